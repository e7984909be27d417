"""The broker's wall clock: milliseconds since the epoch, the unit of every timestamp it writes.

The lowest layer: imports nothing from ``broker``. Code that a test drives through time takes
a ``clock_ms=`` callable whose default is ``now_ms``; everything else calls ``now_ms()``.
Waits and deadlines measure with ``time.monotonic`` instead (a wall clock may step).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """The wall clock, in ms since the Unix epoch (``time.time()``, truncated to a whole ms)."""
    return int(time.time() * 1000)
