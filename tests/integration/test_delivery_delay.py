"""Delivery delay (Jakarta Messaging 2.0 section 7.9, ``JMSDeliveryTime``; Artemis scheduled delivery).

A publication with a delivery time reaches no subscriber before it, keeps every field, and
publications of one publisher with equal delivery times keep their order. The workers' clocks are
injected (``Worker(clock_ms=...)``): nothing sleeps. The moves in and out of ``{qm}:delayed`` are
inside the one ``dequeue.lua`` call, so a worker dying at any crash point loses nothing.
"""

from __future__ import annotations

import json

import pytest

from broker import Publisher
from broker.core import clock, keys
from broker.core.errors import InvalidMessage
from broker.core.models import MAX_DELIVERY_DELAY_MS
from broker.operations.status import status
from broker.testing import Collector, drain
from worker.delays import STANDBY_MS
from worker.loop import Worker

QM = "TEST"


class Clock:
    """A worker clock a test moves by hand, ms since the epoch."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Died(BaseException):
    """A worker's death at a crash point (simulated in-process)."""


def _workers(client, settings, clock_ms: Clock, count: int = 1, hook=None) -> list[Worker]:
    workers = [Worker(client, settings, name=f"w{i}", clock_ms=clock_ms, hook=hook) for i in range(count)]
    for worker in workers:
        worker.setup()
    return workers


def test_a_delayed_publication_reaches_no_subscriber_before_its_delivery_time(real_redis, settings):
    # Given a subscriber and a publication sent at t0 with a delivery delay of 5 s
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, settings, "/orders/#")
    workers = _workers(real_redis, settings, now)
    publisher = Publisher(real_redis, QM, "p")
    publisher.publish("/orders/1", b"later", msgid="m1", timestamp_ms=t0, delivery_delay_ms=5_000)
    publisher.publish("/orders/2", b"now", msgid="m2", timestamp_ms=t0)

    # When the workers run before the delivery time
    drain(workers)
    now.now = t0 + 4_999
    drain(workers)

    # Then only the undelayed one is delivered, and status counts the one waiting
    assert [m.msgid for m in collector.collect()] == ["m2"]
    snapshot = status(real_redis, QM)
    assert (snapshot.delayed, snapshot.next_delivery_ms) == (1, t0 + 5_000)

    # When the delivery time comes
    now.now = t0 + 5_000
    drain(workers)

    # Then it is delivered once, with its msgid, publish time and delivery time
    [message] = collector.collect()
    assert (message.msgid, message.body, message.topic) == ("m1", b"later", "/orders/1")
    assert (message.timestamp_ms, message.delivery_time_ms) == (t0, t0 + 5_000)
    assert status(real_redis, QM).delayed == 0
    now.now = t0 + 60_000
    drain(workers)
    assert collector.collect() == []


def test_a_raw_entry_with_a_delivery_time_field_waits_and_keeps_every_field(real_redis, settings):
    # Given an entry XADDed by another language's client with a delivery_time and no msgid
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, settings, "/raw")
    workers = _workers(real_redis, settings, now)
    entry_id = real_redis.xadd(
        keys.publish_stream(QM),
        {"publisher": "x", "topic": "/raw", "body": b"\xff\x00bin", "delivery_time": str(t0 + 100)},
    ).decode()

    # When the workers run before, then at its delivery time
    drain(workers)
    assert collector.collect() == []
    now.now = t0 + 100
    drain(workers)

    # Then it is delivered with its bytes, its msgid and publish time those of the entry published
    [message] = collector.collect()
    assert message.body == b"\xff\x00bin"
    assert message.msgid == entry_id
    assert message.timestamp_ms == int(entry_id.split("-")[0])
    assert message.delivery_time_ms == t0 + 100


