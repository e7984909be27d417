"""The ``broker pipeline`` and ``broker journal`` command groups.

Importing this module imports neither PySpark nor pyarrow (they come with the
``spark`` extra): ``broker.pipeline``'s modules import them when a job runs, and
this module imports PySpark only inside ``_spark``, so ``broker --help`` and the
workers start without a JVM. ``broker.cli`` adds both groups to ``broker``; its
``State`` (``ctx.obj``) gives them the settings (``--redis-url``, ``--qm``) and a
Redis client.

Each command parses, calls one library function and prints a summary line on
stdout (progress goes to stderr).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from broker.cli.common import State, _fail
from broker.cli.render import _progress_bars
from broker.core.connection import connect
from broker.pipeline.audit import run_audit, write_figure
from broker.pipeline.journal import export_journal
from broker.pipeline.publish import Progress, publish_dataset
from broker.pipeline.routes import Subscriptions
from broker.pipeline.session import DEFAULT_DRIVER_MEMORY, DEFAULT_MASTER, build_session
from broker.pipeline.source import FORMATS, SourceSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Exit code when the audit finds a violation, or a Spark job fails.
FAILED = 1

_PY_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Lost|Failure|Timeout)\b: ")


def _spark_error(exc: BaseException) -> str:
    """The Python error line inside a failed Spark job's message (else its first line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    found = [line for line in lines if _PY_ERROR_LINE.match(line)]
    return (found[-1] if found else (lines[0] if lines else type(exc).__name__))[:2000]


@contextmanager
def _spark(master: str, driver_memory: str) -> Iterator[SparkSession]:
    """A session for one command: stopped at the end unless it was already running."""
    from pyspark.sql import SparkSession  # lazy: the JVM only when a Spark command runs

    running = SparkSession.getActiveSession()
    spark = build_session(master, driver_memory=driver_memory)
    try:
        yield spark
    except Exception as exc:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        if isinstance(exc, Py4JJavaError | PySparkException):
            _fail(f"Spark job failed: {_spark_error(exc)}", FAILED)
        raise
    finally:
        if running is None:
            spark.stop()


def _split_columns(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if not names:
        raise click.BadParameter("name at least one column", ctx=ctx, param=param)
    return names


def _spark_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--driver-memory",
        default=DEFAULT_DRIVER_MEMORY,
        show_default=True,
        help="spark.driver.memory (in local mode the whole job runs in the driver).",
    )(func)
    return click.option(
        "--master",
        default=DEFAULT_MASTER,
        show_default=True,
        envvar="BROKER_SPARK_MASTER",
        help="Spark master: local[N] (N task slots), local[N,F] (F attempts per task), "
        "spark://host:port. Env: BROKER_SPARK_MASTER.",
    )(func)


def _source_options(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options that say how a row becomes a publication (shared by publish and audit --source)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option(
                "--format",
                "fmt",
                type=click.Choice(FORMATS),
                default=None,
                help=f"Format of {what} (default: from the file extension).",
            ),
            click.option(
                "--topic",
                metavar="COLUMN|TEMPLATE",
                help="The topic: a column, or a template over columns, "
                "e.g. '/FLIGHTS/{origin}/{carrier}/{dest}'.",
            ),
            click.option(
                "--publisher-column",
                metavar="COLUMN",
                help="The column holding the publisher id (order is kept per publisher).",
            ),
            click.option(
                "--publisher-prefix",
                default="",
                metavar="TEXT",
                help="Text before the publisher column's value, e.g. 'carrier-'.",
            ),
            click.option(
                "--order-column",
                "order_columns",
                multiple=True,
                metavar="COLUMN",
                help="Orders each publisher's rows (seq 1..n); repeat for a composite order.",
            ),
            click.option(
                "--body-columns",
                callback=_split_columns,
                metavar="A,B,..",
                help="Columns of the JSON body (default: all).",
            ),
            click.option(
                "--key-columns",
                callback=_split_columns,
                metavar="A,B,..",
                help="Columns identifying a row, hashed into its message id (default: all).",
            ),
            click.option(
                "--null-value",
                default=None,
                metavar="TEXT",
                help="CSV only: the text standing for null (e.g. NA).",
            ),
        ]
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def _source_spec(
    path: str,
    fmt: str | None,
    topic: str | None,
    publisher_column: str | None,
    publisher_prefix: str,
    order_columns: tuple[str, ...],
    body_columns: tuple[str, ...] | None,
    key_columns: tuple[str, ...] | None,
    null_value: str | None,
) -> SourceSpec:
    if not topic or not publisher_column:
        raise click.UsageError("--topic and --publisher-column are required with a data set")
    return SourceSpec(
        path=path,
        topic=topic,
        publisher_column=publisher_column,
        publisher_prefix=publisher_prefix,
        order_columns=tuple(order_columns),
        body_columns=body_columns,
        key_columns=key_columns,
        format=fmt,
        null_value=null_value,
    )


