"""Message groups in the chaos workload (issue 28 row 12): a publisher of grouped publications,
the consumers of one shared subscription (some killed, some closed), and the checker.

The publisher ``g0`` publishes on ``GROUP_TOPICS`` with ``group=`` one of ``GROUPS`` and
``group_seq=`` 1, 2, ... per group (``Publisher.publish``); its publications are ordinary ones
for the harness's own history too (the ``#`` subscription receives them). ``CONSUMERS`` threads
consume the shared subscription ``GROUP_FILTER``, each through a ``Subscriber`` (heartbeat on),
acknowledging every batch; on ``group_consumer_kill`` a consumer is abandoned with its batch in
flight (its lease lapses, the broker frees its groups and gives the batch back), on
``group_consumer_close`` it closes with its batch unacknowledged, and a consumer of a new id takes
its place. ``GroupLog`` records, in the order they happen, each receipt, each acknowledgement and
each consumer's end (recorded before the consumer stops, so before the broker can give its groups
to another), and ``GroupLog.check`` verifies:

- **shared**: no consumer receives a message of a group another consumer received and has not
  ended (no two consumers hold one group at once). A consumer whose lease may have lapsed when
  the other received (no renewal of it that ended before that receive began started within a
  lease of the receive's end: its heartbeat thread stalled, on a busy box) was dead to the
  broker, which rightly gave its groups away; it is counted as ``lapsed`` (a zombie: it goes on
  after its lease, as a process that paused would), not as shared, and holds nothing from then on
  (and an acknowledgement it made when its lease may have lapsed counts as maybe acknowledged);
- **reordered**: a consumer receives a group's message only when every earlier message of the
  group (published, with a known outcome) is acknowledged or already received by it: in order,
  and a new owner gets its predecessor's unacknowledged messages first;
- **lost**: a grouped publication whose ``XADD`` was acknowledged and that no consumer received;
- **duplicated**: a message received again after it was acknowledged, or again without the
  redelivered flag.
"""

from __future__ import annotations

import bisect
import contextlib
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.clients.consumer import Subscriber
from broker.core.config import Settings
from broker.core.errors import BrokerError
from broker.topics.subscriptions import SubscriptionRecord

#: The shared subscription whose consumers the groups are checked on (ShareName ``grouped``).
GROUP_FILTER = "$share/grouped//groups/#"

#: Topics of the grouped publications (only ``#`` among the harness's other filters matches them).
GROUP_TOPICS = ("/groups/a", "/groups/b/c")

#: The message groups.
GROUPS = tuple(f"G{i}" for i in range(6))

#: The publisher id of the grouped publications.
GROUP_PUBLISHER = "g0"

#: Consumer threads of the shared subscription.
CONSUMERS = 3

#: The least consumer lease of the group consumers, ms: a live consumer whose heartbeat thread
#: stalls for a lease is dead to the broker (its groups move) yet goes on (a zombie, which
#: ``GroupLog`` counts as ``lapsed``); a box busy with a chaos run stalls a thread for more than
#: the harness's 600 ms default now and then.
GROUP_LEASE_MS = 3_000

#: The fault kinds of the group consumers and their weights (``scripts.chaos.FAULTS``).
GROUP_FAULTS = {"group_consumer_kill": 2, "group_consumer_close": 1}


@dataclass
class GroupedPublication:
    """A grouped publication: its group, its sequence number in it, and whether its XADD was
    acknowledged (``acked`` is read from the harness's ``Publication`` at check time)."""

    msgid: str
    group: str
    seq: int
    publication: Any


@dataclass
class GroupVerdict:
    """The result of ``GroupLog.check``."""

    publications: int = 0
    receipts: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    shared: int = 0
    #: receipts of a group from a consumer whose previous holder's lease may have lapsed
    lapsed: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.shared)


