"""Decide: an entry, the routing table and the settings in, a unit of work out. No Redis.

The middle step of a worker's round (``worker.loop``: dequeue -> decide -> commit -> apply). For
each FIFO head the worker holds, it says what the unit of work does: deliver (to which subscriber
queues and channels, with which envelope, under which delivery policy), expire, refuse (with the
reason, dead-lettered unless USEDLQ(NO)) or skip (gone from the stream), and groups the units into
the ``commit.lua`` calls of the round (``CommitBatch``, a round's worth each: ``Decider.chunk``).

Nothing here reads or writes Redis: the routing table was loaded by the worker
(``broker.topics.routing.RoutingTable``), the entries were read by the dequeue, and the time is given, so
every rule can be tested without a server (``tests/unit/test_decide.py``). A principal with publish
grants (``broker.topics.grants``) publishing on a topic none of them matches is refused here, inside
the unit of work, dead-lettered with the reason and answered like every refusal. Nothing here raises
either: an entry that cannot be handled is refused with the reason (bad input never stops a worker).
"""

from __future__ import annotations

import logging

from broker.core import keys, wire
from broker.core.config import Settings
from broker.core.entries import apply_topic_defaults, parse_entry
from broker.core.errors import InvalidMessage, InvalidTopic
from broker.core.logs import publication_extra
from broker.core.models import encode_envelope
from broker.core.schemes import root_topic, separator
from broker.core.topic_rules import limit_problem
from broker.core.unit_of_work import Action, CommitBatch, Retain, UnitOfWork
from broker.topics.queue_controllers import PersistenceModes
from broker.topics.routing import RoutingTable

log = logging.getLogger("broker.worker")

#: The fewest publications a ``commit.lua`` call may hold before the next publisher's units go to
#: another call (``Decider.chunk``: ``batch_size`` when larger). A call bounds how long Redis is held
#: (about 15 ms for 500 publications of the 2-worker bench row); a round split into two calls let
#: another worker's dequeue run between them and find half the round's turns given up: it took those,
#: the rest came a round later (rounds of 260 and 740 publications instead of 500), and the drain's
#: server was 75-91% busy against 92-98% with one call a round, which also pushes each queue's copies
#: in fewer ``LPUSH`` (1.7 a publication against 2.5).
COMMIT_CHUNK = 256

#: Most topics ``Decider`` remembers as within the topic limits (``limit_problem``: checked once a topic).
WITHIN_LIMITS_KEPT = 100_000

#: ``{entry id: (publisher, fields)}``: the entries a worker has read (fields bytes to bytes).
Entries = dict[str, tuple[str, dict[bytes, bytes]]]


def msgid_of(fields: dict[bytes, bytes], entry_id: str) -> str:
    """The message id of an entry, its bytes as sent (``surrogateescape``: a msgid that is not
    UTF-8 round-trips, so its reply and dedup keys are those the publisher built), or the entry id."""
    raw = fields.get(b"msgid")
    return wire.exact_text(raw) if raw else entry_id


def log_refused(unit: UnitOfWork) -> None:
    """Log a publication its committed unit of work refused (dead-lettered unless USEDLQ(NO)), with its keys."""
    if not log.isEnabledFor(logging.WARNING):
        return
    # a deliver refused by commit.lua (a full MAXDEPTH queue under ALL, a foreign key): the reason
    # is in the dead-letter record
    reason = unit.reason or "delivered to no subscription (a subscriber queue refused it)"
    log.warning(
        "publication refused: %s; %s",
        reason,
        "dead-lettered" if unit.dead_letter else "not dead-lettered (USEDLQ(NO))",
        extra=publication_extra(unit.entry_id, msgid=unit.msgid, publisher=unit.publisher),
    )


