"""The audit: check an exported delivery journal for the broker's guarantees, in Spark.

Input: the Parquet journal (``broker journal export``), optionally the
subscriptions and links in force (a subscriptions file, see
``broker.pipeline.routes``) and the source data set the publications came
from (``broker.pipeline.source``, same options as the publish job).

The journal's own order is its stream id (``journal_id``): a record is added
in the same atomic unit of work as the fan-out, so two deliveries to one
subscriber queue are journaled in the order they were pushed. Records that
appear twice with the same ``journal_id`` (an export repeated after a crash)
are counted once.

Checks, each per subscription (the ``subs`` of ``delivered`` records exploded):

* **duplicates**: a (subscription, publisher, msgid) delivered more than once;
  each copy after the first counts.
* **order violations**: within (subscription, publisher), taking each msgid's
  first delivery in journal order, a seq that is not greater than the previous
  one (records without a seq are not ordered and are counted as ``no_seq``).
* **missing**: with subscriptions, every publication delivered in the journal
  (and, with a source, every source row never journaled at all) should reach
  exactly the subscriptions whose filter matches its topic or a topic linked
  from it; each expected (subscription, publication) pair not delivered
  counts. With a source and no subscriptions, each source publication never
  journaled counts once.
* **unexpected**: a delivery to a subscription the rules do not give it.
* **seq mismatches** (with a source): a journaled seq different from the one
  the source gives that msgid.

Figures: the latency ``dlv_ms - enq_ms`` of delivered records (p50, p90, p99,
max; exact percentiles) and the fan-out (subscriptions per delivered
publication) per root topic, the first non-empty level with its leading
slashes (``/FLIGHTS/JFK/B6/BOS`` -> ``/FLIGHTS``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.pipeline.journal import JOURNAL_COLUMNS
from broker.pipeline.routes import Subscriptions
from broker.pipeline.source import SourceSpec, prepare, read_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Bins of the latency histogram.
HISTOGRAM_BINS = 50
#: Examples kept per kind of violation in the report.
EXAMPLES = 20

_PAIR = ["sub", "publisher", "msgid"]
_PUB = ["publisher", "msgid"]


@dataclass
class AuditReport:
    """The audit's findings (``to_json`` is the ``--report`` file).

    Attributes:
        audited: journal records audited (distinct journal ids).
        order_violations: see the module docstring; likewise the next four.
        duplicates: deliveries beyond the first of one msgid to one subscription.
        missing: expected deliveries not made (or source publications never journaled).
        unexpected: deliveries the subscriptions and links do not call for.
        seq_mismatches: journaled seqs that differ from the source's.
        deliveries: (subscription, publication) deliveries in the journal, copies included.
        publications: distinct (publisher, msgid) delivered.
        repeated_records: rows dropped because their journal id was already seen.
        no_seq: first deliveries without a seq (not order-checked).
        statuses: status -> records.
        latency_ms: ``count, min, max, mean, p50, p90, p99`` and ``histogram``
            (``edges`` in ms, ``counts``) of ``dlv_ms - enq_ms``, delivered records.
        fanout: root topic -> ``publications, deliveries, mean, max, histogram``
            (fan-out -> publications).
        per_subscription: sub id -> ``deliveries, duplicates, order_violations,
            expected, missing, unexpected``.
        order_violations_by_publisher: sub id -> publisher -> violations (non-zero only).
        source: with a source: ``rows, unjournaled, duplicate_only, not_in_source``.
        examples: a few rows of each violation kind.
        checked: which checks ran (``subscriptions``, ``source``).
        elapsed_s: wall time of the audit, seconds.
    """

    audited: int = 0
    order_violations: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    seq_mismatches: int = 0
    deliveries: int = 0
    publications: int = 0
    repeated_records: int = 0
    no_seq: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, Any] = field(default_factory=dict)
    fanout: dict[str, dict[str, Any]] = field(default_factory=dict)
    per_subscription: dict[str, dict[str, int]] = field(default_factory=dict)
    order_violations_by_publisher: dict[str, dict[str, int]] = field(default_factory=dict)
    source: dict[str, int] | None = None
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def violations(self) -> int:
        """Every violation found, all kinds together."""
        return self.order_violations + self.duplicates + self.missing + self.unexpected + self.seq_mismatches

    @property
    def ok(self) -> bool:
        """True when no violation was found."""
        return self.violations == 0

    def line(self) -> str:
        """``audited=<n> order_violations=<n> duplicates=<n> missing=<n> p50_ms=<x> p99_ms=<x>``."""
        p50, p99 = self.latency_ms.get("p50"), self.latency_ms.get("p99")
        return (
            f"audited={self.audited} order_violations={self.order_violations} "
            f"duplicates={self.duplicates} missing={self.missing} "
            f"p50_ms={_fmt(p50)} p99_ms={_fmt(p99)}"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object."""
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def write(self, path: str | Path) -> None:
        """Write the JSON report."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def _fmt(value: float | None) -> str:
    if value is None:
        return "nan"
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _rows(df: DataFrame, limit: int) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.limit(limit).collect()]


def _per_sub(rows: list[Any], name: str, out: dict[str, dict[str, int]]) -> int:
    total = 0
    for row in rows:
        out.setdefault(row["sub"], {})[name] = int(row["n"])
        total += int(row["n"])
    return total


def read_journal(spark: SparkSession, journal: str | Path | Sequence[str | Path]) -> DataFrame:
    """Read an exported journal (a file, a directory of part files, or several).

    Raises:
        ValueError: a path does not exist or a column is missing.
    """
    paths = [str(journal)] if isinstance(journal, str | Path) else [str(p) for p in journal]
    for path in paths:
        if not Path(path).exists():
            raise ValueError(f"journal {path!r} does not exist")
    df = spark.read.parquet(*paths)
    missing = [c for c in JOURNAL_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{', '.join(paths)} is not an exported journal: no column {', '.join(missing)}")
    return df


def run_audit(
    spark: SparkSession,
    journal: str | Path | Sequence[str | Path],
    *,
    subscriptions: Subscriptions | None = None,
    source: SourceSpec | None = None,
    histogram_bins: int = HISTOGRAM_BINS,
    examples: int = EXAMPLES,
) -> AuditReport:
    """Audit an exported journal.

    Args:
        spark: the session.
        journal: the exported journal: a Parquet file or directory, or several.
        subscriptions: the subscriptions and links in force while the journal
            was written; None skips the missing/unexpected checks (unless
            ``source`` is given, see the module docstring).
        source: the data set the publications were made from, with the publish
            job's options; None skips the source checks.
        histogram_bins: bins of the latency histogram.
        examples: rows kept per violation kind in the report.

    Returns:
        The ``AuditReport``.

    Raises:
        ValueError: a path does not exist, a column is missing, or a filter is invalid.
    """
    from pyspark.sql import functions as F

    started = time.perf_counter()
    report = AuditReport()
    raw = read_journal(spark, journal)
    order_id = F.split(F.col("journal_id"), "-")
    journal_df = (
        raw.dropDuplicates(["journal_id"])
        .withColumn("_jms", order_id.getItem(0).cast("long"))
        .withColumn("_jn", order_id.getItem(1).cast("long"))
        .persist()
    )
    cached: list[DataFrame] = [journal_df]
    try:
        report.statuses = {
            r["status"]: int(r["count"]) for r in journal_df.groupBy("status").count().collect()
        }
        report.audited = sum(report.statuses.values())
        report.repeated_records = int(raw.count()) - report.audited

        delivered = journal_df.filter(F.col("status") == "delivered")
        pairs = _copies(delivered, cached)
        firsts = pairs.filter(F.col("_occ") == 1)
        per_sub = _count_copies(pairs, report)
        _check_order(firsts, per_sub, report, examples, cached)
        if report.duplicates:
            report.examples["duplicates"] = _rows(
                pairs.filter(F.col("_occ") > 1)
                .orderBy("_jms", "_jn")
                .select("sub", "publisher", "msgid", "seq", "journal_id"),
                examples,
            )

        delivered_pubs = delivered.select("publisher", "msgid", "topic").dropDuplicates(_PUB).persist()
        cached.append(delivered_pubs)
        report.publications = int(delivered_pubs.count())
        scope = delivered_pubs
        unjournaled_count = 0
        if source is not None:
            scope, unjournaled_count = _check_source(
                spark, source, journal_df, delivered, delivered_pubs, report, examples, cached
            )
        if subscriptions is not None:
            _check_routes(spark, subscriptions, scope, firsts, per_sub, report, examples, cached)
        elif source is not None:
            report.missing = unjournaled_count
        for counts in per_sub.values():
            for name in ("deliveries", "duplicates", "order_violations", "expected", "missing", "unexpected"):
                counts.setdefault(name, 0)
        report.per_subscription = dict(sorted(per_sub.items()))

        report.latency_ms = _latency(delivered, histogram_bins)
        report.fanout = _fanout(delivered)
    finally:
        for df in reversed(cached):
            df.unpersist()
    report.elapsed_s = round(time.perf_counter() - started, 3)
    return report


def _copies(delivered: DataFrame, cached: list[DataFrame]) -> DataFrame:
    """One row per (subscription, publication) delivery of the ``delivered`` records (their ``subs``
    exploded), numbered ``_occ`` in journal order within each (subscription, publisher, msgid): 1 is
    the first delivery, more a duplicate. Persisted, and added to ``cached``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    pairs = (
        delivered.select(
            "publisher",
            "msgid",
            "seq",
            "topic",
            "journal_id",
            "_jms",
            "_jn",
            F.explode("subs").alias("sub"),
        )
        .withColumn("_occ", F.row_number().over(Window.partitionBy(*_PAIR).orderBy("_jms", "_jn")))
        .persist()
    )
    cached.append(pairs)
    return pairs


