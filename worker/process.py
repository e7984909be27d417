"""A worker process's runtime: CPython's garbage collector set for how a worker allocates.

A worker's round makes a few container objects per publication (the entry's fields, its unit of
work, the arguments of its commit) and frees nearly all of them by reference counting when the
round ends; what it keeps (the routing table, the settings, the modules) lives as long as the
process. CPython's defaults collect the young generation every 700 container allocations: some
11 collections a round of 500 publications, each walking the round's objects still alive and
promoting them, so that older generations walk them again. In the 2-worker bench row that was
220-230 collections and 59-61 ms per worker per 20,000 publications (about 3 µs a publication,
and pauses while the server may wait for both workers); with ``YOUNG_THRESHOLD`` none at all
(``gc.callbacks``, ``docs/design.md``: the drain).

Reference counting frees every object that is not in a cycle at once whatever the threshold; only
cyclic garbage waits longer for its collection (at most ``YOUNG_THRESHOLD`` container objects more).

May import: the standard library only.
"""

from __future__ import annotations

import gc

#: Container allocations (less deallocations) between two young-generation collections in a worker
#: process (CPython's default: 700). The older generations keep CPython's defaults (10, 10).
YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Set this process's collector for a worker: call once, after the imports, before the loop.

    Freezes what exists so far (``gc.freeze``: the imports' objects, never garbage, are no longer
    walked by any collection) and raises the young generation's threshold to ``YOUNG_THRESHOLD``.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
