"""Publishing: one ``XADD`` per publication, and waiting for its result if asked.

Seed 000: "the publisher knows the result at publish time". A publication sent
with ``wait`` asks the worker to post its result (delivered to how many
subscriptions, a duplicate, expired, or refused and why) on a reply list the
publisher blocks on.

Every publication from this class carries a message id (unique per Publisher
instance and sequence number, unless given),
so a retry after a lost reply (redis-py retries on connection errors) is
recognised by the worker and delivered once.

Flow control (``broker.core.flow``): the broker asks a publisher to slow down to its
slowest subscriber's pace with a delay. A ``Publisher`` learns it from the result
(``wait``) or reads its flow key with each ``XADD`` (one round trip: both written at once to a pooled connection),
and waits that long before its next publication, unless made with
``flow_control=False``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import hierarchy, keys, wire
from broker.core.connection import as_bytes, block_slice_ms
from broker.core.errors import ConnectionLost, InvalidMessage, ReplyTimeout, ServerError, ServerFull
from broker.core.flow import FlowGate, parse_delay
from broker.core.models import GROUP_ID, GROUP_SEQ, PropertyValue, delivery_time, publication_fields
from broker.core.topic_rules import validate_topic
from broker.topics.topic_objects import topic_of


def _direct_pool(client: Any) -> redis.ConnectionPool | None:
    """The client's connection pool when ``publish`` may use its connections directly: a plain
    ``redis.Redis`` on redis-py's own connection classes (not a cluster client, not fakeredis)."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.Redis) or not isinstance(pool, redis.ConnectionPool):
        return None
    if not getattr(pool, "connection_class", type).__module__.startswith("redis."):
        return None
    return pool


def _xadd_direct(
    pool: redis.ConnectionPool, stream: str, fields: dict[Any, Any], flow_key: str | None
) -> tuple[Any, Any]:
    """``XADD stream * fields`` (and ``GET flow_key``) in one round trip on a pooled connection.

    What a pipeline does, without building one per call: the commands are packed once, sent
    with one write and their replies read in order. Nothing is retried: an XADD whose reply was
    lost may have been applied (the caller raises ``ConnectionLost``, the msgid says how to retry).

    Returns:
        ``(entry id, the flow key's value, None, or the GET's error when the server refused it)``.

    Raises:
        redis.ConnectionError, redis.TimeoutError: the connection failed (it is dropped).
        redis.ResponseError: the server refused the XADD (OutOfMemoryError when full).
    """
    args: list[Any] = ["XADD", stream, "*"]
    for pair in fields.items():
        args.extend(pair)
    commands: list[Any] = [args] if flow_key is None else [args, ("GET", flow_key)]
    conn = pool.get_connection()
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        try:
            added = conn.read_response()
        except redis.ResponseError:
            if flow_key is not None:
                conn.read_response()  # the GET's reply: keep the connection in step
            raise
        try:
            flow = conn.read_response() if flow_key is not None else None
        except redis.ResponseError as refused:  # the XADD was applied: the caller decides
            flow = refused
    finally:
        pool.release(conn)
    return added, flow


@dataclass(frozen=True)
class PublishResult:
    """The result of one publication.

    Attributes:
        status: "sent" (not waited for), "delivered", "duplicate", "expired" or "refused".
        entry_id: the publish stream entry id.
        msgid: the message id.
        seq: the publisher's sequence number of this publication.
        subscriptions: how many subscriber queues received it (when waited for).
        reason: why it was refused, or None.
        suggestion: a corrected topic when the topic was refused, or None.
        flow_control_delay_ms: how long the broker asked the publisher to wait before its
            next publication, ms (its slowest subscriber's delay): from the result with
            ``wait``, else from the publisher's flow key read with the XADD (the delay of
            its latest publications the workers handled). 0: no wait, or flow control off.
        forwarded: how many channels to other queue managers it was forwarded on (when waited
            for; ``broker.topics.topology``): its subscribers there are not counted in ``subscriptions``.
    """

    status: str
    entry_id: str
    msgid: str
    seq: int
    subscriptions: int = 0
    reason: str | None = None
    suggestion: str | None = None
    flow_control_delay_ms: int = 0
    forwarded: int = 0

    @property
    def ok(self) -> bool:
        """True unless the broker refused the publication."""
        return self.status != "refused"


