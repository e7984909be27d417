"""The wire codec: how values read from (and written to) Redis become text, publisher ids,
priorities and publication results. Each rule lives here once; its callers import it.

Text read from Redis comes in four ways, on purpose different (a client made by
``broker.core.connection.connect`` never decodes, so every reply is bytes):

- ``text``: strict UTF-8, for what the broker wrote itself (key types, ids, names it
  checked on the way in); bytes that are not UTF-8 raise ``UnicodeDecodeError``.
- ``lenient_text``: UTF-8 with ``errors="replace"``, for what is only shown or compared
  (a record an operator may have written by hand holds any bytes; it is never stored again).
- ``exact_text``: UTF-8 with ``errors="surrogateescape"``, for a name a key is built from
  again (a publisher id, a proxy field): its bytes round-trip through ``connect``'s client.
- ``utf8_or_none``: None when the bytes are not UTF-8 (a dead letter's field, shown as hex).

Publisher ids (the ``publisher`` field; ``is_publisher_id``, ``publisher_fifo``): 1 to
``MAX_PUBLISHER_BYTES`` bytes, any bytes. ``broker/lua/lib.lua``'s ``publisher_of`` keeps a
twin of ``publisher_fifo`` (a script cannot import Python); ``tests/unit/test_wire.py``
checks both on one table of good and bad ids on a real server.

Broker-only fields (``BROKER_ONLY_FIELDS``, ``BROKER_ONLY_PREFIX``, ``is_broker_only``): the fields of a
publication entry only the broker sets. ``dequeue.lua`` drops them from every entry it moves out of
an ingress stream; ``lib.lua``'s ``broker_only`` is the twin, checked by ``tests/unit/test_wire.py``.

In ``broker.core``, below ``connection``: imports ``broker.core.keys`` and ``broker.core.errors`` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from broker.core import keys
from broker.core.errors import InvalidMessage

#: Most bytes of a publisher id (the ``publisher`` field); ``dequeue.lua`` is passed it
#: (ARGV[9]) and files an entry with a longer or empty id as ``keys.MALFORMED_PUBLISHER``.
MAX_PUBLISHER_BYTES = 256

#: Priorities a publication may carry (Jakarta Messaging §3.4.10: 0 lowest to 9 highest);
#: the default, ``keys.DEFAULT_PRIORITY``, is the band the subscriber queue itself holds.
MIN_PRIORITY = 0
MAX_PRIORITY = 9

#: Publication fields only the broker may set: ``principal`` (the queue mutex, from the ingress
#: stream an entry came by), ``origin`` and ``route`` (a channel's mover, ``broker.network.mover``).
#: An entry a principal wrote to its ingress stream loses them (``dequeue.lua``), so a publisher
#: cannot claim another principal or a path through other queue managers (issue 27).
BROKER_ONLY_FIELDS = ("principal", "origin", "route")
#: Fields starting with it are the dead-letter queue's own (``dlq.principal`` says which ingress
#: stream a replay goes back to), dropped from an ingress entry as well.
BROKER_ONLY_PREFIX = "dlq."


def text(raw: Any) -> str:
    """``raw`` as text: bytes decoded as strict UTF-8, None as "", anything else ``str(raw)``.

    Raises:
        UnicodeDecodeError: bytes that are not UTF-8.
    """
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    return "" if raw is None else str(raw)


def lenient_text(raw: Any) -> str:
    """``raw`` as text to show or compare: bytes decoded as UTF-8 with each bad byte replaced
    (U+FFFD), None as "", anything else ``str(raw)``. Never raises."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return "" if raw is None else str(raw)


