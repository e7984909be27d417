"""The measurements behind ``scripts/bench.py``: topology, CPU accounting and the six runs.

Every function here takes an explicit client, settings or URL (nothing global)
and returns plain dicts of figures that ``bench.py`` prints and writes as JSON.
See the docstring of ``scripts/bench.py`` for what each measurement means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
import redis

from broker import keys
from broker.config import Settings
from broker.errors import LinkCycle
from broker.hierarchy import HierarchyIndex
from broker.links import link
from broker.models import Message, encode_envelope, parse_entry, publication_fields
from broker.publish import Publisher
from broker.routing import RoutingTable, explain
from broker.selectors import compile_selector
from broker.stream import group_state
from broker.subscriptions import subscribe
from broker.topic_objects import Attributes, TopicObject
from broker.topic_objects import define as define_topic
from broker.topics import LinkGraph, TopicIndex

#: Fan-out of every publication: subscriber queues it reaches.
FANOUT = 10
#: Publishers of the throughput runs (ids ``p00``..``p49``).
PUBLISHERS = 50
#: Body size of every publication, bytes (as in perf-anchors).
BODY_BYTES = 200
#: How often the drain is sampled, s.
POLL_S = 0.02
#: A run with no progress for this long is abandoned, s.
STALL_S = 60.0


class BenchError(RuntimeError):
    """A measurement could not be completed (stalled, lost deliveries, a dead process)."""


def code_state(repo: os.PathLike[str] | str) -> dict[str, Any]:
    """The commit measured and whether broker/ or worker/ had uncommitted changes (others edit concurrently)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
            ).stdout.rstrip("\n")
        except (OSError, subprocess.TimeoutExpired):
            return ""

    head = git("rev-parse", "--short", "HEAD").strip()
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "broker", "worker").splitlines()]
    diff = git("diff", "HEAD", "--", "broker", "worker")
    digest = hashlib.sha1(diff.encode()).hexdigest()[:8] if diff else ""
    describe = head + (f"+dirty({len(dirty)} files, diff {digest})" if dirty else "")
    return {"head": head, "dirty": dirty, "diff_sha1": digest, "describe": describe or "?"}


def bodies(count: int = 16, size: int = BODY_BYTES, seed: int = 7) -> list[bytes]:
    """``count`` different printable bodies of ``size`` bytes."""
    rng = random.Random(seed)
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 "
    return [bytes(rng.choice(alphabet) for _ in range(size)) for _ in range(count)]


# --------------------------------------------------------------------------------------------
# Topology: 1,000 topics, 1,450 subscriptions, 1,100 links; every topic reaches exactly 10 queues
# --------------------------------------------------------------------------------------------

TOPICS: list[str] = [f"bench/{r}/{c}/{j}" for r in range(10) for c in range(10) for j in range(10)]


def subscription_plan() -> list[tuple[str, str, str]]:
    """The subscriptions, as ``(filter, client id, durable name)``.

    A topic ``bench/r/c/j`` is matched by exactly one subscription of each
    kind below, so every publication goes to exactly ``FANOUT`` = 10 queues:

    ========================  ====  =====================================================
    filter                    subs  how it reaches ``bench/r/c/j``
    ========================  ====  =====================================================
    ``bench/r/c/j``           1000  exact
    ``bench/r/#``               10  ``#``
    ``bench/r/+/+``             10  ``+`` ``+``
    ``bench/+/+/j``             10  ``+`` ``+``
    ``bench/+/c/j``            100  ``+``
    ``bench/r/+/j``            100  ``+``
    ``bench/r/c/+``            100  ``+``
    ``+/r/#``                   10  ``+`` and ``#``; matches the topic *and* both linked
                                    topics below: three paths, delivered once (dedup)
    ``audit/r/c``              100  exact, only through the link ``bench/r/c/j -> audit/r/c``
    ``audit/r``                 10  exact, only through two links (``audit/r/c -> audit/r``)
    ========================  ====  =====================================================
    """
    rng10 = range(10)
    plan: list[tuple[str, str, str]] = []
    plan += [(f"bench/{r}/#", "hash", f"r{r}") for r in rng10]
    plan += [(f"bench/{r}/+/+", "plus2r", f"r{r}") for r in rng10]
    plan += [(f"bench/+/+/{j}", "plus2j", f"j{j}") for j in rng10]
    plan += [(f"bench/+/{c}/{j}", "plusr", f"c{c}j{j}") for c in rng10 for j in rng10]
    plan += [(f"bench/{r}/+/{j}", "plusc", f"r{r}j{j}") for r in rng10 for j in rng10]
    plan += [(f"bench/{r}/{c}/+", "plusj", f"r{r}c{c}") for r in rng10 for c in rng10]
    plan += [(f"+/{r}/#", "dedup", f"r{r}") for r in rng10]
    plan += [(f"audit/{r}/{c}", "link1", f"r{r}c{c}") for r in rng10 for c in rng10]
    plan += [(f"audit/{r}", "link2", f"r{r}") for r in rng10]
    plan += [(t, "exact", t.replace("/", "_")) for t in TOPICS]
    return plan


def link_plan() -> list[tuple[str, str]]:
    """The links: ``audit/r/c -> audit/r`` (100), then ``bench/r/c/j -> audit/r/c`` (1,000)."""
    plan = [(f"audit/{r}/{c}", f"audit/{r}") for r in range(10) for c in range(10)]
    plan += [(t, "audit/" + "/".join(t.split("/")[1:3])) for t in TOPICS]
    return plan


#: The same 1,000 topics as dot topics, for the swiftmq scheme.
SWIFT_TOPICS: list[str] = [t.replace("/", ".") for t in TOPICS]


def swiftmq_subscription_plan() -> list[tuple[str, str, str]]:
    """``subscription_plan`` in the swiftmq scheme: every ``bench.r.c.j`` reaches exactly 10 subscriptions.

    ``+`` levels become ``%`` predicates (320 of the 1,540 subscriptions, 21%); ``bench/r/#``
    becomes ``bench.r`` (a node receives its sub-nodes); ``+/r/#`` has no swiftmq form (the
    root cannot be a predicate) and becomes ``bench.r.c`` (100, plain). The links are
    ``bench.r.c.j -> audit.r.c`` only: ``audit.r`` receives what is delivered on its sub-node
    ``audit.r.c``, and a link ``audit.r.c -> audit.r`` would deliver on ``audit.r`` and so reach
    all ten ``audit.r.*`` (publishing on a node reaches its sub-nodes).
    """
    plan: list[tuple[str, str, str]] = []
    for topic_filter, client_id, name in subscription_plan():
        if topic_filter.startswith("+/"):
            continue  # replaced by the bench.r.c nodes below
        if topic_filter.endswith("/#"):
            topic_filter = topic_filter[:-2]
        plan.append((topic_filter.replace("/", ".").replace("+", "%"), client_id, name))
    plan += [(f"bench.{r}.{c}", "node", f"r{r}c{c}") for r in range(10) for c in range(10)]
    return plan


#: The selector of the selector variant of the topology (measurement 7): ~49% of the publications
#: (``selector_props``) have region 'eu' (70%) and an amount of 30 or more (70%).
SELECTOR = "region = 'eu' AND amount >= 30"
#: Every how many subscriptions of ``subscription_plan`` one carries ``SELECTOR`` (20%).
SELECTOR_EVERY = 5


def plan_selectors(count: int, selector: str | None, every: int = SELECTOR_EVERY) -> list[str | None]:
    """The selector of each of ``count`` planned subscriptions: ``selector`` for every ``every``-th
    (indexes ``every - 1``, ``2 * every - 1``, ...), None for the others (and for all when ``selector`` is None)."""
    return [selector if selector and i % every == every - 1 else None for i in range(count)]


def selector_props(rng: random.Random) -> dict[str, str | int]:
    """The user properties of one publication of the selector runs: ``region`` and ``amount``."""
    return {
        "region": "eu" if rng.random() < 0.7 else ("us" if rng.random() < 0.5 else "apac"),
        "amount": rng.randrange(100),
    }


#: How many administrative topic objects the topic-object variant defines (measurement 9).
TOPIC_OBJECTS = 200
#: maxdepth of some of them: far above anything a run puts in one queue (never reached).
HUGE_DEPTH = 10**9


def topic_object_plan(count: int = TOPIC_OBJECTS, seed: int = 13) -> list[TopicObject]:
    """``count`` topic objects over the benchmark's topic space, none of which changes a delivery.

    Topic strings are prefixes of ``TOPICS`` (and the link targets ``audit/r``), all in
    regions 0-8, so that 90% of the topics (and of the uniformly drawn publications) fall
    under an object and region 9 resolves up to ``SYSTEM.BASE.TOPIC``: ``bench/r`` (9),
    ``audit/r`` (9), ``bench/r/c`` (90) and then leaf topics ``bench/r/c/j`` drawn with
    ``seed`` (the rest). Attributes repeat the base's behaviour (``pubscope=ALL``,
    ``defprty=ASPARENT``, ``usedlq=YES``, ``pub=ENABLED``, ``capexpry=NOLIMIT``) and every
    fifth object has ``maxdepth=HUGE_DEPTH``: nothing is refused, re-prioritised or
    bounded, so the deliveries are those of the run without objects.
    """
    regions = range(9)
    strings = [f"bench/{r}" for r in regions] + [f"audit/{r}" for r in regions]
    strings += [f"bench/{r}/{c}" for r in regions for c in range(10)]
    leaves = [t for t in TOPICS if int(t.split("/")[1]) in regions]
    strings += sorted(random.Random(seed).sample(leaves, count - len(strings)))
    variants = (
        Attributes(pubscope="ALL", defprty="ASPARENT"),
        Attributes(pubscope="ALL", defprty="ASPARENT", usedlq="YES"),
        Attributes(pub="ENABLED", capexpry="NOLIMIT"),
        Attributes(pubscope="ALL", usedlq="YES"),
        Attributes(defprty="ASPARENT", maxdepth=HUGE_DEPTH),
    )
    return [
        TopicObject(
            name="BENCH." + s.replace("/", "."),
            topic_string=s,
            attributes=variants[i % len(variants)],
            description="bench: no effect on deliveries",
        )
        for i, s in enumerate(strings)
    ]


def topic_object_coverage(objects: Sequence[TopicObject]) -> float:
    """Share of ``TOPICS`` at or below the topic string of some object (the rest inherit from the base)."""
    bound = {o.topic_string for o in objects}
    covered = sum(1 for t in TOPICS if any("/".join(t.split("/")[:k]) in bound for k in range(1, 5)))
    return covered / len(TOPICS)


def define_topic_objects(client: redis.Redis, qm: str, objects: Sequence[TopicObject]) -> float:
    """Define ``objects`` (``broker.topic_objects.define``, one version bump each) on a queue manager
    that must have none; returns the seconds taken.

    Raises:
        BenchError: ``{qm}:topics`` was not empty, or does not hold exactly ``objects`` afterwards.
    """
    key = keys.topic_objects(qm)
    if client.exists(key):
        raise BenchError(f"{key} holds {client.hlen(key)} topic objects before defining the bench's")
    start = time.perf_counter()
    for obj in objects:
        define_topic(client, qm, obj.name, obj.topic_string, obj.attributes, obj.description)
    taken = time.perf_counter() - start
    if client.hlen(key) != len(objects):
        raise BenchError(f"{key} holds {client.hlen(key)} topic objects, not {len(objects)}")
    return taken


