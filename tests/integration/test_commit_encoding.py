"""What ``commit.lua`` reads from the packed fields of a unit of work reaches Redis intact."""

from __future__ import annotations

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"


def test_journal_records_carry_seq_topic_and_time_even_when_the_topic_holds_the_separator(
    real_redis, settings
):
    # Given a journal and subscriptions on topics holding "|" (the packed fields' separator)
    journaled = settings.model_copy(update={"journal": True})
    a = subscribe(real_redis, QM, "/x|y/#", "s", "a")
    b = subscribe(real_redis, QM, "/x|y/z|", "s", "b")
    pub = Publisher(real_redis, QM, "p|1")
    # When two publications are delivered, one to both subscriptions
    pub.publish("/x|y/z|", b"one", msgid="m|1")
    pub.publish("/x|y/w", b"two", msgid="m|2")
    drain(make_workers(real_redis, journaled, 1))
    # Then each queue holds its copies and the journal names every field as published
    assert len(queue_messages(real_redis, QM, a.sub_id)) == 2
    assert len(queue_messages(real_redis, QM, b.sub_id)) == 1
    records = [fields for _, fields in real_redis.xrange(keys.journal(QM))]
    assert [r[b"topic"] for r in records] == [b"/x|y/z|", b"/x|y/w"]
    assert [r[b"msgid"] for r in records] == [b"m|1", b"m|2"]
    assert [r[b"publisher"] for r in records] == [b"p|1", b"p|1"]
    assert [r[b"status"] for r in records] == [b"delivered", b"delivered"]
    assert all(r[b"seq"].isdigit() and r[b"enq_ms"].isdigit() and r[b"dlv_ms"].isdigit() for r in records)
    assert sorted(records[0][b"subs"].decode().strip("[]").replace('"', "").split(",")) == sorted(
        [a.sub_id, b.sub_id]
    )
    # and the dedup records were made under the message ids
    assert real_redis.exists(keys.dedup(QM, "p|1", "m|1"), keys.dedup(QM, "p|1", "m|2")) == 2
