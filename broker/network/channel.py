"""Channels between queue managers: the announcing agent and the movers (``broker channel``).

One channel process runs per queue manager (a Procfile process type, supervised like the
workers). It does two things in one loop:

- **The agent** (SwiftMQ's subscription exchange, IBM MQ's proxy subscriptions; seeds 002
  and 003, ``broker.topics.topology``): it writes what this queue manager announces
  (``{qm}:announced``: the keys of its subscriptions, "some/none"), reads what every other
  queue manager announces and the cluster topic objects they define, and reconciles this
  queue manager's proxy subscriptions (``{qm}:proxies``) and cluster topic copies
  (``{qm}:cluster_topics``) with them, bumping ``{qm}:version`` so that the workers route
  with them. A queue manager that cannot be reached keeps its proxy subscriptions until it
  withdraws them: messages for it wait in its transmission stream.
- **Remote slow-subscriber conditions** (``broker.network.slow_routes``): each agent round,
  a channel whose undelivered backlog reaches a ``remote`` (or ``all``) condition's
  ``max_messages`` is named in ``{qm}:withheld``, and the workers forward no further
  publication of that root topic to it until the backlog is below the bound again (with a
  ``disconnect_*`` option, the proxy subscriptions of that root topic behind it are removed
  until their queue managers announce again).
- **The movers** (``broker.network.mover``), one per channel to a neighbour: each moves the entries of the
  transmission stream ``{qm}:xmit:<to>`` (written by ``commit.lua`` inside the unit of work)
  into the receiver's publish stream, in order, with ``lua/channel_in.lua``, which files an
  entry only if its channel sequence (its transmission entry id) is above the last one filed
  from this sender. The last sequence filed is read from the receiver, so a mover killed at
  any point, or a receiver restarted from an older AOF, sends again what is missing and
  nothing twice. Entries are trimmed from the transmission stream ``retention_ms`` after
  they were filed. A receiver that cannot be reached is retried with a doubling pause
  (100 ms up to ``channel_max_backoff_ms``), reported in the channel's state
  (``{qm}:channel:<to>``).

A forwarded publication keeps its publisher id, message id, timestamp, sequence number and
properties, and carries its origin queue manager and route (``origin``, ``route``): the
receiver's dedup record drops a second copy by message id, and its workers never forward it
back along its route.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import clock, keys, wire
from broker.core.config import Settings
from broker.core.connection import wait_for_server
from broker.core.errors import ConfigError
from broker.core.schemes import separator
from broker.network.mover import Mover
from broker.network.peers import UNREACHABLE, Clock, Peers
from broker.network.slow_routes import SlowRoutes
from broker.topics.routing import RoutingTable
from broker.topics.topic_objects import TopicObject, fixed_prefix
from broker.topics.topology import (
    Network,
    ProxySubscription,
    RouteClass,
    Topology,
    announce_key,
    parse_network,
    route_class_text,
)

log = logging.getLogger("broker.channel")

#: A channel process heartbeat older than this is removed by the live ones, ms.
AGENT_GONE_AFTER_MS = 60_000

#: How long a process (re)started by its pool waits for the server, ms: a child restarted
#: while its server (or the cluster node its URL names) is down waits instead of dying.
START_WAIT_MS = 60_000


def _sync_hash(pipe: Any, key: str, old: dict[str, str], new: dict[str, str]) -> None:
    """Queue on ``pipe`` the commands that turn hash ``key`` from ``old`` into ``new``."""
    gone = [field for field in old if field not in new]
    if gone:
        pipe.hdel(key, *gone)
    fresh: dict[Any, Any] = {field: value for field, value in new.items() if old.get(field) != value}
    if fresh:
        pipe.hset(key, mapping=fresh)


def read_network(client: redis.Redis, qm: str) -> Network | None:
    """The network record of ``qm`` (``{qm}:network``), or None when it is in no network.

    Raises:
        ConfigError: the record is not a valid network.
    """
    raw = client.get(keys.network(qm))
    return None if raw is None else parse_network(raw, keys.network(qm))


def read_announced(client: redis.Redis, qm: str) -> dict[str, Any] | None:
    """What ``qm`` announces (``{qm}:announced``), or None when it never announced.

    Raises:
        ValueError: the record is not JSON of the documented shape.
    """
    raw = client.get(keys.announced(qm))
    if raw is None:
        return None
    data = json.loads(raw)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("keys", {}), dict)
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.get("keys", {}).values())
        or not isinstance(data.get("seq", 0), int)
        or isinstance(data.get("seq", 0), bool)
    ):
        raise ValueError(f"{keys.announced(qm)} is not an announcement record")
    return data


def announced_keys(table: RoutingTable, topology: Topology) -> set[str]:
    """The keys a queue manager announces, from its routing table: one per subscription
    (``SUBSCOPE(QMGR)`` ones excepted), per link source, and per ``PROXYSUB(FORCE)`` object."""
    mode, sep = topology.network.announce, separator(table.scheme)
    tree = None if table.tree.trivial else table.tree
    found: set[str] = set()
    for record in table.subscriptions.values():
        if tree is not None and tree.effective(fixed_prefix(record.topic_filter, sep))["subscope"] == "QMGR":
            continue
        found.add(announce_key(record.topic_filter, mode, sep))
    for source in table.links.sources():
        found.add(announce_key(source, mode, sep))
    if tree is not None:
        for obj in tree.objects.values():
            if obj.attributes.proxysub == "FORCE" and obj.topic_string:
                whole = obj.topic_string + ("/#" if sep == "/" else "")
                found.add(announce_key(whole, mode, sep))
    return found


def unrouted_statics(table: RoutingTable, topology: Topology) -> list[str]:
    """One problem line per static remote subscription configured at this queue manager (``at``)
    that forwards nothing for a route class: no path leads from ``at`` to ``to`` in the route class
    of its root topic, or of a topic below it where a topic object here or a cluster copy
    changes the class (``RoutingTable.route_class``), e.g. a local topic between two members of
    a cluster with no hierarchy edge. Empty when every static subscription has its path.

    Args:
        table: this queue manager's routing table, loaded.
        topology: the network it is in.
    """
    sep = separator(table.scheme)
    bound = {obj.topic_string for obj in table.tree.objects.values()} | set(table.cluster_topics)
    found: list[str] = []
    for static in topology.network.static_subscriptions:
        if static.at != table.qm:
            continue
        below = sorted(t for t in bound if t.startswith(static.topic + sep))
        seen: set[RouteClass] = set()
        for topic in (static.topic, *below):
            route = table.route_class(topic)
            if route in seen:
                continue
            seen.add(route)
            if topology.path(route, static.at, static.to) is None:
                found.append(
                    f"static remote subscription {static.topic!r} to {static.to} forwards nothing on "
                    f"{topic!r}: no path from {static.at} to {static.to} for its route class "
                    f"({route_class_text(route)}); give them a hierarchy edge, or put the topic under a "
                    "cluster topic object of a cluster both are in"
                )
    return found


def _still_removed(removed: dict[str, int], other: str, seq: int) -> tuple[set[str] | None, list[str]]:
    """What of ``other``'s announcement (its ``seq``) stays out of the proxy subscriptions after a
    removal (``{qm}:proxies_removed``): ``(None: all of it, else the topic keys kept out; the fields
    to delete, their removal overtaken by a newer announcement)``."""
    kept_out: set[str] = set()
    cleared: list[str] = []
    for name, removed_seq in removed.items():
        whole = name == other
        if not whole and not name.startswith(other + " "):
            continue
        if seq > removed_seq:
            cleared.append(name)
        elif whole:
            return None, []
        else:
            kept_out.add(name[len(other) + 1 :])
    return kept_out, cleared


def _removed_at(raw: dict[Any, Any]) -> dict[str, int]:
    """``{qm}:proxies_removed`` read: ``<remote qm>`` (all its keys) or ``<remote qm> <topic key>``
    (one, a slow remote route's disconnect) -> the announcement ``seq`` removed (a value that is
    not a number counts as 0: removed until the remote queue manager announces again)."""
    found: dict[str, int] = {}
    for name, value in raw.items():
        try:
            found[wire.exact_text(name)] = int(value)
        except ValueError:
            found[wire.exact_text(name)] = 0
    return found


@dataclass
class Agent:
    """The announcing and reconciling half of a channel process, for queue manager ``qm``.

    Args:
        client: the queue manager's own client.
        qm: the queue manager.
        peers: clients of the other queue managers.
        clock_ms: ms since the epoch (injectable).
    """

    client: redis.Redis
    qm: str
    peers: Peers
    clock_ms: Clock
    topology: Topology | None = None
    #: remote qm -> its last announcement read (kept while it cannot be reached)
    remote: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: the index version and state the last announcement was worked out at
    _announced_at: tuple[Any, str] | None = None
    #: static remote subscriptions at this queue manager without a path (``unrouted_statics``),
    #: and the index version and network they were worked out at
    unrouted: list[str] = field(default_factory=list)
    _unrouted_at: tuple[Any, str] | None = None

    def load(self) -> Topology | None:
        """Read the network record (None: not in a network).

        Raises:
            ConfigError: the record is invalid or does not name this queue manager.
        """
        network = read_network(self.client, self.qm)
        if network is None:
            self.topology = None
            return None
        if self.qm not in network.queue_managers:
            raise ConfigError(f"{self.qm} is not in the network stored in {keys.network(self.qm)}")
        if self.topology is None or self.topology.network != network:
            self.topology = Topology(network)
        self.peers.network = network
        return self.topology

    def round(self) -> bool:
        """Announce, then reconcile; returns whether the proxy subscriptions or copies changed.

        Raises:
            redis.RedisError: this queue manager's own server cannot be reached.
            ConfigError: the network record is invalid.
        """
        topology = self.load()
        if topology is None:
            return False
        self.announce(topology)
        changed = self.reconcile(topology)
        self.check_statics(topology)
        return changed

    def check_statics(self, topology: Topology) -> list[str]:
        """Work out ``unrouted`` again when the index version or the network changed; log each
        line at WARNING when the set changes (once per change, not per publication), and add
        them to ``problems`` (the heartbeat: ``broker status --network``)."""
        if not any(s.at == self.qm for s in topology.network.static_subscriptions):
            self.unrouted, self._unrouted_at = [], None
            return []
        at = (self.client.get(keys.version(self.qm)), topology.network.digest)
        if at != self._unrouted_at:
            table = RoutingTable(self.qm)
            table.load(self.client)
            found = unrouted_statics(table, topology)
            if found != self.unrouted:
                for line in found:
                    log.warning("%s: %s", self.qm, line)
                if self.unrouted and not found:
                    log.info("%s: every static remote subscription has its path again", self.qm)
            self.unrouted, self._unrouted_at = found, at
        self.problems += self.unrouted
        return self.unrouted

    def announce(self, topology: Topology, state: str | None = None, again: bool = False) -> dict[str, Any]:
        """Write ``{qm}:announced`` when what this queue manager announces changed, or ``again``.

        Each write counts one more in the record's ``seq``: a proxy subscription an operator
        removed elsewhere (``broker proxies remove``) comes back only with a higher one.

        Args:
            state: ``withdrawn`` to withdraw every key (an orderly shutdown), ``up`` to announce
                again; None keeps the recorded state.
            again: write the record even when unchanged (a channel process that starts announces
                again, SwiftMQ's router connecting).

        Returns:
            The record as written.
        """
        qm, now = self.qm, self.clock_ms()
        try:
            old = read_announced(self.client, qm) or {}
        except ValueError:
            old = {}
        state = state or old.get("state", "up")
        version = self.client.get(keys.version(qm))
        if not again and old and self._announced_at == (version, state) and old.get("state") == state:
            return old  # nothing it announces can have changed (subscriptions, links, objects)
        found: set[str] = set()
        if state == "up":
            table = RoutingTable(qm)
            table.load(self.client)
            found = announced_keys(table, topology)
        before = old.get("keys", {})
        record = {
            "state": state,
            "keys": {k: before.get(k, now) for k in sorted(found)},
            "at_ms": now,
            "seq": int(old.get("seq", 0)) + 1,
        }
        if again or record["keys"] != before or state != old.get("state") or not old:
            self.client.set(keys.announced(qm), json.dumps(record, separators=(",", ":")))
            log.info("%s announces %s (%s)", qm, sorted(found) or "nothing", state)
        else:
            record = old
        self._announced_at = (version, state)
        return record

    def reconcile(self, topology: Topology) -> bool:
        """Make ``{qm}:proxies`` and ``{qm}:cluster_topics`` what the network says; bump the
        version when either changed. A queue manager that cannot be read keeps its entries."""
        qm, now, network = self.qm, self.clock_ms(), topology.network
        self.problems = []
        current = {
            wire.exact_text(f): wire.exact_text(v) for f, v in self.client.hgetall(keys.proxies(qm)).items()
        }
        seen = {wire.exact_text(f) for f in self.client.hkeys(keys.network_seen(qm))}
        try:
            removed = _removed_at(self.client.hgetall(keys.proxies_removed(qm)))
        except redis.ResponseError as exc:  # a foreign key: no removal is known
            removed = {}
            self.problems.append(f"{keys.proxies_removed(qm)}: {exc}")
        announced_again: list[str] = []
        newly_seen: list[str] = []
        desired: dict[str, ProxySubscription] = {}
        unreachable: set[str] = set()
        for other in network.queue_managers:
            if other == qm:
                continue
            try:
                record = read_announced(self.peers.client(other), other)
            except UNREACHABLE as exc:
                self.peers.drop(other)
                unreachable.add(other)
                self.problems.append(f"{other}: {exc}")
                continue
            except ValueError as exc:
                self.problems.append(str(exc))
                unreachable.add(other)
                continue
            if record is None:
                continue
            self.remote[other] = record
            if other not in seen:
                newly_seen.append(other)
                seen.add(other)
            seq = int(record.get("seq", 0))
            kept_out, cleared = _still_removed(removed, other, seq)
            announced_again += cleared
            if kept_out is None:
                continue  # removed by an operator: not again until it announces again
            for key, since in record.get("keys", {}).items():
                if key not in kept_out and topology.announced_to(other, qm, key):
                    proxy = ProxySubscription(other, key, "dynamic", since_ms=int(since), seq=seq)
                    desired[proxy.field] = proxy
        for static in network.static_subscriptions:
            if static.to != qm and (static.keep_on_unsubscribe or static.to not in seen):
                proxy = ProxySubscription(
                    static.to, static.topic, "static", static.at, static.keep_on_unsubscribe, now
                )
                desired[proxy.field] = proxy
        wanted = {f: p.to_json() for f, p in desired.items()}
        for name, raw in current.items():  # one that cannot be read now keeps what it had
            try:
                kept = ProxySubscription.from_json(raw)
            except (ValueError, TypeError):  # a corrupt record: replaced by what is wanted, or removed
                continue
            if kept.source == "dynamic" and kept.qm in unreachable:
                wanted[name] = wire.exact_text(raw)
            elif name in wanted:  # unchanged: keep its record (and its since_ms)
                again = ProxySubscription.from_json(wanted[name])
                if (again.qm, again.topic, again.source, again.at, again.keep, again.seq) == (
                    kept.qm,
                    kept.topic,
                    kept.source,
                    kept.at,
                    kept.keep,
                    kept.seq,
                ):
                    wanted[name] = wire.exact_text(raw)
        copies = self._cluster_copies(topology)
        old_copies = {
            wire.exact_text(f): wire.exact_text(v)
            for f, v in self.client.hgetall(keys.cluster_topics(qm)).items()
        }
        if copies is None:
            copies = old_copies
        changed = wanted != current or copies != old_copies
        if changed or newly_seen or announced_again:
            pipe = self.client.pipeline(transaction=True)
            _sync_hash(pipe, keys.proxies(qm), current, wanted)
            _sync_hash(pipe, keys.cluster_topics(qm), old_copies, copies)
            if newly_seen:
                pipe.hset(keys.network_seen(qm), mapping=dict.fromkeys(newly_seen, now))
            if announced_again:
                pipe.hdel(keys.proxies_removed(qm), *announced_again)
                log.info(
                    "%s: %s announced again: its proxy subscriptions are made again", qm, announced_again
                )
            if changed:
                pipe.incr(keys.version(qm))
            pipe.execute()
            if changed:
                log.info("%s: proxy subscriptions now %s", qm, sorted(wanted))
        return changed

    def _cluster_copies(self, topology: Topology) -> dict[str, str] | None:
        """topic string -> JSON copy of the cluster topic objects defined in the network, or None
        when a cluster member cannot be read (the copies are then left as they are)."""
        members = topology.members
        found: dict[str, dict[str, Any]] = {}
        for name, node in topology.network.queue_managers.items():
            if not node.clusters:
                continue
            try:
                client = self.client if name == self.qm else self.peers.client(name)
                raw = client.hgetall(keys.topic_objects(name))
            except UNREACHABLE as exc:
                self.peers.drop(name)
                self.problems.append(f"{name}: {exc}")
                return None
            for raw_name, value in raw.items():
                try:
                    obj = TopicObject.from_json(wire.exact_text(raw_name), value, name)
                except Exception:  # a corrupt record: broker status names it on its own queue manager
                    continue
                cluster = obj.attributes.cluster
                if cluster in ("ASPARENT", "") or name not in members.get(cluster, ()):
                    continue
                copy = found.setdefault(
                    obj.topic_string, {"cluster": cluster, "clroute": obj.attributes.clroute, "hosts": []}
                )
                copy["hosts"] = sorted({*copy["hosts"], name})
        return {t: json.dumps(c, sort_keys=True, separators=(",", ":")) for t, c in found.items()}


class ChannelProcess:
    """The channel process of one queue manager: its agent and its movers, in one loop.

    Args:
        client: the queue manager's client.
        settings: the broker settings (``qm``, ``redis_url``, ``network_poll_ms``, ...).
        name: the process's name (mover leases, heartbeat); default ``<host>-<pid>-<random>``.
        clock_ms: ms since the epoch (injectable).
        hook: called with a crash point's name (``before_channel_in``, ``after_channel_in``).
    """

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        name: str | None = None,
        clock_ms: Clock | None = None,
        hook: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.qm = settings.qm
        self.name = name or keys.process_name()
        self.clock_ms = clock_ms or clock.now_ms
        self.hook = hook or (lambda point: None)
        self.peers = Peers(settings.redis_url, client, settings.tls)
        self.agent = Agent(client, self.qm, self.peers, self.clock_ms)
        self.movers: dict[str, Mover] = {}
        self.slow_routes = SlowRoutes(client, self.qm, list(settings.slow_subscriber_conditions))
        self.stopping = False
        self._next_round_ms = 0
        self._next_forget_ms = 0

    def _movers(self, topology: Topology | None) -> list[Mover]:
        """One mover per neighbour of the current topology."""
        wanted = topology.neighbours.get(self.qm, ()) if topology is not None else ()
        retention = topology.network.retention_ms if topology is not None else 60_000
        for to in wanted:
            if to not in self.movers:
                self.movers[to] = Mover(
                    self.client,
                    self.qm,
                    to,
                    self.peers,
                    self.name,
                    self.clock_ms,
                    self.settings.channel_batch,
                    self.settings.channel_max_backoff_ms,
                    retention,
                    self.hook,
                )
        for to in [t for t in self.movers if t not in wanted]:
            del self.movers[to]
        return list(self.movers.values())

    def rejoin(self) -> None:
        """Announce again after an orderly withdrawal (a restarted queue manager, SwiftMQ)."""
        topology = self.agent.load()
        if topology is not None:
            self.agent.announce(topology, state="up", again=True)

    def run_once(self) -> int:
        """One agent round when due, then one move per channel; returns the entries moved."""
        now = self.clock_ms()
        due = now >= self._next_round_ms
        if due:
            self._next_round_ms = now + self.settings.network_poll_ms
            try:
                self.agent.round()
            except ConfigError as exc:
                # an invalid network record: the movers go on with the last topology read, so
                # that what is in the transmission streams still moves; the heartbeat says why
                log.error("channel process %s: %s", self.qm, exc)
                self.agent.problems = [str(exc)]
        movers = self._movers(self.agent.topology)
        if due:
            try:
                self.slow_routes.check({mover.to: mover.last for mover in movers}, now, self.agent.topology)
            except redis.ResponseError as exc:  # a foreign {qm}:withheld: nothing is withheld, moving goes on
                log.error("channel process %s: slow remote routes: %s", self.qm, exc)
                self.agent.problems.append(f"slow remote routes: {exc}")
            self._heartbeat(now)
        return sum(mover.move_once() for mover in movers)

    def _heartbeat(self, now: int) -> None:
        beat = {
            "name": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "seen_ms": now,
            "channels": sorted(self.movers),
            "problems": self.agent.problems[:5],
        }
        agents = keys.network_agents(self.qm)
        self.client.hset(agents, self.name, json.dumps(beat, separators=(",", ":")))
        if now >= self._next_forget_ms:  # forget processes killed without a chance to say so
            self._next_forget_ms = now + AGENT_GONE_AFTER_MS // 6
            gone = []
            for name, raw in self.client.hgetall(agents).items():
                try:
                    if now - int(json.loads(raw)["seen_ms"]) > AGENT_GONE_AFTER_MS:
                        gone.append(name)
                except (ValueError, KeyError, TypeError):
                    gone.append(name)
            if gone:
                self.client.hdel(agents, *gone)

    def run(self, idle_wait_ms: int = 100) -> None:
        """Loop until ``stopping``: never ends on a Redis error (logged, retried after a pause)."""
        try:
            self.rejoin()
        except UNREACHABLE as exc:
            log.warning("channel process %s: %s", self.qm, exc)
        while not self.stopping:
            try:
                moved = self.run_once()
            except UNREACHABLE as exc:
                log.warning("channel process %s: %s; retrying", self.qm, exc)
                moved = 0
                time.sleep(0.5)
            except ConfigError as exc:
                log.error("channel process %s: %s", self.qm, exc)
                moved = 0
                time.sleep(1.0)
            if moved == 0 and not self.stopping:
                self._wait(idle_wait_ms)
        self.close()

    def close(self) -> None:
        """Give up the movers' leases and forget this process's heartbeat (a stopped process is
        not listed as running, and the next one, or ``broker channel --once`` again, moves at once)."""
        for mover in self.movers.values():
            with contextlib.suppress(*UNREACHABLE):
                mover.release()
        with contextlib.suppress(*UNREACHABLE):
            self.client.hdel(keys.network_agents(self.qm), self.name)

    def _wait(self, idle_wait_ms: int) -> None:
        """Block until a transmission stream gets an entry, or ``idle_wait_ms`` passes."""
        movers = [m for m in self.movers.values() if m.last is not None and m.backoff_ms == 0]
        if not movers:
            time.sleep(idle_wait_ms / 1000)
            return
        try:
            streams: dict[Any, Any] = {m.stream: m.last for m in movers}
            self.client.xread(streams, count=1, block=idle_wait_ms)
        except UNREACHABLE:
            time.sleep(idle_wait_ms / 1000)


def main(settings: Settings, name: str | None = None, hook: Callable[[str], None] | None = None) -> None:
    """Run a channel process until SIGTERM/SIGINT (the ``broker channel`` command, a Procfile entry).

    Args:
        settings: the broker settings.
        name: the process's name (``ChannelProcess``); default ``<host>-<pid>-<random>``.
        hook: crash-point hook of its movers (the chaos harness).
    """
    import signal

    client = wait_for_server(settings.redis_url, START_WAIT_MS, tls=settings.tls)  # an outage: it waits
    process = ChannelProcess(client, settings, name=name, hook=hook)

    def _stop(signum: int, frame: object) -> None:
        process.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("channel process %s for %s", process.name, settings.qm)
    process.run()
