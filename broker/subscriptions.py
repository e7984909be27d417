"""Subscriptions and the subscriber's reliable pop.

A subscription is a topic filter (MQTT 5 §4.7) and a subscriber queue
``{qm}:sub:<sub id>``. Its id is ``<client id>$<name>`` as in SwiftMQ's durable
subscriptions. A **durable** subscription keeps collecting while its subscriber
is away and lasts until ``unsubscribe``; a non-durable one is removed (with its
queue) when its subscriber closes it.

Every change bumps ``{qm}:version`` in the same MULTI as the change itself. A
worker reads that counter in the same atomic call that dequeues, so a
publication enqueued after ``subscribe`` returned always reaches the new
subscription.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.connection import as_bytes, read_hash, translate_errors
from broker.errors import (
    CorruptRecord,
    InvalidMessage,
    InvalidName,
    InvalidTopicFilter,
    NoSuchSubscription,
    SubscriptionConflict,
)
from broker.models import Message
from broker.topics import validate_filter

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def _check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidName(f"{what} {shown!r} must be 1-128 characters of A-Z a-z 0-9 _ . -")


def check_sub_id(sub_id: str) -> None:
    """Check a subscription id: ``<client id>$<name>``, each part as ``subscribe`` requires.

    Raises:
        InvalidName: it is not. (An id with ``:`` would make a queue key that is
            another subscription's in-flight list.)
    """
    client_id, sep, name = sub_id.partition("$")
    if not sep:
        raise InvalidName(f"subscription id {sub_id[:40]!r} is not <client id>$<name>")
    _check_name("client id", client_id)
    _check_name("subscription name", name)


@dataclass(frozen=True)
class SubscriptionRecord:
    """A subscription as stored in ``{qm}:subs`` (the protocol document, ``broker.keys``).

    Attributes:
        sub_id: ``clientid$name``.
        topic_filter: the MQTT-style filter.
        durable: survives its subscriber going away.
        created_ms: when it was made, ms since the epoch.
    """

    sub_id: str
    topic_filter: str
    durable: bool
    created_ms: int

    def to_json(self) -> str:
        """The JSON stored as the hash value."""
        return json.dumps(
            {"filter": self.topic_filter, "durable": self.durable, "created_ms": self.created_ms},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, sub_id: str, raw: bytes | str, qm: str = "") -> SubscriptionRecord:
        """Parse and check a hash value written by ``to_json`` (or by hand, by another service).

        Raises:
            CorruptRecord: the id or the value cannot be read: not JSON, no valid
                filter, a field of the wrong type.
        """
        key = keys.subscriptions(qm) if qm else "{qm}:subs"
        try:
            check_sub_id(sub_id)
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            topic_filter = data.get("filter")
            if not isinstance(topic_filter, str):
                raise ValueError('"filter" must be a string')
            validate_filter(topic_filter)
            durable = data.get("durable", False)
            created = data.get("created_ms", 0)
            if not isinstance(durable, bool):
                raise ValueError('"durable" must be true or false')
            if not isinstance(created, int) or isinstance(created, bool):
                raise ValueError('"created_ms" must be an integer')
        except InvalidName as exc:
            raise CorruptRecord(key, sub_id, str(exc)) from exc
        except InvalidTopicFilter as exc:
            raise CorruptRecord(key, sub_id, f"invalid filter: {exc.reason}") from exc
        except ValueError as exc:  # json.JSONDecodeError included
            reason = "not JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise CorruptRecord(key, sub_id, reason) from exc
        return cls(sub_id, topic_filter, durable, created)


def parse_subscriptions(qm: str, raw: dict[Any, Any]) -> tuple[list[SubscriptionRecord], list[CorruptRecord]]:
    """Parse the ``{qm}:subs`` hash, skipping records that cannot be read.

    Returns:
        ``(records sorted by id, problems)``.
    """
    records: list[SubscriptionRecord] = []
    problems: list[CorruptRecord] = []
    for raw_id, value in raw.items():
        try:
            sub_id = raw_id.decode("utf-8") if isinstance(raw_id, bytes) else raw_id
        except UnicodeDecodeError:
            problems.append(CorruptRecord(keys.subscriptions(qm), repr(raw_id), "the id is not UTF-8"))
            continue
        try:
            records.append(SubscriptionRecord.from_json(sub_id, value, qm))
        except CorruptRecord as exc:
            problems.append(exc)
    records.sort(key=lambda r: r.sub_id)
    return records, problems


@translate_errors
def read_subscriptions(client: redis.Redis, qm: str) -> tuple[list[SubscriptionRecord], list[CorruptRecord]]:
    """Every subscription that can be read, and the records that cannot.

    Raises:
        ForeignKey: ``{qm}:subs`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    return parse_subscriptions(qm, read_hash(client, keys.subscriptions(qm)))


@translate_errors
def subscribe(
    client: redis.Redis, qm: str, topic_filter: str, client_id: str, durable_name: str | None = None
) -> SubscriptionRecord:
    """Create a subscription (or re-attach to a durable one).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        topic_filter: an MQTT-style filter (``+`` one level, ``#`` the rest).
        client_id: the subscriber's client id.
        durable_name: the durable subscription's name; None makes a non-durable
            subscription with a generated name.

    Returns:
        The subscription record; ``sub_id`` names its queue.

    Raises:
        InvalidTopicFilter: the filter is invalid.
        InvalidName: the client id or name has characters other than ``A-Za-z0-9_.-``.
        SubscriptionConflict: the durable subscription exists with another filter.
        CorruptRecord: the stored record of this durable subscription cannot be
            read (``unsubscribe`` removes it).
    """
    validate_filter(topic_filter)
    _check_name("client id", client_id)
    name = durable_name if durable_name is not None else "nd-" + uuid.uuid4().hex[:12]
    _check_name("subscription name", name)
    sub_id = f"{client_id}${name}"
    record = SubscriptionRecord(sub_id, topic_filter, durable_name is not None, int(time.time() * 1000))
    subs_key = keys.subscriptions(qm)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(subs_key)
                existing = pipe.hget(subs_key, sub_id)
                if existing is not None:
                    try:
                        old = SubscriptionRecord.from_json(sub_id, existing, qm)
                    except CorruptRecord as exc:
                        raise CorruptRecord(exc.key, sub_id, f"{exc.reason}; unsubscribe it first") from exc
                    if old.topic_filter != topic_filter:
                        raise SubscriptionConflict(
                            f"durable subscription {sub_id!r} exists with filter {old.topic_filter!r}; "
                            "unsubscribe it first"
                        )
                    pipe.unwatch()
                    return old
                pipe.multi()
                pipe.hset(subs_key, sub_id, record.to_json())
                pipe.incr(keys.version(qm))
                pipe.execute()
                return record
            except redis.WatchError:
                continue


@translate_errors
def unsubscribe(client: redis.Redis, qm: str, sub_id: str) -> None:
    """Delete a subscription and its queue (and in-flight list); also removes a record that cannot be read.

    Raises:
        NoSuchSubscription: there is no such subscription.
    """
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.subscriptions(qm), sub_id)
    pipe.incr(keys.version(qm))
    pipe.delete(keys.sub_queue(qm, sub_id), keys.sub_inflight(qm, sub_id))
    removed, _, _ = pipe.execute()
    if not removed:
        raise NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {qm!r}")


@translate_errors
def list_subscriptions(client: redis.Redis, qm: str) -> list[SubscriptionRecord]:
    """Every subscription of the queue manager that can be read, sorted by id (see ``read_subscriptions``).

    Raises:
        ForeignKey: ``{qm}:subs`` holds another Redis type.
    """
    return read_subscriptions(client, qm)[0]


@dataclass(frozen=True)
class Delivery:
    """One message taken from a subscriber queue, not yet acknowledged.

    Attributes:
        message: the decoded message.
        raw: the envelope as stored (needed to acknowledge it).
    """

    message: Message
    raw: bytes


class Subscriber:
    """Reads one subscription's queue reliably: take into an in-flight list, then ack.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        record: the subscription (from ``subscribe``).
        recover: move messages left in flight by an earlier subscriber back
            to the queue first, oldest first (default True).
    """

    def __init__(
        self, client: redis.Redis, qm: str, record: SubscriptionRecord, recover: bool = True
    ) -> None:
        self.client = client
        self.qm = qm
        self.record = record
        self.queue = keys.sub_queue(qm, record.sub_id)
        self.inflight = keys.sub_inflight(qm, record.sub_id)
        if recover:
            self.recover()

    @translate_errors
    def recover(self) -> int:
        """Put un-acknowledged messages back at the head of the queue; returns how many."""
        moved = 0
        while self.client.lmove(self.inflight, self.queue, "LEFT", "RIGHT") is not None:
            moved += 1
        return moved

    @translate_errors
    def receive(self, timeout_ms: int = 0) -> Delivery | None:
        """Take the oldest message into the in-flight list.

        Args:
            timeout_ms: how long to block, ms; 0 returns at once.

        Returns:
            A ``Delivery`` to ``ack``, or None when the queue stayed empty.

        Raises:
            InvalidMessage: the envelope is malformed (it stays in flight).
        """
        if timeout_ms > 0:
            # redis-py types the timeout as int; the server takes fractional seconds
            timeout_s: Any = timeout_ms / 1000
            raw = self.client.blmove(self.queue, self.inflight, timeout_s, "RIGHT", "LEFT")
        else:
            raw = self.client.lmove(self.queue, self.inflight, "RIGHT", "LEFT")
        if raw is None:
            return None
        envelope = as_bytes(raw)
        try:
            return Delivery(Message.from_envelope(envelope), envelope)
        except (InvalidMessage, KeyError, ValueError) as exc:
            raise InvalidMessage(f"malformed envelope in {self.queue}: {exc}") from exc

    @translate_errors
    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivery: drop it from the in-flight list."""
        value: Any = delivery.raw  # bytes: an ack must send back the exact bytes (redis-py types it str)
        self.client.lrem(self.inflight, 1, value)

    @translate_errors
    def depth(self) -> int:
        """Messages waiting in the queue (not counting in-flight ones)."""
        return int(self.client.llen(self.queue))

    @translate_errors
    def close(self) -> None:
        """Stop consuming. A non-durable subscription is deleted with its queue."""
        if not self.record.durable:
            with contextlib.suppress(NoSuchSubscription):
                unsubscribe(self.client, self.qm, self.record.sub_id)
