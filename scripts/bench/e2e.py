"""Row 20, end to end: paced publishers -> 2 workers -> one consumer process that acknowledges."""

from __future__ import annotations

import time
from typing import Any

import redis

from broker.clients.publish import Publisher
from broker.core.config import Settings
from scripts.bench.base import Ctx, Figures, Measurement, Row, cpu3, fmt, percentiles
from scripts.bench.cpu import CpuMeter, redis_pid
from scripts.bench.latency import _paced, _percentile
from scripts.bench.pool import _pool, _worker_pids, run_broker, wait_registered
from scripts.bench.preload import publisher_ids
from scripts.bench.topology import Topology
from scripts.bench.workload import LATENCY_SUB, BenchError

#: Most publications/s one paced publisher process is given in the end-to-end run (16.).
E2E_RATE_PER_PUBLISHER = 6_000.0


def e2e_publisher(url: str, qm: str, rate: float, count: int, pids: list[str], conn: Any) -> None:
    """Child process of 16.: ``latency_publisher``'s schedule, on its own publisher ids ``pids``
    (each id's sequence belongs to one process). Sends the same summary on ``conn``."""
    from broker.core.connection import connect

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

    from broker.clients.consumer import Subscriber
    from broker.core.config import Settings
    from broker.core.connection import connect
    from broker.topics.subscriptions import SubscriptionRecord

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

    from broker.topics.subscriptions import read_subscriptions

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


def _finish(ctx: Ctx) -> None:
    """20. End to end at ``--rate`` and at 80% of the saturated 2-worker rate."""
    a = ctx.args
    saturated = a.e2e_saturated or ctx.figures.get("broker_2w", {}).get("pubs_per_s")
    if not saturated:
        ctx.idle("e2e saturation")
        ctx.log(f"20. end to end: the saturated rate first (2 workers, N={a.n:,})")
        got = ctx.attempt(
            "e2e_saturation", run_broker, ctx.client, ctx.settings, ctx.topo, a.n, 2, False, a.interleave
        )
        saturated = got and got["pubs_per_s"]
    if not saturated:
        return
    ctx.figures["e2e_saturated"] = saturated
    for key, rate in (("e2e", a.rate), ("e2e_80pct", 0.8 * saturated)):
        ctx.idle(key)
        ctx.log(f"20. end to end: paced {rate:,.0f}/s for {a.latency_s:.0f} s, 2 workers, 1 consumer process")
        got = ctx.attempt(key, run_e2e, ctx.client, ctx.settings, ctx.topo, rate, a.latency_s)
        if got:
            ctx.figures[key] = got
            ctx.log(f"   p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms, achieved {got['achieved_rate']:,}/s")


def _rows(f: Figures) -> list[Row]:
    rows = []
    for key, label in (("e2e", "20. e2e"), ("e2e_80pct", "20. e2e 80% sat.")):
        if key in f:
            e = f[key]
            rows.append(
                Row(
                    label,
                    fmt(e["achieved_rate"]),
                    "-",
                    f"paced {e['rate']:,}/s ({e['publishers']} publisher processes) for {e['duration_s']:.0f} s, "
                    f"XADD -> 2 workers -> receive_many({e['batch']}) + ack_many in 1 consumer process: "
                    f"{percentiles(e)}; consumer {e['consumer_cpu_us_per_msg']} CPU-us/msg",
                    cpu3(e["cpu"], ("workers", "consumer", "publishers")),
                )
            )
    return rows


def e2e_text(f: Figures) -> str:
    """20.'s figures, printed before the last line."""
    if "e2e" not in f and "e2e_80pct" not in f:
        return ""
    nan = float("nan")
    return (
        f"20. end to end (publish -> 2 workers -> consumer ack), saturated {f.get('e2e_saturated', nan):,} pubs/s: "
        f"e2e_p99_ms={f.get('e2e', {}).get('p99_ms', nan)} "
        f"e2e_p99_80pct_ms={f.get('e2e_80pct', {}).get('p99_ms', nan)}"
    )


MEASUREMENT = Measurement("e2e", topology=True, finish=_finish, rows=_rows)
