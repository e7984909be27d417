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
import re
import time
import uuid
from dataclasses import dataclass

import redis

from broker import keys
from broker.errors import InvalidMessage, NoSuchSubscription, SubscriptionConflict
from broker.models import Message
from broker.routing import SubscriptionRecord
from broker.topics import validate_filter

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def _check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} must be 1-128 characters of A-Z a-z 0-9 _ . -")


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
        ValueError: the client id or name has characters other than ``A-Za-z0-9_.-``.
        SubscriptionConflict: the durable subscription exists with another filter.
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
                    old = SubscriptionRecord.from_json(sub_id, existing)
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


def unsubscribe(client: redis.Redis, qm: str, sub_id: str) -> None:
    """Delete a subscription and its queue (and in-flight list).

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


def list_subscriptions(client: redis.Redis, qm: str) -> list[SubscriptionRecord]:
    """Every subscription of the queue manager, sorted by id."""
    raw = client.hgetall(keys.subscriptions(qm))
    return sorted(
        (SubscriptionRecord.from_json(k.decode(), v) for k, v in raw.items()), key=lambda r: r.sub_id
    )


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

    def __init__(self, client: redis.Redis, qm: str, record: SubscriptionRecord, recover: bool = True) -> None:
        self.client = client
        self.qm = qm
        self.record = record
        self.queue = keys.sub_queue(qm, record.sub_id)
        self.inflight = keys.sub_inflight(qm, record.sub_id)
        if recover:
            self.recover()

    def recover(self) -> int:
        """Put un-acknowledged messages back at the head of the queue; returns how many."""
        moved = 0
        while self.client.lmove(self.inflight, self.queue, "LEFT", "RIGHT") is not None:
            moved += 1
        return moved

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
            raw = self.client.blmove(self.queue, self.inflight, timeout_ms / 1000, "RIGHT", "LEFT")
        else:
            raw = self.client.lmove(self.queue, self.inflight, "RIGHT", "LEFT")
        if raw is None:
            return None
        try:
            return Delivery(Message.from_envelope(raw), raw)
        except (InvalidMessage, KeyError, ValueError) as exc:
            raise InvalidMessage(f"malformed envelope in {self.queue}: {exc}") from exc

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a delivery: drop it from the in-flight list."""
        self.client.lrem(self.inflight, 1, delivery.raw)

    def depth(self) -> int:
        """Messages waiting in the queue (not counting in-flight ones)."""
        return int(self.client.llen(self.queue))

    def close(self) -> None:
        """Stop consuming. A non-durable subscription is deleted with its queue."""
        if not self.record.durable:
            with contextlib.suppress(NoSuchSubscription):
                unsubscribe(self.client, self.qm, self.record.sub_id)

