"""Issue 8: foreign state never half-applies a unit of work, keys never collide, nothing stays pending.

Each test plants what a user planted with ``valkey-cli`` (a key of the wrong
type where the broker keeps a list, a string or a stream; ids containing the
key separator) and checks the four promises: the unit of work is all or
nothing, a publication that cannot be delivered is refused as a whole with a
true reason (dead-lettered, reply posted once), every entry ends delivered or
dead-lettered in its publisher's order, and the foreign key is left as it was.
A subscriber queue of another type refuses a publication as a whole only under PMSGDLV(ALL)
(or ALLDUR); under ALLAVAIL, the default, it makes only its subscription unavailable
(``test_unavailable_subscriptions.py``).
"""

from __future__ import annotations

import json

import pytest
import redis

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.errors import ForeignKey
from broker.core.models import publication_fields
from broker.operations.maintenance import trim_acknowledged
from broker.testing import drain, make_workers, queue_messages
from broker.topics.topic_objects import Attributes, define

QM = "TEST"


def _pending(client: redis.Redis) -> int:
    return int(client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"])


def _xadd(
    client: redis.Redis, publisher: str, topic: str, msgid: str, reply: bool = True, **extra: str
) -> str:
    fields = publication_fields(publisher, topic, b"body", msgid=msgid, reply=reply)
    fields.update(extra)
    return client.xadd(keys.publish_stream(QM), fields).decode()


def _dead_letters(client: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(keys.dead_letter(QM))]


def _replies(client: redis.Redis, publisher: str, msgid: str) -> list[dict]:
    return [json.loads(r) for r in client.lrange(keys.reply(QM, publisher, msgid), 0, -1)]


# -- 1. a foreign key inside the unit of work ------------------------------------------------------


@pytest.mark.parametrize(
    ("good", "bad"), [("good$g", "bad$b"), ("zz$good", "aa$bad")], ids=["bad-sorts-first", "bad-sorts-last"]
)
def test_foreign_subscriber_queue_under_pmsgdlv_all_refuses_the_publication_as_a_whole(
    real_redis, settings, good, bad
):
    # Given two subscriptions on /T/# under PMSGDLV(ALL) and a string planted where one's queue (a
    # list) belongs (under ALLAVAIL, the default, only that subscription is unavailable:
    # test_unavailable_subscriptions.py)
    define(real_redis, QM, "T", "/T", Attributes(pmsgdlv="ALL"))
    for sub_id in (good, bad):
        client_id, name = sub_id.split("$")
        subscribe(real_redis, QM, "/T/#", client_id, name)
    real_redis.set(keys.sub_queue(QM, bad), "x")
    workers = make_workers(real_redis, settings, 2)
    # When a publication asking for its result is handled
    entry_id = _xadd(real_redis, "pub", "/T/1", "m1")
    drain(workers)
    # Then nothing was delivered anywhere, and the entry is no longer pending
    assert real_redis.llen(keys.sub_queue(QM, good)) == 0
    assert _pending(real_redis) == 0
    # And it was dead-lettered once, with a reason naming the foreign key
    dead = _dead_letters(real_redis)
    assert len(dead) == 1
    reason = dead[0][b"dlq.reason"].decode()
    assert keys.sub_queue(QM, bad) in reason and "string" in reason, reason
    assert dead[0][b"dlq.entry_id"].decode() == entry_id
    # And exactly one result was posted: refused, with the same reason
    replies = _replies(real_redis, "pub", "m1")
    assert [r["status"] for r in replies] == ["refused"]
    assert replies[0]["subscriptions"] == 0 and replies[0]["reason"] == reason
    # And no dedup record was left, and the foreign key is untouched
    assert real_redis.exists(keys.dedup(QM, "pub", "m1")) == 0
    assert real_redis.get(keys.sub_queue(QM, bad)) == b"x"
    # When the operator removes the foreign key and the publisher retries with the same msgid
    real_redis.delete(keys.sub_queue(QM, bad), keys.reply(QM, "pub", "m1"))
    _xadd(real_redis, "pub", "/T/1", "m1")
    drain(workers)
    # Then it is delivered once to each subscription, not answered "duplicate"
    assert [r["status"] for r in _replies(real_redis, "pub", "m1")] == ["delivered"]
    assert real_redis.llen(keys.sub_queue(QM, good)) == 1
    assert real_redis.llen(keys.sub_queue(QM, bad)) == 1


def test_a_foreign_queue_refuses_only_the_publications_that_go_to_it_in_a_batch(real_redis, settings):
    # Given a healthy subscription on /ok and a foreign key where /bad's subscriber queue belongs, under ALL
    define(real_redis, QM, "BAD", "/bad", Attributes(pmsgdlv="ALL"))
    subscribe(real_redis, QM, "/ok", "app", "ok")
    subscribe(real_redis, QM, "/bad", "app", "bad")
    real_redis.hset(keys.sub_queue(QM, "app$bad"), "a", "b")
    workers = make_workers(real_redis, settings, 1)
    # When one publisher's publications alternate between the two topics, all in one batch
    publisher = Publisher(real_redis, QM, "p")
    for i in range(10):
        publisher.publish("/ok" if i % 2 == 0 else "/bad", str(i).encode())
    drain(workers)
    # Then every /ok publication was delivered in order, every /bad one dead-lettered, nothing pending
    assert [m.body for m in queue_messages(real_redis, QM, "app$ok")] == [b"0", b"2", b"4", b"6", b"8"]
    assert [int(d[b"seq"]) for d in _dead_letters(real_redis)] == [2, 4, 6, 8, 10]
    assert _pending(real_redis) == 0
    assert real_redis.type(keys.sub_queue(QM, "app$bad")) == b"hash"


def test_foreign_reply_key_refuses_the_publication_and_writes_nothing(real_redis, settings):
    # Given a subscription and a hash planted where the publication's reply list belongs
    subscribe(real_redis, QM, "/T/#", "app", "s")
    real_redis.hset(keys.reply(QM, "rawz", "m1"), "a", "b")
    workers = make_workers(real_redis, settings, 1)
    # When the publication asks for its result
    _xadd(real_redis, "rawz", "/T/1", "m1")
    drain(workers)
    # Then it was refused as a whole: not delivered, dead-lettered with the reply key named, nothing pending
    assert real_redis.llen(keys.sub_queue(QM, "app$s")) == 0
    [dead] = _dead_letters(real_redis)
    assert keys.reply(QM, "rawz", "m1") in dead[b"dlq.reason"].decode()
    assert _pending(real_redis) == 0
    assert real_redis.hgetall(keys.reply(QM, "rawz", "m1")) == {b"a": b"b"}
    assert real_redis.exists(keys.dedup(QM, "rawz", "m1")) == 0


def test_foreign_dedup_key_is_not_taken_for_a_duplicate(real_redis, settings):
    # Given a list planted where a message id's dedup record (a string) belongs
    subscribe(real_redis, QM, "/T/#", "app", "s")
    real_redis.rpush(keys.dedup(QM, "p", "m1"), "x")
    workers = make_workers(real_redis, settings, 1)
    # When that message id is published
    _xadd(real_redis, "p", "/T/1", "m1")
    drain(workers)
    # Then it is refused with a true reason, not silently answered "duplicate"
    [reply] = _replies(real_redis, "p", "m1")
    assert reply["status"] == "refused"
    assert keys.dedup(QM, "p", "m1") in reply["reason"]
    assert _pending(real_redis) == 0


def test_foreign_dead_letter_stream_stops_nothing_half_way(real_redis, settings):
    # Given an invalid publication and a string planted where the dead-letter stream belongs
    real_redis.set(keys.dead_letter(QM), "x")
    workers = make_workers(real_redis, settings, 1)
    _xadd(real_redis, "p", "/bad/#", "m1")
    # When a worker runs, it cannot dead-letter: the round fails, naming the key, before writing anything
    with pytest.raises(ForeignKey, match=f"foreign key: {keys.dead_letter(QM)}"):
        drain(workers)
    assert real_redis.exists(keys.reply(QM, "p", "m1")) == 0
    assert real_redis.get(keys.dead_letter(QM)) == b"x"
    assert real_redis.xlen(keys.publish_stream(QM)) == 1
    # And once the operator removes the key, the entry is dead-lettered with its own reason
    real_redis.delete(keys.dead_letter(QM))
    drain(make_workers(real_redis, settings, 1))
    [dead] = _dead_letters(real_redis)
    assert b"wildcard" in dead[b"dlq.reason"] or b"#" in dead[b"dlq.reason"]
    assert _pending(real_redis) == 0


# -- 2. keys built from ids are injective ----------------------------------------------------------


def test_dedup_and_reply_keys_of_ids_containing_the_separator_do_not_collide():
    assert keys.dedup(QM, "a", "b:c") != keys.dedup(QM, "a:b", "c")
    assert keys.reply(QM, "a", "b:c") != keys.reply(QM, "a:b", "c")
    assert keys.dedup(QM, "a", "") != keys.dedup(QM, "", "a")


def test_publications_whose_ids_differ_only_in_where_the_separator_falls_are_both_delivered(
    real_redis, settings
):
    # Given a subscription
    subscribe(real_redis, QM, "/T/#", "app", "s")
    workers = make_workers(real_redis, settings, 1)
    # When publisher "a" sends msgid "b:c" and publisher "a:b" sends msgid "c"
    _xadd(real_redis, "a", "/T/1", "b:c")
    _xadd(real_redis, "a:b", "/T/1", "c")
    drain(workers)
    # Then both are delivered (neither is taken for the other's duplicate), each result on its own key
    assert [m.msgid for m in queue_messages(real_redis, QM, "app$s")] == ["b:c", "c"]
    assert [r["status"] for r in _replies(real_redis, "a", "b:c")] == ["delivered"]
    assert [r["status"] for r in _replies(real_redis, "a:b", "c")] == ["delivered"]


def test_lua_builds_the_same_dedup_and_reply_keys_as_python(real_redis, settings):
    # Given a publisher id with the separator and multi-byte characters
    publisher, msgid = "é:ü:1", "m:ö"
    workers = make_workers(real_redis, settings, 1)
    # When the worker records the message id and posts the result
    _xadd(real_redis, publisher, "/T/1", msgid)
    drain(workers)
    # Then both keys are the ones keys.py names
    assert real_redis.exists(keys.dedup(QM, publisher, msgid)) == 1
    assert real_redis.exists(keys.reply(QM, publisher, msgid)) == 1


# -- 3. a foreign per-publisher key never leaves an entry pending ----------------------------------


def test_foreign_fifo_key_dead_letters_the_entry_and_later_ones_flow_in_order(real_redis, settings):
    # Given a string planted where publisher rawy's FIFO (a list) belongs
    subscribe(real_redis, QM, "/T/#", "app", "s")
    real_redis.set(keys.fifo_key(QM, "rawy"), "oops")
    workers = make_workers(real_redis, settings, 2)
    # When rawy publishes seq 1, and another publisher publishes too
    first = _xadd(real_redis, "rawy", "/T/1", "y1", seq="1")
    _xadd(real_redis, "other", "/T/1", "o1")
    drain(workers)
    # Then seq 1 is dead-lettered with a reason naming the FIFO key, nothing stays pending
    [dead] = _dead_letters(real_redis)
    assert dead[b"dlq.entry_id"].decode() == first
    assert keys.fifo_key(QM, "rawy") in dead[b"dlq.reason"].decode()
    assert _pending(real_redis) == 0
    assert [r["status"] for r in _replies(real_redis, "rawy", "y1")] == ["refused"]
    assert real_redis.get(keys.fifo_key(QM, "rawy")) == b"oops"
    # And the other publisher was not held up
    assert [m.msgid for m in queue_messages(real_redis, QM, "app$s")] == ["o1"]
    # When the operator deletes the key and rawy publishes seq 2
    real_redis.delete(keys.fifo_key(QM, "rawy"))
    _xadd(real_redis, "rawy", "/T/1", "y2", seq="2")
    drain(workers)
    # Then seq 2 is delivered, and trimming removes every entry
    assert [m.msgid for m in queue_messages(real_redis, QM, "app$s")] == ["o1", "y2"]
    assert _pending(real_redis) == 0
    trim_acknowledged(real_redis, QM)
    assert real_redis.xlen(keys.publish_stream(QM)) == 0


def test_foreign_owner_key_dead_letters_the_entries_instead_of_stalling_every_worker(real_redis, settings):
    # Given a hash planted where publisher rawo's turn (a string) belongs
    subscribe(real_redis, QM, "/T/#", "app", "s")
    real_redis.hset(keys.turn_key(QM, "rawo"), "a", "b")
    workers = make_workers(real_redis, settings, 1)
    # When rawo and another publisher publish
    _xadd(real_redis, "rawo", "/T/1", "r1")
    _xadd(real_redis, "other", "/T/1", "o1")
    drain(workers)
    # Then rawo's entry is dead-lettered naming the key, the other is delivered, nothing pending
    [dead] = _dead_letters(real_redis)
    assert keys.turn_key(QM, "rawo") in dead[b"dlq.reason"].decode()
    assert [m.msgid for m in queue_messages(real_redis, QM, "app$s")] == ["o1"]
    assert _pending(real_redis) == 0


def test_entries_orphaned_by_a_deleted_fifo_are_dead_lettered_by_the_sweep(real_redis, settings):
    # Given entries filed in a publisher's FIFO, whose FIFO an operator then deletes by hand
    subscribe(real_redis, QM, "/T/#", "app", "s")
    (worker,) = make_workers(real_redis, settings, 1)
    for i in range(3):
        _xadd(real_redis, "lost", "/T/1", f"l{i}")
    _xadd(real_redis, "kept", "/T/1", "k0")
    worker.scripts.dequeue("someone-else", 10, settings.lease_ms, 10, [])  # filed, turns held elsewhere
    real_redis.delete(keys.fifo_key(QM, "lost"), keys.turn_key(QM, "lost"))
    # When the orphan sweep looks at every pending entry, however long it has been pending
    refused = worker.housekeeping.sweep_entries(min_idle_ms=0)
    # Then every orphaned entry is dead-lettered, in stream order, and nothing stays pending
    assert [d[b"msgid"] for d in _dead_letters(real_redis)] == [b"l0", b"l1", b"l2"]
    assert all(b"FIFO" in d[b"dlq.reason"] for d in _dead_letters(real_redis))
    assert len(refused) == 3
    # And the entry still in its FIFO was left to the worker holding its turn, pending
    assert _pending(real_redis) == 1


# -- 5. smaller holes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [("seq", "-1", "seq"), ("reply", "yes", "reply"), ("persistent", "true", "persistent")],
)
def test_out_of_range_fields_are_refused_not_ignored(real_redis, settings, field, value, words):
    subscribe(real_redis, QM, "/T/#", "app", "s")
    workers = make_workers(real_redis, settings, 1)
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": "/T/1", "msgid": "m", field: value})
    drain(workers)
    [dead] = _dead_letters(real_redis)
    assert words in dead[b"dlq.reason"].decode()
    assert real_redis.llen(keys.sub_queue(QM, "app$s")) == 0


