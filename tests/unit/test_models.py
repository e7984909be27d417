"""Publication entries and envelopes (protocol version 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import keys
from broker.core.entries import parse_entry
from broker.core.errors import InvalidMessage
from broker.core.models import (
    Message,
    _from_usual_header,
    decode_envelope,
    encode_envelope,
    publication_fields,
)


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
    assert entry.timestamp_ms == 1700000000123 and "priority" not in entry.header  # defaults are left out
    # protocol 5: the publish time is the entry id's, the size the body's
    assert "ts" not in entry.header and "size" not in entry.header
    header, body = decode_envelope(encode_envelope(entry.header, b""))
    assert header["v"] == keys.PROTOCOL_VERSION and body == b""


@pytest.mark.parametrize(
    ("props", "grouped"),
    [
        ('{"JMSXGroupID":"g1","JMSXGroupSeq":2,"k":1}', True),
        ('{"JMSXGroupID":""}', False),  # an empty id is no group
        ('{"JMSXGroupID":7}', False),  # nor one of another type
        ('{"k":"JMSXGroupID"}', False),
        (None, False),
    ],
)
def test_a_grouped_messages_header_starts_with_grouped_and_keeps_props_last(props, grouped):
    # Given a publication with these properties
    fields = {"publisher": "p", "topic": "t", **({"props": props} if props else {})}
    # When a worker makes its envelope
    envelope = encode_envelope(parse_entry("1-0", _entry(fields), 10).header, b"x")
    # Then it starts {"grouped":true,"v":7, only for a group (receive.lua reads these bytes), and
    # props stays the header's last field
    head = b'{"grouped":true,"v":%d,' % keys.PROTOCOL_VERSION
    assert envelope.startswith(head if grouped else b'{"v":%d,' % keys.PROTOCOL_VERSION)
    header, _ = decode_envelope(envelope)
    assert list(header)[-1] == ("props" if props else "entry_id")


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


@pytest.mark.parametrize(
    "raw",
    [b"42", b" 42 ", b"4_2", "\u0664\u0662".encode(), b"-0", b"9223372036854775807", b"+7"],
)
def test_an_integer_field_read_from_its_bytes_is_what_its_text_says(raw):
    """``ts`` and ``seq`` are read straight from the bytes when they can be: whatever ``int`` of the
    decoded text accepts (whitespace, ``_``, other scripts' digits) gives the same number."""
    entry = parse_entry("5-0", _entry({"publisher": "p", "topic": "t", "ts": raw, "seq": raw}), 10)
    assert entry.timestamp_ms == int(raw.decode()) == entry.header["seq"]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [(b"4\xff", "not valid UTF-8"), (b"0x10", "not an integer"), (b"-9223372036854775809", "64-bit")],
)
def test_an_integer_field_that_is_not_one_is_refused_as_before(raw, fragment):
    with pytest.raises(InvalidMessage, match=f"'ts' {fragment}|{fragment}"):
        parse_entry("5-0", _entry({"publisher": "p", "topic": "t", "ts": raw}), 10)


@pytest.mark.parametrize(
    ("raw", "fragment"), [(b"", "1-256 bytes"), (b"\xff", "'publisher' is not valid UTF-8")]
)
def test_a_publisher_field_is_checked_for_length_and_utf8(raw, fragment):
    with pytest.raises(InvalidMessage, match=fragment):
        parse_entry("1-0", _entry({"publisher": raw, "topic": "t"}), 10)


@pytest.mark.parametrize("field", ["seq", "ts", "expiration"])
def test_integers_beyond_64_bits_are_rejected(field):
    with pytest.raises(InvalidMessage, match="64-bit"):
        parse_entry("1-0", _entry({"publisher": "p", "topic": "t", field: str(2**64)}), 10)


# --------------------------------------------------------------------------
# The usual header is decoded without pydantic's validation: the same message


def _validated(header: dict[str, object], body: bytes) -> Message | Exception:
    try:
        return Message._from_header(header, body)
    except Exception as exc:  # what from_envelope turns into InvalidMessage
        return exc


