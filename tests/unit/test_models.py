"""Publication entries and envelopes (protocol version 1)."""

from __future__ import annotations

import pytest

from broker import keys
from broker.errors import InvalidMessage
from broker.models import Message, decode_envelope, encode_envelope, parse_entry, publication_fields


def _entry(fields: dict[str, object]) -> dict[bytes, bytes]:
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_fields_round_trip_into_an_envelope_and_a_message():
    fields = publication_fields(
        "p1",
        "/a/b",
        b"\x00\xff\n",
        msgid="m",
        seq=3,
        timestamp_ms=5,
        persistent=False,
        priority=9,
        expiration_ms=99,
        correlation_id="c",
        reply_to="r",
        properties={"k": 1, "f": 1.5, "b": True, "s": "x", "n": None},
    )
    entry = parse_entry("10-0", _entry(fields), 1024)
    message = Message.from_envelope(encode_envelope(entry.header, entry.body))
    assert message.body == b"\x00\xff\n"
    assert (message.msgid, message.publisher, message.seq, message.topic) == ("m", "p1", 3, "/a/b")
    assert (message.timestamp_ms, message.persistent, message.priority, message.expiration_ms) == (
        5,
        False,
        9,
        99,
    )
    assert (message.correlation_id, message.reply_to, message.entry_id) == ("c", "r", "10-0")
    assert message.properties == {"k": 1, "f": 1.5, "b": True, "s": "x", "n": None}


def test_defaults_come_from_the_entry_id():
    entry = parse_entry("1700000000123-4", _entry({"publisher": "p", "topic": "t"}), 10)
    assert entry.msgid == "1700000000123-4" and not entry.msgid_given
    assert entry.header["ts"] == 1700000000123 and "priority" not in entry.header  # defaults are left out
    header, body = decode_envelope(encode_envelope(entry.header, b""))
    assert header["v"] == keys.PROTOCOL_VERSION and body == b""


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"topic": "t"}, "missing field 'publisher'"),
        ({"publisher": "p"}, "missing field 'topic'"),
        ({"publisher": "p", "topic": b"\xc3"}, "not valid UTF-8"),
        ({"publisher": "p", "topic": "t", "body": b"x" * 11}, "larger than the limit"),
        ({"publisher": "p", "topic": "t", "seq": "x"}, "'seq' is not an integer"),
        ({"publisher": "p", "topic": "t", "priority": "10"}, "0-9"),
        ({"publisher": "p", "topic": "t", "persistent": "yes"}, "persistent"),
        ({"publisher": "p", "topic": "t", "props": "[1]"}, "JSON object"),
        ({"publisher": "p", "topic": "t", "props": "{"}, "not JSON"),
        ({"publisher": "p" * 257, "topic": "t"}, "1-256 bytes"),
    ],
)
def test_malformed_entries_are_rejected_with_a_reason(fields, fragment):
    with pytest.raises(InvalidMessage, match=fragment):
        parse_entry("1-0", _entry(fields), 10)


def test_envelope_without_header_line_is_invalid():
    with pytest.raises(InvalidMessage):
        decode_envelope(b"no newline")


def test_publication_fields_reject_bad_priority_and_nested_properties():
    with pytest.raises(InvalidMessage):
        publication_fields("p", "t", b"", priority=10)
    with pytest.raises(InvalidMessage):
        publication_fields("p", "t", b"", properties={"a": {"b": 1}})


@pytest.mark.parametrize("field", ["seq", "ts", "expiration"])
def test_integers_beyond_64_bits_are_rejected(field):
    with pytest.raises(InvalidMessage, match="64-bit"):
        parse_entry("1-0", _entry({"publisher": "p", "topic": "t", field: str(2**64)}), 10)