def test_oversized_body_is_not_copied_into_the_dead_letter_stream(real_redis, settings):
    settings = settings.model_copy(update={"max_body_bytes": 1000})
    workers = make_workers(real_redis, settings, 1)
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": "/T/1", "body": b"x" * 5000})
    drain(workers)
    [dead] = _dead_letters(real_redis)
    assert b"body" not in dead
    assert dead[b"dlq.body_bytes"] == b"5000"
    assert b"larger than the limit" in dead[b"dlq.reason"]


def test_dead_letter_stream_is_capped(real_redis, settings):
    settings = settings.model_copy(update={"dead_letter_max_len": 10})
    workers = make_workers(real_redis, settings, 1)
    for i in range(300):
        real_redis.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": f"/bad/{i}/#"})
    drain(workers)
    assert _pending(real_redis) == 0
    assert 10 <= real_redis.xlen(keys.dead_letter(QM)) < 300


def test_workers_killed_without_deregistering_are_forgotten_by_the_live_ones(real_redis, settings):
    # Given the heartbeats of a worker killed long ago and of one seen a second ago
    import time

    from worker.housekeeping import GONE_AFTER_MS

    now_ms = int(time.time() * 1000)
    for name, age_ms in (("killed", GONE_AFTER_MS + 1_000), ("recent", 1_000)):
        real_redis.zadd(keys.alive(QM), {name: now_ms - age_ms})
        real_redis.hset(keys.workers(QM), name, json.dumps({"pid": 1, "heartbeat_ms": now_ms - age_ms}))
    # When a live worker sends its heartbeat
    make_workers(real_redis, settings, 1)
    # Then the killed worker is gone from the registry, the recent one and the live one stay
    assert sorted(real_redis.hkeys(keys.workers(QM))) == [b"recent", b"w0"]
    assert sorted(real_redis.zrange(keys.alive(QM), 0, -1)) == [b"recent", b"w0"]


