"""What the chaos harness published and received, and the check of the guarantees.

A publication is *acknowledged* once its ``XADD`` returned an entry id. One
whose outcome is unknown (the connection was lost before the reply and the
harness gave up retrying) may be delivered 0 or 1 times, never twice.

The check, per subscription and publisher (Jepsen's queue checker, reduced to
what a per-publisher FIFO promises; each subscription is scored by
``broker.demo.oracle.score``, the checker the demo uses too):

- **lost**: an acknowledged publication whose topic (or a topic linked from it)
  matches the subscription, never received by it;
- **duplicated**: a publication received more than once by one subscription,
  the later receipt not flagged redelivered (a consumer that dies or stalls
  before acknowledging gets its messages redelivered, flagged: **redelivered**,
  reported, not a failure);
- **reordered**: a publication received after a later publication of the same
  publisher (first receipts only);
- **unexpected**: a message that was never published, or not for this subscription.

Some publications are *refusable*: those on a victim topic or of a victim
publisher, whose keys the harness turns foreign for a while (a key of another
Redis type where the broker keeps a subscriber queue, a reply list, a dedup
record, a FIFO or a turn). Each must end either delivered once to every one of
its recipients, or *refused as a whole*: in the dead-letter stream (once per
entry, ``dlq.entry_id``) with a reason containing "foreign key", and received
by none. Refused ones are not lost; order is checked over the delivered ones.
A subscriber queue of another type makes only its subscription *unavailable*
(PMSGDLV/NPMSGDLV(ALLAVAIL), the default; issue 27): the publication is delivered
to its other recipients, and that subscription's copy is in the dead-letter
stream (``dlq.subscription``, ``dlq.entry_id``, a reason starting "subscription
unavailable"). Such a copy counts as received for the check (**unavailable_copies**).

- **half_applied**: a refusable publication refused but received by some
  subscription (an envelope of a refused entry), or received by some of its
  recipients and neither received by nor dead-lettered for (unavailable) the others;
- **refused_by_foreign_key**: refusable publications refused, received by none;
- **foreign_not_refused**: a publication whose reply list or dedup record the
  harness planted before publishing it (``planted``), yet not refused, or received;
- **refused_repeated**: an entry refused for a foreign key dead-lettered more than once;
- **refused_after_delivered** (reported, not a failure): a retry of a delivered
  publication (same msgid, a later entry) refused for a foreign key instead of
  answered "duplicate".

Poison entries (acknowledged raw ``XADD``s the broker must refuse) must each be
in the dead-letter stream exactly once (``dlq.entry_id``) with a reason. A killer
entry (every worker that handles it dies) is one, with "max_deliveries" in its reason.

- **good_dead_lettered**: a publication that is not refusable found in the
  dead-letter stream (e.g. charged for the deaths of workers that died on a
  killer entry held with it), or a copy of one dead-lettered as unavailable: a failure.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis

from broker.demo import oracle
from broker.testing import queue_messages


def recipients(topic: str, filters: dict[str, str], links: list[tuple[str, str]]) -> frozenset[str]:
    """The subscription ids (keys of ``filters``) a publication on ``topic`` must reach, computed independently."""
    return oracle.recipients(topic, filters, oracle.link_targets(links))


def network_recipients(
    topic: str, origin: str, filters: Mapping[str, tuple[str, str]], edges: Iterable[tuple[str, str]]
) -> frozenset[str]:
    """The subscription ids a publication on ``topic`` made at queue manager ``origin`` must reach
    in a network of queue managers, computed independently of ``broker.topics.topology`` and
    ``broker.topics.routing``: every subscription whose filter matches ``topic`` at a queue manager
    that ``origin`` reaches over ``edges``.

    Args:
        topic: the topic published on.
        origin: the queue manager it was published at.
        filters: subscription id -> (its queue manager, its filter), over the whole network.
        edges: the channels the topic's route class may use (the hierarchy's parent-child
            pairs, plus for a cluster topic every pair of the cluster's members). Every
            subscription is announced everywhere (no announce filters, no ``SUBSCOPE(QMGR)``).
    """
    adjacent: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adjacent[a].add(b)
        adjacent[b].add(a)
    reached, queue = {origin}, deque([origin])
    while queue:
        for there in adjacent[queue.popleft()] - reached:
            reached.add(there)
            queue.append(there)
    local = {sub: flt for sub, (qm, flt) in filters.items() if qm in reached}
    return oracle.recipients(topic, local, {})


def foreign_key_of(reason: str) -> str:
    """The key a "foreign key: <key> holds a <type>, ..." reason names ("" when there is none)."""
    _, found, rest = reason.partition("foreign key: ")
    return rest.partition(" holds a ")[0] if found else ""


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


@dataclass
class Publication:
    """One publication of the harness.

    Attributes:
        publisher: the publisher id.
        number: 1, 2, ... in the order the publisher published.
        msgid: the message id (the same on every retry).
        topic: the topic.
        recipients: the subscription ids that must receive it.
        acked: an XADD of it returned an entry id.
        entry_id: that entry id.
        attempts: how many times it was sent.
        acked_at: ``time.monotonic()`` when the XADD returned, or None.
        refusable: the harness may make one of its keys foreign (a victim topic or
            publisher): it may end refused as a whole instead of delivered.
        planted: the fault kind ("foreign:reply", "foreign:dedup") when a foreign
            key was planted for it before it was published: it must end refused.
    """

    publisher: str
    number: int
    msgid: str
    topic: str
    recipients: frozenset[str]
    acked: bool = False
    entry_id: str | None = None
    attempts: int = 0
    acked_at: float | None = None
    refusable: bool = False
    planted: str | None = None


@dataclass
class Poison:
    """One malformed entry the harness wrote on purpose.

    Attributes:
        kind: what is wrong with it.
        marker: the value of its ``chaos.poison`` field.
        expect: a fragment the dead-letter reason must contain ("" for any).
        acked: its XADD returned an entry id.
        entry_id: that entry id.
    """

    kind: str
    marker: str
    expect: str = ""
    acked: bool = False
    entry_id: str | None = None


@dataclass
class Verdict:
    """The result of ``History.check``."""

    publications: int = 0
    refusable: int = 0
    unknown: int = 0
    deliveries: int = 0
    dead_lettered: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    reordered: int = 0
    unexpected: int = 0
    unknown_delivered: int = 0
    good_dead_lettered: int = 0
    poison_acked: int = 0
    poison_missing: int = 0
    poison_repeated: int = 0
    poison_bad_reason: int = 0
    half_applied: int = 0
    refused_by_foreign_key: int = 0
    foreign_not_refused: int = 0
    refused_repeated: int = 0
    refused_after_delivered: int = 0
    unavailable_copies: int = 0
    refused_keys: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No guarantee was broken."""
        return not (
            self.lost
            or self.duplicated
            or self.reordered
            or self.unexpected
            or self.poison_missing
            or self.poison_repeated
            or self.poison_bad_reason
            or self.half_applied
            or self.foreign_not_refused
            or self.refused_repeated
            or self.good_dead_lettered
        )

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)


