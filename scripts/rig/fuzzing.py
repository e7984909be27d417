"""Bad input of every kind the broker takes, for ``tests/unit/test_fuzz_properties.py``,
``tests/integration/test_fuzz.py`` and ``python -m scripts.fuzz``.

Every generator takes a ``random.Random`` (the fuzz script's, seeded; or hypothesis's
``st.randoms()``, which shrinks), so one seed gives the same inputs again:

- ``bad_entry``: the raw fields of one ``XADD {qm}:publish`` (the protocol document in
  ``broker.core.keys``), a valid publication with one to three mutations: a field left out, given
  twice, of the wrong type, huge, not UTF-8, out of range; a binary or oversized body; bad
  priorities, expirations, props JSON, origin and route; thousands of fields;
- ``garbage_envelope``: what a consumer may find in a subscriber queue written by another
  service: a valid envelope mutated, or bytes;
- ``random_topic`` / ``random_filter``: topic strings and filters of either scheme, near the
  rules' edges; ``matching_filter`` / ``matching_topic``: valid ones over a small alphabet, so
  that they meet;
- ``garbage_selector``, ``valid_selector``, ``random_properties``: Jakarta Messaging selectors
  and what they are evaluated on; ``like_reference``: SQL LIKE by dynamic programming, the
  reference of ``broker.core.selectors.like``;
- ``settings_toml``, ``topics_toml``, ``network_toml``: configuration files (``toml_document``
  writes TOML), and ``junk_document``: bytes that may not be TOML at all;
- ``admin_request`` / ``run_admin``: subscribe, unsubscribe, link, topic define/alter/delete/apply,
  declare, with random names and filters; ``ADMIN_ERRORS`` are the errors they may raise, and
  ``snapshot`` what they may change;
- ``corrupt_record``: a record written by hand into a hash the workers read;
- ``reason_class``: the class of a dead letter's reason, for counting.

Topics and names never start with ``good`` (``GOOD``): the fuzz run's well-behaved publishers
and subscribers live there, and no bad input may change what they are owed. Nor does any
input set ``USEDLQ(NO)``: every refused bad entry must leave a dead letter.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import redis
from pydantic import ValidationError

from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import BrokerError
from broker.topics.declared import declare, undeclare
from broker.topics.links import link, unlink, unlink_all
from broker.topics.subscriptions import subscribe, unsubscribe
from broker.topics.topic_objects import BASE, Attributes, TopicObject, alter, apply, define, delete

R = random.Random

#: The root topic of the fuzz run's good traffic: bad input never names it.
GOOD = "good"

#: The publication entry's fields (``broker.core.keys``).
ENTRY_FIELDS = (
    "publisher",
    "topic",
    "body",
    "msgid",
    "seq",
    "ts",
    "persistent",
    "priority",
    "expiration",
    "correlation_id",
    "reply_to",
    "props",
    "reply",
    "client_id",
    "type",
    "origin",
    "route",
)

#: Text near the edges of the rules: separators, wildcards, escapes, control characters,
#: lone surrogates, numbers around the limits.
EDGE_TEXT = (
    "",
    " ",
    "\x00",
    "\x01",
    "\x1f",
    "\x7f",
    "\x85",
    "\u2028",
    "\ufeff",
    "\ud800",
    "\udfff",
    "é",
    "日本",
    "\U0001f600",
    "+",
    "#",
    "/",
    "//",
    "$",
    "$SYS",
    "$share",
    "$share/",
    "%",
    "_",
    "\\",
    "\\%",
    "\\_",
    "\\\\",
    ".",
    "..",
    "'",
    "''",
    '"',
    ",",
    ":",
    "{",
    "}",
    "[",
    "NaN",
    "Infinity",
    "-1",
    "0",
    "1",
    "9",
    "10",
    "007",
    "1_000",
    " 5 ",
    "+5",
    "0x10",
    "1e3",
    "1.5",
    "١٢",
    "²",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1e999",
    "true",
    "null",
    "SYSTEM.BASE.TOPIC",
)

#: Level (node) words of random topics and filters; never ``GOOD``.
WORDS = ("a", "b", "junk", "x", "A", "sport", "tennis", "$SYS", "$x", "iit", "sales", "EU", "é", " ", "")


def edge_text(r: R) -> str:
    return r.choice(EDGE_TEXT)


def junk_text(r: R, most: int = 24) -> str:
    """Unicode of every kind: ASCII, control characters, lone surrogates, astral characters."""
    pools = (
        "abcxyz019 ",
        "/+#.%_\\$'\",:()",
        "\x00\x01\x1f\x7f\x85\xa0",
        "éß日本\u2028\ufeff",
        "\ud800\udc00\udfff",
        "\U0001f600\U0010ffff",
    )
    return "".join(r.choice(r.choice(pools)) for _ in range(r.randint(0, most)))


def junk_bytes(r: R, most: int = 24) -> bytes:
    """Bytes, often not UTF-8."""
    choice = r.random()
    if choice < 0.3:
        return bytes(r.randrange(256) for _ in range(r.randint(0, most)))
    if choice < 0.5:
        return r.choice(
            (b"\xff", b"\xc3", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\x80b", b"\xe2\x82")
        )
    return junk_text(r, most).encode("utf-8", "surrogatepass")


def text(r: R, most: int = 24) -> str:
    """Text near the rules' edges: an edge case, junk, or a composite of both."""
    choice = r.random()
    if choice < 0.35:
        return edge_text(r)
    if choice < 0.7:
        return junk_text(r, most)
    return "".join(r.choice((edge_text(r), junk_text(r, 4), r.choice(WORDS))) for _ in range(r.randint(1, 5)))


def huge(r: R) -> bytes:
    """A large value (up to about 300 kB)."""
    return r.choice((b"x", b"\xff", "é".encode(), b"/", b"0")) * r.choice((1_000, 65_536, 70_000, 300_000))


