"""Admin jobs: trimming keeps every unacknowledged entry; usage snapshots."""

from __future__ import annotations

import json

from rq import Queue, SimpleWorker

from broker import Publisher, keys, subscribe
from broker.jobs import ADMIN_QUEUE, trim_stream, usage_snapshot
from tests.harness.testing import drain, make_workers

QM = "TEST"


def test_trim_removes_only_acknowledged_entries(real_server, real_redis, settings):
    subscribe(real_redis, QM, "#", "c", "all")
    pub = Publisher(real_redis, QM, "p")
    workers = make_workers(real_redis, settings, 1)
    for i in range(5):
        pub.publish("/a", str(i).encode())
    drain(workers)
    for i in range(5, 8):
        pub.publish("/a", str(i).encode())
    # an entry delivered to a worker but not acknowledged (a worker died after dequeue)
    workers[0].scripts.dequeue("dead", 1, 30_000, 1, [])
    removed = trim_stream(real_server.url, QM)
    assert removed == 5
    assert real_redis.xlen(keys.publish_stream(QM)) == 3
    real_redis.delete(keys.turn_key(QM, "p"))  # the dead worker's lease ran out
    drain(make_workers(real_redis, settings, 1) + workers)
    assert real_redis.llen(keys.sub_queue(QM, "c$all")) == 8


def test_usage_snapshot_job_runs_under_rq(real_server, real_redis, settings):
    subscribe(real_redis, QM, "#", "c", "all")
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    job = queue.enqueue(usage_snapshot, real_server.url, QM)
    SimpleWorker([queue], connection=real_redis).work(burst=True)
    assert job.get_status() == "finished"
    snaps = real_redis.xrange(keys.usage(QM))
    assert json.loads(snaps[0][1][b"snapshot"])["subscriptions"] == 1
