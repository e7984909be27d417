"""Batch receive and acknowledgement on the real server (``receive.lua``, ``ack.lua``).

Envelopes are written straight into the subscriber queues as a worker writes them
(``encode_envelope``, LPUSH), so that batches of any size are cheap to set up. Leases
are driven by an injected clock; the crash-point tests run real consumer processes that
SIGKILL themselves at a named point (``broker.clients.consumer.CRASH_POINTS``) and are joined.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import time

import pytest

from broker import subscribe
from broker.clients.consumer import CRASH_POINTS, Delivery, Subscriber
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import ForeignKey, InvalidMessage
from broker.core.models import encode_envelope
from scripts.rig.consumers import run_crashing_consumer

QM = "TEST"
LEASE = 1_000


class Clock:
    """A hand-driven clock, ms since the epoch."""

    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


class Died(BaseException):
    """A consumer's death at a crash point (simulated in-process)."""


def _settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"consumer_lease_ms": LEASE})


def _envelope(n: int, priority: int = 4, expiration_ms: int = 0) -> bytes:
    header: dict[str, object] = {
        "v": keys.PROTOCOL_VERSION,
        "msgid": f"m{n}",
        "publisher": "p",
        "seq": n,
        "topic": "/batch",
        "ts": 1,
        "entry_id": f"1-{n}",
        "size": 1,
    }
    if priority != 4:
        header["priority"] = priority
    if expiration_ms:
        header["expiration"] = expiration_ms
    return encode_envelope(header, b"x")


def _fill(client, sub_id: str, numbers: range, priority: int = 4, **options: int) -> None:
    """LPUSH the envelopes of ``numbers`` into a band, oldest first (the oldest ends rightmost)."""
    band = keys.sub_band(QM, sub_id, priority)
    envelopes = [_envelope(n, priority, **options) for n in numbers]
    for i in range(0, len(envelopes), 1000):
        client.lpush(band, *envelopes[i : i + 1000])


def _msgids(deliveries) -> list[str]:
    return [d.message.msgid for d in deliveries]


def _in_flight(client, sub_id: str, consumer: str) -> list[str]:
    """The consumer's in-flight messages, newest first (as the list holds them)."""
    raw = client.lrange(keys.consumer_inflight(QM, sub_id, consumer), 0, -1)
    return [json.loads(e.partition(b"\n")[0])["msgid"] for e in raw]


def test_a_large_batch_comes_oldest_first_and_is_held_as_one_move_at_a_time_would_hold_it(
    real_redis, settings
):
    # Given 2,500 messages waiting (more than one LPUSH of receive.lua takes)
    record = subscribe(real_redis, QM, "/batch", "b", "large")
    _fill(real_redis, record.sub_id, range(2500))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    # When one call takes 2,400 of them
    got = consumer.receive_many(2400)
    # Then they come oldest first, the in-flight list holds them newest on the left, 100 wait
    assert _msgids(got) == [f"m{n}" for n in range(2400)]
    assert _in_flight(real_redis, record.sub_id, "c") == [f"m{n}" for n in reversed(range(2400))]
    assert consumer.depth() == 100
    # and acknowledging them all at once empties the in-flight list
    assert consumer.ack_many(got) == 2400
    assert consumer.in_flight() == 0
    assert _msgids(consumer.receive_many(1000)) == [f"m{n}" for n in range(2400, 2500)]


def test_a_batch_spans_priority_bands_highest_first_and_expired_ones_are_replaced(real_redis, settings):
    # Given messages of priority 2, 4 and 7, some of priority 4 expired while waiting
    record = subscribe(real_redis, QM, "/batch", "b", "bands")
    clock = Clock()
    _fill(real_redis, record.sub_id, range(3), priority=2)
    _fill(real_redis, record.sub_id, range(10, 13))
    _fill(real_redis, record.sub_id, range(13, 15), expiration_ms=clock.now - 1)
    _fill(real_redis, record.sub_id, range(15, 17))
    _fill(real_redis, record.sub_id, range(20, 22), priority=7)
    consumer = Subscriber(
        real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False, clock_ms=clock
    )
    # When a consumer asks for 8
    got = consumer.receive_many(8)
    # Then it gets priority 7, then 4 (without the expired ones), then the oldest of priority 2
    assert _msgids(got) == ["m20", "m21", "m10", "m11", "m12", "m15", "m16", "m0"]
    assert real_redis.get(keys.sub_expired(QM, record.sub_id)) == b"2"
    assert consumer.ack_many(got) == 8
    assert _msgids(consumer.receive_many(8)) == ["m1", "m2"]


