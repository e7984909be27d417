"""The brute-force reference for who should receive what, used to check the broker.

The demo, the chaos harness and the Spark audit all check the broker's
deliveries against an answer computed independently of the worker's index
(``broker.topics.routing``: exact-match hash + wildcard trie + ``LinkGraph``): links
are followed with a plain breadth-first search, and every subscription filter
is tested against every reached topic. ``score`` is the one checker of a
subscription's receipts (lost, duplicated, out of order, unexpected) that the
demo and the chaos harness share; the Spark audit recomputes on its own, on purpose.

Across a network of queue managers (``broker.topics.topology``; ``broker demo --federation``),
``network_recipients`` gives the subscriptions of every queue manager a publication must
reach, again without the broker's own code (no ``Topology``): a plain breadth-first search
over the hierarchy's parent-child edges, plus the full mesh of a cluster's members for a
topic under a cluster topic object, finds the queue managers reachable from the origin, and
each of them contributes its own local recipients, with its own links.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from broker.core.topic_rules import matches
from broker.pipeline.routes import link_closure


def link_targets(links: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``source -> [targets]`` from ``(source, target)`` pairs, in the pairs' order."""
    targets: dict[str, list[str]] = {}
    for source, target in links:
        targets.setdefault(source, []).append(target)
    return targets


def recipients(
    topic: str, filters: Mapping[str, str], targets: Mapping[str, Iterable[str]]
) -> frozenset[str]:
    """The subscription ids (keys of ``filters``) a publication on ``topic`` must reach, each once.

    Args:
        topic: the topic published on.
        filters: subscription id -> topic filter.
        targets: source topic -> linked topics (``link_targets``).
    """
    reached = link_closure(topic, targets)
    return frozenset(sub for sub, flt in filters.items() if any(matches(flt, t) for t in reached))


@dataclass(frozen=True)
class Node:
    """One queue manager of a network, as the oracle sees it.

    Attributes:
        parent: its parent in the hierarchy, or None.
        clusters: the publish/subscribe clusters it is a member of.
        filters: its subscriptions: subscription id -> topic filter.
        links: its topic links, ``(source, target)`` (links are per queue manager).
    """

    parent: str | None = None
    clusters: tuple[str, ...] = ()
    filters: Mapping[str, str] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()

    @cached_property
    def targets(self) -> dict[str, list[str]]:
        """``link_targets`` of its links."""
        return link_targets(self.links)


def label(qm: str, sub_id: str) -> str:
    """The network-wide name of subscription ``sub_id`` of queue manager ``qm``: ``<qm>:<sub_id>``."""
    return f"{qm}:{sub_id}"


def route_cluster(topic: str, cluster_topics: Mapping[str, str]) -> str:
    """The cluster whose edges a publication on ``topic`` may use: that of the closest cluster
    topic object at or above it (walking up ``/`` levels), "" for a local topic.

    Args:
        topic: the topic published on.
        cluster_topics: topic string of a topic object -> its CLUSTER ("" for an object that
            keeps its topics local); objects without a CLUSTER of their own are left out.
    """
    levels = topic.split("/")
    for depth in range(len(levels), 0, -1):
        found = cluster_topics.get("/".join(levels[:depth]))
        if found is not None:
            return found
    return ""


def reachable(origin: str, cluster: str, nodes: Mapping[str, Node]) -> set[str]:
    """The queue managers a publication made at ``origin`` can reach: ``origin`` itself and every
    queue manager connected to it by parent-child edges and, when ``cluster`` is not "", edges
    between any two members of ``cluster`` (CLROUTE(DIRECT)).

    Announce filters are not modelled: every queue manager on a path holds every announcement.
    """
    adjacent: dict[str, set[str]] = {name: set() for name in nodes}
    for name, node in nodes.items():
        if node.parent is not None:
            adjacent[name].add(node.parent)
            adjacent[node.parent].add(name)
    if cluster:
        members = [name for name, node in nodes.items() if cluster in node.clusters]
        for name in members:
            adjacent[name].update(m for m in members if m != name)
    seen = {origin}
    queue = deque([origin])
    while queue:
        for there in adjacent[queue.popleft()]:
            if there not in seen:
                seen.add(there)
                queue.append(there)
    return seen


