"""The message model and the envelope subscribers pop (the stream entry it travels in:
``broker.core.entries``).

The wire formats are documented in ``broker.core.keys`` (``keys.PROTOCOL_VERSION``). The
worker's hot path uses ``broker.core.entries.parse_entry`` and ``encode_envelope`` on plain dicts;
``Message`` (pydantic) is what the Python publisher takes and the subscriber
returns.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.core import clock, keys, wire
from broker.core.errors import InvalidMessage

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


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def set_header(header: dict[str, Any], name: str, value: Any) -> None:
    """Set a header field, keeping ``props`` last (``lua/lib.lua``'s ``envelope_head`` relies on it);
    a value at its default (persistent true, priority 4, expiration 0) is left out."""
    props = header.pop("props", None)
    header.pop(name, None)
    if (name, value) not in (("persistent", True), ("priority", keys.DEFAULT_PRIORITY), ("expiration", 0)):
        header[name] = value
    if props is not None:
        header["props"] = props


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
        header: the header fields (``broker.core.entries.Entry.header``).
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