class History:
    """Thread-safe record of publications, poison entries and receipts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.publications: dict[str, list[Publication]] = defaultdict(list)
        self.by_msgid: dict[str, Publication] = {}
        self.poison: list[Poison] = []
        self.received: dict[str, list[tuple[str, bool]]] = defaultdict(list)
        self.received_at: dict[str, list[float]] = defaultdict(list)
        #: msgid -> the stream entry ids its received envelopes came from (None: not known)
        self.received_entries: dict[str, set[str | None]] = defaultdict(set)

    def add_publication(self, publication: Publication) -> None:
        with self._lock:
            self.publications[publication.publisher].append(publication)
            self.by_msgid[publication.msgid] = publication

    def add_poison(self, poison: Poison) -> None:
        with self._lock:
            self.poison.append(poison)

    def receive(
        self, sub_id: str, msgid: str, entry_id: str | None = None, redelivered: bool = False
    ) -> None:
        """Record that ``sub_id`` received ``msgid`` (from stream entry ``entry_id``, when known),
        flagged redelivered or not."""
        now = time.monotonic()
        with self._lock:
            self.received[sub_id].append((msgid, redelivered))
            self.received_at[sub_id].append(now)
            self.received_entries[msgid].add(entry_id)

    def latencies_ms(self) -> list[float]:
        """From acknowledgement to first receipt, per (subscription, publication), sorted, ms."""
        out = []
        with self._lock:
            for sub_id, receipts in self.received.items():
                seen: set[str] = set()
                for (msgid, _), at in zip(receipts, self.received_at[sub_id], strict=True):
                    pub = self.by_msgid.get(msgid)
                    if pub is None or pub.acked_at is None or msgid in seen:
                        continue
                    seen.add(msgid)
                    out.append(max(0.0, (at - pub.acked_at) * 1000))
        return sorted(out)

    def counts(self) -> tuple[int, int, int]:
        """(acknowledged publications, unknown ones, receipts) so far."""
        with self._lock:
            pubs = [p for ps in self.publications.values() for p in ps]
            return (
                sum(p.acked for p in pubs),
                sum(not p.acked for p in pubs),
                sum(len(r) for r in self.received.values()),
            )

    def check(self, subscriptions: list[str], dead_letters: list[tuple[str, dict[bytes, bytes]]]) -> Verdict:
        """Check everything recorded against the guarantees.

        Args:
            subscriptions: every subscription id that was consumed.
            dead_letters: the dead-letter stream's entries ``(id, fields)``.

        Returns:
            The ``Verdict``.
        """
        v = Verdict()
        with self._lock:
            pubs = [p for ps in self.publications.values() for p in ps]
            v.publications = sum(p.acked for p in pubs)
            v.unknown = len(pubs) - v.publications
            v.refusable = sum(p.acked and p.refusable for p in pubs)
            received = {s: list(self.received.get(s, [])) for s in subscriptions}
            received_entries = {m: set(e) for m, e in self.received_entries.items()}
        unknown_seen: set[str] = set()
        got: dict[str, set[str]] = defaultdict(set)  # msgid -> subscriptions that received it
        published = {
            p.msgid: oracle.Expectation(p.publisher, p.number, p.recipients) for p in self.by_msgid.values()
        }
        for sub_id, msgids in received.items():
            owed = (p.msgid for p in pubs if p.acked and not p.refusable and sub_id in p.recipients)
            result = oracle.score(sub_id, msgids, published, owed)
            v.deliveries += result.received
            v.lost += result.lost
            v.duplicated += result.duplicated
            v.redelivered += result.redelivered
            v.reordered += result.out_of_order
            v.unexpected += result.unexpected
            for text in result.examples:
                v.note(text)
            for msgid in result.first:
                got[msgid].add(sub_id)
                if not self.by_msgid[msgid].acked:
                    unknown_seen.add(msgid)
        v.unknown_delivered = len(unknown_seen)

        v.dead_lettered = len(dead_letters)
        by_entry: Counter[str] = Counter()
        reasons: dict[str, str] = {}
        refused: dict[str, set[str]] = defaultdict(set)  # msgid -> entries refused for a foreign key
        unavailable: dict[str, set[str]] = defaultdict(set)  # entry id -> subscriptions its copy missed
        for _, fields in dead_letters:
            entry_id = fields.get(b"dlq.entry_id", b"").decode()
            reason = fields.get(b"dlq.reason", b"").decode("utf-8", "replace")
            if b"dlq.subscription" in fields and reason.startswith("subscription unavailable: "):
                unavailable[entry_id].add(fields[b"dlq.subscription"].decode("utf-8", "replace"))
                v.unavailable_copies += 1
                continue
            by_entry[entry_id] += 1
            reasons[entry_id] = reason
            raw_msgid = fields.get(b"msgid")
            pub = None if raw_msgid is None else self.by_msgid.get(raw_msgid.decode("utf-8", "replace"))
            if pub is not None and fields.get(b"publisher", b"").decode("utf-8", "replace") != pub.publisher:
                pub = None
            if b"chaos.poison" in fields or pub is None:
                continue
            if pub.refusable and "foreign key" in reason:
                refused[pub.msgid].add(entry_id)
                v.refused_keys[foreign_key_of(reason)] += 1
                continue
            v.good_dead_lettered += 1
            v.note(f"dead-lettered good publication {raw_msgid!r}: {reason}")
        for pub in pubs:
            came_from = received_entries.get(pub.msgid, set())
            dropped = set().union(*(unavailable.get(e, set()) for e in {*came_from, pub.entry_id} if e))
            if not pub.refusable:
                if dropped:
                    v.good_dead_lettered += 1
                    v.note(f"dead-lettered copies of good publication {pub.msgid!r} for {sorted(dropped)}")
                continue
            entries = refused.get(pub.msgid, set())
            v.refused_repeated += sum(by_entry[e] > 1 for e in entries)
            receivers = got.get(pub.msgid, set()) | (dropped & pub.recipients)
            refused_but_received = bool(entries and receivers and (None in came_from or entries & came_from))
            what = f"{pub.msgid} ({pub.topic}, entry {pub.entry_id}, refused entries {sorted(entries)})"
            if refused_but_received:
                v.half_applied += 1
                v.note(f"half-applied: {what} refused, yet received by {sorted(receivers)}")
            elif receivers and receivers != pub.recipients:
                v.half_applied += 1
                v.note(
                    f"half-applied: {what} received by {sorted(receivers)}, "
                    f"not by {sorted(pub.recipients - receivers)}"
                )
            elif not receivers and entries:
                v.refused_by_foreign_key += 1
            elif receivers and entries:
                delivered_from = [_entry_key(e) for e in came_from if e is not None]
                if delivered_from and max(_entry_key(e) for e in entries) > min(delivered_from):
                    v.refused_after_delivered += 1
                    v.note(
                        f"refused after delivered (not a failure): {what}, delivered from {sorted(came_from)}"
                    )
            elif not receivers and pub.acked and pub.recipients:
                v.lost += 1
                v.note(f"lost: {what} neither received nor refused")
            if pub.planted and pub.acked and (receivers or not entries):
                v.foreign_not_refused += 1
                v.note(f"{pub.planted} planted for {what}, yet not refused (received by {sorted(receivers)})")
        for poison in self.poison:
            if not poison.acked or poison.entry_id is None:
                continue
            v.poison_acked += 1
            n = by_entry.get(poison.entry_id, 0)
            if n == 0:
                v.poison_missing += 1
                v.note(f"poison {poison.kind} {poison.entry_id} is not in the dead-letter stream")
            elif n > 1:
                v.poison_repeated += 1
                v.note(f"poison {poison.kind} {poison.entry_id} is in the dead-letter stream {n} times")
            elif not reasons[poison.entry_id] or poison.expect not in reasons[poison.entry_id]:
                v.poison_bad_reason += 1
                v.note(f"poison {poison.kind} {poison.entry_id}: reason {reasons[poison.entry_id]!r}")
        return v


def check_queues(
    client: redis.Redis,
    qm: str,
    filters: dict[str, str],
    links: list[tuple[str, str]],
    published: dict[str, list[tuple[str, str]]],
) -> list[str]:
    """Check subscriber queues (read, not consumed) against what was published (the tests use it).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        filters: subscription id -> topic filter, for every subscription to check.
        links: the links (source, target) in force.
        published: publisher -> ``[(msgid, topic)]`` in publish order, every one acknowledged.

    Returns:
        One line per problem (lost, duplicated, reordered, unexpected); empty when none.
    """
    problems = []
    for sub_id in filters:
        got = [m.msgid for m in queue_messages(client, qm, sub_id)]
        expected_all: set[str] = set()
        for publisher, items in published.items():
            expected = [msgid for msgid, topic in items if sub_id in recipients(topic, filters, links)]
            expected_all.update(expected)
            mine = [m for m in got if m in set(expected)]
            if mine != expected:
                missing = [m for m in expected if m not in mine]
                extra = len(mine) - len(set(mine))
                problems.append(
                    f"{sub_id} / {publisher}: got {mine}, expected {expected} "
                    f"(lost {missing}, duplicated {extra})"
                )
        unexpected = [m for m in got if m not in expected_all]
        if unexpected:
            problems.append(f"{sub_id}: unexpected {unexpected}")
    return problems
