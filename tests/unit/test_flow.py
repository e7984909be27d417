"""Flow control: the bulk publisher waits while the workers' backlog is at the bound."""

from __future__ import annotations

import pytest

from broker import keys
from broker.errors import BacklogTimeout
from broker.flow import backlog, wait_for_room

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

    from broker import keys
    from broker.errors import ForeignKey
    from broker.stream import ensure_group, group_state

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