def test_acknowledging_the_older_of_two_batches_then_the_newer_leaves_nothing_in_flight(real_redis, settings):
    record = subscribe(real_redis, QM, "/batch", "b", "two")
    _fill(real_redis, record.sub_id, range(20))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    first, second = consumer.receive_many(10), consumer.receive_many(10)
    # the newer batch first: not the oldest in flight, so each is looked for
    assert consumer.ack_many(reversed(second)) == 10
    assert _in_flight(real_redis, record.sub_id, "c") == [f"m{n}" for n in reversed(range(10))]
    # then the older one, in any order
    assert consumer.ack_many(first[::-1]) == 10
    assert consumer.in_flight() == 0


def test_acknowledging_a_subset_keeps_the_rest_in_flight_and_a_dead_consumer_gives_it_back_in_order(
    real_redis, settings
):
    # Given a consumer that took 10 and acknowledged every other one, then died
    record = subscribe(real_redis, QM, "/batch", "b", "subset")
    _fill(real_redis, record.sub_id, range(10))
    clock = Clock()
    cs = _settings(settings)
    first = Subscriber(real_redis, QM, record, cs, consumer_id="first", heartbeat=False, clock_ms=clock)
    got = first.receive_many(10)
    assert first.ack_many(got[::2]) == 5
    assert first.ack_many(got[::2]) == 0  # acknowledged already: nothing changes
    assert _in_flight(real_redis, record.sub_id, "first") == ["m9", "m7", "m5", "m3", "m1"]
    # When its lease has passed and another consumer attaches
    clock.now += LEASE + 1
    second = Subscriber(real_redis, QM, record, cs, consumer_id="second", heartbeat=False, clock_ms=clock)
    again = second.receive_many(100)
    # Then only the unacknowledged ones come again, in order, counted
    assert [(d.message.msgid, d.delivery_count) for d in again] == [(f"m{n}", 2) for n in (1, 3, 5, 7, 9)]
    assert second.ack_many(again) == 5
    assert second.in_flight() == 0 and second.depth() == 0
    assert real_redis.exists(keys.sub_redelivered(QM, record.sub_id)) == 0  # the counts are forgotten


def test_a_late_acknowledgement_after_recovery_changes_nothing_and_nothing_is_lost_or_doubled(
    real_redis, settings
):
    # Given a consumer whose lease lapsed while it held a batch, and whose messages were given back
    record = subscribe(real_redis, QM, "/batch", "b", "late")
    _fill(real_redis, record.sub_id, range(30))
    clock = Clock()
    cs = _settings(settings)
    slow = Subscriber(real_redis, QM, record, cs, consumer_id="slow", heartbeat=False, clock_ms=clock)
    held = slow.receive_many(10)
    clock.now += LEASE + 1
    other = Subscriber(real_redis, QM, record, cs, consumer_id="other", heartbeat=False, clock_ms=clock)
    assert other.recover_dead() == (0, 0, 0)  # the other's attach already gave them back
    assert real_redis.llen(keys.consumer_inflight(QM, record.sub_id, "slow")) == 0
    taken = other.receive_many(5)
    # When the slow consumer acknowledges its old batch
    assert slow.ack_many(held) == 0
    # Then nothing was removed: the other's in-flight messages and the waiting ones are intact,
    # and every message is received exactly once more, the given-back ones counted
    assert _in_flight(real_redis, record.sub_id, "other") == [f"m{n}" for n in reversed(range(5))]
    rest = other.receive_many(100)
    assert other.ack_many(taken + rest) == 30
    counts = {d.message.msgid: d.delivery_count for d in taken + rest}
    assert len(taken + rest) == len(counts) == 30
    assert counts == {f"m{n}": 2 if n < 10 else 1 for n in range(30)}
    assert other.depth() == 0 and other.in_flight() == 0


def test_acknowledging_nothing_or_the_same_delivery_twice_counts_it_once(real_redis, settings):
    record = subscribe(real_redis, QM, "/batch", "b", "twice")
    _fill(real_redis, record.sub_id, range(3))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    got = consumer.receive_many(3)
    assert consumer.ack_many([]) == 0
    assert consumer.ack_many([got[0], got[0]]) == 1
    assert consumer.ack_many(got) == 2
    assert consumer.in_flight() == 0