def _encode(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------
# Publication entries


def good_fields(publisher: str, topic: str, body: bytes = b"") -> list[tuple[bytes, bytes]]:
    """A valid entry's fields."""
    return [(b"publisher", publisher.encode()), (b"topic", topic.encode()), (b"body", body)]


def _bad_value(r: R, name: str, max_body: int, scheme: str = "mqtt") -> bytes:
    """A value for field ``name`` that is probably out of its range."""
    if r.random() < 0.15:
        return junk_bytes(r)
    if r.random() < 0.05:
        return huge(r)
    if name in ("seq", "ts", "priority", "expiration"):
        return _encode(
            r.choice(("-1", "x", "1.5", "1e3", " 1", "10", "99", "12", "", "١", "0x10", "+3", "007", "1_0"))
            if r.random() < 0.7
            else edge_text(r)
        )
    if name in ("persistent", "reply"):
        return _encode(r.choice(("2", "yes", "true", "", "1 ", "01", "-0", "0", "1")))
    if name == "props":
        return _encode(
            r.choice(
                (
                    "[]",
                    "{",
                    '{"a": {}}',
                    '{"a": [1]}',
                    '{"a": NaN}',
                    '{"a": Infinity}',
                    '{"a": -Infinity}',
                    '{"a": 1e999}',
                    '{"a": 9223372036854775808}',
                    '{"a": -9223372036854775809}',
                    '{"a": ' + "9" * 5000 + "}",
                    '"x"',
                    "null",
                    "1",
                    "[" * r.choice((100, 5_000, 100_000)),
                    '{"a": "\\ud800"}',
                    '{"\\udc00": 1}',
                    '{"a": 1, "a": "x"}',
                    '{"JMSPriority": 9, "parity": "even"}',
                    '{"a": 1.5, "b": true, "c": null, "d": "x"}',
                    '{"": ""}',
                )
            )
        )
    if name == "body":
        return r.choice(
            (b"", b"\n", b"\x00\xff\n{}", bytes(range(256)), b"x" * (max_body + 1), junk_bytes(r))
        )
    if name == "topic":
        if r.random() < 0.5:
            return _encode(random_topic(r, scheme))
        return _encode(
            r.choice(
                (
                    "",
                    "#",
                    "a/+",
                    "a/#",
                    "+",
                    "a\x00b",
                    "a\x01",
                    "\x7f",
                    "\ud800",
                    "a//b",
                    "$SYS/x",
                    "a..b",
                    ".a",
                )
            )
        )
    if name == "publisher":
        return r.choice((b"", b"x" * 257, b"\xff", "é".encode() * 129, b"p:q", b"?", b"x" * 256))
    if name == "origin":
        return _encode(r.choice(("", "QM 1", "a,b", "x" * 65, "QM1", "QM2", "\xe9")))
    if name == "route":
        return _encode(r.choice(("", "QM1", "QM2,QM1", "QM1,,QM2", "QM1,QM 2", ",", "QM1," * 100)))
    return _encode(text(r))


def bad_entry(
    r: R, publisher: str, topic: str, max_body: int = 65_536, scheme: str = "mqtt"
) -> tuple[list[tuple[bytes, bytes]], str]:
    """A publication entry with one to three mutations, and a label naming them.

    Args:
        publisher: the publisher id of the entry before its mutations.
        topic: its topic before its mutations (valid, not under ``GOOD``).
        max_body: the workers' ``max_body_bytes`` (an oversized body is one byte more).
        scheme: the queue manager's topic scheme (bad topics near its rules).

    Returns:
        ``([(field, value)], label)``: the fields in order (a field may be given twice).
    """
    fields = dict(good_fields(publisher, topic, junk_bytes(r, 16)))
    if r.random() < 0.5:
        fields[b"seq"] = str(r.randint(0, 10**6)).encode()
    if r.random() < 0.2:
        fields[b"reply"] = b"1"
    if r.random() < 0.3:
        fields[b"msgid"] = _encode(r.choice(("m1", "m2", "a:b", "", "é", "x" * 300)))
    extra: list[tuple[bytes, bytes]] = []
    labels: list[str] = []
    for _ in range(r.choice((1, 1, 1, 2, 3))):
        what = r.random()
        name = "topic" if r.random() < 0.25 else r.choice(ENTRY_FIELDS)
        if what < 0.1:
            dropped = r.choice((b"publisher", b"topic"))
            fields.pop(dropped, None)
            labels.append(f"no {dropped.decode()}")
        elif what < 0.7:
            fields[name.encode()] = _bad_value(r, name, max_body, scheme)
            labels.append(f"bad {name}")
        elif what < 0.8:
            # given twice: the first value counts (lua/lib.lua's field_of)
            second = r.choice((b"good-0", _bad_value(r, name, max_body, scheme)))
            extra.append((name.encode(), second))
            labels.append(f"{name} twice")
        elif what < 0.85:
            count = r.choice((1_500, 5_000))
            extra.extend((f"f{i}".encode(), b"v") for i in range(count))
            labels.append(f"{count} fields")
        elif what < 0.92:
            extra.append((junk_bytes(r, 8), junk_bytes(r, 8)))
            labels.append("unknown field")
        else:
            fields[b"origin"] = _encode(r.choice(("QM1", "QM2", "", "Q M")))
            fields[b"route"] = _encode(r.choice(("QM1", "QM2,QM1", "QM1,QM2", "", "QM1,,QM2")))
            labels.append("origin/route")
    return [*fields.items(), *extra], ", ".join(labels)


def flat(pairs: list[tuple[bytes, bytes]]) -> list[bytes]:
    """``[(field, value)]`` as XADD's argument list."""
    return [part for pair in pairs for part in pair]


# --------------------------------------------------------------------------
# Envelopes


def good_header(r: R) -> dict[str, Any]:
    header: dict[str, Any] = {
        "v": keys.PROTOCOL_VERSION,
        "msgid": "m-" + str(r.randint(0, 999)),
        "publisher": "p",
        "seq": r.choice((None, 1)),
        "topic": "poison/x",
        "entry_id": f"{r.randint(1, 10**13)}-0",
    }
    if r.random() < 0.3:  # a publish time of its own (protocol 5: absent = the entry id's ms)
        header["ts"] = 1_700_000_000_000
    if r.random() < 0.3:
        header["props"] = {"a": 1}
    return header


def _dumps(header: dict[str, Any]) -> bytes:
    return json.dumps(header).encode()  # json, not orjson: integers beyond 64 bits too


def garbage_envelope(r: R) -> tuple[bytes, str]:
    """An element of a subscriber queue another service may have written, and a label.

    Mostly a valid envelope with one mutation (a field left out or of the wrong type, the
    header not JSON, no newline, ``expiration`` passed); sometimes plain bytes.
    """
    choice = r.random()
    if choice < 0.15:
        return junk_bytes(r, 64), "bytes"
    if choice < 0.2:
        return r.choice((b"", b"\n", b"\n\n", b"{}", b"{}\n", b"[]\n", b"null\n", b'"x"\n', b"1\n")), "short"
    header = good_header(r)
    body = junk_bytes(r, 32)
    mutation = r.choice(
        ("drop", "type", "type", "priority", "expiration", "not json", "no newline", "deep", "big", "route")
    )
    if mutation == "drop":
        header.pop(r.choice(("msgid", "publisher", "topic")), None)
    elif mutation == "type":
        name = r.choice(
            ("msgid", "publisher", "topic", "ts", "seq", "persistent", "props", "priority", "route")
        )
        header[name] = r.choice(([], {}, "x", 1.5, None, True, -1, [1, [2]], {"a": {}}, 10**30))
    elif mutation == "priority":
        header["priority"] = r.choice((-1, 10, 12, 99, "7", 7))
    elif mutation == "expiration":
        header["expiration"] = r.choice((1, -5, 10**20, "x"))
    elif mutation == "route":
        header["origin"], header["route"] = r.choice((("QM1", 5), ("QM1", "QM1"), (5, []), ("QM1", ["QM1"])))
    elif mutation == "not json":
        return b'{"msgid": "m", ' + junk_bytes(r, 16) + b"\n" + body, mutation
    elif mutation == "no newline":
        return _dumps(header) + junk_bytes(r, 8).replace(b"\n", b""), mutation
    elif mutation == "deep":
        return b"[" * r.choice((200, 2_000, 100_000)) + b"\n", mutation
    else:
        header["correlation_id"] = "x" * 100_000
    return _dumps(header) + b"\n" + body, mutation


# --------------------------------------------------------------------------
# Topics and filters


def random_topic(r: R, scheme: str) -> str:
    """A topic string near the scheme's rules: valid or not, not under ``GOOD``."""
    sep = "/" if scheme == "mqtt" else "."
    if r.random() < 0.15:
        return text(r)
    if scheme == "swiftmq" and r.random() < 0.2:  # a predicate topic (indirect selection)
        return random_filter(r, scheme)
    if r.random() < 0.05:
        return r.choice(("x" * 65_536, "é" * 32_768, sep.join(["x" * 1000] * 66)))
    parts = [r.choice(WORDS) if r.random() < 0.8 else text(r, 4) for _ in range(r.randint(1, 5))]
    if parts[0] == GOOD:
        parts[0] = "junk"
    return sep.join(parts)


def random_filter(r: R, scheme: str) -> str:
    """A topic filter near the scheme's rules: ``+``/``#`` or SQL-LIKE predicate nodes, ``$share/``."""
    sep = "/" if scheme == "mqtt" else "."
    if r.random() < 0.1:
        return text(r)
    wild = ("+", "#", "a+", "#a") if scheme == "mqtt" else ("%", "_", "a%", "%a%", "\\%", "\\_", "\\", "b\\x")
    parts = [r.choice(WORDS) if r.random() < 0.6 else r.choice(wild) for _ in range(r.randint(1, 5))]
    if parts[0] == GOOD:
        parts[0] = "junk"
    found = sep.join(parts)
    if scheme == "mqtt" and r.random() < 0.1:
        found = r.choice(("$share/", "$share//", "$share/g+/", "$share/grp/")) + found
    return found


def matching_filter(r: R, scheme: str) -> str:
    """A valid filter over a small alphabet (to compare an index with the reference ``matches``)."""
    if scheme == "mqtt":
        levels = [r.choice(("a", "b", "", "+", "$s")) for _ in range(r.randint(1, 4))]
        if r.random() < 0.4:
            levels.append("#")
        return "/".join(levels) or "+"
    nodes = [r.choice(("a", "b", "c", "ab"))] + [
        r.choice(("a", "b", "c", "ab", "%", "_", "a%", "%b", "_b", "a\\%", "a\\_b"))
        for _ in range(r.randint(0, 3))
    ]
    return ".".join(nodes)


def matching_topic(r: R, scheme: str) -> str:
    """A valid topic over the same small alphabet."""
    if scheme == "mqtt":
        return "/".join(r.choice(("a", "b", "", "$s", "c")) for _ in range(r.randint(1, 5))) or "/"
    return ".".join(r.choice(("a", "b", "c", "ab", "a%", "_", "a_b")) for _ in range(r.randint(1, 5)))


# --------------------------------------------------------------------------
# Selectors and LIKE

_SELECTOR_TOKENS = (
    "x",
    "y",
    "parity",
    "n",
    "JMSPriority",
    "JMSType",
    "JMSDeliveryMode",
    "_a",
    "$b",
    "é",
    "null",
    "NULL",
    "true",
    "FALSE",
    "and",
    "OR",
    "not",
    "BETWEEN",
    "in",
    "LIKE",
    "ESCAPE",
    "is",
    "'s'",
    "'it''s'",
    "''",
    "'",
    "57",
    "57L",
    "-9",
    "7E3",
    "7.",
    ".5",
    "1e999",
    "0x1F",
    "010",
    "9" * 5000,
    "=",
    "<>",
    "<",
    ">",
    "<=",
    ">=",
    "!=",
    "+",
    "-",
    "*",
    "/",
    "(",
    ")",
    ",",
    "²",
    "١",
    "\x00",
    '"',
    "\n",
    "%",
    "?",
    "\ud800",
)


def garbage_selector(r: R) -> str:
    """Selector tokens and junk in any order: mostly not a selector."""
    if r.random() < 0.1:
        return text(r, 40)
    if r.random() < 0.05:
        return "(" * r.choice((49, 51, 300)) + "x = 1" + ")" * r.choice((49, 51, 300))
    if r.random() < 0.05:
        return " AND ".join(["x = 1"] * r.choice((150, 250))) + " OR " + "NOT " * r.choice((10, 300)) + "y"
    return " ".join(r.choice(_SELECTOR_TOKENS) for _ in range(r.randint(1, 12)))


def _operand(r: R, depth: int) -> str:
    if depth <= 0 or r.random() < 0.5:
        return r.choice(("x", "y", "n", "JMSPriority", "1", "2.5", "-3", "0", "1e308", "9223372036854775807"))
    return f"({_operand(r, depth - 1)} {r.choice('+-*/')} {_operand(r, depth - 1)})"


def valid_selector(r: R, depth: int = 3) -> str:
    """A selector that parses (mostly), so that evaluation is exercised; LIKE patterns may be pathological."""
    choice = r.random()
    if depth > 0 and choice < 0.25:
        op = r.choice(("AND", "OR"))
        return f"({valid_selector(r, depth - 1)}) {op} ({valid_selector(r, depth - 1)})"
    if depth > 0 and choice < 0.3:
        return f"NOT ({valid_selector(r, depth - 1)})"
    kind = r.choice(("cmp", "cmp", "between", "in", "like", "null", "str", "bool"))
    if kind == "cmp":
        return f"{_operand(r, 2)} {r.choice(('=', '<>', '<', '>', '<=', '>='))} {_operand(r, 2)}"
    if kind == "between":
        return f"{_operand(r, 1)} {r.choice(('', 'NOT '))}BETWEEN {_operand(r, 1)} AND {_operand(r, 1)}"
    if kind == "in":
        return f"parity {r.choice(('', 'NOT '))}IN ('even', 'odd', 'é')"
    if kind == "like":
        pattern = r.choice(("%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%a%b", "a_%", "\\%%", "%", "_", "a%b%c"))
        escape = " ESCAPE '\\'" if "\\" in pattern else ""
        return f"x {r.choice(('', 'NOT '))}LIKE '{pattern}'{escape}"
    if kind == "null":
        return f"{r.choice(('x', 'parity', 'JMSType'))} IS {r.choice(('', 'NOT '))}NULL"
    if kind == "str":
        return f"{r.choice(('x', 'parity', 'JMSType', 'JMSDeliveryMode'))} {r.choice(('=', '<>'))} 'even'"
    return f"{r.choice(('x', 'y'))} = {r.choice(('TRUE', 'FALSE'))}"


class Odd:
    """A property value of a type a selector cannot use; comparing it is a bug."""

    def __eq__(self, other: object) -> bool:
        raise AssertionError("a selector compared an unusable value")

    __hash__ = None  # type: ignore[assignment]


def random_properties(r: R) -> dict[str, object]:
    """What a selector is evaluated on: every kind of value, usable or not."""
    values: tuple[object, ...] = (
        0,
        1,
        -1,
        2**63 - 1,
        -(2**63),
        10**30,
        1.5,
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        1e308,
        "even",
        "odd",
        "a" * 60,
        "",
        "é",
        True,
        False,
        None,
        b"x",
        [1],
        {"a": 1},
    )
    names = ("x", "y", "n", "parity", "JMSPriority", "JMSType", "JMSDeliveryMode")
    found: dict[str, object] = {name: r.choice(values) for name in names if r.random() < 0.7}
    if r.random() < 0.1:
        found["x"] = Odd()
    return found


@lru_cache(maxsize=4096)
def like_reference(pattern: str, value: str, escape: str | None = None) -> bool:
    """SQL LIKE by dynamic programming over the pattern's tokens: the reference
    ``broker.core.selectors.like`` must agree with. The pattern's escapes must be valid."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if escape is not None and char == escape:
            tokens.append(("lit", pattern[i + 1]))
            i += 2
            continue
        tokens.append(("any", "") if char == "%" else ("one", "") if char == "_" else ("lit", char))
        i += 1
    # reach[j]: the tokens so far match value[:j]
    reach = [True] + [False] * len(value)
    for kind, char in tokens:
        following = [False] * (len(value) + 1)
        for j in range(len(value) + 1):
            if kind == "any":
                following[j] = reach[j] or (j > 0 and following[j - 1])
            elif j > 0 and reach[j - 1] and (kind == "one" or value[j - 1] == char):
                following[j] = True
        reach = following
    return reach[len(value)]


# --------------------------------------------------------------------------
# Configuration files


def toml_key(key: str) -> str:
    return json.dumps(key)


def toml_value(value: Any) -> str:
    """``value`` as TOML (a lone surrogate is written as a ``\\ud800`` escape, which TOML refuses)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def toml_document(data: dict[str, Any]) -> bytes:
    """A TOML document of top-level keys; a short list of dicts is written as an array of tables."""
    lines: list[str] = []
    tables: list[str] = []
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and len(value) < 5:
            for item in value:
                tables.append(f"[[{toml_key(key)}]]")
                tables.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in item.items())
        else:
            lines.append(f"{toml_key(key)} = {toml_value(value)}")
    return ("\n".join(lines + tables) + "\n").encode("utf-8", "surrogatepass")


