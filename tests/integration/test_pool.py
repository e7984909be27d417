"""The worker pool as real processes: restart of a killed child, warm stop on SIGTERM."""

from __future__ import annotations

import os
import signal

from broker import Publisher, subscribe
from broker.core import keys
from broker.operations.status import status
from broker.testing import queue_messages, wait_for
from worker.pool import Pool

QM = "TEST"


_wait_for = wait_for


def test_killed_worker_is_restarted_and_nothing_is_lost_duplicated_or_reordered(real_redis, settings):
    # Given a pool of 2 worker processes with a short lease
    sub = subscribe(real_redis, QM, "#", "app", "all")
    pool = Pool(
        settings.model_copy(update={"concurrency": 2, "lease_ms": 300, "batch_size": 20, "heads": 20})
    )
    pool.start()
    try:
        publishers = [Publisher(real_redis, QM, f"p{i}") for i in range(10)]
        for n in range(300):
            for pub in publishers:
                pub.publish(f"/t/{n % 7}", str(n).encode())
        # When one child is SIGKILLed while it works
        _wait_for(lambda: status(real_redis, QM).subscriptions[0].depth > 200, 60, "first deliveries")
        victim = pool._children[0]
        assert victim is not None and victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        assert pool.supervise_once() == 1
        # Then every publication is delivered exactly once, in per-publisher order
        _wait_for(lambda: (s := status(real_redis, QM)).pending == 0 and s.lag == 0, 120, "all acknowledged")
    finally:
        pool.stop()
    got = queue_messages(real_redis, QM, sub.sub_id)
    assert len(got) == 3000
    assert len({m.msgid for m in got}) == 3000
    last: dict[str, int] = {}
    for message in got:
        assert message.seq == last.get(message.publisher, 0) + 1
        last[message.publisher] = message.seq


def test_sigterm_stops_the_pool_warmly_and_gives_up_turns(real_redis, settings):
    pool = Pool(settings.model_copy(update={"concurrency": 2}))
    pool.start()
    _wait_for(lambda: len(status(real_redis, QM).workers) == 2, 60, "workers to register")
    pool.stop()
    assert all(p is not None and p.exitcode == 0 for p in pool._children)
    assert status(real_redis, QM).workers == []
    assert not list(real_redis.scan_iter(match=keys.turn_key(QM, "*")))
