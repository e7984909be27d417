"""What a busy round costs in round trips (issue 25): the heads another worker read are taken over in
the dequeue of a worker holding nothing else, in the commit's round trip when it has other heads to
commit, and in a round trip of their own only when nothing else is ready."""

from __future__ import annotations

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"


def _p1_head_read_elsewhere(real_redis, settings):
    """A worker holding p1's turn whose head a1 it did not read itself (read outside it, as by another
    worker), then new entries b1 (p2) and a2 (p1); its take_over round trips are recorded."""
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    publisher_1, publisher_2 = Publisher(real_redis, QM, "p1"), Publisher(real_redis, QM, "p2")
    publisher_1.publish("/t", b"a1", msgid="a1")
    (worker,) = make_workers(real_redis, settings, 1)
    held = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [])
    assert held is not None and list(held.turns) == ["p1"]
    worker.turns = {"p1"}
    publisher_2.publish("/t", b"b1", msgid="b1")
    publisher_1.publish("/t", b"a2", msgid="a2")
    round_trips: list[str] = []
    take_over = worker.scripts.take_over
    worker.scripts.take_over = lambda *a, **k: (round_trips.append("take_over"), take_over(*a, **k))[1]  # type: ignore[method-assign]
    return sub, worker, round_trips


def test_heads_another_worker_read_are_taken_over_by_the_dequeue_of_a_worker_holding_nothing(
    real_redis, settings
):
    # Given a worker holding p1's turn whose head it did not read itself (read outside it, as by
    # another worker), holding no entry in memory, and a new entry of p2
    sub, worker, round_trips = _p1_head_read_elsewhere(real_redis, settings)
    # When it runs one round
    assert worker.run_once() == 3
    # Then its dequeue took p1's head over (no take_over round trip, no round's wait) and the round
    # committed every head, each publisher's in order
    bodies = [m.body for m in queue_messages(real_redis, QM, sub.sub_id)]
    assert sorted(bodies) == [b"a1", b"a2", b"b1"] and bodies.index(b"a1") < bodies.index(b"a2")
    assert round_trips == []
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


def test_heads_another_worker_read_ride_with_the_commit_of_a_worker_holding_other_entries(
    real_redis, settings
):
    # Given a worker holding p1's turn whose head it did not read itself, and entries of its own
    # in memory that this round does not commit (another publisher's, beyond its heads)
    sub, worker, round_trips = _p1_head_read_elsewhere(real_redis, settings)
    worker._entries["0-1"] = ("p9", {})  # an entry it holds and does not commit this round
    # When it runs one round
    assert worker.run_once() == 1
    # Then it committed p2's head, and took p1's over in the same round trip as the commit
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"b1"]
    assert round_trips == []
    # ... and the next rounds handle p1's heads in order with what it took over
    del worker._entries["0-1"]
    drain([worker])
    bodies = [m.body for m in queue_messages(real_redis, QM, sub.sub_id)]
    assert bodies == [b"b1", b"a1", b"a2"]
    assert round_trips == []
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


def test_with_nothing_else_to_commit_the_heads_are_taken_over_at_once(real_redis, settings):
    # Given a worker holding p1's turn whose heads it did not read itself, and nothing else to do
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    Publisher(real_redis, QM, "p1").publish("/t", b"a1", msgid="a1")
    (worker,) = make_workers(real_redis, settings, 1)
    held = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [])
    assert held is not None
    worker.turns = {"p1"}
    round_trips: list[str] = []
    take_over = worker.scripts.take_over
    worker.scripts.take_over = lambda *a, **k: (round_trips.append("take_over"), take_over(*a, **k))[1]  # type: ignore[method-assign]
    worker._entries["0-1"] = ("p9", {})  # an entry it holds in memory: its dequeue takes nothing over
    # When it runs one round
    # Then it takes them over in a round trip of their own and commits them in the same round
    assert worker.run_once() == 1
    assert round_trips == ["take_over"]
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"a1"]
