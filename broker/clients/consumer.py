"""Consumers of a subscription: receive, acknowledge, heartbeat, recover, browse.

Each consumer (a ``Subscriber``) has an id and its own in-flight list
``{qm}:sub:<id>:inflight:<consumer>``, and renews a lease in the
subscription's consumers zset with every receive and heartbeat. What it holds
belongs to it alone:

- a consumer that dies (its lease deadline passes) has its in-flight messages
  given back to the head of the queue, in the order it received them, by
  ``broker_recover`` (run by the other consumers' heartbeats, by a new consumer,
  and by the workers' sweep); they are redelivered with ``redelivered`` set
  and a ``delivery_count`` (JMSXDeliveryCount), and dead-lettered once they
  have failed ``max_redeliveries`` times. A live consumer's in-flight messages
  are never taken;
- acknowledging removes messages from the consumer's own short list
  (``broker_ack``): a whole batch that is the oldest in flight with one ``LTRIM``,
  any other message searched from the oldest end (``LREM ... -1``): no scan of
  a long list;
- messages are taken highest priority first (one list per priority band,
  Jakarta Messaging §3.4.10), oldest first within a band, so per-publisher
  order holds within a priority; one whose expiration passed while it waited
  is never handed over (``broker_receive``, which takes a batch with one
  ``LRANGE`` + ``LTRIM`` per band). A delivery's envelope is decoded when its
  ``message`` is first read;
- a malformed envelope (written by something other than a worker) never stops a
  consumer: it becomes a poison message at once, reason "malformed envelope: ...", removed
  from the consumer's in-flight list and added to the subscription's poison stream
  ``{qm}:sub:<id>:poison`` in one step (``broker_reject``), and
  the consumer goes on to the next. It is checked as it is taken (no header line, a
  header that is not a JSON object or not UTF-8, a header field missing, of the wrong
  type or out of range), so that reading a delivery's message never fails.

Every operation is one ``FCALL`` of the function library ``broker`` with the subscription's
key (``broker.core.library``; docs/protocol.md): a consumer's ACL user needs ``FCALL`` on its
subscriptions' keys and no ``EVAL``. What its consumers write (expired count, last use,
poison messages) is the subscription's own (``keys.sub_expired``, ``sub_last_active``,
``sub_poison``), never a key shared with other clients.

Consumer modes (``SubscriptionRecord.mode``): ``shared`` (each message to one
of many consumers), ``exclusive`` (a second consumer is refused with
``ConsumerConflict``) and ``activestandby`` (a second consumer waits as a
standby and takes over within a lease of the active one dying). The holder of
an exclusive or active-standby subscription is ``{qm}:sub:<id>:active``.

``sweep_subscriptions`` (run by the workers) also removes abandoned
non-durable subscriptions: those whose consumers have all been dead for
``subscription_expiry_ms`` (MQTT 5 session expiry).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis

from broker.core import clock, keys
from broker.core.config import Settings
from broker.core.connection import as_bytes, block_slice_ms
from broker.core.errors import (
    ConsumerConflict,
    ForeignKey,
    InvalidMessage,
    ServerError,
    TooManyConsumers,
    translate_errors,
)
from broker.core.library import fcall
from broker.core.models import GROUPED_FIELD, Message, decode_header, message_of, usual_values
from broker.core.scripts import register
from broker.topics.subscriptions import (
    SubscriptionRecord,
    check_name,
    read_subscriptions,
    remove_subscription,
)

log = logging.getLogger("broker.consumer")

#: Most messages one ``browse`` shows (``broker_browse``'s bound, ``lua/library/browse.lua``).
BROWSE_MAX = 1_000

#: Most subscriptions one ``sweep_subscriptions`` call looks at.
SWEEP_SUBSCRIPTIONS = 200

#: Where a consumer may die between its atomic steps (the crash-point hook of the tests):
#: ``after_receive``, its messages taken into its in-flight list and not yet handed to the
#: caller; ``after_ack``, acknowledged but the caller not yet told. Either way nothing is lost:
#: what it held is given back, counted, once its lease has passed (``broker_recover``).
CRASH_POINTS = ("after_receive", "after_ack")

#: How often a consumer waiting for messages looks again while the server is full, ms (it
#: cannot block on its subscription's bell then: BLMOVE is refused like any write that may grow).
FULL_POLL_MS = 50


class Delivery:
    """One message taken by a consumer, not yet acknowledged.

    The envelope's header is checked when the message is taken (``Subscriber.receive_many``:
    a malformed one is dead-lettered then and never handed over); the message is made from
    the checked fields when ``message`` is first read (then kept): a consumer that
    acknowledges without reading, or reads only some, pays little for the others.

    Attributes:
        message: the decoded message.
        raw: the envelope as stored (needed to acknowledge it).
        delivery_count: how many times it has been delivered, this one
            included (JMSXDeliveryCount, Jakarta Messaging §3.5.11); 1 the first time.

    Raises:
        InvalidMessage: reading ``message`` of a delivery made by hand from a malformed
            envelope (``header`` None). A delivery a ``Subscriber`` hands over was checked
            when taken and reads without error.
    """

    __slots__ = ("_count", "_header", "_message", "_owner", "_queue", "_raw")

    def __init__(
        self,
        message: Message | None,
        raw: bytes,
        delivery_count: int = 1,
        queue: str = "",
        header: dict[str, Any] | None = None,
        owner: Subscriber | None = None,
    ) -> None:
        self._message = message
        self._raw = raw
        self._count = delivery_count
        self._queue = queue
        self._header = header
        self._owner = owner

    @property
    def message(self) -> Message:
        """The decoded message (decoded on first use)."""
        message = self._message
        if message is None:
            message = self._message = self._decode()
        return message

    def _decode(self) -> Message:
        raw, header, queue = self._raw, self._header, self._queue or "?"
        try:
            if header is None:
                return Message.from_envelope(raw)
            return message_of(header, raw[raw.index(b"\n") + 1 :])  # checked when taken (receive_many)
        except (InvalidMessage, KeyError, ValueError) as exc:
            owner = self._owner
            if owner is None:
                raise InvalidMessage(f"malformed envelope in {queue}: {exc}") from exc
            done = owner.dead_letter_malformed([(raw, f"malformed envelope: {exc}")])
            what = "dead-lettered" if done else "no longer in flight: not dead-lettered"
            raise InvalidMessage(f"malformed envelope in {queue}: {exc} ({what})") from exc

    @property
    def raw(self) -> bytes:
        """The envelope as stored: ``<header JSON>\\n<body>``."""
        return self._raw

    @property
    def delivery_count(self) -> int:
        """How many times it has been delivered, this one included; 1 the first time."""
        return self._count

    @property
    def redelivered(self) -> bool:
        """It was delivered before to a consumer that did not acknowledge it (JMSRedelivered)."""
        return self._count > 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delivery):
            return NotImplemented
        return self._raw == other._raw and self._count == other._count

    __hash__ = None  # type: ignore[assignment]  # as before: equal by value, not hashable

    def __repr__(self) -> str:
        return f"Delivery(raw={self._raw[:60]!r}..., delivery_count={self._count})"


def _consumer_id() -> str:
    host = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())[:60] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def forget_ms(settings: Settings) -> int:
    """How long a dead consumer stays in its subscription's consumers zset, ms (then forgotten)."""
    return max(settings.subscription_expiry_ms, settings.consumer_lease_ms) * 2


