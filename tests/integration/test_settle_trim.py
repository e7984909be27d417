"""An idle worker trims what it committed since its last trim, at most once a second, even when that
is fewer than ``trim_every_entries`` (the stragglers after a trim stopped at another worker's pending
entry would otherwise stay in the publish stream for good)."""

from __future__ import annotations

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers
from worker.housekeeping import SETTLE_TRIM_MS

QM = "TEST"


def test_an_idle_worker_trims_its_last_few_commits_at_most_once_a_second(real_redis, settings):
    # Given a worker that trims every 10 commits, and 3 publications it handled
    subscribe(real_redis, QM, "/t", "s", "all")
    publisher = Publisher(real_redis, QM, "p1")
    (worker,) = make_workers(real_redis, settings.model_copy(update={"trim_every_entries": 10}), 1)
    for body in (b"a", b"b", b"c"):
        publisher.publish("/t", body)
    drain([worker])
    stream = keys.publish_stream(QM)
    assert real_redis.xlen(stream) == 3  # fewer than trim_every_entries: no trim on the count
    # When it is about to wait for work (nothing waiting)
    now = worker.clock_ms()
    worker.housekeeping.before_wait(now, 0, worker._unless_full)
    # Then it trimmed them
    assert real_redis.xlen(stream) == 0
    # ... and two more within the same second stay until a second has passed
    for body in (b"d", b"e"):
        publisher.publish("/t", body)
    drain([worker])
    real_redis.delete(keys.trim_lock(QM))  # the lock's PX (100 ms of the server's time) as if passed
    worker.housekeeping.before_wait(now + SETTLE_TRIM_MS // 2, 0, worker._unless_full)
    assert real_redis.xlen(stream) == 2
    worker.housekeeping.before_wait(now + SETTLE_TRIM_MS, 0, worker._unless_full)
    assert real_redis.xlen(stream) == 0


def test_a_worker_set_not_to_trim_does_not_trim_when_idle(real_redis, settings):
    subscribe(real_redis, QM, "/t", "s", "all")
    (worker,) = make_workers(real_redis, settings.model_copy(update={"trim_every_entries": 0}), 1)
    Publisher(real_redis, QM, "p1").publish("/t", b"a")
    drain([worker])
    worker.housekeeping.before_wait(worker.clock_ms(), 0, worker._unless_full)
    assert real_redis.xlen(keys.publish_stream(QM)) == 1