def _count_copies(pairs: DataFrame, report: AuditReport) -> dict[str, dict[str, int]]:
    """Count the deliveries, duplicates and first deliveries without a seq into ``report``.

    Returns:
        sub id -> ``deliveries, duplicates, order_violations`` (0: ``_check_order`` counts them).
    """
    from pyspark.sql import functions as F

    per_sub: dict[str, dict[str, int]] = {}
    for row in (
        pairs.groupBy("sub")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.sum((F.col("_occ") > 1).cast("int")).alias("duplicates"),
            F.sum(((F.col("_occ") == 1) & F.col("seq").isNull()).cast("int")).alias("no_seq"),
        )
        .collect()
    ):
        per_sub[row["sub"]] = {
            "deliveries": int(row["deliveries"]),
            "duplicates": int(row["duplicates"]),
            "order_violations": 0,
        }
        report.deliveries += int(row["deliveries"])
        report.duplicates += int(row["duplicates"])
        report.no_seq += int(row["no_seq"])
    return per_sub


def _check_order(
    firsts: DataFrame,
    per_sub: dict[str, dict[str, int]],
    report: AuditReport,
    examples: int,
    cached: list[DataFrame],
) -> None:
    """The order check (module docstring) on the first deliveries ``firsts``: counts into ``report``
    (and ``per_sub``), with ``examples`` rows of violations."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    checked = (
        firsts.filter(F.col("seq").isNotNull())
        .withColumn(
            "prev_seq", F.lag("seq").over(Window.partitionBy("sub", "publisher").orderBy("_jms", "_jn"))
        )
        .filter(F.col("prev_seq").isNotNull() & (F.col("seq") <= F.col("prev_seq")))
        .persist()
    )
    cached.append(checked)
    for row in checked.groupBy("sub", "publisher").count().collect():
        n = int(row["count"])
        report.order_violations += n
        entry = per_sub.setdefault(row["sub"], {})
        entry["order_violations"] = entry.get("order_violations", 0) + n
        report.order_violations_by_publisher.setdefault(row["sub"], {})[row["publisher"]] = n
    if report.order_violations:
        report.examples["order_violations"] = _rows(
            checked.orderBy("_jms", "_jn").select(
                "sub", "publisher", "msgid", "seq", "prev_seq", "journal_id"
            ),
            examples,
        )


def _check_source(
    spark: SparkSession,
    source: SourceSpec,
    journal_df: DataFrame,
    delivered: DataFrame,
    delivered_pubs: DataFrame,
    report: AuditReport,
    examples: int,
    cached: list[DataFrame],
) -> tuple[DataFrame, int]:
    """The source checks (module docstring): seq mismatches and ``report.source``, with examples.

    Returns:
        ``(scope, unjournaled)``: the publications the routes check covers (the delivered ones and
        the source rows never journaled: publisher, msgid, topic) and how many were never journaled.
    """
    from pyspark.sql import functions as F

    report.checked.append("source")
    src = prepare(read_source(spark, source), source).select("publisher", "msgid", "seq", "topic").persist()
    cached.append(src)
    journaled = journal_df.select(*_PUB).distinct()
    unjournaled = src.join(journaled, _PUB, "left_anti").persist()
    cached.append(unjournaled)
    unjournaled_count = int(unjournaled.count())
    delivered_seq = delivered.select(*_PUB, F.col("seq").alias("_jseq")).dropDuplicates(_PUB)
    mismatched = src.join(delivered_seq, _PUB).filter(~F.col("seq").eqNullSafe(F.col("_jseq")))
    report.seq_mismatches = int(mismatched.count())
    if report.seq_mismatches:
        report.examples["seq_mismatches"] = _rows(
            mismatched.select("publisher", "msgid", "seq", F.col("_jseq").alias("journal_seq")),
            examples,
        )
    report.source = {
        "rows": int(src.count()),
        "unjournaled": unjournaled_count,
        "duplicate_only": int(
            src.join(delivered_pubs.select(*_PUB), _PUB, "left_anti")
            .join(journaled, _PUB, "left_semi")
            .count()
        ),
        "not_in_source": int(delivered_pubs.join(src.select(*_PUB), _PUB, "left_anti").count()),
    }
    if unjournaled_count:
        report.examples["unjournaled"] = _rows(
            unjournaled.select("publisher", "msgid", "seq", "topic"), examples
        )
    return delivered_pubs.unionByName(unjournaled.select("publisher", "msgid", "topic")), unjournaled_count


def _check_routes(
    spark: SparkSession,
    subscriptions: Subscriptions,
    scope: DataFrame,
    firsts: DataFrame,
    per_sub: dict[str, dict[str, int]],
    report: AuditReport,
    examples: int,
    cached: list[DataFrame],
) -> None:
    """The missing and unexpected checks (module docstring) of the publications in ``scope`` against
    the first deliveries ``firsts``: counts into ``report`` and ``per_sub``, with examples."""
    from pyspark.sql import functions as F

    report.checked.append("subscriptions")
    topics = [r["topic"] for r in scope.select("topic").distinct().collect() if r["topic"] is not None]
    recipients = subscriptions.recipients(topics)
    routes = spark.createDataFrame(
        [(t, s) for t, subs in recipients.items() for s in subs], "topic string, sub string"
    )
    expected = scope.join(F.broadcast(routes), "topic").select(*_PAIR, "topic").persist()
    cached.append(expected)
    got = firsts.select(*_PAIR, "topic")
    missing = expected.join(got.select(*_PAIR), _PAIR, "left_anti").persist()
    unexpected = got.join(expected.select(*_PAIR), _PAIR, "left_anti").persist()
    cached += [missing, unexpected]
    count = F.count(F.lit(1)).alias("n")
    _per_sub(expected.groupBy("sub").agg(count).collect(), "expected", per_sub)
    report.missing = _per_sub(missing.groupBy("sub").agg(count).collect(), "missing", per_sub)
    report.unexpected = _per_sub(unexpected.groupBy("sub").agg(count).collect(), "unexpected", per_sub)
    if report.missing:
        report.examples["missing"] = _rows(missing, examples)
    if report.unexpected:
        report.examples["unexpected"] = _rows(unexpected, examples)


def _latency(delivered: DataFrame, bins: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    lat = delivered.select((F.col("dlv_ms") - F.col("enq_ms")).alias("lat")).filter(F.col("lat").isNotNull())
    stats = lat.agg(
        F.count(F.lit(1)).alias("count"),
        F.min("lat").alias("min"),
        F.max("lat").alias("max"),
        F.avg("lat").alias("mean"),
        F.expr("percentile(lat, array(0.5, 0.9, 0.99))").alias("pct"),
    ).first()
    if stats is None or not stats["count"]:
        return {
            "count": 0,
            "min": None,
            "max": None,
            "mean": None,
            "p50": None,
            "p90": None,
            "p99": None,
            "histogram": {"edges": [], "counts": []},
        }
    low, high = int(stats["min"]), int(stats["max"])
    width = max(1, math.ceil((high - low + 1) / bins))
    counts = [0] * bins
    for row in lat.groupBy(F.floor((F.col("lat") - low) / width).alias("bin")).count().collect():
        counts[min(int(row["bin"]), bins - 1)] += int(row["count"])
    p50, p90, p99 = (float(x) for x in stats["pct"])
    return {
        "count": int(stats["count"]),
        "min": low,
        "max": high,
        "mean": round(float(stats["mean"]), 3),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "histogram": {"edges": [low + i * width for i in range(bins + 1)], "counts": counts},
    }


def _fanout(delivered: DataFrame) -> dict[str, dict[str, Any]]:
    from pyspark.sql import functions as F

    rows = (
        delivered.select(
            F.regexp_extract(F.coalesce(F.col("topic"), F.lit("")), r"^/*[^/]*", 0).alias("root"),
            F.size("subs").alias("fanout"),
        )
        .groupBy("root", "fanout")
        .count()
        .collect()
    )
    out: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["root"], r["fanout"])):
        entry = out.setdefault(
            row["root"], {"publications": 0, "deliveries": 0, "mean": 0.0, "max": 0, "histogram": {}}
        )
        n, fanout = int(row["count"]), int(row["fanout"])
        entry["publications"] += n
        entry["deliveries"] += n * fanout
        entry["max"] = max(entry["max"], fanout)
        entry["histogram"][str(fanout)] = n
    for entry in out.values():
        entry["mean"] = (
            round(entry["deliveries"] / entry["publications"], 3) if entry["publications"] else 0.0
        )
    return out


def write_figure(report: AuditReport, path: str | Path) -> None:
    """Draw the latency histogram and the fan-out per root topic (grouped bars) into a PNG (matplotlib, Agg).

    Args:
        report: the audit report.
        path: the PNG file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_fan) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    hist = report.latency_ms.get("histogram") or {}
    edges, counts = hist.get("edges") or [], hist.get("counts") or []
    if counts:
        widths = [edges[i + 1] - edges[i] for i in range(len(counts))]
        ax_lat.bar(
            edges[:-1], counts, width=widths, align="edge", color="#4C72B0", edgecolor="white", linewidth=0.3
        )
        ax_lat.set_yscale("log")
        for name, style in (("p50", "--"), ("p99", ":")):
            value = report.latency_ms.get(name)
            if value is not None:
                ax_lat.axvline(value, color="#C44E52", linestyle=style, label=f"{name} = {_fmt(value)} ms")
        ax_lat.legend()
    else:
        ax_lat.text(0.5, 0.5, "no delivered records", ha="center", va="center", transform=ax_lat.transAxes)
    ax_lat.set_title(f"publish-to-delivery latency ({report.latency_ms.get('count', 0)} publications)")
    ax_lat.set_xlabel("dlv_ms - enq_ms (ms)")
    ax_lat.set_ylabel("publications (log scale)")

    roots = sorted(report.fanout, key=lambda r: -report.fanout[r]["publications"])
    if roots:
        sizes = sorted({int(k) for r in roots for k in report.fanout[r]["histogram"]})
        width = 0.8 / len(roots)
        for i, root in enumerate(roots):
            entry = report.fanout[root]
            heights = [entry["histogram"].get(str(k), 0) for k in sizes]
            ax_fan.bar(
                [x + (i - (len(roots) - 1) / 2) * width for x in range(len(sizes))],
                heights,
                width=width,
                label=f"{root or '(empty)'}: {entry['publications']} pubs, mean {entry['mean']:.2f}",
            )
        ax_fan.set_xticks(range(len(sizes)), [str(k) for k in sizes])
        ax_fan.legend(fontsize=8)
    else:
        ax_fan.text(0.5, 0.5, "no delivered records", ha="center", va="center", transform=ax_fan.transAxes)
    ax_fan.set_title("fan-out per root topic")
    ax_fan.set_xlabel("subscriptions a publication was delivered to")
    ax_fan.set_ylabel("publications")
    fig.suptitle(report.line() + ("" if report.ok else "   VIOLATIONS FOUND"), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