def clear_topic_objects(client: redis.Redis, qm: str) -> None:
    """Remove every topic object (DEL ``{qm}:topics``) and bump ``{qm}:version`` so workers reload."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.topic_objects(qm))
    pipe.incr(keys.version(qm))
    pipe.execute()


#: The queue the latency consumer pops: ``bench/0/#`` receives every topic of region 0.
LATENCY_SUB = "hash$r0"
LATENCY_TOPICS = [t for t in TOPICS if t.startswith("bench/0/")]


@dataclass
class Topology:
    """The subscriptions and links, made once with the broker's admin API, and a DUMP to restore them.

    Attributes:
        qm: the queue manager.
        sub_ids: every subscription id.
        queues: every subscriber queue key.
        snapshot: key -> DUMP payload of the subscription, link and version keys.
        setup_s: how long subscribe + link took, s.
        checked: topic -> number of subscriptions ``admin.explain`` resolved it to.
        selective: the subscriptions made with a selector (``build(selector=...)``).
    """

    qm: str
    sub_ids: list[str] = field(default_factory=list)
    selective: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    snapshot: dict[str, bytes] = field(default_factory=dict)
    setup_s: float = 0.0
    checked: dict[str, int] = field(default_factory=dict)
    via: dict[str, list[str]] = field(default_factory=dict)
    scheme: str = "mqtt"
    topics: list[str] = field(default_factory=lambda: TOPICS)

    @classmethod
    def build(
        cls, client: redis.Redis, qm: str, sample: int = 8, selector: str | None = None, scheme: str = "mqtt"
    ) -> Topology:
        """Subscribe, link, check F with ``explain`` on ``sample`` topics, and DUMP the result.

        With ``selector``, every ``SELECTOR_EVERY``-th subscription of ``subscription_plan``
        carries it (``plan_selectors``); F is then the fan-out before selectors.

        Raises:
            BenchError: a sampled topic does not resolve to exactly ``FANOUT`` subscriptions.
        """
        swift = scheme == "swiftmq"
        topo = cls(qm, scheme=scheme, topics=SWIFT_TOPICS if swift else TOPICS)
        client.flushdb()
        start = time.perf_counter()
        plan = swiftmq_subscription_plan() if swift else subscription_plan()
        for (topic_filter, client_id, name), chosen in zip(
            plan, plan_selectors(len(plan), selector), strict=True
        ):
            record = subscribe(
                client,
                qm,
                topic_filter,
                client_id=client_id,
                durable_name=name,
                selector=chosen,
                scheme=scheme,
            )
            topo.sub_ids.append(record.sub_id)
            if chosen:
                topo.selective.append(record.sub_id)
        for source, target in link_plan():
            if swift:
                if source.startswith("audit/"):
                    continue  # audit.r receives audit.r.c's publications as its sub-node's already
                source, target = source.replace("/", "."), target.replace("/", ".")
            link(client, qm, source, target)
        topo.setup_s = time.perf_counter() - start
        topo.queues = [keys.sub_queue(qm, s) for s in topo.sub_ids]
        rng = random.Random(3)
        for topic in rng.sample(topo.topics, sample):
            route = explain(client, qm, topic)
            topo.checked[topic] = len(route.subscriptions)
            topo.via.setdefault("example", [f"{t}: {len(s)}" for t, s in route.via.items()])
            if len(route.subscriptions) != FANOUT:
                raise BenchError(
                    f"{topic} resolves to {len(route.subscriptions)} subscriptions, not {FANOUT}"
                )
        for key in (keys.subscriptions(qm), keys.links(qm), keys.version(qm), keys.manager(qm)):
            payload = client.dump(key)
            if payload is not None:
                topo.snapshot[key] = payload
        return topo

    def for_qm(self, qm: str) -> Topology:
        """The same topology for queue manager ``qm`` (its records do not name their queue manager)."""
        snapshot = {
            name(qm): self.snapshot[name(self.qm)]
            for name in (keys.subscriptions, keys.links, keys.version, keys.manager)
            if name(self.qm) in self.snapshot
        }
        queues = [keys.sub_queue(qm, s) for s in self.sub_ids]
        return dataclasses.replace(self, qm=qm, snapshot=snapshot, queues=queues)

    def restore(self, client: redis.Redis) -> None:
        """FLUSHDB, then RESTORE the subscriptions, links and version."""
        client.flushdb()
        pipe = client.pipeline(transaction=False)
        for key, payload in self.snapshot.items():
            pipe.restore(key, 0, payload)
        pipe.execute()

    def routes(self, client: redis.Redis) -> dict[str, tuple[str, ...]]:
        """topic -> queue keys, resolved by the broker's own ``RoutingTable``."""
        table = RoutingTable(self.qm)
        table.load(client)
        return {t: table.resolve(t).queues() for t in self.topics}


# --------------------------------------------------------------------------------------------
# CPU accounting from /proc (Linux)
# --------------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)
    except (OSError, IndexError, ValueError):
        return 0


def _box_ticks() -> tuple[int, int]:
    with open("/proc/stat", "rb") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values[:8]) - idle, sum(values[:8])


class CpuMeter:
    """CPU of named processes and of the whole box over a span, as % of one core.

    Args:
        pids: name -> list of pids ("redis", "workers", "bench", ...).
    """

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._start = self._read()

    def _read(self) -> tuple[float, dict[str, int], tuple[int, int]]:
        return (
            time.perf_counter(),
            {name: sum(_proc_ticks(p) for p in pids) for name, pids in self.pids.items()},
            _box_ticks(),
        )

    def stop(self) -> dict[str, float]:
        """CPU since creation: each name, ``box`` (all processes) and ``foreign`` (box minus ours), % of one core."""
        t1, procs1, (busy1, total1) = self._read()
        t0, procs0, (busy0, total0) = self._start
        span = max(t1 - t0, 1e-9)
        out = {name: round(100 * (procs1[name] - procs0[name]) / _TICK / span, 1) for name in procs1}
        ncpu = os.cpu_count() or 1
        box = 100 * ncpu * (busy1 - busy0) / max(total1 - total0, 1)
        out["box"] = round(box, 1)
        out["foreign"] = round(max(0.0, box - sum(v for k, v in out.items() if k != "box")), 1)
        return out


def redis_pid(client: redis.Redis) -> int:
    """The server's pid (INFO server ``process_id``)."""
    return int(client.info("server")["process_id"])


def commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """INFO commandstats as ``{command: {"calls", "usec"}}``."""
    stats = {}
    for name, data in client.info("commandstats").items():
        stats[name.removeprefix("cmdstat_")] = {"calls": int(data["calls"]), "usec": float(data["usec"])}
    return stats


# --------------------------------------------------------------------------------------------
# 1. The ceiling: hand-packed MULTI fan-out with a bare hiredis reader
# --------------------------------------------------------------------------------------------


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _preload_raw(client: redis.Redis, stream: str, n: int, body_list: list[bytes]) -> None:
    """XADD ``n`` publication-shaped entries (publisher, seq, topic, ts, msgid, body) with redis-py."""
    rng = random.Random(11)
    pipe = client.pipeline(transaction=False)
    seqs = [0] * PUBLISHERS
    now_ms = int(time.time() * 1000)
    for i in range(n):
        p = i % PUBLISHERS
        seqs[p] += 1
        pipe.xadd(
            stream,
            {
                "publisher": f"p{p:02d}",
                "seq": seqs[p],
                "topic": rng.choice(TOPICS),
                "ts": now_ms,
                "msgid": f"m{i}",
                "body": body_list[i % len(body_list)],
            },
        )
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()


def run_ceiling(
    client: redis.Redis,
    host: str,
    port: int,
    routes: dict[str, tuple[str, ...]],
    n: int,
    tx_per_rt: int = 50,
    around: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """Time ``n`` MULTI / F x LPUSH / XACK / EXEC transactions, ``tx_per_rt`` per round trip.

    Entries are preloaded and read into the group's PEL first (untimed). The timed loop
    builds each payload (a one-line JSON header + the body, like an envelope), packs
    RESP by hand into one buffer per round trip, writes it to a raw socket and reads
    the replies with a bare ``hiredis.Reader``. ``around``: called just before the timed
    loop and just after it (``bench_callgrind`` counts the server's instructions in between).

    Returns:
        ``{"n", "tx_per_s", "deliveries_per_s", "elapsed_s", "cpu", "redis_usec_per_tx"}``.

    Raises:
        BenchError: a transaction failed.
    """
    stream, group = "ceiling:stream", "ceiling"
    client.flushdb()
    _preload_raw(client, stream, n, bodies())
    client.xgroup_create(stream, group, id="0")
    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
    while len(entries) < n:
        got = client.xreadgroup(group, "c1", {stream: ">"}, count=10_000)
        if not got:
            break
        entries.extend(got[0][1])
    prefixes = {t: [b"*3\r\n$5\r\nLPUSH\r\n" + _bulk(q.encode()) for q in qs] for t, qs in routes.items()}
    multi = b"*1\r\n$5\r\nMULTI\r\n"
    exec_ = b"*1\r\n$4\r\nEXEC\r\n"
    xack = b"*4\r\n$4\r\nXACK\r\n" + _bulk(stream.encode()) + _bulk(group.encode())
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    fanout = len(next(iter(prefixes.values())))
    client.config_resetstat()
    if around is not None:
        around[0]()
    meter = CpuMeter({"redis": [redis_pid(client)], "bench": [os.getpid()]})
    start = time.perf_counter()
    try:
        for first in range(0, len(entries), tx_per_rt):
            out = bytearray()
            chunk = entries[first : first + tx_per_rt]
            for entry_id, fields in chunk:
                header = b'{"entry_id":"%s","publisher":"%s","seq":%s,"topic":"%s","ts":%s}\n' % (
                    entry_id,
                    fields[b"publisher"],
                    fields[b"seq"],
                    fields[b"topic"],
                    fields[b"ts"],
                )
                payload = _bulk(header + fields[b"body"])
                out += multi
                for prefix in prefixes[fields[b"topic"].decode()]:
                    out += prefix
                    out += payload
                out += xack
                out += _bulk(entry_id)
                out += exec_
            sock.sendall(out)
            expected = len(chunk) * (fanout + 3)
            got_replies = 0
            while got_replies < expected:
                reply = reader.gets()
                if reply is False:
                    size = sock.recv_into(buf)
                    if not size:
                        raise BenchError("server closed the connection")
                    reader.feed(view, 0, size)
                    continue
                got_replies += 1
                if isinstance(reply, hiredis.ReplyError) or (
                    isinstance(reply, list) and any(isinstance(r, hiredis.ReplyError) for r in reply)
                ):
                    raise BenchError(f"ceiling transaction failed: {reply!r}")
        elapsed = time.perf_counter() - start
    finally:
        sock.close()
        if around is not None:
            around[1]()
    cpu = meter.stop()
    done = len(entries)
    pending = client.xpending(stream, group)["pending"]
    if pending:
        raise BenchError(f"ceiling: {pending} entries left unacknowledged")
    return {
        "n": done,
        "fanout": fanout,
        "tx_per_rt": tx_per_rt,
        "elapsed_s": round(elapsed, 3),
        "tx_per_s": round(done / elapsed),
        "deliveries_per_s": round(done * fanout / elapsed),
        "cpu": cpu,
        "redis_cpu_us_per_pub": round(cpu["redis"] / 100 * elapsed * 1e6 / max(done, 1), 2),
    }


# --------------------------------------------------------------------------------------------
# 2-3. The broker end to end: preload with Publisher.publish_many, then drain with the pool
# --------------------------------------------------------------------------------------------


def publisher_ids(prefix: str = "p") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(PUBLISHERS)]


