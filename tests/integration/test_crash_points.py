"""A worker that dies at any named crash point loses nothing, duplicates nothing, reorders nothing.

Each point of ``worker.loop.CRASH_POINTS`` is tested twice, without sleeps:

- in-process: the hook raises ``Died`` (a ``BaseException``, so nothing in the
  worker can swallow it) and the object is dropped with its Redis state as it
  is; the lease running out is simulated by deleting the turns it held;
- as a real process that SIGKILLs itself at the point (``scripts.rig.hook``),
  joined (not slept on).

The set-up makes every point reachable in the victim's first round: a live
worker already holds publisher ``q``'s turn, so the victim's dequeue hands
``q``'s entries over (``waiting_for_turn``) while it holds ``p``'s turn.
"""

from __future__ import annotations

import multiprocessing
import signal

import pytest

from broker import Publisher, link, subscribe
from broker.core import keys
from broker.testing import drain, make_workers
from scripts.rig.history import check_queues
from scripts.rig.hook import run_worker
from worker.loop import CRASH_POINTS, Worker

QM = "TEST"

FILTERS = {"exact": "/a/x", "plus": "/a/+", "hash": "/a/#", "linked": "/news/#"}
LINKS = [("/a/y", "/news/y")]
TOPICS = ["/a/x", "/a/y", "/b", "/a/x/deep"]


class Died(BaseException):
    """A worker's death at a crash point (simulated in-process)."""


class DieAt:
    """A hook that raises ``Died`` at ``point`` and records every point passed."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.passed: list[str] = []

    def __call__(self, at: str) -> None:
        self.passed.append(at)
        if at == self.point:
            raise Died(at)


def _subscribe_all(client) -> dict[str, str]:
    sub_ids = {name: subscribe(client, QM, flt, "crash", name).sub_id for name, flt in FILTERS.items()}
    for source, target in LINKS:
        link(client, QM, source, target)
    return sub_ids


def _holds_q(client, settings) -> Worker:
    """A live worker that has dequeued q's first publication and holds q's turn."""
    other = make_workers(client, settings, 1)[0]
    dequeued = other.scripts.dequeue(other.name, 1, settings.lease_ms, settings.heads, [])
    assert list(dequeued.turns) == ["q"]
    other.turns = set(dequeued.turns)
    return other


def _publish(client, publisher: str, count: int, first: int = 1) -> list[tuple[str, str]]:
    """``count`` publications of ``publisher``; returns ``(msgid, topic)`` in order."""
    pub = Publisher(client, QM, publisher, first_seq=first)
    out = []
    for n in range(first, first + count):
        topic = TOPICS[n % len(TOPICS)]
        msgid = f"{publisher}.{n}"
        pub.publish(topic, msgid.encode(), msgid=msgid)
        out.append((msgid, topic))
    return out


def _scenario(client, settings) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]], Worker]:
    sub_ids = _subscribe_all(client)
    published = {"q": _publish(client, "q", 1)}
    other = _holds_q(client, settings)
    published["p"] = _publish(client, "p", 6)
    published["q"] += _publish(client, "q", 5, first=2)
    return sub_ids, published, other


def _expire_turns_of(client, token_part: str) -> int:
    """Simulate the lease running out: delete every turn whose token contains ``token_part``."""
    gone = 0
    for key in client.scan_iter(match=keys.turn_key(QM, "*")):
        owner = client.get(key)
        if owner is not None and token_part.encode() in owner:
            gone += client.delete(key)
    return gone


def assert_exactly_once_in_order(
    client, sub_ids: dict[str, str], published: dict[str, list[tuple[str, str]]]
) -> None:
    """Every subscription holds each matching publication once, in each publisher's order, nothing else."""
    filters = {sub_ids[name]: flt for name, flt in FILTERS.items()}
    assert check_queues(client, QM, filters, LINKS, published) == []
    assert client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0
    assert client.xlen(keys.dead_letter(QM)) == 0
    assert client.scard(keys.active_publishers(QM)) == 0


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_worker_dying_in_process_at_crash_point_loses_and_duplicates_nothing(real_redis, settings, point):
    # Given a victim that will die at `point` in its first round, and a live worker holding q's turn
    sub_ids, published, other = _scenario(real_redis, settings)
    hook = DieAt(point)
    victim = Worker(real_redis, settings, name="victim", hook=hook)
    victim.setup()
    # When it dies there
    with pytest.raises(Died):
        victim.run_once()
    assert hook.passed == list(
        CRASH_POINTS[: CRASH_POINTS.index(point) + 1]
    )  # every earlier point was passed
    delivered = sum(real_redis.llen(keys.sub_queue(QM, s)) for s in sub_ids.values())
    assert (delivered > 0) == (point == "after_commit")  # the unit of work is all or nothing
    # Then, once its lease is over, the others finish everything: once each, in order
    _expire_turns_of(real_redis, "victim")
    drain([other, *make_workers(real_redis, settings, 2)])
    assert_exactly_once_in_order(real_redis, sub_ids, published)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_worker_process_sigkilled_at_crash_point_loses_and_duplicates_nothing(
    real_redis, settings, tmp_path, point
):
    # Given a worker process armed to SIGKILL itself at `point`, and a live worker holding q's turn
    sub_ids, published, other = _scenario(real_redis, settings)
    ctx = multiprocessing.get_context("spawn")
    plan = {"point": point, "action": "kill", "after": 1}
    proc = ctx.Process(
        target=run_worker,
        args=(settings.model_dump_json(), str(tmp_path), str(tmp_path / "worker.log"), plan),
    )
    # When it runs until it kills itself
    proc.start()
    proc.join(60)
    assert not proc.is_alive(), "the worker never reached the crash point"
    assert proc.exitcode == -signal.SIGKILL
    assert (tmp_path / f"{proc.pid}.kill").read_text() == point
    # Then, once its lease is over, the others finish everything: once each, in order
    _expire_turns_of(real_redis, f"-{proc.pid}-")
    drain([other, *make_workers(real_redis, settings, 2)])
    assert_exactly_once_in_order(real_redis, sub_ids, published)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_three_deaths_in_a_row_at_crash_point_still_deliver_once_in_order(real_redis, settings, point):
    # Given victims that die at `point`, one after the other, with more publications arriving
    sub_ids, published, other = _scenario(real_redis, settings)
    for round_ in range(3):
        victim = Worker(real_redis, settings, name=f"victim{round_}", hook=DieAt(point))
        victim.setup()
        with pytest.raises(Died):
            victim.run_once()
        _expire_turns_of(real_redis, f"victim{round_}")
        published["p"] += _publish(real_redis, "p", 2, first=len(published["p"]) + 1)
        published["q"] += _publish(real_redis, "q", 2, first=len(published["q"]) + 1)
    # When the survivors drain
    drain([other, *make_workers(real_redis, settings, 2)])
    # Then
    assert_exactly_once_in_order(real_redis, sub_ids, published)
