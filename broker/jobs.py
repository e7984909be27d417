"""The broker's scheduled admin jobs, run by an rq worker with its scheduler (``broker scheduler``).

rq stores each job's dotted path (``broker.jobs.<name>``), so these functions
must not move, and they take primitive arguments only: the TLS settings of a
``rediss://`` URL travel as the keyword argument ``tls``, a dict of
``TLSOptions``' fields (absent when none are set). Two kinds:

- periodic jobs (trimming the stream, usage snapshots, idle durable expiry):
  each re-enqueues itself with ``enqueue_in`` after it runs; ``schedule``
  makes sure each runs in exactly one chain per queue manager.
- scheduled jobs (``broker jobs schedule``; SwiftMQ's Scheduler Swiftlet jobs):
  a record in ``{qm}:schedules`` (``broker.operations.schedules``) and an rq job enqueued
  at its next cron time (``enqueue_at``). ``run_schedule`` runs the job only
  while the record exists and names that rq job, then enqueues the next run
  and records its id, only if the record still exists: a cancelled schedule
  (record removed, rq job deleted) never runs again, and a corrupt record is
  logged and left for ``broker jobs list`` to name, never run.

One scheduler process per queue manager.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from rq import Queue, Worker
from rq.exceptions import NoSuchJobError
from rq.job import Job

from broker.core import clock, keys
from broker.core.connection import TLSOptions, connect, redact_url, require_single_server
from broker.core.errors import BrokerError, CorruptRecord, translate_errors
from broker.operations import schedules
from broker.operations.durables import Deletion, delete_durables, expire_idle_durables
from broker.operations.maintenance import trim_acknowledged
from broker.operations.schedules import Schedule
from broker.operations.status import status

log = logging.getLogger("broker.jobs")

#: The rq queue the admin jobs run on.
ADMIN_QUEUE = "broker-admin"

#: How many usage snapshots ``{qm}:usage`` keeps.
USAGE_KEEP = 10_000


#: ``TLSOptions`` as an rq job stores it (``dataclasses.asdict``); None: no TLS settings.
TLSArgument = Mapping[str, Any] | None


def _stored(tls: TLSOptions | None) -> dict[str, Any] | None:
    """``tls`` as an rq job stores it (``dataclasses.asdict``); None when no TLS setting is set."""
    return dataclasses.asdict(tls) if tls is not None and tls.configured else None


def _carry(tls: TLSArgument) -> dict[str, Any]:
    """The keyword arguments of an rq job that carry ``tls`` on: ``{"tls": {...}}``, none when it is None."""
    return {"tls": dict(tls)} if tls else {}


def _connect(redis_url: str, tls: TLSArgument) -> redis.Redis:
    """``connect`` in a job, with the TLS settings it was given."""
    return connect(redis_url, tls=TLSOptions(**tls) if tls else None)


def trim_stream(redis_url: str, qm: str, tls: TLSArgument = None) -> int:
    """Trim acknowledged entries from the publish stream; returns how many were removed."""
    return trim_acknowledged(_connect(redis_url, tls), qm)


def usage_snapshot(redis_url: str, qm: str, tls: TLSArgument = None) -> dict[str, int]:
    """Append a usage snapshot (stream length, pending, dead-lettered, queued messages) to ``{qm}:usage``.

    Returns:
        The snapshot's figures.
    """
    client = _connect(redis_url, tls)
    snap = status(client, qm, keyspace=False)  # figures only: no SCAN of the whole database
    figures = {
        "ts_ms": clock.now_ms(),
        "stream_length": snap.stream_length,
        "pending": snap.pending,
        "dead_lettered": snap.dead_lettered,
        "queued": sum(s.depth or 0 for s in snap.subscriptions),
        "subscriptions": len(snap.subscriptions),
        "workers": len(snap.workers),
    }
    client.xadd(keys.usage(qm), {"snapshot": json.dumps(figures)}, maxlen=USAGE_KEEP, approximate=True)
    return figures


def expire_idle(redis_url: str, qm: str, idle_ms: int, tls: TLSArgument = None) -> list[str]:
    """Delete the durable subscriptions no consumer has used for ``idle_ms`` ms (``durable_idle_expiry_ms``).

    Each deletion is logged with the messages lost (``broker.operations.durables``); problems are logged too.

    Returns:
        The subscription ids deleted.
    """
    done = expire_idle_durables(_connect(redis_url, tls), qm, idle_ms)
    _log_problems("idle durable expiry", done)
    return [d.sub_id for d in done.deleted]


def _log_problems(what: str, done: Deletion) -> None:
    for problem in done.problems:
        log.warning("%s: %s", what, problem)


def _description(redis_url: str, qm: str, job: str) -> str:
    """What rq logs for a job instead of its arguments (which hold the URL and its password)."""
    return f"broker.jobs.{job} of queue manager {qm} on {redact_url(redis_url)}"


#: The periodic jobs, by the name ``periodic`` is given.
PERIODIC: dict[str, Callable[..., Any]] = {
    "trim_stream": trim_stream,
    "usage_snapshot": usage_snapshot,
    "expire_idle": expire_idle,
}


#: Why the rq admin jobs cannot use a Redis Cluster.
RQ_ON_CLUSTER = (
    "rq keeps its queues and jobs in keys of no common hash tag, and its worker needs a single "
    "server's connection pool; run the scheduler against a plain redis:// server"
)


def _rq_client(client: redis.Redis, operation: str) -> redis.Redis:
    """``client`` for rq, refused when it is a cluster client.

    Raises:
        ClusterUnsupported: ``client`` is a ``RedisCluster`` (``redis+cluster://``).
    """
    require_single_server(client, operation, RQ_ON_CLUSTER)
    return client


def periodic(
    redis_url: str, qm: str, job: str, interval_ms: int, *args: Any, tls: TLSArgument = None
) -> None:
    """Run the periodic job named ``job`` (a name of ``PERIODIC``) with ``args``, then schedule the next run
    ``interval_ms`` ms later (with the same ``tls``).

    Raises:
        ValueError: an unknown job name.
    """
    if job not in PERIODIC:
        raise ValueError(f"unknown admin job {job!r}; known: {', '.join(sorted(PERIODIC))}")
    try:
        PERIODIC[job](redis_url, qm, *args, tls=tls)
    finally:
        queue = Queue(ADMIN_QUEUE, connection=_rq_client(_connect(redis_url, tls), "the admin scheduler"))
        queue.enqueue_in(
            timedelta(milliseconds=interval_ms),
            periodic,
            redis_url,
            qm,
            job,
            interval_ms,
            *args,
            description=_description(redis_url, qm, job),
            **_carry(tls),
        )


def _periodic_chains(queue: Queue, qm: str) -> dict[str, list[Job]]:
    """The queued and scheduled runs of ``periodic`` for ``qm``, by job name."""
    ids = [*queue.get_job_ids(), *queue.scheduled_job_registry.get_job_ids()]
    chains: dict[str, list[Job]] = {}
    for job in Job.fetch_many(ids, connection=queue.connection):
        try:
            if job is None or job.func_name != f"{__name__}.periodic":
                continue
            args = job.args
        except Exception:  # a job rq cannot load: not one of ours to judge
            continue
        if len(args) >= 4 and args[1] == qm:
            chains.setdefault(str(args[2]), []).append(job)
    return chains


def schedule(
    redis_url: str,
    qm: str,
    interval_ms: int = 60_000,
    idle_expiry_ms: int = 0,
    tls: TLSOptions | None = None,
) -> list[str]:
    """Make each periodic admin job of ``qm`` run in exactly one chain, with these arguments.

    A chain that is missing (never made, or broken when a scheduler died mid-run)
    is enqueued now; one with other arguments (another interval or idle expiry,
    other TLS settings), a duplicate, or one no longer wanted is deleted.
    ``expire_idle`` runs only when ``idle_expiry_ms`` is above 0.

    Args:
        redis_url: the broker's Redis.
        qm: the queue manager.
        interval_ms: how often each job runs, ms.
        idle_expiry_ms: ``durable_idle_expiry_ms``: how long a durable subscription may go unused, ms.
        tls: the TLS settings of a ``rediss://`` URL (``Settings.tls``), for the jobs too.

    Returns:
        The rq job ids enqueued.

    Raises:
        ClusterUnsupported: ``redis_url`` names a Redis Cluster (rq needs one server).
    """
    queue = Queue(ADMIN_QUEUE, connection=_rq_client(connect(redis_url, tls=tls), "the admin scheduler"))
    carried = _carry(_stored(tls))
    wanted: dict[str, tuple[Any, ...]] = {"trim_stream": (), "usage_snapshot": ()}
    if idle_expiry_ms > 0:
        wanted["expire_idle"] = (idle_expiry_ms,)
    chains = _periodic_chains(queue, qm)
    enqueued = []
    for name in sorted(set(wanted) | set(chains)):
        keep = None
        for job in chains.get(name, []):
            if (
                keep is None
                and name in wanted
                and tuple(job.args[3:]) == (interval_ms, *wanted[name])
                and job.kwargs == carried
            ):
                keep = job
            else:
                job.delete()
        if keep is None and name in wanted:
            enqueued.append(
                queue.enqueue(
                    periodic,
                    redis_url,
                    qm,
                    name,
                    interval_ms,
                    *wanted[name],
                    description=_description(redis_url, qm, name),
                    **carried,
                ).id
            )
    return enqueued


def run_scheduler(
    redis_url: str,
    qm: str,
    interval_ms: int = 60_000,
    idle_expiry_ms: int = 0,
    tls: TLSOptions | None = None,
) -> None:
    """Schedule the periodic admin jobs (see ``schedule``) and run an rq worker for them.

    The worker runs rq's scheduler too (``with_scheduler``), which enqueues the
    jobs' next runs and the scheduled jobs (``broker jobs``) when they are due;
    it stops on SIGTERM/SIGINT as rq workers do.

    Args:
        redis_url: the broker's Redis.
        qm: the queue manager.
        interval_ms: how often each periodic job runs, ms.
        idle_expiry_ms: ``durable_idle_expiry_ms``, ms; 0 runs no idle durable expiry.
        tls: the TLS settings of a ``rediss://`` URL (``Settings.tls``).

    Raises:
        ClusterUnsupported: ``redis_url`` names a Redis Cluster (rq needs one server).
    """
    client = _rq_client(connect(redis_url, tls=tls), "the admin scheduler")
    queue = Queue(ADMIN_QUEUE, connection=client)
    schedule(redis_url, qm, interval_ms, idle_expiry_ms, tls)
    Worker([queue], connection=client).work(with_scheduler=True)


# --- scheduled jobs (broker jobs schedule | list | cancel) -----------------------------------------


def _run_delete_durable(client: redis.Redis, qm: str, params: Mapping[str, str]) -> str:
    done = delete_durables(client, qm, params["client_id"], params["durable_name"])
    _log_problems("Delete Durable", done)
    ids = ", ".join(d.sub_id for d in done.deleted)
    return done.summary() + (f": {ids}" if ids else "")


#: How each job of ``broker.operations.schedules.JOBS`` runs: (client, qm, params) -> one line of result.
RUNNERS: dict[str, Callable[[redis.Redis, str, Mapping[str, str]], str]] = {
    "delete-durable": _run_delete_durable,
}


def _enqueue_run(
    client: redis.Redis,
    redis_url: str,
    qm: str,
    schedule_id: str,
    token: str,
    at_ms: int,
    tls: TLSArgument = None,
) -> None:
    Queue(ADMIN_QUEUE, connection=_rq_client(client, "a scheduled admin job")).enqueue_at(
        datetime.fromtimestamp(at_ms / 1000, tz=UTC),
        run_schedule,
        redis_url,
        qm,
        schedule_id,
        token,
        job_id=token,
        description=_description(redis_url, qm, f"run_schedule {schedule_id}"),
        **_carry(tls),
    )


def _delete_rq_job(client: redis.Redis, job_id: str) -> bool:
    """Delete an rq job wherever it is (queued, scheduled, finished); False when there is none."""
    try:
        Job.fetch(job_id, connection=client).delete()
    except NoSuchJobError:
        return False
    return True


@translate_errors
def add_schedule(
    client: redis.Redis,
    redis_url: str,
    qm: str,
    job: str,
    cron: str,
    params: Mapping[str, str],
    now_ms: int | None = None,
    tls: TLSOptions | None = None,
) -> Schedule:
    """Schedule ``job`` with ``params`` at the times of ``cron`` (five fields, UTC).

    Everything is checked before anything is stored. The rq job of the first run
    is enqueued first, then the record: a record always names an rq job.

    Args:
        client: a redis-py client.
        redis_url: the broker's Redis, as the scheduler reaches it (the rq job's argument).
        qm: the queue manager.
        job: a name of ``broker.operations.schedules.JOBS`` (``delete-durable``).
        cron: the cron expression.
        params: the job's parameters (``client_id`` and ``durable_name`` for ``delete-durable``).
        now_ms: the time, ms since the epoch; None for this machine's clock.
        tls: the TLS settings the scheduler reaches ``redis_url`` with (``Settings.tls``).

    Returns:
        The schedule stored, with its id and first run.

    Raises:
        InvalidSchedule: an unknown job, a cron expression that is not five valid fields or
            never fires, a missing parameter.
        InvalidSelector: a predicate parameter is invalid.
        ClusterUnsupported: ``client`` is a Redis Cluster client (rq needs one server).
    """
    now = clock.now_ms() if now_ms is None else now_ms
    made = schedules.new_schedule(job, cron, params, now)
    _enqueue_run(client, redis_url, qm, made.schedule_id, made.rq_job, made.next_run_ms, _stored(tls))
    if not schedules.store(client, qm, made):  # an id taken (8 random hex digits): try once more
        _delete_rq_job(client, made.rq_job)
        return add_schedule(client, redis_url, qm, job, cron, params, now_ms, tls)
    log.info("scheduled %s %s at %r (%s)", made.schedule_id, job, cron, made.params)
    return made


@translate_errors
def cancel_schedule(client: redis.Redis, qm: str, schedule_id: str) -> Schedule | CorruptRecord:
    """Cancel a schedule: remove its record (even a corrupt one) and delete its rq job.

    A run already under way finishes; no run starts after this returns.

    Returns:
        The schedule removed, or the ``CorruptRecord`` an unreadable one was.

    Raises:
        NoSuchSchedule: there is no such schedule.
    """
    removed = schedules.remove(client, qm, schedule_id)
    if isinstance(removed, Schedule):
        _delete_rq_job(client, removed.rq_job)
    log.info("cancelled schedule %s", schedule_id)
    return removed


@translate_errors
def list_schedules(client: redis.Redis, qm: str) -> tuple[list[Schedule], list[str]]:
    """Every schedule (sorted by next run), and problems: records that cannot be read, and
    schedules whose rq job is gone (nothing will run them: cancel and schedule them again).

    Raises:
        ForeignKey: ``{qm}:schedules`` holds another Redis type.
    """
    found, corrupt = schedules.read_schedules(client, qm)
    problems = [str(p) for p in corrupt]
    problems.extend(
        f"schedule {item.schedule_id}: its rq job {item.rq_job} is gone, so it will not run; "
        "cancel it and schedule it again"
        for item in found
        if not Job.exists(item.rq_job, connection=client)
    )
    return found, problems


def run_schedule(
    redis_url: str,
    qm: str,
    schedule_id: str,
    token: str,
    now_ms: int | None = None,
    tls: TLSArgument = None,
) -> str:
    """The rq job of one run of a schedule: run it, then enqueue the next run.

    Runs only while the record exists and names this rq job (``token``): a
    cancelled schedule, or a stale run of one, does nothing and ends its chain.
    A corrupt record is logged and not run (``broker jobs list`` names it).

    Args:
        redis_url: the broker's Redis.
        qm: the queue manager.
        schedule_id: the schedule.
        token: this run's rq job id.
        now_ms: the time, ms since the epoch; None for this machine's clock.
        tls: the TLS settings (``TLSOptions``' fields), passed on to the next run.

    Returns:
        What happened, one line (also logged): the job's result, "cancelled", "stale" or "corrupt".
    """
    client = _connect(redis_url, tls)
    now = clock.now_ms() if now_ms is None else now_ms
    try:
        record = schedules.get_schedule(client, qm, schedule_id)
    except BrokerError as exc:  # a corrupt record, a foreign {qm}:schedules
        log.error("schedule %s not run: %s", schedule_id, exc)
        return "corrupt"
    if record is None:
        log.info("schedule %s was cancelled: not run", schedule_id)
        return "cancelled"
    if record.rq_job != token:
        log.warning(
            "schedule %s: rq job %s is not its current run (%s): not run", schedule_id, token, record.rq_job
        )
        return "stale"
    try:
        result = RUNNERS[record.job](client, qm, record.params)
    except Exception as exc:  # the next run is still scheduled; the failure is recorded
        log.exception("schedule %s (%s) failed", schedule_id, record.job)
        result = f"failed: {exc}"
    log.info("schedule %s (%s %s): %s", schedule_id, record.job, record.params, result)
    next_run = schedules.next_run_ms(record.cron, now)
    following = schedules.run_token(schedule_id)
    _enqueue_run(client, redis_url, qm, schedule_id, following, next_run, tls)
    recorded = schedules.advance(
        client,
        qm,
        schedule_id,
        token,
        next_run_ms=next_run,
        rq_job=following,
        last_run_ms=now,
        last_result=result,
    )
    if not recorded:  # cancelled while it ran: its next run must not stay queued
        _delete_rq_job(client, following)
        log.info("schedule %s was cancelled while it ran: no next run", schedule_id)
    return result
