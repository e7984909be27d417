"""The bulk publish job: a data set in, one publication per row, per-publisher order kept.

Plan (``publish_dataset``):

1. ``source.prepare`` gives every row its publisher, topic, JSON body, msgid
   (a hash of the row's key) and seq (its rank in the publisher's order).
2. ``repartition(n, publisher)`` puts all the rows of one publisher in one
   partition, and ``sortWithinPartitions(publisher, seq)`` puts them in order.
3. Each partition (one Spark task) opens its own Redis client and XADDs its
   rows in that order, ``batch`` per pipelined round trip, waiting for room
   first when ``max_backlog`` is set (``broker.core.flow.wait_for_room``). So each
   publisher's entries reach the stream in seq order, from one writer. With
   flow control (the default), each round trip also reads the flow keys of the
   batch's publishers, and the next round trip waits the largest delay they
   held (``broker.core.flow.FlowGate``): the partition slows to its slowest
   subscriber's pace.

Re-running the job, or Spark re-running a failed task, sends the same entries
again with the same msgids and seqs; the workers find the msgid in their
de-duplication records (``dedup_window_ms``) and deliver nothing twice.
The entries of a partition's first attempt come before those of its retry in
the stream, so every publication is delivered in order from its first copy.

Progress: a Spark accumulator counts the rows of finished tasks (exact: Spark
applies a task's accumulator update once, on success, never from a failed
attempt); since tasks report only when they end, a driver thread also reads
the stream's ``entries-added`` counter to show XADDs as they happen.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis

from broker.core import keys
from broker.core.connection import TLSOptions, connect, unreachable
from broker.core.errors import ConnectionLost, InjectedFailure, ServerError
from broker.core.flow import FlowGate, parse_delay, wait_for_room
from broker.core.models import publication_fields
from broker.pipeline.session import task_attempts
from broker.pipeline.source import SourceSpec, prepare, read_source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: XADDs per pipelined round trip, by default.
DEFAULT_BATCH = 500
#: How often the driver's progress thread reports, seconds.
PROGRESS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Progress:
    """What the progress callback is told.

    Attributes:
        total: rows in the data set.
        sent: entries added to the publish stream since the job started (all
            writers, retried halves included).
        rows_done: rows of the tasks that finished (the accumulator).
    """

    total: int
    sent: int
    rows_done: int


@dataclass
class PublishReport:
    """The outcome of a publish job.

    Attributes:
        rows: rows published (each once, by the task attempt that succeeded).
        publishers: distinct publishers.
        elapsed_s: seconds from reading the data set to the last XADD.
        xadds: entries the job added to the stream, retried ones included
            (read from the stream's ``entries-added`` counter: exact only when
            nothing else publishes meanwhile).
        per_publisher: publisher -> rows.
    """

    rows: int
    publishers: int
    elapsed_s: float
    xadds: int
    per_publisher: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        """Rows per second over the whole job."""
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        """``rows=<n> publishers=<n> rows_per_s=<n> elapsed_s=<x>``."""
        return (
            f"rows={self.rows} publishers={self.publishers} rows_per_s={int(self.rows_per_s)} "
            f"elapsed_s={self.elapsed_s:.1f}"
        )


def _entries_added(client: redis.Redis, qm: str) -> int:
    """The publish stream's ``entries-added`` counter (0 before the stream exists)."""
    try:
        info = client.xinfo_stream(keys.publish_stream(qm))
    except redis.ResponseError:
        return 0
    added = info.get("entries-added")
    return int(added) if added is not None else int(info["length"])


