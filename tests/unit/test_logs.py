"""broker.core.logs: the text and JSON formats, the publication keys, hostile values, configuration."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from broker.core.config import load_settings
from broker.core.errors import ConfigError
from broker.core.logs import (
    MAX_VALUE_CHARS,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    escape,
    publication_extra,
)

#: What starts every text line: an ISO 8601 UTC time with ms.
LINE_START = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


def _record(
    msg: str, *args: object, extra: dict[str, object] | None = None, exc: bool = False
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("bad\nline")
        except RuntimeError:
            import sys

            exc_info = sys.exc_info()
    record = logging.LogRecord("broker.worker", logging.WARNING, __file__, 1, msg, args, exc_info)
    for key, value in (extra or {}).items():
        setattr(record, key, value)
    return record


FIELDS = {b"publisher": b"pub-1", b"msgid": b"m-1", b"topic": b"a/b"}


def test_publication_extra_reads_msgid_and_publisher_from_the_entry_fields():
    assert publication_extra("5-0", FIELDS) == {"msgid": "m-1", "publisher": "pub-1", "entry_id": "5-0"}


def test_publication_extra_gives_the_entry_id_as_msgid_when_the_publication_has_none():
    assert publication_extra("5-0", {b"publisher": b"p"})["msgid"] == "5-0"


def test_publication_extra_keeps_given_values_and_none_for_unknown_ones():
    assert publication_extra("5-0", FIELDS, publisher="other")["publisher"] == "other"
    assert publication_extra("5-0") == {"msgid": None, "publisher": None, "entry_id": "5-0"}


def test_publication_extra_cuts_long_values():
    extra = publication_extra("1-0", publisher="p" * 10_000)
    assert extra["publisher"] is not None and len(extra["publisher"]) == MAX_VALUE_CHARS


def test_json_line_about_a_publication_has_its_three_keys_and_the_standard_ones():
    # Given a formatter and a record about a publication
    record = _record("entry %s refused", "5-0", extra=publication_extra("5-0", FIELDS))
    # When it is formatted
    line = JsonFormatter().format(record)
    # Then it is one JSON object with ts (ISO 8601 UTC), level, logger, process, message and the keys
    assert "\n" not in line
    data = json.loads(line)
    assert data["msgid"] == "m-1" and data["publisher"] == "pub-1" and data["entry_id"] == "5-0"
    assert data["level"] == "WARNING" and data["logger"] == "broker.worker"
    assert data["message"] == "entry 5-0 refused"
    assert data["process"] == "MainProcess"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", data["ts"])
    assert next(iter(data)) == "ts"


def test_json_line_with_a_hostile_publisher_is_still_one_line_with_the_exact_value():
    hostile = 'evil\n{"level": "INFO", "message": "forged"}\r\u2028\x1b[31m'
    line = JsonFormatter().format(_record("x", extra=publication_extra("1-0", publisher=hostile)))
    assert len(line.splitlines()) == 1
    assert json.loads(line)["publisher"] == hostile


def test_json_line_carries_a_traceback_inside_the_object():
    line = JsonFormatter().format(_record("failed", exc=True))
    assert len(line.splitlines()) == 1
    assert "RuntimeError" in json.loads(line)["exc_info"]


def test_text_line_appends_the_publication_keys():
    line = TextFormatter().format(_record("entry %s refused", "5-0", extra=publication_extra("5-0", FIELDS)))
    assert LINE_START.match(line)
    assert line.endswith(
        " MainProcess broker.worker WARNING entry 5-0 refused msgid=m-1 publisher=pub-1 entry_id=5-0"
    )


def test_text_line_without_a_publication_has_no_keys():
    line = TextFormatter().format(_record("worker %s: retrying", "w0"))
    assert line.endswith("WARNING worker w0: retrying")
    assert "entry_id=" not in line


def test_a_hostile_publisher_id_cannot_end_a_text_line_or_forge_one_or_a_key():
    # Given a publisher id that tries to start a line of its own, and to add a key
    forged = "2025-01-01T00:00:00.000Z MainProcess broker.worker ERROR forged"
    hostile = f"p\n{forged}\r\u2028\x85 entry_id=9-9 \x1b[2J"
    record = _record(
        "refused on %r from %s", "a\nb", hostile, extra=publication_extra("1-0", publisher=hostile)
    )
    # When it is written as text
    line = TextFormatter().format(record)
    # Then it is one line; the forged line and key are inside quoted, escaped text
    assert len(line.splitlines()) == 1
    # the message and the quoted publisher hold the forged key as text; the real one ends the line
    assert line.count(" entry_id=") == 3
    assert line.endswith(" entry_id=1-0")
    assert "\\n2025-01-01T00:00:00.000Z" in line and "\\u2028" in line and "\\x85" in line
    assert "\\x1b[2J" in line
    (publisher,) = re.findall(r' publisher=("(?:[^"\\]|\\.)*")', line)
    assert publisher.startswith('"p\\n2025')


def test_text_values_with_spaces_quotes_or_backslashes_are_quoted():
    line = TextFormatter().format(
        _record("x", extra={"msgid": 'a "b"', "publisher": "c\\d", "entry_id": "1-0"})
    )
    assert line.endswith(' msgid="a \\"b\\"" publisher="c\\\\d" entry_id=1-0')


def test_a_traceback_in_text_is_indented_so_no_line_of_it_starts_like_a_record():
    line = TextFormatter().format(_record("failed", exc=True))
    first, *rest = line.split("\n")
    assert LINE_START.match(first) and rest
    assert all(part.startswith("    ") for part in rest)
    assert any("RuntimeError: bad" in part for part in rest)


def test_escape_leaves_printable_text_alone_and_escapes_the_rest():
    assert escape("plain text é") == "plain text é"
    assert escape("a\nb\tc\x00\u2029") == "a\\nb\\tc\\x00\\u2029"


def test_configure_logging_writes_json_from_the_level_and_replaces_its_own_handler():
    root = logging.getLogger()
    before = list(root.handlers)
    level = root.level
    first, second = io.StringIO(), io.StringIO()
    try:
        configure_logging("text", "INFO", stream=first)
        configure_logging("json", "warning", stream=second)
        assert len(root.handlers) == len(before) + 1
        logger = logging.getLogger("broker.test_logs")
        logger.info("not written")
        logger.warning("written %d", 1, extra=publication_extra("2-0"))
        # rq sets its own logger's level: the handler's level still applies
        rq = logging.getLogger("rq.worker.test_logs")
        rq.setLevel(logging.INFO)
        rq.info("below the level")
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        root.setLevel(level)
    assert first.getvalue() == ""
    (line,) = second.getvalue().splitlines()
    assert json.loads(line)["message"] == "written 1"
    assert json.loads(line)["entry_id"] == "2-0"


def test_configure_logging_refuses_an_unknown_format_or_level():
    with pytest.raises(ValueError, match="log format"):
        configure_logging("xml")
    with pytest.raises(ValueError, match="log level"):
        configure_logging("text", "LOUD")


def test_log_settings_come_from_the_environment_and_are_checked(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_LOG_FORMAT", "json")
    monkeypatch.setenv("BROKER_LOG_LEVEL", "debug")
    settings = load_settings()
    assert (settings.log_format, settings.log_level) == ("json", "DEBUG")
    monkeypatch.setenv("BROKER_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="log_format"):
        load_settings()
