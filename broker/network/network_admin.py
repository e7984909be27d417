"""Administering the network of queue managers: apply the topology, withdraw, list proxy
subscriptions, and the network's status (``broker network``, ``broker proxies``,
``broker status --network``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from broker.core import clock, keys, wire
from broker.core.connection import TLSOptions, redact_url
from broker.core.errors import ConfigError, translate_errors
from broker.network.channel import Agent, read_announced, read_network, unrouted_statics
from broker.network.peers import UNREACHABLE, Peers
from broker.topics.routing import RoutingTable
from broker.topics.topology import Network, ProxySubscription, Topology, proxy_field, read_withheld


@dataclass
class Applied:
    """What ``apply_network`` did on each queue manager: qm -> "applied", "unchanged" or the error."""

    results: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [qm for qm, what in self.results.items() if what not in ("applied", "unchanged")]


def apply_network(
    network: Network, own_url: str, own_client: redis.Redis, tls: TLSOptions | None = None
) -> Applied:
    """Store the topology in every queue manager of the network (``{qm}:network``, with a version
    bump in the same MULTI so its workers reload at once).

    A queue manager that cannot be reached is reported in the result, the others are applied:
    run it again when it is back. ``tls``: the TLS settings for ``rediss://`` nodes (``Settings.tls``).
    """
    peers = Peers(own_url, own_client, tls)
    peers.network = network
    text = network.to_json()
    done = Applied()
    for qm in network.queue_managers:
        try:
            client = peers.client(qm)
            if wire.exact_text(client.get(keys.network(qm))) == text:
                done.results[qm] = "unchanged"
                continue
            pipe = client.pipeline(transaction=True)
            pipe.set(keys.network(qm), text)
            pipe.incr(keys.version(qm))
            pipe.execute()
            done.results[qm] = "applied"
        except UNREACHABLE as exc:
            peers.drop(qm)
            done.results[qm] = f"not applied: {exc}"
    return done


@translate_errors
def withdraw(client: redis.Redis, qm: str, url: str, tls: TLSOptions | None = None) -> dict[str, Any]:
    """Withdraw every announcement of ``qm`` (an orderly shutdown for maintenance, SwiftMQ): the
    other queue managers drop its dynamic proxy subscriptions at their next round; static ones
    with ``keep_on_unsubscribe`` keep forwarding into their transmission streams. Its channel
    process announces again when it starts.

    Raises:
        ConfigError: ``qm`` is in no network.
    """
    agent = Agent(client, qm, Peers(url, client, tls), clock.now_ms)
    topology = agent.load()
    if topology is None:
        raise ConfigError(f"{qm} is in no network: run 'broker network apply' first")
    return agent.announce(topology, state="withdrawn")


@translate_errors
def remove_proxies(client: redis.Redis, qm: str, remote_qm: str) -> int:
    """Remove the dynamic proxy subscriptions ``qm`` holds for ``remote_qm`` (and bump the version,
    so its workers stop forwarding at once); returns how many were removed.

    SwiftMQ's deletion of a dead router's remote subscriptions (seed 003): they stay removed
    until ``remote_qm`` announces again, with a newer announcement than the one they were read
    from (its channel process starts, or what it announces changes), even while its old
    announcement can still be read. The removal is recorded in ``{qm}:proxies_removed`` with
    that announcement's ``seq``, in the same MULTI. Static ones come from the network file and stay.
    """
    prefix = proxy_field(remote_qm, "", "dynamic")
    found = {
        f: raw for f, raw in client.hgetall(keys.proxies(qm)).items() if wire.exact_text(f).startswith(prefix)
    }
    if not found:
        return 0
    seq = 0
    for raw in found.values():
        try:
            seq = max(seq, ProxySubscription.from_json(raw).seq)
        except (ValueError, TypeError):  # a corrupt record: removed, its seq unknown
            continue
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.proxies(qm), *found)
    pipe.hset(keys.proxies_removed(qm), remote_qm, seq)
    pipe.incr(keys.version(qm))
    removed, _, _ = pipe.execute()
    return int(removed)


@translate_errors
def static_problems(client: redis.Redis, qm: str) -> list[str]:
    """The static remote subscriptions configured at ``qm`` that forward nothing for want of a
    path (``broker.network.channel.unrouted_statics``), one line each; none when ``qm`` is in no
    network, its network record cannot be read (``network_problems`` names it) or it has none.
    A routing table is loaded only when ``qm`` has a static subscription (``broker status``)."""
    try:
        network = read_network(client, qm)
    except ConfigError:
        return []
    if network is None or qm not in network.queue_managers:
        return []
    if not any(s.at == qm for s in network.static_subscriptions):
        return []
    table = RoutingTable(qm)
    table.load(client)
    return unrouted_statics(table, Topology(network))


@dataclass
class ProxyRow:
    """One proxy subscription held here, for ``broker proxies``."""

    qm: str
    topic: str
    source: str
    at: str
    keep: bool
    since_ms: int


@translate_errors
def list_proxies(client: redis.Redis, qm: str) -> tuple[list[ProxyRow], dict[str, Any] | None, list[str]]:
    """The proxy subscriptions ``qm`` holds, what it announces, and the records that cannot be read.

    Returns:
        ``(rows sorted by remote qm and key, the announcement record or None, problems)``.
    """
    rows, problems = [], []
    for raw_field, raw in client.hgetall(keys.proxies(qm)).items():
        try:
            proxy = ProxySubscription.from_json(raw)
        except (ValueError, TypeError) as exc:
            problems.append(f"{keys.proxies(qm)} field {wire.exact_text(raw_field)!r}: {exc}")
            continue
        rows.append(ProxyRow(proxy.qm, proxy.topic, proxy.source, proxy.at, proxy.keep, proxy.since_ms))
    try:
        announced = read_announced(client, qm)
    except ValueError as exc:
        announced = None
        problems.append(str(exc))
    return sorted(rows, key=lambda r: (r.qm, r.topic, r.source)), announced, problems


@dataclass
class QueueManagerRow:
    """One queue manager of the network in ``network_status``.

    Attributes:
        qm: its name.
        url: its Redis URL, password redacted.
        parent: its parent in the hierarchy, or None.
        clusters: the publish/subscribe clusters it is in.
        reachable: False when it could not be reached (``error`` says why; the fields below are None).
        state: what it last announced ("never announced" when it never did).
        announced: the topic keys it announces, sorted.
        proxies: proxy subscriptions it holds.
        workers: worker heartbeats it has.
        channel_processes: channel processes with a recent heartbeat (``AGENT_SILENT_MS``).
        same_network: True when its network record is this one.
        error: why it could not be reached, or None.
    """

    qm: str
    url: str
    parent: str | None
    clusters: list[str]
    reachable: bool = False
    state: str | None = None
    announced: list[str] | None = None
    proxies: int | None = None
    workers: int | None = None
    channel_processes: int | None = None
    same_network: bool | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``broker status --network --json``: the reached fields, or ``error``."""
        row = asdict(self)
        drop = ("error",) if self.reachable else tuple(k for k in row if k not in _QM_UNREACHED)
        return {k: v for k, v in row.items() if k not in drop}