def _publish_partition(
    index: int,
    rows: Iterable[Any],
    *,
    redis_url: str,
    qm: str,
    batch: int,
    max_backlog: int | None,
    backlog_timeout_ms: int | None,
    counter: Any,
    fail_partition: int | None,
    marker_dir: str | None,
    flow_control: bool = True,
    clock_ms: Callable[[], float] | None = None,
    sleep_ms: Callable[[float], None] | None = None,
    tls: TLSOptions | None = None,
) -> Iterator[tuple[str, int]]:
    """Publish one partition's rows in order (runs in a Spark task).

    Each batch is one pipelined round trip; with ``flow_control`` it also reads the flow
    keys of the batch's publishers (``{qm}:pub:<publisher>:flow``), and the next batch
    waits the largest delay read, ms (``clock_ms``/``sleep_ms`` are injectable for tests).

    Yields:
        ``(publisher, rows)`` for each publisher of the partition.

    Raises:
        InjectedFailure: this is ``fail_partition`` and its marker file does
            not exist yet: raised after half its rows are in the stream.
        ConnectionLost, ServerError: Redis failed; Spark retries the task.
        ReplyTimeout: the workers' backlog stayed at ``max_backlog`` for ``backlog_timeout_ms``.
    """
    stream = keys.publish_stream(qm)
    client = connect(redis_url, tls=tls)
    fail_after: int | None = None
    marker = Path(marker_dir, f"fail-partition-{index}") if marker_dir else None
    if fail_partition == index and marker is not None and not marker.exists():
        rows = list(rows)
        fail_after = len(rows) // 2
    counts: dict[str, int] = {}
    pipe = client.pipeline(transaction=False)
    pending = sent = 0
    gate = FlowGate(flow_control, clock_ms, sleep_ms)
    batch_publishers: dict[str, None] = {}  # the publishers of the batch, in order

    def flush() -> None:
        nonlocal pending, sent
        if not pending:
            return
        if max_backlog:
            wait_for_room(client, qm, max_backlog, timeout_ms=backlog_timeout_ms)
        gate.wait()
        if flow_control:
            for publisher in batch_publishers:
                pipe.get(keys.flow_key(qm, publisher))
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[:pending]:
            if isinstance(reply, Exception):
                raise reply
        if flow_control:
            gate.learn(max((parse_delay(r) for r in replies[pending:]), default=0))
        batch_publishers.clear()
        counter.add(pending)
        sent += pending
        pending = 0

    try:
        for row in rows:
            if fail_after is not None and sent + pending >= fail_after:
                break
            publisher = row["publisher"]
            fields = publication_fields(
                publisher, row["topic"], row["body"].encode(), msgid=row["msgid"], seq=row["seq"]
            )
            pipe.xadd(stream, cast(dict[Any, Any], fields))
            batch_publishers[publisher] = None
            counts[publisher] = counts.get(publisher, 0) + 1
            pending += 1
            if pending >= batch:
                flush()
        flush()
        if fail_after is not None and marker is not None:
            marker.touch()
            raise InjectedFailure(f"partition {index} failed on purpose after {sent} rows (first attempt)")
    except redis.ConnectionError as exc:
        raise ConnectionLost(f"partition {index}: publish failed: {exc}") from exc
    except redis.ResponseError as exc:
        raise ServerError(f"partition {index}: publish refused by the server: {exc}") from exc
    finally:
        client.close()
    yield from counts.items()