def test_a_round_whose_every_entry_was_refused_in_dequeue_blocks_as_idle(real_redis, settings):
    # Given a publisher whose FIFO key is foreign, and nothing else to do
    real_redis.set(keys.fifo_key(QM, "rawy"), "oops")
    settings = settings.model_copy(update={"block_ms": 1})
    (worker,) = make_workers(real_redis, settings, 1)
    _xadd(real_redis, "rawy", "/T/1", "y1")
    # When the worker's round reads only that entry and then blocks for new ones
    done = worker.run_once(block=True)
    # Then the round ends normally (no invalid stream id), with the entry refused
    assert done == 0
    assert len(_dead_letters(real_redis)) == 1


def test_retry_of_a_delivered_message_is_a_duplicate_even_when_a_queue_became_foreign(real_redis, settings):
    # Given a message delivered to two subscriptions under PMSGDLV(ALL), then a foreign key planted on one queue
    define(real_redis, QM, "T", "/T", Attributes(pmsgdlv="ALL"))
    subscribe(real_redis, QM, "/T/#", "app", "a")
    subscribe(real_redis, QM, "/T/#", "app", "b")
    workers = make_workers(real_redis, settings, 1)
    _xadd(real_redis, "p", "/T/1", "m1")
    drain(workers)
    real_redis.delete(keys.sub_queue(QM, "app$b"))
    real_redis.set(keys.sub_queue(QM, "app$b"), "x")
    # When the publisher retries the same msgid
    _xadd(real_redis, "p", "/T/1", "m1")
    drain(workers)
    # Then the retry is answered "duplicate" and nothing is dead-lettered
    assert [r["status"] for r in _replies(real_redis, "p", "m1")] == ["duplicate", "delivered"]
    assert _dead_letters(real_redis) == []
    # And a fresh message refused for the foreign queue leaves no dedup record behind
    _xadd(real_redis, "p", "/T/1", "m2")
    drain(workers)
    assert [r["status"] for r in _replies(real_redis, "p", "m2")] == ["refused"]
    assert real_redis.exists(keys.dedup(QM, "p", "m2")) == 0
