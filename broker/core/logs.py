"""Logging of every broker process: one handler on the root logger, text or JSON lines.

``configure_logging(log_format, log_level)`` is called once per process: by the
long-running commands (``broker worker``, ``scheduler``, ``channel``) and by each
child of a worker pool or channel pool (``worker.pool.run_worker``,
``run_channel``), which receive the settings (``log_format``, ``log_level``) in
the Settings JSON they are spawned with.

Two formats, one line per record, both with the time in ISO 8601 UTC (ms):

- ``text``: ``<ts> <process> <logger> <LEVEL> <message>`` and, for a line about a
  publication, `` msgid=<m> publisher=<p> entry_id=<e>``. Control characters (a
  newline, a carriage return, U+2028, ...) in the message and in those values are
  written as escapes (``\\n``, ``\\x1b``, ``\\u2028``), and a value with a space, a
  ``"``, a ``=`` or a ``\\`` is written in double quotes: a publisher id can
  neither end a line nor forge a key. A traceback follows on lines of its own,
  each indented by four spaces, so that no line it adds starts like a record.
- ``json`` (python-json-logger): one JSON object per line with ``ts``, ``level``,
  ``logger``, ``process`` (the process name: ``broker-worker-0``, ``MainProcess``)
  and ``message``; a line about a publication also has ``msgid``, ``publisher``
  and ``entry_id`` (null when not known); ``exc_info`` holds a traceback.
  Safe by construction: JSON escapes every control character.

A line about a publication gets its keys with ``extra=publication_extra(...)``:

    log.warning("entry %s: %s; dead-lettering it", entry_id, reason,
                extra=publication_extra(entry_id, fields))

Build the extra only on the path that logs (an error path), never per publication.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any, Literal

from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

#: ``--log-format``: human-readable lines, or one JSON object per line for log shippers.
LogFormat = Literal["text", "json"]

#: ``--log-level``: the least severe level written.
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

LOG_FORMATS: tuple[str, ...] = ("text", "json")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

#: The keys of a line about a publication, in the order the text format writes them.
PUBLICATION_KEYS = ("msgid", "publisher", "entry_id")

#: Longest value of a publication key written, characters; longer ones are cut, ending in "...".
MAX_VALUE_CHARS = 256

#: The text format, before the publication keys.
TEXT_FORMAT = "%(asctime)s %(processName)s %(name)s %(levelname)s %(message)s"

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

#: Marks the handler ``configure_logging`` installed, so that a second call replaces it.
_OURS = "_broker_logs"


def _bounded(value: object) -> str | None:
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _field(fields: Mapping[Any, Any], name: str) -> Any:
    found = fields.get(name.encode())
    return fields.get(name) if found is None else found


def publication_extra(
    entry_id: str | None,
    fields: Mapping[Any, Any] | None = None,
    *,
    msgid: str | None = None,
    publisher: str | None = None,
) -> dict[str, str | None]:
    """The ``extra=`` of a log line about a publication: its message id, publisher and entry id.

    Args:
        entry_id: the stream entry id (publish or transmission stream), or None.
        fields: the entry's fields (bytes or str keys), read for ``msgid`` and
            ``publisher`` when those are not given; a publication without a ``msgid``
            field has its entry id as message id, as the workers give it.
        msgid: the message id, when known otherwise.
        publisher: the publisher id, when known otherwise.

    Returns:
        ``{"msgid", "publisher", "entry_id"}``, each a str cut to ``MAX_VALUE_CHARS`` or
        None when unknown. Values are not escaped here: the formatters do it.
    """
    if fields is not None:
        if msgid is None:
            msgid = _field(fields, "msgid") or entry_id
        if publisher is None:
            publisher = _field(fields, "publisher")
    return {"msgid": _bounded(msgid), "publisher": _bounded(publisher), "entry_id": _bounded(entry_id)}


def _escape_char(char: str) -> str:
    known = _ESCAPES.get(char)
    if known is not None:
        return known
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character (``str.isprintable``) as an escape: one line, always."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _value(value: object) -> str:
    """A ``key=value`` value of the text format: bare when plain, else quoted and escaped."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _iso_utc(created: float) -> str:
    """A record's time as ISO 8601 UTC with milliseconds: ``2025-01-31T12:00:00.123Z``."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class TextFormatter(logging.Formatter):
    """The ``text`` format: one escaped line per record, publication keys appended (module docstring)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _iso_utc(record.created)

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape(record.getMessage())
        record.asctime = self.formatTime(record)
        line = self.formatMessage(record)
        keys = record.__dict__
        if "entry_id" in keys or "msgid" in keys or "publisher" in keys:
            for name in PUBLICATION_KEYS:
                value = keys.get(name)
                if value is not None:
                    line += f" {name}={_value(value)}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        extra = [record.exc_text] if record.exc_text else []
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for block in extra:
            line += "".join(f"\n    {escape(part)}" for part in block.splitlines())
        return line


class JsonFormatter(_JsonFormatter):
    """The ``json`` format: one JSON object per line (module docstring), by python-json-logger."""

    def __init__(self) -> None:
        super().__init__(
            "%(levelname)s %(name)s %(processName)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "processName": "process"},
            json_ensure_ascii=True,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["ts"] = _iso_utc(record.created)  # first, for people reading the lines
        super().add_fields(log_data, record, message_dict)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``).

    Raises:
        ValueError: another format.
    """
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")


def configure_logging(
    log_format: str = "text", log_level: str = "INFO", stream: IO[str] | None = None
) -> logging.Handler:
    """Send every logger's records to ``stream`` (stderr) in ``log_format``, from ``log_level`` up.

    Installs one handler on the root logger, replacing the one an earlier call installed
    (handlers others added, such as pytest's, stay). Libraries that add their own handler
    only when none is in effect (rq's worker) then write through it too.

    Args:
        log_format: ``text`` or ``json``.
        log_level: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR`` or ``CRITICAL`` (any case).
        stream: where lines go; default ``sys.stderr``.

    Returns:
        The handler installed.

    Raises:
        ValueError: an unknown format or level.
    """
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {log_level!r}: use one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.setLevel(level)  # also for loggers that set their own level (rq.worker: INFO)
    setattr(handler, _OURS, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
