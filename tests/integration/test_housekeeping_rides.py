"""A busy worker's trim and heartbeat ride with its commit (``Housekeeping.ride``): no round trip of
their own between two commits, in which the server would wait for this worker (2-worker drain: such
round trips left the server idle for up to a commit's decide time each)."""

from __future__ import annotations

import json

import pytest
import redis

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import make_workers
from worker.housekeeping import BUSY_TRIM_FACTOR

QM = "TEST"


def test_a_busy_workers_trim_and_heartbeat_ride_with_its_commit(real_redis, settings, monkeypatch):
    # Given a worker that trims every BUSY_TRIM_FACTOR x 1 commits when busy, and 40 publications
    subscribe(real_redis, QM, "/t", "s", "all")
    busy = settings.model_copy(update={"trim_every_entries": 1, "batch_size": 8})
    (worker,) = make_workers(real_redis, busy, 1)
    publisher = Publisher(real_redis, QM, "p1")
    for n in range(40):
        publisher.publish("/t", f"m{n}".encode())
    trims: list[bool] = []  # True: queued on the commit's pipeline
    real_trim = worker.scripts.trim
    monkeypatch.setattr(
        worker.scripts,
        "trim",
        lambda token, lock_ms, pipe=None: (
            trims.append(pipe is not None) or real_trim(token, lock_ms, pipe=pipe)
        ),
    )
    heard: list[bool] = []  # True: a heartbeat sent on its own (``strict``)
    real_heard = worker.housekeeping._heard
    monkeypatch.setattr(
        worker.housekeeping,
        "_heard",
        lambda replies, strict: heard.append(strict) or real_heard(replies, strict),
    )
    # When it works through them, its heartbeat due at every round
    committed = 0
    while True:
        worker.housekeeping.next_heartbeat_ms = 0
        heard.clear()
        done = worker.run_once(block=False)
        if not done:
            break
        committed += done
        # Then every round that committed sent its heartbeat with the commit, none on its own
        assert heard and not any(heard)
    assert committed == 40
    # and the trim rode with a commit once BUSY_TRIM_FACTOR were committed, and trimmed
    assert trims and all(trims)
    assert real_redis.xlen(keys.publish_stream(QM)) <= 40 - BUSY_TRIM_FACTOR
    beat = json.loads(real_redis.hget(keys.workers(QM), worker.name))
    assert beat["processed"] >= 40 - busy.batch_size


def test_a_heartbeat_refused_with_the_commit_is_sent_again_on_its_own_and_raises(real_redis, settings):
    # Given a worker whose heartbeat key holds another type (an operator's mistake)
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    (worker,) = make_workers(real_redis, settings, 1)
    Publisher(real_redis, QM, "p1").publish("/t", b"x")
    Publisher(real_redis, QM, "p1").publish("/t", b"y")
    real_redis.delete(keys.workers(QM))
    real_redis.set(keys.workers(QM), "planted")
    worker.housekeeping.next_heartbeat_ms = 0
    # When a round commits (the heartbeat rides and is refused), the commit stands, and the
    # heartbeat sent again after it raises what the server answered
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        worker.run_once(block=False)
    assert sum(real_redis.llen(queue) for queue in keys.sub_bands(QM, sub.sub_id)) == 2