def schedule(n: int, hot: bool, chunk: int, prefix: str = "p") -> list[tuple[str, int]]:
    """The preload order: ``(publisher, how many)`` chunks, interleaved across publishers.

    Uniform: every publisher gets n/50, taken round robin ``chunk`` at a time. Hot:
    ``p00`` gets n/2 and its chunks alternate with chunks of the 49 others (round
    robin over them), so it is half of the stream all along.
    """
    ids = publisher_ids(prefix)
    if hot:
        quota = {ids[0]: n // 2}
        rest = n - n // 2
        for i, pid in enumerate(ids[1:]):
            quota[pid] = rest // (len(ids) - 1) + (1 if i < rest % (len(ids) - 1) else 0)
    else:
        quota = {pid: n // len(ids) + (1 if i < n % len(ids) else 0) for i, pid in enumerate(ids)}
    order: list[tuple[str, int]] = []
    if hot:
        others = [p for p in ids[1:]]
        k = 0
        while quota[ids[0]] > 0 or any(quota[p] for p in others):
            if quota[ids[0]] > 0:
                take = min(chunk, quota[ids[0]])
                quota[ids[0]] -= take
                order.append((ids[0], take))
            for _ in range(len(others)):
                pid = others[k % len(others)]
                k += 1
                if quota[pid] > 0:
                    take = min(chunk, quota[pid])
                    quota[pid] -= take
                    order.append((pid, take))
                    break
    else:
        while any(quota.values()):
            for pid in ids:
                if quota[pid] > 0:
                    take = min(chunk, quota[pid])
                    quota[pid] -= take
                    order.append((pid, take))
    return order


@dataclass
class Principals:
    """The ACL users of a run with security on (14.): one publisher user per publisher id
    (``<id>-user``, bound to that id: it XADDs to its ingress stream ``{qm}:in:<id>-user``)
    and one worker user, made after the topology's restore (which flushes the bindings).

    Attributes:
        qm: the queue manager.
        clients: publisher id -> a client authenticated as its principal.
        worker_url: the Redis URL the workers connect with (the worker user's).
        password: every user's password (a throwaway server's users).
    """

    qm: str
    clients: dict[str, redis.Redis]
    worker_url: str
    password: str

    @classmethod
    def make(cls, client: redis.Redis, qm: str, url: str, ids: Sequence[str]) -> Principals:
        """Make the users on ``client``'s server (``url``: its URL, without credentials)."""
        from broker.acl import RoleSpec, add_user

        password = uuid.uuid4().hex

        def as_user(user: str) -> str:
            return url.replace("redis://", f"redis://{user}:{password}@", 1)

        made: dict[str, redis.Redis] = {}
        for pid in ids:
            add_user(client, qm, f"{pid}-user", RoleSpec("publisher", [pid]), password)
            made[pid] = redis.Redis.from_url(as_user(f"{pid}-user"))
        add_user(client, qm, "bench-worker", RoleSpec("worker"), password)
        return cls(qm, made, as_user("bench-worker"), password)

    def principal(self, publisher_id: str) -> str:
        return f"{publisher_id}-user"

    def ingress(self) -> list[str]:
        """Every principal's ingress stream."""
        return [keys.ingress(self.qm, self.principal(pid)) for pid in self.clients]

    def close(self, client: redis.Redis) -> None:
        """Close the publishers' clients and delete every user."""
        for made in self.clients.values():
            made.close()
        client.execute_command("ACL", "DELUSER", "bench-worker", *map(self.principal, self.clients))


def _publish_with_props(
    pipe: Any, stream: str, pub: Publisher, prefix: str, items: list[tuple[str, bytes]], props: list[dict]
) -> str:
    """XADD ``items`` as ``Publisher.publish_many`` would (its seq, a msgid), each with its own
    properties, in one round trip; returns the last msgid. (``publish_many`` takes one set of
    properties per call.)"""
    msgid = ""
    for (topic, body), properties in zip(items, props, strict=True):
        seq = pub.next_seq
        pub.next_seq += 1
        msgid = f"{prefix}-{seq}"
        pipe.xadd(
            stream,
            publication_fields(pub.publisher_id, topic, body, msgid=msgid, seq=seq, properties=properties),
        )
    pipe.execute()
    return msgid


def preload(
    client: redis.Redis,
    qm: str,
    n: int,
    hot: bool,
    chunk: int,
    seed: int = 1,
    properties: bool = False,
    topics: Sequence[str] = TOPICS,
    prefix: str = "p",
    principals: Principals | None = None,
) -> dict[str, Any]:
    """XADD ``n`` publications with ``Publisher.publish_many``, one call per chunk, interleaved.

    Publisher ids are ``<prefix>00``..``<prefix>49`` (queue managers of one network each use their own).
    With ``principals``, each publisher id publishes as its principal user, through its ingress stream.

    With ``properties``, every publication carries its own ``selector_props`` (same topics
    and bodies as without), XADDed with the fields ``publish_many`` writes, one round trip
    per chunk; the deliveries expected after the subscriptions' selectors are counted with
    the broker's ``RoutingTable`` (loaded from the server) and ``Selector.matches``.

    Returns:
        ``{"n", "elapsed_s", "xadd_per_s", "per_publisher": {id: count}, "msgids": sample}``,
        and with ``properties`` ``expected_deliveries``, ``selector_evaluations``, ``selected_share``.
    """
    rng = random.Random(seed)
    props_rng = random.Random(seed + 1000)
    body_list = bodies()
    # no flow control: the preload runs before any worker, so there is no delay to learn
    # (and its round trips stay as they were: no GET of the flow key)
    if principals is not None and properties:
        raise BenchError("preload: properties are XADDed to the publish stream, not through ingress streams")
    pubs = {
        pid: Publisher(client, qm, pid, flow_control=False)
        if principals is None
        else Publisher(
            principals.clients[pid], qm, pid, flow_control=False, principal=principals.principal(pid)
        )
        for pid in publisher_ids(prefix)
    }
    prefixes = {pid: uuid.uuid4().hex for pid in pubs}
    counts: Counter[str] = Counter()
    msgids: list[tuple[str, str]] = []
    table: RoutingTable | None = None
    expected = evaluations = selected = 0
    published: list[tuple[str, dict[str, str | int]]] = []
    if properties:
        table = RoutingTable(qm)
        table.load(client)
    pipe = client.pipeline(transaction=False)
    stream = keys.publish_stream(qm)
    start = time.perf_counter()
    for pid, take in schedule(n, hot, chunk, prefix):
        items = [(rng.choice(topics), body_list[rng.randrange(len(body_list))]) for _ in range(take)]
        if properties:
            props = [selector_props(props_rng) for _ in range(take)]
            last = _publish_with_props(pipe, stream, pubs[pid], prefixes[pid], items, props)
        else:
            last = pubs[pid].publish_many(items, batch=take)[-1].msgid
        counts[pid] += take
        if rng.random() < 0.02:
            msgids.append((pid, last))
        if properties:
            published += [(topic, p) for (topic, _), p in zip(items, props, strict=True)]
    elapsed = time.perf_counter() - start
    if table is not None:
        for topic, p in published:
            for sub_id in table.resolve(topic).sub_ids:
                selector = table.selectors.get(sub_id)
                if selector is None:
                    expected += 1
                else:
                    evaluations += 1
                    hit = selector.matches(p)
                    selected += hit
                    expected += hit
    out = {
        "n": n,
        "elapsed_s": round(elapsed, 3),
        "xadd_per_s": round(n / elapsed),
        "hot_share": round(counts[f"{prefix}00"] / n, 3),
        "msgids": msgids[:100],
    }
    if properties:
        out |= {
            "expected_deliveries": expected,
            "selector_evaluations": evaluations,
            "selected_share": round(selected / evaluations, 3) if evaluations else None,
        }
    return out


def group_progress(client: redis.Redis, qm: str) -> tuple[bool, int, int]:
    """``(group exists, pending, lag)`` of the workers' group (``broker.stream.group_state``)."""
    state = group_state(client, qm)
    lag = state.lag
    if lag is None:  # unknown (deleted entries): compare ids instead
        last = client.xinfo_stream(keys.publish_stream(qm))["last-generated-id"]
        last_id = last.decode() if isinstance(last, bytes) else str(last)
        lag = 0 if state.last_delivered_id == last_id else 1
    return state.exists, state.pending, lag


def _worker_pids(client: redis.Redis, qm: str) -> list[int]:
    return [int(json.loads(raw)["pid"]) for raw in client.hgetall(keys.workers(qm)).values()]


def _queue_total(client: redis.Redis, queues: Sequence[str], length: str = "LLEN") -> int:
    """Messages in ``queues`` (lists; ``length="XLEN"``: entries in streams), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.execute_command(length, q)
    return sum(pipe.execute())


def order_violations(client: redis.Redis, queue: str) -> tuple[int, int]:
    """Per-publisher order in one subscriber queue: ``(inversions, envelopes checked)``."""
    raw = client.lrange(queue, 0, -1)
    last: dict[str, int] = {}
    bad = 0
    for envelope in reversed(raw):  # LPUSHed: the oldest is on the right
        header = json.loads(envelope.partition(b"\n")[0])
        pub, seq = header["publisher"], header["seq"]
        if seq <= last.get(pub, -1):
            bad += 1
        last[pub] = seq
    return bad, len(raw)


def work_split(client: redis.Redis, qm: str, n: int, timeout_s: float = 3.0) -> list[float] | None:
    """Share of the publications each worker handled, from their heartbeats (written about once a second).

    Waits up to ``timeout_s`` for the heartbeats to add up to ``n``; None if they do not.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [
            int(json.loads(raw).get("processed") or 0) for raw in client.hgetall(keys.workers(qm)).values()
        ]
        if sum(counts) >= n:
            return sorted((round(c / sum(counts), 3) for c in counts), reverse=True)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _pool(settings: Settings, k: int) -> Any:
    from worker.pool import Pool

    return Pool(settings.model_copy(update={"concurrency": k}))


def wait_registered(client: redis.Redis, qm: str, pool: Any, k: int, timeout_s: float = 60.0) -> None:
    """Wait until ``k`` workers have a heartbeat.

    Raises:
        BenchError: a worker died or they did not register within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while client.hlen(keys.workers(qm)) < k:
        if pool.alive() < k:
            raise BenchError("a worker process died at start (see its log above)")
        if time.monotonic() > deadline:
            raise BenchError(f"workers did not register within {timeout_s:.0f} s")
        time.sleep(POLL_S)


class Profiler:
    """py-spy ``record --format raw`` on some pids until stopped, then a text summary."""

    def __init__(self, pids: list[int], out_dir: str, label: str, rate: int = 100) -> None:
        self.procs: list[tuple[int, str, subprocess.Popen[bytes]]] = []
        exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
        for pid in pids:
            path = os.path.join(out_dir, f"{label}-{pid}.txt")
            cmd = [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--idle",
                "--format",
                "raw",
                "--output",
                path,
                "--nonblocking",
            ]
            self.procs.append(
                (pid, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            )

    def stop(self) -> dict[str, Any]:
        """SIGINT every py-spy (it writes its file) and summarise the collapsed stacks."""
        for _, _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, _, proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        per_worker = []
        for pid, path, _ in self.procs:
            stacks: Counter[str] = Counter()
            try:
                with open(path) as handle:
                    for line in handle:
                        stack, _, count = line.rstrip("\n").rpartition(" ")
                        if stack and count.isdigit():
                            stacks[stack] += int(count)
            except OSError:
                continue
            per_worker.append({"pid": pid, "file": path, **summarise_stacks(stacks)})
        return {"workers": per_worker}


def _frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"; py-spy raw frames carry the line number.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    return f"{name} ({os.path.basename(path)})" if path else name


def summarise_stacks(stacks: Counter[str], top: int = 25) -> dict[str, Any]:
    """Self and inclusive shares of the hottest functions in collapsed stacks."""
    total = sum(stacks.values())
    if not total:
        return {"samples": 0, "self": [], "inclusive": []}
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = [_frame_name(f) for f in stack.split(";") if f]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    share = lambda c: round(100 * c / total, 1)  # noqa: E731
    return {
        "samples": total,
        "self": [(name, share(c)) for name, c in own.most_common(top)],
        "inclusive": [(name, share(c)) for name, c in inclusive.most_common(top)],
    }


def run_broker(
    client: redis.Redis,
    settings: Settings,
    topo: Topology,
    n: int,
    workers: int,
    hot: bool,
    chunk: int,
    profile_dir: str | None = None,
    label: str = "",
    properties: bool = False,
    topic_objects: Sequence[TopicObject] | None = None,
    security: bool = False,
    pool_factory: Callable[[Settings, int], Any] | None = None,
) -> dict[str, Any]:
    """Preload ``n`` publications, then time the pool draining them into the subscriber queues.

    The clock starts when all ``workers`` have registered (a worker writes its first
    heartbeat after its first round, so whatever was acknowledged before that is
    subtracted) and stops when the group has nothing pending and no lag. Then the
    subscriber queues must hold exactly ``n x FANOUT`` envelopes (with ``properties``:
    every publication carries ``selector_props``, and the queues must hold what the
    topology's selectors select, counted by ``preload``). With ``topic_objects``, they are
    defined after the topology is restored and before the preload (untimed), must still all
    be there when the drain ends, and are removed afterwards; without, the queue manager must
    have none. With ``security``, every publisher id publishes as its own principal user through
    its ingress stream (``Principals``, made after the restore, untimed) and the workers connect as a
    worker user: the drain ends when the ingress streams are empty too, and every envelope of a
    sampled queue must carry its publisher's principal. ``pool_factory(settings, workers)`` makes
    the pool instead of this commit's ``worker.pool.Pool`` (``bench_baseline``: an earlier
    commit's, for the no-regression row).

    Returns:
        Figures: pubs/s, deliveries/s, measured F, CPU, Redis time per publication, ...

    Raises:
        BenchError: the drain stalled, a worker died, or deliveries are missing.
    """
    qm = topo.qm
    topo.restore(client)
    objects_key = keys.topic_objects(qm)
    define_s = None
    if topic_objects:
        define_s = define_topic_objects(client, qm, topic_objects)
    elif client.exists(objects_key):
        raise BenchError(f"{objects_key} holds {client.hlen(objects_key)} topic objects after the restore")
    principals = Principals.make(client, qm, settings.redis_url, publisher_ids()) if security else None
    loaded = preload(
        client, qm, n, hot=hot, chunk=chunk, properties=properties, topics=topo.topics, principals=principals
    )
    settings = settings.model_copy(update={"topic_scheme": topo.scheme})
    if principals is not None:
        settings = settings.model_copy(update={"redis_url": principals.worker_url})
    ingress = principals.ingress() if principals is not None else []
    expected = loaded.get("expected_deliveries", n * FANOUT)
    client.config_resetstat()
    pool = (pool_factory or _pool)(settings, workers)
    t_spawn = time.perf_counter()
    pool.start()
    profiler: Profiler | None = None
    samples: list[tuple[float, int]] = []
    try:
        t0: float | None = None
        acked0 = 0
        meter: CpuMeter | None = None
        last_acked, last_change = -1, time.monotonic()
        while True:
            now = time.perf_counter()
            exists, pending, lag = group_progress(client, qm)
            lag += _queue_total(client, ingress, "XLEN") if ingress else 0  # not yet moved in
            acked = n - pending - lag if exists else 0
            samples.append((now, acked))
            if t0 is None and client.hlen(keys.workers(qm)) >= workers:
                t0, acked0 = now, acked
                pids = _worker_pids(client, qm)
                meter = CpuMeter({"redis": [redis_pid(client)], "workers": pids, "bench": [os.getpid()]})
                if profile_dir:
                    profiler = Profiler(pids, profile_dir, label)
            if exists and pending == 0 and lag == 0:
                t_end = now
                break
            if acked != last_acked:
                last_acked, last_change = acked, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                raise BenchError(f"no progress for {STALL_S:.0f} s at {acked}/{n} acknowledged")
            if pool.alive() < workers:
                raise BenchError("a worker process died during the run")
            time.sleep(POLL_S)
        cpu = meter.stop() if meter else {}
        profile = profiler.stop() if profiler else None
        profiler = None
        split = work_split(client, qm, n)
    finally:
        if profiler is not None:
            profiler.stop()
        pool.stop()
        objects_left = client.hlen(objects_key)
        if topic_objects:
            clear_topic_objects(client, qm)
        if principals is not None:
            principals.close(client)
    stats = commandstats(client)
    if t0 is None:  # finished before every worker registered: fall back to the spawn time
        t0, acked0 = t_spawn, 0
    elapsed = t_end - t0
    measured = n - acked0
    delivered = _queue_total(client, topo.queues)
    dead = client.xlen(keys.dead_letter(qm))
    # steady window: 10% -> 90% acknowledged
    t10 = next((t for t, a in samples if a >= 0.1 * n), t0)
    t90 = next((t for t, a in samples if a >= 0.9 * n), t_end)
    steady = round(0.8 * n / (t90 - t10)) if t90 > t10 else None
    inversions = checked = 0
    for sub in ("hash$r3", "exact$bench_3_3_3", "dedup$r7"):
        bad, count = order_violations(client, keys.sub_queue(qm, sub))
        inversions += bad
        checked += count
    pipe = client.pipeline(transaction=False)
    for pid, msgid in loaded["msgids"]:
        pipe.exists(keys.dedup(qm, pid, msgid))
    dedup_found = sum(pipe.execute())
    redis_cpu_us = cpu.get("redis", 0.0) / 100 * elapsed * 1e6
    result = {
        "n": n,
        "workers": workers,
        "hot": hot,
        "elapsed_s": round(elapsed, 3),
        "measured_publications": measured,
        "pubs_per_s": round(measured / elapsed),
        "deliveries_per_s": round(measured * FANOUT / elapsed)
        if expected == n * FANOUT
        else round(measured * expected / n / elapsed),
        "steady_10_90_pubs_per_s": steady,
        "from_spawn_pubs_per_s": round(n / (t_end - t_spawn)),
        "spawn_to_registered_s": round(t0 - t_spawn, 3),
        "acked_before_registered": acked0,
        "deliveries": delivered,
        "fanout_measured": round(delivered / n, 3),
        "dead_lettered": dead,
        "work_split": split,
        "order_inversions": inversions,
        "order_checked": checked,
        "dedup_records_found": f"{dedup_found}/{len(loaded['msgids'])}",
        "preload_xadd_per_s": loaded["xadd_per_s"],
        "preload_s": loaded["elapsed_s"],
        "hot_share": loaded["hot_share"],
        "cpu": cpu,
        "redis_cpu_us_per_pub": round(redis_cpu_us / max(measured, 1), 2),
        # (command, calls per publication, usec per publication); commands run inside
        # scripts are counted both on their own and inside evalsha
        "redis_commands": sorted(
            ((k, round(v["calls"] / n, 3), round(v["usec"] / n, 2)) for k, v in stats.items()),
            key=lambda x: -x[2],
        )[:8],
    }
    if profile is not None:
        result["profile"] = profile
    if properties:
        result |= {
            "properties": True,
            "selective_subscriptions": len(topo.selective),
            "expected_deliveries": expected,
            "selector_evaluations": loaded["selector_evaluations"],
            "selected_share": loaded["selected_share"],
        }
    if principals is not None:
        sample = [Message.from_envelope(raw) for raw in client.lrange(keys.sub_queue(qm, "hash$r3"), 0, 199)]
        strays = [m.msgid for m in sample if m.principal != principals.principal(m.publisher)]
        if strays or not sample:
            raise BenchError(f"envelopes without their publisher's principal: {strays[:5]} of {len(sample)}")
        result |= {"security": True, "principals": len(principals.clients), "principal_checked": len(sample)}
    if topic_objects is not None:
        result |= {
            "topic_objects": len(topic_objects),
            "topic_objects_define_s": round(define_s, 3) if define_s is not None else None,
            "topic_objects_coverage": round(topic_object_coverage(topic_objects), 3),
        }
    if objects_left != len(topic_objects or ()):
        raise BenchError(
            f"{objects_key} held {objects_left} topic objects at the end of the run, "
            f"not {len(topic_objects or ())}"
        )
    if delivered != expected or dead:
        raise BenchError(
            f"expected {expected} deliveries, found {delivered} ({dead} dead-lettered): {result}"
        )
    return result


# --------------------------------------------------------------------------------------------
# 4. Latency at a paced rate
# --------------------------------------------------------------------------------------------


def latency_publisher(url: str, qm: str, rate: float, count: int, conn: Any) -> None:
    """Child process: publish ``count`` publications at ``rate``/s on an absolute schedule.

    One ``Publisher.publish`` (one XADD) per publication, rotating over 50 publisher
    ids and the 100 topics of region 0; the send time (``time.time_ns()`` taken
    just before the publish call) travels as the property ``sent_ns``.
    Sends ``{"sent", "elapsed_s", "max_behind_ms", "late"}`` on ``conn`` at the end.
    """
    from broker.connection import connect

    client = connect(url)
    # No flow control: the schedule is open loop, and only the queue of bench/0/# is drained
    # (the other queues of region 0 grow past the start depth): the run measures latency, not pacing.
    pubs = [Publisher(client, qm, pid, flow_control=False) for pid in publisher_ids()]
    _paced(pubs, rate, count, conn)


def _paced(pubs: list[Publisher], rate: float, count: int, conn: Any) -> None:
    """Publish ``count`` publications at ``rate``/s on an absolute schedule, rotating over ``pubs``
    and the topics of region 0, ``sent_ns`` in a property; send the summary on ``conn``."""
    body = bodies(1)[0]
    interval = 1.0 / rate
    behind_max = 0.0
    late = 0
    start = time.perf_counter() + 0.05
    for k in range(count):
        due = start + k * interval
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        else:
            behind_max = max(behind_max, -wait)
            late += wait < -0.001
        pubs[k % len(pubs)].publish(
            LATENCY_TOPICS[k % len(LATENCY_TOPICS)], body, properties={"sent_ns": time.time_ns()}
        )
    elapsed = time.perf_counter() - start
    conn.send(
        {"sent": count, "elapsed_s": elapsed, "max_behind_ms": round(behind_max * 1000, 2), "late": late}
    )
    conn.close()


#: Most envelopes the latency consumer takes with one RPOP after a BRPOP returned.
CONSUMER_BATCH = 500


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def run_latency(
    client: redis.Redis,
    settings: Settings,
    topo: Topology,
    rate: float,
    duration_s: float,
    warmup_s: float = 0.25,
    workers: int = 2,
) -> dict[str, Any]:
    """Publish at ``rate``/s for ``duration_s`` with ``workers`` running; BRPOP one queue and time each
    (``measure_latency``).

    Raises:
        BenchError: the workers did not start, or fewer than 99% of the messages came back.
    """
    qm = topo.qm
    topo.restore(client)
    pool = _pool(settings, workers)
    pool.start()
    client.config_resetstat()
    try:
        wait_registered(client, qm, pool, workers)
        result = measure_latency(
            settings.redis_url,
            qm,
            settings.redis_url,
            keys.sub_queue(qm, LATENCY_SUB),
            rate,
            duration_s,
            warmup_s,
            {"redis": [redis_pid(client)], "workers": _worker_pids(client, qm)},
        )
        stats = commandstats(client)
    finally:
        pool.stop()
    count = result["sent"]
    result["workers"] = workers
    result["redis_commands"] = sorted(
        ((k, round(v["calls"] / count, 3), round(v["usec"] / count, 2)) for k, v in stats.items()),
        key=lambda x: -x[2],
    )[:10]
    return result


def measure_latency(
    publish_url: str,
    publish_qm: str,
    consume_url: str,
    queue: str,
    rate: float,
    duration_s: float,
    warmup_s: float,
    pids: dict[str, list[int]],
) -> dict[str, Any]:
    """Publish at ``rate``/s for ``duration_s`` at ``publish_qm`` (a ``latency_publisher`` process on
    ``publish_url``); BRPOP ``queue`` on ``consume_url`` and time each envelope.

    Latency = ``time.time_ns()`` when the envelope was popped minus ``sent_ns`` (same
    machine clock). After each BRPOP the consumer takes whatever else is queued with one
    ``RPOP queue count`` (each stamped when that call returned), so that a backlog does
    not make the consumer itself the bottleneck. The first ``warmup_s`` of sends are
    left out of the percentiles. ``pids``: the processes whose CPU is reported (the
    bench and the publisher are added).

    Raises:
        BenchError: fewer than 99% of the messages came back.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    proc = None
    closers: list[Callable[[], None]] = []
    count = int(rate * duration_s)
    try:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=latency_publisher,
            args=(publish_url, publish_qm, rate, count, child),
            name="bench-latency-publisher",
        )
        consumer = redis.Redis.from_url(consume_url)
        closers.append(consumer.close)
        proc.start()
        meter = CpuMeter({**pids, "bench": [os.getpid()], "publisher": [proc.pid or 0]})
        records: list[tuple[int, int]] = []
        idle_since = None
        while len(records) < count:
            got = consumer.brpop([queue], timeout=1)
            if got is None:
                if not proc.is_alive():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > 5:
                        break
                continue
            received = time.time_ns()
            batch = [(got[1], received)]
            # a backlog is taken in one round trip, so the consumer does not fall behind the broker
            more = consumer.rpop(queue, CONSUMER_BATCH)
            if more:
                received = time.time_ns()
                batch += [(envelope, received) for envelope in more]
            for envelope, at in batch:
                header = json.loads(envelope.partition(b"\n")[0])
                records.append((int(header["props"]["sent_ns"]), at))
        cpu = meter.stop()
        pub_info = parent.recv() if parent.poll(30) else {}
        proc.join(10)
    finally:
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(5)
        for close in closers:
            close()
    if len(records) < 0.99 * count:
        raise BenchError(f"latency: only {len(records)} of {count} messages received")
    first_sent = min(s for s, _ in records)
    lat_ms = sorted((r - s) / 1e6 for s, r in records if s - first_sent >= warmup_s * 1e9)
    return {
        "rate": rate,
        "duration_s": duration_s,
        "sent": pub_info.get("sent", count),
        "received": len(records),
        "measured": len(lat_ms),
        "achieved_rate": round(pub_info["sent"] / pub_info["elapsed_s"]) if pub_info else None,
        "publisher_max_behind_ms": pub_info.get("max_behind_ms"),
        "publisher_late_gt_1ms": pub_info.get("late"),
        "p50_ms": round(_percentile(lat_ms, 50), 3),
        "p90_ms": round(_percentile(lat_ms, 90), 3),
        "p99_ms": round(_percentile(lat_ms, 99), 3),
        "p999_ms": round(_percentile(lat_ms, 99.9), 3),
        "max_ms": round(lat_ms[-1], 3) if lat_ms else None,
        "cpu": cpu,
    }


# --------------------------------------------------------------------------------------------
# 5. The peer: kombu's topic exchange on the same Redis
# --------------------------------------------------------------------------------------------


def run_kombu(client: redis.Redis, url: str, n: int) -> dict[str, Any]:
    """Publish ``n`` messages to a kombu topic exchange bound by 10 queues (``t.#``), then consume all.

    kombu defaults: JSON serializer, persistent delivery mode, one Consumer on the
    10 queues acknowledging each message.

    Raises:
        BenchError: fewer than ``n x 10`` messages were consumed, or kombu is not installed.
    """
    try:
        from kombu import Connection, Exchange, Queue
    except ImportError as exc:  # the row is skipped, the run goes on
        raise BenchError(f"kombu is not installed ({exc}): pip install -e '.[bench]'") from exc

    client.flushdb()
    body = bodies(1)[0].decode()
    exchange = Exchange("bench.topic", type="topic", durable=True)
    queues = [Queue(f"bench.q{i}", exchange=exchange, routing_key="t.#") for i in range(FANOUT)]
    received = 0
    meter_pids = {"redis": [redis_pid(client)], "bench": [os.getpid()]}
    with Connection(url) as conn:
        channel = conn.channel()
        for q in queues:
            q(channel).declare()
        producer = conn.Producer(serializer="json")
        meter = CpuMeter(meter_pids)
        start = time.perf_counter()
        for i in range(n):
            producer.publish(
                {"publisher": f"p{i % PUBLISHERS:02d}", "seq": i, "body": body},
                exchange=exchange,
                routing_key=f"t.{i % 1000}",
            )
        published_s = time.perf_counter() - start
        cpu_pub = meter.stop()

        def on_message(_body: Any, message: Any) -> None:
            nonlocal received
            message.ack()
            received += 1

        meter = CpuMeter(meter_pids)
        start = time.perf_counter()
        with conn.Consumer(queues, callbacks=[on_message]):
            last = time.monotonic()
            while received < n * FANOUT:
                before = received
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=2)
                if received != before:
                    last = time.monotonic()
                elif time.monotonic() - last > 10:
                    break
        consumed_s = time.perf_counter() - start
        cpu_consume = meter.stop()
        channel.close()
    client.flushdb()
    if received < n * FANOUT:
        raise BenchError(f"kombu: consumed {received} of {n * FANOUT}")
    return {
        "n": n,
        "pubs_per_s": round(n / published_s),
        "published_deliveries_per_s": round(n * FANOUT / published_s),
        "consumed_deliveries_per_s": round(received / consumed_s),
        "publish_s": round(published_s, 2),
        "consume_s": round(consumed_s, 2),
        "cpu_publish": cpu_pub,
        "cpu_consume": cpu_consume,
    }


# --------------------------------------------------------------------------------------------
# 6. Matching alone: TopicIndex + LinkGraph at 1k, 100k, 1M subscriptions
# --------------------------------------------------------------------------------------------

_METRICS = ("temp", "rh", "wind", "rain", "power", "door", "alarm", "cpu", "disk", "net")


def _random_topic(rng: random.Random) -> str:
    return (
        f"region{rng.randrange(100)}/site{rng.randrange(1000)}/dev{rng.randrange(1000)}/"
        f"{_METRICS[rng.randrange(len(_METRICS))]}"
    )


def filter_stream(seed: int = 5) -> Iterator[str]:
    """An endless, reproducible stream of subscription filters (a prefix of it is each index).

    Mix: 80% exact topics (1 in 20 re-uses an earlier exact topic: several subscribers
    on one topic), 12% with one ``+`` level (2nd, 3rd or 4th), 8% ``#`` under a 2- or
    3-level prefix. Topic space: 100 regions x 1,000 sites x 1,000 devices x 10 metrics.
    """
    rng = random.Random(seed)
    exact: list[str] = []
    while True:
        x = rng.random()
        if x < 0.80:
            if exact and rng.random() < 0.05:
                yield exact[rng.randrange(len(exact))]
            else:
                topic = _random_topic(rng)
                exact.append(topic)
                yield topic
        elif x < 0.92:
            levels = _random_topic(rng).split("/")
            levels[rng.choice((1, 2, 3))] = "+"
            yield "/".join(levels)
        else:
            levels = _random_topic(rng).split("/")[: rng.choice((2, 3))]
            yield "/".join(levels) + "/#"


def _exact_prefix(count: int) -> list[str]:
    stream = filter_stream()
    return [f for f in (next(stream) for _ in range(count)) if "+" not in f and "#" not in f]


def match_sample(size: int = 4000, seed: int = 9) -> list[str]:
    """The fixed topic sample: 90% exact topics of the first 1,000 filters (present in every index), 10% random."""
    rng = random.Random(seed)
    base = _exact_prefix(1000)
    return [rng.choice(base) if rng.random() < 0.9 else _random_topic(rng) for _ in range(size)]


def build_index(n: int) -> tuple[TopicIndex, LinkGraph, dict[str, Any]]:
    """Build the index of the first ``n`` filters under tracemalloc, then the links.

    Links: every 10th exact topic of the first 1,000 filters (about 80, so ~9% of the
    sample) links to a random exact topic of the index, plus n/100 links between
    random exact topics; links that would close a cycle are skipped.

    Returns:
        ``(index, links, {"build_s", "bytes_per_sub", "links", "wildcards"})``.
    """
    gc.collect()
    stream = filter_stream()
    exact: list[str] = []
    wildcards = 0
    tracemalloc.start()
    start = time.perf_counter()
    index = TopicIndex()
    for i in range(n):
        topic_filter = next(stream)
        index.add(topic_filter, f"sub{i}")
        if "+" in topic_filter or "#" in topic_filter:
            wildcards += 1
        else:
            exact.append(topic_filter)
    traced = tracemalloc.get_traced_memory()[0] - sys.getsizeof(exact)
    tracemalloc.stop()
    build_s = time.perf_counter() - start
    rng = random.Random(n)
    graph = LinkGraph()
    head = _exact_prefix(1000)
    sources = head[::10] + [exact[rng.randrange(len(exact))] for _ in range(n // 100)]
    made = 0
    for source in sources:
        target = exact[rng.randrange(len(exact))]
        if target == source:
            continue
        try:
            graph.add(source, target)
            made += 1
        except LinkCycle:
            pass
    return (
        index,
        graph,
        {
            "build_s": round(build_s, 2),
            "bytes_per_sub": round(traced / n),
            "links": made,
            "wildcard_share": round(wildcards / n, 3),
        },
    )


def _time_per_call(fn: Callable[[str], Any], sample: list[str], min_s: float) -> float:
    calls = 0
    start = time.perf_counter()
    while True:
        for topic in sample:
            fn(topic)
        calls += len(sample)
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def run_matching(sizes: Sequence[int], min_s: float = 0.3, rounds: int = 5) -> list[dict[str, Any]]:
    """Build every index, then time ``match`` and resolve (closure + match) on each, interleaved.

    The indexes are timed in turn for ``rounds`` rounds of ``min_s / rounds`` s each and
    the best round is kept, so that a burst of foreign load hits every size alike.

    Returns:
        One dict per size: ``n``, ``match_us``, ``resolve_us``, ``resolves_per_s``,
        ``bytes_per_sub``, ``avg_results``, ``matched_share``, ``build_s``, ``links``.
    """
    sample = match_sample()
    built = []
    for n in sizes:
        index, graph, info = build_index(n)

        def resolve(topic: str, index: TopicIndex = index, graph: LinkGraph = graph) -> set[str]:
            found: set[str] = set()
            for linked in graph.closure(topic):
                found |= index.match(linked)
            return found

        sizes_found = [len(resolve(t)) for t in sample]
        info |= {
            "n": n,
            "avg_results": round(statistics.mean(sizes_found), 2),
            "matched_share": round(sum(1 for s in sizes_found if s) / len(sample), 3),
        }
        built.append((info, index.match, resolve))
    best: dict[int, list[float]] = {n: [float("inf"), float("inf")] for n in sizes}
    for _ in range(rounds):
        for info, match, resolve in built:
            times = best[info["n"]]
            times[0] = min(times[0], _time_per_call(match, sample, min_s / rounds))
            times[1] = min(times[1], _time_per_call(resolve, sample, min_s / rounds))
    results = []
    for info, _, _ in built:
        match_s, resolve_s = best[info["n"]]
        results.append(
            {
                **info,
                "match_us": round(match_s * 1e6, 3),
                "resolve_us": round(resolve_s * 1e6, 3),
                "resolves_per_s": round(1 / resolve_s),
            }
        )
    built.clear()
    gc.collect()
    return results


def hierarchy_filters(n: int, predicate_share: float, seed: int = 17) -> list[str]:
    """``n`` distinct swiftmq subscriptions of depth 4 (``r<a>.c<b>.d<c>.e<d>``); every
    ``1 / predicate_share``-th one has a node after the root turned into a predicate that
    matches about ten values (``d12_``, ``e4_``; ``c%`` for one-digit values)."""
    rng = random.Random(seed)
    found: dict[str, None] = {}
    while len(found) < n:
        nodes = [
            f"r{rng.randrange(20)}",
            f"c{rng.randrange(100)}",
            f"d{rng.randrange(100)}",
            f"e{rng.randrange(1000)}",
        ]
        found[".".join(nodes)] = None
    filters = list(found)
    if predicate_share:
        every = round(1 / predicate_share)
        for i in range(every - 1, n, every):
            nodes = filters[i].split(".")
            k = 1 + i % 3
            nodes[k] = nodes[k][:-1] + "_" if len(nodes[k]) > 2 else nodes[k][0] + "%"
            filters[i] = ".".join(nodes)
    return filters


def run_hierarchy_matching(
    sizes: Sequence[int], min_s: float = 0.3, rounds: int = 5, predicate_share: float = 0.1
) -> list[dict[str, Any]]:
    """Time ``match`` of the swiftmq ``HierarchyIndex`` against ``TopicIndex`` (mqtt) on the same topics.

    For each size: the mqtt index of the plain filters (``/`` levels), the swiftmq index of the
    same plain filters, and the swiftmq index with ``predicate_share`` of them predicates.
    The sample: 90% topics that are plain filters of the index, 10% random depth-4 topics.
    Best of ``rounds`` interleaved rounds, as ``run_matching``.

    Returns:
        One dict per size: ``n``, ``mqtt_us``, ``plain_us``, ``predicates_us``, ``avg_results``
        (with predicates), ``predicates``.
    """
    rng = random.Random(23)
    built = []
    for n in sizes:
        plain = hierarchy_filters(n, 0.0)
        mixed = hierarchy_filters(n, predicate_share)
        mqtt, swift, swift_mixed = TopicIndex(), HierarchyIndex(), HierarchyIndex()
        for i, f in enumerate(plain):
            mqtt.add(f.replace(".", "/"), f"s{i}")
            swift.add(f, f"s{i}")
        for i, f in enumerate(mixed):
            swift_mixed.add(f, f"s{i}")
        exact = [f for f in mixed if "%" not in f and "_" not in f][:1000]  # in all three indexes
        sample = [
            rng.choice(exact)
            if rng.random() < 0.9
            else hierarchy_filters(1, 0.0, seed=rng.randrange(10**9))[0]
            for _ in range(2000)
        ]
        slashed = [t.replace(".", "/") for t in sample]
        results = statistics.mean(len(swift_mixed.match(t)) for t in sample)
        built.append((n, sample, slashed, mqtt, swift, swift_mixed, results))
    out = []
    for n, sample, slashed, mqtt, swift, swift_mixed, results in built:
        best = [float("inf")] * 3
        for _ in range(rounds):
            best[0] = min(best[0], _time_per_call(mqtt.match, slashed, min_s / rounds))
            best[1] = min(best[1], _time_per_call(swift.match, sample, min_s / rounds))
            best[2] = min(best[2], _time_per_call(swift_mixed.match, sample, min_s / rounds))
        out.append(
            {
                "n": n,
                "mqtt_us": round(best[0] * 1e6, 3),
                "plain_us": round(best[1] * 1e6, 3),
                "predicates_us": round(best[2] * 1e6, 3),
                "avg_results": round(results, 2),
                "predicates": swift_mixed.predicate_count,
            }
        )
    built.clear()
    gc.collect()
    return out


def wait_idle(
    own_pids: list[int], max_wait_s: float, busy_pct: float = 12.0, window_s: float = 1.0
) -> dict[str, Any]:
    """Wait until the box is quiet: other processes use < ``busy_pct`` % of one core for ``window_s``.

    Gives up after ``max_wait_s`` (the measurement then runs anyway; its CPU
    figures show the foreign load).

    Returns:
        ``{"waited_s", "foreign_pct" (last window), "idle" (True when quiet)}``.
    """
    start = time.monotonic()
    while True:
        meter = CpuMeter({"ours": own_pids})
        time.sleep(window_s)
        cpu = meter.stop()
        if cpu["foreign"] < busy_pct or time.monotonic() - start >= max_wait_s:
            return {
                "waited_s": round(time.monotonic() - start, 1),
                "foreign_pct": cpu["foreign"],
                "idle": cpu["foreign"] < busy_pct,
            }


# --------------------------------------------------------------------------------------------
# 7. Selectors: the cost of one evaluation (the fan-out runs are run_broker(properties=True))
# --------------------------------------------------------------------------------------------


def selector_sample(size: int = 1000, seed: int = 21) -> list[dict[str, object]]:
    """What a worker's selectors see for ``size`` publications with ``selector_props``: each built
    with ``publication_fields``, parsed with ``parse_entry`` and read with ``Entry.selector_properties``
    (user properties and the JMS header fields)."""
    rng = random.Random(seed)
    body = bodies(1)[0]
    now_ms = int(time.time() * 1000)
    sample = []
    for i in range(size):
        fields = publication_fields(
            f"p{i % PUBLISHERS:02d}",
            TOPICS[i % len(TOPICS)],
            body,
            msgid=f"m{i}",
            seq=i + 1,
            properties=selector_props(rng),
        )
        raw = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}
        sample.append(parse_entry(f"{now_ms}-{i}", raw, 1 << 20).selector_properties())
    return sample


def run_selector_cost(
    selector: str = SELECTOR, size: int = 1000, rounds: int = 7, min_s: float = 0.05
) -> dict[str, Any]:
    """Time ``compile_selector(selector).matches`` over ``selector_sample(size)`` in a tight loop.

    ``rounds`` timeit rounds of at least ``min_s`` each; the loop's own cost (a for loop
    calling a one-argument no-op) is measured the same way and reported, not subtracted.

    Returns:
        ``{"selector", "sample", "selected_share", "median_us", "min_us", "loop_us", "rounds"}``.
    """
    sample = selector_sample(size)
    matches = compile_selector(selector).matches

    def noop(properties: object) -> bool:
        return True

    def per_call(fn: Callable[[Any], Any]) -> list[float]:
        timer = timeit.Timer("for p in sample: fn(p)", globals={"sample": sample, "fn": fn})
        number, taken = timer.autorange()
        number = max(1, round(number * min_s / taken))
        return [t / (number * len(sample)) for t in timer.repeat(rounds, number)]

    times = per_call(matches)
    loop = per_call(noop)
    return {
        "selector": selector,
        "sample": len(sample),
        "selected_share": round(sum(matches(p) for p in sample) / len(sample), 3),
        "median_us": round(statistics.median(times) * 1e6, 3),
        "min_us": round(min(times) * 1e6, 3),
        "loop_us": round(statistics.median(loop) * 1e6, 3),
        "rounds": rounds,
    }


# --------------------------------------------------------------------------------------------
# 8. One consumer: receive_many + ack_many against receive + ack
# --------------------------------------------------------------------------------------------

#: The topic filter of the consumer measurement's subscriptions (nothing is published to it).
CONSUME_FILTER = "bench/consume"


def preload_queue(client: redis.Redis, queue: str, n: int, per_push: int = 1000) -> float:
    """LPUSH ``n`` envelopes as a worker writes them (``encode_envelope`` of a ``parse_entry``-shaped
    header, 200-byte body, 50 publishers) into ``queue``; returns the envelopes pushed per second."""
    body_list = bodies()
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    envelopes: list[bytes] = []
    start = time.perf_counter()
    for i in range(n):
        body = body_list[i % len(body_list)]
        header = {
            "v": keys.PROTOCOL_VERSION,
            "msgid": f"c{i}",
            "publisher": f"p{i % PUBLISHERS:02d}",
            "seq": i // PUBLISHERS + 1,
            "topic": TOPICS[i % len(TOPICS)],
            "entry_id": f"{now_ms}-{i}",
        }
        envelopes.append(encode_envelope(header, body))
        if len(envelopes) >= per_push:
            pipe.lpush(queue, *envelopes)
            envelopes = []
            if len(pipe) >= 10:
                pipe.execute()
    if envelopes:
        pipe.lpush(queue, *envelopes)
    pipe.execute()
    return n / (time.perf_counter() - start)


def _drain(subscriber: Any, n: int, batch: int, read: bool = False) -> tuple[int, int]:
    """Receive and acknowledge until ``n`` came or the queue is empty: ``(received, acknowledged)``.
    ``read``: read each message (``Delivery.message``, decoded when first read) before acknowledging."""
    got = acked = 0
    if batch == 1:
        while got < n:
            delivery = subscriber.receive()
            if delivery is None:
                break
            got += 1
            if read:
                delivery.message  # noqa: B018 - decoded when read
            acked += subscriber.ack(delivery)
        return got, acked
    while got < n:
        deliveries = subscriber.receive_many(batch)
        if not deliveries:
            break
        got += len(deliveries)
        if read:
            for delivery in deliveries:
                delivery.message  # noqa: B018 - decoded when read
        acked += subscriber.ack_many(deliveries)
    return got, acked


#: The runs of 8.: (label, key prefix, batch size: "batch" / "large" / 1, read each message).
CONSUME_RUNS = (
    ("batch", "", "batch", False),
    ("large", "large_", "large", False),
    ("read", "read_", "batch", True),
    ("single", "single_", 1, False),
)


def run_consume(
    client: redis.Redis,
    settings: Settings,
    qm: str,
    n: int,
    single_n: int,
    batch: int = 100,
    large_batch: int = 1000,
) -> dict[str, Any]:
    """One consumer, in this process (its own connection): drain ``n`` preloaded messages with
    ``receive_many(batch)`` + ``ack_many``; ``n`` others with ``receive_many(large_batch)`` +
    ``ack_many``; ``n`` others with ``receive_many(batch)``, reading each message (its envelope
    decoded: ``Delivery.message``), + ``ack_many``; then ``single_n`` with ``receive`` + ``ack``.

    Each run has its own durable subscription (``CONSUME_FILTER``), whose queue is filled
    directly with ``preload_queue`` (untimed), and a ``broker.consumer.Subscriber`` with its
    default heartbeat thread. Afterwards the queue and the in-flight list must be empty.
    Keys: ``msgs_per_s`` (batch), ``large_msgs_per_s``, ``read_msgs_per_s``,
    ``single_msgs_per_s``, each with its CPU and Redis commands under the same prefix.

    Raises:
        BenchError: a message was not received or not acknowledged.
    """
    from broker.connection import connect
    from broker.consumer import Subscriber

    client.flushdb()
    conn = connect(settings.redis_url)
    out: dict[str, Any] = {"mode": "in-process", "batch": batch, "large_batch": large_batch}
    sizes = {"batch": batch, "large": large_batch}
    try:
        for label, prefix, which, read in CONSUME_RUNS:
            count = single_n if which == 1 else n
            size = 1 if which == 1 else sizes[str(which)]
            record = subscribe(client, qm, CONSUME_FILTER, client_id="consume", durable_name=label)
            pushed_per_s = preload_queue(client, keys.sub_queue(qm, record.sub_id), count)
            subscriber = Subscriber(conn, qm, record, settings)
            try:
                client.config_resetstat()
                meter = CpuMeter({"redis": [redis_pid(client)], "bench": [os.getpid()]})
                start = time.perf_counter()
                got, acked = _drain(subscriber, count, size, read)
                elapsed = time.perf_counter() - start
                cpu = meter.stop()
                left, in_flight = subscriber.depth(), subscriber.in_flight()
            finally:
                subscriber.close()
            stats = commandstats(client)
            if got != count or acked != count or left or in_flight:
                raise BenchError(
                    f"consume ({label}): received {got}, acknowledged {acked} of {count}; "
                    f"{left} left in the queue, {in_flight} in flight"
                )
            out |= {
                f"{prefix}n": count,
                f"{prefix}msgs_per_s": round(count / elapsed),
                f"{prefix}elapsed_s": round(elapsed, 3),
                f"{prefix}preload_per_s": round(pushed_per_s),
                f"{prefix}cpu": cpu,
                f"{prefix}redis_cpu_us_per_msg": round(cpu["redis"] / 100 * elapsed * 1e6 / count, 2),
                f"{prefix}bench_cpu_us_per_msg": round(cpu["bench"] / 100 * elapsed * 1e6 / count, 2),
                f"{prefix}redis_commands": sorted(
                    (
                        (k, round(v["calls"] / count, 3), round(v["usec"] / count, 2))
                        for k, v in stats.items()
                    ),
                    key=lambda x: -x[2],
                )[:6],
            }
    finally:
        conn.close()
        client.flushdb()
    out["batch_over_single"] = round(out["msgs_per_s"] / out["single_msgs_per_s"], 2)
    return out


# --------------------------------------------------------------------------------------------
# 16. End to end: paced publishers -> 2 workers -> one consumer process (receive_many + ack_many)
# --------------------------------------------------------------------------------------------

#: Most publications/s one paced publisher process is given in the end-to-end run (16.).
E2E_RATE_PER_PUBLISHER = 6_000.0


def e2e_publisher(url: str, qm: str, rate: float, count: int, pids: list[str], conn: Any) -> None:
    """Child process of 16.: ``latency_publisher``'s schedule, on its own publisher ids ``pids``
    (each id's sequence belongs to one process). Sends the same summary on ``conn``."""
    from broker.connection import connect

    client = connect(url)
    pubs = [Publisher(client, qm, pid, flow_control=False) for pid in pids]
    conn.recv()  # go
    _paced(pubs, rate, count, conn)


def e2e_consumer(
    url: str, qm: str, sub_id: str, record_json: str, count: int, batch: int, idle_s: float, conn: Any
) -> None:
    """Child process of 16.: one ``Subscriber`` doing ``receive_many(batch, timeout_ms=100)``,
    reading each message's ``sent_ns`` property, then ``ack_many``; a message's latency is
    ``time.time_ns()`` when ``ack_many`` returned minus ``sent_ns``. Stops after ``count``
    messages, or ``idle_s`` with nothing received. Sends ``"ready"`` once attached, then
    ``{"sent_ns": [...], "latency_ns": [...], "calls": n, "cpu_s": s}`` on ``conn``."""
    from array import array

    from broker.config import Settings
    from broker.connection import connect
    from broker.consumer import Subscriber
    from broker.subscriptions import SubscriptionRecord

    client = connect(url)
    record = SubscriptionRecord.from_json(sub_id, record_json, qm)
    subscriber = Subscriber(client, qm, record, Settings(redis_url=url, qm=qm))
    sent = array("q")
    latency = array("q")
    calls = 0
    conn.send("ready")
    cpu0 = time.process_time()
    idle_since = time.monotonic()
    try:
        while len(sent) < count and time.monotonic() - idle_since < idle_s:
            got = subscriber.receive_many(batch, timeout_ms=100)
            calls += 1
            if not got:
                continue
            stamps = [int(d.message.properties["sent_ns"]) for d in got]  # type: ignore[arg-type]
            subscriber.ack_many(got)
            acked = time.time_ns()
            sent.extend(stamps)
            latency.extend(acked - s for s in stamps)
            idle_since = time.monotonic()
    finally:
        subscriber.close()
    conn.send(
        {
            "sent_ns": sent.tobytes(),
            "latency_ns": latency.tobytes(),
            "calls": calls,
            "cpu_s": time.process_time() - cpu0,
        }
    )
    conn.close()


def run_e2e(
    client: redis.Redis,
    settings: Settings,
    topo: Topology,
    rate: float,
    duration_s: float,
    warmup_s: float = 0.25,
    workers: int = 2,
    batch: int = 100,
) -> dict[str, Any]:
    """End to end at a paced rate: publishers (``Publisher.publish``, one XADD each, ``sent_ns`` in
    a property; ``ceil(rate / E2E_RATE_PER_PUBLISHER)`` processes, each with its own publisher
    ids) -> ``workers`` workers -> one consumer process (``e2e_consumer``: ``receive_many(batch)``
    + ``ack_many`` on the subscription of ``bench/0/#``, which receives every publication).
    Latency = ack time - send time (the same machine clock); the first ``warmup_s`` of sends are
    left out of the percentiles.

    Returns:
        ``rate``, ``achieved_rate`` (publications sent / the slowest publisher's time),
        ``received``, ``p50_ms`` .. ``max_ms``, ``publisher_max_behind_ms``, ``publishers``,
        ``batch``, ``receive_calls``, ``consumer_cpu_us_per_msg``, ``cpu``.

    Raises:
        BenchError: the workers did not start, or fewer than 99% of the messages were acknowledged.
    """
    import math
    import multiprocessing
    from array import array

    from broker.subscriptions import read_subscriptions

    qm = topo.qm
    topo.restore(client)
    records = {r.sub_id: r for r in read_subscriptions(client, qm)[0]}
    record = records[LATENCY_SUB]
    count = int(rate * duration_s)
    n_pub = max(1, math.ceil(rate / E2E_RATE_PER_PUBLISHER))
    ids = publisher_ids()
    ctx = multiprocessing.get_context("spawn")
    pool = _pool(settings, workers)
    pool.start()
    procs: list[Any] = []
    try:
        wait_registered(client, qm, pool, workers)
        c_parent, c_child = ctx.Pipe()
        consumer = ctx.Process(
            target=e2e_consumer,
            args=(settings.redis_url, qm, record.sub_id, record.to_json(), count, batch, 5.0, c_child),
            name="bench-e2e-consumer",
        )
        consumer.start()
        procs.append(consumer)
        if not c_parent.poll(60) or c_parent.recv() != "ready":
            raise BenchError("e2e: the consumer did not start")
        pipes = []
        for i in range(n_pub):
            parent, child = ctx.Pipe()
            share = count // n_pub + (1 if i < count % n_pub else 0)
            proc = ctx.Process(
                target=e2e_publisher,
                args=(settings.redis_url, qm, rate / n_pub, share, ids[i::n_pub], child),
                name=f"bench-e2e-publisher-{i}",
            )
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        meter = CpuMeter(
            {
                "redis": [redis_pid(client)],
                "workers": _worker_pids(client, qm),
                "consumer": [consumer.pid or 0],
                "publishers": [p.pid or 0 for p in procs[1:]],
            }
        )
        for parent in pipes:
            parent.send("go")
        pub_infos = [parent.recv() if parent.poll(duration_s * 10 + 60) else {} for parent in pipes]
        got = c_parent.recv() if c_parent.poll(duration_s * 10 + 60) else {}
        cpu = meter.stop()
        for proc in procs:
            proc.join(10)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        pool.stop()
    sent_ns, lat_ns = array("q"), array("q")
    sent_ns.frombytes(got.get("sent_ns", b""))
    lat_ns.frombytes(got.get("latency_ns", b""))
    if len(lat_ns) < 0.99 * count:
        raise BenchError(f"e2e: only {len(lat_ns)} of {count} messages acknowledged")
    first_sent = min(sent_ns)
    lat_ms = sorted(
        lat / 1e6 for s, lat in zip(sent_ns, lat_ns, strict=True) if s - first_sent >= warmup_s * 1e9
    )
    slowest = max((i["elapsed_s"] for i in pub_infos if i), default=float("nan"))
    return {
        "rate": round(rate),
        "duration_s": duration_s,
        "publishers": n_pub,
        "batch": batch,
        "sent": sum(i.get("sent", 0) for i in pub_infos),
        "received": len(lat_ns),
        "measured": len(lat_ms),
        "achieved_rate": round(sum(i.get("sent", 0) for i in pub_infos) / slowest) if pub_infos else None,
        "publisher_max_behind_ms": max((i.get("max_behind_ms", 0) for i in pub_infos), default=None),
        "p50_ms": round(_percentile(lat_ms, 50), 3),
        "p90_ms": round(_percentile(lat_ms, 90), 3),
        "p99_ms": round(_percentile(lat_ms, 99), 3),
        "p999_ms": round(_percentile(lat_ms, 99.9), 3),
        "max_ms": round(lat_ms[-1], 3) if lat_ms else None,
        "receive_calls": got.get("calls"),
        "consumer_cpu_us_per_msg": round(got.get("cpu_s", 0) * 1e6 / max(1, len(lat_ns)), 2),
        "cpu": cpu,
    }


# --------------------------------------------------------------------------------------------
# 13. Federation: queue managers of one network on a local 3-master cluster
# --------------------------------------------------------------------------------------------

#: The federation rows' queue managers, each on a master of its own (``spread_names``): the
#: first is the hierarchy's root, the others its children.
FED_ROLES = ("FEDA", "FEDB", "FEDC")


@dataclass
class Federation:
    """A local 3-master cluster (in memory) with one queue manager per master, each with the
    benchmark's topology (``Topology``, built once, restored on each queue manager's master).

    Attributes:
        cluster: the ``LocalCluster``.
        qms: the queue managers (``FED_ROLES``), in network order.
        client: a cluster client (``redis+cluster://``).
        direct: qm -> a client of its master.
        topos: qm -> its topology.
    """

    cluster: Any
    qms: list[str]
    client: redis.Redis
    direct: dict[str, redis.Redis]
    topos: dict[str, Topology]

    @classmethod
    def start(cls, topology: Topology | None = None) -> Federation:
        """Start the cluster and give every queue manager the benchmark's topology: ``topology``'s
        (built on another server), or one built here on the first queue manager's master."""
        from broker.connection import connect
        from scripts.rig.cluster import LocalCluster, spread_names

        cluster = LocalCluster().start()
        try:
            qms = spread_names(cluster, FED_ROLES)
            direct = {
                qm: connect(f"redis://127.0.0.1:{cluster.owner(keys.publish_stream(qm))}/0") for qm in qms
            }
            first = topology or Topology.build(direct[qms[0]], qms[0])
            topos = {qm: first.for_qm(qm) for qm in qms}
            return cls(cluster, qms, connect(cluster.url), direct, topos)
        except BaseException:
            cluster.stop()
            raise

    def stop(self) -> None:
        for client in (self.client, *self.direct.values()):
            with contextlib.suppress(redis.RedisError):
                client.close()
        self.cluster.stop()

    def port(self, qm: str) -> int:
        return self.cluster.owner(keys.publish_stream(qm))

    def redis_pids(self) -> list[int]:
        return [s.process.pid for s in self.cluster.servers if s.process is not None]

    def node_cpu_s(self) -> dict[int, float]:
        """Master port -> its CPU so far, s (INFO CPU ``used_cpu_sys`` + ``used_cpu_user``)."""
        out = {}
        for port in self.cluster.ports:
            with redis.Redis(port=port) as node:
                info = node.info("cpu")
            out[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return out


def _channels_filed(fed: Federation, qms: Sequence[str]) -> dict[tuple[str, str], str] | None:
    """Each channel's last transmission entry id, or None when a receiver has not filed one of them."""
    lasts = {}
    for sender in qms:
        for to in qms:
            if to == sender:
                continue
            try:
                info = fed.direct[sender].xinfo_stream(keys.transmission(sender, to))
            except redis.ResponseError:  # no transmission stream yet
                continue
            last = info["last-generated-id"]
            last = last.decode() if isinstance(last, bytes) else str(last)
            filed = fed.direct[to].hget(keys.received(to), sender)
            if filed is None or _entry_ms_seq(filed.decode()) < _entry_ms_seq(last):
                return None
            lasts[(sender, to)] = last
    return lasts


def _entry_ms_seq(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _handled(fed: Federation, qms: Sequence[str]) -> tuple[int, bool]:
    """(entries the queue managers' workers handled, whether every group is caught up with nothing pending)."""
    total, idle = 0, True
    for qm in qms:
        state = group_state(fed.direct[qm], qm)
        total += state.acknowledged
        idle = idle and state.exists and state.pending == 0 and state.lag == 0
    return total, idle


@contextlib.contextmanager
def federated(
    fed: Federation, settings: Settings, k: int, timeout_s: float = 60.0
) -> Iterator[tuple[list[str], list[int]]]:
    """The first ``k`` queue managers restored and, for ``k`` > 1, in one network (the first the
    hierarchy's root, the others its children) with their channel processes running and every
    proxy subscription in place; yields the queue managers and the channel processes' pids.
    Channel processes stop at exit.

    Raises:
        BenchError: the proxy subscriptions were not in place within ``timeout_s``.
    """
    from broker.network import announce_key, parse_network
    from broker.network_admin import apply_network
    from worker.pool import Pool, run_channel

    qms = fed.qms[:k]
    for qm in fed.qms:
        fed.topos[qm].restore(fed.direct[qm])
    channels = []
    try:
        if k > 1:
            nodes: dict[str, dict[str, Any]] = {qms[0]: {}, **{qm: {"parent": qms[0]} for qm in qms[1:]}}
            apply_network(parse_network({"queue_managers": nodes}), fed.cluster.url, fed.client)
            for qm in qms:
                channel = settings.model_copy(
                    update={"redis_url": fed.cluster.url, "qm": qm, "concurrency": 1}
                )
                channels.append(Pool(channel, run_channel))
                channels[-1].start()
            roots = {announce_key(f, "root", "/") for f, _, _ in subscription_plan()}
            deadline = time.monotonic() + timeout_s
            for qm in qms:
                wanted = {f"{other} dynamic {root}" for other in qms if other != qm for root in roots}
                while not wanted <= {f.decode() for f in fed.direct[qm].hkeys(keys.proxies(qm))}:
                    if time.monotonic() > deadline:
                        raise BenchError(f"proxy subscriptions at {qm} not in place after {timeout_s:.0f} s")
                    time.sleep(POLL_S)
        yield qms, [p.pid for pool in channels for p in pool.children if p is not None and p.pid]
    finally:
        for pool in channels:
            pool.stop()


def run_federation(
    fed: Federation, settings: Settings, k: int, n: int, workers: int, chunk: int
) -> dict[str, Any]:
    """``k`` queue managers, each with ``n`` publications preloaded (publishers of its own) and a pool
    of ``workers``; time until every publication is delivered at every queue manager.

    With ``k`` > 1 each publication is forwarded to the others (every queue manager subscribes
    to every topic), so the workers of the network handle ``k x k x n`` entries (each
    publication once at each queue manager) and each queue manager's queues must end with
    ``k x n x FANOUT`` envelopes. The clock starts when every worker has registered and stops
    when every transmission stream is filed by its receiver and every group has nothing
    pending and no lag (checked twice around). pubs/s = publications (origin ones) per second
    = handled entries / ``k`` / elapsed, what was handled before the clock started left out.

    Returns:
        Figures: pubs/s, deliveries/s (network-wide), entries handled/s, CPU, and each master's
        Redis CPU-us per publication (``INFO CPU``).

    Raises:
        BenchError: the drain stalled, a process died, or deliveries are missing.
    """
    with federated(fed, settings, k) as (qms, channel_pids):
        loaded = {
            qm: preload(
                fed.direct[qm], qm, n, False, chunk, topics=fed.topos[qm].topics, prefix=f"{qm.lower()}p"
            )
            for qm in qms
        }
        pools = {}
        t_spawn = time.perf_counter()
        try:
            for qm in qms:
                pools[qm] = _pool(
                    settings.model_copy(update={"redis_url": fed.cluster.url, "qm": qm}), workers
                )
                pools[qm].start()
            t0: float | None = None
            handled0 = 0
            meter: CpuMeter | None = None
            cpu0: dict[int, float] = {}
            last, last_change = -1, time.monotonic()
            while True:
                now = time.perf_counter()
                handled, idle = _handled(fed, qms)
                if t0 is None and all(fed.direct[qm].hlen(keys.workers(qm)) >= workers for qm in qms):
                    t0, handled0, cpu0 = now, handled, fed.node_cpu_s()
                    meter = CpuMeter(
                        {
                            "redis": fed.redis_pids(),
                            "workers": [p for qm in qms for p in _worker_pids(fed.direct[qm], qm)],
                            "channels": channel_pids,
                            "bench": [os.getpid()],
                        }
                    )
                if idle and handled == k * k * n:
                    filed = _channels_filed(fed, qms)
                    if filed is not None and _handled(fed, qms)[1] and _channels_filed(fed, qms) == filed:
                        t_end = time.perf_counter()
                        break
                if handled != last:
                    last, last_change = handled, time.monotonic()
                elif time.monotonic() - last_change > STALL_S:
                    raise BenchError(f"no progress for {STALL_S:.0f} s at {handled}/{k * k * n} handled")
                if any(pool.alive() < workers for pool in pools.values()):
                    raise BenchError("a worker process died during the run")
                time.sleep(POLL_S)
            cpu = meter.stop() if meter else {}
            cpu1 = fed.node_cpu_s()
        finally:
            for pool in pools.values():
                pool.stop()
        if t0 is None:
            t0, handled0, cpu0 = t_spawn, 0, cpu1
        elapsed = t_end - t0
        measured = (k * k * n - handled0) / k  # publications' worth of entries handled on the clock
        delivered = {qm: _queue_total(fed.direct[qm], fed.topos[qm].queues) for qm in qms}
        dead = sum(fed.direct[qm].xlen(keys.dead_letter(qm)) for qm in qms)
        hosts = {fed.port(qm): qm for qm in qms}
        nodes = [
            {
                "port": port,
                "qm": hosts.get(port, "-"),
                "cpu_us_per_pub": round((cpu1[port] - cpu0[port]) * 1e6 / measured, 2),
            }
            for port in fed.cluster.ports
        ]
        result = {
            "qms": k,
            "n_per_qm": n,
            "workers_per_qm": workers,
            "elapsed_s": round(elapsed, 3),
            "pubs_per_s": round(measured / elapsed),
            "entries_per_s": round(measured * k / elapsed),
            "deliveries_per_s": round(measured * k * FANOUT / elapsed),
            "from_spawn_pubs_per_s": round(k * n / (t_end - t_spawn)),
            "preload_xadd_per_s": round(statistics.median(x["xadd_per_s"] for x in loaded.values())),
            "delivered": delivered,
            "fanout_measured": round(sum(delivered.values()) / (k * n), 3),
            "dead_lettered": dead,
            "cpu": cpu,
            "redis_cpu_us_per_pub": round(sum(x["cpu_us_per_pub"] for x in nodes), 2),
            "nodes": nodes,
        }
        for name in ("workers", "channels"):  # Python CPU per publication, all queue managers together
            result[f"{name}_cpu_us_per_pub"] = round(cpu.get(name, 0.0) / 100 * elapsed * 1e6 / measured, 1)
        if any(v != k * n * FANOUT for v in delivered.values()) or dead:
            raise BenchError(f"expected {k * n * FANOUT} deliveries at each queue manager: {result}")
        return result


def run_federation_latency(
    fed: Federation, settings: Settings, rate: float, duration_s: float, warmup_s: float = 0.25
) -> dict[str, Any]:
    """Two queue managers (root and child), one worker each: publish at ``rate``/s at the root and time
    each publication from its XADD to its arrival in the child's queue of ``bench/0/#``
    (``measure_latency``): worker at the root -> transmission stream -> channel -> the child's
    publish stream -> worker at the child -> its queue.

    Raises:
        BenchError: the network did not come up, or fewer than 99% of the messages came back.
    """
    with federated(fed, settings, 2) as ((origin, dest), channel_pids):
        pools = []
        try:
            for qm in (origin, dest):
                pools.append(_pool(settings.model_copy(update={"redis_url": fed.cluster.url, "qm": qm}), 1))
                pools[-1].start()
                wait_registered(fed.direct[qm], qm, pools[-1], 1)
            workers = [p for qm in (origin, dest) for p in _worker_pids(fed.direct[qm], qm)]
            result = measure_latency(
                fed.cluster.url,
                origin,
                f"redis://127.0.0.1:{fed.port(dest)}/0",
                keys.sub_queue(dest, LATENCY_SUB),
                rate,
                duration_s,
                warmup_s,
                {"redis": fed.redis_pids(), "workers": workers, "channels": channel_pids},
            )
        finally:
            for pool in pools:
                pool.stop()
    return result | {"origin": origin, "destination": dest}


# --------------------------------------------------------------------------------------------
# AOF everysec (the broker's row like RabbitMQ's persistent messages) and memory per waiting message
# --------------------------------------------------------------------------------------------


def set_aof(client: redis.Redis, on: bool, timeout_s: float = 60.0) -> dict[str, Any]:
    """Turn the server's AOF on (``appendonly yes``, ``appendfsync everysec``) or off, at run time.

    Turning it on starts a rewrite of the data set into a new AOF: this waits until it is done
    (``aof_rewrite_in_progress`` and ``aof_rewrite_scheduled`` 0), so that the run measures
    appending, not the first rewrite.

    Returns:
        The server's ``appendonly``, ``appendfsync`` and ``aof_enabled`` afterwards.

    Raises:
        BenchError: the first rewrite did not finish within ``timeout_s``, or the setting did not take.
    """
    if on:
        client.config_set("appendfsync", "everysec")
    client.config_set("appendonly", "yes" if on else "no")
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        busy = info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
        if int(info.get("aof_enabled", 0)) == int(on) and not busy:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"AOF {'on' if on else 'off'}: not settled after {timeout_s:.0f} s: {info}")
        time.sleep(POLL_S)
    config = client.config_get("append*")
    return {
        "appendonly": config.get("appendonly"),
        "appendfsync": config.get("appendfsync"),
        "aof_enabled": int(info.get("aof_enabled", 0)),
    }


def run_broker_aof(
    client: redis.Redis, settings: Settings, topo: Topology, n: int, chunk: int
) -> dict[str, Any]:
    """``run_broker`` with 2 workers while the server appends to its AOF (``appendfsync everysec``);
    the AOF is turned off again afterwards, whatever happens."""
    aof = set_aof(client, True)
    try:
        result = run_broker(client, settings, topo, n, 2, False, chunk)
    finally:
        set_aof(client, False)
    return result | {"aof": aof}


def _used_memory(client: redis.Redis, timeout_s: float = 30.0) -> int:
    """INFO ``used_memory``, bytes, once nothing is waiting to be freed lazily (``lazyfree_pending_objects``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("memory")
        if not int(info.get("lazyfree_pending_objects", 0)) or time.monotonic() > deadline:
            return int(info["used_memory"])
        time.sleep(POLL_S)


def _memory_usage(client: redis.Redis, names: Sequence[str]) -> int:
    """The sum of ``MEMORY USAGE <key> SAMPLES 0`` (every element counted), bytes."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.execute_command("MEMORY", "USAGE", name, "SAMPLES", 0)
    return sum(int(x or 0) for x in pipe.execute())


def run_memory(
    client: redis.Redis, settings: Settings, topo: Topology, k_single: int, k_fanout: int, chunk: int
) -> dict[str, Any]:
    """Bytes of Redis memory per waiting message (200-byte bodies), two ways.

    * one queue: ``k_single`` envelopes as a worker writes them (``preload_queue``) LPUSHed into
      one subscriber queue: (``used_memory`` after - before) / ``k_single``, and the queue's own
      ``MEMORY USAGE`` / ``k_single``; the envelope's mean length is reported too.
    * fan-out: ``k_fanout`` publications through the broker (``run_broker``, 2 workers) into the
      benchmark's topology, so ``k_fanout x FANOUT`` queue elements wait: (``used_memory`` after -
      before) / elements (everything the run left: queue elements, the publish stream's entries,
      dedup records), the queues' ``MEMORY USAGE`` / elements, the envelopes' mean length (a
      sample), and the publish stream's and the rest's bytes per publication.

    ``before`` is taken right after the topology is restored. The database is flushed at the end.

    Raises:
        BenchError: the broker run failed (``run_broker``).
    """
    qm = topo.qm
    out: dict[str, Any] = {"body_bytes": BODY_BYTES}
    try:
        topo.restore(client)
        queue = keys.sub_queue(qm, "hash$r3")
        before = _used_memory(client)
        preload_queue(client, queue, k_single)
        after = _used_memory(client)
        sample = client.lrange(queue, 0, 999)
        out["single"] = {
            "k": k_single,
            "bytes_per_msg": round((after - before) / k_single, 1),
            "key_bytes_per_msg": round(_memory_usage(client, [queue]) / k_single, 1),
            "envelope_bytes": round(sum(len(x) for x in sample) / max(len(sample), 1), 1),
        }
        topo.restore(client)
        before = _used_memory(client)
        run = run_broker(client, settings, topo, k_fanout, 2, False, chunk)
        after = _used_memory(client)
        elements = run["deliveries"]
        queues = _memory_usage(client, topo.queues)
        stream = _memory_usage(client, [keys.publish_stream(qm)])
        sample = [x for q in topo.queues[::50] for x in client.lrange(q, 0, 19)]
        out["fanout"] = {
            "k": k_fanout,
            "elements": elements,
            "bytes_per_element": round((after - before) / elements, 1),
            "queue_bytes_per_element": round(queues / elements, 1),
            "envelope_bytes": round(sum(len(x) for x in sample) / max(len(sample), 1), 1),
            "elements_per_queue": round(elements / len(topo.queues), 1),
            "stream_bytes_per_pub": round(stream / k_fanout, 1),
            "other_bytes_per_pub": round((after - before - queues - stream) / k_fanout, 1),
            "pubs_per_s": run["pubs_per_s"],
        }
    finally:
        client.flushdb()
    out["target_bytes"] = BODY_BYTES + 150
    return out
