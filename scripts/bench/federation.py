"""Row 13, federation: queue managers on the masters of a local cluster, channels forwarding between them, throughput and forwarded latency."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.core.stream import group_state
from scripts.bench.base import Ctx, Figures, Measurement, Row, cpu3, fmt, percentiles, ratios
from scripts.bench.cpu import CpuMeter
from scripts.bench.latency import measure_latency
from scripts.bench.pool import _pool, _queue_total, _worker_pids, wait_registered
from scripts.bench.preload import preload
from scripts.bench.topology import Topology
from scripts.bench.workload import FANOUT, LATENCY_SUB, POLL_S, STALL_S, BenchError, subscription_plan

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
        from broker.core.connection import connect
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
    from broker.network.network_admin import apply_network
    from broker.topics.topology import announce_key, parse_network
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


# --------------------------------------------------------------------------------------------
# Row 13 in the bench's registry
# --------------------------------------------------------------------------------------------

#: Queue managers in the federation runs (13.).
FED_SIZES = (1, 2, 3)


def _setup(ctx: Ctx) -> None:
    ctx.log("13. federation: a local 3-master cluster, the workload on one queue manager per master ...")
    started = time.perf_counter()
    fed = Federation.start(ctx.topo)  # the shared topology
    ctx.state["fed"] = fed
    ctx.closers.append(fed.stop)
    ctx.figures["federation_setup"] = {
        "queue_managers": {qm: fed.port(qm) for qm in fed.qms},
        "masters": fed.cluster.ports,
        "setup_s": round(time.perf_counter() - started, 1),
    }


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    a = ctx.args
    for k in FED_SIZES:
        ctx.idle(f"federation {k}")
        ctx.log(
            f"13. federation, {k} queue manager(s), {a.fed_workers} worker(s) each, N={a.fed_n:,} each{tag}"
        )
        got = ctx.attempt(
            f"fed_{k}qm",
            run_federation,
            ctx.state["fed"],
            ctx.settings,
            k,
            a.fed_n,
            a.fed_workers,
            a.interleave,
        )
        ctx.keep(
            f"fed_{k}qm",
            got,
            got and f"   {got['pubs_per_s']:,} pubs/s ({got['entries_per_s']:,} entries/s handled)",
        )


def _finish(ctx: Ctx) -> None:
    a, runs = ctx.args, ctx.runs
    ctx.figures["federation_ratios"] = {
        f"{k}qm": ratios(runs["fed_1qm"], runs[f"fed_{k}qm"]) for k in FED_SIZES[1:]
    }
    ctx.idle("federation latency")
    ctx.log(f"13. forwarded latency: paced {a.fed_rate:,.0f}/s for {a.latency_s:.0f} s, 2 queue managers")
    got = ctx.attempt(
        "fed_latency", run_federation_latency, ctx.state["fed"], ctx.settings, a.fed_rate, a.latency_s
    )
    if got:
        ctx.figures["fed_latency"] = got


def _rows(f: Figures) -> list[Row]:
    rows = []
    for k in FED_SIZES:
        b = f.get(f"fed_{k}qm")
        if not b:
            continue
        rs = f.get("federation_ratios", {}).get(f"{k}qm") or []
        ratio = (
            f"; {k} QMs / 1 QM {statistics.median(rs):.2f} (per repeat {', '.join(map(str, rs))})"
            if rs
            else ""
        )
        nodes = ", ".join(f"{n['qm']} {n['cpu_us_per_pub']}" for n in b["nodes"])
        rows.append(
            Row(
                f"13. federation {k} QM" + ("s" if k > 1 else ""),
                fmt(b["pubs_per_s"]),
                fmt(b["deliveries_per_s"]),
                f"{k} of the 3 masters, {b['workers_per_qm']} worker(s) each"
                + (", one network (hierarchy), channel processes" if k > 1 else "")
                + f"; N={b['n_per_qm']:,} each; {fmt(b['entries_per_s'])} entries/s handled; "
                f"F={b['fanout_measured']} network-wide{ratio}; "
                f"redis CPU-us/pub per master {nodes}; workers {b['workers_cpu_us_per_pub']}, "
                f"channels {b['channels_cpu_us_per_pub']} CPU-us/pub",
                cpu3(b["cpu"], ("workers", "channels", "bench")),
            )
        )
    if "fed_latency" in f:
        lat = f["fed_latency"]
        rows.append(
            Row(
                "13. forwarded latency",
                fmt(lat["achieved_rate"]),
                "-",
                f"{lat['origin']} -> {lat['destination']}, paced {lat['rate']:,.0f}/s for {lat['duration_s']:.0f} s, "
                f"XADD -> worker -> channel -> worker -> BRPOP: {percentiles(lat)}",
                cpu3(lat["cpu"], ("workers", "channels", "bench", "publisher")),
            )
        )
    return rows


def federation_summary(f: Figures) -> dict[str, Any]:
    """The federation figures (13.): pubs/s and Redis CPU-us per publication (all masters) with
    1, 2 and 3 queue managers, the median ratios to 1, the forwarded latency."""
    nan = float("nan")
    out: dict[str, Any] = {}
    for k in FED_SIZES:
        run = f.get(f"fed_{k}qm", {})
        out[f"federation_{k}qm_pubs_per_s"] = run.get("pubs_per_s", nan)
        out[f"federation_{k}qm_redis_cpu_us_per_pub"] = run.get("redis_cpu_us_per_pub", nan)
        rs = f.get("federation_ratios", {}).get(f"{k}qm")
        if k > 1:
            out[f"federation_{k}qm_ratio"] = statistics.median(rs) if rs else nan
    out["federation_latency_p50_ms"] = f.get("fed_latency", {}).get("p50_ms", nan)
    out["federation_latency_p99_ms"] = f.get("fed_latency", {}).get("p99_ms", nan)
    return out


def federation_text(f: Figures) -> str:
    """Per master and per process kind, CPU-us per publication in each federation run, and the summary."""
    lines = []
    for k in FED_SIZES:
        b = f.get(f"fed_{k}qm")
        if not b:
            continue
        nodes = ", ".join(f"{n['qm']}@{n['port']} {n['cpu_us_per_pub']}" for n in b["nodes"])
        lines.append(
            f"  {k} queue manager(s): redis per master {nodes} (sum {b['redis_cpu_us_per_pub']}); "
            f"workers {b['workers_cpu_us_per_pub']}, channel processes {b['channels_cpu_us_per_pub']}"
        )
    if not lines:
        return ""
    summary = " ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in federation_summary(f).items()
    )
    return (
        "Federation CPU-us per publication (a publication is handled once at every queue manager; "
        "channel_in at each receiver, the transmission stream at each sender):\n"
        + "\n".join(lines)
        + f"\n{summary}"
    )


MEASUREMENT = Measurement(
    "federation",
    runs=tuple(f"fed_{k}qm" for k in FED_SIZES),
    setup=_setup,
    repeat=_repeat,
    finish=_finish,
    rows=_rows,
)
