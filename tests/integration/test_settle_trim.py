"""A trim stops at the oldest pending entry: an idle worker whose last trim stopped so trims again,
at most once a second, until nothing is pending (the few entries another worker committed after it
may never add up to ``trim_every_entries`` of that worker's own, and would stay in the stream)."""

from __future__ import annotations

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers
from worker.housekeeping import SETTLE_TRIM_MS

QM = "TEST"


def test_an_idle_worker_trims_again_once_the_entry_its_trim_stopped_at_is_acknowledged(real_redis, settings):
    # Given two workers that trim every 10 commits; w1 holds an entry of p2 (read, not committed)
    subscribe(real_redis, QM, "/t", "s", "all")
    w0, w1 = make_workers(real_redis, settings.model_copy(update={"trim_every_entries": 10}), 2)
    Publisher(real_redis, QM, "p2").publish("/t", b"x")
    held = w1.scripts.dequeue(w1.name, 1, settings.lease_ms, settings.heads, [])
    assert held is not None and list(held.turns) == ["p2"]
    w1._file(held)
    # and w0 committed 10 of p1's and trimmed when idle: its trim stopped at w1's pending entry
    publisher = Publisher(real_redis, QM, "p1")
    for n in range(10):
        publisher.publish("/t", f"a{n}".encode())
    drain([w0])
    stream = keys.publish_stream(QM)
    now = w0.clock_ms()
    w0.housekeeping.before_wait(now, 0, w0._unless_full)
    assert real_redis.xlen(stream) == 11 and w0.housekeeping.trim_incomplete
    # When w1 commits its entry (one: no trim of its own), and w0 is idle again within the second
    drain([w1])
    real_redis.delete(keys.trim_lock(QM))  # the lock's 100 ms (server time) as if passed
    w0.housekeeping.before_wait(now + SETTLE_TRIM_MS // 2, 0, w0._unless_full)
    assert real_redis.xlen(stream) == 11
    # Then once a second has passed, w0 trims again, and everything is gone
    w0.housekeeping.before_wait(now + SETTLE_TRIM_MS, 0, w0._unless_full)
    assert real_redis.xlen(stream) == 0 and not w0.housekeeping.trim_incomplete


def test_a_lone_worker_trims_only_every_trim_every_entries(real_redis, settings):
    # its trims find nothing pending: a few commits stay until trim_every_entries are reached
    subscribe(real_redis, QM, "/t", "s", "all")
    (worker,) = make_workers(real_redis, settings.model_copy(update={"trim_every_entries": 10}), 1)
    for body in (b"a", b"b", b"c"):
        Publisher(real_redis, QM, "p1").publish("/t", body)
    drain([worker])
    for later in (0, SETTLE_TRIM_MS, 2 * SETTLE_TRIM_MS):
        worker.housekeeping.before_wait(worker.clock_ms() + later, 0, worker._unless_full)
    assert real_redis.xlen(keys.publish_stream(QM)) == 3