def exact_text(raw: Any) -> str:
    """``raw`` as text that encodes back to the same bytes (``surrogateescape``): a name a key
    is built from again. None as "", anything else ``str(raw)``. Never raises."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "surrogateescape")
    return "" if raw is None else str(raw)


def utf8_or_none(raw: bytes | None) -> str | None:
    """``raw`` as UTF-8 text, or None when absent or not UTF-8."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def field_text(fields: dict[bytes, bytes], name: bytes, required: bool = False) -> str | None:
    """A publication entry's field as strict UTF-8 text, or None when absent.

    Raises:
        InvalidMessage: the field is absent and ``required``, or it is not UTF-8.
    """
    raw = fields.get(name)
    if raw is None:
        if required:
            raise InvalidMessage(f"missing field {name.decode()!r}")
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"field {name.decode()!r} is not valid UTF-8") from exc


def is_publisher_id(publisher_id: str | bytes) -> bool:
    """Whether ``publisher_id`` is 1 to ``MAX_PUBLISHER_BYTES`` bytes (a str counts its UTF-8
    bytes, a lone surrogate as three: ``surrogatepass``)."""
    if isinstance(publisher_id, str):
        publisher_id = publisher_id.encode("utf-8", "surrogatepass")
    return 0 < len(publisher_id) <= MAX_PUBLISHER_BYTES


def publisher_fifo(raw: bytes | None) -> str:
    """The FIFO an entry is filed under, from its ``publisher`` field as read: the id (its bytes
    round-trip: ``surrogateescape``), or ``keys.MALFORMED_PUBLISHER`` when the field is absent,
    empty or longer than ``MAX_PUBLISHER_BYTES``. ``lib.lua``'s ``publisher_of`` is its twin."""
    if raw is None or not 0 < len(raw) <= MAX_PUBLISHER_BYTES:
        return keys.MALFORMED_PUBLISHER
    return raw.decode("utf-8", "surrogateescape")


def publisher_bytes(publisher_id: str) -> bytes:
    """A publisher id back as the bytes Redis holds (ids that were not UTF-8 round-trip)."""
    return publisher_id.encode("utf-8", "surrogateescape")


def is_broker_only(name: str | bytes) -> bool:
    """Whether a publication field ``name`` is one only the broker may set (``BROKER_ONLY_FIELDS``,
    or it starts with ``BROKER_ONLY_PREFIX``); ``lib.lua``'s ``broker_only`` is its twin."""
    text_name = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
    return text_name in BROKER_ONLY_FIELDS or text_name.startswith(BROKER_ONLY_PREFIX)


def is_priority(priority: int) -> bool:
    """Whether ``priority`` is one a publication may carry, ``MIN_PRIORITY`` to ``MAX_PRIORITY``."""
    return MIN_PRIORITY <= priority <= MAX_PRIORITY


@dataclass(frozen=True)
class Reply:
    """A publication's result as a worker posts it on its reply list (``keys.reply``), the JSON
    object ``commit.lua`` (and ``lib.lua``'s refusals) write with ``cjson.encode``.

    Attributes:
        status: "delivered", "duplicate", "expired" or "refused".
        entry_id: the publish stream entry id, or None when the reply names none.
        subscriptions: how many subscriber queues received it.
        reason: why it was refused, or None.
        suggestion: a corrected topic, or None.
        flow_control_delay_ms: the delay the broker asks of the publisher, ms (the raw value:
            ``broker.flow.parse_delay`` reads it).
        forwarded: how many channels it was forwarded on.
    """

    status: str
    entry_id: str | None
    subscriptions: int
    reason: str | None
    suggestion: str | None
    flow_control_delay_ms: Any
    forwarded: int


def parse_reply(raw: bytes | str) -> Reply:
    """Decode a reply list's element (JSON text) into a ``Reply``.

    Raises:
        ValueError: not JSON; KeyError: no ``status``.
    """
    data = json.loads(raw)
    return Reply(
        status=data["status"],
        entry_id=data.get("entry_id"),
        subscriptions=int(data.get("subscriptions", 0)),
        reason=data.get("reason"),
        suggestion=data.get("suggestion"),
        flow_control_delay_ms=data.get("flow_control_delay_ms"),
        forwarded=int(data.get("forwarded", 0)),
    )