class GroupLog:
    """Thread-safe record of grouped publications and of the group consumers' events, in order.

    Args:
        lease_ms: the consumers' ``consumer_lease_ms``, when their lease renewals are recorded
            (``renew``); None: every consumer holds its groups until it ends.
    """

    def __init__(self, lease_ms: int | None = None) -> None:
        self._lock = threading.Lock()
        self.lease_s = None if lease_ms is None else lease_ms / 1000
        self.published: dict[str, GroupedPublication] = {}
        self.events: list[tuple[Any, ...]] = []
        #: consumer -> [(started, ended)] of its lease renewals that succeeded (monotonic seconds)
        self.renewals: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def publish(self, msgid: str, group: str, seq: int, publication: Any) -> None:
        with self._lock:
            self.published[msgid] = GroupedPublication(msgid, group, seq, publication)

    def receive(
        self, consumer: str, msgid: str, redelivered: bool, started: float = 0.0, at: float | None = None
    ) -> None:
        """A receipt by a receive call that began at ``started`` and ended at ``at`` (monotonic s)."""
        at = time.monotonic() if at is None else at
        with self._lock:
            self.events.append(("receive", consumer, msgid, redelivered, started, at))

    def renew(self, consumer: str, started: float, at: float | None = None) -> None:
        """A lease renewal (a receive or a heartbeat) that began at ``started`` and succeeded at ``at``."""
        at = time.monotonic() if at is None else at
        with self._lock:
            self.renewals[consumer].append((started, at))

    def ack(self, consumer: str, msgids: list[str], at: float | None = None) -> None:
        """An acknowledgement that returned at ``at`` (monotonic s)."""
        at = time.monotonic() if at is None else at
        with self._lock:
            self.events.append(("ack", consumer, tuple(msgids), at))

    def ack_unknown(self, consumer: str, msgids: list[str]) -> None:
        """An ``ack_many`` whose outcome is unknown (its connection failed): maybe acknowledged."""
        with self._lock:
            self.events.append(("ack?", consumer, tuple(msgids), time.monotonic()))

    def end(self, consumer: str) -> None:
        with self._lock:
            self.events.append(("end", consumer))

    def _lapse_index(self) -> dict[str, tuple[list[float], list[float]]]:
        """consumer -> (its renewals' ends, sorted; the latest start among the renewals up to each)."""
        index = {}
        for consumer, renewals in self.renewals.items():
            ends, latest, last = [], [], float("-inf")
            for started, ended in sorted(renewals, key=lambda r: r[1]):
                last = max(last, started)
                ends.append(ended)
                latest.append(last)
            index[consumer] = (ends, latest)
        return index

    def _may_have_lapsed(self, index: dict, holder: str, started: float, ended: float) -> bool:
        """Whether ``holder``'s lease may have lapsed by the time a receive from ``started`` to
        ``ended`` took a message: none of its renewals that ended before ``started`` (so reached
        the server before that receive) began within a lease of ``ended``."""
        if self.lease_s is None:
            return False
        ends, latest = index.get(holder, ([], []))
        i = bisect.bisect_left(ends, started)
        return i == 0 or latest[i - 1] + self.lease_s < ended

    def check(self) -> GroupVerdict:
        """Check the events against the guarantees (see the module docstring)."""
        with self._lock:
            events = list(self.events)
            published = dict(self.published)
            index = self._lapse_index()
        v = GroupVerdict(publications=sum(1 for p in published.values() if p.publication.acked))
        known: dict[str, dict[int, GroupedPublication]] = defaultdict(dict)
        for p in published.values():
            known[p.group][p.seq] = p
        acked: dict[str, set[int]] = defaultdict(set)  # group -> seqs acknowledged
        low: dict[str, int] = defaultdict(lambda: 1)  # group -> lowest seq not yet acknowledged
        holders: dict[str, set[str]] = defaultdict(set)  # group -> consumers that received it, not ended
        took: dict[tuple[str, str], set[int]] = defaultdict(set)  # (consumer, group) -> seqs received
        received: set[str] = set()
        acked_msgids: set[str] = set()
        maybe_acked: set[str] = set()
        for event in events:
            if event[0] == "end":
                for consumers in holders.values():
                    consumers.discard(event[1])
                continue
            if event[0] in ("ack", "ack?"):
                kind, consumer, msgids, at = event
                if kind == "ack" and self._may_have_lapsed(index, consumer, at, at):
                    kind = "ack?"  # a zombie's: its messages may have been given back, the ack ignored
                for msgid in msgids:
                    p = published.get(msgid)
                    if p is None:
                        continue
                    (acked_msgids if kind == "ack" else maybe_acked).add(msgid)
                    acked[p.group].add(p.seq)
                    while low[p.group] in acked[p.group] or (
                        low[p.group] in known[p.group] and not known[p.group][low[p.group]].publication.acked
                    ):
                        low[p.group] += 1
                continue
            _, consumer, msgid, redelivered, started, at = event
            p = published.get(msgid)
            if p is None:
                v.duplicated += 1
                v.note(f"{consumer} received {msgid}, never published by the group publisher")
                continue
            v.receipts += 1
            group, seq = p.group, p.seq
            others = holders[group] - {consumer}
            lapsed = {o for o in others if self._may_have_lapsed(index, o, started, at)}
            if lapsed:
                v.lapsed += 1
                v.note(
                    f"{consumer} received {group}#{seq} after {sorted(lapsed)}'s lease may have lapsed (not counted)"
                )
                for consumers in holders.values():
                    consumers.difference_update(lapsed)
                others -= lapsed
            if others:
                v.shared += 1
                v.note(f"{consumer} received {group}#{seq} while {sorted(others)} held {group}")
            holders[group].add(consumer)
            mine = took[(consumer, group)]
            missing = [
                s
                for s in range(low[group], seq)
                if s not in acked[group]
                and s not in mine
                and (s not in known[group] or known[group][s].publication.acked)
            ]
            if missing:
                v.reordered += 1
                v.note(
                    f"{consumer} received {group}#{seq} before {group}#{missing[:5]} (neither acked nor its own)"
                )
            if msgid in maybe_acked:
                maybe_acked.discard(msgid)  # it was not acknowledged after all: given back
            elif msgid in acked_msgids or (msgid in received and not redelivered):
                v.duplicated += 1
                v.note(
                    f"{consumer} received {group}#{seq} again ({'after its ack' if msgid in acked_msgids else 'unflagged'})"
                )
            mine.add(seq)
            received.add(msgid)
        for p in published.values():
            if p.publication.acked and p.msgid not in received:
                v.lost += 1
                v.note(f"{p.group}#{p.seq} ({p.msgid}) never received")
        return v


