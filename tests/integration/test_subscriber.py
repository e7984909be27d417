"""Consumers on the real server: per-consumer in-flight lists, leases, modes, priority, expiry, browsing.

Leases are driven by an injected clock (``clock_ms``) wherever a test needs
time to pass; only the SIGKILL test runs real consumer processes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from broker import ConsumerConflict, Publisher, list_subscriptions, subscribe, unsubscribe
from broker.clients.consumer import Subscriber, sweep_subscriptions
from broker.clients.loads import subscription_load
from broker.core import keys
from broker.core.config import ConsumerMode, Settings
from broker.testing import drain, make_workers
from scripts.rig.consumers import run_consumer

QM = "TEST"
LEASE = 1_000


class Clock:
    """A hand-driven clock, ms since the epoch."""

    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


def _consumer_settings(settings: Settings, **extra: object) -> Settings:
    return settings.model_copy(update={"consumer_lease_ms": LEASE, **extra})


def _publish(client, settings, topic, bodies, **options):
    pub = Publisher(client, QM, options.pop("publisher", "p"), client_id=options.pop("client_id", None))
    for body in bodies:
        pub.publish(topic, body, **options)
    drain(make_workers(client, settings, 1))


def test_a_consumer_that_dies_mid_message_loses_nothing(real_redis, settings):
    # Given a durable subscription with two messages and a consumer that took one and died
    record = subscribe(real_redis, QM, "/A", "c", "d")
    _publish(real_redis, settings, "/A", [b"1", b"2"])
    clock = Clock()
    cs = _consumer_settings(settings)
    first = Subscriber(real_redis, QM, record, cs, consumer_id="first", heartbeat=False, clock_ms=clock)
    taken = first.receive()
    assert taken is not None and taken.message.body == b"1" and not taken.redelivered
    # When its lease has passed and a new consumer attaches
    clock.now += LEASE + 1
    second = Subscriber(real_redis, QM, record, cs, consumer_id="second", heartbeat=False, clock_ms=clock)
    got = second.receive_many(10)
    # Then the dead consumer's message comes first, flagged redelivered, and nothing is left
    assert [(d.message.body, d.delivery_count) for d in got] == [(b"1", 2), (b"2", 1)]
    assert got[0].redelivered and not got[1].redelivered
    assert second.ack_many(got) == 2
    assert real_redis.llen(keys.consumer_inflight(QM, record.sub_id, "second")) == 0
    assert real_redis.exists(keys.consumer_inflight(QM, record.sub_id, "first")) == 0
    assert second.receive() is None
    # A late acknowledgement by the dead consumer changes nothing
    assert first.ack(taken) is False


def test_recovery_never_takes_a_live_consumers_messages(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "s", shared=True)
    _publish(real_redis, settings, "/A", [b"1", b"2", b"3"])
    clock = Clock()
    cs = _consumer_settings(settings)
    alive = Subscriber(real_redis, QM, record, cs, consumer_id="alive", heartbeat=False, clock_ms=clock)
    held = alive.receive_many(2)
    other = Subscriber(real_redis, QM, record, cs, consumer_id="other", heartbeat=False, clock_ms=clock)
    clock.now += LEASE - 1  # the live consumer's lease still runs
    assert other.recover_dead() == (0, 0, 0)
    assert [d.message.body for d in other.receive_many(10)] == [b"3"]
    assert alive.ack_many(held) == 2


def test_shared_subscription_gives_each_message_to_one_consumer_and_a_killed_consumers_batch_is_redelivered(
    real_redis, settings, real_server
):
    # Given a shared subscription with 120 messages waiting
    record = subscribe(real_redis, QM, "$share/grp/jobs/+", "anyone")
    assert record.sub_id.startswith("grp$") and record.mode == "shared"
    total = 120
    _publish(real_redis, settings, "jobs/a", [f"m{i}".encode() for i in range(total)])
    ctx = multiprocessing.get_context("spawn")
    log = "test:got"

    def start(consumer_id: str, hold: int = 0) -> multiprocessing.process.BaseProcess:
        proc = ctx.Process(
            target=run_consumer,
            args=(real_server.url, QM, record.sub_id, record.to_json(), consumer_id, 600, log, hold),
            daemon=True,
        )
        proc.start()
        return proc

    # When one consumer takes a batch of 10 and is killed with SIGKILL before acknowledging it
    victim = start("victim", hold=10)
    assert real_redis.blpop([f"{log}:holding"], timeout=60) is not None
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    held = {m.decode() for m in real_redis.lrange(f"{log}:held", 0, -1)}
    assert len(held) == 10
    # and two more consumers consume everything
    survivors = [start("s1"), start("s2")]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = [r.decode().split("|") for r in real_redis.lrange(log, 0, -1)]
            if len({msgid for _, msgid, _ in rows}) >= total:
                break
            real_redis.blpop(["test:never"], timeout=0.2)  # wait a little, on the server
    finally:
        for proc in survivors:
            proc.kill()
            proc.join(10)
    # Then every message was received; only the killed consumer's batch twice, flagged redelivered
    rows = [r.decode().split("|") for r in real_redis.lrange(log, 0, -1)]
    got = [msgid for _, msgid, _ in rows]
    assert len(set(got)) == total and len(got) == total, "each message received once by the survivors"
    counts = {msgid: int(count) for _, msgid, count in rows}
    assert {m for m, c in counts.items() if c > 1} == held
    assert all(counts[m] == 2 for m in held)
    assert {consumer for consumer, _, _ in rows} <= {"s1", "s2"}  # (how they share the work is theirs)


def test_a_second_consumer_of_an_exclusive_subscription_is_refused(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "only")
    assert record.mode == "exclusive"
    clock = Clock()
    cs = _consumer_settings(settings)
    first = Subscriber(real_redis, QM, record, cs, consumer_id="first", heartbeat=False, clock_ms=clock)
    with pytest.raises(ConsumerConflict) as caught:
        Subscriber(real_redis, QM, record, cs, consumer_id="second", heartbeat=False, clock_ms=clock)
    assert caught.value.holder == "first" and caught.value.exit_code == 3
    # Once the first one closes, a new consumer may attach
    first.close()
    Subscriber(real_redis, QM, record, cs, consumer_id="second", heartbeat=False, clock_ms=clock).close()


def test_active_standby_consumer_takes_over_within_the_lease_with_the_dead_ones_messages(
    real_redis, settings
):
    # Given consumer modes from settings, as in seed 003's queue controllers
    rules = [
        ConsumerMode(predicate="failsave$%", mode="activestandby"),
        ConsumerMode(predicate="%$%", mode="shared"),
    ]
    record = subscribe(real_redis, QM, "/A", "failsave", "orders", consumer_modes=rules)
    assert record.mode == "activestandby"
    assert subscribe(real_redis, QM, "/B", "other", "x", consumer_modes=rules).mode == "shared"
    _publish(real_redis, settings, "/A", [b"1", b"2", b"3"])
    clock = Clock()
    cs = _consumer_settings(settings)
    active = Subscriber(real_redis, QM, record, cs, consumer_id="active", heartbeat=False, clock_ms=clock)
    standby = Subscriber(real_redis, QM, record, cs, consumer_id="standby", heartbeat=False, clock_ms=clock)
    assert not active.standby and standby.standby
    took = active.receive()
    assert took is not None and took.message.body == b"1"
    assert standby.receive() is None and standby.standby  # receives nothing while the active one lives
    # When the active consumer stops renewing its lease, and the lease runs out
    clock.now += LEASE // 2
    standby.heartbeat()
    assert standby.standby  # within the lease: still standby
    clock.now += LEASE // 2 + 1
    standby.heartbeat()
    # Then the standby holds the subscription and gets the dead one's message first, redelivered
    assert not standby.standby
    got = standby.receive_many(10)
    assert [(d.message.body, d.redelivered) for d in got] == [(b"1", True), (b"2", False), (b"3", False)]


def test_abandoned_non_durable_subscription_is_removed_and_durable_stays(real_redis, settings):
    temporary = subscribe(real_redis, QM, "/A", "c")
    durable = subscribe(real_redis, QM, "/A", "c", "keep")
    clock = Clock()
    cs = _consumer_settings(settings, subscription_expiry_ms=5_000)
    for record in (temporary, durable):
        Subscriber(real_redis, QM, record, cs, heartbeat=False, clock_ms=clock).abandon()  # kill -9
    _publish(real_redis, settings, "/A", [b"x"])
    assert real_redis.exists(keys.sub_queue(QM, temporary.sub_id)) == 1
    # Within the expiry: kept
    _, removed = sweep_subscriptions(real_redis, QM, cs, now_ms=clock.now + LEASE + 4_000)
    assert removed == []
    # After it: the non-durable one is removed with its keys, the durable one stays
    _, removed = sweep_subscriptions(real_redis, QM, cs, now_ms=clock.now + LEASE + 5_001)
    assert removed == [temporary.sub_id]
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == [durable.sub_id]
    left = [k.decode() for k in real_redis.scan_iter(match=keys.sub_queue(QM, temporary.sub_id) + "*")]
    assert left == []


def test_a_publication_resolved_before_an_unsubscribe_never_recreates_the_queue(real_redis, settings):
    # Given a worker that dequeued a publication while the subscription existed
    record = subscribe(real_redis, QM, "/A", "c", "gone")
    keep = subscribe(real_redis, QM, "/A", "c", "keep")
    Publisher(real_redis, QM, "p").publish("/A", b"x")
    (worker,) = make_workers(real_redis, settings, 1)
    unsubscribed = []

    def hook(point: str) -> None:  # after the dequeue, before the topic is resolved and committed
        if point == "after_dequeue" and not unsubscribed:
            unsubscribe(real_redis, QM, record.sub_id)
            unsubscribed.append(True)

    worker.hook = hook
    drain([worker])
    # Then the removed subscription got nothing and its queue was not made again; the other got it
    assert unsubscribed
    assert real_redis.exists(keys.sub_queue(QM, record.sub_id), keys.sub_bell(QM, record.sub_id)) == 0
    assert real_redis.llen(keys.sub_queue(QM, keep.sub_id)) == 1


def test_higher_priority_is_received_first_and_per_publisher_order_holds_within_a_priority(
    real_redis, settings
):
    record = subscribe(real_redis, QM, "/A", "c", "prio")
    pub = Publisher(real_redis, QM, "p")
    for body, priority in [("low1", 1), ("high1", 9), ("norm1", 4), ("high2", 9), ("low2", 1), ("norm2", 4)]:
        pub.publish("/A", body, priority=priority)
    drain(make_workers(real_redis, settings, 1))
    sub = Subscriber(real_redis, QM, record, _consumer_settings(settings), heartbeat=False)
    got = [d.message.body.decode() for d in sub.receive_many(10)]
    assert got == ["high1", "high2", "norm1", "norm2", "low1", "low2"]


@pytest.mark.parametrize("to_dlq", [False, True])
def test_a_message_that_expires_while_waiting_is_never_handed_over(real_redis, settings, to_dlq):
    record = subscribe(real_redis, QM, "/A", "c", "exp")
    clock = Clock()
    _publish(real_redis, settings, "/A", [b"old"], expiration_ms=clock.now + 60_000)
    _publish(real_redis, settings, "/A", [b"fresh"])
    cs = _consumer_settings(settings, expired_to_dlq=to_dlq)
    sub = Subscriber(real_redis, QM, record, cs, heartbeat=False, clock_ms=clock)
    assert [m.body for m in sub.browse(10)] == [b"old", b"fresh"]
    clock.now += 60_001
    assert [m.body for m in sub.browse(10)] == [b"fresh"]
    got = sub.receive_many(10)
    assert [d.message.body for d in got] == [b"fresh"]
    assert int(real_redis.get(keys.sub_expired(QM, record.sub_id))) == 1
    dead = real_redis.xrange(keys.sub_poison(QM, record.sub_id))
    assert len(dead) == (1 if to_dlq else 0)
    if to_dlq:
        assert b"expired while waiting" in dead[0][1][b"dlq.reason"]


def test_browse_leaves_the_queue_unchanged(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "b")
    _publish(real_redis, settings, "/A", [b"1", b"2", b"3"])
    _publish(real_redis, settings, "/A", [b"urgent"], priority=8)
    sub = Subscriber(real_redis, QM, record, _consumer_settings(settings), heartbeat=False)
    before = {k: real_redis.lrange(k, 0, -1) for k in keys.sub_bands(QM, record.sub_id)}
    assert [m.body for m in sub.browse(3)] == [b"urgent", b"1", b"2"]
    assert {k: real_redis.lrange(k, 0, -1) for k in keys.sub_bands(QM, record.sub_id)} == before
    assert sub.depth() == 4
    assert [d.message.body for d in sub.receive_many(10)] == [b"urgent", b"1", b"2", b"3"]


def test_no_local_skips_the_subscribers_own_publications(real_redis, settings):
    mine = subscribe(real_redis, QM, "/chat", "alice", "room", no_local=True)
    everyone = subscribe(real_redis, QM, "/chat", "bob", "room")
    _publish(real_redis, settings, "/chat", [b"from alice"], client_id="alice", publisher="pa")
    _publish(real_redis, settings, "/chat", [b"from bob"], client_id="bob", publisher="pb")
    _publish(real_redis, settings, "/chat", [b"anonymous"], publisher="pc")
    cs = _consumer_settings(settings)
    alice = Subscriber(real_redis, QM, mine, cs, heartbeat=False)
    bob = Subscriber(real_redis, QM, everyone, cs, heartbeat=False)
    assert [d.message.body for d in alice.receive_many(10)] == [b"from bob", b"anonymous"]
    assert len(bob.receive_many(10)) == 3


def test_selector_decides_at_fan_out_on_header_and_properties(real_redis, settings):
    eu = subscribe(real_redis, QM, "/orders", "c", "eu", selector="region = 'eu' AND JMSPriority > 4")
    all_ = subscribe(real_redis, QM, "/orders", "c", "all")
    pub = Publisher(real_redis, QM, "p")
    pub.publish("/orders", b"1", properties={"region": "eu"}, priority=7)
    pub.publish("/orders", b"2", properties={"region": "eu"})  # priority 4: not > 4
    pub.publish("/orders", b"3", properties={"region": "us"}, priority=9)
    pub.publish("/orders", b"4", priority=9)  # region unknown: not selected
    drain(make_workers(real_redis, settings, 1))
    cs = _consumer_settings(settings)
    assert [d.message.body for d in Subscriber(real_redis, QM, eu, cs, heartbeat=False).receive_many(10)] == [
        b"1"
    ]
    assert subscription_load(real_redis, QM, all_.sub_id).depth == 4


def test_durable_subscription_keeps_collecting_after_close_and_non_durable_is_removed(real_redis, settings):
    durable = subscribe(real_redis, QM, "/A", "c", "keep")
    temporary = subscribe(real_redis, QM, "/A", "c")
    cs = _consumer_settings(settings)
    Subscriber(real_redis, QM, durable, cs, heartbeat=False).close()
    Subscriber(real_redis, QM, temporary, cs, heartbeat=False).close()
    _publish(real_redis, settings, "/A", [b"while away"])
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["c$keep"]
    back = Subscriber(real_redis, QM, subscribe(real_redis, QM, "/A", "c", "keep"), cs, heartbeat=False)
    delivery = back.receive()
    assert delivery is not None and delivery.message.body == b"while away"
    assert real_redis.exists(keys.sub_queue(QM, temporary.sub_id)) == 0


def test_receive_blocks_until_a_message_arrives_and_close_gives_unacked_messages_back(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "blk")
    cs = _consumer_settings(settings)
    sub = Subscriber(real_redis, QM, record, cs, heartbeat=False)
    assert sub.receive(timeout_ms=50) is None
    _publish(real_redis, settings, "/A", [b"1", b"2"])
    assert real_redis.llen(keys.sub_bell(QM, record.sub_id)) == 1
    got = sub.receive_many(1, timeout_ms=1_000)
    assert [d.message.body for d in got] == [b"1"]
    sub.close()
    again = Subscriber(real_redis, QM, record, cs, heartbeat=False)
    assert [(d.message.body, d.delivery_count) for d in again.receive_many(5)] == [(b"1", 2), (b"2", 1)]


def test_a_foreign_key_in_one_subscription_does_not_stop_the_sweep_of_the_others(real_redis, settings):
    bad = subscribe(real_redis, QM, "/A", "a", "bad")
    temporary = subscribe(real_redis, QM, "/A", "z")
    real_redis.set(keys.sub_consumers(QM, bad.sub_id), "not a zset")
    clock = Clock()
    cs = _consumer_settings(settings, subscription_expiry_ms=5_000)
    _, removed = sweep_subscriptions(real_redis, QM, cs, now_ms=clock.now + 60_000)
    assert removed == [temporary.sub_id]
    assert real_redis.get(keys.sub_consumers(QM, bad.sub_id)) == b"not a zset"  # never written over


def test_messages_left_in_flight_by_a_protocol_2_subscriber_are_given_back_oldest_first(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "old")
    _publish(real_redis, settings, "/A", [b"1", b"2", b"3"])
    queue, legacy = keys.sub_queue(QM, record.sub_id), keys.sub_inflight(QM, record.sub_id)
    for _ in range(2):  # a protocol-2 subscriber took two and was upgraded away
        real_redis.lmove(queue, legacy, "RIGHT", "LEFT")
    sub = Subscriber(real_redis, QM, record, _consumer_settings(settings), heartbeat=False)
    assert [d.message.body for d in sub.receive_many(10)] == [b"1", b"2", b"3"]
    assert real_redis.exists(legacy) == 0
