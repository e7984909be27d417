"""The pure step of a worker's round (``worker.decide``): entries, routing table and settings in,
units of work out, with no Redis. The table is loaded once (fakeredis), then the store is emptied:
every decision below is made from what the worker holds, as on the hot path."""

from __future__ import annotations

import fakeredis
import pytest

from broker.core import keys
from broker.core.config import Settings
from broker.core.unit_of_work import Action, Retain
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import subscribe
from worker.decide import COMMIT_CHUNK, Decider

QM = "TEST"
NOW_MS = 1_700_000_000_000


@pytest.fixture
def decider() -> Decider:
    client = fakeredis.FakeRedis()
    exact = subscribe(client, QM, "a/b", "c1", "exact")
    wild = subscribe(client, QM, "a/#", "c2", "wild")
    table = RoutingTable(QM)
    table.load(client)
    client.flushall()  # from here on nothing is read from the store
    settings = Settings(qm=QM, max_deliveries=5, reply_ttl_ms=9_000, dedup_window_ms=7_000)
    decider = Decider(settings, table)
    decider.queues = (keys.sub_queue(QM, exact.sub_id), keys.sub_queue(QM, wild.sub_id))  # type: ignore[attr-defined]
    return decider


def _fields(topic: str = "a/b", **extra: bytes) -> dict[bytes, bytes]:
    return {
        b"publisher": b"p",
        b"topic": topic.encode(),
        b"body": b"hello",
        **{k.encode(): v for k, v in extra.items()},
    }


def test_a_publication_is_delivered_to_every_matching_subscriber_queue_once(decider):
    unit = decider.unit_of_work("p", "1-0", _fields(msgid=b"m1", reply=b"1"), NOW_MS)
    assert unit.action is Action.DELIVER
    assert sorted(unit.queues) == sorted(decider.queues)
    assert unit.envelope.endswith(b"\nhello") and unit.msgid == "m1"
    assert (unit.dedup_window_ms, unit.reply_ttl_ms) == (7_000, 9_000)


def test_a_delivered_units_every_field_is_in_its_place(decider):
    # the unit is built positionally (worker.decide): each field, distinct values where types allow
    unit = decider.unit_of_work("p", "1-0", _fields(msgid=b"m1", reply=b"1", seq=b"3", ts=b"12"), NOW_MS)
    assert (unit.publisher, unit.entry_id, unit.action, unit.msgid) == ("p", "1-0", Action.DELIVER, "m1")
    assert (unit.reason, unit.suggestion, unit.policy) == ("", "", False)
    assert (unit.dedup_window_ms, unit.reply_ttl_ms, unit.seq, unit.enqueued_ms) == (7_000, 9_000, 3, 12)
    assert (unit.topic, unit.delivery, unit.dead_letter, unit.slow) == ("a/b", "ALLAVAIL", True, None)
    assert unit.retain is Retain.NONE and unit.envelope.endswith(b"\nhello") and len(unit.queues) == 2


def test_an_invalid_topic_is_refused_with_a_suggestion(decider):
    unit = decider.unit_of_work("p", "1-0", _fields("a/+/b", reply=b"1"), NOW_MS)
    assert unit.action is Action.REFUSE and "wildcard" in unit.reason
    assert unit.suggestion and unit.reply_ttl_ms == 9_000 and unit.dead_letter


def test_a_malformed_entry_is_refused_not_raised(decider):
    unit = decider.unit_of_work("p", "1-0", {b"publisher": b"p"}, NOW_MS)
    assert unit.action is Action.REFUSE and unit.reason


def test_an_expired_publication_expires(decider):
    unit = decider.unit_of_work("p", "1-0", _fields(expiration=str(NOW_MS - 1).encode()), NOW_MS)
    assert unit.action is Action.EXPIRE


def test_a_head_delivered_more_than_max_deliveries_times_is_refused_and_the_rest_go_on(decider):
    entries = {i: ("p", _fields()) for i in ("1-0", "2-0")}
    (batch,) = decider.batches({"p": ["1-0", "2-0"]}, entries, {"1-0": 6}, NOW_MS)
    first, second = batch.units
    assert first.action is Action.REFUSE and "taken over 6 times" in first.reason
    assert second.action is Action.DELIVER


def test_a_head_gone_from_the_stream_is_skipped(decider):
    (batch,) = decider.batches({"p": ["1-0"]}, {}, {}, NOW_MS)
    assert [u.action for u in batch.units] == [Action.SKIP]


def test_units_are_split_into_commit_calls_of_a_rounds_worth(decider):
    # a round's worth: batch_size (what one dequeue reads), COMMIT_CHUNK at least
    assert decider.chunk == max(COMMIT_CHUNK, decider.settings.batch_size)
    n = decider.chunk
    heads = {f"p{i}": [f"{i}-0"] for i in range(n + 1)}
    entries = {f"{i}-0": (f"p{i}", _fields()) for i in range(n + 1)}
    batches = decider.batches(heads, entries, {}, NOW_MS)
    assert [len(b) for b in batches] == [n, 1]


def test_a_round_of_batch_size_publications_is_one_commit_call(decider):
    # 25 publishers with 20 heads each: what one dequeue of 500 reads in the bench's drain
    settings, table = decider.settings, decider.table
    one = Decider(settings.model_copy(update={"batch_size": 500}), table)
    heads = {f"p{i}": [f"{i}-{j}" for j in range(20)] for i in range(25)}
    entries = {e: (p, _fields()) for p, ids in heads.items() for e in ids}
    assert [len(b) for b in one.batches(heads, entries, {}, NOW_MS)] == [500]
    # a smaller batch_size keeps COMMIT_CHUNK: no more calls than before
    assert Decider(settings.model_copy(update={"batch_size": 10}), table).chunk == COMMIT_CHUNK


def test_the_decider_holds_no_redis_client(decider):
    assert not any(hasattr(v, "execute_command") for v in vars(decider).values())


def test_a_topic_over_the_limits_is_refused_every_time_and_one_within_them_checked_once(decider, monkeypatch):
    import worker.decide as decide_module

    over = "a/" + "/".join(["x"] * decider.settings.max_topic_levels)
    for _ in range(2):  # never remembered as within the limits
        unit = decider.unit_of_work("p", "1-0", _fields(over), NOW_MS)
        assert unit.action is Action.REFUSE and "max_topic_levels" in unit.reason
    checked: list[str] = []
    real = decide_module.limit_problem
    monkeypatch.setattr(
        decide_module, "limit_problem", lambda text, *a: checked.append(text) or real(text, *a)
    )
    for _ in range(3):
        assert decider.unit_of_work("p", "1-0", _fields("a/b"), NOW_MS).action is Action.DELIVER
    assert checked == ["a/b"]