def with_group(
    properties: dict[str, PropertyValue] | None, group: str | None, group_seq: int | None
) -> dict[str, PropertyValue] | None:
    """``properties`` (a copy) with the message group's ``JMSXGroupID`` and ``JMSXGroupSeq``; with
    neither, ``properties`` itself.

    Raises:
        InvalidMessage: ``group`` is empty or not a string, ``group_seq`` is not an int, or
            ``group_seq`` comes without ``group``.
    """
    if group is None and group_seq is None:
        return properties
    if group is None:
        raise InvalidMessage("a group sequence number (JMSXGroupSeq) needs a group (JMSXGroupID)")
    if not isinstance(group, str) or not group:
        raise InvalidMessage(f"the group (JMSXGroupID) must be a non-empty string, not {group!r}")
    out: dict[str, PropertyValue] = dict(properties or {})
    out[GROUP_ID] = group
    if group_seq is not None:
        if not isinstance(group_seq, int) or isinstance(group_seq, bool):
            raise InvalidMessage(
                f"the group sequence number (JMSXGroupSeq) must be an int, not {group_seq!r}"
            )
        out[GROUP_SEQ] = group_seq
    return out


class Publisher:
    """Publishes on behalf of one publisher id; order is kept per publisher id.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        publisher_id: 1-256 bytes (``wire.MAX_PUBLISHER_BYTES``); every publication of this id is delivered in
            the order it was published.
        validate: check topics here and raise at once (default); with False the
            broker checks them and refuses invalid ones (visible with ``wait``).
        first_seq: the sequence number of the first publication.
        client_id: the publishing connection's client id, sent with every
            publication (a subscription with no-local made by the same client id
            does not receive it); None sends none.
        scheme: the queue manager's topic scheme (``Settings.topic_scheme``) that
            ``validate`` checks topics against: ``mqtt`` (MQTT 5 §4.7) or ``swiftmq``
            (dot nodes, ``broker.core.hierarchy``).
        flow_control: wait the delay the broker asks for (``PublishResult.flow_control_delay_ms``)
            before the next publication; False: never wait, and do not read the flow key.
        clock_ms: a monotonic clock in ms, for the flow-control wait (injectable for tests).
        sleep_ms: sleeps for the given ms, for the flow-control wait (injectable for tests).
        principal: publish through this principal's ingress stream (``{qm}:in:<principal>``,
            ``broker.core.principals``): the ACL user the client is authenticated as, when the
            queue manager runs with security on; None publishes to the publish stream.
    """

    def __init__(
        self,
        client: redis.Redis,
        qm: str,
        publisher_id: str,
        validate: bool = True,
        first_seq: int = 1,
        client_id: str | None = None,
        scheme: str = "mqtt",
        flow_control: bool = True,
        clock_ms: Callable[[], float] | None = None,
        sleep_ms: Callable[[float], None] | None = None,
        principal: str | None = None,
    ) -> None:
        if not wire.is_publisher_id(publisher_id):
            raise InvalidMessage(f"publisher_id must be 1-{wire.MAX_PUBLISHER_BYTES} bytes")
        self.client = client
        self.qm = qm
        self.publisher_id = publisher_id
        self.validate = validate
        self.next_seq = first_seq
        self.client_id = client_id
        self._stream = keys.ingress(qm, principal) if principal else keys.publish_stream(qm)
        self.flow_control = flow_control
        self.flow = FlowGate(flow_control, clock_ms, sleep_ms)
        self._flow_key = keys.flow_key(qm, publisher_id)
        self._valid_topics: set[str] = set()
        self._validate_topic = hierarchy.validate_topic if scheme == "swiftmq" else validate_topic
        #: Default message ids are "<random 128-bit hex>-<seq>": unique, and the same on a retry.
        self._msgid_prefix = uuid.uuid4().hex
        #: a plain server's connection pool: ``publish`` writes its XADD (and the flow key's GET)
        #: to a pooled connection itself; None (a cluster, fakeredis): through redis-py's commands
        self._pool = _direct_pool(client)

    def _fields(
        self, topic: str, body: bytes | str, msgid: str | None, reply: bool, options: dict[str, Any]
    ) -> tuple[dict[Any, Any], str, int]:
        if self.validate and topic not in self._valid_topics:
            self._validate_topic(topic)
            if len(self._valid_topics) >= 10_000:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if isinstance(body, str):
            try:
                body = body.encode()
            except UnicodeEncodeError as exc:
                raise InvalidMessage("a str body must be UTF-8 text: it has a lone surrogate") from exc
        seq = self.next_seq
        self.next_seq += 1
        msgid = msgid or f"{self._msgid_prefix}-{seq}"
        fields = publication_fields(
            self.publisher_id,
            topic,
            body,
            msgid=msgid,
            seq=seq,
            reply=reply,
            client_id=self.client_id,
            **options,
        )
        return fields, msgid, seq

    def publish(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        properties: dict[str, PropertyValue] | None = None,
        msgid: str | None = None,
        persistent: bool | None = None,
        priority: int | None = None,
        expiration_ms: int = 0,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        message_type: str | None = None,
        timestamp_ms: int | None = None,
        topic_object: str | None = None,
        group: str | None = None,
        group_seq: int | None = None,
        wait: bool = False,
        timeout_ms: int = 10_000,
        delivery_delay_ms: int = 0,
        retain: bool = False,
    ) -> PublishResult:
        """Publish one message with a single ``XADD``, after the flow-control delay the broker asked for.

        Args:
            topic: the topic string.
            body: the body; str is encoded as UTF-8.
            properties: user properties (scalar values).
            msgid: the message id; default ``<random hex>-<seq>``. Re-sending the same id
                within the dedup window delivers nothing twice.
            persistent: Jakarta Messaging delivery mode; None: the topic's DEFPSIST (persistent
                without topic objects).
            priority: 0-9; None: the topic's DEFPRTY (4 without topic objects).
            expiration_ms: absolute expiry, ms since the epoch; 0 = never.
            correlation_id: carried to subscribers.
            reply_to: carried to subscribers.
            message_type: JMSType, carried to subscribers (selectors can test it).
            timestamp_ms: publish time to record, ms; default the stream entry's.
            topic_object: publish through this topic object: its topic string, joined with
                ``/`` to ``topic`` when ``topic`` is not empty (IBM MQ; ``broker.topics.topic_objects``).
            group: the message group, the ``JMSXGroupID`` property: on a shared subscription a
                group's messages go to one consumer, in order (ActiveMQ, Artemis; docs/protocol.md).
            group_seq: its number in the group, ``JMSXGroupSeq`` (negative: the group's last).
            wait: block until a worker has handled it and return its result.
            timeout_ms: how long to wait for the result, ms (beyond the flow-control wait and the delay).
            delivery_delay_ms: no subscriber receives it before ``timestamp_ms`` (default now) + this,
                0 to 365 days, ms (Jakarta Messaging 2.0 §7.9; ``models.delivery_time``).
            retain: a retained publication (IBM MQ ``MQPMO_RETAIN``, MQTT 5 RETAIN): kept as the
                topic's last, which each new subscription matching it receives (flagged
                ``retained``); an empty body clears the topic's (``broker.topics.retained``).

        Returns:
            A ``PublishResult``: status "sent", or the worker's result with ``wait``.

        Raises:
            InvalidTopic: ``validate`` is on and the topic is invalid (with a suggestion).
            InvalidMessage: priority, expiration, delivery delay, properties or group (``with_group``)
                are invalid.
            NoSuchTopicObject: ``topic_object`` does not exist.
            ReplyTimeout: ``wait`` and no result came within ``timeout_ms``.
            ConnectionLost: the server cannot be reached.
            ServerFull: the server is out of memory (``maxmemory``): the publication was not
                written; publish it again (same msgid) once memory is freed. Raised at once.
            ServerError: the server refused the write otherwise, or the entry was written under a
                publisher id this ACL user is not bound to (its flow key is refused; the broker
                dead-letters the entry).
        """
        if topic_object is not None:
            topic = topic_of(self.client, self.qm, topic_object, topic)
        options = dict(
            properties=with_group(properties, group, group_seq),
            persistent=persistent,
            priority=priority,
            expiration_ms=expiration_ms,
            correlation_id=correlation_id,
            reply_to=reply_to,
            message_type=message_type,
            timestamp_ms=timestamp_ms,
            delivery_time_ms=delivery_time(delivery_delay_ms, timestamp_ms) if delivery_delay_ms else None,
            retain=retain,
        )
        fields, msgid, seq = self._fields(topic, body, msgid, wait, options)
        self.flow.wait()
        entry_id, delay = self._write(fields, msgid, seq, self.flow_control and not wait)
        if not wait:
            self.flow.learn(delay)
            return PublishResult("sent", entry_id, msgid, seq, flow_control_delay_ms=delay)
        reply = self._result(msgid, timeout_ms + delivery_delay_ms)
        delay = parse_delay(reply.flow_control_delay_ms)
        self.flow.learn(delay)
        return PublishResult(
            status=reply.status,
            entry_id=entry_id if reply.entry_id is None else reply.entry_id,
            msgid=msgid,
            seq=seq,
            subscriptions=reply.subscriptions,
            reason=reply.reason,
            suggestion=reply.suggestion,
            flow_control_delay_ms=delay,
            forwarded=reply.forwarded,
        )

    def _write(self, fields: dict[Any, Any], msgid: str, seq: int, read_flow: bool) -> tuple[str, int]:
        """The publication's one ``XADD`` (with the flow key's ``GET`` in the same round trip when
        ``read_flow``): ``(entry id, flow-control delay ms)``; on a failure ``next_seq`` is ``seq`` again.

        Raises:
            ConnectionLost, ServerFull, ServerError: as ``publish``.
        """
        delay = 0
        try:
            if self._pool is not None:
                added, flow = _xadd_direct(
                    self._pool, self._stream, fields, self._flow_key if read_flow else None
                )
            else:
                added, flow = self._xadd_commands(fields, read_flow)
            entry_id = as_bytes(added).decode()
            if isinstance(flow, redis.exceptions.NoPermissionError):
                # the XADD went through: only an unbound publisher id's flow key is out of reach
                raise ServerError(
                    f"message {msgid} was written under publisher id {self.publisher_id}, which is not "
                    f"this user's (its flow key: {flow}); the broker dead-letters it"
                ) from flow
            if read_flow and not isinstance(flow, Exception):
                delay = parse_delay(flow)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Unknown outcome: a retry with the same msgid must carry the same seq.
            self.next_seq = seq
            raise ConnectionLost(
                f"publish of message {msgid} failed, outcome unknown (retry with msgid={msgid!r}): {exc}"
            ) from exc
        except redis.exceptions.OutOfMemoryError as exc:
            self.next_seq = seq  # not written: the same seq again
            raise ServerFull(f"publication of message {msgid}", str(exc)) from exc
        except redis.ResponseError as exc:
            self.next_seq = seq
            raise ServerError(f"publish refused by the server: {exc}") from exc
        return entry_id, delay

    def _xadd_commands(self, fields: dict[Any, Any], read_flow: bool) -> tuple[Any, Any]:
        """``XADD`` (and ``GET`` of the flow key when ``read_flow``) through redis-py's commands, for
        a client ``publish`` does not write to directly (a cluster, fakeredis): one round trip.

        Returns:
            ``(entry id, the flow key's value, None, or the GET's error)``, as ``_xadd_direct``.

        Raises:
            redis.RedisError: as redis-py raises it (the XADD's own error when it failed).
        """
        if not read_flow:
            return self.client.xadd(self._stream, fields), None
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self._stream, fields)
        pipe.get(self._flow_key)
        added, flow = pipe.execute(raise_on_error=False)
        if isinstance(added, Exception):
            raise added
        return added, flow

    def _result(self, msgid: str, timeout_ms: int) -> wire.Reply:
        """Wait for the result a worker posts for ``msgid`` on its reply list (``keys.reply``).

        Returns:
            The result (``wire.parse_reply``: status, subscriptions, reason... as the worker gives).

        Raises:
            ReplyTimeout: no result within ``timeout_ms``.
            ConnectionLost, ServerError: as ``publish``.
        """
        try:
            got = None
            deadline = time.monotonic() + timeout_ms / 1000
            reply_key = keys.reply(self.qm, self.publisher_id, msgid)
            while got is None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    break
                # in slices: one BLPOP longer than the socket timeout would fail as a lost connection
                slice_s: Any = min(left_ms, block_slice_ms(self.client)) / 1000
                got = self.client.blpop([reply_key], timeout=slice_s)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ConnectionLost(f"waiting for the result of message {msgid} failed: {exc}") from exc
        except redis.exceptions.NoPermissionError as exc:  # the XADD went through: see publish
            raise ServerError(
                f"message {msgid} was written under publisher id {self.publisher_id}, which is not this "
                f"user's (its result: {exc}); the broker dead-letters it"
            ) from exc
        except redis.ResponseError as exc:
            raise ServerError(f"publish refused by the server: {exc}") from exc
        if got is None:
            raise ReplyTimeout(f"no result for message {msgid} within {timeout_ms} ms (is a worker running?)")
        return wire.parse_reply(got[1])

    def publish_many(
        self, items: Iterable[tuple[str, bytes | str]], batch: int = 500, **options: Any
    ) -> list[PublishResult]:
        """Publish many messages, pipelining ``batch`` XADDs per round trip, in order.

        With flow control, each round trip also reads the publisher's flow key, and the
        next round trip waits the delay it holds (``Publisher``).

        Args:
            items: ``(topic, body)`` pairs.
            batch: XADDs per round trip.
            **options: as for ``publish`` (not ``wait``/``msgid``).

        Returns:
            One "sent" ``PublishResult`` per item, in order.

        Raises:
            InvalidTopic, InvalidMessage, ConnectionLost, ServerError: as ``publish``.
            ServerFull: the server is out of memory; its ``accepted`` lists the "sent" results of
                the items that were written (in order), the others were not: publish them again
                once memory is freed.
        """
        results: list[PublishResult] = []
        pending: list[tuple[str, int]] = []
        pipe = self.client.pipeline(transaction=False)

        def flush() -> None:
            self.flow.wait()
            if self.flow_control:
                pipe.get(self._flow_key)
            try:
                replies = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise ConnectionLost(f"publish failed: {exc}") from exc
            ids = replies[: len(pending)]
            for reply in ids:
                if isinstance(reply, Exception) and not isinstance(reply, redis.exceptions.OutOfMemoryError):
                    raise ServerError(f"publish refused by the server: {reply}") from reply
            delay = parse_delay(replies[-1]) if self.flow_control else 0
            self.flow.learn(delay)
            full: redis.exceptions.OutOfMemoryError | None = None
            refused: list[tuple[str, int]] = []
            for eid, (m, s) in zip(ids, pending, strict=True):
                if isinstance(eid, redis.exceptions.OutOfMemoryError):
                    full = full or eid
                    refused.append((m, s))
                else:
                    results.append(
                        PublishResult("sent", as_bytes(eid).decode(), m, s, flow_control_delay_ms=delay)
                    )
            pending.clear()
            if full is not None:
                self.next_seq = refused[0][1]  # the items not written take their seqs again
                error = ServerFull(
                    f"publication of message {refused[0][0]} and {len(refused) - 1} more", str(full)
                )
                error.accepted = list(results)
                raise error from full

        for topic, body in items:
            fields, msgid, seq = self._fields(topic, body, None, False, options)
            pipe.xadd(self._stream, fields)
            pending.append((msgid, seq))
            if len(pending) >= batch:
                flush()
        if pending:
            flush()
        return results
