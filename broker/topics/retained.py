"""Retained publications: the last retained publication of each topic string, and what a new
subscription receives of them.

What we follow (issue 28 row 10):

- **Keeping** (IBM MQ ``MQPMO_RETAIN``; MQTT 5 §3.3.1.3 RETAIN): a publication with ``retain 1``
  is delivered as any other, and its envelope becomes its topic string's retained publication,
  replacing the one before, in the same unit of work as its delivery (``lua/library/commit.lua``, option
  ``retain``; the hash ``{qm}:retained``, ``broker.core.keys.retained``). Kept whether or not a
  subscription matched it. A duplicate, expired or refused publication changes nothing.
- **Clearing**: a retained publication with an empty body removes its topic's retained
  publication and is not kept (MQTT 5 §3.3.1.3: "a zero byte retained message MUST NOT be stored";
  IBM MQ does the same for a zero-length retained publication). It is still delivered to the
  subscriptions that match it, as MQTT says ("processed as normal"). ``broker retained clear``
  (IBM MQ ``CLEAR TOPICSTR CLRTYPE(RETAINED)``) removes one or all.
- **A new subscription** receives the retained publications of every topic its filter matches
  (a wildcard filter: each matching topic's), in the transaction that creates it
  (``broker.topics.subscriptions.subscribe``), each flagged ``"retained": true`` in its envelope
  header (``Message.retained``; IBM MQ's ``MQIsRetained`` property, MQTT's RETAIN 1 on a message
  sent for a new subscription). Delivered as published otherwise they are not flagged (MQTT 5
  without Retain As Published; IBM MQ sets ``MQIsRetained`` only on a publication sent from the
  retained store). Its selector and no-local apply; an expired one is not sent (MQTT 5
  §3.3.2.3.3). Attaching to an existing subscription sends nothing (IBM MQ: ``MQSO_RESUME``; MQTT 5
  Retain Handling 1), nor does a shared subscription (MQTT 5 §4.8.2). ``retained=False``
  (``broker subscribe --no-retained``) asks for none: MQTT 5 Retain Handling 2, IBM MQ
  ``MQSO_NEW_PUBLICATIONS_ONLY``.

Not followed: retained publications are not forwarded to other queue managers of a network, links
and topic objects (WILDCARD(BLOCK)) do not apply to the retained set, and there is no
``MQSO_PUBLICATIONS_ON_REQUEST`` (MQSUBRQ).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import clock, hierarchy, keys, topic_rules, wire
from broker.core.connection import KEEP, read_hash
from broker.core.entries import selector_properties
from broker.core.errors import InvalidMessage, translate_errors
from broker.core.models import Message, decode_envelope, header_timestamp_ms, retained_envelope
from broker.core.schemes import recorded_scheme
from broker.core.selectors import compile_selector


@dataclass(frozen=True, slots=True)
class RetainedPublication:
    """One topic string's retained publication.

    Attributes:
        topic: the topic string.
        message: the publication as kept (None when the stored value is not an envelope).
        size_bytes: the stored envelope's size, bytes.
    """

    topic: str
    message: Message | None
    size_bytes: int


def _matches(scheme: str, topic_filter: str, topic: str) -> bool:
    """Whether ``topic_filter`` (a subscription's, without ``$share``) matches ``topic`` under ``scheme``."""
    try:
        if scheme == "swiftmq":
            return hierarchy.matches(topic_filter, topic)
        return topic_rules.matches(topic_filter, topic)
    except Exception:  # a kept topic the scheme refuses (another scheme's): no match
        return False


def for_subscription(
    stored: dict[str, bytes],
    qm: str,
    sub_id: str,
    topic_filter: str,
    scheme: str,
    selector: str = "",
    no_local: bool = False,
    now_ms: int | None = None,
) -> list[tuple[str, bytes]]:
    """The retained publications a new subscription receives, flagged, with the band of each.

    Args:
        stored: ``{topic: envelope}`` as read from ``{qm}:retained``.
        qm: the queue manager.
        sub_id: the new subscription's id (its bands and client id).
        topic_filter: its filter (without ``$share``).
        scheme: the queue manager's topic scheme (``mqtt`` or ``swiftmq``).
        selector: its selector ("" for none); one that fails on a publication does not select it.
        no_local: leave out publications whose ``client_id`` is the subscription's client id.
        now_ms: the time, ms since the epoch (an expired publication is left out); None: now.

    Returns:
        ``[(priority band key, envelope with "retained": true)]``, by topic string. A stored value
        that is not an envelope is left out.
    """
    now = clock.now_ms() if now_ms is None else now_ms
    compiled = compile_selector(selector) if selector else None
    client_id = sub_id.partition("$")[0]
    out = []
    for topic in sorted(stored):
        if not _matches(scheme, topic_filter, topic):
            continue
        envelope = stored[topic]
        try:
            header, _ = decode_envelope(envelope)
            expiration = header.get("expiration", 0)
            if isinstance(expiration, int) and 0 < expiration <= now:
                continue
            if no_local and header.get("client_id") == client_id:
                continue
            if compiled is not None:
                properties = selector_properties(header, header_timestamp_ms(header))
                if not compiled.matches(properties):
                    continue
            priority = header.get("priority", keys.DEFAULT_PRIORITY)
            if not wire.is_priority(priority):
                continue
            flagged = retained_envelope(envelope)
        except (InvalidMessage, KeyError, TypeError, ValueError):
            continue
        out.append((keys.sub_band(qm, sub_id, priority), flagged))
    return out


@dataclass
class NewSubscription:
    """The retained publications a subscription being made receives (``subscribe``): read in its
    transaction's decide step (``prepare``), pushed with its change (``push``).

    Attributes:
        qm, sub_id, topic_filter, scheme, selector, no_local: the subscription (``for_subscription``).
        wanted: it receives them (False: ``retained=False``, or a shared subscription).
        sends: ``[(band, flagged envelope)]`` found by the last ``prepare``.
        bell: its bell to ring (the bell was absent), or "".
    """

    qm: str
    sub_id: str
    topic_filter: str
    scheme: str
    selector: str = ""
    no_local: bool = False
    wanted: bool = True
    sends: list[tuple[str, bytes]] = field(default_factory=list)
    bell: str = ""

    def prepare(self, pipe: Any, value: Any) -> Any:
        """When ``value`` (what ``subscribe``'s decision writes) makes the subscription, watch
        ``{qm}:retained`` and read what it receives, through ``pipe`` (a pipeline watching, before
        MULTI: each read executes at once). Returns ``value``.

        Raises:
            ForeignKey: ``{qm}:retained`` holds another type.
        """
        self.sends, self.bell = [], ""
        if value is KEEP or not self.wanted:
            return value
        pipe.watch(keys.retained(self.qm))
        stored = read_stored(pipe, self.qm)
        self.sends = for_subscription(
            stored, self.qm, self.sub_id, self.topic_filter, self.scheme, self.selector, self.no_local
        )
        bell = keys.sub_bell(self.qm, self.sub_id)
        self.bell = bell if self.sends and wire.lenient_text(pipe.type(bell)) == "none" else ""
        return value

    def push(self, pipe: Any) -> None:
        """Queue the pushes (after MULTI): each envelope onto its band, and the bell."""
        for band, envelope in self.sends:
            pipe.lpush(band, envelope)
        if self.bell:
            pipe.rpush(self.bell, "1")


def read_stored(pipe: Any, qm: str) -> dict[str, bytes]:
    """``{topic: envelope}`` of ``{qm}:retained`` read through ``pipe`` (a client, or a pipeline
    that executes at once while watching); a topic that is not UTF-8 is left out.

    Raises:
        ForeignKey: the key holds another type.
    """
    raw = read_hash(pipe, keys.retained(qm))
    out = {}
    for topic, envelope in raw.items():
        text = wire.utf8_or_none(topic)
        if text is not None:
            out[text] = envelope
    return out


@translate_errors
def list_retained(
    client: redis.Redis, qm: str, topic_filter: str | None = None, *, topic: str | None = None
) -> list[RetainedPublication]:
    """The retained publications of ``qm``, by topic string.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        topic_filter: only the topics this filter matches (the queue manager's scheme); None for all.
        topic: only this topic string's (one ``HGET``); None for all.

    Raises:
        ForeignKey: ``{qm}:retained`` holds another type.
    """
    key = keys.retained(qm)
    if topic is not None:
        try:
            one = client.hget(key, topic)
        except redis.ResponseError:
            read_hash(client, key)  # names the foreign key
            raise
        stored = {topic: one} if one is not None else {}
    else:
        stored = {wire.lenient_text(t): envelope for t, envelope in read_hash(client, key).items()}
    scheme = recorded_scheme(client, qm) if topic_filter is not None else None
    out = []
    for name, envelope in sorted(stored.items()):
        if scheme is not None and topic_filter is not None and not _matches(scheme, topic_filter, name):
            continue
        raw = envelope if isinstance(envelope, bytes) else str(envelope).encode()
        try:
            message: Message | None = Message.from_envelope(raw)
        except InvalidMessage:
            message = None
        out.append(RetainedPublication(name, message, len(raw)))
    return out


@translate_errors
def clear_retained(client: redis.Redis, qm: str, topic: str | None = None) -> int:
    """Remove the retained publication of ``topic`` (IBM MQ ``CLEAR TOPICSTR CLRTYPE(RETAINED)``),
    or every one when ``topic`` is None.

    Returns:
        How many were removed.

    Raises:
        ForeignKey: ``{qm}:retained`` holds another type.
    """
    key = keys.retained(qm)
    if topic is not None:
        return int(client.hdel(key, topic))
    with client.pipeline(transaction=True) as pipe:
        pipe.hlen(key)
        pipe.delete(key)
        count, _ = pipe.execute()
    return int(count)


@translate_errors
def count_retained(client: redis.Redis, qm: str) -> int:
    """How many topic strings have a retained publication (``broker status``).

    Raises:
        ForeignKey: ``{qm}:retained`` holds another type.
    """
    return int(client.hlen(keys.retained(qm)))
