"""The chaos harness's check of retained publications (``scripts.rig.retained``) finds what it must."""

from __future__ import annotations

from broker.core.models import Message
from scripts.rig.retained import RetainedLog

TOPICS = ("/r/a",)


def _message(number: int, retained: bool) -> Message:
    return Message(msgid=f"r0.{number}", publisher="r0", topic="/r/a", timestamp_ms=1, retained=retained)


def _log(received: list[tuple[int, bool, bool]]) -> RetainedLog:
    """Retained publications 1..4 answered at t=1..4; subscription "s" made at t=2.5 received ``received``
    as (number, flagged retained, redelivered)."""
    log = RetainedLog("r0")
    for n in range(1, 5):
        log.answered("/r/a", n, float(n))
    log.subscribed("s", 2.5)
    for number, retained, redelivered in received:
        log.receive("s", _message(number, retained), redelivered)
    return log


def test_the_latest_retained_then_every_later_one_in_order_is_right():
    assert _log([(2, True, False), (3, False, False), (4, False, False)]).check(TOPICS) == []
    # the one in flight while it was made, found in the store, is right too
    assert _log([(3, True, False), (4, False, False), (4, False, True)]).check(TOPICS) == []


def test_a_stale_missing_twice_flagged_lost_or_duplicated_one_is_a_problem():
    assert (
        "stale"
        in _log([(1, True, False), (2, False, False), (3, False, False), (4, False, False)]).check(TOPICS)[0]
    )
    assert "no retained publication" in _log([(3, False, False), (4, False, False)]).check(TOPICS)[0]
    assert "flagged retained" in _log([(2, True, False), (3, True, False)]).check(TOPICS)[0]
    assert "lost [3]" in _log([(2, True, False), (4, False, False)]).check(TOPICS)[0]
    assert (
        "duplicates"
        in _log([(2, True, False), (3, False, False), (3, False, False), (4, False, False)]).check(TOPICS)[0]
    )
    assert "out of order" in _log([(2, True, False), (4, False, False), (3, False, False)]).check(TOPICS)[0]