@translate_errors
def recover(
    client: redis.Redis,
    qm: str,
    sub_id: str,
    *,
    max_redeliveries: int = 10,
    dead_letter_max_len: int = 100_000,
    forget_ms: int = 60_000,
    now_ms: int | None = None,
    closing: str = "",
) -> tuple[int, int, int]:
    """Give back the in-flight messages of a subscription's dead consumers (``broker_recover``).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        sub_id: the subscription.
        max_redeliveries: a message that failed more often becomes a poison message instead
            (the subscription's own poison stream ``keys.sub_poison``).
        dead_letter_max_len: approximate cap of the poison stream, records.
        forget_ms: consumers dead for longer are removed from the consumers zset, ms.
        now_ms: the time, ms since the epoch; None for the server's clock.
        closing: a consumer closing now: its in-flight messages are given back whatever its lease.

    Returns:
        ``(consumers recovered, messages given back, messages made poison)``.

    Raises:
        ForeignKey: a key of the subscription holds another Redis type.
        LibraryMissing: the server has no ``broker`` library and this user may not load it.
    """
    got = fcall(
        client,
        "broker_recover",
        keys.sub_queue(qm, sub_id),
        "" if now_ms is None else now_ms,
        max_redeliveries,
        dead_letter_max_len,
        forget_ms,
        closing,
    )
    return int(got[0]), int(got[1]), int(got[2])