def random_value(r: R, depth: int = 2) -> Any:
    """A TOML value of any type (strings near the edges, numbers around the limits)."""
    choice = r.random()
    if choice < 0.25:
        return r.choice((0, 1, -1, 10, 2**63 - 1, -(2**63), 5_000, 512 * 1024 * 1024 + 1, 65_536))
    if choice < 0.35:
        return r.choice((0.5, -1.5, math.inf, math.nan, 1e300))
    if choice < 0.45:
        return r.random() < 0.5
    if choice < 0.8 or depth <= 0:
        return text(r)
    if choice < 0.9:
        return [random_value(r, depth - 1) for _ in range(r.randint(0, 3))]
    return {text(r, 6): random_value(r, depth - 1) for _ in range(r.randint(0, 3))}


def _setting_value(r: R, name: str) -> Any:
    if r.random() < 0.4:
        return random_value(r)
    if name == "consumer_modes":
        return [
            {"predicate": r.choice(("%", "a\\", "", "x%")), "mode": r.choice(("shared", "x", "exclusive"))}
            for _ in range(r.randint(0, 3))
        ]
    if name == "queue_controllers":
        return [
            {
                "predicate": r.choice(("tmp$%", "", "%", 5)),
                "persistence_mode": r.choice(("as_message", "non_persistent", "transient", 1)),
                "consumer_mode": r.choice(("shared", "activestandby", "x")),
            }
            for _ in range(r.randint(0, 3))
        ]
    if name == "slow_subscriber_conditions":
        return [
            {"name": r.choice(("feed", "a/b", "a.b", "#", "")), "max_messages": r.choice((0, 1, -1, "x"))}
            for _ in range(r.randint(0, 3))
        ]
    if name == "topics":
        return [random_topic(r, "swiftmq") for _ in range(r.randint(0, 3))]
    if name in ("redis_url", "server_config", "server_dir", "qm", "topic_scheme"):
        return r.choice(
            ("redis://x", "rediss://", "http://x", "", "QM1", "mqtt", "swiftmq", "x" * 5_000, text(r))
        )
    default = Settings.model_fields[name].default
    if isinstance(default, bool):
        return r.choice((True, False, "true", 1))
    if isinstance(default, int):
        return r.choice((0, 1, -1, default, default * 1000, 2**64, "5"))
    return random_value(r)


