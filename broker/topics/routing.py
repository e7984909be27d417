"""The worker's in-memory routing table: subscriptions and links, loaded at a known version.

A publication on topic T goes to every subscription whose filter matches T or
any topic linked from T, transitively (seed 000), each subscription once (a client
id set to one copy per subscriber gets one copy in all: ``broker.topics.copies``).
``explain`` resolves through the same ``resolve`` as the workers. The
table is loaded with the index version read in the same MULTI, and the worker
brings it to the version a dequeue returns whenever that is newer, so it never
matches against a stale index. A subscription change is logged with the version
it bumped to (``{qm}:sub_changes``): the worker reads the entries after its
table's version and the records they name in one atomic call and applies them
alone (``refresh``); any other change reloads the whole table. Resolved recipient
sets are cached per topic until the next change.

A record that cannot be read (written by hand: not JSON, an invalid filter or
id, a forward link closing a cycle) matches nothing: it is skipped, logged
once per load, and kept in ``problems`` for ``broker status`` and
``explain``. A queue-manager-wide key of the wrong type (the subscription or
link hash) raises ``ForeignKey``: the worker waits, with its entries pending,
until an operator removes it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import hierarchy, keys, wire
from broker.core.connection import as_bytes
from broker.core.entries import Entry
from broker.core.errors import ConfigError, CorruptRecord, ForeignKey, InvalidTopicFilter, translate_errors
from broker.core.hierarchy import DeclaredTopics, HierarchyIndex
from broker.core.keys import DEFAULT_PRIORITY
from broker.core.logs import publication_extra
from broker.core.schemes import root_topic, scheme_of, separator
from broker.core.scripts import register
from broker.core.selectors import Selector, compile_selector
from broker.core.topic_rules import LinkGraph, TopicIndex, validate_topic
from broker.core.topic_rules import matches as mqtt_matches
from broker.core.topic_rules import validate_filter as mqtt_validate_filter
from broker.topics.copies import one_copy, parse_copies
from broker.topics.declared import parse_declared
from broker.topics.grants import Grants, parse_grants
from broker.topics.links import parse_links
from broker.topics.subscriptions import SubscriptionRecord, parse_subscriptions
from broker.topics.topic_objects import Effective, TopicTree, fixed_prefix
from broker.topics.topology import (
    EVERYTHING,
    LOCAL,
    ProxySubscription,
    RouteClass,
    Topology,
    key_matches,
    parse_network,
    read_withheld,
    withholds,
)

log = logging.getLogger("broker.routing")

#: Most topics whose recipient set is cached; the cache is cleared when full.
CACHE_TOPICS = 100_000

#: The Redis type of each key the table reads.
_TYPES = {
    "version": "string",
    "subs": "hash",
    "links": "hash",
    "topics": "hash",
    "manager": "hash",
    "declared": "hash",
    "network": "string",
    "proxies": "hash",
    "cluster_topics": "hash",
    "principals": "hash",
    "grants": "hash",
    "copies": "hash",
}


def _epoch(first: list[tuple[Any, Any]]) -> bytes | None:
    """The change log's epoch (``"epoch <id>"`` scored 0) from its first entry (member, score), or None."""
    if not first:
        return None
    member, score = as_bytes(first[0][0]), first[0][1]
    try:
        if float(score) == 0 and member.startswith(b"epoch "):
            return member
    except (TypeError, ValueError):
        pass
    return None


@dataclass(slots=True)
class Recipients:
    """The subscriptions a topic reaches, and their queue keys per priority band.

    Attributes:
        sub_ids: subscription ids, sorted, each once.
        conditional: those among them with a selector or no-local (decided per publication).
        attributes: the effective topic-object attributes of the topic published on;
            None when the queue manager has no topic object but the base at its defaults.
        one_of: groups of subscriptions of one client set to one copy per subscriber
            (``broker.topics.copies``), earliest-made first: a publication goes to the first
            of each group whose selector and no-local let it through; () when there is none.
    """

    qm: str
    sub_ids: tuple[str, ...]
    conditional: frozenset[str]
    attributes: Effective | None = None
    one_of: tuple[tuple[str, ...], ...] = ()
    _bands: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def queues(self, priority: int = DEFAULT_PRIORITY) -> tuple[str, ...]:
        """The queue keys of every subscription, for a publication of ``priority`` (cached)."""
        found = self._bands.get(priority)
        if found is None:
            found = self._bands[priority] = tuple(keys.sub_band(self.qm, s, priority) for s in self.sub_ids)
        return found


