"""The console's chart samples (``broker.operations.console.samples``) on a real server, and
``GET /api/samples`` serving them (Starlette's TestClient)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import warnings

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.server import Server
from broker.operations.acl import RoleSpec, add_user
from broker.operations.console import create_app
from broker.operations.console.samples import START_GRACE_MS, SampleRing, run, take
from broker.testing import drain, make_workers
from broker.topics.subscriptions import subscribe

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

QM = "TEST"


def test_samples_read_the_counters_depth_and_dead_letters_and_give_rates_per_second(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given a subscription, 3 publications delivered and one dead letter, sampled before and after
    subscribe(real_redis, QM, "a/#", "app", "one")
    ring = SampleRing(size=3)
    ring.add(take(real_redis, QM, at_ms=1_000_000))
    publisher = Publisher(real_redis, QM, "p1")
    for n in range(3):
        publisher.publish(f"a/{n}", b"x")
    drain(make_workers(real_redis, settings, 1))
    real_redis.xadd(keys.dead_letter(QM), {"publisher": "p1", "dlq.reason": "test"})
    ring.add(take(real_redis, QM, at_ms=1_002_000))  # 2 s later

    # Then the series has both samples, 3 publications in 2 s, the depth and the dead letter
    series = ring.series()
    assert series["t"] == [1000.0, 1002.0]
    assert series["published_per_s"] == [None, 1.5]
    assert series["handled_per_s"] == [None, 1.5]
    assert series["depth"] == [0, 3]
    assert series["dead_letters"] == [0, 1]


def test_the_ring_is_bounded_and_a_counter_going_back_gives_no_rate(real_redis: redis.Redis) -> None:
    ring = SampleRing(size=3)
    for at in (1_000, 2_000, 3_000, 4_000):
        ring.add(take(real_redis, QM, at_ms=at))
    assert len(ring) == 3 and ring.series()["t"] == [2.0, 3.0, 4.0]
    Publisher(real_redis, QM, "p1").publish("a", b"x")
    ring.add(take(real_redis, QM, at_ms=5_000))
    real_redis.delete(keys.publish_stream(QM))  # an operator deleted the stream: its counters restart
    ring.add(take(real_redis, QM, at_ms=6_000))
    assert ring.series()["published_per_s"] == [None, 1.0, None]  # the oldest has none before it


def test_the_api_serves_the_console_ring_to_a_monitor(real_server: Server, real_redis: redis.Redis) -> None:
    password = secrets.token_urlsafe(12)
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), password)
    try:
        app = create_app(Settings(redis_url=real_server.url, qm=QM), sample_interval_s=None)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            app.state.samples.add(take(real_redis, QM, at_ms=7_000))
            answer = client.get("/api/samples", auth=("watch", password))
            assert answer.status_code == 200, answer.text
            assert answer.json()["t"][-1] == 7.0
            assert answer.json()["interval_s"] == 10
    finally:
        real_redis.execute_command("ACL", "DELUSER", "watch")


def _sample(ring: SampleRing, connect, clock) -> None:
    """Run the sampler (``run``) until ``ring`` holds two samples."""

    async def two_samples() -> None:
        task = asyncio.create_task(run(ring, connect, QM, interval_s=0, clock_ms=lambda: next(clock)))
        for _ in range(10_000):  # bounded: each turn of the loop lets the task take one step
            if len(ring) >= 2:
                break
            await asyncio.sleep(0.001)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(two_samples())


def _refused_first(real_redis: redis.Redis, times: int, tries: list[int]):
    def connect() -> redis.Redis:
        tries.append(1)
        if len(tries) <= times:
            raise redis.ConnectionError("refused")
        return real_redis

    return connect


def test_a_server_still_starting_is_not_logged_but_shown_while_it_lasts(
    real_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server refused at first, for less than START_GRACE_MS (a Procfile starts both at once)
    ring = SampleRing(size=10)
    tries: list[int] = []
    clock = iter(range(1_000, 100_000, 1_000))
    problems: list[str] = []
    connect = _refused_first(real_redis, 3, tries)

    def watched() -> redis.Redis:
        problems.append(ring.problem)
        return connect()

    # When the sampler runs
    with caplog.at_level(logging.WARNING, logger="broker.operations.console.samples"):
        _sample(ring, watched, clock)
    # Then nothing is logged, the charts showed the problem meanwhile, and the readings go on
    assert caplog.records == []
    assert problems[1:4] == ["ConnectionError: refused"] * 3
    assert len(ring) >= 2 and ring.problem == ""


def test_the_background_task_keeps_sampling_after_a_failed_reading(
    real_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a connection refused for longer than START_GRACE_MS, then made
    ring = SampleRing(size=10)
    tries: list[int] = []
    connect = _refused_first(real_redis, 2, tries)
    clock = iter([1_000, 1_000, 1_000 + START_GRACE_MS, *range(20_000, 100_000, 1_000)])

    # When the task runs: the failure past the grace is logged once, and the next readings work
    with caplog.at_level(logging.WARNING, logger="broker.operations.console.samples"):
        _sample(ring, connect, clock)
    assert [r.getMessage() for r in caplog.records] == ["console samples: refused"]
    assert len(tries) == 3  # connected again, then kept its client
    assert len(ring) >= 2 and ring.problem == ""
    assert ring.series()["t"][:2] == [20.0, 21.0]
