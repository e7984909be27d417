"""The console's chart samples: a small ring of readings its own process takes every few seconds.

``SampleRing`` keeps at most ``SAMPLE_COUNT`` samples (one hour at ``SAMPLE_INTERVAL_S``; bounded
memory, nothing written to Redis). ``take`` reads one sample with the console's own connection
(``settings.redis_url``; the samples need the rights of a ``monitor`` user): the publish
stream's counters (``figures.read_counters``: entries added, entries acknowledged), the
depth of every subscriber queue (``broker.operations.status.status``) and the length of the
dead-letter queue. Rates are the change between two samples, per second. ``run`` is the
background task ``create_app``'s lifespan starts; ``GET /api/samples`` serves ``series``.

Prometheus is not needed: the ring lives as long as the console process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.clock import now_ms
from broker.core.errors import BrokerError
from broker.operations.console.figures import read_counters
from broker.operations.status import status

#: Seconds between two samples.
SAMPLE_INTERVAL_S = 10

#: How long the sampler takes an unreachable server for one still starting (``broker server``
#: and the console started together, as a Procfile does) before it logs it, ms: until then, and
#: until its first reading, the problem is shown on the charts only (``SampleRing.problem``).
START_GRACE_MS = 10_000

#: Samples kept: one hour at ``SAMPLE_INTERVAL_S``.
SAMPLE_COUNT = 3600 // SAMPLE_INTERVAL_S

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """One reading.

    Attributes:
        at_ms: wall-clock time of the reading, ms since the epoch.
        published: entries ever added to the publish stream.
        handled: publications the workers handled (acknowledged: delivered, refused, duplicate, expired).
        depth: messages waiting in every subscriber queue, summed.
        dead_letters: entries in the dead-letter queue ``{qm}:dlq``.
    """

    at_ms: int
    published: int
    handled: int
    depth: int
    dead_letters: int


def take(client: redis.Redis, qm: str, at_ms: int) -> Sample:
    """One sample of queue manager ``qm`` now (``at_ms``: its time, ms since the epoch).

    Raises:
        redis.RedisError, BrokerError: Redis refused a read or cannot be reached (``ForeignKey``
            when a key holds another type).
    """
    counters = read_counters(client, qm, at_ms)
    snap = status(client, qm, keyspace=False)
    depth = sum(row.depth or 0 for row in snap.subscriptions)
    dead = (
        client.xlen(keys.dead_letter(qm)) if client.type(keys.dead_letter(qm)) in (b"stream", "stream") else 0
    )
    return Sample(at_ms, counters.published, counters.handled, depth, int(dead))


class SampleRing:
    """The last ``size`` samples, oldest first; thread-safe.

    Args:
        size: most samples kept (``SAMPLE_COUNT``).
    """

    def __init__(self, size: int = SAMPLE_COUNT) -> None:
        self._samples: deque[Sample] = deque(maxlen=size)
        self._lock = threading.Lock()
        #: the last reading's error, shown with the series ("" when it worked)
        self.problem = ""

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._samples.append(sample)
            self.problem = ""

    def __len__(self) -> int:
        return len(self._samples)

    def series(self) -> dict[str, Any]:
        """The charts' data: ``{"interval_s", "problem", "t" (s since the epoch), "published_per_s",
        "handled_per_s", "depth", "dead_letters"}``, one value per sample (the rates: None for
        the first sample and after a counter went back, a stream deleted)."""
        with self._lock:
            samples = list(self._samples)
        rates: dict[str, list[float | None]] = {"published_per_s": [], "handled_per_s": []}
        for before, now in zip([None, *samples], samples, strict=False):
            span_s = (now.at_ms - before.at_ms) / 1000 if before else 0
            for name, field in (("published_per_s", "published"), ("handled_per_s", "handled")):
                delta = getattr(now, field) - getattr(before, field) if before else -1
                rates[name].append(round(delta / span_s, 3) if span_s > 0 and delta >= 0 else None)
        return {
            "interval_s": SAMPLE_INTERVAL_S,
            "problem": self.problem,
            "t": [s.at_ms / 1000 for s in samples],
            **rates,
            "depth": [s.depth for s in samples],
            "dead_letters": [s.dead_letters for s in samples],
        }


async def run(
    ring: SampleRing,
    connect: Callable[[], redis.Redis],
    qm: str,
    interval_s: float = SAMPLE_INTERVAL_S,
    clock_ms: Callable[[], int] | None = None,
) -> None:
    """Fill ``ring`` every ``interval_s`` until cancelled; a failed reading is kept in
    ``ring.problem`` and logged once, and the next one is tried (the task never dies on one).
    A server that cannot be reached before the first reading is not logged for ``START_GRACE_MS``
    (it may still be starting: ``broker server`` and the console started together)."""
    now = clock_ms or now_ms
    client: redis.Redis | None = None
    started_ms, read, logged = now(), False, False
    while True:
        try:
            if client is None:
                client = await asyncio.to_thread(connect)
            ring.add(await asyncio.to_thread(take, client, qm, now()))
            read, logged = True, False
        except (redis.RedisError, BrokerError, OSError) as exc:
            starting = (
                not read
                and isinstance(exc, (redis.ConnectionError, OSError))
                and now() - started_ms < START_GRACE_MS
            )
            if not logged and not starting:
                _log.warning("console samples: %s", exc)
                logged = True
            ring.problem = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(interval_s)