def settings_toml(r: R) -> dict[str, Any]:
    """A settings file's content: known settings with values of every type, unknown ones sometimes."""
    names = list(Settings.model_fields)
    data = {name: _setting_value(r, name) for name in r.sample(names, r.randint(0, 6))}
    if r.random() < 0.1:
        data[text(r, 8)] = random_value(r)
    return data


_ATTRIBUTES = tuple(Attributes.model_fields)

#: Values each attribute takes (``broker.topics.topic_objects.Attributes``), USEDLQ(NO) left out.
_VALID_ATTRIBUTES: dict[str, tuple[Any, ...]] = {
    "pub": ("ENABLED", "DISABLED", "ASPARENT"),
    "sub": ("ENABLED", "DISABLED", "ASPARENT"),
    "dursub": ("YES", "NO", "ASPARENT"),
    "defpsist": ("YES", "NO", "ASPARENT"),
    "defprty": (0, 9, "ASPARENT"),
    "capexpry": (1, 1000, 10**30, 2**63, "NOLIMIT", "ASPARENT"),
    "maxdepth": (0, 1, 5, 10**30, "NOLIMIT", "ASPARENT"),
    "pmsgdlv": ("ALL", "ALLDUR", "ALLAVAIL", "ASPARENT"),
    "npmsgdlv": ("ALL", "ALLDUR", "ALLAVAIL", "ASPARENT"),
    "usedlq": ("YES", "ASPARENT"),
    "wildcard": ("PASSTHRU", "BLOCK"),
    "pubscope": ("QMGR", "ALL", "ASPARENT"),
    "subscope": ("QMGR", "ALL", "ASPARENT"),
    "cluster": ("", "CL1", "ASPARENT"),
    "clroute": ("DIRECT", "TOPICHOST"),
    "proxysub": ("FIRSTUSE", "FORCE"),
}


