"""``broker.core.clock.now_ms``: the one wall clock every timestamp the broker writes comes from."""

from __future__ import annotations

import re
import time
from pathlib import Path

from broker.core.clock import now_ms


def test_now_ms_is_whole_milliseconds_since_the_epoch_between_two_readings_of_time_time() -> None:
    # Given two readings of the wall clock around a call
    before = time.time() * 1000
    # When the broker reads its clock
    got = now_ms()
    after = time.time() * 1000
    # Then it is an int in ms, truncated, between them
    assert isinstance(got, int)
    assert int(before) <= got <= after


def test_no_module_of_the_product_restates_the_wall_clock_in_ms() -> None:
    # Given every module of the two shipped packages but the clock's own
    root = Path(__file__).resolve().parents[2]
    sources = [p for d in ("broker", "worker") for p in (root / d).rglob("*.py") if p.name != "clock.py"]
    # Then none computes ms since the epoch itself: each calls broker.core.clock.now_ms
    restated = [str(p) for p in sources if re.search(r"time\.time\(\)\s*\*\s*1000", p.read_text())]
    assert sources and restated == []