def test_equal_delivery_times_keep_publication_order_across_dequeues(real_redis, settings):
    # Given small batches (several dequeues) and one publisher's publications with one delivery time,
    # some read before it and some after it
    small = settings.model_copy(update={"batch_size": 2, "heads": 2})
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, small, "/t")
    workers = _workers(real_redis, small, now, count=2)
    publisher = Publisher(real_redis, QM, "p")
    for n in range(6):
        publisher.publish("/t", f"{n}", msgid=f"m{n}", timestamp_ms=t0, delivery_delay_ms=1_000)
    drain(workers)
    for n in range(6, 12):
        publisher.publish("/t", f"{n}", msgid=f"m{n}", timestamp_ms=t0, delivery_delay_ms=1_000)

    # When the delivery time has come for all of them
    now.now = t0 + 1_000 + STANDBY_MS
    drain(workers)

    # Then each is delivered once, in publication order
    assert [m.msgid for m in collector.collect()] == [f"m{n}" for n in range(12)]


def test_later_delivery_times_go_after_earlier_ones(real_redis, settings):
    # Given one publisher's publications with decreasing delivery delays
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, settings, "/t")
    workers = _workers(real_redis, settings, now)
    publisher = Publisher(real_redis, QM, "p")
    for n, delay in enumerate([300, 200, 100]):
        publisher.publish("/t", b"", msgid=f"m{n}", timestamp_ms=t0, delivery_delay_ms=delay)

    # When the clock passes each delivery time
    seen = []
    for at in (t0 + 100, t0 + 200, t0 + 300):
        now.now = at
        drain(workers)
        seen.append([m.msgid for m in collector.collect()])

    # Then each is delivered at its own time
    assert seen == [["m2"], ["m1"], ["m0"]]


@pytest.mark.parametrize("point", ["after_dequeue", "holding_turn", "before_commit", "after_commit"])
def test_a_worker_dying_around_the_moves_loses_and_duplicates_nothing(real_redis, settings, point):
    # Given delayed publications and a worker that dies at a crash point, both in the round that
    # delays them and in the round that releases them
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, settings, "/t")
    publisher = Publisher(real_redis, QM, "p")
    for n in range(5):
        publisher.publish("/t", b"", msgid=f"m{n}", timestamp_ms=t0, delivery_delay_ms=500 if n % 2 else 0)

    def die(at: str) -> None:
        if at == point:
            raise Died(at)

    for _ in range(2):
        [victim] = _workers(real_redis, settings, now, hook=die)
        victim.delays.next_due_ms = t0 + 500  # it knows the delivery time (its own dequeue)
        with pytest.raises(Died):
            victim.run_once()
        for turn in real_redis.keys(keys.pub_prefix(QM) + "*:turn"):  # its leases ran out
            real_redis.delete(turn)
        now.now = t0 + 500

    # When a fresh worker (knowing nothing) takes over once the delivery time has come
    [survivor] = _workers(real_redis, settings, now)
    now.now = t0 + 500 + STANDBY_MS
    drain([survivor])
    for _ in range(2):
        survivor.housekeeping.sweep_entries(0)
        survivor.housekeeping.sweep_turns()
        drain([survivor])

    # Then each publication is delivered exactly once: the undelayed ones first, each group in order
    assert [m.msgid for m in collector.collect()] == ["m0", "m2", "m4", "m1", "m3"]
    assert status(real_redis, QM).delayed == 0


def test_a_restarted_worker_releases_what_waits_one_standby_after_its_time(real_redis, settings):
    # Given a publication delayed by a worker that then stopped
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, settings, "/t")
    Publisher(real_redis, QM, "p").publish("/t", b"", msgid="m", timestamp_ms=t0, delivery_delay_ms=50)
    drain(_workers(real_redis, settings, now))

    # When a new worker starts (it reads the earliest delivery time with its heartbeat)
    [fresh] = _workers(real_redis, settings, now)
    assert fresh.delays.next_due_ms == t0 + 50 + STANDBY_MS
    now.now = t0 + 50 + STANDBY_MS - 1
    drain([fresh])
    assert collector.collect() == []
    now.now = t0 + 50 + STANDBY_MS
    drain([fresh])

    # Then it is delivered once it is due
    assert [m.msgid for m in collector.collect()] == ["m"]


@pytest.mark.parametrize("delay", [-1, MAX_DELIVERY_DELAY_MS + 1, "5", 2.5, True])
def test_a_bad_delivery_delay_is_refused_before_anything_is_written(real_redis, delay):
    publisher = Publisher(real_redis, QM, "p")
    with pytest.raises(InvalidMessage, match="delivery_delay_ms"):
        publisher.publish("/t", b"", delivery_delay_ms=delay)
    assert real_redis.xlen(keys.publish_stream(QM)) == 0


