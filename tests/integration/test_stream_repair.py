"""Issue 24, bug 3: one XADD with an id of the client's choosing, or an operator's DEL or
XGROUP DESTROY, stopped all publishing or all delivery for good.

``XADD '{qm}:publish' 18446744073709551615-18446744073709551615 ...`` exhausted the stream
(every later XADD failed); ``9999999999999-0`` put every later entry in 2286; after a
``DEL {qm}:publish`` or ``XGROUP DESTROY`` the workers looped on NOGROUP, and ``broker
status`` named none of it. Now the workers create the group again (reading what was added
meanwhile, and nothing they read before), status names the stream, and ``broker repair
stream`` moves the pending and unread work to a fresh stream, in order.
"""

from __future__ import annotations

import time

import pytest

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.stream import MAX_ID, group_state
from broker.operations.repair import repair_stream
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from worker.loop import Worker

QM = "TEST"
SUB = "app$all"


def _xadd(client, publisher: str, body: bytes, topic: str = "/T/1") -> None:
    """Publish as a plain client does (``XADD ... *``, no msgid): a second delivery would not be
    a duplicate within the dedup window, so a test sees it."""
    client.xadd(keys.publish_stream(QM), {"publisher": publisher, "topic": topic, "body": body})


def _bodies(client) -> list[bytes]:
    return [m.body for m in queue_messages(client, QM, SUB)]


def _past_millisecond_of(client, entry_id: bytes) -> None:
    """Return once the server's clock is past the millisecond of ``entry_id`` (bounded: the
    clock moves), so that a stream made anew gets later ids than the entries read before."""
    ms = int(entry_id.split(b"-")[0])
    for _ in range(100_000):
        seconds, micros = client.time()
        if seconds * 1000 + micros // 1000 > ms:
            return
    raise AssertionError("the server's clock did not move")


def _stop_at(point: str):
    """A hook that stops a worker's round once, at ``point``."""
    fired: list[str] = []

    def hook(at: str) -> None:
        if at == point and not fired:
            fired.append(at)
            raise RuntimeError(f"stopped at {at}")

    return hook


@pytest.fixture
def pool(real_redis, settings):
    subscribe(real_redis, QM, "/T/#", "app", "all")
    return make_workers(real_redis, settings, 2)


def test_the_pool_recovers_after_the_publish_stream_is_deleted(real_redis, pool):
    # Given publications delivered, two more read by a worker that stopped before committing them
    for body in (b"a", b"b"):
        _xadd(real_redis, "p", body)
    drain(pool)
    reader = Worker(real_redis, pool[0].settings, name="reader", hook=_stop_at("holding_turn"))
    reader.setup()
    for body in (b"read1", b"read2"):
        _xadd(real_redis, "p", body)
    with pytest.raises(RuntimeError):
        reader.run_once()
    # When an operator deletes the stream and publishers go on (in a later millisecond: within the
    # one of the last entry read, a stream made anew could give a new entry an id the workers read
    # already, the limit docs/operations.md states)
    (last_id, _), *_ = real_redis.xrevrange(keys.publish_stream(QM), count=1)
    real_redis.delete(keys.publish_stream(QM))
    _past_millisecond_of(real_redis, last_id)
    for body in (b"c", b"d", b"e"):
        _xadd(real_redis, "p", body)
    drain([*pool, reader])
    # Then the later publications are delivered, in order, after the two the worker had read
    # (it holds their fields; an entry nobody read is gone with the stream)
    assert _bodies(real_redis) == [b"a", b"b", b"read1", b"read2", b"c", b"d", b"e"]
    assert group_state(real_redis, QM).exists and group_state(real_redis, QM).pending == 0