def test_a_plain_command_consumer_and_the_scripts_share_the_protocol(real_redis, settings):
    # Given a consumer in another language that moves messages with LMOVE and acknowledges with LREM
    record = subscribe(real_redis, QM, "/batch", "b", "plain")
    _fill(real_redis, record.sub_id, range(4))
    inflight = keys.consumer_inflight(QM, record.sub_id, "c")
    moved = [real_redis.lmove(keys.sub_queue(QM, record.sub_id), inflight, "RIGHT", "LEFT") for _ in range(2)]
    assert real_redis.lrem(inflight, -1, moved[0]) == 1
    # When a Python consumer of the same id takes the rest and acknowledges everything it holds
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    got = consumer.receive_many(10)
    assert _msgids(got) == ["m2", "m3"]
    assert _in_flight(real_redis, record.sub_id, "c") == ["m3", "m2", "m1"]
    # Then ack.lua removes exactly what it is given, wherever it is in the list
    assert consumer.ack_many(got) == 2
    assert real_redis.lrange(inflight, 0, -1) == [moved[1]]


def test_a_foreign_in_flight_key_is_reported_before_anything_is_taken_or_removed(real_redis, settings):
    record = subscribe(real_redis, QM, "/batch", "b", "foreign")
    _fill(real_redis, record.sub_id, range(3))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    got = consumer.receive_many(2)
    real_redis.delete(consumer.inflight)
    real_redis.set(consumer.inflight, "not a list")
    with pytest.raises(ForeignKey, match="foreign key"):
        consumer.ack_many(got)
    with pytest.raises(ForeignKey, match="foreign key"):
        consumer.receive_many(1)
    assert real_redis.get(consumer.inflight) == b"not a list" and consumer.depth() == 1


def test_a_foreign_priority_band_is_reported_before_anything_is_taken(real_redis, settings):
    record = subscribe(real_redis, QM, "/batch", "b", "band")
    _fill(real_redis, record.sub_id, range(3))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    real_redis.set(keys.sub_band(QM, record.sub_id, 0), "not a list")
    with pytest.raises(ForeignKey, match="foreign key"):
        consumer.receive_many(10)
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 3 and consumer.in_flight() == 0


def test_the_consumer_functions_work_after_function_flush_and_in_a_pipeline(real_redis, settings):
    record = subscribe(real_redis, QM, "/batch", "b", "flush")
    _fill(real_redis, record.sub_id, range(4))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    # a consumer whose user may load the library loads it again after FUNCTION FLUSH
    real_redis.function_flush()
    got = consumer.receive_many(2)
    real_redis.function_flush()
    assert consumer.ack_many(got) == 2
    # in a pipeline: broker_receive, then broker_ack of what it took
    pipe = real_redis.pipeline()
    args = consumer._receive_args.copy()
    args[1] = 2
    pipe.fcall("broker_receive", 1, consumer.queue, *args)
    (reply,) = pipe.execute()
    pipe = real_redis.pipeline()
    pipe.fcall("broker_ack", 1, consumer.queue, "c", *reply[2::2])
    assert pipe.execute() == [2]
    assert consumer.in_flight() == 0 and consumer.depth() == 0


