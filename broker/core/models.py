"""The message model, the stream entry it travels in, and the envelope subscribers pop.

The wire formats are documented in ``broker.core.keys`` (``keys.PROTOCOL_VERSION``). The
worker's hot path uses ``parse_entry`` and ``encode_envelope`` on plain dicts;
``Message`` (pydantic) is what the Python publisher takes and the subscriber
returns.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.core import clock, keys, wire
from broker.core.errors import InvalidMessage, shown
from broker.core.wire import field_text

#: User property values: JSON scalars (Jakarta Messaging §3.5 property types, minus byte).
PropertyValue = str | int | float | bool | None

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: The ``delivery_time`` field: ms since the epoch, 1-15 ASCII digits (``dequeue.lua`` reads the same).
_DELIVERY_TIME = re.compile(r"[0-9]{1,15}")
#: The longest delivery delay a publisher may ask for (``delivery_delay_ms``): 365 days, in ms.
MAX_DELIVERY_DELAY_MS = 365 * 24 * 3600 * 1000
#: Queue manager names in ``origin`` / ``route`` (as ``Settings.qm``).
_QM_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


#: The properties of message groups (Jakarta Messaging §3.5.9 JMSX properties): the group's id (a
#: string) and the message's sequence number in it (an int; negative: the group's last).
GROUP_ID = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"
#: The envelope header's first field when the message belongs to a group (a non-empty string
#: ``JMSXGroupID`` property; protocol 7): ``{"grouped":true,"v":7,...``. ``broker_receive``
#: compares the envelope's first bytes with it and looks for the group only then; a header with
#: no group starts ``{"v":7,`` (docs/protocol.md, "Message groups").
GROUPED_FIELD = "grouped"


class Message(BaseModel):
    """A publication as a subscriber receives it (and as a publisher describes it).

    Attributes:
        msgid: the message id; publisher retries with the same id are delivered once. A
            msgid published as bytes that are not UTF-8 (a raw XADD) reads with each such
            byte as U+FFFD (JSON text cannot carry it); dedup and the reply used its bytes.
        msgid_bytes: the message id's bytes as published when they are not UTF-8 (the
            envelope's ``msgid_hex``), else None.
        publisher: the publisher id; order is kept per publisher.
        seq: the publisher's sequence number, or None.
        topic: the topic string it was published on.
        timestamp_ms: publish time, milliseconds since the epoch.
        persistent: Jakarta Messaging delivery mode (True = PERSISTENT).
        priority: 0 (lowest) to 9 (highest), default 4 (Jakarta Messaging §3.4.10).
        expiration_ms: absolute expiry in ms since the epoch; 0 = never.
        delivery_time_ms: Jakarta Messaging ``JMSDeliveryTime`` (2.0 section 3.4.13): the earliest
            time it could be delivered, ms since the epoch, when it was published with a delivery
            delay; 0 = none (its delivery time is its publish time).
        correlation_id: free text carried to subscribers.
        reply_to: free text carried to subscribers.
        message_type: JMSType, free text carried to subscribers.
        properties: user properties, string keys and scalar values.
        body: the body, bytes (binary-safe end to end).
        entry_id: the publish stream entry id, set by the broker.
        origin: the queue manager it was published at, when it came from another one
            over a channel (``broker.topics.topology``); None when published here.
        route: the queue managers it passed through before this one, origin first.
        principal: the ACL user that published it through its ingress stream
            (``broker.core.principals``; Redis enforced it), or None.
        retained: a retained publication (``retain 1``) the subscription received when it was
            made, not as it was published (the envelope's ``retained``; IBM MQ's MQIsRetained
            property, MQTT 5 §3.3.1.3: RETAIN 1 on a message sent for a new subscription).
    """

    model_config = ConfigDict(frozen=True)

    msgid: str
    publisher: str
    seq: int | None = None
    topic: str
    timestamp_ms: int
    persistent: bool = True
    priority: int = Field(default=keys.DEFAULT_PRIORITY, ge=wire.MIN_PRIORITY, le=wire.MAX_PRIORITY)
    expiration_ms: int = Field(default=0, ge=0)
    delivery_time_ms: int = Field(default=0, ge=0)
    correlation_id: str | None = None
    reply_to: str | None = None
    message_type: str | None = None
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    body: bytes = b""
    entry_id: str | None = None
    origin: str | None = None
    route: tuple[str, ...] = ()
    principal: str | None = None
    msgid_bytes: bytes | None = None
    retained: bool = False

    @property
    def group_id(self) -> str | None:
        """The message group it belongs to: its ``JMSXGroupID`` property (Jakarta Messaging §3.5.9),
        or None. On a shared subscription a group's messages all go to one consumer, in order
        (ActiveMQ Classic and Artemis message groups; docs/protocol.md, "Message groups")."""
        group = self.properties.get(GROUP_ID)
        return group if isinstance(group, str) and group else None

    @property
    def group_seq(self) -> int | None:
        """Its sequence number within its group: its ``JMSXGroupSeq`` property, or None; a
        negative one closed the group (ActiveMQ Classic: the group's next message may go to
        another consumer)."""
        seq = self.properties.get(GROUP_SEQ)
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else None

    @classmethod
    def from_envelope(cls, envelope: bytes) -> Message:
        """Decode an envelope popped from a subscriber queue.

        Args:
            envelope: ``<header JSON>\\n<body bytes>``.

        Returns:
            The message.

        Raises:
            InvalidMessage: the envelope is not in the protocol's format.
        """
        header, body = decode_envelope(envelope)
        return cls.from_header(header, body)

    @classmethod
    def from_header(cls, header: dict[str, Any], body: bytes) -> Message:
        """The message of an envelope already split (``decode_envelope``).

        Args:
            header: the header line, decoded (a JSON object).
            body: the body bytes.

        Returns:
            The message.

        Raises:
            InvalidMessage: a header field is missing, of the wrong type or out of its range.
        """
        fast = _from_usual_header(header, body) if cls is Message else None
        if fast is not None:
            return fast
        try:
            return cls._from_header(header, body)
        except KeyError as exc:
            raise InvalidMessage(f"envelope header has no {exc.args[0]!r} field") from exc
        except ValidationError as exc:
            first = exc.errors()[0]
            place = ".".join(str(p) for p in first["loc"])
            raise InvalidMessage(f"envelope header field {place!r}: {first['msg']}") from exc
        except (TypeError, ValueError) as exc:  # e.g. a "route" that is not a list
            raise InvalidMessage(f"envelope header is not in the protocol's format: {exc}") from exc

    @classmethod
    def _from_header(cls, header: dict[str, Any], body: bytes) -> Message:
        return cls(
            msgid=header["msgid"],
            publisher=header["publisher"],
            seq=header.get("seq"),
            topic=header["topic"],
            timestamp_ms=header["ts"] if "ts" in header else header_timestamp_ms(header),
            persistent=header.get("persistent", True),
            priority=header.get("priority", keys.DEFAULT_PRIORITY),
            expiration_ms=header.get("expiration", 0),
            delivery_time_ms=header.get("delivery_time", 0),
            correlation_id=header.get("correlation_id"),
            reply_to=header.get("reply_to"),
            message_type=header.get("type"),
            properties=header.get("props") or {},
            body=body,
            entry_id=header.get("entry_id"),
            origin=header.get("origin"),
            route=tuple(header.get("route") or ()),
            principal=header.get("principal"),
            msgid_bytes=bytes.fromhex(header["msgid_hex"]) if "msgid_hex" in header else None,
            retained=header.get("retained", False),
        )


def header_timestamp_ms(header: dict[str, Any]) -> int:
    """An envelope header's publish time, ms: its ``ts``, or, when it has none (protocol 5: left
    out when equal), the milliseconds of its ``entry_id``.

    Raises:
        KeyError: neither; ValueError, TypeError: a ``ts`` or ``entry_id`` of the wrong form.
    """
    if "ts" in header:
        return int(header["ts"])
    entry_id = header["entry_id"]
    if not isinstance(entry_id, str):
        raise TypeError(f"entry_id {entry_id!r} is not a stream entry id")
    received = entry_id.partition("-")[0]
    if not (received.isascii() and received.isdigit()):
        raise ValueError(f"entry_id {header['entry_id']!r} is not a stream entry id")
    return int(received)


_MESSAGE_FIELDS = frozenset(Message.model_fields)
_DEFAULTS: dict[str, Any] = {name: field.default for name, field in Message.model_fields.items()}
_PROPERTY_TYPES = frozenset({str, int, float, bool, type(None)})
_OPTIONAL_TEXT = (
    ("correlation_id", "correlation_id"),
    ("reply_to", "reply_to"),
    ("message_type", "type"),
    ("entry_id", "entry_id"),
    ("origin", "origin"),
    ("principal", "principal"),
)
_new_object = object.__new__
_set_attribute = object.__setattr__


def _from_usual_header(header: dict[str, Any], body: bytes) -> Message | None:
    """The ``Message`` of an envelope header of the usual shape (what a worker writes), built
    without pydantic's validation; None for any other shape (``Message._from_header`` then
    validates it and names what is wrong).

    "Usual" means every field already has the exact type its ``Message`` field holds
    (``type(x) is int``: no bool for an int, no coercion) and its value is in range, so the
    result equals the validated one field for field (``tests/unit/test_models.py`` checks
    this); about a third of the validated path's cost.
    """
    values = usual_values(header)
    return None if values is None else message_of(values, body)


def usual_values(header: dict[str, Any]) -> dict[str, Any] | None:
    """The checked field values of a header of the usual shape (``_from_usual_header``), the body
    not yet set, or None for any other shape. A consumer checks each envelope it takes with this
    (``broker.clients.consumer``) and makes the message from the values only when it is read
    (``message_of``)."""
    values = _DEFAULTS.copy()
    get = header.get
    msgid, publisher, topic, ts = get("msgid"), get("publisher"), get("topic"), get("ts")
    if (
        type(msgid) is not str
        or type(publisher) is not str
        or type(topic) is not str
        or "msgid_hex" in header
    ):
        return None  # msgid_hex (a msgid that is not UTF-8, rare): the validated path reads it
    if "ts" not in header:  # protocol 5: absent when it is the entry id's milliseconds
        entry_id = get("entry_id")
        if type(entry_id) is not str:
            return None
        received = entry_id.partition("-")[0]
        if not (received.isascii() and received.isdigit()):
            return None
        ts = int(received)
    elif type(ts) is not int:
        return None
    values["msgid"], values["publisher"], values["topic"], values["timestamp_ms"] = (
        msgid,
        publisher,
        topic,
        ts,
    )
    seq = get("seq")
    if seq is not None:
        if type(seq) is not int:
            return None
        values["seq"] = seq
    if "persistent" in header:
        if type(header["persistent"]) is not bool:
            return None
        values["persistent"] = header["persistent"]
    if "priority" in header:
        priority = header["priority"]
        if type(priority) is not int or not wire.is_priority(priority):
            return None
        values["priority"] = priority
    if "expiration" in header:
        expiration = header["expiration"]
        if type(expiration) is not int or expiration < 0:
            return None
        values["expiration_ms"] = expiration
    if "delivery_time" in header:
        delivery_time = header["delivery_time"]
        if type(delivery_time) is not int or delivery_time < 0:
            return None
        values["delivery_time_ms"] = delivery_time
    for name, key in _OPTIONAL_TEXT:
        value = get(key)
        if value is not None:
            if type(value) is not str:
                return None
            values[name] = value
    props = get("props") or {}
    if type(props) is not dict:
        return None
    for value in props.values():  # JSON object keys are always str
        if type(value) not in _PROPERTY_TYPES:
            return None
    values["properties"] = props
    route = get("route") or ()
    if route:
        if type(route) is not list:
            return None
        for hop in route:
            if type(hop) is not str:
                return None
        route = tuple(route)
    values["route"] = route
    if "retained" in header:
        if header["retained"] is not True:
            return None
        values["retained"] = True
    return values


def message_of(values: dict[str, Any], body: bytes) -> Message:
    """The ``Message`` of ``usual_values`` (a fresh dict, kept by the message) and its body:
    what ``BaseModel.model_construct`` does, without its per-field loop."""
    values["body"] = body
    message = _new_object(Message)
    _set_attribute(message, "__dict__", values)
    _set_attribute(message, "__pydantic_fields_set__", set(_MESSAGE_FIELDS))
    _set_attribute(message, "__pydantic_extra__", None)
    _set_attribute(message, "__pydantic_private__", None)
    return message


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


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    publisher = field_text(fields, b"publisher", required=True)
    assert publisher is not None
    if not wire.is_publisher_id(publisher):
        raise InvalidMessage(f"field 'publisher' must be 1-{wire.MAX_PUBLISHER_BYTES} bytes")
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
    ts = _int(fields, b"ts", None)
    received_ms = int(entry_id.split("-", 1)[0])
    if ts is None:
        ts = received_ms
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
    seq = _int(fields, b"seq", None)
    if seq is not None and seq < 0:
        raise InvalidMessage(f"field 'seq' must be >= 0, not {seq}")
    reply = field_text(fields, b"reply")
    if reply not in (None, "", "0", "1"):
        raise InvalidMessage(f"field 'reply' must be 0 or 1, not {reply[:20]!r}")
    retain = _retain(fields)
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
    if msgid_hex is not None:  # not UTF-8: its bytes, for a channel and any subscriber
        header["msgid_hex"] = msgid_hex
    client_id = _client_id(fields, header, retain)
    if props:
        header["props"] = props  # last: lua/lib.lua's envelope_head cuts the header here
        group = props.get(GROUP_ID)
        if type(group) is str and group:  # first: receive.lua reads the envelope's first bytes only
            header = {GROUPED_FIELD: True, **header}
    return Entry(
        entry_id=entry_id,
        publisher=publisher,
        msgid=msgid,
        msgid_given=bool(given),
        topic=topic,
        body=body,
        reply=reply == "1",
        expiration_ms=expiration,
        header=header,
        client_id=client_id,
        timestamp_ms=ts,
        retain=retain,
    )


def set_header(header: dict[str, Any], name: str, value: Any) -> None:
    """Set a header field, keeping ``props`` last (``lua/lib.lua``'s ``envelope_head`` relies on it);
    a value at its default (persistent true, priority 4, expiration 0) is left out."""
    props = header.pop("props", None)
    header.pop(name, None)
    if (name, value) not in (("persistent", True), ("priority", keys.DEFAULT_PRIORITY), ("expiration", 0)):
        header[name] = value
    if props is not None:
        header["props"] = props


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


def retained_envelope(envelope: bytes) -> bytes:
    """A retained publication's envelope as a new subscription receives it: its header with
    ``"retained": true`` (before ``props``, which stays last), the body as it is.

    Raises:
        InvalidMessage: not an envelope (``decode_envelope``).
    """
    header, body = decode_envelope(envelope)
    set_header(header, "retained", True)
    return encode_envelope(header, body)


def encode_envelope(header: dict[str, Any], body: bytes) -> bytes:
    """Build the envelope a subscriber pops: header JSON, a newline, the body.

    Args:
        header: the header fields (``Entry.header``).
        body: the body bytes, appended as they are.

    Returns:
        The envelope bytes.
    """
    return orjson.dumps(header) + b"\n" + body


def decode_envelope(envelope: bytes) -> tuple[dict[str, Any], bytes]:
    """Split an envelope into its header dict and body bytes.

    Raises:
        InvalidMessage: no newline, or the header is not a JSON object (or not UTF-8).
    """
    header = decode_header(envelope)
    return header, envelope[envelope.index(b"\n") + 1 :]


def decode_header(envelope: bytes) -> dict[str, Any]:
    """The header line of an envelope, decoded, without copying its body (a consumer checks
    each envelope it takes with this; ``Message.from_header`` then makes its message).

    Raises:
        InvalidMessage: no newline, or the header is not a JSON object (or not UTF-8).
    """
    end = envelope.find(b"\n")
    if end < 0:
        raise InvalidMessage("envelope has no header line")
    try:
        header = orjson.loads(memoryview(envelope)[:end])
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"envelope header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise InvalidMessage("envelope header is not a JSON object")
    return header


def delivery_time(delivery_delay_ms: int, timestamp_ms: int | None = None) -> int:
    """The delivery time of a publication sent with a delivery delay (Jakarta Messaging 2.0
    section 7.9: the time it is sent plus the delay), ms since the epoch.

    Args:
        delivery_delay_ms: the delay, 0 to ``MAX_DELIVERY_DELAY_MS``, ms.
        timestamp_ms: its publish time, ms since the epoch; default now.

    Raises:
        InvalidMessage: the delay is not an integer, negative or over ``MAX_DELIVERY_DELAY_MS``.
    """
    if type(delivery_delay_ms) is not int or not 0 <= delivery_delay_ms <= MAX_DELIVERY_DELAY_MS:
        raise InvalidMessage(
            f"delivery_delay_ms must be an integer from 0 to {MAX_DELIVERY_DELAY_MS} (365 days), "
            f"not {delivery_delay_ms!r}"
        )
    return (clock.now_ms() if timestamp_ms is None else timestamp_ms) + delivery_delay_ms


def publication_fields(
    publisher: str,
    topic: str,
    body: bytes,
    *,
    msgid: str | None = None,
    seq: int | None = None,
    timestamp_ms: int | None = None,
    persistent: bool | None = None,
    priority: int | None = None,
    expiration_ms: int = 0,
    correlation_id: str | None = None,
    reply_to: str | None = None,
    properties: dict[str, PropertyValue] | None = None,
    reply: bool = False,
    client_id: str | None = None,
    message_type: str | None = None,
    delivery_time_ms: int | None = None,
    retain: bool = False,
) -> dict[str, bytes | str]:
    """Build the fields of one publication entry (``keys.PROTOCOL_VERSION``).

    Args:
        delivery_time_ms: the earliest time the publication may be delivered (Jakarta Messaging
            ``JMSDeliveryTime``), ms since the epoch; None: at once.

    Returns:
        ``{field: value}`` for ``XADD``; optional fields not given (None) are omitted, and
        ``persistent``/``priority`` then take the topic's defaults (1 and 4 without topic objects).

    Raises:
        InvalidMessage: priority out of 0-9, a negative expiration, a number outside the signed
            64-bit range, text that is not UTF-8 (a lone surrogate), or a property value that is
            not a scalar or not a finite number (what the workers would refuse).
    """
    if priority is not None and not wire.is_priority(priority):
        raise InvalidMessage(f"priority must be 0-9, not {priority}")
    if expiration_ms < 0:
        raise InvalidMessage("expiration_ms must be >= 0")
    if delivery_time_ms is not None and (
        type(delivery_time_ms) is not int or not 0 <= delivery_time_ms < 10**15
    ):
        raise InvalidMessage(
            f"delivery_time_ms must be an integer from 0 to 15 digits (ms since the epoch), not {delivery_time_ms!r}"
        )
    texts = {"publisher": publisher, "topic": topic, "msgid": msgid, "correlation_id": correlation_id}
    texts.update(reply_to=reply_to)
    texts.update(client_id=client_id, message_type=message_type)
    texts.update({f"property name {k!r}": k for k in properties or {}})
    texts.update({f"property {k!r}": v for k, v in (properties or {}).items() if isinstance(v, str)})
    for what, value in texts.items():
        if value is not None and not _utf8(value):
            raise InvalidMessage(f"{what} is not UTF-8 text: it has a lone surrogate")
    for what, number in (("seq", seq), ("timestamp_ms", timestamp_ms), ("expiration_ms", expiration_ms)):
        if number is not None and not _INT64_MIN <= number <= _INT64_MAX:
            raise InvalidMessage(f"{what} is outside the signed 64-bit range")
    fields: dict[str, bytes | str] = {"publisher": publisher, "topic": topic, "body": body}
    if msgid is not None:
        fields["msgid"] = msgid
    if seq is not None:
        fields["seq"] = str(seq)
    if timestamp_ms is not None:
        fields["ts"] = str(timestamp_ms)
    # Not given (None): the topic's default applies (DEFPSIST / DEFPRTY, broker.topics.topic_objects).
    if persistent is not None:
        fields["persistent"] = "1" if persistent else "0"
    if priority is not None:
        fields["priority"] = str(priority)
    if expiration_ms:
        fields["expiration"] = str(expiration_ms)
    if delivery_time_ms is not None:
        fields["delivery_time"] = str(delivery_time_ms)
    if correlation_id is not None:
        fields["correlation_id"] = correlation_id
    if reply_to is not None:
        fields["reply_to"] = reply_to
    if message_type is not None:
        fields["type"] = message_type
    if client_id is not None:
        fields["client_id"] = client_id
    if properties:
        if any(isinstance(v, (dict, list)) for v in properties.values()):
            raise InvalidMessage("property values must be scalars")
        if any(isinstance(v, float) and not math.isfinite(v) for v in properties.values()):
            raise InvalidMessage("property values must be finite numbers (JSON has no NaN or Infinity)")
        if any(isinstance(v, int) and not _INT64_MIN <= v <= _INT64_MAX for v in properties.values()):
            raise InvalidMessage("property values must be within the signed 64-bit range")
        fields["props"] = json.dumps(properties, separators=(",", ":"))
    if reply:
        fields["reply"] = "1"
    if retain:
        fields["retain"] = "1"
    return fields
