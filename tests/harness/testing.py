"""Helpers for tests and the chaos harness: a real server, in-process workers, queue contents.

The tests drive workers in-process, round by round (``drain``), so nothing in a
test depends on timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from broker import keys
from broker.config import Settings
from broker.models import Message
from broker.server import Server
from worker.loop import Worker


def start_server() -> Server:
    """Start a throwaway in-memory server: ``$BROKER_REDIS_SERVER_BIN`` or the embedded Valkey."""
    return Server().start()


def make_workers(client: redis.Redis, settings: Settings, count: int) -> list[Worker]:
    """``count`` in-process workers named ``w0``.. with the group created and the table loaded."""
    workers = [Worker(client, settings, name=f"w{i}") for i in range(count)]
    for worker in workers:
        worker.setup()
    return workers


def drain(workers: Iterable[Worker], max_rounds: int = 100_000) -> int:
    """Run the workers round-robin, one ``run_once`` each, until a full round does nothing.

    Args:
        workers: in-process workers.
        max_rounds: give up after this many rounds.

    Returns:
        How many publications were committed.

    Raises:
        AssertionError: still busy after ``max_rounds`` rounds.
    """
    pool = list(workers)
    total = 0
    for _ in range(max_rounds):
        done = sum(w.run_once(block=False) for w in pool)
        total += done
        if done == 0 and not any(w.turns for w in pool):
            return total
    raise AssertionError(f"workers still busy after {max_rounds} rounds")


def work_while(worker: Worker, publish: Callable[[], None]) -> None:
    """Run ``publish`` (which waits for results) in a thread while ``worker`` handles rounds, until it returns.

    The worker blocks on the stream until the publisher's entry arrives, so nothing waits on timing.
    """
    thread = threading.Thread(target=publish)
    thread.start()
    while thread.is_alive():
        worker.run_once(block=True)
        thread.join(timeout=0)
    thread.join()


class FakeTime:
    """A clock in ms that moves only when someone sleeps (or a test moves ``now``); records every sleep.

    For the injectable ``clock_ms``/``sleep_ms`` of publishers (flow control): no test really sleeps.
    """

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, ms: float) -> None:
        self.slept.append(ms)
        self.now += ms


def queue_messages(client: redis.Redis, qm: str, sub_id: str) -> list[Message]:
    """Every message in a subscriber queue in the order a consumer takes them, without consuming them."""
    out = []
    for band in keys.sub_bands(qm, sub_id):  # highest priority first, as a consumer takes them
        out += [Message.from_envelope(item) for item in reversed(client.lrange(band, 0, -1))]
    return out


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` (not a fixed sleep) until it returns something true, and return that.

    Raises:
        AssertionError: ``what`` was not met within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval_s)