def attribute_value(r: R, name: str) -> Any:
    """A value for attribute ``name``: mostly one it takes (never USEDLQ(NO)), sometimes any."""
    if r.random() < 0.6 and name in _VALID_ATTRIBUTES:
        return r.choice(_VALID_ATTRIBUTES[name])
    if r.random() < 0.5:
        return random_value(r, 0)
    return r.choice(
        (
            "ASPARENT",
            "ENABLED",
            "DISABLED",
            "YES",
            "ALL",
            "ALLDUR",
            "ALLAVAIL",
            "NOLIMIT",
            "QMGR",
            "PASSTHRU",
            "BLOCK",
            "DIRECT",
            "TOPICHOST",
            "FIRSTUSE",
            "FORCE",
            "",
            "CL1",
            0,
            1,
            9,
            10,
            -1,
            1000,
        )
    )


def attributes(r: R, most: int = 3) -> dict[str, Any]:
    """Some attributes of a topic object, with values from ``attribute_value``."""
    return {name: attribute_value(r, name) for name in r.sample(_ATTRIBUTES, r.randint(0, most))}


def object_name(r: R) -> str:
    if r.random() < 0.6:
        return r.choice(("T1", "T2", "JUNK.A", "a/b", "%x", "X" * 48))
    return r.choice(("", "X" * 49, "a b", "é", "T*", "SYSTEM.BASE.TOPIC", text(r, 8)))


def topics_toml(r: R) -> dict[str, Any]:
    """A topic-object file's content (``broker.topics.topic_objects.load_file``)."""
    if r.random() < 0.1:
        return {r.choice(("topic", "topics", text(r, 6))): random_value(r)}
    items = []
    for _ in range(r.randint(0, 4)):
        item: dict[str, Any] = {}
        if r.random() < 0.9:
            item["name"] = object_name(r) if r.random() < 0.9 else random_value(r, 0)
        if r.random() < 0.9:
            item["topic_string"] = random_topic(r, "mqtt") if r.random() < 0.9 else random_value(r, 0)
        item.update(attributes(r))
        if r.random() < 0.1:
            item[text(r, 6)] = random_value(r, 0)
        items.append(item)
    return {"topic": items}


