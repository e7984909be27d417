"""The brute-force reference for who should receive what, used to check the broker.

The demo, the chaos harness and the Spark audit all check the broker's
deliveries against an answer computed independently of the worker's index
(``broker.routing``: exact-match hash + wildcard trie + ``LinkGraph``): links
are followed with a plain breadth-first search, and every subscription filter
is tested against every reached topic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from broker.topics import matches


def link_targets(links: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``source -> [targets]`` from ``(source, target)`` pairs, in the pairs' order."""
    targets: dict[str, list[str]] = {}
    for source, target in links:
        targets.setdefault(source, []).append(target)
    return targets


def link_closure(topic: str, targets: Mapping[str, Iterable[str]]) -> list[str]:
    """``topic`` and every topic reachable from it through links, each once, breadth first.

    Loops (closed by backward links) end because each topic is visited once (seed 000).

    Args:
        topic: the topic published on.
        targets: source topic -> the topics it links to (``link_targets``).

    Returns:
        The topics a publication on ``topic`` appears on, ``topic`` first.
    """
    seen = {topic}
    order = [topic]
    queue = deque(order)
    while queue:
        for nxt in targets.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
                queue.append(nxt)
    return order


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
