"""Schedule records: which admin job runs when (SwiftMQ's Scheduler Swiftlet jobs, seed 003).

A schedule is one field of ``{qm}:schedules`` (the protocol document,
``broker.core.keys``): a job name, its parameters, a cron expression, the next run
and the id of the rq job that will run it. ``broker.jobs`` enqueues that rq
job and runs it; this module reads, checks and changes the records.

Cron expressions are five fields (minute hour day-of-month month day-of-week,
``croniter`` syntax: ``*/5``, ``1-5``, ``mon-fri``), read in UTC as rq's own
scheduler does. One that never fires (``0 0 30 2 *``) is refused.

The jobs (``JOBS``): ``delete-durable`` with ``client_id`` and ``durable_name``,
two SQL-LIKE predicates (``broker.operations.durables.delete_durables``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import redis
from croniter import CroniterBadDateError, croniter

from broker.core import keys
from broker.core.connection import KEEP, change_field, read_hash, translate_errors
from broker.core.errors import CorruptRecord, InvalidSchedule, NoSuchSchedule
from broker.operations.durables import check_predicate

#: The jobs that can be scheduled -> their parameters (all mandatory), and how each is checked.
JOBS: dict[str, dict[str, str]] = {
    "delete-durable": {"client_id": "client id", "durable_name": "durable name"},
}


def check_cron(cron: str) -> None:
    """Check a cron expression: five fields that ``croniter`` reads and that fire at some time.

    Raises:
        InvalidSchedule: it is not.
    """
    next_run_ms(cron, 0)


def next_run_ms(cron: str, after_ms: int) -> int:
    """The first time after ``after_ms`` that ``cron`` fires, in UTC, ms since the epoch.

    Raises:
        InvalidSchedule: ``cron`` is not five valid fields, or never fires.
    """
    fields = cron.split()
    if len(fields) != 5:
        raise InvalidSchedule(
            f"cron expression {cron!r} must have 5 fields (minute hour day-of-month month day-of-week), "
            f"not {len(fields)}"
        )
    if not croniter.is_valid(cron):
        raise InvalidSchedule(f"cron expression {cron!r} is not valid")
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    try:
        fires = croniter(cron, start).get_next(datetime)
    except CroniterBadDateError as exc:
        raise InvalidSchedule(f"cron expression {cron!r} never fires") from exc
    return int(fires.timestamp() * 1000)


def check_params(job: str, params: Mapping[str, str]) -> dict[str, str]:
    """Check a job's name and parameters; returns the parameters as stored.

    Raises:
        InvalidSchedule: an unknown job, a missing or unknown parameter.
        InvalidSelector: a predicate parameter is invalid.
    """
    wanted = JOBS.get(job)
    if wanted is None:
        raise InvalidSchedule(f"unknown job {job!r}; known: {', '.join(sorted(JOBS))}")
    unknown = sorted(set(params) - set(wanted))
    missing = [name for name in wanted if not params.get(name)]
    if unknown or missing:
        raise InvalidSchedule(
            f"job {job!r} takes the parameters {', '.join(wanted)}"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    for name, what in wanted.items():
        check_predicate(what, params[name])
    return {name: params[name] for name in wanted}


@dataclass(frozen=True)
class Schedule:
    """One scheduled job as stored in ``{qm}:schedules``.

    Attributes:
        schedule_id: ``<job>-<8 hex digits>``.
        job: a name of ``JOBS``.
        cron: five cron fields, UTC.
        params: the job's parameters.
        created_ms: when it was scheduled, ms since the epoch.
        next_run_ms: when it runs next, ms since the epoch.
        rq_job: the id of the rq job that runs it then; a run whose id differs does nothing.
        last_run_ms: when it last ran, ms since the epoch; None before the first run.
        last_result: what the last run did, one line.
    """

    schedule_id: str
    job: str
    cron: str
    params: dict[str, str]
    created_ms: int
    next_run_ms: int
    rq_job: str
    last_run_ms: int | None = None
    last_result: str = field(default="")

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "job": self.job,
            "cron": self.cron,
            "params": self.params,
            "created_ms": self.created_ms,
            "next_run_ms": self.next_run_ms,
            "rq_job": self.rq_job,
        }
        if self.last_run_ms is not None:
            data["last_run_ms"] = self.last_run_ms
            data["last_result"] = self.last_result
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, qm: str, schedule_id: str, raw: bytes | str) -> Schedule:
        """Parse and check a stored record.

        Raises:
            CorruptRecord: not JSON, an unknown job, a bad cron expression or parameter,
                a field of the wrong type.
        """
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            job, cron, params = data.get("job"), data.get("cron"), data.get("params")
            if not isinstance(job, str) or not isinstance(cron, str) or not isinstance(params, dict):
                raise ValueError('"job" and "cron" must be strings, "params" an object')
            check_cron(cron)
            params = check_params(job, params)
            ints = {name: data.get(name) for name in ("created_ms", "next_run_ms")}
            last_run = data.get("last_run_ms")
            if any(type(v) is not int for v in ints.values()) or (
                last_run is not None and type(last_run) is not int
            ):
                raise ValueError('"created_ms", "next_run_ms" and "last_run_ms" must be integers')
            rq_job, last_result = data.get("rq_job"), data.get("last_result", "")
            if not isinstance(rq_job, str) or not isinstance(last_result, str):
                raise ValueError('"rq_job" and "last_result" must be strings')
        except ValueError as exc:  # InvalidSchedule, InvalidSelector and JSONDecodeError included
            reason = "not JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise CorruptRecord(keys.schedules(qm), schedule_id, reason) from exc
        created, next_run = int(data["created_ms"]), int(data["next_run_ms"])
        return cls(schedule_id, job, cron, params, created, next_run, rq_job, last_run, last_result)


def new_schedule(job: str, cron: str, params: Mapping[str, str], now_ms: int) -> Schedule:
    """A schedule not stored yet, with a new id and its first run after ``now_ms``.

    Raises:
        InvalidSchedule: an unknown job, a bad cron expression, a missing parameter.
        InvalidSelector: a predicate parameter is invalid.
    """
    checked = check_params(job, params)
    first = next_run_ms(cron, now_ms)
    schedule_id = f"{job}-{uuid.uuid4().hex[:8]}"
    return Schedule(schedule_id, job, cron, checked, now_ms, first, run_token(schedule_id))


def run_token(schedule_id: str) -> str:
    """A new id for the rq job of a schedule's next run (rq's job id alphabet: ``A-Za-z0-9_-``)."""
    return f"{schedule_id}-{uuid.uuid4().hex[:12]}"


def _decode(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


@translate_errors
def read_schedules(client: redis.Redis, qm: str) -> tuple[list[Schedule], list[CorruptRecord]]:
    """Every schedule that can be read (sorted by next run), and the records that cannot.

    Raises:
        ForeignKey: ``{qm}:schedules`` holds another Redis type.
    """
    found: list[Schedule] = []
    problems: list[CorruptRecord] = []
    for raw_id, raw in read_hash(client, keys.schedules(qm)).items():
        try:
            found.append(Schedule.from_json(qm, _decode(raw_id), raw))
        except CorruptRecord as exc:
            problems.append(exc)
    found.sort(key=lambda s: (s.next_run_ms, s.schedule_id))
    return found, problems


@translate_errors
def get_schedule(client: redis.Redis, qm: str, schedule_id: str) -> Schedule | None:
    """The schedule, or None when there is none (it was cancelled).

    Raises:
        CorruptRecord: its record cannot be read.
        ForeignKey: ``{qm}:schedules`` holds another Redis type.
    """
    raw = read_hash(client, keys.schedules(qm)).get(schedule_id.encode())
    return None if raw is None else Schedule.from_json(qm, schedule_id, raw)


@translate_errors
def store(client: redis.Redis, qm: str, schedule: Schedule) -> bool:
    """Store a new schedule; False when its id is taken (nothing written)."""
    return bool(client.hsetnx(keys.schedules(qm), schedule.schedule_id, schedule.to_json()))


@translate_errors
def remove(client: redis.Redis, qm: str, schedule_id: str) -> Schedule | CorruptRecord:
    """Remove a schedule's record (a corrupt one too): it never runs again.

    Returns:
        The schedule removed, or the ``CorruptRecord`` that described an unreadable one.

    Raises:
        NoSuchSchedule: there is no such schedule.
    """
    removed: list[Schedule | CorruptRecord] = []

    def decide(pipe: Any) -> Any:
        raw = pipe.hget(keys.schedules(qm), schedule_id)
        if raw is None:
            raise NoSuchSchedule(f"no scheduled job {schedule_id!r} in queue manager {qm!r}")
        try:
            removed.append(Schedule.from_json(qm, schedule_id, raw))
        except CorruptRecord as exc:
            removed.append(exc)
        return None  # HDEL

    change_field(client, keys.schedules(qm), schedule_id, decide, None)
    return removed[-1]


@translate_errors
def advance(client: redis.Redis, qm: str, schedule_id: str, ran: str, **changes: Any) -> bool:
    """Record a run and the next one, only if the schedule still exists and rq job ``ran`` runs it.

    Args:
        ran: the rq job id that ran (the record's ``rq_job``).
        **changes: fields of ``Schedule`` to change (``next_run_ms``, ``rq_job``, ``last_run_ms``,
            ``last_result``).

    Returns:
        False when the schedule was cancelled (or given another rq job) meanwhile: nothing written.
    """

    def decide(pipe: Any) -> Any:
        raw = pipe.hget(keys.schedules(qm), schedule_id)
        if raw is None:
            return KEEP
        try:
            current = Schedule.from_json(qm, schedule_id, raw)
        except CorruptRecord:
            return KEEP
        if current.rq_job != ran:
            return KEEP
        return replace(current, **changes).to_json()

    return change_field(client, keys.schedules(qm), schedule_id, decide, None) is not KEEP