@click.group("pipeline")
def pipeline() -> None:
    """Spark jobs: publish a data set in bulk, audit an exported delivery journal.

    Needs the 'spark' extra (pyspark, pyarrow, matplotlib) and Java 17+.
    """


@click.group("journal")
def journal() -> None:
    """The delivery journal ({qm}:journal, written when the 'journal' setting is on)."""


@pipeline.command("publish", short_help="Publish every row of a data set, in per-publisher order.")
@click.argument("path", type=click.Path(exists=True))
@_source_options("the data set")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="XADDs per pipelined round trip.",
)
@click.option(
    "--max-backlog",
    type=click.IntRange(min=1),
    default=None,
    help="Wait while the workers have this many publications or more not yet acknowledged "
    "(default: never wait).",
)
@click.option(
    "--flow-control/--no-flow-control",
    default=True,
    show_default=True,
    help="Wait, before each batch, the flow-control delay the broker asks for (its slowest "
    "subscriber's pace).",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Tasks publishing in parallel, each owning whole publishers (default: Spark's parallelism).",
)
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr."
)
@_spark_options
@click.pass_obj
def publish_command(
    state: State,
    path: str,
    fmt: str | None,
    topic: str | None,
    publisher_column: str | None,
    publisher_prefix: str,
    order_columns: tuple[str, ...],
    body_columns: tuple[str, ...] | None,
    key_columns: tuple[str, ...] | None,
    null_value: str | None,
    batch: int,
    max_backlog: int | None,
    flow_control: bool,
    partitions: int | None,
    progress: bool,
    master: str,
    driver_memory: str,
) -> None:
    """Publish one message per row of PATH (Parquet, CSV or JSON Lines) with Spark.

    Each publisher's rows are published in the order of --order-column, by one
    task, with a message id hashed from the row's key and a seq numbered in
    that order, so re-running the job (or Spark retrying a task) delivers
    nothing twice. Prints 'rows=<n> publishers=<n> rows_per_s=<n> elapsed_s=<x>'.
    """
    spec = _source_spec(
        path,
        fmt,
        topic,
        publisher_column,
        publisher_prefix,
        order_columns,
        body_columns,
        key_columns,
        null_value,
    )
    settings = state.settings
    connect(settings.redis_url, check=True, tls=settings.tls).close()  # fail fast, before a JVM
    bars = _progress_bars("{task.description}", progress)
    with bars, _spark(master, driver_memory) as spark:
        task = bars.add_task("preparing", total=None)

        def on_progress(p: Progress) -> None:
            bars.update(
                task,
                total=p.total,
                completed=min(p.sent, p.total),
                description=f"published (tasks done: {p.rows_done} rows)",
            )

        report = publish_dataset(
            spark,
            spec,
            redis_url=settings.redis_url,
            tls=settings.tls,
            qm=settings.qm,
            batch=batch,
            max_backlog=max_backlog,
            flow_control=flow_control,
            partitions=partitions,
            on_progress=on_progress,
        )
    click.echo(report.line())


