"""Issue 27: a subscriber's own keys of another type make only its subscription unavailable.

A subscriber role may write its own subscription's keys (every priority band of its queue, its
bell). A band holding another type makes that subscription *unavailable* for the publications it
matches, as a full queue (MAXDEPTH) is: the topic's PMSGDLV/NPMSGDLV decide (IBM MQ). Under
ALLAVAIL, the default, the others get every publication and the unavailable one's copy is
dead-lettered with the reason and its subscription; ALL refuses the publication as a whole, ALLDUR
when the unavailable subscription is durable. No worker ever waits on a subscriber's key.
"""

from __future__ import annotations

import json

import pytest
import redis

from broker import subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.models import publication_fields
from broker.operations.dead_letters import Selection, replay
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.topic_objects import BASE, Attributes, alter, define

QM = "TEST"


def _dead_letters(client: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(keys.dead_letter(QM))]


def _pending(client: redis.Redis) -> int:
    return int(client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"])


def _publish(client: redis.Redis, body: bytes, msgid: str, **options: int) -> None:
    """One publication of publisher p1 on t/a asking for its result (a worker drains it later)."""
    fields = publication_fields("p1", "t/a", body, msgid=msgid, reply=True, **options)
    client.xadd(keys.publish_stream(QM), fields)


def _result(client: redis.Redis, publisher: str, msgid: str) -> dict:
    (reply,) = client.lrange(keys.reply(QM, publisher, msgid), 0, -1)
    return json.loads(reply)


def test_a_subscribers_planted_band_and_bell_stop_nobody_elses_delivery(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given three subscriptions on t/#, and the evil one's default band and bell planted as strings
    # (DEL + SET: both allowed by the subscriber role on its own keys)
    evil = subscribe(real_redis, QM, "t/#", "evil", "d")
    good = [subscribe(real_redis, QM, "t/#", "good", name) for name in ("a", "b")]
    queue, bell = keys.sub_queue(QM, evil.sub_id), keys.sub_bell(QM, evil.sub_id)
    real_redis.set(queue, "x")
    real_redis.set(bell, "x")
    workers = make_workers(real_redis, settings, 2)
    # When a publisher publishes on the topic, asking for its results
    for i in range(5):
        _publish(real_redis, b"%d" % i, f"m{i}")
    drain(workers)
    # Then every other subscription got every publication, in order, and nothing waits
    for sub in good:
        assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"%d" % i for i in range(5)]
    assert _pending(real_redis) == 0
    # And each result says delivered, to the two available subscriptions
    for i in range(5):
        result = _result(real_redis, "p1", f"m{i}")
        assert (result["status"], result["subscriptions"]) == ("delivered", 2), result
    # And the evil one's copies were dead-lettered with the reason and its subscription, counted as skipped
    dead = _dead_letters(real_redis)
    assert len(dead) == 5
    for letter in dead:
        assert letter[b"dlq.reason"].decode() == f"subscription unavailable: {queue} holds a string"
        assert letter[b"dlq.subscription"].decode() == evil.sub_id
    assert int(real_redis.hget(keys.skipped(QM), evil.sub_id)) == 5
    assert real_redis.get(queue) == b"x" and real_redis.get(bell) == b"x"
    # And status names the subscription, its key and what to do
    problems = "\n".join(status(real_redis, QM).problems)
    assert queue in problems and f"subscription {evil.sub_id!r} is unavailable" in problems, problems
    assert f"broker dlq replay --subscription '{evil.sub_id}'" in problems


def test_a_planted_priority_band_makes_only_that_bands_copies_unavailable_and_replay_delivers_them(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given two subscriptions, and a hash planted where the first one's priority 7 band belongs
    evil = subscribe(real_redis, QM, "t/#", "evil", "d")
    good = subscribe(real_redis, QM, "t/#", "good", "d")
    band = keys.sub_band(QM, evil.sub_id, 7)
    real_redis.hset(band, "a", "b")
    (worker,) = make_workers(real_redis, settings, 1)
    # When one publication of priority 7 and one of the default priority are made
    _publish(real_redis, b"high", "m1", priority=7)
    _publish(real_redis, b"plain", "m2")
    drain([worker])
    # Then the other subscription got both, and the planted one only the default priority's
    assert sorted(m.body for m in queue_messages(real_redis, QM, good.sub_id)) == [b"high", b"plain"]
    assert real_redis.llen(keys.sub_queue(QM, evil.sub_id)) == 1  # its default band: "plain"
    (dead,) = _dead_letters(real_redis)
    assert dead[b"dlq.reason"].decode() == f"subscription unavailable: {band} holds a hash"
    # And status names the planted band
    assert any(band in p and "is unavailable" in p for p in status(real_redis, QM).problems)
    # When the operator removes the key and replays the subscription's dead letters
    real_redis.delete(band)
    report = replay(real_redis, QM, Selection(subscription=evil.sub_id))
    # Then the copy reaches the subscription it was meant for, and the dead-letter queue is empty
    assert len(report.requeued) == 1, report
    assert sorted(m.body for m in queue_messages(real_redis, QM, evil.sub_id)) == [b"high", b"plain"]
    assert _dead_letters(real_redis) == []


@pytest.mark.parametrize("policy", ["ALL", "ALLDUR"])
def test_all_and_alldur_refuse_the_publication_as_a_whole_without_a_worker_waiting(
    real_redis: redis.Redis, settings: Settings, policy: str
) -> None:
    # Given a topic object with PMSGDLV(policy), a durable subscription whose queue is planted, and another
    define(real_redis, QM, "T", "t", Attributes(pmsgdlv=policy))
    evil = subscribe(real_redis, QM, "t/#", "evil", "d")
    good = subscribe(real_redis, QM, "t/#", "good", "d")
    queue = keys.sub_queue(QM, evil.sub_id)
    real_redis.set(queue, "x")
    (worker,) = make_workers(real_redis, settings, 1)
    # When a persistent publication asking for its result is made, and one after it
    _publish(real_redis, b"first", "m1")
    _publish(real_redis, b"second", "m2")
    drain([worker])
    # Then both were refused as a whole: dead-lettered with the reason, replied to, nothing pending
    reason = (
        f"subscription unavailable: {queue} holds a string (delivery {policy}); delivered to no subscription"
    )
    for msgid in ("m1", "m2"):
        result = _result(real_redis, "p1", msgid)
        assert (result["status"], result["reason"]) == ("refused", reason), result
    assert [d[b"dlq.reason"].decode() for d in _dead_letters(real_redis)] == [reason, reason]
    assert queue_messages(real_redis, QM, good.sub_id) == []
    assert _pending(real_redis) == 0
    assert real_redis.exists(keys.dedup(QM, "p1", "m1")) == 0  # a retry is not a duplicate


def test_alldur_delivers_to_the_rest_when_the_unavailable_subscription_is_not_durable(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given PMSGDLV(ALLDUR) on the base, a non-durable subscription whose queue is planted, and a durable one
    alter(real_redis, QM, BASE, pmsgdlv="ALLDUR")
    evil = subscribe(real_redis, QM, "t/#", "evil")
    good = subscribe(real_redis, QM, "t/#", "good", "d")
    real_redis.set(keys.sub_queue(QM, evil.sub_id), "x")
    (worker,) = make_workers(real_redis, settings, 1)
    # When a persistent publication is made
    _publish(real_redis, b"x", "m1")
    drain([worker])
    # Then the durable one has it, and the non-durable one's copy was dead-lettered
    assert [m.body for m in queue_messages(real_redis, QM, good.sub_id)] == [b"x"]
    (dead,) = _dead_letters(real_redis)
    assert dead[b"dlq.subscription"].decode() == evil.sub_id


def test_the_base_topic_delivers_to_the_available_subscriptions_by_default(real_redis: redis.Redis) -> None:
    # Given no topic object but the base: its delivery defaults cannot let one subscriber refuse others
    from broker.topics.topic_objects import read_tree

    effective = read_tree(real_redis, QM).effective("t/a")
    # Then both are ALLAVAIL (a documented departure from IBM MQ's PMSGDLV(ALLDUR))
    assert (effective["pmsgdlv"], effective["npmsgdlv"]) == ("ALLAVAIL", "ALLAVAIL")
