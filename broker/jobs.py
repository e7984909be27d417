"""The broker's scheduled admin jobs, run by an rq worker with its scheduler (``broker scheduler``).

rq stores each job's dotted path (``broker.jobs.<name>``), so these functions
must not move, and they take primitive arguments only. Each periodic job
re-enqueues itself with ``enqueue_in`` after it runs.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

from rq import Queue, Worker

from broker import keys
from broker.connection import connect, redact_url
from broker.maintenance import trim_acknowledged
from broker.status import status

#: The rq queue the admin jobs run on.
ADMIN_QUEUE = "broker-admin"

#: How many usage snapshots ``{qm}:usage`` keeps.
USAGE_KEEP = 10_000


def trim_stream(redis_url: str, qm: str) -> int:
    """Trim acknowledged entries from the publish stream; returns how many were removed."""
    return trim_acknowledged(connect(redis_url), qm)


def usage_snapshot(redis_url: str, qm: str) -> dict[str, int]:
    """Append a usage snapshot (stream length, pending, dead-lettered, queued messages) to ``{qm}:usage``.

    Returns:
        The snapshot's figures.
    """
    client = connect(redis_url)
    snap = status(client, qm)
    figures = {
        "ts_ms": int(time.time() * 1000),
        "stream_length": snap["stream_length"],
        "pending": snap["pending"],
        "dead_lettered": snap["dead_lettered"],
        "queued": sum(s["depth"] or 0 for s in snap["subscriptions"]),
        "subscriptions": len(snap["subscriptions"]),
        "workers": len(snap["workers"]),
    }
    client.xadd(keys.usage(qm), {"snapshot": json.dumps(figures)}, maxlen=USAGE_KEEP, approximate=True)
    return figures


def _description(redis_url: str, qm: str, job: str) -> str:
    """What rq logs for a job instead of its arguments (which hold the URL and its password)."""
    return f"broker.jobs.{job} of queue manager {qm} on {redact_url(redis_url)}"


def periodic(redis_url: str, qm: str, job: str, interval_ms: int) -> None:
    """Run the job named ``job`` ("trim_stream" or "usage_snapshot"), then schedule the next run.

    Raises:
        ValueError: an unknown job name.
    """
    functions = {"trim_stream": trim_stream, "usage_snapshot": usage_snapshot}
    if job not in functions:
        raise ValueError(f"unknown admin job {job!r}; known: {', '.join(sorted(functions))}")
    try:
        functions[job](redis_url, qm)
    finally:
        queue = Queue(ADMIN_QUEUE, connection=connect(redis_url))
        queue.enqueue_in(
            timedelta(milliseconds=interval_ms),
            periodic,
            redis_url,
            qm,
            job,
            interval_ms,
            description=_description(redis_url, qm, job),
        )


def schedule(redis_url: str, qm: str, interval_ms: int = 60_000) -> list[str]:
    """Enqueue the periodic admin jobs once (an rq worker with ``--with-scheduler`` runs them).

    Returns:
        The rq job ids.
    """
    queue = Queue(ADMIN_QUEUE, connection=connect(redis_url))
    return [
        queue.enqueue(
            periodic, redis_url, qm, job, interval_ms, description=_description(redis_url, qm, job)
        ).id
        for job in ("trim_stream", "usage_snapshot")
    ]


def run_scheduler(redis_url: str, qm: str, interval_ms: int = 60_000) -> None:
    """Schedule the periodic admin jobs (unless already scheduled) and run an rq worker for them.

    The worker runs rq's scheduler too (``with_scheduler``), which enqueues the
    jobs' next runs; it stops on SIGTERM/SIGINT as rq workers do.

    Args:
        redis_url: the broker's Redis.
        qm: the queue manager.
        interval_ms: how often each job runs, ms.
    """
    client = connect(redis_url)
    queue = Queue(ADMIN_QUEUE, connection=client)
    if not queue.count and not queue.scheduled_job_registry.count:
        schedule(redis_url, qm, interval_ms)
    Worker([queue], connection=client).work(with_scheduler=True)