_QM_UNREACHED = ("qm", "url", "parent", "clusters", "reachable", "error")


@dataclass
class ChannelRow:
    """One channel (``sender`` -> ``to``) in ``network_status``; a field is None when the end that
    holds it could not be read.

    Attributes:
        sender: the sending queue manager (``"from"`` in JSON).
        to: the receiving queue manager.
        lag: entries written to the transmission stream and not yet filed by the receiver
            (messages), or None when either end cannot be read.
        state: the mover's state ("idle" when it never wrote one).
        moved: entries moved.
        in_flight: entries sent in a move that failed (messages).
        backoff_ms: the mover's backoff, ms.
        last_error: the mover's last error ("" when none).
        dead_lettered: unreadable entries the mover dead-lettered.
        withheld: the root topics a remote slow-subscriber condition withholds from this channel
            (its backlog reached ``max_messages``: ``broker.network.slow_routes``), sorted.
        error: why an end could not be reached, or None.
    """

    sender: str
    to: str
    lag: int | None = None
    state: str | None = None
    moved: int | None = None
    in_flight: int | None = None
    backoff_ms: int | None = None
    last_error: str | None = None
    dead_lettered: int | None = None
    withheld: list[str] | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``broker status --network --json``: ``"from"``, ``"to"``, ``"lag"``
        and the fields that could be read."""
        row = {k: v for k, v in asdict(self).items() if v is not None or k == "lag"}
        return {"from": row.pop("sender"), **row}


@dataclass
class NetworkStatus:
    """The network as seen from one queue manager (``network_status``).

    Attributes:
        network: the network record's digest, or None when the queue manager is in no network.
        queue_managers: one row per queue manager of the network.
        channels: one row per channel, by sender.
        proxies: the proxy subscriptions held at the queue manager.
        problems: its proxy subscription records that cannot be read, and what its running
            channel processes report.
    """

    network: str | None
    queue_managers: list[QueueManagerRow] = field(default_factory=list)
    channels: list[ChannelRow] = field(default_factory=list)
    proxies: list[ProxyRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of ``broker status --network --json`` (and the console's workers page)."""
        return {
            "network": self.network,
            "queue_managers": [q.as_dict() for q in self.queue_managers],
            "channels": [c.as_dict() for c in self.channels],
            "proxies": [asdict(p) for p in self.proxies],
            "problems": list(self.problems),
        }


