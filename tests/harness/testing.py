"""Helpers for tests and the chaos harness: a real server, in-process workers, queue contents.

The tests drive workers in-process, round by round (``drain``), so nothing in a
test depends on timing.
"""

from __future__ import annotations

from collections.abc import Iterable

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


def queue_messages(client: redis.Redis, qm: str, sub_id: str) -> list[Message]:
    """Every message in a subscriber queue in the order a consumer takes them, without consuming them."""
    out = []
    for band in keys.sub_bands(qm, sub_id):  # highest priority first, as a consumer takes them
        out += [Message.from_envelope(item) for item in reversed(client.lrange(band, 0, -1))]
    return out
