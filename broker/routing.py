"""The worker's in-memory routing table: subscriptions and links, loaded at a known version.

A publication on topic T goes to every subscription whose filter matches T or
any topic linked from T, transitively (seed 000), each subscription once. The
table is loaded with the index version read in the same MULTI, and the worker
reloads it whenever a dequeue returns a newer version, so it never matches
against a stale index. Resolved recipient sets are cached per topic until the
next reload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from broker import keys
from broker.topics import LinkGraph, TopicIndex, validate_topic

#: Most topics whose recipient set is cached; the cache is cleared when full.
CACHE_TOPICS = 100_000


@dataclass(frozen=True)
class SubscriptionRecord:
    """A subscription as stored in ``{qm}:subs``.

    Attributes:
        sub_id: ``clientid$name``.
        topic_filter: the MQTT-style filter.
        durable: survives its subscriber going away.
        created_ms: when it was made, ms since the epoch.
    """

    sub_id: str
    topic_filter: str
    durable: bool
    created_ms: int

    def to_json(self) -> str:
        """The JSON stored as the hash value."""
        return json.dumps(
            {"filter": self.topic_filter, "durable": self.durable, "created_ms": self.created_ms},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, sub_id: str, raw: bytes | str) -> SubscriptionRecord:
        """Parse a hash value written by ``to_json``."""
        data = json.loads(raw)
        return cls(sub_id, data["filter"], bool(data.get("durable")), int(data.get("created_ms", 0)))


def read_links(raw: dict[bytes, bytes]) -> LinkGraph:
    """Build a ``LinkGraph`` from the ``{qm}:links`` hash (source -> JSON {target: backward})."""
    graph = LinkGraph()
    pairs = [
        (source.decode(), target, bool(backward))
        for source, targets in raw.items()
        for target, backward in json.loads(targets).items()
    ]
    # Forward links were cycle-checked against a superset when made, so they form
    # a DAG on their own; backward links go in after them, unchecked.
    for source, target, backward in sorted(pairs, key=lambda p: p[2]):
        graph.add(source, target, backward=backward)
    return graph


class RoutingTable:
    """Subscriptions and links of one queue manager, as of ``version``.

    Args:
        qm: the queue manager.
    """

    def __init__(self, qm: str) -> None:
        self.qm = qm
        self.version = -1
        self.index = TopicIndex()
        self.links = LinkGraph()
        self.subscriptions: dict[str, SubscriptionRecord] = {}
        self._queue_of: dict[str, str] = {}
        self._cache: dict[str, tuple[str, ...]] = {}

    def load(self, client: redis.Redis) -> None:
        """Read subscriptions, links and the version in one MULTI/EXEC and rebuild.

        Raises:
            redis.RedisError: as redis-py raises it.
        """
        pipe = client.pipeline(transaction=True)
        pipe.get(keys.version(self.qm))
        pipe.hgetall(keys.subscriptions(self.qm))
        pipe.hgetall(keys.links(self.qm))
        version, subs, links = pipe.execute()
        index = TopicIndex()
        records = {}
        for raw_id, raw in subs.items():
            record = SubscriptionRecord.from_json(raw_id.decode(), raw)
            records[record.sub_id] = record
            index.add(record.topic_filter, record.sub_id)
        self.index = index
        self.links = read_links(links)
        self.subscriptions = records
        self._queue_of = {sub_id: keys.sub_queue(self.qm, sub_id) for sub_id in records}
        self._cache = {}
        self.version = int(version or 0)

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
