"""`broker status --watch` on a real server: rates from real samples (clock injected), problems, Ctrl-C."""

from __future__ import annotations

import pytest

from broker import subscribe
from broker.core import keys
from broker.core.models import publication_fields
from broker.operations import watch

QM = "TEST"


class _Clock:
    """The view's clock (ms) and its wait between refreshes: waiting runs ``between`` and moves time."""

    def __init__(self, between=lambda: None, step_ms: float = 1_000) -> None:
        self.now = 0.0
        self.between = between
        self.step_ms = step_ms
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, ms: float) -> None:
        self.waits.append(ms)
        self.between()
        self.now += self.step_ms


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(watch, "monotonic_ms", fake.clock)
    monkeypatch.setattr(watch, "sleep_ms", fake.wait)
    return fake


def test_status_watch_two_iterations_shows_100_publications_per_second(run, real_redis, clock):
    # Given a subscription, and 100 publications added between two refreshes 1,000 ms apart
    subscribe(real_redis, QM, "a/#", "app", "d1")
    stream = keys.publish_stream(QM)

    def publish_100() -> None:
        for n in range(100):
            real_redis.xadd(stream, publication_fields("p", "a/b", str(n).encode()))

    publish_100()  # the stream exists from the first sample
    clock.between = publish_100
    # When `broker status --watch --iterations 2` runs
    result = run("status", "--watch", "--iterations", "2", "--interval-ms", "1000")
    # Then it exits 0 after two frames, the second with 100 publications/s (no worker: 0 deliveries/s)
    assert result.exit_code == 0, result.output
    frames = result.output.split("queue manager TEST")[1:]
    assert len(frames) == 2
    assert "publications/s -" in frames[0]
    assert "publications/s 100.0   deliveries/s 0.0 (over 1.0 s)" in frames[1]
    assert "stream length 200" in frames[1]
    assert "app$d1" in frames[1]
    assert clock.waits == [1_000]


def test_status_watch_names_foreign_keys_as_problems(run, real_redis, clock):
    # Given a foreign key where the dead-letter stream belongs
    real_redis.set(keys.dead_letter(QM), "not a stream")
    # When the view is shown once
    result = run("status", "--watch", "--iterations", "1")
    # Then it says so on a problem line, and still shows the rest
    assert result.exit_code == 0, result.output
    assert f"problem: foreign key: {keys.dead_letter(QM)} holds a string, not a stream" in result.output
    assert "workers alive 0/0" in result.output


def test_status_watch_ends_with_exit_0_on_ctrl_c(run, clock):
    def interrupt() -> None:
        raise KeyboardInterrupt

    clock.between = interrupt
    result = run("status", "--watch")
    assert result.exit_code == 0, result.output
    assert result.output.count("queue manager TEST") == 1


def test_status_watch_refuses_json_and_network(run):
    result = run("status", "--watch", "--json")
    assert result.exit_code == 2
    assert "--watch" in result.output
