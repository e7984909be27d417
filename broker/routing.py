"""The worker's in-memory routing table: subscriptions and links, loaded at a known version.

A publication on topic T goes to every subscription whose filter matches T or
any topic linked from T, transitively (seed 000), each subscription once. The
table is loaded with the index version read in the same MULTI, and the worker
reloads it whenever a dequeue returns a newer version, so it never matches
against a stale index. Resolved recipient sets are cached per topic until the
next reload.

A record that cannot be read (written by hand: not JSON, an invalid filter or
id, a forward link closing a cycle) matches nothing: it is skipped, logged
once per load, and kept in ``problems`` for ``broker status`` and
``explain``. A queue-manager-wide key of the wrong type (the subscription or
link hash) raises ``ForeignKey``: the worker waits, with its entries pending,
until an operator removes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis

from broker import keys
from broker.connection import translate_errors
from broker.errors import CorruptRecord, ForeignKey
from broker.links import parse_links
from broker.subscriptions import SubscriptionRecord, parse_subscriptions
from broker.topics import LinkGraph, TopicIndex, validate_topic

log = logging.getLogger("broker.routing")

#: Most topics whose recipient set is cached; the cache is cleared when full.
CACHE_TOPICS = 100_000

#: The Redis type of each key the table reads.
_TYPES = {"version": "string", "subs": "hash", "links": "hash"}


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class RoutingTable:
    """Subscriptions and links of one queue manager, as of ``version``.

    Args:
        qm: the queue manager.

    Attributes:
        version: the index version counter's value when loaded (bytes, opaque:
            compared, never parsed), or None before the first load.
        problems: the records skipped at the last load.
    """

    def __init__(self, qm: str) -> None:
        self.qm = qm
        self.version: bytes | None = None
        self.index = TopicIndex()
        self.links = LinkGraph()
        self.subscriptions: dict[str, SubscriptionRecord] = {}
        self.problems: list[CorruptRecord] = []
        self._queue_of: dict[str, str] = {}
        self._cache: dict[str, tuple[str, ...]] = {}

    def load(self, client: redis.Redis) -> None:
        """Read subscriptions, links and the version in one MULTI/EXEC and rebuild.

        Raises:
            ForeignKey: the subscription hash, the link hash or the version
                counter holds another Redis type.
            redis.RedisError: as redis-py raises it.
        """
        qm = self.qm
        names = {"version": keys.version(qm), "subs": keys.subscriptions(qm), "links": keys.links(qm)}
        pipe = client.pipeline(transaction=True)
        for key in names.values():
            pipe.type(key)
        pipe.get(names["version"])
        pipe.hgetall(names["subs"])
        pipe.hgetall(names["links"])
        replies = pipe.execute(raise_on_error=False)
        for (what, key), found in zip(names.items(), replies[:3], strict=True):
            kind = _text(found)
            if kind not in ("none", _TYPES[what]):
                raise ForeignKey(key, kind, _TYPES[what])
        version, subs, links = replies[3:]
        for reply in (version, subs, links):
            if isinstance(reply, Exception):
                raise reply
        records, problems = parse_subscriptions(qm, subs)
        graph, link_problems = parse_links(qm, links)
        problems += link_problems
        index = TopicIndex()
        for record in records:
            index.add(record.topic_filter, record.sub_id)
        if problems:
            for problem in problems:
                log.warning("routing table of %s: %s; it is skipped (matches nothing)", qm, problem)
        self.index = index
        self.links = graph
        self.problems = problems
        self.subscriptions = {record.sub_id: record for record in records}
        self._queue_of = {sub_id: keys.sub_queue(qm, sub_id) for sub_id in self.subscriptions}
        self._cache = {}
        self.version = version if version is not None else b"0"

    def resolve(self, topic: str) -> tuple[str, ...]:
        """The subscriber queue keys a publication on ``topic`` goes to, each once.

        Args:
            topic: a topic string; validated the first time it is seen.

        Returns:
            Queue keys, sorted (a stable order makes the unit of work repeatable).

        Raises:
            InvalidTopic: the topic is invalid (with a suggested correction).
        """
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        validate_topic(topic)
        sub_ids: set[str] = set()
        for linked in self.links.closure(topic):
            sub_ids |= self.index.match(linked)
        queues = tuple(sorted(self._queue_of[s] for s in sub_ids))
        if len(self._cache) >= CACHE_TOPICS:
            self._cache.clear()
        self._cache[topic] = queues
        return queues


@dataclass
class Route:
    """Where a publication on one topic goes.

    Attributes:
        topic: the topic published on.
        via: topic reached (the topic itself, then linked ones) -> subscription ids matching it.
        subscriptions: the de-duplicated subscription ids that receive one copy each.
        problems: records skipped because they cannot be read (they match nothing).
    """

    topic: str
    via: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: list[str] = field(default_factory=list)
    problems: list[CorruptRecord] = field(default_factory=list)


@translate_errors
def explain(client: redis.Redis, qm: str, topic: str) -> Route:
    """Resolve ``topic`` the way a worker does and say through which topics each subscription matched.

    Raises:
        InvalidTopic: the topic is invalid (with a suggestion).
        ForeignKey: the subscription or link hash holds another Redis type.
    """
    validate_topic(topic)
    table = RoutingTable(qm)
    table.load(client)
    route = Route(topic, problems=list(table.problems))
    seen: set[str] = set()
    for linked in table.links.closure(topic):
        matched = sorted(table.index.match(linked))
        route.via[linked] = matched
        seen.update(matched)
    route.subscriptions = sorted(seen)
    return route