@pytest.mark.parametrize("value", ["soon", " 5", "-5", "1234567890123456", "١٢"])
def test_a_bad_delivery_time_field_is_dead_lettered_with_the_reason(real_redis, settings, value):
    # Given a raw entry whose delivery_time is not 1-15 ASCII digits
    now = Clock(clock.now_ms())
    workers = _workers(real_redis, settings, now)
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "x", "topic": "/t", "msgid": "bad", "delivery_time": value}
    )

    # When the workers run
    drain(workers)

    # Then it is refused and dead-lettered with the reason, and nothing waits
    [(_, letter)] = real_redis.xrange(keys.dead_letter(QM))
    assert b"delivery_time" in letter[b"dlq.reason"]
    assert status(real_redis, QM).delayed == 0


def test_a_foreign_delayed_key_dead_letters_the_delayed_publication_and_status_names_it(real_redis, settings):
    # Given {qm}:delayed of another type
    real_redis.set(keys.delayed(QM), "x")
    now = Clock(clock.now_ms())
    collector = Collector(real_redis, settings, "/t")
    workers = _workers(real_redis, settings, now)
    publisher = Publisher(real_redis, QM, "p")
    publisher.publish("/t", b"", msgid="late", delivery_delay_ms=10)
    publisher.publish("/t", b"", msgid="now")

    # When the workers run
    drain(workers)

    # Then the undelayed one is delivered, the delayed one dead-lettered with the reason
    assert [m.msgid for m in collector.collect()] == ["now"]
    [(_, letter)] = real_redis.xrange(keys.dead_letter(QM))
    assert b"foreign key" in letter[b"dlq.reason"] and letter[b"msgid"] == b"late"
    assert any(keys.delayed(QM) in p for p in status(real_redis, QM).problems)


def test_status_json_shows_the_delayed_count_and_next_due_time(run, real_redis, settings):
    t0 = clock.now_ms()
    Publisher(real_redis, QM, "p").publish("/t", b"", timestamp_ms=t0, delivery_delay_ms=60_000)
    drain(_workers(real_redis, settings, Clock(t0)))

    result = run("status", "--json")

    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["delayed"], shown["next_delivery_ms"]) == (1, t0 + 60_000)
    assert "delayed (waiting for their delivery time)" in run("status").output


def test_broker_publish_delay_ms_is_checked_and_carried(run, real_redis):
    refused = run("publish", "/t", "x", "--delay-ms", "-5", "--no-wait")
    assert refused.exit_code == 2 and "--delay-ms" in refused.output

    sent = run("publish", "/t", "x", "--delay-ms", "5000", "--no-wait")

    assert sent.exit_code == 0, sent.output
    [(_, fields)] = real_redis.xrange(keys.publish_stream(QM))
    assert int(fields[b"delivery_time"]) - clock.now_ms() in range(3_000, 5_001)


def test_more_delayed_publications_than_one_call_moves_are_all_delivered_in_order(real_redis, settings):
    # Given 1,200 delayed publications read in one dequeue (over the 1,000 one ZADD and one release take)
    big = settings.model_copy(update={"batch_size": 1_500, "heads": 1_500})
    t0 = clock.now_ms()
    now = Clock(t0)
    collector = Collector(real_redis, big, "/t")
    workers = _workers(real_redis, big, now)
    pipe = real_redis.pipeline(transaction=False)
    for n in range(1_200):
        pipe.xadd(
            keys.publish_stream(QM),
            {"publisher": "p", "topic": "/t", "msgid": f"m{n}", "delivery_time": t0 + 10},
        )
    pipe.execute()
    drain(workers)
    assert status(real_redis, QM).delayed == 1_200

    # When their delivery time comes
    now.now = t0 + 10
    drain(workers)

    # Then every one is delivered once, in order
    assert [m.msgid for m in collector.collect(batch=2_000)] == [f"m{n}" for n in range(1_200)]
    assert status(real_redis, QM).delayed == 0
