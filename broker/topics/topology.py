"""Many queue managers, one topic space: the network's topology, its routes and its announcements.

The rules come from IBM MQ's *Topic spaces* (seed 002) and SwiftMQ's federated router
network (seed 003):

- **Hierarchies** (IBM MQ): each queue manager may name a ``parent``. Every topic
  flows along parent-child edges; the hierarchy is a tree (no cycles).
- **Publish/subscribe clusters** (IBM MQ): queue managers that name the same cluster.
  Only *cluster topics* flow between members: topics under a topic object with the
  ``CLUSTER`` attribute (``broker.topics.topic_objects``); other topics are local and never cross
  a cluster edge. ``CLROUTE(DIRECT)``: every member sends straight to every member.
  ``CLROUTE(TOPICHOST)``: edges only between a member and the *topic hosts*, the members
  that define the clustered topic object, so a publication travels through a host.
- **Routes**: the edges a publication may use depend on its topic's *route class*
  (hierarchy only, or hierarchy plus one cluster's edges). In each class, every queue
  manager's next hop towards a destination is its neighbour closest to the destination
  (breadth first, ties by name), so the routes towards one destination form a tree: a
  publication follows one path from its origin to each destination, never a loop, and a
  queue manager on two mechanisms (a hierarchy and a cluster) sends one copy per channel.
- **Announcements** (SwiftMQ's "some/none"): a queue manager announces a topic key (the
  root topic of a subscription's filter, or the whole filter, by ``announce``) while it has
  at least one subscription for it (``SUBSCOPE(QMGR)`` ones excepted), and withdraws it
  with the last. **Announce filters** (SwiftMQ), ordered by name, decide per receiving
  queue manager (an SQL-LIKE predicate on its name) which keys are announced to it:
  ``include`` only those matching a topic predicate, ``exclude`` all but those. A
  destination gets a publication only when every queue manager on the path to it holds
  its announcement (its *proxy subscription*).
- **Static remote subscriptions** (SwiftMQ): queue manager ``at`` forwards a root topic
  to ``to`` even before ``to`` announces it; with ``keep_on_unsubscribe`` also after
  ``to`` withdraws it (an orderly shutdown), so nothing is lost during maintenance.

- **At the destination**, a forwarded publication is routed like a local one, with that
  queue manager's own links, selectors and topic objects (a link at the origin does not
  carry it to remote subscribers of the link's target). Publisher ids are network-wide:
  the receiver's dedup record drops a second copy of a publisher id and message id,
  whichever queue manager it came from.

The topology is read from ``configs/network.toml`` and stored in every queue manager
(``{qm}:network``, ``broker network apply``), so a worker reads it with its routing table.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from broker.core import wire
from broker.core.errors import ConfigError, InvalidSelector
from broker.core.selectors import like_regex

#: Where ``broker network apply`` reads the topology by default.
DEFAULT_NETWORK_FILE = Path("configs") / "network.toml"

#: Queue manager names (as ``Settings.qm``).
QM_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

#: The announced key that stands for every topic (a filter whose first level is a wildcard).
EVERYTHING = "#"

#: SQL LIKE escape of announce filters (SwiftMQ: a backslash).
ESCAPE = "\\"

AnnounceMode = Literal["root", "topic"]


class QueueManagerNode(BaseModel):
    """One queue manager of the network.

    Attributes:
        url: its Redis (``redis://``, ``redis+cluster://`` ...); None: the same Redis as the
            process's own ``redis_url``.
        parent: its parent in the hierarchy, or None.
        clusters: the publish/subscribe clusters it is a member of.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    parent: str | None = None
    clusters: tuple[str, ...] = ()


class StaticSubscription(BaseModel):
    """SwiftMQ's static remote subscription: ``at`` forwards ``topic`` (a root topic) to ``to``.

    Without ``keep_on_unsubscribe`` it holds only until ``to`` first announces (then the
    dynamic announcements decide); with it, always.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str
    to: str
    topic: str = Field(min_length=1)
    keep_on_unsubscribe: bool = False


class AnnounceFilter(BaseModel):
    """SwiftMQ's router-name filter of queue manager ``at``'s announcements.

    Attributes:
        at: the announcing queue manager.
        name: orders the filters (applied in name order; SwiftMQ advises numbers: "01").
        router: SQL-LIKE predicate (``\\`` escape) on the receiving queue manager's name.
        type: ``include``: only keys matching a topic predicate are announced to it;
            ``exclude``: all keys but those.
        topics: SQL-LIKE predicates on the topic key.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str
    name: str = Field(min_length=1)
    router: str = Field(min_length=1)
    type: Literal["include", "exclude"]
    topics: tuple[str, ...] = ()


class Network(BaseModel):
    """The network of queue managers (``configs/network.toml``).

    Attributes:
        announce: what is announced: ``root`` (the root topic of each subscription, SwiftMQ)
            or ``topic`` (each subscription's filter, IBM MQ's proxy subscriptions).
        retention_ms: how long a transmission entry is kept after the receiver filed it, ms
            (a receiver restarted from an older AOF is sent it again, and drops what it has).
        queue_managers: name -> node.
        static_subscriptions: SwiftMQ's static remote subscriptions.
        announce_filters: SwiftMQ's announce filters.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    announce: AnnounceMode = "root"
    retention_ms: int = Field(default=60_000, ge=0)
    queue_managers: dict[str, QueueManagerNode]
    static_subscriptions: tuple[StaticSubscription, ...] = ()
    announce_filters: tuple[AnnounceFilter, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Network:
        names = self.queue_managers
        if not names:
            raise ValueError("a network needs at least one queue manager")
        for name, node in names.items():
            if node.url and urlsplit(node.url).password:
                raise ValueError(
                    f"queue manager {name!r}: its url holds a password; the network is stored in Redis, "
                    "so give urls without credentials (each process connects with its own)"
                )
            if not QM_NAME.match(name):
                raise ValueError(f"queue manager name {name!r} must be 1-64 of A-Z a-z 0-9 _ . -")
            if node.parent is not None:
                if node.parent not in names:
                    raise ValueError(f"queue manager {name!r}: parent {node.parent!r} is not in the network")
                if node.parent == name:
                    raise ValueError(f"queue manager {name!r} cannot be its own parent")
            for cluster in node.clusters:
                if not QM_NAME.match(cluster):
                    raise ValueError(f"queue manager {name!r}: cluster name {cluster!r} is invalid")
        for name in names:  # the hierarchy is a tree: walking up never comes back
            seen, node_name = {name}, names[name].parent
            while node_name is not None:
                if node_name in seen:
                    raise ValueError(f"the hierarchy has a cycle through {name!r}: parents must form a tree")
                seen.add(node_name)
                node_name = names[node_name].parent
        for static in self.static_subscriptions:
            for role, qm in (("at", static.at), ("to", static.to)):
                if qm not in names:
                    raise ValueError(
                        f"static subscription {static.topic!r}: {role} {qm!r} is not in the network"
                    )
            if static.at == static.to:
                raise ValueError(
                    f"static subscription {static.topic!r}: at and to are the same queue manager"
                )
        for rule in self.announce_filters:
            if rule.at not in names:
                raise ValueError(f"announce filter {rule.name!r}: at {rule.at!r} is not in the network")
            for pattern in (rule.router, *rule.topics):
                try:
                    like_regex(pattern, ESCAPE)
                except InvalidSelector as exc:
                    raise ValueError(f"announce filter {rule.name!r}: {pattern!r}: {exc}") from exc
        return self

    def to_json(self) -> str:
        """The canonical JSON (sorted keys) stored in ``{qm}:network``."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """A short hash of the canonical JSON: equal on every queue manager given the same network."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]


def load_network(path: str | Path = DEFAULT_NETWORK_FILE) -> Network:
    """Read and check a network file.

    Raises:
        ConfigError: the file is missing, not TOML, or not a valid network (the first
            problem is named).
    """
    from broker.core.config import read_toml

    raw = read_toml(path, f"network file {path}")
    return parse_network(raw, str(path))


def parse_network(raw: Any, where: str = "network") -> Network:
    """Check a network given as a dict (or the JSON text of ``{qm}:network``).

    Raises:
        ConfigError: not a valid network, with the first problem named.
    """
    try:
        if isinstance(raw, (bytes, str)):
            return Network.model_validate_json(raw)
        return Network.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        place = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{where}: {place}: {first['msg']}") from exc


#: A route class: ("", ()) for local topics (hierarchy edges only), or (cluster, hosts) for
#: a cluster topic: hosts () for CLROUTE(DIRECT), else the topic hosts (CLROUTE(TOPICHOST)).
RouteClass = tuple[str, tuple[str, ...]]

LOCAL: RouteClass = ("", ())


def route_class_text(route: RouteClass) -> str:
    """``local``, ``cluster <name>`` or ``cluster <name> via topic hosts <qm>, ...`` for a route class."""
    cluster, hosts = route
    if not cluster:
        return "local"
    return f"cluster {cluster}" + (f" via topic hosts {', '.join(hosts)}" if hosts else "")


@dataclass
class Topology:
    """Routes and announce rules of one network (built once per network record).

    Args:
        network: the network.
    """

    network: Network
    _graphs: dict[RouteClass, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    _next: dict[tuple[RouteClass, str], dict[str, str]] = field(default_factory=dict)
    _announce: dict[tuple[str, str, str], bool] = field(default_factory=dict)

    @cached_property
    def members(self) -> dict[str, tuple[str, ...]]:
        """Cluster name -> its members, sorted."""
        found: dict[str, set[str]] = {}
        for name, node in self.network.queue_managers.items():
            for cluster in node.clusters:
                found.setdefault(cluster, set()).add(name)
        return {c: tuple(sorted(m)) for c, m in found.items()}

    @cached_property
    def hierarchy_edges(self) -> set[frozenset[str]]:
        return {
            frozenset((name, node.parent))
            for name, node in self.network.queue_managers.items()
            if node.parent is not None
        }

    def graph(self, route: RouteClass) -> dict[str, tuple[str, ...]]:
        """Queue manager -> its neighbours (sorted) in the route class's edges."""
        found = self._graphs.get(route)
        if found is not None:
            return found
        edges = set(self.hierarchy_edges)
        cluster, hosts = route
        members = self.members.get(cluster, ())
        if cluster:
            if hosts:
                edges |= {frozenset((m, h)) for m in members for h in hosts if h in members and m != h}
            else:
                edges |= {frozenset((a, b)) for a in members for b in members if a < b}
        adjacent: dict[str, set[str]] = {name: set() for name in self.network.queue_managers}
        for edge in edges:
            a, b = tuple(edge)
            adjacent[a].add(b)
            adjacent[b].add(a)
        found = {name: tuple(sorted(n)) for name, n in adjacent.items()}
        self._graphs[route] = found
        return found

    @cached_property
    def neighbours(self) -> dict[str, tuple[str, ...]]:
        """Queue manager -> every queue manager it has a channel to (any route class)."""
        adjacent: dict[str, set[str]] = {name: set() for name in self.network.queue_managers}
        for edge in self.hierarchy_edges:
            a, b = tuple(edge)
            adjacent[a].add(b)
            adjacent[b].add(a)
        for members in self.members.values():
            for a in members:
                adjacent[a].update(m for m in members if m != a)
        return {name: tuple(sorted(n)) for name, n in adjacent.items()}

    def next_hops(self, route: RouteClass, dest: str) -> dict[str, str]:
        """Queue manager -> its next hop towards ``dest`` (only those that can reach it)."""
        key = (route, dest)
        found = self._next.get(key)
        if found is not None:
            return found
        graph = self.graph(route)
        distance = {dest: 0}
        queue = deque([dest])
        while queue:
            here = queue.popleft()
            for there in graph.get(here, ()):
                if there not in distance:
                    distance[there] = distance[here] + 1
                    queue.append(there)
        found = {}
        for name, dist in distance.items():
            if name != dest:
                found[name] = min(n for n in graph[name] if distance.get(n) == dist - 1)
        self._next[key] = found
        return found

    def path(self, route: RouteClass, origin: str, dest: str) -> tuple[str, ...] | None:
        """The queue managers from ``origin`` to ``dest`` (both included), or None when unreachable."""
        if origin == dest:
            return (origin,)
        hops = self.next_hops(route, dest)
        if origin not in hops:
            return None
        found = [origin]
        while found[-1] != dest:
            found.append(hops[found[-1]])
        return tuple(found)

    def announced_to(self, announcer: str, receiver: str, key: str) -> bool:
        """Whether ``announcer``'s announce filters let it announce topic key ``key`` to ``receiver``.

        The first filter of ``announcer`` (in name order) whose router predicate matches
        ``receiver`` decides; none matching: announced (seed 003, *Topic Announce Filters*).
        """
        memo = (announcer, receiver, key)
        found = self._announce.get(memo)
        if found is not None:
            return found
        found = True
        for rule in self.filters.get(announcer, ()):
            if like_regex(rule.router, ESCAPE).fullmatch(receiver) is None:
                continue
            hit = any(like_regex(t, ESCAPE).fullmatch(key) is not None for t in rule.topics)
            found = hit if rule.type == "include" else not hit
            break
        if len(self._announce) > 100_000:
            self._announce.clear()
        self._announce[memo] = found
        return found

    @cached_property
    def filters(self) -> dict[str, tuple[AnnounceFilter, ...]]:
        """Announcing queue manager -> its filters, in name order."""
        found: dict[str, list[AnnounceFilter]] = {}
        for rule in self.network.announce_filters:
            found.setdefault(rule.at, []).append(rule)
        return {qm: tuple(sorted(rules, key=lambda r: r.name)) for qm, rules in found.items()}

    def delivers(self, route: RouteClass, origin: str, dest: str, key: str, static: bool = False) -> bool:
        """Whether a publication of ``route`` class made at ``origin`` reaches ``dest``'s interest
        in ``key``: a path exists and every queue manager before ``dest`` on it holds the
        announcement (a static subscription needs no announcement)."""
        path = self.path(route, origin, dest)
        if path is None:
            return False
        return static or all(self.announced_to(dest, hop, key) for hop in path[:-1])


def announce_key(topic_filter: str, mode: AnnounceMode, separator: str) -> str:
    """The key a subscription's filter is announced under: its root topic (``root``: the first
    level or node; a wildcard there gives ``EVERYTHING``) or the filter itself (``topic``).

    ``$share/<name>/`` (MQTT shared subscriptions) is cut first.
    """
    if topic_filter.startswith("$share/"):
        topic_filter = topic_filter.split("/", 2)[2] if topic_filter.count("/") >= 2 else topic_filter
    if mode == "topic":
        return topic_filter
    root = topic_filter.partition(separator)[0]
    if root in ("#", "+"):  # a swiftmq root node is never a predicate (refused)
        return EVERYTHING
    return root


def key_matches(key: str, topic: str, mode: AnnounceMode, separator: str, match: Any = None) -> bool:
    """Whether a publication on ``topic`` is of interest to announced ``key``.

    ``match(filter, topic)``: the scheme's filter match, for ``topic`` mode.
    """
    if key == EVERYTHING:
        return not topic.startswith("$")
    if mode == "root":
        return topic.partition(separator)[0] == key
    return bool(match(key, topic)) if match is not None else key == topic


@dataclass(frozen=True)
class ProxySubscription:
    """A proxy subscription held at one queue manager for another (``{qm}:proxies``).

    Attributes:
        qm: the remote queue manager whose interest it is (the destination).
        topic: the announced key (a root topic, or a filter under ``announce = "topic"``).
        source: ``dynamic`` (announced) or ``static`` (a static remote subscription).
        at: for a static one, the queue manager it is configured at.
        keep: for a static one, keep_on_unsubscribe.
        since_ms: when it was made, ms since the epoch.
        seq: for a dynamic one, the ``seq`` of the announcement it was read from (``keys.announced``).
    """

    qm: str
    topic: str
    source: Literal["dynamic", "static"] = "dynamic"
    at: str = ""
    keep: bool = False
    since_ms: int = 0
    seq: int = 0

    @property
    def field(self) -> str:
        """Its field in ``{qm}:proxies``: ``<qm> <source> <topic key>``."""
        return proxy_field(self.qm, self.topic, self.source)

    def to_json(self) -> str:
        return json.dumps(
            {
                "qm": self.qm,
                "topic": self.topic,
                "source": self.source,
                "at": self.at,
                "keep": self.keep,
                "since_ms": self.since_ms,
                "seq": self.seq,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> ProxySubscription:
        """Raises: ValueError: not a proxy subscription record."""
        try:
            data = json.loads(raw)
        except RecursionError:
            raise ValueError("not a proxy subscription record: nested too deeply") from None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("qm"), str)
            or not isinstance(data.get("topic"), str)
        ):
            raise ValueError("not a proxy subscription record")
        source = data.get("source", "dynamic")
        if source not in ("dynamic", "static"):
            raise ValueError(f"unknown source {source!r}")
        try:
            since_ms = int(data.get("since_ms", 0))
            seq = int(data.get("seq", 0))
        except (TypeError, OverflowError):  # a list, an infinite number
            raise ValueError("not a proxy subscription record: since_ms or seq is not a number") from None
        return cls(
            data["qm"],
            data["topic"],
            source,
            str(data.get("at", "")),
            bool(data.get("keep", False)),
            since_ms,
            seq,
        )


def proxy_field(qm: str, topic: str, source: str = "dynamic") -> str:
    """The ``{qm}:proxies`` field of a proxy subscription: ``<qm> <source> <key>`` (neither a queue
    manager name nor a source holds a space; the key is the rest)."""
    return f"{qm} {source} {topic}"


def read_withheld(raw: dict[Any, Any]) -> dict[str, dict[str, str]]:
    """``{qm}:withheld`` as read (``hgetall``): receiving qm -> {root topic: persistence mode}.

    A field that cannot be read is left out (nothing withheld on that channel).
    """
    found: dict[str, dict[str, str]] = {}
    for name, value in raw.items():
        try:
            data = json.loads(value)
            roots = data["roots"]
            if not isinstance(roots, dict) or not all(
                isinstance(k, str) and v in ("all", "persistent", "non_persistent") for k, v in roots.items()
            ):
                continue
            found[wire.exact_text(name)] = dict(roots)
        except (ValueError, TypeError, KeyError, RecursionError):
            continue
    return found


def withholds(roots: dict[str, str], root: str, persistent: bool) -> bool:
    """Whether a channel withholding ``roots`` (root topic -> persistence mode) withholds a
    publication on ``root`` with this delivery mode."""
    mode = roots.get(root)
    if mode is None:
        return False
    return mode == "all" or persistent == (mode == "persistent")