def _calls(client, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_consumer_that_emptied_the_queue_waits_for_the_bell_before_taking_again(real_redis, settings):
    # Given a consumer whose last receive took every waiting message
    record = subscribe(real_redis, QM, "/batch", "b", "bell")
    _fill(real_redis, record.sub_id, range(3))
    consumer = Subscriber(real_redis, QM, record, _settings(settings), consumer_id="c", heartbeat=False)
    assert consumer.ack_many(consumer.receive_many(10)) == 3
    assert real_redis.exists(consumer.bell) == 0  # broker_receive cleared it
    # When a message arrives and rings the bell (as commit.lua does), then it receives with a timeout
    _fill(real_redis, record.sub_id, range(3, 4))
    real_redis.rpush(consumer.bell, "1")
    real_redis.config_resetstat()
    got = consumer.receive_many(10, timeout_ms=5_000)
    # Then it looked at the bell first (rung: no wait), then took the message with one script call
    assert _msgids(got) == ["m3"]
    assert (_calls(real_redis, "blmove"), _calls(real_redis, "fcall")) == (1, 1)
    # A message written without ringing the bell is still taken once the wait is over
    _fill(real_redis, record.sub_id, range(4, 5))
    assert _msgids(consumer.receive_many(10, timeout_ms=200)) == ["m4"]
    # and without a timeout, a receive always takes first
    _fill(real_redis, record.sub_id, range(5, 6))
    assert _msgids(consumer.receive_many(10)) == ["m5"]


def test_a_delivery_decodes_its_envelope_once_when_first_read() -> None:
    delivery = Delivery(None, _envelope(7), 2, "q")
    assert delivery._message is None  # nothing decoded yet
    assert delivery.message.msgid == "m7" and delivery.message is delivery.message
    assert delivery.redelivered and delivery == Delivery(None, _envelope(7), 2)
    garbage = Delivery(None, b'{"msgid": 5}\n', 1, "{TEST}:sub:x")
    with pytest.raises(InvalidMessage, match=r"malformed envelope in \{TEST\}:sub:x"):
        garbage.message  # noqa: B018
    assert garbage.raw == b'{"msgid": 5}\n'


# --------------------------------------------------------------------------
# A consumer that dies at a crash point loses nothing


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_consumer_dying_in_process_at_a_crash_point_loses_nothing(real_redis, settings, point):
    # Given 30 messages and a consumer that dies at the point in its second batch
    record = subscribe(real_redis, QM, "/batch", "b", "die")
    _fill(real_redis, record.sub_id, range(30))
    clock = Clock()
    cs = _settings(settings)
    passed: list[str] = []

    def hook(at: str) -> None:
        passed.append(at)
        if at == point and passed.count(at) == 2:
            raise Died(at)

    victim = Subscriber(
        real_redis, QM, record, cs, consumer_id="victim", heartbeat=False, clock_ms=clock, hook=hook
    )
    acked: list[str] = []
    with pytest.raises(Died):
        while True:
            got = victim.receive_many(10)
            victim.ack_many(got)
            acked += _msgids(got)  # told: acknowledged
    # When its lease passes and another consumer takes everything
    clock.now += LEASE + 1
    other = Subscriber(real_redis, QM, record, cs, consumer_id="other", heartbeat=False, clock_ms=clock)
    rest = other.receive_many(100)
    assert other.ack_many(rest) == len(rest)
    # Then every message was acknowledged once, or twice only when the victim died not knowing
    counts = {d.message.msgid: d.delivery_count for d in rest}
    if point == "after_receive":  # its second batch: taken, never handed over, given back counted
        assert acked == [f"m{n}" for n in range(10)]
        assert counts == {f"m{n}": 2 if n < 20 else 1 for n in range(10, 30)}
    else:  # its second batch: acknowledged, the caller not told; never redelivered
        assert acked == [f"m{n}" for n in range(10)]
        assert counts == {f"m{n}": 1 for n in range(20, 30)}
    assert other.depth() == 0 and other.in_flight() == 0
    assert real_redis.exists(keys.consumer_inflight(QM, record.sub_id, "victim")) == 0


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_consumer_process_sigkilled_at_a_crash_point_loses_nothing(
    real_redis, settings, real_server, tmp_path, point
):
    # Given 50 messages and a consumer process that SIGKILLs itself at the point of its third batch
    record = subscribe(real_redis, QM, "/batch", "b", "kill")
    _fill(real_redis, record.sub_id, range(50))
    log = "test:got"
    plan = json.dumps({"point": point, "action": "kill", "after": 3})
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(
        target=run_crashing_consumer,
        args=(real_server.url, QM, record.sub_id, record.to_json(), "victim", log, str(tmp_path), plan),
        daemon=True,
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert (tmp_path / f"{proc.pid}.kill").read_text() == point
    recorded = [r.decode().split("|")[1] for r in real_redis.lrange(log, 0, -1)]
    held = _in_flight(real_redis, record.sub_id, "victim")
    # When another consumer, once the victim's lease has passed, takes everything
    clock = Clock()
    clock.now += settings.consumer_lease_ms + 1
    other = Subscriber(real_redis, QM, record, settings, consumer_id="other", heartbeat=False, clock_ms=clock)
    rest = other.receive_many(100)
    assert other.ack_many(rest) == len(rest)
    # Then every message was received, the victim's unacknowledged batch again and counted
    counts = {d.message.msgid: d.delivery_count for d in rest}
    if point == "after_receive":
        assert len(recorded) == 20 and sorted(held) == sorted(f"m{n}" for n in range(20, 30))
    else:
        assert len(recorded) == 30 and held == []
    assert {m for m, c in counts.items() if c == 2} == set(held)
    # (what the victim was told it acknowledged never comes again)
    assert set(recorded) | set(counts) == {f"m{n}" for n in range(50)}
    assert len(recorded) + len(counts) == 50
    assert other.depth() == 0 and other.in_flight() == 0