def _same(fast: Message, slow: Message) -> None:
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert {k: type(v) for k, v in fast.__dict__.items()} == {k: type(v) for k, v in slow.__dict__.items()}
    assert fast.__pydantic_fields_set__ == slow.__pydantic_fields_set__


USUAL = {
    "v": 5,
    "msgid": "m",
    "publisher": "p",
    "seq": 3,
    "topic": "t",
    "ts": 5,
    "entry_id": "1-0",
}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"seq": None},
        {"persistent": False, "priority": 9, "expiration": 99, "correlation_id": "c", "reply_to": "r"},
        {"type": "T", "origin": "QM2", "route": ["QM3", "QM2"], "principal": "u"},
        {"props": {"k": 1, "f": 1.5, "b": True, "s": "x", "n": None, "big": 2**62}},
        {"priority": 0, "expiration": 0, "props": {}, "route": []},
        {"ts": 1700000000123, "size": 4},  # protocol 4's fields still decode
        {"grouped": True, "props": {"JMSXGroupID": "g"}},  # protocol 7: a grouped message's first field
    ],
)
def test_a_usual_header_decodes_to_the_validated_message(extra: dict[str, object]) -> None:
    header = {**USUAL, **extra}
    fast = _from_usual_header(dict(header), b"body")
    assert fast is not None
    slow = _validated(dict(header), b"body")
    assert isinstance(slow, Message)
    _same(fast, slow)
    assert Message.from_envelope(encode_envelope(header, b"body")) == slow


@pytest.mark.parametrize(
    "extra",
    [
        {"seq": True},
        {"seq": "3"},
        {"ts": 1.0},
        {"persistent": 1},
        {"persistent": None},
        {"priority": 10},
        {"priority": None},
        {"priority": True},
        {"expiration": -1},
        {"correlation_id": 5},
        {"props": {"k": [1]}},
        {"props": [1]},
        {"route": "QM1"},
        {"route": [1]},
        {"msgid": None},
        {"topic": 7},
        {"ts": None},
    ],
)
def test_any_other_header_is_left_to_the_validation(extra: dict[str, object]) -> None:
    assert _from_usual_header({**USUAL, **extra}, b"") is None


def test_a_header_without_ts_has_the_entry_ids_milliseconds_as_its_publish_time() -> None:
    # Given protocol 5 headers: no "ts" (it was the entry id's milliseconds) and no "size"
    header = {k: v for k, v in USUAL.items() if k != "ts"} | {"entry_id": "1700000000123-7"}
    # When they are decoded, fast and validated, Then the publish time is the entry id's ms
    fast = _from_usual_header(dict(header), b"body")
    slow = _validated(dict(header), b"body")
    assert fast is not None and isinstance(slow, Message)
    _same(fast, slow)
    assert fast.timestamp_ms == 1700000000123
    # And an entry id that is not a stream id is refused by the validation, not guessed
    bad = header | {"entry_id": "later"}
    assert _from_usual_header(dict(bad), b"") is None
    with pytest.raises(InvalidMessage):
        Message.from_envelope(encode_envelope(bad, b""))


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=12),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.lists(st.one_of(st.text(max_size=2), st.integers()), max_size=2),
    st.dictionaries(
        st.text(max_size=2), st.one_of(st.none(), st.integers(), st.text(max_size=2)), max_size=2
    ),
)
_NAMES = st.sampled_from(
    [
        "msgid",
        "publisher",
        "seq",
        "topic",
        "ts",
        "persistent",
        "priority",
        "expiration",
        "correlation_id",
        "reply_to",
        "type",
        "props",
        "entry_id",
        "origin",
        "route",
        "principal",
    ]
)


@given(changes=st.dictionaries(_NAMES, _VALUES, max_size=4), dropped=st.sets(_NAMES, max_size=2))
@settings(max_examples=400, deadline=None)
def test_the_fast_decoding_never_differs_from_the_validation(changes, dropped) -> None:
    header = {k: v for k, v in {**USUAL, **changes}.items() if k not in dropped}
    fast = _from_usual_header(dict(header), b"x")
    slow = _validated(dict(header), b"x")
    if fast is not None:
        assert isinstance(slow, Message), slow
        _same(fast, slow)