@translate_errors
def sweep_subscriptions(
    client: redis.Redis,
    qm: str,
    settings: Settings,
    start: str = "",
    now_ms: int | None = None,
    records: Iterable[SubscriptionRecord] | None = None,
) -> tuple[str, list[str]]:
    """Recover dead consumers' messages and remove abandoned non-durable subscriptions.

    Looks at up to ``SWEEP_SUBSCRIPTIONS`` subscriptions whose id sorts after ``start``.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        settings: ``consumer_lease_ms``, ``subscription_expiry_ms``, ``max_redeliveries``,
            ``dead_letter_max_len``.
        start: go on after this subscription id ("" from the first).
        now_ms: the time, ms since the epoch; None for this machine's clock.
        records: the subscriptions (a worker's routing table has them); None reads them.

    Returns:
        ``(the last id looked at, or "" when the end was reached; subscription ids removed)``.
    """
    now = clock.now_ms() if now_ms is None else now_ms
    if records is None:
        records = read_subscriptions(client, qm)[0]
    todo = sorted((r for r in records if r.sub_id > start), key=lambda r: r.sub_id)[:SWEEP_SUBSCRIPTIONS]
    removed = []
    forget = forget_ms(settings)
    # One call finds the subscriptions with a dead consumer (or none at all): only those need a
    # script call of their own. A foreign consumers key counts as dead: broker_recover names it.
    cutoff = now - settings.subscription_expiry_ms
    probes = (
        register(client, "consumers_probe")(keys=[keys.sub_consumers(qm, r.sub_id) for r in todo], args=[now])
        if todo
        else []
    )
    for i, record in enumerate(todo):
        dead, newest = probes[2 * i], probes[2 * i + 1]
        last_seen = max(record.created_ms, int(newest))
        abandoned = not record.durable and last_seen < cutoff
        try:
            if dead:
                recover(
                    client,
                    qm,
                    record.sub_id,
                    max_redeliveries=settings.max_redeliveries,
                    dead_letter_max_len=settings.dead_letter_max_len,
                    forget_ms=forget,
                    now_ms=now,
                )
            if abandoned and remove_subscription(client, qm, record.sub_id, abandoned_before_ms=cutoff):
                log.info("removed abandoned non-durable subscription %s", record.sub_id)
                removed.append(record.sub_id)
        except (ServerError, ForeignKey) as exc:  # a foreign key in one subscription: name it, go on
            log.warning("subscription sweep: %s: %s", record.sub_id, exc)
    last = todo[-1].sub_id if len(todo) == SWEEP_SUBSCRIPTIONS else ""
    return last, removed


def _decode(envelope: bytes, queue: str) -> Message:
    """The message of an envelope taken from ``queue``.

    Raises:
        InvalidMessage: the envelope is malformed (named with its queue).
    """
    try:
        return Message.from_envelope(envelope)
    except (InvalidMessage, KeyError, ValueError) as exc:
        raise InvalidMessage(f"malformed envelope in {queue}: {exc}") from exc


#: the text of a message group's property in an envelope (a consumer of groups, ``_grouped``),
#: searched for only in an envelope older than protocol 7
_GROUP_TEXT = b'"JMSXGroupID":'
#: how the header of a grouped message starts since protocol 7 (``models.GROUPED_FIELD``)
_GROUPED_HEAD = b'{"' + GROUPED_FIELD.encode() + b'":'
#: the first protocol whose envelopes start with ``_GROUPED_HEAD`` when grouped
_GROUPED_HEAD_SINCE = 7


def _before_grouped_head(header: dict[str, Any]) -> bool:
    """Whether an envelope header is older than protocol 7 (or has no version), so that only a search
    tells whether it belongs to a group."""
    version = header.get("v")
    return type(version) is not int or version < _GROUPED_HEAD_SINCE


