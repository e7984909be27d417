"""The cost of topic statistics (issue 28 row 13): prints figures, not a timed test.

- Python µs per publication of the worker's apply step (``TopicCounter.note`` over decoded
  batches of 256 delivered publications: 1 topic string, 100, and 256 new ones per batch
  past the bound), the best of 5 repeats; nothing else of the hot path changes (no Redis call).
- With ``--redis-url``: ms per flush of 1,000 topic strings (two pipelined round trips, off the
  hot path), on the queue manager ``--qm`` (default ``TOPICSTATS``, its statistics keys removed after).

    PYTHONPATH=$PWD python -m scripts.bench_topic_stats [--redis-url redis://127.0.0.1:7114/0]
"""

from __future__ import annotations

import argparse
import time
import timeit

import redis

from broker.core import keys
from broker.core.unit_of_work import Action, Outcome, UnitOfWork
from broker.operations.topic_stats import TopicCounter

BATCH = 256


def _decoded(topics: list[str], start: int = 0) -> list[tuple[UnitOfWork, Outcome, int, bool]]:
    return [
        (
            UnitOfWork("p", f"{i}-0", Action.DELIVER, f"m{i}", topic=topics[(start + i) % len(topics)]),
            Outcome.DELIVERED,
            2,
            False,
        )
        for i in range(BATCH)
    ]


def note_us(topics: list[str], max_topics: int = 1_000, rounds: int = 2_000) -> float:
    """Best µs per publication of ``TopicCounter.note`` (5 repeats of ``rounds`` batches)."""
    counter = TopicCounter(max_topics)
    decoded = _decoded(topics)
    for _ in range(10):
        counter.note(decoded, 1)
    best = min(timeit.repeat(lambda: counter.note(decoded, 1), number=rounds, repeat=5))
    return best / rounds / BATCH * 1e6


def flush_ms(client: redis.Redis, qm: str, topics: int = 1_000, repeat: int = 5) -> list[float]:
    """ms per flush of ``topics`` topic strings (each flush after a fresh count of them all)."""
    decoded = [
        d for start in range(0, topics, BATCH) for d in _decoded([f"bench/{i}" for i in range(topics)], start)
    ]
    out = []
    try:
        for n in range(repeat):
            counter = TopicCounter(topics)
            counter.note(decoded, n)
            started = time.perf_counter()
            counter.flush(client, qm)
            out.append((time.perf_counter() - started) * 1000)
    finally:
        client.delete(keys.topic_publications(qm), keys.topic_copies(qm), keys.topic_last_publication(qm))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--qm", default="TOPICSTATS")
    args = parser.parse_args()
    print(f"note, 1 topic string:         {note_us(['t/1']):.3f} µs per publication")
    print(f"note, 100 topic strings:      {note_us([f't/{i}' for i in range(100)]):.3f} µs per publication")
    past = note_us([f"t/{i}" for i in range(10_000)], max_topics=10)
    print(f"note, past the bound (10):    {past:.3f} µs per publication")
    if args.redis_url:
        client = redis.Redis.from_url(args.redis_url)
        print(
            "flush of 1,000 topic strings: "
            + ", ".join(f"{ms:.1f}" for ms in flush_ms(client, args.qm))
            + " ms"
        )


if __name__ == "__main__":
    main()