def network_toml(r: R, qm: str = "QM1") -> dict[str, Any]:
    """A network file's content (``broker.topics.topology.load_network``); ``qm`` is often in it."""
    names = [qm, qm, "QM2", "QM3", "Q M", "", "x" * 65, "é"]
    qms: dict[str, Any] = {}
    for _ in range(r.randint(0, 3)):
        node: dict[str, Any] = {}
        if r.random() < 0.5:
            node["parent"] = r.choice(names)
        if r.random() < 0.3:
            node["clusters"] = [r.choice(("C1", "", "C 1")) for _ in range(r.randint(0, 2))]
        if r.random() < 0.2:
            node["url"] = r.choice(("redis://x", 5, ""))
        if r.random() < 0.1:
            node[text(r, 5)] = 1
        qms[r.choice(names)] = node if r.random() < 0.95 else random_value(r, 0)
    data: dict[str, Any] = {"queue_managers": qms}
    if r.random() < 0.3:
        data["announce"] = r.choice(("root", "topic", "all", 1))
    if r.random() < 0.3:
        data["retention_ms"] = r.choice((-1, 0, 10, "x"))
    if r.random() < 0.3:
        data["static_subscriptions"] = [
            {"at": r.choice(names), "to": r.choice(names), "topic": r.choice(("a", "", "#"))}
            for _ in range(r.randint(0, 2))
        ]
    if r.random() < 0.3:
        data["announce_filters"] = [
            {
                "at": r.choice(names),
                "name": r.choice(("01", "")),
                "router": r.choice(("%", "QM\\", "Q_", "%a%a%a%a%a%a%a%a%a%a%a%a%b")),
                "type": r.choice(("include", "exclude", "x")),
                "topics": [r.choice(("%", "\\", "a%"))],
            }
            for _ in range(r.randint(0, 2))
        ]
    if r.random() < 0.1:
        data[text(r, 6)] = random_value(r)
    return data


def junk_document(r: R) -> bytes:
    """A file that may not be TOML at all: bytes, deep nesting, a TOML document cut short."""
    choice = r.random()
    if choice < 0.3:
        return junk_bytes(r, 80)
    if choice < 0.5:
        return b"a = " + b"[" * r.choice((10, 1_000, 100_000))
    if choice < 0.6:
        return b"a = " + b"{ b = " * r.choice((10, 1_000, 10_000))
    if choice < 0.8:
        return toml_document(settings_toml(r))[: r.randint(0, 60)]
    return b"\xef\xbb\xbf" + toml_document({"qm": "QM1"}) + junk_bytes(r, 8)


# --------------------------------------------------------------------------
# Administrative requests

#: What an administrative request may raise (the documented errors): the broker's own
#: errors, and pydantic's ``ValidationError`` (a ``ValueError``) for attribute values.
ADMIN_ERRORS: tuple[type[Exception], ...] = (BrokerError, ValidationError)


@dataclass
class AdminRequest:
    """One administrative request: the operation and its arguments."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v!r:.60}" for k, v in self.args.items())
        return f"{self.op}({shown})"


def _name(r: R) -> str:
    """A client id, durable name or consumer id: mostly valid, sometimes at the edges."""
    if r.random() < 0.8:
        return r.choice(("fz", "fz-1", "a.b", "A_b", "x" * 128, "zz"))
    return r.choice(("", "x" * 129, "a b", "a$b", "a:b", "é", "a/b", "\ud800", text(r, 8)))


def _sub_id(r: R, victim: str, made: list[str]) -> str:
    choice = r.random()
    if made and choice < 0.3:
        return r.choice(made)
    if choice < 0.6:
        suffix = r.choice(
            (":p3", ":p7", ":inflight:c1", ":bell", ":consumers", ":active", ":redelivered", ":inflight")
        )
        return victim + suffix
    return r.choice(("fz$nope", "nope", "$", "a$", "$b", "a$b$c", text(r, 10), "fz$" + text(r, 6)))


def admin_request(
    r: R, scheme: str, victim: str = "fz$victim", made: list[str] | None = None
) -> AdminRequest:
    """An administrative request with random names and filters.

    Args:
        scheme: the queue manager's topic scheme.
        victim: a subscription with messages in several bands and in flight, whose keys
            ids such as ``<victim>:p3`` would name.
        made: subscription ids made by earlier requests (unsubscribed again).
    """
    made = made or []
    op = r.choice(
        (
            "subscribe",
            "subscribe",
            "unsubscribe",
            "link",
            "unlink",
            "unlink_all",
            "define",
            "alter",
            "delete",
            "apply",
            "declare",
            "undeclare",
        )
    )
    if op == "subscribe":
        args: dict[str, Any] = {
            "topic_filter": random_filter(r, scheme),
            "client_id": _name(r),
            "durable_name": r.choice((None, _name(r))),
            "shared": r.random() < 0.2,
            "selector": r.choice((None, "", " ", garbage_selector(r), valid_selector(r, 1))),
            "no_local": r.random() < 0.2,
        }
        if r.random() < 0.1:
            args["topic_object"] = r.choice(("T1", "NOPE", "T*", "*", "SYSTEM*", ""))
        return AdminRequest(op, args)
    if op == "unsubscribe":
        return AdminRequest(op, {"sub_id": _sub_id(r, victim, made)})
    if op in ("link", "unlink"):
        args = {"source": random_topic(r, scheme), "target": random_topic(r, scheme)}
        if op == "link":
            args["backward"] = r.random() < 0.3
        return AdminRequest(op, args)
    if op == "unlink_all":
        return AdminRequest(op, {"source": random_topic(r, scheme)})
    if op == "define":
        return AdminRequest(
            op,
            {
                "name": object_name(r),
                "topic_string": random_topic(r, scheme),
                "attributes": attributes(r),
                "replace": r.random() < 0.3,
            },
        )
    if op == "alter":
        changes = attributes(r, 2)
        if r.random() < 0.1:
            changes[r.choice(("topic_string", "bogus", "PUB"))] = "x"
        return AdminRequest(op, {"name": object_name(r), "changes": changes})
    if op == "delete":
        return AdminRequest(op, {"name": object_name(r)})
    if op == "apply":
        objects = topics_toml(r).get("topic", [])
        return AdminRequest(op, {"objects": objects if isinstance(objects, list) else []})
    return AdminRequest(op, {"topic": random_topic(r, "swiftmq")})


def touches_good(topic: Any, scheme: str) -> bool:
    """Whether ``topic`` is ``GOOD``'s, or the root "" (where an object would change every topic)."""
    if not isinstance(topic, str):
        return False
    sep = "/" if scheme == "mqtt" else "."
    return topic == "" or topic.partition(sep)[0] == GOOD


