"""A saturated publisher (a FIFO of at least ``heads`` entries) gets a worker of its own.

Issue 16, item 2: with one publisher sending half of all publications, its order makes its
worker the pool's bottleneck. That worker takes no other turn and gives up the ones it
held; it reads nothing from the stream while saturated, and the entries other workers read
for it come back taken over in its (pipelined) dequeue, not in a ``take_over.lua`` round
trip of their own; the FIFO head still counts as a delivery there, so a worker dying on it
is charged to it. Driven round by round, without sleeps.
"""

from __future__ import annotations

import pytest

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers, queue_messages
from worker.loop import Worker

QM = "TEST"
HEADS = 5


class Died(BaseException):
    """A worker's death at a crash point (simulated in-process)."""


@pytest.fixture
def small(settings):
    return settings.model_copy(update={"heads": HEADS, "batch_size": 50})


def _publish(client, publisher: str, count: int, first: int = 1) -> list[str]:
    pub = Publisher(client, QM, publisher, first_seq=first)
    msgids = [f"{publisher}.{n}" for n in range(first, first + count)]
    for msgid in msgids:
        pub.publish("/t", msgid.encode(), msgid=msgid)
    return msgids


def _bodies(client, sub_id: str, publisher: str) -> list[str]:
    return [m.body.decode() for m in queue_messages(client, QM, sub_id) if m.publisher == publisher]


def _delivered(client, entry_id: str) -> tuple[str, int]:
    """``(consumer, times delivered)`` of a pending entry."""
    [info] = client.xpending_range(keys.publish_stream(QM), keys.WORKER_GROUP, entry_id, entry_id, 1)
    return info["consumer"].decode(), info["times_delivered"]


def _count_take_overs(worker: Worker) -> list[int]:
    calls: list[int] = []
    original = worker.scripts.take_over

    def counting(token, counted, uncounted):
        calls.append(len(counted) + len(uncounted))
        return original(token, counted, uncounted)

    worker.scripts.take_over = counting  # type: ignore[method-assign]
    return calls


def test_the_saturated_publishers_worker_takes_no_other_turn_and_the_other_worker_takes_them(
    real_redis, small
):
    # Given two live workers, a hot publisher with 8 heads' worth of entries, then 4 others
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    hot = _publish(real_redis, "hot", 8 * HEADS)
    others = {p: _publish(real_redis, p, 2) for p in ("a", "b", "c", "d")}
    first, second = make_workers(real_redis, small, 2)
    # When the first reads everything (the hot publisher first)
    first.run_once()
    # Then it holds the hot publisher's turn alone and handled one round of it
    assert first.turns == {"hot"}
    assert first.processed == HEADS
    # ... and the second takes the others (the orphan sweep: it read nothing of theirs)
    second.run_once()
    assert second.turns <= set(others)
    drain([first, second])
    assert second.processed == 8 and first.processed == len(hot)
    for publisher, msgids in {"hot": hot, **others}.items():
        assert _bodies(real_redis, sub.sub_id, publisher) == msgids


def test_a_worker_holding_a_saturated_publisher_gives_up_its_other_turns(real_redis, small):
    # Given a worker that took a quiet publisher's turn, then its hot one's
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    quiet = _publish(real_redis, "quiet", 3)
    first, second = make_workers(real_redis, small, 2)
    held = first.scripts.dequeue(first.name, 50, small.lease_ms, HEADS, [])
    assert held is not None and list(held.turns) == ["quiet"]
    hot = _publish(real_redis, "hot", 4 * HEADS)
    # When it handles a round holding both (the hot one saturated: the second worker is live)
    first.turns = set(held.turns)
    first.run_once()
    # Then it handled the quiet publisher once and gave its turn up: only the hot one is kept
    assert first.turns == {"hot"}
    assert real_redis.get(keys.turn_key(QM, "quiet")) is None
    assert _bodies(real_redis, sub.sub_id, "quiet") == quiet
    drain([first, second])
    assert _bodies(real_redis, sub.sub_id, "hot") == hot


def test_with_one_live_worker_nothing_is_saturated(real_redis, small):
    # Given a single worker, a hot publisher and a quiet one
    subscribe(real_redis, QM, "/t", "s", "all")
    _publish(real_redis, "hot", 4 * HEADS)
    _publish(real_redis, "quiet", 2)
    [only] = make_workers(real_redis, small, 1)
    # When it runs a round
    # Then it takes both turns (nobody else could serve the quiet one)
    only.run_once()
    assert only.processed == HEADS + 2


