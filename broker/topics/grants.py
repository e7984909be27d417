"""Per-topic authorization: the grants of a user, and how a topic or a filter is matched against them.

SwiftMQ grants access to predicate topics as to plain ones; IBM MQ puts authorities on topic
objects, which cover the subtree below them. Here a user's grants are topic filters (the queue
manager's scheme: MQTT ``+`` / ``#``, or SwiftMQ dot topics with SQL-LIKE predicate nodes) and
topic object names, each for publishing or subscribing, stored in ``{qm}:grants`` (user -> JSON,
``GrantRecord``; written by ``broker.operations.grants``).

**The default rule**: a user without a publish grant may publish on any topic, as before grants
existed; once it has at least one, it may publish only on topics one of them matches. The same
holds for subscribing. A grant on a topic object covers the object's topic string and every
topic below it (mqtt: the filter ``<topic string>/#``; ``#`` for ``SYSTEM.BASE.TOPIC``; swiftmq:
the topic string's nodes and every node below). A grant naming an object that no longer exists
matches nothing (it still counts as a grant).

Nothing here reads Redis: the routing table parses ``{qm}:grants`` with the version
(``parse_grants``), and the workers decide with ``Grants.may_publish`` (``worker.decide``); the
control requests check ``Grants.may_subscribe`` (``broker.operations.control``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.core import hierarchy, keys, wire
from broker.core.errors import CorruptRecord, InvalidSelector, InvalidTopicFilter
from broker.core.selectors import like
from broker.core.topic_rules import SHARE_PREFIX, TopicIndex
from broker.core.topic_rules import validate_filter as mqtt_validate_filter
from broker.topics.topic_objects import TopicTree

#: The four lists of a grant record, in the order ``broker acl list`` shows them.
KINDS = ("publish", "publish_objects", "subscribe", "subscribe_objects")

#: Most topics whose publish decision is cached per principal; the cache is cleared when full.
CACHE_TOPICS = 10_000


@dataclass
class GrantRecord:
    """One user's grants (``{qm}:grants`` field value).

    Attributes:
        publish: topic filters it may publish on (a topic one of them matches).
        publish_objects: topic object names: it may publish on their subtrees.
        subscribe: topic filters it may subscribe within (a filter one of them covers).
        subscribe_objects: topic object names: it may subscribe within their subtrees.
    """

    publish: list[str] = field(default_factory=list)
    publish_objects: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    subscribe_objects: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(getattr(self, kind) for kind in KINDS)

    def to_json(self) -> str:
        return json.dumps({k: getattr(self, k) for k in KINDS if getattr(self, k)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, user: str, raw: bytes | str, qm: str) -> GrantRecord:
        """Raises: CorruptRecord: not a JSON object of lists of strings under the ``KINDS`` names."""
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecord(keys.grants(qm), user, "not JSON") from exc
        if not isinstance(data, dict) or set(data) - set(KINDS):
            raise CorruptRecord(keys.grants(qm), user, f"not an object of {', '.join(KINDS)}")
        for kind, values in data.items():
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise CorruptRecord(keys.grants(qm), user, f"{kind} is not a list of strings")
        return cls(**{k: list(data.get(k, [])) for k in KINDS})


def validate_grant_filter(topic_filter: str, scheme: str) -> str:
    """Check a grant's topic filter under the queue manager's ``scheme`` (``mqtt`` or ``swiftmq``).

    Returns:
        ``topic_filter`` itself.

    Raises:
        InvalidTopicFilter: it breaks the scheme's rules (``broker.core.topic_rules``,
            ``broker.core.hierarchy``), or is a ``$share/`` filter (a grant names topics, not shares).
    """
    if scheme == "swiftmq":
        return hierarchy.validate_filter(topic_filter)
    if topic_filter.startswith(SHARE_PREFIX):
        raise InvalidTopicFilter(topic_filter, "a grant names topics, not a $share/ subscription")
    return mqtt_validate_filter(topic_filter)


def object_filter(topic_string: str, scheme: str) -> str:
    """The filter a grant on a topic object at ``topic_string`` stands for: its subtree.

    mqtt: ``<topic string>/#`` (``#`` matches the parent level too), ``#`` for ``SYSTEM.BASE.TOPIC``
    (``""``); swiftmq: the topic string itself (matched as a subtree), ``""`` (every topic) for
    the base object.
    """
    if scheme == "swiftmq":
        return topic_string
    return f"{topic_string}/#" if topic_string else "#"


def _unescaped(node: str) -> str:
    return re.sub(r"\\(.)", r"\1", node)


def _mqtt_covers(grant: str, requested: str) -> bool:
    """Whether every topic the mqtt filter ``requested`` matches is matched by ``grant`` (both valid)."""
    gl, fl = grant.split("/"), requested.split("/")
    if fl[0].startswith("$") and gl[0] in ("+", "#"):
        return False  # MQTT 5 §4.7.2: a wildcard first level never matches a '$' topic
    for i, level in enumerate(gl):
        if level == "#":
            return True
        if i >= len(fl) or fl[i] == "#":
            return False
        if level != "+" and fl[i] != level:
            return False  # a '+' or another literal where the grant has a literal
    return len(fl) == len(gl)


def _swift_node_covers(grant_node: str, node: str) -> bool:
    if not hierarchy.is_predicate(grant_node):
        return grant_node == node
    if hierarchy.is_predicate(node):
        return grant_node in (node, "%")
    return like(grant_node, _unescaped(node), "\\")


def _swift_covers(grant: str, requested: str) -> bool:
    """Whether the swiftmq filter ``requested`` lies at or below ``grant``, node by node (both valid):
    a predicate node of the grant covers a plain node it matches, or the same predicate (``%`` any)."""
    gn, fn = grant.split(hierarchy.SEPARATOR), requested.split(hierarchy.SEPARATOR)
    if len(fn) < len(gn):
        return False
    return all(_swift_node_covers(g, f) for g, f in zip(gn, fn, strict=False))


def covers(grant: str, requested: str, scheme: str) -> bool:
    """Whether a subscription to ``requested`` stays within ``grant`` (both valid under ``scheme``).

    mqtt: every topic ``requested`` matches, ``grant`` matches (``a/#`` covers ``a``, ``a/+/c``
    and ``a/#``; ``a/+`` covers ``a/b`` but not ``a/#``). swiftmq: ``requested`` is at or below
    ``grant`` node by node (the scheme's subscriptions also receive their parents' publications).
    """
    if scheme == "swiftmq":
        return grant == "" or _swift_covers(grant, requested)
    return _mqtt_covers(grant, requested)


class _Publish:
    """One principal's publish grants, compiled once per table load, decisions cached per topic."""

    __slots__ = ("_cache", "_filters", "_index", "_scheme")

    def __init__(self, filters: Iterable[str], scheme: str) -> None:
        self._scheme = scheme
        self._filters = tuple(dict.fromkeys(filters))
        self._index = TopicIndex()
        if scheme != "swiftmq":
            for topic_filter in self._filters:
                self._index.add(topic_filter, topic_filter)
        self._cache: dict[str, bool] = {}

    def allows(self, topic: str) -> bool:
        """Raises: InvalidTopic: (swiftmq) the topic is invalid."""
        found = self._cache.get(topic)
        if found is None:
            if self._scheme == "swiftmq":
                nodes = len(topic.split(hierarchy.SEPARATOR))
                found = any(
                    f == "" or (len(f.split(hierarchy.SEPARATOR)) <= nodes and hierarchy.matches(f, topic))
                    for f in self._filters
                )
            else:
                found = bool(self._index.match(topic))
            if len(self._cache) >= CACHE_TOPICS:
                self._cache.clear()
            self._cache[topic] = found
        return found


@dataclass
class Grants:
    """Every user's grants on one queue manager, compiled (``parse_grants``).

    Attributes:
        scheme: the queue manager's topic scheme.
        records: user -> its record as stored.
        publish: principals with at least one publish grant -> their compiled filters.
        subscribe: users with at least one subscribe grant -> their filters (objects resolved).
    """

    scheme: str = "mqtt"
    records: dict[str, GrantRecord] = field(default_factory=dict)
    publish: dict[str, _Publish] = field(default_factory=dict)
    subscribe: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def may_publish(self, principal: str | None, topic: str) -> bool:
        """Whether ``principal`` may publish on ``topic``: no principal (a trusted writer of the
        publish stream) or no publish grant: yes; else when a grant matches it.

        Raises:
            InvalidTopic: (swiftmq) the topic is invalid.
        """
        if principal is None:
            return True
        found = self.publish.get(principal)
        return found is None or found.allows(topic)

    def may_subscribe(self, user: str, topic_filter: str) -> bool:
        """Whether ``user`` may subscribe to ``topic_filter`` (valid under ``scheme``; ``$share/``
        stripped): no subscribe grant, or one that covers it (``covers``)."""
        found = self.subscribe.get(user)
        return found is None or any(covers(g, topic_filter, self.scheme) for g in found)


def _resolve(qm: str, user: str, record: GrantRecord, kind: str, tree: TopicTree, scheme: str) -> list[str]:
    """The filters of ``record``'s ``kind`` grants, topic objects resolved through ``tree``.

    Raises:
        CorruptRecord: a filter is invalid under ``scheme``.
    """
    filters = []
    for topic_filter in getattr(record, kind):
        try:
            filters.append(validate_grant_filter(topic_filter, scheme))
        except (InvalidTopicFilter, InvalidSelector) as exc:
            raise CorruptRecord(keys.grants(qm), user, f"{kind} filter {topic_filter!r}: {exc}") from exc
    for name in getattr(record, f"{kind}_objects"):
        obj = tree.objects.get(name)
        if obj is not None:  # a deleted object: the grant matches nothing
            filters.append(object_filter(obj.topic_string, scheme))
    return filters


def parse_grants(
    qm: str, raw: dict[Any, Any], tree: TopicTree, scheme: str
) -> tuple[Grants | None, list[CorruptRecord]]:
    """Compile the ``{qm}:grants`` hash as read (user -> JSON) with the queue manager's topic objects.

    A record that cannot be read, or holds an invalid filter, is left out and returned among the
    problems (its user is then unrestricted, as with no grant: the problem is logged and shown).

    Returns:
        ``(grants, problems)``; grants is None when no user has any grant (nothing to check).
    """
    grants, problems = Grants(scheme), []
    for raw_user, value in raw.items():
        user = wire.lenient_text(raw_user)
        try:
            record = GrantRecord.from_json(user, value, qm)
            publish = _resolve(qm, user, record, "publish", tree, scheme)
            subscribe = _resolve(qm, user, record, "subscribe", tree, scheme)
        except CorruptRecord as exc:
            problems.append(exc)
            continue
        grants.records[user] = record
        if record.publish or record.publish_objects:
            grants.publish[user] = _Publish(publish, scheme)
        if record.subscribe or record.subscribe_objects:
            grants.subscribe[user] = tuple(subscribe)
    return (grants if grants.records else None), problems