def test_after_xgroup_destroy_the_pool_reads_what_was_added_meanwhile_and_nothing_twice(real_redis, pool):
    # Given publications delivered, and two more filed in a FIFO by a worker that stopped before committing
    for body in (b"a", b"b", b"c"):
        _xadd(real_redis, "p", body)
    drain(pool)
    pool[0].hook = _stop_at("holding_turn")
    for body in (b"d", b"e"):
        _xadd(real_redis, "p", body)
    with pytest.raises(RuntimeError):
        pool[0].run_once()
    # When an operator destroys the group, and publications arrive before any worker notices
    real_redis.xgroup_destroy(keys.publish_stream(QM), keys.WORKER_GROUP)
    for body in (b"f", b"g"):
        _xadd(real_redis, "p", body)
    drain(pool)
    # Then everything is delivered once, in order: nothing read before is read again
    assert _bodies(real_redis) == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]


def test_a_worker_started_after_xgroup_destroy_starts_after_what_the_others_read(real_redis, settings):
    # Given a worker that delivered publications (its heartbeat names the last entry it read)
    subscribe(real_redis, QM, "/T/#", "app", "all")
    ticks = iter(range(10**6))

    def clock() -> int:  # a second per call: every round writes a heartbeat
        return int(time.time() * 1000) + 1000 * next(ticks)

    (old,) = [Worker(real_redis, settings, name="old", clock_ms=clock)]
    old.setup()
    for body in (b"a", b"b"):
        _xadd(real_redis, "p", body)
    drain([old])
    # When the group is destroyed, a publication arrives, and a new worker starts
    real_redis.xgroup_destroy(keys.publish_stream(QM), keys.WORKER_GROUP)
    _xadd(real_redis, "p", b"c")
    drain(make_workers(real_redis, settings, 1))
    # Then it delivers the new one only
    assert _bodies(real_redis) == [b"a", b"b", b"c"]


@pytest.mark.parametrize(
    ("entry_id", "named"),
    [(MAX_ID, "is exhausted"), ("9999999999999-0", "days ahead of the server's clock")],
    ids=["exhausted", "far-future"],
)
def test_status_names_an_exhausted_or_far_future_stream_and_the_way_out(real_redis, pool, entry_id, named):
    # Given a publication added with an id the client chose
    Publisher(real_redis, QM, "p").publish("/T/1", b"a")
    assert not [p for p in status(real_redis, QM).problems if "publish stream" in p]
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": "/T/1"}, id=entry_id)
    # When an operator asks for the status
    problems = [p for p in status(real_redis, QM).problems if "publish stream" in p]
    # Then the stream is named, with the way out
    assert len(problems) == 1 and named in problems[0] and "broker repair stream" in problems[0]


def test_status_names_a_stream_without_the_workers_group(real_redis):
    Publisher(real_redis, QM, "p").publish("/T/1", b"a")
    problems = status(real_redis, QM).problems
    assert any("no consumer group 'workers'" in p for p in problems), problems


def test_repair_stream_moves_pending_and_unread_work_in_order_while_a_worker_holds_old_units(
    run, real_redis, pool
):
    # Given two publishers, delivered work, and a far-future entry that every later one follows
    _xadd(real_redis, "one", b"one-0")
    drain(pool)
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "one", "topic": "/T/1", "body": "one-1"}, id="9999999999999-0"
    )
    for i in range(2, 6):
        _xadd(real_redis, "one", f"one-{i}".encode())
        _xadd(real_redis, "two", f"two-{i}".encode(), "/T/2")
    # and a worker that read them and built their units of work, and is about to commit them
    # when two more arrive (not read) and the operator repairs the stream (`broker repair stream`)
    said: list[str] = []

    def repair_now(point: str) -> None:
        if point == "before_commit" and not said:
            _xadd(real_redis, "one", b"one-6")
            _xadd(real_redis, "two", b"two-6", "/T/2")
            result = run("repair", "stream")
            assert result.exit_code == 0, result.output
            said.append(result.stdout)

    pool[0].hook = repair_now
    pool[0].run_once()
    assert said and "moved 11 entries (9 pending, 2 unread)" in said[0], said
    # When the workers go on
    drain(pool)
    # Then every publication is delivered once, each publisher's in order, and new ids are on time
    bodies = _bodies(real_redis)
    assert len(bodies) == 12
    assert [b for b in bodies if b.startswith(b"one")] == [f"one-{i}".encode() for i in range(7)]
    assert [b for b in bodies if b.startswith(b"two")] == [f"two-{i}".encode() for i in range(2, 7)]
    assert not [p for p in status(real_redis, QM).problems if "publish stream" in p]
    last = real_redis.xinfo_stream(keys.publish_stream(QM))["last-generated-id"].decode()
    assert int(last.split("-")[0]) < time.time() * 1000 + 60_000