def _check_options(
    master: str, batch: int, partitions: int | None, max_backlog: int | None, fail_partition: int | None
) -> None:
    """Refuse ``publish_dataset``'s bad options before anything is read or sent.

    Raises:
        ValueError: ``batch``, ``partitions`` or ``max_backlog`` below 1, or ``fail_partition``
            with a Spark ``master`` that runs each task once.
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    if partitions is not None and partitions < 1:
        raise ValueError("partitions must be at least 1")
    if max_backlog is not None and max_backlog < 1:
        raise ValueError("max_backlog must be at least 1")
    if fail_partition is not None:
        attempts = task_attempts(master)
        if attempts is not None and attempts < 2:
            raise ValueError(
                f"fail_partition needs task retries but master {master!r} runs each task once; "
                "use a master like local[2,3]"
            )


def _run_tasks(
    rows: Any, task: Callable[..., Any], report_progress: Callable[[], None], interval_s: float
) -> list[tuple[str, int]]:
    """Run ``task`` on every partition of ``rows`` (a DataFrame), calling ``report_progress`` from a
    driver thread every ``interval_s`` seconds meanwhile (its Redis errors ignored: best effort).

    Returns:
        The tasks' ``(publisher, rows)`` pairs.
    """
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(interval_s):
            with contextlib.suppress(redis.RedisError):  # best effort; the job reports errors
                report_progress()

    poller = threading.Thread(target=poll, name="publish-progress", daemon=True)
    poller.start()
    try:
        results: list[tuple[str, int]] = rows.rdd.mapPartitionsWithIndex(task).collect()
    finally:
        stop.set()
        poller.join()
    return results


def publish_dataset(
    spark: SparkSession,
    source: SourceSpec,
    *,
    redis_url: str,
    qm: str,
    batch: int = DEFAULT_BATCH,
    max_backlog: int | None = None,
    backlog_timeout_ms: int | None = None,
    flow_control: bool = True,
    partitions: int | None = None,
    fail_partition: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = PROGRESS_INTERVAL_S,
    tls: TLSOptions | None = None,
) -> PublishReport:
    """Publish every row of a data set, each publisher's rows in order.

    Args:
        spark: the session (``broker.pipeline.session.build_session``).
        source: the data set and how a row becomes a publication.
        redis_url: the Redis server; every task connects on its own.
        qm: the queue manager.
        batch: XADDs per pipelined round trip, >= 1.
        max_backlog: wait before each batch while the workers have this many
            publications or more not yet acknowledged; None: never wait.
            Each task waits on its own, so the backlog can overshoot by up to
            ``partitions * batch``.
        backlog_timeout_ms: fail the task (``ReplyTimeout``) when the backlog stays
            at ``max_backlog`` this long, ms; None: wait for as long as it takes.
        flow_control: wait, before each batch, the flow-control delay the broker asked
            of the previous batch's publishers (their slowest subscriber's); False: never.
        partitions: tasks publishing in parallel (each owns whole publishers);
            None: Spark's default parallelism.
        fail_partition: testing: the partition with this index raises
            ``InjectedFailure`` after publishing half its rows the first time it
            runs (a marker file in a temporary directory lets the retry pass).
            Needs task retries (a ``local[N,F]`` master with F >= 2).
        on_progress: called from a driver thread every ``progress_interval_s``
            seconds and once at the end.
        progress_interval_s: seconds between progress calls.
        tls: the TLS settings of a ``rediss://`` URL (``Settings.tls``), for the
            driver and every task.

    Returns:
        The ``PublishReport``.

    Raises:
        ValueError: bad options (unknown column, format, ``batch`` < 1, no retries
            for ``fail_partition``).
        ConnectionLost: Redis cannot be reached from the driver.
        pyspark.errors.PySparkException / Py4JJavaError: a task failed more times
            than Spark retries it (its Redis error is in the message).
    """
    sc = spark.sparkContext
    _check_options(str(sc.master), batch, partitions, max_backlog, fail_partition)
    started = time.perf_counter()
    client = connect(redis_url, check=True, tls=tls)
    try:
        added_before = _entries_added(client, qm)
        n = partitions or sc.defaultParallelism
        rows = (
            prepare(read_source(spark, source), source)
            .repartition(n, "publisher")
            .sortWithinPartitions("publisher", "seq")
        )
        rows = rows.persist()
        marker_dir = tempfile.mkdtemp(prefix="broker-fail-") if fail_partition is not None else None
        try:
            total = rows.count()
            counter = sc.accumulator(0)
            task = functools.partial(
                _publish_partition,
                redis_url=redis_url,
                tls=tls,
                qm=qm,
                batch=batch,
                max_backlog=max_backlog,
                backlog_timeout_ms=backlog_timeout_ms,
                flow_control=flow_control,
                counter=counter,
                fail_partition=fail_partition,
                marker_dir=marker_dir,
            )

            def report_progress() -> None:
                if on_progress is not None:
                    sent = _entries_added(client, qm) - added_before
                    on_progress(Progress(total=total, sent=sent, rows_done=int(counter.value)))

            results = _run_tasks(rows, task, report_progress, progress_interval_s)
            elapsed = time.perf_counter() - started
            report_progress()
        finally:
            rows.unpersist()
            if marker_dir is not None:
                shutil.rmtree(marker_dir, ignore_errors=True)
        per_publisher: dict[str, int] = {}
        for publisher, count in results:
            per_publisher[publisher] = per_publisher.get(publisher, 0) + count
        xadds = _entries_added(client, qm) - added_before
    except redis.ConnectionError as exc:
        raise ConnectionLost(unreachable(redis_url, tls, exc)) from exc
    finally:
        client.close()
    return PublishReport(
        rows=int(counter.value),
        publishers=len(per_publisher),
        elapsed_s=elapsed,
        xadds=xadds,
        per_publisher=per_publisher,
    )
