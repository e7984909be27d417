"""``broker.core.wire``: the one owner of the text, publisher-id, priority and reply rules."""

from __future__ import annotations

from importlib import resources

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys, wire
from broker.core.entries import parse_entry
from broker.core.errors import InvalidMessage, InvalidName
from broker.core.principals import check_publisher_ids

#: Publisher fields as an entry carries them (bytes) -> the FIFO the entry is filed under.
PUBLISHER_FIELDS: list[tuple[bytes | None, str]] = [
    (b"p1", "p1"),
    (b"x", "x"),
    (b"a" * wire.MAX_PUBLISHER_BYTES, "a" * wire.MAX_PUBLISHER_BYTES),
    ("é".encode() * (wire.MAX_PUBLISHER_BYTES // 2), "é" * (wire.MAX_PUBLISHER_BYTES // 2)),
    (b"\xff\xfe", b"\xff\xfe".decode("utf-8", "surrogateescape")),  # not UTF-8: filed as it is
    (b"with\nnewline", "with\nnewline"),
    (b"?", "?"),
    (None, keys.MALFORMED_PUBLISHER),  # no publisher field
    (b"", keys.MALFORMED_PUBLISHER),
    (b"a" * (wire.MAX_PUBLISHER_BYTES + 1), keys.MALFORMED_PUBLISHER),
    ("é".encode() * (wire.MAX_PUBLISHER_BYTES // 2) + b"a", keys.MALFORMED_PUBLISHER),
]

#: lib.lua's publisher_of called on one entry's flat field list (test only: the twin check).
_CALL_PUBLISHER_OF = """
local fields = {}
if ARGV[3] == '1' then fields = {'topic', 't', 'publisher', ARGV[4]} else fields = {'topic', 't'} end
return publisher_of(fields, ARGV[1], tonumber(ARGV[2]))
"""


@pytest.mark.parametrize(("raw", "fifo"), PUBLISHER_FIELDS)
def test_publisher_fifo_files_an_entry_under_its_id_or_the_malformed_publisher(raw, fifo) -> None:
    # Given an entry's publisher field as read; When filed; Then under the FIFO the table says
    assert wire.publisher_fifo(raw) == fifo


def test_lib_lua_publisher_of_agrees_with_wire_publisher_fifo_on_every_id(real_redis: redis.Redis) -> None:
    # Given lib.lua as every script starts with it, on a real server
    lib = resources.files("broker").joinpath("lua", "lib.lua").read_text(encoding="utf-8")
    for raw, fifo in PUBLISHER_FIELDS:
        # When the script files the same field
        filed = real_redis.eval(
            lib + _CALL_PUBLISHER_OF,
            0,
            keys.MALFORMED_PUBLISHER,
            wire.MAX_PUBLISHER_BYTES,
            "0" if raw is None else "1",
            raw or b"",
        )
        # Then under the same FIFO as the Python owner, byte for byte
        assert filed == wire.publisher_bytes(fifo), raw


@pytest.mark.parametrize(
    ("publisher_id", "good"),
    [
        ("p1", True),
        ("a" * wire.MAX_PUBLISHER_BYTES, True),
        ("a" * (wire.MAX_PUBLISHER_BYTES + 1), False),
        ("é" * (wire.MAX_PUBLISHER_BYTES // 2), True),
        ("é" * (wire.MAX_PUBLISHER_BYTES // 2) + "a", False),
        ("", False),
        (b"\xff" * wire.MAX_PUBLISHER_BYTES, True),
        (b"", False),
    ],
)
def test_is_publisher_id_counts_bytes_from_1_to_max(publisher_id, good) -> None:
    assert wire.is_publisher_id(publisher_id) is good


def test_publisher_parse_entry_and_principals_refuse_the_same_ids_the_rule_refuses() -> None:
    # Given the ids the rule refuses and one it accepts at the limit
    too_long, at_limit = "a" * (wire.MAX_PUBLISHER_BYTES + 1), "a" * wire.MAX_PUBLISHER_BYTES
    for bad in ("", too_long):
        # Then each place that takes a publisher id refuses it
        with pytest.raises(InvalidMessage):
            Publisher(None, "QM", bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage, match="field 'publisher'"):
            parse_entry("1-0", {b"publisher": bad.encode(), b"topic": b"t"}, 1024)
        with pytest.raises(InvalidName):
            check_publisher_ids([bad])
    # And accepts the one at the limit
    assert parse_entry("1-0", {b"publisher": at_limit.encode(), b"topic": b"t"}, 1024).publisher == at_limit
    assert check_publisher_ids([at_limit]) == [at_limit]
    with pytest.raises(InvalidName, match="newline"):
        check_publisher_ids(["a\nb"])  # the principals hash holds ids one per line


@pytest.mark.parametrize(("priority", "good"), [(0, True), (4, True), (9, True), (-1, False), (10, False)])
def test_is_priority_is_0_to_9(priority, good) -> None:
    assert wire.is_priority(priority) is good


def test_the_four_text_readings_differ_only_where_they_say() -> None:
    # Given UTF-8, non-UTF-8, str, None and a number
    bad = b"a\xffb"
    # Then strict text decodes UTF-8 and raises on the rest
    assert wire.text(b"caf\xc3\xa9") == "café"
    assert wire.text("s") == "s" and wire.text(None) == "" and wire.text(7) == "7"
    with pytest.raises(UnicodeDecodeError):
        wire.text(bad)
    # lenient_text replaces, exact_text round-trips, utf8_or_none gives up
    assert wire.lenient_text(bad) == "a\ufffdb" and wire.lenient_text(None) == ""
    assert wire.exact_text(bad).encode("utf-8", "surrogateescape") == bad and wire.exact_text(None) == ""
    assert wire.utf8_or_none(bad) is None and wire.utf8_or_none(None) is None
    assert wire.utf8_or_none(b"ok") == "ok"


def test_field_text_names_a_missing_or_non_utf8_field() -> None:
    assert wire.field_text({b"topic": b"t"}, b"topic") == "t"
    assert wire.field_text({}, b"topic") is None
    with pytest.raises(InvalidMessage, match="missing field 'topic'"):
        wire.field_text({}, b"topic", required=True)
    with pytest.raises(InvalidMessage, match="not valid UTF-8"):
        wire.field_text({b"topic": b"\xff"}, b"topic")


def test_parse_reply_reads_the_json_commit_lua_posts() -> None:
    # Given a reply as cjson encodes it (absent fields omitted)
    reply = wire.parse_reply(b'{"status":"delivered","subscriptions":3,"flow_control_delay_ms":5}')
    # Then every field has its default when absent
    assert reply == wire.Reply("delivered", None, 3, None, None, 5, 0)
    refused = wire.parse_reply('{"status":"refused","entry_id":"1-0","reason":"r","suggestion":"a/b"}')
    assert (refused.entry_id, refused.reason, refused.suggestion) == ("1-0", "r", "a/b")


#: Field names on either side of the broker-only rule (lib.lua's broker_only, wire.is_broker_only).
FIELD_NAMES = [
    *wire.BROKER_ONLY_FIELDS,
    "dlq.principal",
    "dlq.reason",
    "dlq.",
    "publisher",
    "topic",
    "body",
    "msgid",
    "seq",
    "props",
    "reply_to",
    "origins",
    "Route",
    "dlq",
    "xdlq.principal",
    "",
]


def test_lib_lua_broker_only_agrees_with_wire_is_broker_only_on_every_field_name(
    real_redis: redis.Redis,
) -> None:
    # Given lib.lua as every script starts with it, on a real server
    lib = resources.files("broker").joinpath("lua", "lib.lua").read_text(encoding="utf-8")
    for name in FIELD_NAMES:
        # When the script judges a field name
        dropped = real_redis.eval(lib + "\nreturn broker_only(ARGV[1]) and 1 or 0", 0, name)
        # Then as the Python owner does
        assert bool(dropped) is wire.is_broker_only(name), name
    assert {"principal", "origin", "route"} <= set(wire.BROKER_ONLY_FIELDS)