def test_repair_stream_makes_an_exhausted_stream_take_publications_again(run, real_redis, pool):
    # Given an exhausted stream with unread work: every publication is refused by the server
    _xadd(real_redis, "p", b"a")
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "p", "topic": "/T/1", "body": "b"}, id=MAX_ID)
    with pytest.raises(Exception, match="exhausted"):
        _xadd(real_redis, "p", b"never")
    # When the operator checks, then repairs
    dry = run("repair", "stream", "--dry-run")
    assert dry.exit_code == 0 and "would move 2 entries (0 pending, 2 unread)" in dry.stdout, dry.output
    assert run("repair", "stream").exit_code == 0
    _xadd(real_redis, "p", b"c")
    drain(pool)
    # Then the unread work and the new publication are delivered, in order
    assert _bodies(real_redis) == [b"a", b"b", b"c"]


def test_repair_stream_refuses_with_nothing_written(run, real_redis):
    # Given a stream without the workers' group, and a backlog over the bound
    Publisher(real_redis, QM, "p").publish("/T/1", b"a")
    before = real_redis.xrange(keys.publish_stream(QM))
    no_group = run("repair", "stream")
    assert no_group.exit_code == 3 and "no consumer group" in no_group.output, no_group.output
    real_redis.xgroup_create(keys.publish_stream(QM), keys.WORKER_GROUP, id="0")
    Publisher(real_redis, QM, "p").publish("/T/1", b"b")
    over = run("repair", "stream", "--max-entries", "1")
    assert over.exit_code == 3 and "max_entries 1" in over.output, over.output
    real_redis.set(keys.active_publishers(QM), "oops")
    foreign = run("repair", "stream")
    assert (
        foreign.exit_code == 3
        and f"foreign key: {keys.active_publishers(QM)} holds a string" in foreign.output
    )
    real_redis.delete(keys.active_publishers(QM))
    # Then the stream is as it was
    assert real_redis.xrange(keys.publish_stream(QM))[:1] == before
    assert repair_stream(real_redis, QM, dry_run=True).unread == 2


def test_a_group_destroyed_after_a_repair_passes_over_ids_of_the_old_stream(run, real_redis, settings):
    # Given a worker that read a far-future entry (its heartbeat names it) and stopped, and a
    # repaired stream another worker delivers from
    subscribe(real_redis, QM, "/T/#", "app", "all")
    ticks = iter(range(10**6))
    old = Worker(
        real_redis, settings, name="old", clock_ms=lambda: int(time.time() * 1000) + 1000 * next(ticks)
    )
    old.setup()
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/T/1", "body": "a"}, id="9999999999999-0"
    )
    drain([old])
    assert "9999999999999-0" in real_redis.hget(keys.workers(QM), "old").decode()
    assert run("repair", "stream").exit_code == 0
    (new,) = make_workers(real_redis, settings, 1)
    _xadd(real_redis, "p", b"b")
    drain([new])
    # When the group is destroyed and a publication follows
    real_redis.xgroup_destroy(keys.publish_stream(QM), keys.WORKER_GROUP)
    _xadd(real_redis, "p", b"c")
    drain([new])
    # Then the group starts after the entry read from the fresh stream, not after the old stream's
    assert _bodies(real_redis) == [b"a", b"b", b"c"]
