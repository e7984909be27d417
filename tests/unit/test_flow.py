"""Flow control: the bulk publisher waits while the workers' backlog is at the bound."""

from __future__ import annotations

import pytest

from broker.core import keys
from broker.core.errors import BacklogTimeout
from broker.core.flow import backlog, wait_for_room
from broker.testing import FakeTime

QM = "TEST"


def _publish(client, n: int) -> list[bytes]:
    return [client.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": "/t"}) for _ in range(n)]


def _group(client) -> None:
    client.xgroup_create(keys.publish_stream(QM), keys.WORKER_GROUP, id="0")


def _read(client, n: int) -> list[bytes]:
    got = client.xreadgroup(keys.WORKER_GROUP, "w0", {keys.publish_stream(QM): ">"}, count=n)
    return [entry_id for entry_id, _ in got[0][1]] if got else []


def test_backlog_is_the_stream_length_before_any_worker_made_the_group(any_redis):
    # Given nothing published, then 3 publications and no consumer group
    assert backlog(any_redis, QM) == 0
    _publish(any_redis, 3)
    # Then every entry counts
    assert backlog(any_redis, QM) == 3


def test_backlog_counts_unread_and_pending_but_not_acknowledged_entries(any_redis):
    # Given 5 publications, 3 read by a worker, 1 of those acknowledged
    _publish(any_redis, 5)
    _group(any_redis)
    read = _read(any_redis, 3)
    any_redis.xack(keys.publish_stream(QM), keys.WORKER_GROUP, read[0])
    # Then the backlog is 2 unread + 2 pending
    assert backlog(any_redis, QM) == 4


def test_backlog_counts_unread_entries_when_the_server_cannot_tell_the_lag(any_redis):
    # Given 5 publications, 1 read, and an unread one deleted (the server's lag becomes nil)
    ids = _publish(any_redis, 5)
    _group(any_redis)
    _read(any_redis, 1)
    any_redis.xdel(keys.publish_stream(QM), ids[3])
    assert any_redis.xinfo_groups(keys.publish_stream(QM))[0]["lag"] is None
    # Then the 3 entries left after the last read one are counted, plus the pending one
    assert backlog(any_redis, QM) == 4
    assert backlog(any_redis, QM, limit=2) == 3


def test_wait_for_room_returns_at_once_below_the_bound(any_redis):
    _publish(any_redis, 2)

    def no_sleep(ms: float) -> None:
        raise AssertionError("must not wait")

    assert wait_for_room(any_redis, QM, max_backlog=3, sleep_ms=no_sleep) == 2


def test_wait_for_room_blocks_until_the_workers_acknowledge_enough(any_redis):
    # Given 4 publications and a bound of 2
    _publish(any_redis, 4)
    _group(any_redis)
    polls: list[int] = []

    def worker_acks_one(ms: float) -> None:  # each poll interval, a worker commits one entry
        polls.append(int(ms))
        for entry_id in _read(any_redis, 1):
            any_redis.xack(keys.publish_stream(QM), keys.WORKER_GROUP, entry_id)

    # When the publisher waits for room
    seen = wait_for_room(any_redis, QM, max_backlog=2, poll_ms=7, sleep_ms=worker_acks_one)
    # Then it waited exactly until the backlog fell below the bound, polling every 7 ms
    assert seen == 1
    assert polls == [7, 7, 7]


def test_wait_for_room_raises_reply_timeout_when_no_worker_makes_progress(any_redis):
    # Given a backlog at the bound and a clock that advances 50 ms per poll
    _publish(any_redis, 2)
    now = [0.0]

    def sleep(ms: float) -> None:
        now[0] += ms

    # Then after the timeout the publisher is told why
    with pytest.raises(BacklogTimeout, match="backlog stayed at 2 >= 2"):
        wait_for_room(
            any_redis, QM, max_backlog=2, poll_ms=50, timeout_ms=200, clock_ms=lambda: now[0], sleep_ms=sleep
        )
    assert now[0] == 200


def test_wait_for_room_refuses_a_bound_below_one(fake_redis):
    with pytest.raises(ValueError, match="max_backlog"):
        wait_for_room(fake_redis, QM, max_backlog=0)


def test_group_state_reads_pending_lag_and_acknowledged_and_names_a_foreign_stream(real_redis):
    import pytest

    from broker.core import keys
    from broker.core.errors import ForeignKey
    from broker.core.stream import ensure_group, group_state

    # Given no stream yet
    assert group_state(real_redis, "GS").exists is False
    # When the group exists, 5 entries are added, 3 read and 1 of them acknowledged
    ensure_group(real_redis, "GS")
    stream = keys.publish_stream("GS")
    for i in range(5):
        real_redis.xadd(stream, {"n": i})
    read = real_redis.xreadgroup(keys.WORKER_GROUP, "c", {stream: ">"}, count=3)[0][1]
    real_redis.xack(stream, keys.WORKER_GROUP, read[0][0])
    state = group_state(real_redis, "GS")
    # Then
    assert (state.exists, state.length, state.pending, state.lag, state.acknowledged) == (True, 5, 2, 2, 1)
    # And a string where the stream belongs is named, not a raw WRONGTYPE
    real_redis.delete(stream)
    real_redis.set(stream, "x")
    with pytest.raises(ForeignKey, match="holds a string"):
        group_state(real_redis, "GS")
    with pytest.raises(ForeignKey):
        ensure_group(real_redis, "GS")


# -- delay-based flow control: what a publisher keeps of the broker's delay ----------------------


@pytest.mark.parametrize(
    ("raw", "delay"), [(None, 0), (b"250", 250), ("7", 7), (b"-3", 0), (b"soon", 0), (ValueError("x"), 0)]
)
def test_parse_delay_reads_a_flow_key_value_or_gives_zero(raw, delay):
    from broker.core.flow import parse_delay

    assert parse_delay(raw) == delay


def test_flow_gate_waits_what_is_left_of_the_largest_delay_once():
    from broker.core.flow import FlowGate

    t = FakeTime(1_000.0)
    gate = FlowGate(clock_ms=t.clock, sleep_ms=t.sleep)
    assert gate.wait() == 0 and t.slept == []  # nothing learnt: no wait
    gate.learn(100)
    gate.learn(40)  # a smaller delay does not shorten the larger one
    t.now += 30  # the publisher spent 30 ms on something else meanwhile
    assert gate.wait() == 70
    assert t.slept == [70]
    assert gate.wait() == 0 and t.slept == [70]  # owed once
    gate.learn(0)
    assert gate.wait() == 0 and gate.waited_ms == 70


def test_a_disabled_flow_gate_never_waits():
    from broker.core.flow import FlowGate

    t = FakeTime()
    gate = FlowGate(enabled=False, clock_ms=t.clock, sleep_ms=t.sleep)
    gate.learn(500)
    assert gate.wait() == 0 and t.slept == []


def test_publisher_reads_its_flow_key_with_the_xadd_and_waits_before_the_next(fake_redis):
    from broker.clients.publish import Publisher

    # Given the broker asked publisher p to wait 250 ms
    t = FakeTime()
    pub = Publisher(fake_redis, QM, "p", clock_ms=t.clock, sleep_ms=t.sleep)
    fake_redis.set(keys.flow_key(QM, "p"), "250", px=250)
    # When it publishes without waiting for the result
    first = pub.publish("/t", b"1")
    # Then the result says so, and it has not waited yet
    assert first.flow_control_delay_ms == 250 and t.slept == []
    # When the key is gone and it publishes again, it waits the delay first
    fake_redis.delete(keys.flow_key(QM, "p"))
    second = pub.publish("/t", b"2")
    assert t.slept == [250]
    assert second.flow_control_delay_ms == 0
    pub.publish("/t", b"3")
    assert t.slept == [250]
    assert fake_redis.xlen(keys.publish_stream(QM)) == 3


def test_publisher_without_flow_control_neither_reads_the_key_nor_waits(fake_redis, monkeypatch):
    from broker.clients.publish import Publisher

    t = FakeTime()
    fake_redis.set(keys.flow_key(QM, "p"), "250")
    pub = Publisher(fake_redis, QM, "p", flow_control=False, clock_ms=t.clock, sleep_ms=t.sleep)

    def no_get(*args, **kwargs):
        raise AssertionError("the flow key must not be read")

    monkeypatch.setattr(fake_redis, "get", no_get)
    results = [pub.publish("/t", b"1"), pub.publish("/t", b"2")]
    assert [r.flow_control_delay_ms for r in results] == [0, 0] and t.slept == []


def test_publish_many_reads_the_flow_key_once_per_batch_and_waits_before_the_next_batch(fake_redis):
    from broker.clients.publish import Publisher

    t = FakeTime()
    pub = Publisher(fake_redis, QM, "p", clock_ms=t.clock, sleep_ms=t.sleep)
    fake_redis.set(keys.flow_key(QM, "p"), "80")
    reads: list[str] = []
    real_pipeline = fake_redis.pipeline

    def counting_pipeline(*args, **kwargs):
        pipe = real_pipeline(*args, **kwargs)
        original = pipe.get

        def get(name):
            reads.append(name)
            return original(name)

        pipe.get = get
        return pipe

    fake_redis.pipeline = counting_pipeline
    results = pub.publish_many([("/t", str(i)) for i in range(5)], batch=2)
    # 3 batches (2 + 2 + 1): one read each, and a wait of 80 ms before the 2nd and the 3rd
    assert reads == [keys.flow_key(QM, "p")] * 3
    assert t.slept == [80, 80]
    assert [r.flow_control_delay_ms for r in results] == [80] * 5
    assert fake_redis.xlen(keys.publish_stream(QM)) == 5


def test_a_foreign_flow_key_does_not_fail_the_publication(fake_redis):
    from broker.clients.publish import Publisher

    fake_redis.rpush(keys.flow_key(QM, "p"), "not a delay")
    pub = Publisher(fake_redis, QM, "p")
    assert pub.publish("/t", b"1").flow_control_delay_ms == 0
    assert pub.publish_many([("/t", "2")])[0].status == "sent"
    assert fake_redis.xlen(keys.publish_stream(QM)) == 2