@pipeline.command("audit", short_help="Check an exported journal for order, duplicates, missing deliveries.")
@click.argument("journal_paths", metavar="JOURNAL...", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--subscriptions",
    "subscriptions_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Subscriptions and links in force (JSON, see 'broker journal subscriptions').",
)
@click.option(
    "--subscriptions-from-broker",
    is_flag=True,
    help="Read the subscriptions and links from the broker now instead of a file.",
)
@click.option(
    "--source",
    "source_path",
    type=click.Path(exists=True),
    help="The data set that was published, to find rows never journaled "
    "(give the options it was published with).",
)
@_source_options("the --source data set")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option(
    "--figure",
    "figure_path",
    type=click.Path(dir_okay=False),
    help="Write a PNG here: latency histogram and fan-out per root topic.",
)
@_spark_options
@click.pass_obj
def audit_command(
    state: State,
    journal_paths: tuple[str, ...],
    subscriptions_file: str | None,
    subscriptions_from_broker: bool,
    source_path: str | None,
    fmt: str | None,
    topic: str | None,
    publisher_column: str | None,
    publisher_prefix: str,
    order_columns: tuple[str, ...],
    body_columns: tuple[str, ...] | None,
    key_columns: tuple[str, ...] | None,
    null_value: str | None,
    report_path: str | None,
    figure_path: str | None,
    master: str,
    driver_memory: str,
) -> None:
    """Audit the exported delivery journal JOURNAL (Parquet files or directories) with Spark.

    Counts per-publisher order violations and duplicate deliveries per
    subscription, missing and unexpected deliveries (recomputing who should
    have received each publication from the subscriptions and links), and
    publish-to-delivery latency and fan-out. Prints 'audited=<n>
    order_violations=<n> duplicates=<n> missing=<n> p50_ms=<x> p99_ms=<x>' and
    exits 1 when any violation is found.
    """
    if subscriptions_file and subscriptions_from_broker:
        raise click.UsageError("give --subscriptions or --subscriptions-from-broker, not both")
    subscriptions = None
    if subscriptions_file:
        subscriptions = Subscriptions.read(subscriptions_file)
    elif subscriptions_from_broker:
        subscriptions = Subscriptions.from_broker(state.client(), state.settings.qm)
    spec = None
    if source_path is not None:
        spec = _source_spec(
            source_path,
            fmt,
            topic,
            publisher_column,
            publisher_prefix,
            order_columns,
            body_columns,
            key_columns,
            null_value,
        )
    with _spark(master, driver_memory) as spark:
        report = run_audit(spark, list(journal_paths), subscriptions=subscriptions, source=spec)
    if report_path:
        report.write(report_path)
    if figure_path:
        write_figure(report, figure_path)
    click.echo(report.line())
    if not report.ok:
        click.echo(
            f"violations: order={report.order_violations} duplicates={report.duplicates} "
            f"missing={report.missing} unexpected={report.unexpected} "
            f"seq_mismatches={report.seq_mismatches}"
            + (f" (details in {report_path})" if report_path else ""),
            err=True,
        )
        raise click.exceptions.Exit(FAILED)


@journal.command("export", short_help="Export the journal to Parquet and drain what was exported.")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(),
    help="A directory (each export adds part files) or a new file ending in .parquet.",
)
@click.option(
    "--chunk", type=click.IntRange(min=1), default=10_000, show_default=True, help="Records per XRANGE."
)
@click.option(
    "--rows-per-file",
    type=click.IntRange(min=1),
    default=500_000,
    show_default=True,
    help="Records per part file in a directory.",
)
@click.option("--keep", is_flag=True, help="Leave the exported records in the stream (default: remove them).")
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="Show a progress bar on stderr."
)
@click.pass_obj
def export_command(
    state: State, out: str, chunk: int, rows_per_file: int, keep: bool, progress: bool
) -> None:
    """Write the journal's records, oldest first, as Parquet, then remove exactly those from the stream.

    Prints 'exported=<n> files=<n> drained=<n>'.
    """
    bars = _progress_bars("exported", progress)
    with bars:
        task = bars.add_task("exported", total=None)
        result = export_journal(
            state.client(),
            state.settings.qm,
            out,
            chunk=chunk,
            rows_per_file=rows_per_file,
            drain=not keep,
            on_progress=lambda done, total: bars.update(task, completed=done, total=total),
        )
    for path in result.files:
        click.echo(f"wrote {path}", err=True)
    click.echo(result.line())


@journal.command("subscriptions", short_help="Write the subscriptions and links to a JSON file.")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False),
    help="The JSON file to write (for 'broker pipeline audit --subscriptions').",
)
@click.pass_obj
def subscriptions_command(state: State, out: str) -> None:
    """Write the live subscriptions ({qm}:subs) and links ({qm}:links) as the audit's subscriptions file."""
    snapshot = Subscriptions.from_broker(state.client(), state.settings.qm)
    snapshot.write(out)
    click.echo(f"subscriptions={len(snapshot.subscriptions)} links={len(snapshot.links)} file={out}")


#: The commands this module adds to ``broker``.
COMMANDS = (pipeline, journal)