class _Renewing(Subscriber):
    """A ``Subscriber`` that records each lease renewal that succeeded (``GroupLog.renew``)."""

    def __init__(self, *args: Any, log: GroupLog, **kwargs: Any) -> None:
        self._group_log = log
        super().__init__(*args, **kwargs)

    def _take(self, count: int) -> list[Any]:
        started = time.monotonic()
        out = super()._take(count)
        self._group_log.renew(self.consumer_id, started)
        return out


class GroupWorkload:
    """The grouped publisher and the consumers of the shared subscription, for one chaos run.

    Args:
        record: the shared subscription.
        settings: the consumers' settings (``consumer_lease_ms``).
        stop_consuming: set when the consumers may stop once idle.
        fault: the harness's ``_fault(kind, text)``: counts a fault when it happens.
    """

    def __init__(
        self,
        record: SubscriptionRecord,
        settings: Settings,
        stop_consuming: threading.Event,
        fault: Callable[[str, str], None],
    ) -> None:
        self.record = record
        self.settings = settings
        self.stop_consuming = stop_consuming
        self.fault = fault
        self.log = GroupLog(settings.consumer_lease_ms)
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self.anomalies: list[str] = []

    def request(self, kind: str) -> None:
        """Ask the next consumer to look to die (``group_consumer_kill``) or close (``group_consumer_close``)."""
        with self._lock:
            self.requests.append(kind)

    def _take_request(self) -> str | None:
        with self._lock:
            return self.requests.pop(0) if self.requests else None

    def next_group(self, rng: random.Random, counters: dict[str, int]) -> tuple[str, int]:
        """A group and its next sequence number."""
        group = rng.choice(GROUPS)
        counters[group] = counters.get(group, 0) + 1
        return group, counters[group]

    def consume(self, index: int, url: str, qm: str) -> None:
        """One consumer thread: a ``Subscriber`` of a new id after each death, close or error."""
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
        generation = 0
        subscriber: Subscriber | None = None
        idle = errors = 0
        acking: list[str] = []
        while True:
            consumer = f"grp-{index}-{generation}"
            try:
                if subscriber is None:
                    subscriber = _Renewing(
                        client, qm, self.record, self.settings, consumer_id=consumer, log=self.log
                    )
                started = time.monotonic()
                got = subscriber.receive_many(10, timeout_ms=200)
                for delivery in got:
                    self.log.receive(consumer, delivery.message.msgid, delivery.redelivered, started)
                kind = self._take_request() if got else None
                if kind is not None:
                    self.log.end(consumer)  # before the broker may give its groups to another
                    if kind == "group_consumer_kill":
                        subscriber.abandon()  # its lease lapses: its groups and batch go to the others
                    else:
                        subscriber.close()  # its batch given back, its groups freed, at once
                    self.fault(kind, f"{consumer} with {len(got)} in flight")
                    subscriber, generation = None, generation + 1
                    continue
                if not got:
                    idle += 1
                    if self.stop_consuming.is_set() and idle > 2:
                        break
                    continue
                idle = 0
                acking = [d.message.msgid for d in got]
                subscriber.ack_many(got)
                self.log.ack(consumer, acking)
                acking = []
            except (BrokerError, redis.RedisError) as exc:
                # a server restart or a cut connection: this consumer is done, a new one takes its place
                if acking:
                    self.log.ack_unknown(consumer, acking)
                    acking = []
                self.log.end(consumer)
                if subscriber is not None:
                    subscriber.abandon()
                subscriber, generation = None, generation + 1
                if self.stop_consuming.wait(0.2):
                    errors += 1
                    if errors > 300:  # a minute of errors after the traffic stopped
                        self.anomalies.append(f"group consumer {index}: {exc}")
                        break
        if subscriber is not None:
            self.log.end(f"grp-{index}-{generation}")
            with contextlib.suppress(BrokerError, redis.RedisError):
                subscriber.close()
        client.close()