class Decider:
    """Builds units of work from entries, for one worker.

    Args:
        settings: the broker settings (limits, reply and dedup windows, max_deliveries, journal,
            slow-subscriber conditions, queue controllers).
        table: the worker's routing table; the worker keeps it at the dequeue's version, and the
            decider reads it as it is at each call.
    """

    def __init__(self, settings: Settings, table: RoutingTable) -> None:
        self.settings = settings
        self.table = table
        #: root topic -> its slow-subscriber condition
        self.slow = {c.name: c for c in settings.slow_subscriber_conditions}
        #: the delivery modes the queue controllers give subscriber queues; None when none does (a
        #: plain test per publication, not PersistenceModes.__bool__)
        modes = PersistenceModes(settings)
        self.persistence = modes if modes else None
        #: topics found within the topic limits (the limits are settings: they never change); cleared
        #: when it holds ``WITHIN_LIMITS_KEPT``
        self._within_limits: set[str] = set()
        #: the fewest publications a commit call holds before another starts: a round's worth (what one
        #: dequeue reads, ``batch_size``), ``COMMIT_CHUNK`` at least
        self.chunk = max(COMMIT_CHUNK, settings.batch_size)

    def batches(
        self, heads: dict[str, list[str]], entries: Entries, times: dict[str, int], now_ms: int
    ) -> list[CommitBatch]:
        """The units of work of the heads, in FIFO order per publisher, in batches of ``chunk`` publications
        (a publisher's heads all in one batch: a batch holds ``chunk`` or more only by its last publisher's).

        Args:
            heads: ``{publisher: [entry ids]}`` in FIFO order, the heads to handle this round.
            entries: the entries read; a head missing here is gone from the stream (skipped).
            times: ``{entry id: times delivered}`` of heads taken over; a publisher's first head
                delivered more than ``max_deliveries`` times is refused (its workers died on it).
            now_ms: the time, ms since the epoch (expiry).
        """
        journal = self.settings.journal
        chunk = self.chunk
        max_deliveries = self.settings.max_deliveries
        unit_of_work = self.unit_of_work
        add = self._add if self._bounds_or_watches() else None  # pay for what you use
        batches = [CommitBatch(journal)]
        for publisher, ids in heads.items():
            batch = batches[-1]
            if len(batch) >= chunk:
                batch = CommitBatch(journal)
                batches.append(batch)
            first = ids[0]
            delivered = times.get(first, 1) if times else 1
            for entry_id in ids:
                found = entries.get(entry_id)
                if found is None:
                    log.warning(
                        "entry %s of publisher %r is gone from the stream; skipping it",
                        entry_id,
                        publisher,
                        extra=publication_extra(entry_id, publisher=publisher),
                    )
                    batch.add(UnitOfWork(publisher, entry_id, Action.SKIP, entry_id))
                elif delivered > max_deliveries and entry_id == first:
                    batch.add(self._poison(publisher, entry_id, found[1], delivered))
                elif add is None:
                    batch.add(unit_of_work(publisher, entry_id, found[1], now_ms))
                else:
                    add(batch, unit_of_work(publisher, entry_id, found[1], now_ms))
        return batches

    def _poison(
        self, publisher: str, entry_id: str, fields: dict[bytes, bytes], delivered: int
    ) -> UnitOfWork:
        """The refusal of a head its workers kept dying on (``max_deliveries``)."""
        max_deliveries = self.settings.max_deliveries
        reason = (
            f"taken over {delivered} times without being handled: its workers died "
            f"(max_deliveries {max_deliveries})"
        )
        log.error(
            "entry %s: %s; dead-lettering it",
            entry_id,
            reason,
            extra=publication_extra(entry_id, fields, publisher=publisher),
        )
        return self.refusal(publisher, entry_id, fields, reason)

    def _bounds_or_watches(self) -> bool:
        """Whether ``_add`` may bound or watch a queue: a MAXDEPTH, a slow-subscriber condition, or
        topic objects (PMSGDLV/NPMSGDLV(ALLDUR) come from their attributes only)."""
        return bool(self.table.queue_limits or self.slow or not self.table.tree.trivial)

    def _add(self, batch: CommitBatch, unit: UnitOfWork) -> None:
        """Add ``unit`` to ``batch`` with the queue bounds (MAXDEPTH) and watches (a slow-subscriber
        condition; PMSGDLV/NPMSGDLV(ALLDUR), which must know the durable ones) its queues need: none
        when nothing is configured."""
        batch.add(unit)
        limits = self.table.queue_limits
        if limits and unit.queues:
            for queue in unit.queues:
                bound = limits.get(queue)
                if bound is not None:
                    batch.limit(queue, *bound)
        if unit.slow is not None or unit.delivery == "ALLDUR":  # ALLDUR: which queues are durable
            subscriptions = self.table.subscriptions
            qm = self.settings.qm
            for queue in unit.queues:
                record = subscriptions.get(keys.band_sub_id(qm, queue))
                if record is not None:  # not a transmission stream
                    batch.watch(queue, record.durable)

    def _check_limits(self, topic: str) -> None:
        """Check ``topic`` against the broker's limits (``limit_problem``), and remember it within them.

        Raises:
            InvalidTopic: over a limit.
        """
        settings = self.settings
        over = limit_problem(
            topic,
            settings.max_topic_bytes,
            settings.max_topic_levels,
            separator(self.table.scheme),
            "the topic",
        )
        if over is not None:
            raise InvalidTopic(topic, over)
        if len(self._within_limits) >= WITHIN_LIMITS_KEPT:
            self._within_limits.clear()
        self._within_limits.add(topic)

    def refusal(
        self,
        publisher: str,
        entry_id: str,
        fields: dict[bytes, bytes],
        reason: str,
        suggestion: str = "",
        dead_letter: bool = True,
        policy: bool = False,
    ) -> UnitOfWork:
        """The unit of work that refuses an entry (dead-letters it unless USEDLQ(NO), posts "refused" if asked);
        ``policy``: a topic object's policy refused it (PUB(DISABLED))."""
        reply_ttl = self.settings.reply_ttl_ms if fields.get(b"reply") == b"1" else 0
        return UnitOfWork(
            publisher,
            entry_id,
            Action.REFUSE,
            msgid_of(fields, entry_id),
            reason=reason,
            suggestion=suggestion,
            reply_ttl_ms=reply_ttl,
            dead_letter=dead_letter,
            policy=policy,
        )

    def unit_of_work(
        self, publisher: str, entry_id: str, fields: dict[bytes, bytes], now_ms: int
    ) -> UnitOfWork:
        """The unit of work of one entry: deliver, expire, or refuse with the reason. Never raises.

        The one place a unit of work is built from an entry, or from the error that refused it.

        Args:
            publisher: the FIFO the entry was filed under.
            entry_id: the stream entry id.
            fields: the entry's fields, bytes to bytes.
            now_ms: the time, ms since the epoch (expiry).
        """
        settings = self.settings
        table = self.table
        delivery, dead_letter, slow = "ALLAVAIL", True, None
        try:
            entry = parse_entry(entry_id, fields, settings.max_body_bytes, settings.max_properties_bytes)
            # before resolving: an abusive topic must not cost a match over thousands of levels
            if entry.topic not in self._within_limits:
                self._check_limits(entry.topic)
            recipients = table.resolve(entry.topic)
            grants = table.grants  # None without grants: nothing else is spent per publication
            if grants is not None and "origin" not in entry.header:  # checked at its own queue manager
                principal = entry.header.get("principal")
                if not grants.may_publish(principal, entry.topic):
                    reason = f"not authorized: principal {principal} may not publish on {entry.topic!r}"
                    return self.refusal(publisher, entry_id, fields, reason)
            attributes = recipients.attributes
            if attributes is not None:  # a topic object at or above the topic (broker.topics.topic_objects)
                dead_letter = attributes["usedlq"] == "YES"
                if attributes["pub"] == "DISABLED":
                    reason = (
                        f"publishing on {entry.topic!r} is disabled: topic object "
                        f"{attributes.source['pub']!r} has PUB(DISABLED)"
                    )
                    return self.refusal(
                        publisher, entry_id, fields, reason, dead_letter=dead_letter, policy=True
                    )
                apply_topic_defaults(entry, fields, attributes)
                persistent = entry.header.get("persistent", True)
                delivery = attributes["pmsgdlv"] if persistent else attributes["npmsgdlv"]
            queues = table.queues(entry, recipients)
            if table.topology is not None:  # in a network: the proxy subscriptions' channels
                forwards = table.forwards(entry, attributes)
                if forwards:
                    queues = (*queues, *forwards)
            if self.persistence is not None and queues:  # a queue controller's persistence mode (seed 003)
                forced = self.persistence.apply(entry.header, queues)
                if forced is not None and attributes is not None:
                    delivery = attributes["pmsgdlv"] if forced else attributes["npmsgdlv"]
            # a retained publication keeps its envelope even when no subscription gets it
            envelope = encode_envelope(entry.header, entry.body) if queues or entry.retain else b""
            if self.slow and queues:
                condition = self.slow.get(root_topic(entry.topic, table.scheme))
                if condition is not None and condition.applies(entry.header.get("persistent", True)):
                    slow = condition
        except InvalidTopic as exc:
            return self.refusal(publisher, entry_id, fields, exc.reason, exc.suggestion or "")
        except InvalidMessage as exc:
            return self.refusal(publisher, entry_id, fields, str(exc))
        except Exception as exc:  # a bug must not stop the worker: dead-letter the entry
            log.exception(
                "entry %s could not be handled",
                entry_id,
                extra=publication_extra(entry_id, fields, publisher=publisher),
            )
            return self.refusal(publisher, entry_id, fields, f"internal error: {exc!r}")
        seq = entry.header["seq"]
        reply_ttl = settings.reply_ttl_ms if entry.reply else 0
        if entry.expiration_ms and entry.expiration_ms <= now_ms:
            return UnitOfWork(
                publisher,
                entry_id,
                Action.EXPIRE,
                entry.msgid,
                reply_ttl_ms=reply_ttl,
                seq=seq,
                topic=entry.topic,
                enqueued_ms=entry.timestamp_ms,
            )
        window = settings.dedup_window_ms if entry.msgid_given else 0
        retain = (Retain.STORE if entry.body else Retain.CLEAR) if entry.retain else Retain.NONE
        # positional, in UnitOfWork's field order (once per publication: 0.44 us where keywords take 0.97)
        return UnitOfWork(
            publisher,
            entry_id,
            Action.DELIVER,
            entry.msgid,
            envelope,
            queues,
            "",  # reason
            "",  # suggestion
            window,
            reply_ttl,
            seq,
            entry.topic,
            entry.timestamp_ms,  # enqueued_ms
            delivery,
            dead_letter,
            slow,
            False,  # policy
            retain,
        )
