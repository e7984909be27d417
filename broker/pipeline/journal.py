"""Exporting the delivery journal (``{qm}:journal``) to Parquet, and draining what was exported.

With the ``journal`` setting on, every unit of work a worker commits adds one
record to the capped stream ``{qm}:journal`` (see ``broker.core.keys``). The export
reads it oldest first with ``XRANGE ... COUNT chunk`` up to the last record
present when it started, writes the records as Parquet, and, once a file is
complete on disk (written, fsynced, renamed into place), removes exactly the
records in it from the stream with ``XTRIM MINID <last id + 1>``: stream ids
only grow, so the records below that id are the ones just read (or ones the
cap already dropped), never a record that was not written out.

Exporting into a directory adds one part file per ``rows_per_file`` records,
named after the first and last journal ids in it, so repeated exports build up
one data set that Spark reads whole. A crash between the rename and the trim
exports the same records again next time; the audit drops repeated
``journal_id`` values.

Columns: ``journal_id`` (the journal stream id, ``<ms>-<n>``: the journal's own
order), ``entry_id``, ``msgid``, ``publisher``, ``seq`` (int64, null when the
publication had none), ``topic``, ``subs`` (list of subscription ids the
publication was delivered to), ``enq_ms`` (int64, the publication's time),
``dlv_ms`` (int64, when its unit of work ran), ``status`` (``delivered``,
``duplicate``, ``expired`` or ``refused``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis

from broker.core import keys, wire
from broker.core.errors import ConnectionLost

if TYPE_CHECKING:
    import pyarrow as pa

#: Records per XRANGE.
DEFAULT_CHUNK = 10_000
#: Records per part file when exporting into a directory.
DEFAULT_ROWS_PER_FILE = 500_000

#: One stream record as redis-py returns it (``decode_responses=False``).
_Record = tuple[bytes, dict[bytes, bytes]]

JOURNAL_COLUMNS = (
    "journal_id",
    "entry_id",
    "msgid",
    "publisher",
    "seq",
    "topic",
    "subs",
    "enq_ms",
    "dlv_ms",
    "status",
)


def journal_schema() -> pa.Schema:
    """The Arrow schema of an exported journal."""
    import pyarrow as pa

    return pa.schema(
        [
            ("journal_id", pa.string()),
            ("entry_id", pa.string()),
            ("msgid", pa.string()),
            ("publisher", pa.string()),
            ("seq", pa.int64()),
            ("topic", pa.string()),
            ("subs", pa.list_(pa.string())),
            ("enq_ms", pa.int64()),
            ("dlv_ms", pa.int64()),
            ("status", pa.string()),
        ]
    )


@dataclass
class ExportResult:
    """What one export wrote.

    Attributes:
        rows: journal records written.
        files: the Parquet files written, in order.
        first_id: the first journal id exported, or None.
        last_id: the last journal id exported, or None.
        drained: records removed from the stream after they were written.
    """

    rows: int = 0
    files: list[str] = field(default_factory=list)
    first_id: str | None = None
    last_id: str | None = None
    drained: int = 0

    def line(self) -> str:
        """``exported=<n> files=<n> drained=<n>``."""
        return f"exported={self.rows} files={len(self.files)} drained={self.drained}"


def _id_key(stream_id: str) -> tuple[int, int]:
    ms, _, n = stream_id.partition("-")
    return int(ms), int(n or 0)


def _next_id(stream_id: str) -> str:
    ms, n = _id_key(stream_id)
    return f"{ms}-{n + 1}"


def _text(raw: bytes | None) -> str | None:
    """A journal field as a column: ``wire.lenient_text``, but an absent field stays None (null)."""
    return None if raw is None else wire.lenient_text(raw)


def _int(raw: bytes | None) -> int | None:
    if raw is None or raw == b"":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _subs(raw: bytes | None) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    return [str(s) for s in value] if isinstance(value, list) else []  # Lua's cjson encodes {} for []


def _columns(records: list[_Record]) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {name: [] for name in JOURNAL_COLUMNS}
    for journal_id, fields in records:
        cols["journal_id"].append(journal_id.decode())
        cols["entry_id"].append(_text(fields.get(b"entry_id")))
        cols["msgid"].append(_text(fields.get(b"msgid")))
        cols["publisher"].append(_text(fields.get(b"publisher")))
        cols["seq"].append(_int(fields.get(b"seq")))
        cols["topic"].append(_text(fields.get(b"topic")))
        cols["subs"].append(_subs(fields.get(b"subs")))
        cols["enq_ms"].append(_int(fields.get(b"enq_ms")))
        cols["dlv_ms"].append(_int(fields.get(b"dlv_ms")))
        cols["status"].append(_text(fields.get(b"status")))
    return cols


class _PartFile:
    """One Parquet file being written: a hidden temporary name, renamed into place when complete."""

    def __init__(self, directory: Path, final: Path | None) -> None:
        import pyarrow.parquet as pq

        self.directory = directory
        self.final = final
        self.tmp = directory / f".part-{uuid.uuid4().hex}.parquet.tmp"
        self.handle = self.tmp.open("wb")
        self.writer = pq.ParquetWriter(self.handle, journal_schema(), compression="zstd")
        self.rows = 0
        self.first_id: str | None = None
        self.last_id: str | None = None

    def write(self, records: list[_Record]) -> None:
        import pyarrow as pa

        self.writer.write_table(pa.table(_columns(records), schema=journal_schema()))
        if self.first_id is None:
            self.first_id = records[0][0].decode()
        self.last_id = records[-1][0].decode()
        self.rows += len(records)

    def close(self) -> Path:
        """Finish the file, fsync it and rename it into place; returns its path."""
        self.writer.close()
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        assert self.first_id is not None and self.last_id is not None
        final = self.final or self.directory / f"part-{self.first_id}_{self.last_id}.parquet"
        self.tmp.replace(final)
        return final

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.handle.close()
            self.tmp.unlink(missing_ok=True)


def export_journal(
    client: redis.Redis,
    qm: str,
    out: str | Path,
    *,
    chunk: int = DEFAULT_CHUNK,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    drain: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Export the journal to Parquet and remove the exported records from the stream.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        out: a directory (created if needed; each export adds part files) or
            a path ending in ``.parquet`` (one new file, which must not exist).
        chunk: records per XRANGE.
        rows_per_file: records per part file in a directory (ignored for one file).
        drain: remove the exported records from the stream once their file is complete.
        on_progress: called as ``(records exported, records to export)`` after each chunk.

    Returns:
        The ``ExportResult``.

    Raises:
        ValueError: ``out`` names a file that exists, or ``chunk``/``rows_per_file`` < 1.
        ConnectionLost: the server cannot be reached.
        OSError: the file cannot be written.
    """
    if chunk < 1 or rows_per_file < 1:
        raise ValueError("chunk and rows_per_file must be at least 1")
    out = Path(out)
    single = out.suffix == ".parquet"
    if single:
        if out.exists():
            raise ValueError(f"{str(out)!r} exists; export into a directory to add part files to it")
        directory = out.parent
    else:
        directory = out
    directory.mkdir(parents=True, exist_ok=True)
    stream = keys.journal(qm)
    result = ExportResult()
    try:
        newest = cast(list[_Record], client.xrevrange(stream, "+", "-", count=1))
        if not newest:
            return result
        end = newest[0][0].decode()
        total = int(client.xlen(stream))
        cursor = "-"
        part: _PartFile | None = None
        try:
            while True:
                records = cast(list[_Record], client.xrange(stream, cursor, end, count=chunk))
                if records:
                    if part is None:
                        part = _PartFile(directory, out if single else None)
                    part.write(records)
                    result.rows += len(records)
                    cursor = "(" + records[-1][0].decode()
                done = len(records) < chunk or cursor == "(" + end
                if part is not None and (done or (not single and part.rows >= rows_per_file)):
                    path = part.close()
                    first, last = part.first_id, part.last_id
                    part = None
                    result.files.append(str(path))
                    result.first_id = result.first_id or first
                    result.last_id = last
                    if drain and last is not None:
                        result.drained += int(client.xtrim(stream, minid=_next_id(last), approximate=False))
                if on_progress is not None:
                    on_progress(result.rows, max(total, result.rows))
                if done:
                    return result
        finally:
            if part is not None:
                part.abort()
    except redis.ConnectionError as exc:
        raise ConnectionLost(f"journal export failed: {exc}") from exc