class RoutingTable:
    """Subscriptions and links of one queue manager, as of ``version``.

    Args:
        qm: the queue manager.
        default_maxdepth: ``Settings.default_maxdepth``: the MAXDEPTH of the queues no topic
            object bounds, messages; 0 for none.
        max_selector_bytes: ``Settings.max_selector_bytes``: a subscription whose selector is
            longer, bytes, is skipped at load (in ``problems``, logged); None: any size. One over
            the fixed bounds of ``broker.core.selectors`` (terms, nesting) is skipped whatever this is.

    Attributes:
        version: the index version counter's value when loaded (bytes; compared with the
            dequeue's, parsed only by ``refresh``), or None before the first load.
        problems: the records skipped at the last load.
    """

    def __init__(self, qm: str, default_maxdepth: int = 0, max_selector_bytes: int | None = None) -> None:
        self.qm = qm
        self.default_maxdepth = default_maxdepth
        self.max_selector_bytes = max_selector_bytes
        self.version: bytes | None = None
        self.index: TopicIndex | HierarchyIndex = TopicIndex()
        #: the queue manager's topic scheme (``{qm}:manager``; ``broker.core.schemes``)
        self.scheme = "mqtt"
        #: swiftmq scheme: direct subscriber selection (else indirect, among ``declared``)
        self.direct = True
        self.declared = DeclaredTopics()
        self.links = LinkGraph()
        #: the client ids that get one copy per subscriber (``{qm}:client_copies``; seed 000)
        self.one_copy: frozenset[str] = frozenset()
        self.subscriptions: dict[str, SubscriptionRecord] = {}
        self.problems: list[CorruptRecord] = []
        self.selectors: dict[str, Selector] = {}
        self.tree = TopicTree.parse(qm, {})
        #: sub id -> (MAXDEPTH of its queue, durable), for subscriptions whose queue is bounded
        self.limits: dict[str, tuple[int, bool]] = {}
        #: queue key (every priority band) -> (MAXDEPTH, durable), for the bounded queues
        self.queue_limits: dict[str, tuple[int, bool]] = {}
        self._first_wildcard: dict[str, int] = {}
        #: topic objects other than the base at its defaults (``limits`` to work out)
        self._bounded = False
        #: the last load's readable records by raw field: (stored JSON, record), reused when unchanged
        self._parsed: dict[bytes, tuple[bytes, SubscriptionRecord]] = {}
        #: the subscriptions with a selector or no-local
        self._conditional: set[str] = set()
        self._cache: dict[str, Recipients] = {}
        #: the network this queue manager is in (``{qm}:network``), None when it is alone
        self.topology: Topology | None = None
        #: the proxy subscriptions held here (``{qm}:proxies``), by announced key
        self.proxies: dict[str, list[ProxySubscription]] = {}
        #: copies of the network's cluster topic objects: topic string -> (cluster, clroute, hosts)
        self.cluster_topics: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self._forward_cache: dict[tuple[str, str, tuple[str, ...]], tuple[str, ...]] = {}
        #: transmission stream -> the root topics a remote slow-subscriber condition withholds
        #: from it (``{qm}:withheld``, ``broker.network.slow_routes``): root topic -> persistence mode
        self.withheld: dict[str, dict[str, str]] = {}
        self.ingress: tuple[bytes, ...] = ()
        #: the users' grants (``broker.topics.grants``), None when nobody has one: nothing to check
        self.grants: Grants | None = None
        #: apply logged subscription changes alone (``refresh``); False: always reload whole
        self.incremental = True
        self._script: tuple[redis.Redis, Any] | None = None
        self._last_fallback = ""
        #: the change log's epoch when the table was loaded (``refresh`` applies only that log's entries)
        self._epoch: bytes | None = None

    def load(self, client: redis.Redis) -> None:
        """Read subscriptions, links and the version in one MULTI/EXEC and rebuild.

        Raises:
            ForeignKey: the subscription hash, the link hash or the version
                counter holds another Redis type.
            redis.RedisError: as redis-py raises it.
        """
        qm = self.qm
        names = {
            "version": keys.version(qm),
            "subs": keys.subscriptions(qm),
            "links": keys.links(qm),
            "topics": keys.topic_objects(qm),
            "manager": keys.manager(qm),
            "declared": keys.declared_topics(qm),
            "network": keys.network(qm),
            "proxies": keys.proxies(qm),
            "cluster_topics": keys.cluster_topics(qm),
            "principals": keys.principals(qm),
            "grants": keys.grants(qm),
            "copies": keys.client_copies(qm),
        }
        pipe = client.pipeline(transaction=True)
        for key in names.values():
            pipe.type(key)
        pipe.get(names["version"])
        for what in ("subs", "links", "topics", "manager", "declared"):
            pipe.hgetall(names[what])
        pipe.get(names["network"])
        pipe.hgetall(names["proxies"])
        pipe.hgetall(names["cluster_topics"])
        pipe.hkeys(names["principals"])
        pipe.hgetall(names["grants"])
        pipe.hgetall(names["copies"])
        pipe.hgetall(keys.withheld(qm))  # foreign: nothing withheld (broker.network.slow_routes)
        pipe.zrange(keys.sub_changes(qm), 0, 0, withscores=True)  # the change log's epoch
        replies = pipe.execute(raise_on_error=False)
        first = replies.pop()  # an error when the log is foreign: no epoch, never applied alone
        withheld = replies.pop()
        for (what, key), found in zip(names.items(), replies[: len(names)], strict=True):
            kind = wire.text(found)
            if kind not in ("none", _TYPES[what]):
                raise ForeignKey(key, kind, _TYPES[what])
        for reply in replies[len(names) :]:
            if isinstance(reply, Exception):
                raise reply
        (
            version,
            subs,
            links,
            topics,
            manager,
            declared,
            network,
            proxies,
            clustered,
            principals,
            granted,
            copies,
        ) = replies[len(names) :]
        self._epoch = _epoch(first if isinstance(first, list) else [])
        #: the ingress streams of the principals (``broker.core.principals``): a worker waits on them too
        # each key as bytes, byte for byte the principal's name as Redis holds it: a client's
        # hiredis packer encodes a str strictly, whatever its encoding_errors
        self.ingress = tuple(
            keys.ingress(qm, wire.exact_text(p)).encode("utf-8", "surrogateescape") for p in principals
        )
        self.scheme = scheme_of(qm, manager)
        self.direct = manager.get(b"direct_subscriber_selection", b"true") != b"false"
        # a selector over the limits is skipped here, named: else every publication pays for it
        records, problems = self._parse_subscriptions(subs)
        graph, link_problems = parse_links(qm, links)
        tree = TopicTree.parse(qm, topics, separator(self.scheme), self.default_maxdepth)
        problems += link_problems + tree.problems
        self.declared, declared_problems = parse_declared(qm, declared)
        problems += declared_problems
        problems += self.load_network_records(network, proxies, clustered)
        self.withheld = {
            keys.transmission(qm, to): roots
            for to, roots in (read_withheld(withheld) if isinstance(withheld, dict) else {}).items()
        }
        grants, grant_problems = parse_grants(qm, granted, tree, self.scheme)
        problems += grant_problems
        one_copy, copies_problems = parse_copies(qm, copies)
        problems += copies_problems
        self.version = None  # until rebuilt: a failure halfway leaves a table that is never refreshed alone
        self.links = graph
        self.tree = tree
        self.grants = grants
        self.one_copy = one_copy
        self._bounded = not tree.trivial
        self.index = TopicIndex() if self.scheme == "mqtt" else HierarchyIndex()
        self.subscriptions, self.selectors, self._conditional = {}, {}, set()
        self.limits, self.queue_limits, self._first_wildcard = {}, {}, {}
        for record in records:
            try:
                self._add(record)
            except InvalidTopicFilter as exc:
                problems.append(
                    CorruptRecord(names["subs"], record.sub_id, f"under the {self.scheme} scheme: {exc}")
                )
        for problem in problems:
            log.warning("routing table of %s: %s; it is skipped (matches nothing)", qm, problem)
        self.problems = problems
        self._cache = {}
        self._forward_cache = {}
        self.version = version if version is not None else b"0"

    def _parse_subscriptions(
        self, subs: dict[bytes, bytes]
    ) -> tuple[list[SubscriptionRecord], list[CorruptRecord]]:
        """``parse_subscriptions`` of the ``{qm}:subs`` hash, reusing the records of the last load
        whose stored JSON is unchanged (a reload after an admin change parses only what changed).

        Returns:
            ``(records sorted by id, problems)``.
        """
        known, kept = self._parsed, {}
        records: list[SubscriptionRecord] = []
        fresh: dict[bytes, bytes] = {}
        for raw_id, value in subs.items():
            found = known.get(raw_id)
            if found is not None and found[0] == value:
                records.append(found[1])
                kept[raw_id] = found
            else:
                fresh[raw_id] = value
        parsed, problems = parse_subscriptions(self.qm, fresh, self.max_selector_bytes)
        for record in parsed:
            raw_id = record.sub_id.encode("utf-8")
            stored = fresh.get(raw_id)
            if stored is not None:
                kept[raw_id] = (stored, record)
        self._parsed = kept
        records += parsed
        records.sort(key=lambda r: r.sub_id)
        return records, problems

    def _add(self, record: SubscriptionRecord) -> None:
        """Index one subscription with everything derived from it (selector, no-local, the first
        wildcard level, its queue's MAXDEPTH). Nothing changes when its filter is refused.

        Raises:
            InvalidTopicFilter: the filter is invalid under the queue manager's scheme.
        """
        sub_id = record.sub_id
        self.index.add(record.topic_filter, sub_id)
        self.subscriptions[sub_id] = record
        if record.selector:
            self.selectors[sub_id] = compile_selector(record.selector)
        if record.selector or record.no_local:
            self._conditional.add(sub_id)
        topic_filter = record.topic_filter
        if "+" in topic_filter or "#" in topic_filter:
            levels = topic_filter.split("/")
            first = next((i for i, level in enumerate(levels) if level in ("+", "#")), None)
            if first is not None:
                self._first_wildcard[sub_id] = first
        if self._bounded:
            tree = self.tree
            depth = tree.effective(fixed_prefix(record.topic_filter, tree.separator))["maxdepth"]
            if isinstance(depth, int):
                limit = self.limits[sub_id] = (depth, record.durable)
                for p in keys.PRIORITIES:
                    self.queue_limits[keys.sub_band(self.qm, sub_id, p)] = limit

    def _remove(self, sub_id: str) -> None:
        """Forget one subscription and everything derived from it (nothing when it is not here)."""
        record = self.subscriptions.pop(sub_id, None)
        if record is None:
            return
        self.index.remove(record.topic_filter, sub_id)
        self.selectors.pop(sub_id, None)
        self._conditional.discard(sub_id)
        self._first_wildcard.pop(sub_id, None)
        if self.limits.pop(sub_id, None) is not None:
            for p in keys.PRIORITIES:
                self.queue_limits.pop(keys.sub_band(self.qm, sub_id, p), None)

    def refresh(self, client: redis.Redis) -> bool:
        """Bring the table to the index version now: apply the logged subscription changes
        (``{qm}:sub_changes``) alone when the log holds every version since the table's, else
        reload the whole table (``load``).

        Only subscription changes are logged; any other version bump (links, topic objects,
        declared topics, the network, principals, grants), a log trimmed past the table's version, an
        absent log, a log other than the one the table was loaded with (its epoch differs: made
        anew after a reset), one that cannot be read (another type, an entry that is not
        ``"<version> <sub id>"``), and a changed record that cannot be read all reload the whole
        table, as before the log existed. Recipient sets cached per topic are dropped when a
        subscription changed.

        Returns:
            True when the changes were applied alone, False when the table was reloaded.

        Raises:
            ForeignKey: as ``load`` (only on a reload).
            redis.RedisError: as redis-py raises it.
        """
        if self.incremental and self.version is not None:
            try:
                why = self._apply_changes(client)
            except (redis.ConnectionError, redis.TimeoutError):
                raise  # nothing was changed: the worker's round is retried
            except Exception as exc:  # never stops a worker: a reload rebuilds everything
                why = f"!the change log could not be applied: {exc!r}"
            if why is None:
                return True
            if why != self._last_fallback:
                log.log(
                    logging.WARNING if why.startswith("!") else logging.DEBUG,
                    "routing table of %s: %s; reloading it whole",
                    self.qm,
                    why.lstrip("!"),
                )
                self._last_fallback = why
        self.load(client)
        return False

    def _apply_changes(self, client: redis.Redis) -> str | None:
        """Apply the subscription changes logged since ``version``; None when done, else why not
        (nothing is changed then; ``!`` first: something is wrong, worth a warning)."""
        qm = self.qm
        assert self.version is not None
        try:
            since = int(self.version)
        except ValueError:
            return "!the version is not an integer"
        if self._script is None or self._script[0] is not client:
            self._script = (client, register(client, "sub_changes"))
        reply = self._script[1](
            keys=[keys.version(qm), keys.sub_changes(qm), keys.subscriptions(qm)],
            args=[since, keys.SUB_CHANGES_MAX_LEN],
        )
        if not reply:
            return "!the version, the change log or the subscription hash holds another type"
        raw_version, entries, records, first = reply
        if self._epoch is None or _epoch([(first[0], first[1])] if len(first) == 2 else []) != self._epoch:
            return "the change log is not the one the table was loaded with (made anew, or none then)"
        raw_version = raw_version if raw_version is not None else b"0"
        try:
            now = int(raw_version)
        except ValueError:
            return "!the version is not an integer"
        if now < since:
            return f"the version went back from {since} to {now}"
        if len(entries) != 2 * (now - since):
            return f"the change log lacks versions between {since} and {now} (not a subscription change)"
        changed = self._changed(since, entries, records)
        if isinstance(changed, str):
            return changed
        self.version = None  # until applied: a failure halfway leaves a table only a reload brings on
        for sub_id, record in changed.items():
            self._remove(sub_id)
            if record is not None:
                self._add(record)
        if changed:
            self._cache = {}
        self.version = raw_version
        return None

    def _changed(
        self, since: int, entries: list[bytes], records: list[bytes | None]
    ) -> dict[str, SubscriptionRecord | None] | str:
        """The subscriptions changed after version ``since`` (id -> its record now, None: removed),
        read from the log entries (flat member, score) and the records; or why they cannot be
        applied alone (a string)."""
        subs_key = keys.subscriptions(self.qm)
        unreadable = {p.field for p in self.problems if p.key == subs_key}
        changed: dict[str, SubscriptionRecord | None] = {}
        for i in range(len(entries) // 2):
            expected = since + 1 + i
            member, score = entries[2 * i], entries[2 * i + 1]
            head, sep, raw_id = as_bytes(member).partition(b" ")
            try:
                if not sep or head != str(expected).encode() or float(score) != expected:
                    raise ValueError("not in order")
                sub_id = raw_id.decode("utf-8")
            except ValueError:  # UnicodeDecodeError too
                return f"!change log entry {wire.lenient_text(member)!r} is not {expected} <subscription id>"
            if sub_id in unreadable:
                return f"subscription {sub_id} could not be read before"
            raw = records[i]
            try:
                record = (
                    None
                    if raw is None
                    else SubscriptionRecord.from_json(sub_id, raw, self.qm, self.max_selector_bytes)
                )
                if record is not None and self.scheme != "mqtt":
                    hierarchy.validate_filter(record.topic_filter)
            except (CorruptRecord, InvalidTopicFilter) as exc:
                return f"changed subscription {sub_id} cannot be read: {exc}"
            changed[sub_id] = record
        return changed

    def load_network_records(
        self, network: bytes | None, proxies: dict[bytes, bytes], clustered: dict[bytes, bytes]
    ) -> list[CorruptRecord]:
        """Read the network record, the proxy subscriptions and the cluster topic copies; a record
        that cannot be read is a problem (it matches nothing)."""
        qm, problems = self.qm, []
        self.topology, self.proxies, self.cluster_topics = None, {}, {}
        if network is not None:
            try:
                parsed = parse_network(network, keys.network(qm))
            except ConfigError as exc:
                problems.append(CorruptRecord(keys.network(qm), "", str(exc)))
            else:
                if qm in parsed.queue_managers:
                    self.topology = Topology(parsed)
                else:
                    problems.append(CorruptRecord(keys.network(qm), "", f"{qm} is not in the network"))
        topic_keys = self.topology is not None and self.topology.network.announce == "topic"
        valid_filter = mqtt_validate_filter if self.scheme == "mqtt" else hierarchy.validate_filter
        for raw_field, raw in proxies.items():
            try:
                proxy = ProxySubscription.from_json(raw)
                if topic_keys and proxy.topic != EVERYTHING:
                    valid_filter(proxy.topic)  # a key is matched as a filter: InvalidTopicFilter here
            except (ValueError, TypeError) as exc:
                problems.append(CorruptRecord(keys.proxies(qm), wire.lenient_text(raw_field), str(exc)))
                continue
            self.proxies.setdefault(proxy.topic, []).append(proxy)
        for raw_field, raw in clustered.items():
            try:
                data = json.loads(raw)
                hosts = data.get("hosts", []) if isinstance(data, dict) else None
                if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
                    raise ValueError("not a cluster topic copy: hosts must be a list of queue manager names")
                self.cluster_topics[wire.text(raw_field)] = (
                    str(data["cluster"]),
                    str(data.get("clroute", "DIRECT")),
                    tuple(hosts),
                )
            except (ValueError, TypeError, KeyError, RecursionError) as exc:  # UnicodeDecodeError too
                problems.append(
                    CorruptRecord(keys.cluster_topics(qm), wire.lenient_text(raw_field), repr(exc))
                )
        return problems

    def route_class(self, topic: str) -> RouteClass:
        """The route class of a publication on ``topic`` (``broker.topics.topology``): the cluster of the
        closest cluster topic object at or above it, with its topic hosts under CLROUTE(TOPICHOST);
        ``LOCAL`` for a local topic. At each topic string, a topic object defined here decides
        (``CLUSTER('')``: local; ``ASPARENT``: the level above) and the network's copy of a cluster
        topic object there is looked at only when there is none: IBM MQ, seed 002, "a local
        definition of a topic object ... takes precedence over the same topic object defined
        elsewhere in the cluster". ``broker topic status`` shows this answer."""
        sep = self.tree.separator
        node: str | None = topic
        while node is not None:
            obj = self.tree.object_at(node)
            if obj is not None:
                if obj.attributes.cluster == "":
                    return LOCAL  # a local topic object: its topics stay out of the clusters
                if obj.attributes.cluster != "ASPARENT":
                    copy = self.cluster_topics.get(node)
                    hosts = tuple(sorted({self.qm, *(copy[2] if copy else ())}))
                    return (obj.attributes.cluster, hosts if obj.attributes.clroute == "TOPICHOST" else ())
            else:
                copy = self.cluster_topics.get(node)
                if copy is not None:
                    cluster, clroute, hosts = copy
                    return (cluster, hosts if clroute == "TOPICHOST" else ())
            cut = node.rfind(sep)
            node = node[:cut] if cut > 0 else (None if node == "" else "")
        return LOCAL

    def forwards(self, entry: Entry, attributes: Effective | None = None) -> tuple[str, ...]:
        """The transmission streams a publication goes to: one per channel whose far side
        leads to a queue manager holding a proxy subscription for it (``broker.topics.topology``).

        A publication made here under ``PUBSCOPE(QMGR)`` goes nowhere else (IBM MQ). One that
        came over a channel goes on only towards destinations whose path from its origin runs
        through here, never to a queue manager on its route. Cached per topic, origin and route.
        A channel a remote slow-subscriber condition withholds the topic's root topic from
        (``self.withheld``) is left out, for the delivery modes the condition looks at.
        """
        if self.topology is None or not self.proxies:
            return ()
        header = entry.header
        origin = header.get("origin") or self.qm
        route = tuple(header.get("route") or ())
        memo = (entry.topic, origin, route)
        found = self._forward_cache.get(memo)
        if found is None:
            if origin == self.qm and attributes is not None and attributes["pubscope"] == "QMGR":
                found = ()
            else:
                found = self._channels(entry.topic, origin, route)
            if len(self._forward_cache) >= CACHE_TOPICS:
                self._forward_cache.clear()
            self._forward_cache[memo] = found
        if self.withheld and found:  # a channel too far behind (a remote slow-subscriber condition)
            root = root_topic(entry.topic, self.scheme)
            persistent = bool(header.get("persistent", True))
            found = tuple(s for s in found if not withholds(self.withheld.get(s, {}), root, persistent))
        return found

    def _channels(self, topic: str, origin: str, route: tuple[str, ...]) -> tuple[str, ...]:
        topology = self.topology
        assert topology is not None
        here, sep = self.qm, separator(self.scheme)
        match = mqtt_matches if self.scheme == "mqtt" else hierarchy.matches
        mode = topology.network.announce
        route_class: RouteClass | None = None
        towards: set[str] = set()
        for key, held in self.proxies.items():
            if not key_matches(key, topic, mode, sep, match):
                continue
            if route_class is None:
                route_class = self.route_class(topic)
            for proxy in held:
                dest = proxy.qm
                if dest == here or dest in route:
                    continue
                static = proxy.source == "static"
                if static:
                    path = topology.path(route_class, proxy.at, dest)
                    if path is None or here not in path[:-1]:
                        continue
                path = topology.path(route_class, origin, dest)
                if path is None or here not in path[:-1]:
                    continue
                if not static and not all(topology.announced_to(dest, hop, key) for hop in path[:-1]):
                    continue
                towards.add(path[path.index(here) + 1])
        return tuple(keys.transmission(here, to) for to in sorted(towards))

    def resolve(self, topic: str) -> Recipients:
        """The subscriptions a publication on ``topic`` reaches (before selectors and no-local), each once.

        Args:
            topic: a topic string; validated the first time it is seen.

        Returns:
            The ``Recipients`` (sorted ids: a stable order makes the unit of work repeatable).

        Raises:
            InvalidTopic: the topic is invalid (with a suggested correction).
        """
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        sub_ids: set[str] = set()
        tree = None if self.tree.trivial else self.tree
        for linked in self._reached(topic):
            sub_ids |= self.matching(linked)
        groups: tuple[tuple[str, ...], ...] = ()
        if self.one_copy:  # one copy per subscriber for some client ids (seed 000)
            sub_ids, groups = one_copy(sub_ids, self.one_copy, self.subscriptions, self._conditional)
        found = Recipients(
            self.qm,
            tuple(sorted(sub_ids)),
            frozenset(self._conditional.intersection(sub_ids)),
            None if tree is None else tree.effective(topic),
            groups,
        )
        if len(self._cache) >= CACHE_TOPICS:
            self._cache.clear()
        self._cache[topic] = found
        return found

    def matching(self, linked: str) -> set[str]:
        """The subscriptions whose filter matches one topic reached (``_reached``) and that no
        WILDCARD(BLOCK) keeps out (wildcard ones made above the blocking topic object)."""
        matched = self.index.match(linked)
        if not self.tree.trivial and matched:
            blocks = self.tree.effective(linked).blocks
            if blocks:
                first = self._first_wildcard
                matched = {s for s in matched if first.get(s, blocks) >= blocks}
        return matched

    def _reached(self, topic: str) -> list[str]:
        """The topics a publication on ``topic`` is delivered on: the topic (under indirect selection,
        the declared topics it selects), then every topic linked from them, each once.

        Raises:
            InvalidTopic: the topic is invalid under the queue manager's scheme (with a suggestion).
        """
        if self.scheme == "mqtt":
            validate_topic(topic)
            return self.links.closure(topic)
        if self.direct:
            hierarchy.validate_topic(topic)
            starts = [topic]
        else:
            starts = self.declared.select(topic)
        if not self.links:
            return starts
        reached: dict[str, None] = {}
        for start in starts:
            reached.update(dict.fromkeys(self.links.closure(start)))
        return list(reached)

    def queues(self, entry: Entry, recipients: Recipients | None = None) -> tuple[str, ...]:
        """The queue keys (priority bands) a publication goes to: its topic's subscriptions whose
        selector selects it and that do not exclude it as no-local.

        Subscriptions with neither cost nothing: their keys are cached per topic and priority.

        Args:
            entry: the parsed publication.
            recipients: ``resolve(entry.topic)`` when the caller has it already.

        Raises:
            InvalidTopic: the topic is invalid (with a suggested correction).
        """
        if recipients is None:
            recipients = self.resolve(entry.topic)
        priority = entry.header.get("priority", DEFAULT_PRIORITY)
        if not recipients.conditional:
            return recipients.queues(priority)
        properties = entry.selector_properties()
        qm = self.qm
        if recipients.one_of:
            return self._one_of_queues(entry, recipients, properties, priority)
        kept = []
        for sub_id in recipients.sub_ids:
            if sub_id in recipients.conditional and not self.admits(
                sub_id, properties, entry.client_id, entry=entry
            ):
                continue
            kept.append(keys.sub_band(qm, sub_id, priority))
        return tuple(kept)

    def _one_of_queues(
        self, entry: Entry, recipients: Recipients, properties: dict[str, object], priority: int
    ) -> tuple[str, ...]:
        """``queues`` when a client set to one copy per subscriber has a group of subscriptions
        here (``Recipients.one_of``): of each group, only the first that lets the publication through."""
        conditional, client_id = recipients.conditional, entry.client_id
        passes = {
            s: s not in conditional or self.admits(s, properties, client_id, entry=entry)
            for s in recipients.sub_ids
        }
        for group in recipients.one_of:
            chosen = next((s for s in group if passes[s]), None)
            passes.update((s, s == chosen) for s in group)
        return tuple(keys.sub_band(self.qm, s, priority) for s in recipients.sub_ids if passes[s])

    def admits(
        self, sub_id: str, properties: dict[str, object], client_id: str | None, *, entry: Entry | None = None
    ) -> bool:
        """Whether subscription ``sub_id``'s no-local and selector let a publication through.

        ``entry``: the publication, named in the log line of a selector that fails on it.
        """
        record = self.subscriptions[sub_id]
        if record.no_local and client_id is not None and client_id == record.client_id:
            return False
        selector = self.selectors.get(sub_id)
        if selector is None:
            return True
        try:
            return selector.matches(properties)
        except Exception:  # a selector never stops a worker; not selected
            log.exception(
                "selector of %s failed on a publication; not selected",
                sub_id,
                extra=None
                if entry is None
                else publication_extra(entry.entry_id, msgid=entry.msgid, publisher=entry.publisher),
            )
            return False


@translate_errors
def network_problems(client: redis.Redis, qm: str) -> list[CorruptRecord]:
    """The network records of ``qm`` that cannot be read (``{qm}:network``, ``{qm}:proxies``,
    ``{qm}:cluster_topics``): the workers skip them (``broker status`` names them)."""
    pipe = client.pipeline(transaction=True)
    pipe.get(keys.network(qm))
    pipe.hgetall(keys.proxies(qm))
    pipe.hgetall(keys.cluster_topics(qm))
    network, proxies, clustered = pipe.execute()
    return RoutingTable(qm).load_network_records(network, proxies, clustered)
