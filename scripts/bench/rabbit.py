"""RabbitMQ as the broker's peer in ``python -m scripts.bench`` (``--only rabbit``): the same workload on a topic exchange.

The benchmark's topology (``workload.subscription_plan``: 1,450 subscriptions;
``workload.link_plan``: 1,100 links; every topic reaches F=10 subscriber queues)
is mapped to AMQP 0-9-1 (``map_topology``):

* publications go to one durable topic exchange (``EXCHANGE``) with the topic as the
  routing key, levels separated by ``.`` (``bench/3/4/5`` -> ``bench.3.4.5``);
* each subscription is a durable queue (named by its subscription id) bound to it with
  the equivalent pattern (``amqp_key``: MQTT ``+`` -> ``*``, ``#`` -> ``#``);
* each link target ``T`` is a durable fanout exchange ``link:<T>`` ("as if published on
  ``T``"): bound to the topic exchange with the routing key of every link source
  (publications on the source itself) and to ``link:<S>`` when the source ``S`` is a link
  target too (exchange-to-exchange bindings, so chains work as the broker's transitive
  links do); every queue whose filter matches ``T`` is bound to ``link:<T>``. RabbitMQ
  delivers a message at most once per queue however many paths reach it, as the broker
  does (the ``+/r/#`` subscriptions are reached three ways).

``route`` simulates that routing in Python and ``expected_depths`` counts what the
broker itself would deliver (``TopicIndex`` + ``LinkGraph.closure``, the routing table's
own parts): the unit tests check they agree on every topic, and a run checks every
queue's depth against ``expected_depths`` afterwards.

``RabbitNode`` starts a node of its own (Debian's ``rabbitmq-server``, no plugins) on
loopback with free ports, everything in a temporary directory, and an ``epmd`` of its
own on a free port; ``stop`` ends both and removes the directory. ``RabbitPeer`` starts
one that loads the topology while it boots (``definitions``) and measures a mode per
``run`` call, as often as the bench repeats (``run_rabbit`` does both modes once). Each
run has ``PUBLISHERS`` = 50 publishers, one pika channel each, spread over ``procs``
processes (one ``SelectConnection`` per process, the asynchronous API), and 200 B bodies:

* ``persistent``: delivery mode 2, publisher confirms with a window of ``window``
  unconfirmed messages per channel; the clock stops at the last confirm;
* ``transient``: delivery mode 1, no confirms; each channel ends with a synchronous
  ``basic.qos`` round trip (the channel has routed everything before it), the clock stops
  at the last of those; the queues' depths are then polled until they add up (reported as
  ``settle_s``, not on the clock).

Processes rather than threads: pika is pure Python and the GIL would make 50 threads share
one core. Two processes is the default; on this 2-vCPU box the publishers take under 10% of
a core in either mode while RabbitMQ's VM takes 120-145% with persistent messages, so the
count (1, 2 or 5 measured) changes nothing beyond the noise: the node is the bottleneck.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from broker.core.topic_rules import LinkGraph, TopicIndex
from scripts.bench.base import Ctx, Figures, Measurement, Row, fmt, median_run, server_cpu_us
from scripts.bench.cpu import CpuMeter
from scripts.bench.preload import publisher_ids
from scripts.bench.rabbit_node import RabbitNode, RabbitUnavailable, unavailable
from scripts.bench.workload import (
    BODY_BYTES,
    FANOUT,
    PUBLISHERS,
    TOPICS,
    BenchError,
    bodies,
    link_plan,
    subscription_plan,
)

#: The topic exchange publications are sent to.
EXCHANGE = "bench"
#: Prefix of the fanout exchange of each link target.
LINK_PREFIX = "link:"
#: Unconfirmed messages per channel in the persistent mode.
WINDOW = 100
#: Modes of ``run_rabbit``: (delivery mode, publisher confirms).
MODES = {"persistent": (2, True), "transient": (1, False)}


# --------------------------------------------------------------------------------------------
# The topology as AMQP: a topic exchange, durable queues, fanout exchanges for link targets
# --------------------------------------------------------------------------------------------


def amqp_key(topic: str) -> str:
    """An MQTT-style topic or filter as an AMQP topic routing/binding key.

    Levels are joined with ``.``; ``+`` becomes ``*`` (one word) and ``#`` stays ``#``
    (zero or more words, so ``a/#`` matches ``a`` in both). AMQP has no rule for topics
    starting with ``$`` (MQTT wildcards at the first level do not match them).

    Raises:
        ValueError: a level holds ``.`` or ``*`` (no AMQP equivalent), or ``#``/``+`` inside a level.
    """
    levels = topic.split("/")
    for level in levels:
        if "." in level or "*" in level or (level not in ("#", "+") and ("#" in level or "+" in level)):
            raise ValueError(f"topic level {level!r} of {topic!r} has no AMQP equivalent")
    return ".".join("*" if level == "+" else level for level in levels)


def amqp_match(pattern: str, key: str) -> bool:
    """Whether an AMQP topic binding key matches a routing key (``*`` one word, ``#`` zero or more)."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] == "*" or p[0] == k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


def sub_id(client_id: str, name: str) -> str:
    """The broker's subscription id of a durable subscription (``client$name``), the queue's name here."""
    return f"{client_id}${name}"


def link_exchange(target: str) -> str:
    """The fanout exchange of link target ``target``."""
    return LINK_PREFIX + amqp_key(target)


@dataclass(frozen=True)
class AmqpTopology:
    """The benchmark's topology as AMQP objects.

    Attributes:
        exchange: the topic exchange publications go to.
        queues: one durable queue per subscription, plan order.
        filters: queue -> its subscription's topic filter.
        link_exchanges: one durable fanout exchange per link target.
        queue_bindings: ``(queue, exchange, binding key)``; the key is ``""`` on fanout exchanges.
        exchange_bindings: ``(destination exchange, source exchange, binding key)``.
    """

    exchange: str
    queues: tuple[str, ...]
    filters: dict[str, str]
    link_exchanges: tuple[str, ...]
    queue_bindings: tuple[tuple[str, str, str], ...]
    exchange_bindings: tuple[tuple[str, str, str], ...]


def map_topology(
    plan: Sequence[tuple[str, str, str]] | None = None,
    links: Sequence[tuple[str, str]] | None = None,
    exchange: str = EXCHANGE,
) -> AmqpTopology:
    """Map subscriptions ``(filter, client id, durable name)`` and links ``(source, target)`` to AMQP.

    Defaults: ``workload.subscription_plan()`` and ``workload.link_plan()``.
    See the module docstring for the mapping.

    Raises:
        ValueError: a filter or topic has no AMQP equivalent (``amqp_key``).
    """
    plan = subscription_plan() if plan is None else plan
    links = link_plan() if links is None else links
    filters = {sub_id(client_id, name): topic_filter for topic_filter, client_id, name in plan}
    queue_bindings = [(queue, exchange, amqp_key(f)) for queue, f in filters.items()]
    index = _index(filters)
    targets = sorted({target for _, target in links})
    for target in targets:
        queue_bindings += [(queue, link_exchange(target), "") for queue in sorted(index.match(target))]
    exchange_bindings = []
    for source, target in links:
        exchange_bindings.append((link_exchange(target), exchange, amqp_key(source)))
        if source in targets:
            exchange_bindings.append((link_exchange(target), link_exchange(source), ""))
    return AmqpTopology(
        exchange=exchange,
        queues=tuple(filters),
        filters=filters,
        link_exchanges=tuple(link_exchange(t) for t in targets),
        queue_bindings=tuple(queue_bindings),
        exchange_bindings=tuple(exchange_bindings),
    )


def _index(filters: dict[str, str]) -> TopicIndex:
    index = TopicIndex()
    for queue, topic_filter in filters.items():
        index.add(topic_filter, queue)
    return index


def route(topo: AmqpTopology, routing_key: str) -> set[str]:
    """The queues RabbitMQ delivers a message published to ``topo.exchange`` with ``routing_key`` to
    (each once, whatever the number of paths; exchanges visited once), simulated."""
    by_exchange: dict[str, list[tuple[str, str, bool]]] = {}  # source -> (destination, key, is queue)
    for queue, source, key in topo.queue_bindings:
        by_exchange.setdefault(source, []).append((queue, key, True))
    for destination, source, key in topo.exchange_bindings:
        by_exchange.setdefault(source, []).append((destination, key, False))
    queues: set[str] = set()
    seen = {topo.exchange}
    todo = [topo.exchange]
    while todo:
        source = todo.pop()
        fanout = source != topo.exchange
        for destination, key, is_queue in by_exchange.get(source, ()):
            if not fanout and not amqp_match(key, routing_key):
                continue
            if is_queue:
                queues.add(destination)
            elif destination not in seen:
                seen.add(destination)
                todo.append(destination)
    return queues


def expected_depths(
    topics: Counter[str],
    plan: Sequence[tuple[str, str, str]] | None = None,
    links: Sequence[tuple[str, str]] | None = None,
) -> dict[str, int]:
    """Queue -> messages the broker would deliver to it for ``topics`` (topic -> publications):
    the subscriptions matching any topic of ``LinkGraph.closure(topic)``, each once."""
    plan = subscription_plan() if plan is None else plan
    links = link_plan() if links is None else links
    index = _index({sub_id(c, n): f for f, c, n in plan})
    graph = LinkGraph()
    for source, target in links:
        graph.add(source, target, backward=True)  # only lets a link close a loop; closure is the same
    depths = dict.fromkeys((sub_id(c, n) for _, c, n in plan), 0)
    for topic, count in topics.items():
        reached: set[str] = set()
        for linked in graph.closure(topic):
            reached |= index.match(linked)
        for queue in reached:
            depths[queue] += count
    return depths


def schedule(n: int, seed: int = 11) -> dict[str, list[str]]:
    """Publisher id -> the topics of its publications, in order: publication ``i`` is publisher
    ``i % 50``'s, on a topic drawn uniformly from ``TOPICS`` (as the broker rows' preload)."""
    rng = random.Random(seed)
    ids = publisher_ids()
    out: dict[str, list[str]] = {p: [] for p in ids}
    for i in range(n):
        out[ids[i % PUBLISHERS]].append(rng.choice(TOPICS))
    return out


# --------------------------------------------------------------------------------------------
# Declaring, checking and purging the topology
# --------------------------------------------------------------------------------------------


def definitions(topo: AmqpTopology, vhost: str = "/") -> dict[str, Any]:
    """``topo`` as a RabbitMQ definitions document (``load_definitions``: declared while the node boots,
    much faster than one round trip per object), with the ``guest`` user the node would make."""
    salt = os.urandom(4)
    guest = base64.b64encode(salt + hashlib.sha256(salt + b"guest").digest()).decode()

    def binding(source: str, destination: str, kind: str, key: str) -> dict[str, Any]:
        return {
            "source": source,
            "vhost": vhost,
            "destination": destination,
            "destination_type": kind,
            "routing_key": key,
            "arguments": {},
        }

    def exchange(name: str, kind: str) -> dict[str, Any]:
        return {
            "name": name,
            "vhost": vhost,
            "type": kind,
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": {},
        }

    return {
        "users": [
            {
                "name": "guest",
                "password_hash": guest,
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"],
            }
        ],
        "vhosts": [{"name": vhost}],
        "permissions": [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "exchanges": [exchange(topo.exchange, "topic")]
        + [exchange(x, "fanout") for x in topo.link_exchanges],
        "queues": [
            {"name": q, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}
            for q in topo.queues
        ],
        "bindings": [binding(s, d, "exchange", k) for d, s, k in topo.exchange_bindings]
        + [binding(s, q, "queue", k) for q, s, k in topo.queue_bindings],
    }


def depths(channel: Any, queues: Iterable[str]) -> dict[str, int]:
    """Queue -> messages ready (a passive ``queue.declare`` each)."""
    return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}


def purge(channel: Any, queues: Iterable[str]) -> None:
    """Purge every queue."""
    for queue in queues:
        channel.queue_purge(queue)


# --------------------------------------------------------------------------------------------
# Publisher processes
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------------


def run_mode(
    node: RabbitNode,
    channel: Any,
    topo: AmqpTopology,
    n: int,
    mode: str,
    procs: int = 2,
    window: int = WINDOW,
    settle_s: float = 60.0,
) -> dict[str, Any]:
    """Publish ``n`` publications (``schedule``) in ``mode`` (``MODES``) and check every queue's depth.

    The queues must be empty before; they are purged after (untimed).

    Returns:
        Figures: pubs/s, deliveries/s, elapsed, settle time, CPU (``rabbitmq``: the node's beam,
        ``publishers``, ``bench``, ``foreign``; % of one core), the node's and the publishers'
        CPU-us per publication, queues checked.

    Raises:
        BenchError: a publisher failed or was nacked, or a queue's depth is not what the broker
            would have delivered (``expected_depths``).
    """
    work = schedule(n)
    expected = expected_depths(Counter(t for topics in work.values() for t in topics))
    total = sum(expected.values())
    if total != n * FANOUT:
        raise BenchError(f"RabbitMQ: the topology delivers {total} for {n} publications, not {n * FANOUT}")
    body = bodies(1, BODY_BYTES)[0]
    timeout_s = max(120.0, n / 100)
    from scripts.bench.rabbit_publishers import _gather, _publishers  # they import this module

    with _publishers(node, work, procs, mode, window, body, timeout_s) as (processes, pipes, go):
        meter = CpuMeter(
            {"rabbitmq": node.beam_pids(), "publishers": [p.pid for p in processes], "bench": [os.getpid()]}
        )
        t0 = time.perf_counter()
        go.set()
        results = _gather(pipes, processes, "done", timeout_s)
        cpu = meter.stop()
    for got in results:
        if got[0] != "done":
            raise BenchError(f"RabbitMQ {mode}: {got[1]}")
    t_end = max(got[2] for got in results)
    published = sum(got[3] for got in results)
    nacked = sum(got[4] for got in results)
    elapsed = t_end - t0
    if published != n or nacked:
        raise BenchError(f"RabbitMQ {mode}: published {published} of {n}, {nacked} nacked")
    deadline = time.monotonic() + settle_s
    while True:
        found = depths(channel, topo.queues)
        if sum(found.values()) >= total or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    settled = time.perf_counter() - t_end
    wrong = {q: (found[q], want) for q, want in expected.items() if found[q] != want}
    purge(channel, topo.queues)
    if wrong:
        sample = dict(list(wrong.items())[:5])
        raise BenchError(
            f"RabbitMQ {mode}: {len(wrong)} queues do not hold what the broker would deliver "
            f"(found, expected): {sample}; {sum(found.values())} of {total} messages"
        )
    return {
        "mode": mode,
        "n": n,
        "procs": procs,
        "window": window if MODES[mode][1] else None,
        "elapsed_s": round(elapsed, 3),
        "pubs_per_s": round(n / elapsed),
        "deliveries_per_s": round(total / elapsed),
        "deliveries": total,
        "fanout_measured": round(total / n, 3),
        "queues_checked": len(found),
        "settle_s": round(settled, 3),
        "cpu": cpu,
        # CPU time per publication: steadier than the rate on a shared box
        "rabbitmq_cpu_us_per_pub": round(cpu.get("rabbitmq", 0.0) / 100 * elapsed * 1e6 / n, 1),
        "publishers_cpu_us_per_pub": round(cpu.get("publishers", 0.0) / 100 * elapsed * 1e6 / n, 1),
    }


class RabbitPeer:
    """A node with the benchmark's topology (loaded while it boots, ``definitions``) and a pika channel
    to check and purge its queues: ``run`` measures one mode, as often as wanted (side by side with
    the broker's runs).

    Args:
        procs: publisher processes for the 50 channels.
        window: unconfirmed messages per channel in the persistent mode.

    Attributes:
        topo: the topology as AMQP.
        info: ``{"version", "node_start_s", "topology": counts}`` once started.
    """

    def __init__(self, procs: int = 2, window: int = WINDOW) -> None:
        self.procs = procs
        self.window = window
        self.topo = map_topology()
        self.node: RabbitNode | None = None
        self.connection: Any = None
        self.channel: Any = None
        self.info: dict[str, Any] = {
            "topology": {
                "queues": len(self.topo.queues),
                "link_exchanges": len(self.topo.link_exchanges),
                "queue_bindings": len(self.topo.queue_bindings),
                "exchange_bindings": len(self.topo.exchange_bindings),
            }
        }

    def start(self) -> RabbitPeer:
        """Start the node; every queue must exist and be empty.

        Raises:
            RabbitUnavailable: rabbitmq-server, epmd or pika is missing.
            BenchError: the node did not start, or its queues are not the topology's (it is stopped).
        """
        why = unavailable()
        if why:
            raise RabbitUnavailable(why)
        import pika

        self.node = RabbitNode(definitions=definitions(self.topo))
        try:
            self.node.start()
            self.info["version"] = self.node.version()
            self.info["node_start_s"] = round(self.node.start_s, 1)
            self.connection = pika.BlockingConnection(self.node.parameters())
            self.channel = self.connection.channel()
            empty = depths(self.channel, self.topo.queues)
            if len(empty) != len(self.topo.queues) or any(empty.values()):
                raise BenchError(
                    f"RabbitMQ: {len(empty)} queues declared, not {len(self.topo.queues)}, or not empty"
                )
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, mode: str, n: int) -> dict[str, Any]:
        """``run_mode`` on this node."""
        assert self.node is not None, "start the peer first"
        return run_mode(self.node, self.channel, self.topo, n, mode, self.procs, self.window)

    def stop(self) -> None:
        """Close the channel's connection and stop the node (``RabbitNode.stop``). Safe to call twice."""
        if self.connection is not None:
            with contextlib.suppress(Exception):
                self.connection.close()
            self.connection = None
        if self.node is not None:
            self.node.stop()
            self.node = None


def run_rabbit(
    n: int, procs: int = 2, window: int = WINDOW, modes: Sequence[str] = ("persistent", "transient")
) -> dict[str, Any]:
    """Start a ``RabbitPeer``, measure each of ``modes`` once, stop it.

    Returns:
        ``RabbitPeer.info`` with ``<mode>: run_mode figures``.

    Raises:
        RabbitUnavailable: rabbitmq-server, epmd or pika is missing.
        BenchError: the node did not start, or a mode failed (``run_mode``).
    """
    peer = RabbitPeer(procs, window).start()
    try:
        return peer.info | {mode: peer.run(mode, n) for mode in modes}
    finally:
        peer.stop()


# --------------------------------------------------------------------------------------------
# Row 17 in the bench's registry
# --------------------------------------------------------------------------------------------


def _setup(ctx: Ctx) -> None:
    why = unavailable()
    if why:
        ctx.figures["rabbit"] = {"skipped": why}
        ctx.log(f"[yellow]17. RabbitMQ skipped: {why}[/yellow]")
        return
    ctx.log("17. RabbitMQ: a node of its own loading the topology as a topic exchange ...")
    peer = RabbitPeer(ctx.args.rabbit_procs, ctx.args.rabbit_window)
    ctx.closers.append(peer.stop)
    if ctx.attempt("rabbit", peer.start) is None:
        return
    ctx.state["rabbit"] = peer
    ctx.figures["rabbit"] = dict(peer.info)
    ctx.log(
        f"   RabbitMQ {peer.info['version']} up in {peer.info['node_start_s']} s "
        f"({len(peer.topo.queues):,} queues, "
        f"{len(peer.topo.queue_bindings) + len(peer.topo.exchange_bindings):,} bindings)"
    )


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    peer = ctx.state.get("rabbit")
    if peer is None:
        return
    a = ctx.args
    for mode in MODES:
        ctx.idle(f"rabbit {mode}")
        ctx.log(f"17. RabbitMQ {mode}, 50 channels in {a.rabbit_procs} processes, N={a.rabbit_n:,}{tag}")
        ctx.keep(f"rabbit_{mode}", ctx.attempt(f"rabbit_{mode}", peer.run, mode, a.rabbit_n))


def _finish(ctx: Ctx) -> None:
    peer = ctx.state.get("rabbit")
    if peer is None:
        return
    peer.stop()
    runs = ctx.runs
    for mode in MODES:
        if runs[f"rabbit_{mode}"]:
            ctx.figures["rabbit"][mode] = median_run(runs[f"rabbit_{mode}"], "pubs_per_s")
    ctx.figures["rabbit_ratios"] = [
        round(a["pubs_per_s"] / b["pubs_per_s"], 3)
        for a, b in zip(runs["broker_2w"], runs["rabbit_persistent"], strict=False)
    ]


def _mode_row(f: Figures, mode: str, what: str) -> Row:
    rabbit = f["rabbit"]
    r = rabbit[mode]
    broker = f.get("broker_2w", {}).get("pubs_per_s")
    aof = f.get("aof_2w", {}).get("pubs_per_s")
    vs = []
    if broker:
        repeats = f.get("rabbit_ratios") if mode == "persistent" else None
        vs.append(
            f"broker 2 workers / this {broker / r['pubs_per_s']:.2f}"
            + (f" (per repeat {', '.join(map(str, repeats))})" if repeats else "")
        )
    if aof:
        vs.append(f"broker with AOF everysec / this {aof / r['pubs_per_s']:.2f}")
    server_us = f"RabbitMQ {r['rabbitmq_cpu_us_per_pub']:,.0f} CPU-us/pub"
    b2 = f.get("broker_2w")
    if b2:
        server_us += f" (the broker's Redis + workers {server_cpu_us(b2):,.0f})"
    topo = rabbit.get("topology", {})
    return Row(
        f"17. RabbitMQ {mode}",
        fmt(r["pubs_per_s"]),
        fmt(r["deliveries_per_s"]),
        f"RabbitMQ {rabbit.get('version')} (a node of its own), topic exchange: {topo.get('queues')} "
        f"durable classic queues, {topo.get('link_exchanges')} link fanout exchanges, "
        f"{topo.get('queue_bindings')} + {topo.get('exchange_bindings')} e2e bindings; "
        + what.format(window=r["window"])
        + f"; 50 pika channels in {r['procs']} processes; N={r['n']:,}; F={r['fanout_measured']} "
        f"(all {r['queues_checked']:,} queue depths checked, {r['settle_s']} s after the clock)"
        + (f"; {', '.join(vs)}" if vs else "")
        + f"; {server_us}, publishers {r['publishers_cpu_us_per_pub']:,.0f}"
        + "; server column = RabbitMQ's beam",
        f"{r['cpu'].get('rabbitmq', 0):.0f} / {r['cpu'].get('publishers', 0) + r['cpu'].get('bench', 0):.0f}"
        f" / {r['cpu'].get('foreign', 0):.0f}",
    )


def _rows(f: Figures) -> list[Row]:
    rabbit = f.get("rabbit") or {}
    rows = []
    if "skipped" in rabbit:
        rows.append(Row("17. RabbitMQ", "-", "-", f"skipped: {rabbit['skipped']}"))
    for mode, what in (
        ("persistent", "persistent (delivery mode 2), publisher confirms, window {window}/channel"),
        ("transient", "transient (delivery mode 1), no confirms"),
    ):
        if rabbit.get(mode):
            rows.append(_mode_row(f, mode, what))
    return rows


MEASUREMENT = Measurement(
    "rabbit",
    runs=("rabbit_persistent", "rabbit_transient"),
    medians=False,
    setup=_setup,
    repeat=_repeat,
    finish=_finish,
    rows=_rows,
)