def network_recipients(
    origin: str, topic: str, nodes: Mapping[str, Node], cluster_topics: Mapping[str, str]
) -> frozenset[str]:
    """The subscriptions, network-wide (``label``), a publication on ``topic`` made at ``origin`` must reach.

    Each queue manager ``reachable`` in the topic's route class (``route_cluster``) contributes
    its local ``recipients``: its own filters, through its own links.

    Args:
        origin: the queue manager the publication was made at.
        topic: the topic published on.
        nodes: queue manager name -> ``Node``.
        cluster_topics: topic string -> CLUSTER of the network's topic objects (``route_cluster``).
    """
    found: set[str] = set()
    for qm in reachable(origin, route_cluster(topic, cluster_topics), nodes):
        node = nodes[qm]
        found.update(label(qm, sub) for sub in recipients(topic, node.filters, node.targets))
    return frozenset(found)


@dataclass(frozen=True)
class Expectation:
    """What the checker knows of one publication.

    Attributes:
        publisher: the publisher id.
        position: its place in the publisher's order (seq, or the n-th publication).
        recipients: the subscription ids that must receive it (``recipients``).
    """

    publisher: str
    position: int
    recipients: frozenset[str]


#: How many problem lines a ``Score`` keeps (the counts are always complete).
EXAMPLES = 20


@dataclass
class Score:
    """The score of one subscription's receipts: the one checker of lost, duplicated and out-of-order.

    Attributes:
        received: envelopes received.
        expected: publications this subscription owed (``owed``).
        lost: owed publications never received.
        duplicated: receipts of a publication already received by this subscription,
            not flagged redelivered.
        redelivered: receipts of a publication already received, flagged redelivered
            (its consumer died or was stopped before acknowledging it: allowed).
        out_of_order: first receipts of a publication after a later publication of
            the same publisher (per-publisher FIFO, the broker's order guarantee).
        unexpected: receipts of an unknown msgid, or of a publication not for this subscription.
        first: msgids in the order first received (duplicates and unexpected left out).
        examples: up to ``EXAMPLES`` problem lines.
    """

    received: int = 0
    expected: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    out_of_order: int = 0
    unexpected: int = 0
    first: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing lost, duplicated, out of order or unexpected."""
        return not (self.lost or self.duplicated or self.out_of_order or self.unexpected)

    def counts(self) -> dict[str, int]:
        """``{"expected", "received", "lost", "duplicated", "out_of_order", "unexpected"}``."""
        return {
            "expected": self.expected,
            "received": self.received,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "unexpected": self.unexpected,
        }

    def _note(self, text: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(text)


def score(
    sub_id: str,
    received: Iterable[str | tuple[str, bool]],
    published: Mapping[str, Expectation],
    owed: Iterable[str],
) -> Score:
    """Score what subscription ``sub_id`` received against what it was owed.

    Args:
        sub_id: the subscription.
        received: the msgids it received, oldest first; ``(msgid, redelivered)``
            where the consumer reported the redelivered flag (a flagged second
            receipt is a redelivery, not a duplicate).
        published: msgid -> ``Expectation`` of every publication made.
        owed: the msgids it must have received (a caller leaves out publications
            whose delivery is not promised, e.g. those refused or never acknowledged).

    Returns:
        The ``Score``.
    """
    result = Score()
    seen: set[str] = set()
    high: dict[str, tuple[int, str]] = {}
    for item in received:
        msgid, flagged = (item, False) if isinstance(item, str) else item
        result.received += 1
        pub = published.get(msgid)
        if pub is None or sub_id not in pub.recipients:
            result.unexpected += 1
            result._note(f"unexpected: {sub_id} received {msgid!r}")
            continue
        if msgid in seen:
            if flagged:
                result.redelivered += 1
            else:
                result.duplicated += 1
                result._note(f"duplicated: {sub_id} received {msgid} again, not flagged redelivered")
            continue
        seen.add(msgid)
        result.first.append(msgid)
        last = high.get(pub.publisher)
        if last is not None and pub.position < last[0]:
            result.out_of_order += 1
            result._note(f"out of order: {sub_id} received {msgid} after {last[1]} of {pub.publisher}")
        else:
            high[pub.publisher] = (pub.position, msgid)
    for msgid in owed:
        result.expected += 1
        if msgid not in seen:
            result.lost += 1
            result._note(f"lost: {sub_id} never received {msgid}")
    return result