@translate_errors
def network_status(client: redis.Redis, qm: str, url: str, tls: TLSOptions | None = None) -> NetworkStatus:
    """The network as seen from ``qm``: queue managers, channels and proxy subscriptions.

    Returns:
        A ``NetworkStatus`` (``network`` None when ``qm`` is in no network); a queue manager that
        cannot be reached is listed with ``reachable`` False and its error.
    """
    network = read_network(client, qm)
    if network is None:
        return NetworkStatus(None)
    topology = Topology(network)
    peers = Peers(url, client, tls)
    peers.network = network
    qms: list[QueueManagerRow] = []
    reach: dict[str, redis.Redis | None] = {}
    problems: list[str] = []
    for name, node in network.queue_managers.items():
        row = QueueManagerRow(name, redact_url(node.url or url), node.parent, list(node.clusters))
        try:
            peer = peers.client(name)
            announced = read_announced(peer, name) or {}
            pipe = peer.pipeline(transaction=False)
            pipe.hlen(keys.proxies(name))
            pipe.hlen(keys.workers(name))
            pipe.hgetall(keys.network_agents(name))
            pipe.get(keys.network(name))
            proxies, workers, agents, stored = pipe.execute()
            if name == qm:
                problems += _agent_problems(agents)
            row.state = announced.get("state", "never announced")
            row.announced = sorted(announced.get("keys", {}))
            row.proxies, row.workers = proxies, workers
            row.channel_processes = _live(agents)
            row.same_network = wire.exact_text(stored) == network.to_json()
            row.reachable = True
            reach[name] = peer
        except (*UNREACHABLE, ValueError) as exc:
            peers.drop(name)
            row.error = f"{type(exc).__name__}: {exc}"
            reach[name] = None
        qms.append(row)
    channels = [
        _channel_row(sender, to, reach.get(sender), reach.get(to))
        for sender, neighbours in sorted(topology.neighbours.items())
        for to in neighbours
    ]
    rows, _, bad_proxies = list_proxies(client, qm)
    return NetworkStatus(network.digest, qms, channels, rows, bad_proxies + problems)


#: A channel process whose heartbeat is older than this is not counted as running, ms.
AGENT_SILENT_MS = 10_000


def _live(agents: dict[Any, Any]) -> int:
    """How many channel process heartbeats are recent (each round writes one)."""
    now, live = clock.now_ms(), 0
    for raw in agents.values():
        try:
            live += now - int(json.loads(raw)["seen_ms"]) < AGENT_SILENT_MS
        except (ValueError, KeyError, TypeError):
            continue
    return live


def _agent_problems(agents: dict[Any, Any]) -> list[str]:
    """What the channel processes whose heartbeat is recent report (``problems`` of the heartbeat)."""
    now, found = clock.now_ms(), []
    for name, raw in agents.items():
        try:
            beat = json.loads(raw)
            if now - int(beat["seen_ms"]) < AGENT_SILENT_MS:
                found += [f"channel process {wire.exact_text(name)}: {p}" for p in beat.get("problems") or ()]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _channel_row(sender: str, to: str, source: redis.Redis | None, target: redis.Redis | None) -> ChannelRow:
    row = ChannelRow(sender, to)
    written = filed = None
    if source is not None:
        try:
            state = {
                wire.exact_text(k): wire.exact_text(v)
                for k, v in source.hgetall(keys.channel_state(sender, to)).items()
            }
            row.state = state.get("state", "idle")
            row.moved = int(state.get("moved", 0) or 0)
            row.in_flight = int(state.get("in_flight", 0) or 0)
            row.backoff_ms = int(state.get("backoff_ms", 0) or 0)
            row.last_error = state.get("last_error", "")
            row.dead_lettered = int(state.get("dead_lettered", 0) or 0)
            withheld = read_withheld({to: source.hget(keys.withheld(sender), to) or b"{}"})
            row.withheld = sorted(withheld.get(to, {}))
            try:
                info: dict[Any, Any] = source.xinfo_stream(keys.transmission(sender, to))
                written = int(info.get("entries-added", info.get(b"entries-added", 0)) or 0)
            except redis.ResponseError:
                written = 0  # no transmission stream yet
        except UNREACHABLE as exc:
            row.error = f"{sender}: {exc}"
    if target is not None:
        try:
            filed = int(target.hget(keys.received(to), f"{sender}:count") or 0)
        except UNREACHABLE as exc:
            row.error = f"{to}: {exc}"
    if written is not None:  # an unreadable entry the mover dead-lettered is never filed
        written -= row.dead_lettered or 0
    row.lag = None if written is None or filed is None else max(written - filed, 0)
    return row


def describe_network(network: Network) -> dict[str, Any]:
    """A summary of a network file for ``broker network apply --dry-run`` and ``show``."""
    topology = Topology(network)
    return {
        "digest": network.digest,
        "announce": network.announce,
        "queue_managers": {
            n: {"parent": q.parent, "clusters": list(q.clusters)} for n, q in network.queue_managers.items()
        },
        "clusters": {c: list(m) for c, m in topology.members.items()},
        "channels": {q: list(n) for q, n in topology.neighbours.items()},
        "static_subscriptions": [json.loads(s.model_dump_json()) for s in network.static_subscriptions],
        "announce_filters": [json.loads(f.model_dump_json()) for f in network.announce_filters],
    }