def test_a_saturated_worker_reads_nothing_and_its_heads_come_with_its_dequeue(real_redis, small):
    # Given the hot publisher's worker, saturated, and a second worker that reads its next entries
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    hot = _publish(real_redis, "hot", 2 * HEADS)
    holder, reader = make_workers(real_redis, small, 2)
    holder.run_once()  # reads all 10, handles 5; its next dequeue reads nothing
    assert holder.turns == {"hot"}
    hot += _publish(real_redis, "hot", 3 * HEADS, first=2 * HEADS + 1)
    _publish(real_redis, "q", 2)
    reader.run_once()  # reads the 15 new hot entries (filed for the holder) and q's two
    assert reader.processed == 2
    [last_read] = real_redis.xrange(keys.publish_stream(QM), count=2 * HEADS)[-1:]
    calls = _count_take_overs(holder)
    # When the holder handles its next rounds
    holder.run_once()  # its own 5 remaining; the dequeue sent with it takes over the next 5
    assert holder.processed == 2 * HEADS
    assert holder._prefetched is not None
    taken = [entry_id for entry_id, _, _ in holder._prefetched.taken_over]
    assert len(taken) == HEADS and taken[0] > last_read[0].decode()
    # Then the FIFO head taken over in the dequeue counts as a delivery (the reader's, then the
    # holder's), the others keep the reader's one (claimed by the holder without a count: a
    # death is charged by the record of the worker that held them, worker.suspects)
    assert _delivered(real_redis, taken[0]) == (holder.name, 2)
    assert _delivered(real_redis, taken[1]) == (holder.name, 1)
    holder.run_once()
    # ... and no take_over.lua round trip was needed for them
    assert calls == []
    assert holder.processed == 3 * HEADS
    drain([holder, reader])
    assert _bodies(real_redis, sub.sub_id, "hot") == hot
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


def test_a_worker_dying_on_heads_taken_over_in_its_dequeue_is_charged_to_the_head(real_redis, small):
    # Given a saturated holder whose next heads (read by another worker) came with its dequeue
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    hot = _publish(real_redis, "hot", 2 * HEADS)
    holder, reader = make_workers(real_redis, small, 2)
    holder.run_once()
    hot += _publish(real_redis, "hot", 3 * HEADS, first=2 * HEADS + 1)
    reader.run_once()
    holder.run_once()
    assert holder._prefetched is not None
    head = holder._prefetched.taken_over[0][0]
    assert _delivered(real_redis, head) == (holder.name, 2)

    # When it dies before committing them, and its lease runs out (simulated)
    def die(point: str) -> None:
        if point == "before_commit":
            raise Died(point)

    holder.hook = die
    with pytest.raises(Died):
        holder.run_once()
    real_redis.delete(keys.turn_key(QM, "hot"))
    # Then the next holder claims the head again: 3 deliveries (SUSPECT_DELIVERIES), so it
    # handles that head alone ...
    successor = Worker(real_redis, small, name="successor")
    successor.setup()
    successor.run_once()  # it holds no entry: its dequeue takes the heads over, the head counted
    assert successor.processed == 1
    assert _bodies(real_redis, sub.sub_id, "hot")[-1] == f"hot.{2 * HEADS + 1}"
    # ... and every publication is delivered once, in order
    drain([successor, reader])
    assert _bodies(real_redis, sub.sub_id, "hot") == hot
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


def test_when_every_worker_is_saturated_none_keeps_its_publisher_alone(real_redis, small):
    # Given two live workers, each holding a saturated publisher of its own
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    first, second = make_workers(real_redis, small, 2)
    hot1 = _publish(real_redis, "hot1", 8 * HEADS)
    first.run_once()
    hot2 = _publish(real_redis, "hot2", 8 * HEADS)
    second.run_once()
    assert first.turns == {"hot1"} and second.turns == {"hot2"}
    # When a quiet publisher publishes and the first worker's dequeue reads it
    quiet = _publish(real_redis, "quiet", 2)
    more = _publish(real_redis, "hot1", 8 * HEADS, first=8 * HEADS + 1)
    held = first.scripts.dequeue(first.name, 500, small.lease_ms, HEADS, sorted(first.turns))
    assert held is not None
    # Then it knows no other worker is spare (the second recorded itself saturated) ...
    assert held.spare == 0
    assert real_redis.hexists(keys.saturated(QM), second.name)
    # ... so it does not keep its publisher alone: it reads on and sweeps as often as any
    # worker, and the quiet publisher is not left to a slow sweep
    first._prefetched = held
    first.run_once()
    assert not first._saturated
    # And everything is delivered once, in order
    drain([first, second])
    for publisher, msgids in {"hot1": hot1 + more, "hot2": hot2, "quiet": quiet}.items():
        assert _bodies(real_redis, sub.sub_id, publisher) == msgids
