"""The encoding of a batch of units of work for ``commit.lua`` (``broker.core.unit_of_work.CommitBatch``)."""

from __future__ import annotations

from broker.core import keys
from broker.core.config import SlowSubscriberCondition
from broker.core.unit_of_work import (
    FIRST_QUEUE_KEY,
    UNIT_FIELDS,
    Action,
    CommitBatch,
    Retain,
    UnitOfWork,
    encode_options,
)

QM = "TEST"


def _unit(batch: CommitBatch, i: int) -> dict[str, object]:
    """The ARGV fields of the i-th unit of ``batch``, by name."""
    size = batch.unit_size
    return dict(zip(UNIT_FIELDS[:size], batch.args[i * size : (i + 1) * size], strict=True))


def test_recipients_are_keys_indexes_packed_three_bytes_each_and_queue_keys_are_interned():
    a, b, c = (keys.sub_queue(QM, s) for s in ("a$1", "b$2", "c$3"))
    batch = CommitBatch()
    batch.add(UnitOfWork("p", "1-0", Action.DELIVER, "m1", envelope=b"e1", queues=(a, b)))
    batch.add(UnitOfWork("p", "2-0", Action.DELIVER, "m2", envelope=b"e2", queues=(b, c)))
    batch.add(UnitOfWork("q", "3-0", Action.DELIVER, "m3", envelope=b"e3", queues=(a, b)))
    batch.add(UnitOfWork("q", "4-0", Action.EXPIRE, "m4"))
    assert batch.queue_keys == [a, b, c]
    first = FIRST_QUEUE_KEY
    assert _unit(batch, 0)["recipients"] == bytes([0, 0, first, 0, 0, first + 1])
    assert _unit(batch, 1)["recipients"] == bytes([0, 0, first + 1, 0, 0, first + 2])
    assert _unit(batch, 2)["recipients"] is _unit(batch, 0)["recipients"]  # one set, encoded once
    assert _unit(batch, 3)["recipients"] == b""
    assert int.from_bytes((300_000).to_bytes(3, "big"), "big") == 300_000  # 3 bytes reach far


def test_options_pack_what_units_share_and_the_suggestion_is_the_rest_of_the_string():
    condition = SlowSubscriberCondition(name="t", max_messages=7, disconnect_delete_durable_subscriber=True)
    deliver = UnitOfWork(
        "p", "1-0", Action.DELIVER, "m", dedup_window_ms=600_000, reply_ttl_ms=0, slow=condition
    )
    assert encode_options(deliver) == "deliver|600000|0|ALLAVAIL|1|7:0:1||"
    refuse = UnitOfWork(
        "p",
        "2-0",
        Action.REFUSE,
        "m",
        reason="bad",
        suggestion="a|b\nc",
        reply_ttl_ms=60_000,
        dead_letter=False,
    )
    assert encode_options(refuse) == "refuse|0|60000|ALLAVAIL|0|||a|b\nc"
    batch = CommitBatch()
    batch.add(refuse)
    assert _unit(batch, 0)["payload"] == "bad"  # a refusal's payload is its reason


def test_a_retained_unit_names_its_topic_by_length_before_the_rest():
    # the topic may hold "|": its length in bytes says where it ends
    stored = UnitOfWork("p", "1-0", Action.DELIVER, "m", topic="a|é", retain=Retain.STORE)
    assert encode_options(stored) == "deliver|0|0|ALLAVAIL|1||s4|a|é"
    cleared = UnitOfWork("p", "1-0", Action.DELIVER, "m", topic="t", retain=Retain.CLEAR)
    assert encode_options(cleared) == "deliver|0|0|ALLAVAIL|1||c1|t"


def test_journal_fields_are_sent_only_when_the_journal_is_on():
    unit = UnitOfWork("p", "1-0", Action.DELIVER, "m", seq=5, topic="a/b|c", enqueued_ms=12)
    on, off = CommitBatch(journal=True), CommitBatch(journal=False)
    on.add(unit)
    off.add(unit)
    assert _unit(on, 0)["journal"] == "5|12|a/b|c"
    assert "journal" not in _unit(off, 0)  # no field at all: each one costs Redis and Lua per unit
    assert len(off.args) == len(UNIT_FIELDS) - 1
    on.add(UnitOfWork("p", "2-0", Action.DELIVER, "m2"))
    assert _unit(on, 1)["journal"] == "|0|"
