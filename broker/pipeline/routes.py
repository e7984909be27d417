"""Who should receive a publication: MQTT 5 §4.7 matching and link closure, written for the audit.

This is a second, independent implementation of the broker's routing rules,
so the audit does not trust the code it checks: it matches and follows links without
``broker.core.topic_rules`` or the routing table's index (``broker.topics.routing`` only reads the
subscription and link records, as the workers read them, in ``Subscriptions.from_broker``);
the link closure is a plain breadth-first search (``link_closure``, which the demo's
oracle, ``broker.demo.oracle``, uses too). Each filter is compiled to a regular
expression instead of walking a trie:

* ``+`` is one whole level, possibly empty: ``[^/]*``;
* a final ``#`` is the parent level and any number of child levels:
  ``a/#`` -> ``a(/.*)?``, and ``#`` alone matches every topic;
* other levels match themselves exactly (case-sensitive);
* a filter whose first level is ``+`` or ``#`` does not match a topic whose
  first level starts with ``$`` (§4.7.2).

A publication on topic T goes to every subscription whose filter matches T
or any topic reachable from T through links (transitively, each topic once,
so loops closed by backward links end), each subscription once.

The subscriptions file (``broker journal subscriptions --out``) is JSON:
``{"subscriptions": {"<sub id>": "<filter>", ...}, "links": [["<source>", "<target>"], ...]}``.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from broker.topics.routing import RoutingTable


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


def filter_pattern(topic_filter: str) -> re.Pattern[str]:
    """Compile a topic filter to a regular expression matched against whole topic names.

    Args:
        topic_filter: an MQTT 5 topic filter.

    Returns:
        A pattern to use with ``fullmatch``.

    Raises:
        ValueError: the filter is empty, or ``+``/``#`` do not occupy a whole
            level, or ``#`` is not the last level.
    """
    if not topic_filter:
        raise ValueError("a topic filter must not be empty")
    levels = topic_filter.split("/")
    multi = levels[-1] == "#"
    literal = levels[:-1] if multi else levels
    parts = []
    for level in literal:
        if level == "+":
            parts.append("[^/]*")
        elif "+" in level or "#" in level:
            raise ValueError(
                f"invalid topic filter {topic_filter!r}: '+' and '#' must be whole levels, '#' only the last"
            )
        else:
            parts.append(re.escape(level))
    body = "/".join(parts)
    if multi:
        body = body + "(?:/.*)?" if literal else ".*"
    guard = r"(?!\$)" if levels[0] in ("+", "#") else ""
    return re.compile(guard + body, re.DOTALL)


@dataclass
class Subscriptions:
    """A snapshot of a queue manager's subscriptions and links.

    Attributes:
        subscriptions: sub id -> topic filter.
        links: ``(source, target)`` topic links (backward links included).
    """

    subscriptions: dict[str, str] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)

    def recipients(self, topics: Iterable[str]) -> dict[str, list[str]]:
        """The subscriptions each topic's publications should reach.

        Args:
            topics: topic names (distinct ones are enough).

        Returns:
            topic -> sorted sub ids (each once, whichever linked topic matched).

        Raises:
            ValueError: a filter is invalid.
        """
        patterns = [(sub_id, filter_pattern(f)) for sub_id, f in sorted(self.subscriptions.items())]
        targets: dict[str, list[str]] = {}
        for source, target in self.links:
            targets.setdefault(source, []).append(target)
        out: dict[str, list[str]] = {}
        for topic in topics:
            if topic in out:
                continue
            reached = link_closure(topic, targets)
            out[topic] = [
                sub_id for sub_id, pattern in patterns if any(pattern.fullmatch(t) for t in reached)
            ]
        return out

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {
            "subscriptions": dict(sorted(self.subscriptions.items())),
            "links": [list(pair) for pair in sorted(self.links)],
        }

    def write(self, path: str | Path) -> None:
        """Write the subscriptions file."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def from_json(cls, data: Any) -> Subscriptions:
        """Parse the file's JSON object.

        Raises:
            ValueError: it is not ``{"subscriptions": {id: filter}, "links": [[source, target], ...]}``.
        """
        if not isinstance(data, dict) or not isinstance(data.get("subscriptions"), dict):
            raise ValueError(
                'a subscriptions file is {"subscriptions": {"<id>": "<filter>"}, "links": [...]}'
            )
        subs = {str(k): str(v) for k, v in data["subscriptions"].items()}
        links: list[tuple[str, str]] = []
        for item in data.get("links") or []:
            if not isinstance(item, list | tuple) or len(item) < 2:
                raise ValueError(f"a link is [source, target], not {item!r}")
            links.append((str(item[0]), str(item[1])))
        for topic_filter in subs.values():
            filter_pattern(topic_filter)
        return cls(subs, links)

    @classmethod
    def read(cls, path: str | Path) -> Subscriptions:
        """Read a subscriptions file.

        Raises:
            ValueError: the file is missing, not JSON, or not in the format.
        """
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ValueError(f"subscriptions file {str(path)!r} does not exist") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"subscriptions file {str(path)!r} is not JSON: {exc}") from exc
        return cls.from_json(data)

    @classmethod
    def from_broker(cls, client: redis.Redis, qm: str) -> Subscriptions:
        """Read the live subscriptions (``{qm}:subs``) and links (``{qm}:links``) in one MULTI.

        Records the workers cannot read are skipped, as the workers skip them
        (they match nothing).

        Raises:
            ForeignKey: either hash holds another Redis type.
            redis.RedisError: as redis-py raises it.
        """
        table = RoutingTable(qm)
        table.load(client)
        subs = {sub_id: record.topic_filter for sub_id, record in table.subscriptions.items()}
        links = [(source, target) for source, target, _backward in table.links.links()]
        return cls(subs, sorted(links))