class Subscriber:
    """One consumer of a subscription: takes messages into its own in-flight list, then acks them.

    Args:
        client: a redis-py client (``decode_responses=False``).
        qm: the queue manager.
        record: the subscription (from ``subscribe``).
        settings: ``consumer_lease_ms``, ``max_redeliveries``, ``expired_to_dlq``,
            ``dead_letter_max_len``, ``subscription_expiry_ms``; default ``Settings()``.
        consumer_id: this consumer's id (``A-Za-z0-9_.-``); default ``<host>-<pid>-<random>``.
        heartbeat: renew the lease from a background thread every third of it
            (default); False: the caller's own ``receive``/``heartbeat`` calls must
            (each ``receive`` renews it too).
        clock_ms: the time in ms since the epoch for scripts (tests); None: the server's clock.
        hook: called with a name from ``CRASH_POINTS`` at each crash point (tests).

    Raises:
        ConsumerConflict: the subscription is exclusive and another live consumer holds it.
        TooManyConsumers: the subscription has ``settings.max_consumers_per_subscription``
            live consumers already (checked in the call that would attach this one).
        InvalidName: ``consumer_id`` has other characters.
    """

    def __init__(
        self,
        client: redis.Redis,
        qm: str,
        record: SubscriptionRecord,
        settings: Settings | None = None,
        *,
        consumer_id: str | None = None,
        heartbeat: bool = True,
        clock_ms: Callable[[], int] | None = None,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.hook = hook
        self.qm = qm
        self.record = record
        self.settings = settings or Settings()
        self.consumer_id = consumer_id or _consumer_id()
        check_name("consumer id", self.consumer_id)
        self.clock_ms = clock_ms
        sub_id = record.sub_id
        self.queue = keys.sub_queue(qm, sub_id)
        self.bands = keys.sub_bands(qm, sub_id)
        self.bell = keys.sub_bell(qm, sub_id)
        self.inflight = keys.consumer_inflight(qm, sub_id, self.consumer_id)
        settings = self.settings
        # broker_receive's arguments; [1] (how many) and [3] (now) are set in each call's copy
        self._receive_args: list[Any] = [
            self.consumer_id,
            0,
            settings.consumer_lease_ms,
            "",
            record.mode,
            1 if settings.expired_to_dlq else 0,
            settings.dead_letter_max_len,
            settings.max_consumers_per_subscription,
        ]
        #: envelopes the last take dead-lettered as malformed
        self._rejected = 0
        self.standby = False
        #: this consumer's last take found every band empty (broker_receive cleared the bell)
        self._drained = False
        #: this consumer has received a message of a message group: another consumer's take may
        #: clear the bell while messages of this one's groups wait (passed over), so it takes
        #: before it waits for the bell
        self._grouped = False
        self.closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeat()  # attach: lease, holder; ConsumerConflict for a second exclusive consumer
        self._give_back_protocol_2()
        if heartbeat:
            self._thread = threading.Thread(
                target=self._beat, name=f"heartbeat-{self.consumer_id}", daemon=True
            )
            self._thread.start()

    # -- leases ---------------------------------------------------------------------

    def _now(self) -> str | int:
        return "" if self.clock_ms is None else self.clock_ms()

    def _take(self, count: int) -> list[Delivery]:
        settings = self.settings
        sub_id = self.record.sub_id
        args = self._receive_args.copy()  # a copy: the heartbeat thread calls this too
        args[1] = count
        args[3] = self._now()
        reply = fcall(self.client, "broker_receive", self.queue, *args)
        status = as_bytes(reply[0])
        if status == b"full":
            raise TooManyConsumers(sub_id, settings.max_consumers_per_subscription)
        if status == b"standby":
            if self.record.mode == "exclusive":
                holder = self.client.get(keys.sub_holder(self.qm, sub_id))
                raise ConsumerConflict(sub_id, as_bytes(holder).decode() if holder else "?")
            self.standby = True
            return []
        self.standby = False
        if count:
            self._drained = len(reply) - 2 < 2 * count  # fewer than asked: broker_receive cleared the bell
        if count and self.hook is not None:
            self.hook("after_receive")
        queue = self.queue
        out = []
        malformed: list[tuple[bytes, str]] = []
        for i in range(2, len(reply), 2):
            raw = reply[i]
            try:  # checked here, so that reading it cannot fail; made when read (Delivery.message)
                header = decode_header(raw)
                values = usual_values(header)
                if values is None:  # an unusual shape (rare): validated, and made, now
                    message = Message.from_header(header, raw[raw.index(b"\n") + 1 :])
            except InvalidMessage as exc:
                malformed.append((raw, f"malformed envelope: {exc}"))
                continue
            if not self._grouped and (
                raw.startswith(_GROUPED_HEAD) or (_before_grouped_head(header) and _GROUP_TEXT in raw)
            ):
                self._grouped = True
            if values is None:
                out.append(Delivery(message, raw, reply[i + 1], queue, None, self))
            else:
                out.append(Delivery(None, raw, reply[i + 1], queue, values, self))
        self._rejected = self.dead_letter_malformed(malformed) if malformed else 0
        return out

    @translate_errors
    def heartbeat(self) -> None:
        """Renew this consumer's lease (and its hold on an exclusive/active-standby
        subscription, taking it over when the holder died), then give back the
        in-flight messages of the subscription's dead consumers.

        Raises:
            ConsumerConflict: the subscription is exclusive and another live consumer holds it.
            TooManyConsumers: this consumer's lease ran out and the subscription has
                ``max_consumers_per_subscription`` live consumers meanwhile.
        """
        was_standby = self.standby
        self.recover_dead()  # first: a dead holder's messages are back before this consumer takes over
        self._take(0)
        if was_standby and not self.standby:
            log.info("consumer %s took over subscription %s", self.consumer_id, self.record.sub_id)

    def _give_back_protocol_2(self) -> int:
        """Move what a protocol-2 subscriber left in the subscription's one in-flight list back to the
        head of the queue, oldest first (a rolling upgrade loses nothing); returns how many."""
        legacy = keys.sub_inflight(self.qm, self.record.sub_id)
        moved = 0
        if not self.client.exists(legacy):  # the usual case; and LMOVE is refused on a full server
            return 0
        while self.client.lmove(legacy, self.queue, "LEFT", "RIGHT") is not None:
            moved += 1
        if moved:
            self.client.rpush(self.bell, b"1")
            log.warning(
                "consumer %s: gave back %d messages left in flight by a protocol-2 subscriber",
                self.consumer_id,
                moved,
            )
        return moved

    def recover_dead(self, closing: str = "") -> tuple[int, int, int]:
        """Give back the in-flight messages of this subscription's dead consumers (see ``recover``);
        with ``closing``, also that consumer's, whatever its lease."""
        settings = self.settings
        now = self._now()
        return recover(
            self.client,
            self.qm,
            self.record.sub_id,
            max_redeliveries=settings.max_redeliveries,
            dead_letter_max_len=settings.dead_letter_max_len,
            forget_ms=forget_ms(settings),
            now_ms=None if now == "" else int(now),
            closing=closing,
        )

    def _beat(self) -> None:
        interval = self.settings.consumer_lease_ms / 3000
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
            except Exception as exc:  # keep beating: the next one may succeed
                log.warning("consumer %s: heartbeat failed: %s", self.consumer_id, exc)

    # -- receiving ------------------------------------------------------------------

    @translate_errors
    def receive_many(self, max_messages: int, timeout_ms: int = 0) -> list[Delivery]:
        """Take up to ``max_messages`` messages into this consumer's in-flight list, in one round trip.

        Highest priority first, oldest first within a priority; messages that
        expired while waiting are skipped (counted; poison messages with
        ``expired_to_dlq``). A standby consumer receives nothing until it takes over.
        Each envelope is checked as it is taken: a malformed one (no header line; a header
        that is not a JSON object, or not UTF-8; a header field missing, of the wrong type or
        out of range) is dead-lettered at once (``dead_letter_malformed``; reason "malformed
        envelope: ...") and left out, and when only such came, it takes again. Each
        delivery's message is made from its checked header when it is first read
        (``Delivery.message``, which then cannot fail).

        Batches of a few hundred are cheapest per message (``python -m scripts.bench`` row 8):
        taking and acknowledging cost a round trip and a fixed part each, and
        ``ack_many`` of a whole batch is one step in Redis.

        Args:
            max_messages: the most messages to take (>= 1).
            timeout_ms: when none is waiting, wait up to this long for one, ms; 0 returns at once.

        Returns:
            The deliveries to acknowledge, oldest first; empty when none came in time.

        Raises:
            ConsumerConflict: the subscription is exclusive and another live consumer holds it.
            TooManyConsumers: this consumer is not attached (its lease ran out) and the
                subscription has ``max_consumers_per_subscription`` live consumers.
            ValueError: ``max_messages`` < 1.
        """
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        deadline = time.monotonic() + timeout_ms / 1000
        # This consumer's last take emptied every band (and so cleared the bell): with time to
        # wait, wait for the bell first, since nothing can be waiting until it rings (one
        # round trip fewer per wake-up of a consumer that keeps up). A take follows the wait.
        # Not for a consumer of message groups: another consumer that passed over its groups'
        # messages may have cleared the bell (docs/protocol.md, "Message groups").
        bell_first = timeout_ms > 0 and self._drained and not self._grouped
        while True:
            if self.standby:
                self.heartbeat()  # takes over when the holder died
            if bell_first:
                bell_first = False
                got = []
            else:
                got = [] if self.standby else self._take(max_messages)
            if got:
                return got
            if self._rejected:
                continue  # only malformed envelopes came (dead-lettered): take again at once
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return []
            if self.standby:
                # the heartbeat takes over when the holder dies; look again then
                self._stop.wait(min(left_ms, self.settings.consumer_lease_ms / 3) / 1000)
                continue
            # wait for the bell without taking it (a list moved onto itself is unchanged)
            wait_s: Any = (
                min(left_ms, self.settings.consumer_lease_ms // 3, block_slice_ms(self.client)) / 1000
            )
            try:
                self.client.blmove(self.bell, self.bell, wait_s, "RIGHT", "RIGHT")
            except redis.exceptions.OutOfMemoryError:
                # a full server refuses BLMOVE (it may add memory): look again a moment later
                time.sleep(min(wait_s, FULL_POLL_MS / 1000))

    def receive(self, timeout_ms: int = 0) -> Delivery | None:
        """Take the next message (see ``receive_many``); None when none came in time.

        A malformed envelope is dead-lettered and passed over (``receive_many``).
        """
        got = self.receive_many(1, timeout_ms)
        return got[0] if got else None

    @translate_errors
    def dead_letter_malformed(self, envelopes: list[tuple[bytes, str]]) -> int:
        """Make poison messages of envelopes this consumer took but cannot read (``broker_reject``):
        each is removed from its in-flight list and added to the subscription's poison stream
        (``keys.sub_poison``) in one step, with
        ``dlq.reason`` (e.g. "malformed envelope: envelope has no header line"), its
        ``dlq.entry_id`` when its header names one, and ``dlq.subscription``.

        Args:
            envelopes: ``[(envelope as received, reason)]``.

        Returns:
            How many were dead-lettered (one no longer in flight is not).

        Raises:
            ForeignKey: the in-flight list, the redelivery hash or the poison stream holds
                another Redis type.
        """
        args: list[Any] = [self.consumer_id, self.settings.dead_letter_max_len]
        for raw, reason in envelopes:
            args += [raw, reason]
        done = int(fcall(self.client, "broker_reject", self.queue, *args))
        for raw, reason in envelopes:
            log.warning("consumer %s: %s: dead-lettering %r", self.consumer_id, reason, raw[:80])
        return done

    # -- acknowledging --------------------------------------------------------------

    @translate_errors
    def ack_many(self, deliveries: Iterable[Delivery]) -> int:
        """Acknowledge deliveries in one round trip (``broker_ack``); returns how many were still in flight.

        Acknowledging the whole batch last received (or its oldest part) is one step
        in Redis whatever its size; any other subset costs a search per message from
        the oldest end of this consumer's in-flight list. A delivery no longer in
        flight (this consumer's lease lapsed and its messages were given back for
        redelivery) is not counted and changes nothing.

        Raises:
            ForeignKey: the in-flight list or the redelivery hash holds another Redis type.
        """
        raws = [delivery.raw for delivery in deliveries]
        if not raws:
            return 0
        acked = int(fcall(self.client, "broker_ack", self.queue, self.consumer_id, *raws))
        if self.hook is not None:
            self.hook("after_ack")
        return acked

    def ack(self, delivery: Delivery) -> bool:
        """Acknowledge one delivery; False when it was no longer in flight (see ``ack_many``)."""
        return self.ack_many([delivery]) == 1

    # -- looking ----------------------------------------------------------------------

    def browse(self, n: int = 10) -> list[Message]:
        """The next ``n`` waiting messages, in the order they would be received, without taking them
        (see the module function ``browse``)."""
        now = None if self.clock_ms is None else self.clock_ms()
        return browse(self.client, self.qm, self.record, n, now_ms=now)

    @translate_errors
    def depth(self) -> int:
        """Messages waiting in the subscription (every priority band; in-flight ones not counted)."""
        pipe = self.client.pipeline(transaction=False)
        for band in self.bands:
            pipe.llen(band)
        return sum(int(n) for n in pipe.execute())

    @translate_errors
    def in_flight(self) -> int:
        """Messages this consumer holds, not yet acknowledged."""
        return int(self.client.llen(self.inflight))

    # -- closing ----------------------------------------------------------------------

    @translate_errors
    def close(self) -> None:
        """Stop consuming: unacknowledged messages go back to the queue for redelivery, the
        lease and hold are given up, and a non-durable subscription with no other live
        consumer is removed with its queue (by the workers' sweep when this client's ACL user,
        a ``subscriber``, may not remove subscriptions)."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        now = self._now()
        self.recover_dead(closing=self.consumer_id)
        if not self.record.durable:
            cutoff = clock.now_ms() + 1 if now == "" else int(now) + 1
            try:
                remove_subscription(self.client, self.qm, self.record.sub_id, abandoned_before_ms=cutoff)
            except (
                redis.exceptions.NoPermissionError
            ):  # a subscriber ACL user (broker.operations.acl) may not
                log.info(  # remove subscriptions: the workers' sweep removes it, as it has no consumer
                    "consumer %s: subscription %s is left to the workers' sweep to remove",
                    self.consumer_id,
                    self.record.sub_id,
                )

    def abandon(self) -> None:
        """Stop heartbeating without closing, as a consumer that died would (tests and fault injection)."""
        self.closed = True
        self._stop.set()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@translate_errors
def browse(
    client: redis.Redis, qm: str, record: SubscriptionRecord, n: int = 10, now_ms: int | None = None
) -> list[Message]:
    """The next ``n`` waiting messages of a subscription, in the order they would be received.

    Like Jakarta Messaging's ``QueueBrowser``: nothing changes (one ``FCALL_RO broker_browse``,
    read only). Messages whose expiration has passed are left out.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        record: the subscription.
        n: the most messages returned (at most ``BROWSE_MAX``, the library's bound).
        now_ms: the time for expiry, ms since the epoch; None for the server's clock.

    Raises:
        InvalidMessage: an envelope is malformed.
        ValueError: ``n`` is over ``BROWSE_MAX``.
        LibraryMissing: the server has no ``broker`` library and this user may not load it.
    """
    if n > BROWSE_MAX:
        raise ValueError(f"browse shows at most {BROWSE_MAX} messages, not {n}")
    if n <= 0:
        return []
    queue = keys.sub_queue(qm, record.sub_id)
    found = fcall(client, "broker_browse", queue, n, "" if now_ms is None else now_ms, read_only=True)
    return [_decode(as_bytes(item), queue) for item in found]


def consumers_of(
    client: redis.Redis, qm: str, sub_id: str, now_ms: int | None = None
) -> list[tuple[str, int]]:
    """The subscription's consumers with live leases: ``[(consumer id, lease deadline ms)]``."""
    now = clock.now_ms() if now_ms is None else now_ms
    raw: Any = client.zrangebyscore(keys.sub_consumers(qm, sub_id), now, "+inf", withscores=True)
    return [(as_bytes(c).decode(), int(score)) for c, score in raw]
