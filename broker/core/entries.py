"""The stream entry: a publication request read from the publish stream, checked field by field
(``parse_entry``), with the topic object's defaults applied (``apply_topic_defaults``).

The entry's wire format is documented in ``broker.core.keys`` (``keys.PROTOCOL_VERSION``). This
is the worker's hot path (``worker.decide``): plain dicts in, the envelope header out, ready for
``broker.core.models.encode_envelope``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, NoReturn

from broker.core import keys, wire
from broker.core.errors import InvalidMessage, shown
from broker.core.models import (
    _DELIVERY_TIME,
    _INT64_MAX,
    _INT64_MIN,
    _QM_NAME,
    GROUP_ID,
    GROUPED_FIELD,
    set_header,
)
from broker.core.wire import field_text


@dataclass(slots=True)
class Entry:
    """A publication request read from the stream and checked field by field.

    ``header`` is the envelope header, ready to encode. ``msgid`` is the ``msgid`` field's
    bytes as sent, decoded with ``surrogateescape`` (a msgid that is not UTF-8 round-trips:
    its dedup record and reply key are those the publisher names); the header carries it as
    JSON text can, each byte that is not UTF-8 as U+FFFD, and then its bytes as ``msgid_hex``.
    """

    entry_id: str
    publisher: str
    msgid: str
    msgid_given: bool
    topic: str
    body: bytes
    reply: bool
    expiration_ms: int
    header: dict[str, Any]
    client_id: str | None = None
    #: publish time, ms since the epoch (the ``ts`` field, else the entry id's ms)
    timestamp_ms: int = 0
    #: ``retain 1``: kept as its topic's retained publication (an empty body clears it)
    retain: bool = False

    def selector_properties(self) -> dict[str, object]:
        """What a selector sees (Jakarta Messaging §3.8.1.1): user properties and the header fields.

        ``JMSDeliveryMode`` ('PERSISTENT' / 'NON_PERSISTENT'), ``JMSPriority``,
        ``JMSMessageID``, ``JMSTimestamp``, and ``JMSCorrelationID`` and
        ``JMSType`` when set; user properties are looked up under their own names.
        """
        return selector_properties(self.header, self.timestamp_ms)


def selector_properties(header: dict[str, Any], timestamp_ms: int) -> dict[str, object]:
    """What a selector sees of a publication with envelope header ``header`` published at
    ``timestamp_ms`` (ms since the epoch): ``Entry.selector_properties``, for an envelope kept
    (a retained publication a new subscription receives)."""
    found: dict[str, object] = dict(header.get("props") or {})
    found["JMSDeliveryMode"] = "PERSISTENT" if header.get("persistent", True) else "NON_PERSISTENT"
    found["JMSPriority"] = header.get("priority", keys.DEFAULT_PRIORITY)
    found["JMSMessageID"] = header["msgid"]  # as the subscriber sees it
    found["JMSTimestamp"] = timestamp_ms
    if "correlation_id" in header:
        found["JMSCorrelationID"] = header["correlation_id"]
    if "type" in header:
        found["JMSType"] = header["type"]
    return found


def _int(fields: dict[bytes, bytes], name: bytes, default: int | None) -> int | None:
    text = field_text(fields, name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError as exc:
        raise InvalidMessage(f"field {name.decode()!r} is not an integer: {shown(text)}") from exc
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise InvalidMessage(f"field {name.decode()!r} is outside the signed 64-bit range")
    return value


def _int_field(fields: dict[bytes, bytes], name: bytes) -> int | None:
    """``_int(fields, name, None)``, with the common case (ASCII digits, in range) read straight from
    the bytes; anything else (absent, empty, not a number, out of range, other digits) goes to
    ``_int``, which decides and raises as before."""
    raw = fields.get(name)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return _int(fields, name, None)
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    return _int(fields, name, None)


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not JSON")


def _properties(text: str) -> dict[str, Any]:
    """The ``props`` field: a JSON object of scalar values, each one the envelope can carry as it is.

    Raises:
        InvalidMessage: not JSON (``NaN`` and ``Infinity`` are not; nor is nesting deeper than the
            parser's recursion limit), not an object of scalars, an integer outside the signed
            64-bit range, a number too large for a float, or a string with a lone surrogate
            (``"\\ud800"``: it has no UTF-8 form).
    """
    try:
        props = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise InvalidMessage("field 'props' is not JSON") from exc
    if not isinstance(props, dict) or any(isinstance(v, (dict, list)) for v in props.values()):
        raise InvalidMessage("field 'props' must be a JSON object of scalar values")
    for name, value in props.items():
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise InvalidMessage("field 'props' has an integer outside the signed 64-bit range")
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidMessage(f"field 'props': the number of property {shown(name)} is too large")
        for text_ in (name, value):
            if isinstance(text_, str):
                try:
                    text_.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InvalidMessage("field 'props' has a string with a lone surrogate") from exc
    return props


def _undecodable_msgid(given: bytes) -> tuple[str, str, str]:
    """``(msgid, shown msgid, msgid_hex)`` of a msgid that is not UTF-8: the keys take its bytes as
    sent (surrogateescape); JSON text cannot, so it is shown with U+FFFD and its hex is kept."""
    return wire.exact_text(given), wire.lenient_text(given), given.hex()


def _props_field(fields: dict[bytes, bytes], raw: bytes, max_bytes: int | None) -> dict[str, Any]:
    """The ``props`` field ``raw`` (not empty), parsed by ``_properties`` after its size is checked
    against ``max_bytes`` (bytes; None: no limit).

    Raises:
        InvalidMessage: larger than ``max_bytes``, not UTF-8, or as ``_properties``.
    """
    if max_bytes is not None and len(raw) > max_bytes:
        raise InvalidMessage(
            f"properties of {len(raw)} bytes (the 'props' field) are larger than the limit "
            f"of {max_bytes} bytes (max_properties_bytes)"
        )
    text = field_text(fields, b"props")
    assert text is not None
    return _properties(text)


def _route(fields: dict[bytes, bytes], origin: str) -> list[str]:
    """The ``route`` field of an entry forwarded from ``origin``: queue manager names, origin first.

    Raises:
        InvalidMessage: a name is not a queue manager name, or the route does not start with the origin.
    """
    route = (field_text(fields, b"route") or "").split(",")
    if not all(_QM_NAME.match(name) for name in (origin, *route)) or route[0] != origin:
        raise InvalidMessage(
            "fields 'origin' and 'route' must be queue manager names, the route "
            "comma-separated and starting with the origin"
        )
    return route


def _delivery_time(fields: dict[bytes, bytes]) -> int:
    """The ``delivery_time`` field, ms since the epoch (0: absent or empty).

    Raises:
        InvalidMessage: it is not 1-15 ASCII digits (what ``dequeue.lua`` delays).
    """
    text = field_text(fields, b"delivery_time")
    if not text:
        return 0
    if not _DELIVERY_TIME.fullmatch(text):
        raise InvalidMessage(
            f"field 'delivery_time' must be 1-15 digits (ms since the epoch), not {shown(text)}"
        )
    return int(text)


def _retain(fields: dict[bytes, bytes]) -> bool:
    """The ``retain`` field: ``1`` a retained publication; ``0``, empty or absent not.

    Raises:
        InvalidMessage: any other value.
    """
    retain = field_text(fields, b"retain")
    if retain not in (None, "", "0", "1"):
        raise InvalidMessage(f"field 'retain' must be 0 or 1, not {shown(retain)}")
    return retain == "1"


def _client_id(fields: dict[bytes, bytes], header: dict[str, Any], retain: bool) -> str | None:
    """The ``client_id`` field, also put in the header of a retained publication: kept, no-local
    applies to it when a subscription made later receives it (``broker.topics.retained``)."""
    client_id = field_text(fields, b"client_id")
    if retain and client_id is not None:
        header["client_id"] = client_id
    return client_id


#: The fields of most publication entries (``publication_fields`` with no option set): an entry
#: with no other field skips every other field's lookup (``parse_entry``).
_USUAL_FIELDS = frozenset({b"publisher", b"topic", b"body", b"msgid", b"ts", b"seq", b"props"})


def _rare_values(fields: dict[bytes, bytes]) -> tuple[str | None, int, int, str | None]:
    """``(persistent, priority, expiration, reply)`` of an entry with fields beyond the usual ones.

    Raises:
        InvalidMessage: one of them is out of its range.
    """
    persistent = field_text(fields, b"persistent")
    if persistent not in (None, "", "0", "1"):
        raise InvalidMessage(f"field 'persistent' must be 0 or 1, not {shown(persistent)}")
    priority = _int(fields, b"priority", keys.DEFAULT_PRIORITY)
    assert priority is not None
    if not wire.is_priority(priority):
        raise InvalidMessage(f"field 'priority' must be 0-9, not {priority}")
    expiration = _int(fields, b"expiration", 0)
    assert expiration is not None
    if expiration < 0:
        raise InvalidMessage(
            f"field 'expiration' must be >= 0 (ms since the epoch, 0 = never), not {expiration}"
        )
    reply = field_text(fields, b"reply")
    if reply not in (None, "", "0", "1"):
        raise InvalidMessage(f"field 'reply' must be 0 or 1, not {reply[:20]!r}")
    return persistent, priority, expiration, reply


def _rare_header(
    fields: dict[bytes, bytes], header: dict[str, Any], persistent: str | None, priority: int, expiration: int
) -> None:
    """The header fields of an entry's rarer fields, in the envelope's order (``parse_entry``).

    Raises:
        InvalidMessage: a delivery time, origin or route that is not one.
    """
    if persistent == "0":
        header["persistent"] = False
    if priority != keys.DEFAULT_PRIORITY:
        header["priority"] = priority
    if expiration:
        header["expiration"] = expiration
    if delivery_time := _delivery_time(fields):
        header["delivery_time"] = delivery_time
    # carried as given when present; "principal" is set by the queue mutex (an ingress stream's entry)
    for name in ("correlation_id", "reply_to", "type", "principal"):
        value = field_text(fields, name.encode())
        if value is not None:
            header[name] = value
    origin = field_text(fields, b"origin")
    if origin is not None:
        header["origin"] = origin
        header["route"] = _route(fields, origin)


def parse_entry(
    entry_id: str, fields: dict[bytes, bytes], max_body_bytes: int, max_properties_bytes: int | None = None
) -> Entry:
    """Check one stream entry's fields, each decoded on its own.

    The topic is not validated here (the caller does, to send a suggestion).

    Args:
        entry_id: the stream entry id ("<ms>-<n>").
        fields: the entry's fields, bytes to bytes, as read without decoding.
        max_body_bytes: the largest body accepted, in bytes.
        max_properties_bytes: the largest ``props`` field accepted, in bytes (checked
            before it is parsed); None: no limit.

    Returns:
        The parsed ``Entry``.

    Raises:
        InvalidMessage: a field is missing, not UTF-8 (the body and the msgid may be any
            bytes), of the wrong type or out of range, or the body or the properties are
            larger than their limit.
    """
    raw = fields.get(b"publisher")
    if raw is None or not 0 < len(raw) <= wire.MAX_PUBLISHER_BYTES:
        if raw is None:
            raise InvalidMessage("missing field 'publisher'")
        raise InvalidMessage(f"field 'publisher' must be 1-{wire.MAX_PUBLISHER_BYTES} bytes")
    try:
        publisher = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage("field 'publisher' is not valid UTF-8") from exc
    topic = field_text(fields, b"topic", required=True)
    assert topic is not None
    body = fields.get(b"body", b"")
    if len(body) > max_body_bytes:
        raise InvalidMessage(
            f"body of {len(body)} bytes is larger than the limit of {max_body_bytes} bytes (max_body_bytes)"
        )
    given = fields.get(b"msgid")
    msgid_hex: str | None = None
    if not given:
        msgid = shown_msgid = entry_id
    else:
        try:
            msgid = shown_msgid = given.decode("utf-8")
        except UnicodeDecodeError:
            msgid, shown_msgid, msgid_hex = _undecodable_msgid(given)
    ts = _int_field(fields, b"ts")
    received_ms = int(entry_id[: entry_id.index("-")])
    if ts is None:
        ts = received_ms
    seq = _int_field(fields, b"seq")
    if seq is not None and seq < 0:
        raise InvalidMessage(f"field 'seq' must be >= 0, not {seq}")
    # most entries carry only the usual fields: the others are looked for only when one is there
    rare = not _USUAL_FIELDS.issuperset(fields)
    persistent, priority, expiration, reply = (
        _rare_values(fields) if rare else (None, keys.DEFAULT_PRIORITY, 0, None)
    )
    retain = rare and _retain(fields)
    raw_props = fields.get(b"props")
    props = _props_field(fields, raw_props, max_properties_bytes) if raw_props else {}
    header: dict[str, Any] = {
        "v": keys.PROTOCOL_VERSION,
        "msgid": shown_msgid,
        "publisher": publisher,
        "seq": seq,
        "topic": topic,
        "entry_id": entry_id,
    }
    # Optional header fields are left out at their defaults (smaller copies in every queue).
    if ts != received_ms:
        header["ts"] = ts
    if rare:
        _rare_header(fields, header, persistent, priority, expiration)
    if msgid_hex is not None:  # not UTF-8: its bytes, for a channel and any subscriber
        header["msgid_hex"] = msgid_hex
    client_id = _client_id(fields, header, retain) if rare else None
    if props:
        header["props"] = props  # last: lua/lib.lua's envelope_head cuts the header here
        group = props.get(GROUP_ID)
        if type(group) is str and group:  # first: receive.lua reads the envelope's first bytes only
            header = {GROUPED_FIELD: True, **header}
    # positional (Entry's field order): half the cost of keywords, once per publication
    return Entry(
        entry_id,
        publisher,
        msgid,
        bool(given),
        topic,
        body,
        reply == "1",
        expiration,
        header,
        client_id,
        ts,
        retain,
    )


def apply_topic_defaults(entry: Entry, fields: dict[bytes, bytes], attributes: Any) -> None:
    """Apply a topic's effective DEFPSIST, DEFPRTY and CAPEXPRY (``broker.topics.topic_objects``) to an entry.

    A publication that gives no ``persistent`` / ``priority`` field gets the topic's default;
    its expiration is capped at its publish time (``ts``) + CAPEXPRY ms.
    """
    header = entry.header
    if b"persistent" not in fields or fields[b"persistent"] == b"":
        set_header(header, "persistent", attributes["defpsist"] == "YES")
    if b"priority" not in fields or fields[b"priority"] == b"":
        set_header(header, "priority", int(attributes["defprty"]))
    cap = attributes["capexpry"]
    if isinstance(cap, int):
        # a cap past the signed 64-bit range caps nothing; one at or before the epoch has passed
        capped = max(entry.timestamp_ms + cap, 1)
        if capped <= _INT64_MAX and (not entry.expiration_ms or entry.expiration_ms > capped):
            entry.expiration_ms = capped
            set_header(header, "expiration", capped)