def run_admin(client: redis.Redis, qm: str, scheme: str, request: AdminRequest) -> str:
    """Carry out ``request``; returns what it did ("made:<sub id>", "removed", "done", "skipped":
    a request on ``GOOD`` topics or ``SYSTEM.BASE.TOPIC``, not sent).

    Raises:
        whatever the request raised (``ADMIN_ERRORS`` are the documented ones).
    """
    a = request.args
    op = request.op
    if op == "subscribe":
        record = subscribe(
            client,
            qm,
            a["topic_filter"],
            a["client_id"],
            a["durable_name"],
            shared=a["shared"],
            selector=a["selector"],
            no_local=a["no_local"],
            topic_object=a.get("topic_object"),
        )
        return "made:" + record.sub_id
    if op == "unsubscribe":
        unsubscribe(client, qm, a["sub_id"])
        return "removed"
    if op in ("link", "unlink", "unlink_all"):
        if touches_good(a["source"], scheme) or touches_good(a.get("target"), scheme):
            return "skipped"
        if op == "link":
            link(client, qm, a["source"], a["target"], backward=a["backward"])
        elif op == "unlink":
            unlink(client, qm, a["source"], a["target"])
        else:
            unlink_all(client, qm, a["source"])
        return "done"
    if op == "define":
        if touches_good(a["topic_string"], scheme):
            return "skipped"
        define(client, qm, a["name"], a["topic_string"], Attributes(**a["attributes"]), replace=a["replace"])
        return "done"
    if op == "alter":
        if a["name"] == BASE:
            return "skipped"
        alter(client, qm, a["name"], **a["changes"])
        return "done"
    if op == "delete":
        delete(client, qm, a["name"])
        return "done"
    if op == "apply":
        objects = []
        for item in a["objects"]:
            if not isinstance(item, dict):  # a file like that is refused by load_file
                return "skipped"
            item = dict(item)
            name, topic_string = item.pop("name", "T1"), item.pop("topic_string", "x")
            if name == BASE or touches_good(topic_string, scheme):
                return "skipped"
            objects.append(TopicObject(name=name, topic_string=topic_string, attributes=Attributes(**item)))
        apply(client, qm, objects)
        return "done"
    if op == "declare":
        declare(client, qm, a["topic"])
        return "done"
    if op == "undeclare":
        undeclare(client, qm, a["topic"])
        return "done"
    raise ValueError(f"unknown request {op!r}")


def snapshot(client: redis.Redis, qm: str, watched: list[str]) -> tuple[Any, ...]:
    """What an administrative request may change: the number of keys, every record hash, the
    version, and the exact contents (``DUMP``) of ``watched`` keys."""
    pipe = client.pipeline(transaction=True)
    pipe.dbsize()
    for key in (keys.subscriptions(qm), keys.links(qm), keys.topic_objects(qm), keys.declared_topics(qm)):
        pipe.hgetall(key)
    pipe.hgetall(keys.manager(qm))
    pipe.get(keys.version(qm))
    for key in watched:
        pipe.dump(key)
    return tuple(pipe.execute())


# --------------------------------------------------------------------------
# Records written by hand


def _junk_json(r: R) -> bytes:
    return r.choice(
        (
            b"",
            b"{",
            b"null",
            b"1e999",
            b"[]",
            b'"x"',
            b"[" * r.choice((100, 5_000, 100_000)),
            b'{"a": ' * 3_000,
            b"\xff\xfe",
            b'{"\xff": 1}',
            b'{"filter": "\\ud800"}',
            junk_bytes(r, 32),
        )
    )


