"""Explain a topic: where a publication on it goes, resolved as a worker resolves it.

``explain`` loads a routing table and calls ``RoutingTable.resolve``, the workers' own code path
(so WILDCARD(BLOCK), links and the copies setting are applied the same way), then says through
which topics each subscription matched, which a WILDCARD(BLOCK) kept out, and which copies rule
applied. ``broker topics TOPIC`` prints it (``broker.cli.render``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from broker.core.errors import CorruptRecord, translate_errors
from broker.topics.routing import RoutingTable


@dataclass
class Route:
    """Where a publication on one topic goes, as a worker resolves it (``RoutingTable.resolve``).

    Attributes:
        topic: the topic published on.
        via: topic reached (the topic itself, then linked ones) -> subscription ids matching it.
        blocked: topic reached -> subscription ids whose filter matches it but that a
            WILDCARD(BLOCK) topic object keeps out (only topics where some are).
        subscriptions: the subscription ids that receive one copy each (before selectors and
            no-local: ``conditional``).
        conditional: those among them with a selector or no-local, decided per publication.
        left_out: client id set to one copy per subscriber -> its matching subscriptions that get
            no copy (only clients with some).
        one_of: groups of one such client's subscriptions of which a publication goes to the
            first its selector and no-local let through.
        rule: the copies rule that applied, in words.
        problems: records skipped because they cannot be read (they match nothing).
    """

    topic: str
    via: dict[str, list[str]] = field(default_factory=dict)
    blocked: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: list[str] = field(default_factory=list)
    conditional: list[str] = field(default_factory=list)
    left_out: dict[str, list[str]] = field(default_factory=dict)
    one_of: list[list[str]] = field(default_factory=list)
    rule: str = ""
    problems: list[CorruptRecord] = field(default_factory=list)


@translate_errors
def explain(client: redis.Redis, qm: str, topic: str) -> Route:
    """Resolve ``topic`` as a worker does (``RoutingTable.resolve``, the one code path) and say
    through which topics each subscription matched, which a WILDCARD(BLOCK) kept out, and which
    copies rule applied (``broker.topics.copies``).

    Raises:
        InvalidTopic: the topic is invalid (with a suggestion).
        ForeignKey: the subscription, link or copies hash holds another Redis type.
    """
    table = RoutingTable(qm)
    table.load(client)
    recipients = table.resolve(topic)
    route = Route(topic, problems=list(table.problems))
    matched: set[str] = set()
    for linked in table._reached(topic):
        kept = table.matching(linked)
        route.via[linked] = sorted(kept)
        matched |= kept
        blocked = table.index.match(linked) - kept
        if blocked:
            route.blocked[linked] = sorted(blocked)
    route.subscriptions = list(recipients.sub_ids)
    route.conditional = sorted(recipients.conditional)
    route.one_of = [list(group) for group in recipients.one_of]
    for sub_id in sorted(matched.difference(recipients.sub_ids)):
        route.left_out.setdefault(sub_id.partition("$")[0], []).append(sub_id)
    subscribers = sorted({s.partition("$")[0] for s in matched} & table.one_copy)
    route.rule = (
        f"one copy per subscriber for {', '.join(subscribers)} (seed 000's duplicate-subscriber check: "
        "the earliest-made matching subscription); one per subscription for the others"
        if subscribers
        else "one copy per subscription (Jakarta Messaging)"
    )
    return route
