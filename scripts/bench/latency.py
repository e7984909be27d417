"""Row 4, latency at a paced rate: paced publisher processes, one consumer popping the latency queue, percentiles."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from scripts.bench.base import Ctx, Figures, Measurement, Row, cpu3, fmt, percentiles
from scripts.bench.cpu import CpuMeter, commandstats, redis_pid
from scripts.bench.pool import _pool, _worker_pids, wait_registered
from scripts.bench.preload import publisher_ids
from scripts.bench.topology import Topology
from scripts.bench.workload import FANOUT, LATENCY_SUB, LATENCY_TOPICS, BenchError, bodies


def latency_publisher(url: str, qm: str, rate: float, count: int, conn: Any) -> None:
    """Child process: publish ``count`` publications at ``rate``/s on an absolute schedule.

    One ``Publisher.publish`` (one XADD) per publication, rotating over 50 publisher
    ids and the 100 topics of region 0; the send time (``time.time_ns()`` taken
    just before the publish call) travels as the property ``sent_ns``.
    Sends ``{"sent", "elapsed_s", "max_behind_ms", "late"}`` on ``conn`` at the end.
    """
    from broker.core.connection import connect

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


def _finish(ctx: Ctx) -> None:
    a = ctx.args
    ctx.idle("latency")
    ctx.log(f"4. latency: paced {a.rate:,.0f}/s for {a.latency_s:.0f} s, 2 workers")
    got = ctx.attempt("latency", run_latency, ctx.client, ctx.settings, ctx.topo, a.rate, a.latency_s)
    if got:
        ctx.figures["latency"] = got


def _rows(f: Figures) -> list[Row]:
    if "latency" not in f:
        return []
    lat = f["latency"]
    return [
        Row(
            "4. latency 2 workers",
            fmt(lat["achieved_rate"]),
            fmt((lat["achieved_rate"] or 0) * FANOUT),
            f"paced {lat['rate']:,.0f}/s for {lat['duration_s']:.0f} s, XADD -> BRPOP: {percentiles(lat)}; "
            f"publisher at most {lat['publisher_max_behind_ms']} ms behind its schedule",
            cpu3(lat["cpu"], ("workers", "bench", "publisher")),
        )
    ]


MEASUREMENT = Measurement("latency", topology=True, finish=_finish, rows=_rows)