def corrupt_record(r: R, scheme: str, qm: str = "QM1") -> tuple[str, bytes | None, bytes]:
    """A record written by hand into a hash the workers read, or the network record.

    Returns:
        ``(what, field, value)``: ``what`` one of ``subs``, ``links``, ``topics``, ``declared``,
        ``proxies``, ``cluster_topics`` (a hash field) or ``network`` (the string; field None).
    """
    what = r.choice(("subs", "links", "topics", "declared", "proxies", "cluster_topics", "network"))
    junk = r.random() < 0.5
    value: bytes
    field_: bytes | None
    if what == "subs":
        field_ = r.choice((b"rec$a", b"rec$b:p3", b"\xff$x", b"nodollar", b"", b"rec$" + junk_bytes(r, 6)))
        record: dict[str, Any] = {
            "filter": r.choice((random_filter(r, scheme), 5, None, "junk/#", "junk")),
            "durable": r.choice((True, "yes", 1)),
            "created_ms": r.choice((0, "x", 1.5, 10**30)),
        }
        if r.random() < 0.5:
            record["selector"] = r.choice((garbage_selector(r), valid_selector(r, 1), 5))
        if r.random() < 0.3:
            record["mode"] = r.choice(("shared", "bogus", None))
        value = _junk_json(r) if junk else json.dumps(record).encode()
    elif what == "links":
        field_ = _encode(random_topic(r, scheme))
        targets = {random_topic(r, scheme): r.choice((True, False, 1, None))}
        value = _junk_json(r) if junk else json.dumps(targets).encode()
    elif what == "topics":
        field_ = _encode(r.choice(("REC1", "a b", "X" * 49, text(r, 6))))
        obj: dict[str, Any] = {"topic_string": r.choice((random_topic(r, scheme), 5, None, ""))}
        if r.random() < 0.5:
            obj["attributes"] = attributes(r)
        value = _junk_json(r) if junk else json.dumps(obj).encode()
    elif what == "declared":
        field_ = _encode(random_topic(r, "swiftmq")) if r.random() < 0.8 else junk_bytes(r, 8)
        value = _junk_json(r)
    elif what == "proxies":
        field_ = junk_bytes(r, 10)
        proxy = {
            "qm": r.choice(("QM2", qm, 5)),
            "topic": r.choice(("junk", "#", "junk/#", "junk.a")),
            "source": r.choice(("dynamic", "static", "x")),
            "at": r.choice((qm, "QM2")),
            "since_ms": r.choice((1, "x", [], 1e300)),
        }
        value = _junk_json(r) if junk else json.dumps(proxy).encode()
    elif what == "cluster_topics":
        field_ = _encode(random_topic(r, scheme)) if r.random() < 0.7 else junk_bytes(r, 8)
        copy = {"cluster": r.choice(("C1", 5)), "hosts": r.choice((["QM2"], 5, {"a": 1}, "ab"))}
        value = _junk_json(r) if junk else json.dumps(copy).encode()
    else:
        field_ = None
        value = _junk_json(r) if junk else json.dumps(network_toml(r, qm)).encode()
    if GOOD.encode() in value:
        value = value.replace(GOOD.encode(), b"gxod")
    if field_ is not None and (field_.startswith(GOOD.encode()) or field_ == b""):
        field_ = b"x" + field_
    return what, field_, value


def network_set(r: R, scheme: str, qm: str) -> list[tuple[str, bytes | None, bytes]]:
    """Records that put ``qm`` in a network and make it forward: the network (``qm`` with a parent
    and cluster peers), proxy subscriptions held for the others, cluster topic copies (their
    hosts sometimes not names) and a cluster topic object; each in the shape ``corrupt_record``
    returns. Publications then take ``broker.topics.routing``'s forwarding path, with junk along it."""
    sep = "/" if scheme == "mqtt" else "."
    network = {
        "announce": r.choice(("root", "topic")),
        "queue_managers": {
            qm: {"parent": "QM2", "clusters": ["C1"]},
            "QM2": {},
            "QM3": {"clusters": ["C1"], "parent": r.choice(("QM2", None))},
        },
    }
    if network["queue_managers"]["QM3"]["parent"] is None:  # type: ignore[index]
        del network["queue_managers"]["QM3"]["parent"]  # type: ignore[attr-defined]
    found: list[tuple[str, bytes | None, bytes]] = [("network", None, json.dumps(network).encode())]
    for dest in ("QM2", "QM3"):
        key = r.choice(("junk", "#", f"junk{sep}+", "$SYS", text(r, 4)))
        proxy = {"qm": dest, "topic": key, "source": r.choice(("dynamic", "static")), "at": qm}
        found.append(
            ("proxies", f"{dest} dynamic {key}".encode("utf-8", "surrogatepass"), json.dumps(proxy).encode())
        )
    hosts = r.choice((["QM3"], [qm, "QM3"], [1, "QM3"], [None], [["x"]], []))
    copy = {"cluster": "C1", "clroute": r.choice(("DIRECT", "TOPICHOST", "x")), "hosts": hosts}
    found.append(("cluster_topics", b"junk", json.dumps(copy).encode()))
    clustered = {
        "topic_string": "junk",
        "attributes": {"cluster": "C1", "clroute": r.choice(("DIRECT", "TOPICHOST"))},
    }
    found.append(("topics", b"RECCL", json.dumps(clustered).encode()))
    return found


def record_key(qm: str, what: str) -> str:
    """The key a ``corrupt_record`` goes to."""
    found: dict[str, Callable[[str], str]] = {
        "subs": keys.subscriptions,
        "links": keys.links,
        "topics": keys.topic_objects,
        "declared": keys.declared_topics,
        "proxies": keys.proxies,
        "cluster_topics": keys.cluster_topics,
        "network": keys.network,
    }
    return found[what](qm)


# --------------------------------------------------------------------------
# Dead letters


_REASONS = (
    ("internal error", "internal error"),
    ("missing field", "missing field"),
    ("not valid UTF-8", "not UTF-8"),
    ("lone surrogate", "not UTF-8"),
    ("'publisher'", "publisher"),
    ("larger than the limit", "body too large"),
    ("'priority'", "priority"),
    ("'expiration'", "expiration"),
    ("'seq'", "seq"),
    ("'ts'", "ts"),
    ("'persistent'", "persistent"),
    ("'reply'", "reply"),
    ("'props'", "props"),
    ("'origin' and 'route'", "origin/route"),
    ("wildcard", "topic: wildcard"),
    ("control character", "topic: control character"),
    ("null character", "topic: null character"),
    ("at least one character", "topic: empty"),
    ("bytes long in UTF-8", "topic: too long"),
    ("node must not be empty", "topic: empty node"),
    ("root node", "topic: predicate root"),
    ("node '", "topic: bad predicate"),
    ("is disabled", "topic object: PUB(DISABLED)"),
    ("foreign key", "foreign key"),
    ("subscription unavailable", "subscription unavailable"),
    ("full", "queue full (MAXDEPTH)"),
    ("max_deliveries", "workers died on it"),
)


def reason_class(reason: str) -> str:
    """The class of a dead letter's reason (``dlq.reason``), for counting."""
    for fragment, name in _REASONS:
        if fragment in reason:
            return name
    return "other"
