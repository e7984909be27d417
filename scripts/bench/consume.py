"""Row 8, one consumer: receive_many + ack_many against receive + ack."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.topics.subscriptions import subscribe
from scripts.bench.base import QM, Ctx, Figures, Measurement, Row, cpu3, fmt
from scripts.bench.cpu import CpuMeter, commandstats, redis_pid
from scripts.bench.preload import preload_queue
from scripts.bench.workload import BenchError

#: The topic filter of the consumer measurement's subscriptions (nothing is published to it).
CONSUME_FILTER = "bench/consume"


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
    directly with ``preload_queue`` (untimed), and a ``broker.clients.consumer.Subscriber`` with its
    default heartbeat thread. Afterwards the queue and the in-flight list must be empty.
    Keys: ``msgs_per_s`` (batch), ``large_msgs_per_s``, ``read_msgs_per_s``,
    ``single_msgs_per_s``, each with its CPU and Redis commands under the same prefix.

    Raises:
        BenchError: a message was not received or not acknowledged.
    """
    from broker.clients.consumer import Subscriber
    from broker.core.connection import connect

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


def _finish(ctx: Ctx) -> None:
    n = ctx.args.n
    single_n = max(1000, n // 5)
    ctx.idle("consume")
    ctx.log(
        f"8. one consumer: receive_many(100) + ack_many of {n:,}, the same with receive_many(1000), "
        f"and reading each message; receive + ack of {single_n:,}"
    )
    got = ctx.attempt("consume", run_consume, ctx.client, ctx.settings, QM, n, single_n)
    if got:
        ctx.figures["consume"] = got
        ctx.log(
            f"   {got['msgs_per_s']:,} msgs/s batched, {got['large_msgs_per_s']:,} by 1000, "
            f"{got['read_msgs_per_s']:,} read, {got['single_msgs_per_s']:,} one at a time"
        )


def _rows(f: Figures) -> list[Row]:
    if "consume" not in f:
        return []
    c = f["consume"]
    rows = [
        Row(
            "8. consume batched",
            "-",
            fmt(c["msgs_per_s"]),
            f"1 Subscriber (in the bench process): receive_many({c['batch']}) + ack_many, "
            f"{c['n']:,} preloaded messages; {c['batch_over_single']:.1f}x one at a time; "
            f"python {c.get('bench_cpu_us_per_msg', '-')}, redis {c['redis_cpu_us_per_msg']} CPU-us/msg",
            cpu3(c["cpu"], ("bench",)),
        )
    ]
    if "large_msgs_per_s" in c:
        rows.append(
            Row(
                "8. consume batched 1000",
                "-",
                fmt(c["large_msgs_per_s"]),
                f"same, receive_many({c['large_batch']}) + ack_many; "
                f"python {c['large_bench_cpu_us_per_msg']}, redis {c['large_redis_cpu_us_per_msg']} CPU-us/msg",
                cpu3(c["large_cpu"], ("bench",)),
            )
        )
        rows.append(
            Row(
                "8. consume batched, read",
                "-",
                fmt(c["read_msgs_per_s"]),
                f"same, receive_many({c['batch']}), every message read (decoded) + ack_many; "
                f"python {c['read_bench_cpu_us_per_msg']}, redis {c['read_redis_cpu_us_per_msg']} CPU-us/msg",
                cpu3(c["read_cpu"], ("bench",)),
            )
        )
    rows.append(
        Row(
            "8. consume one by one",
            "-",
            fmt(c["single_msgs_per_s"]),
            f"same, receive() + ack(), {c['single_n']:,} messages; "
            f"redis {c['single_redis_cpu_us_per_msg']} CPU-us/msg",
            cpu3(c["single_cpu"], ("bench",)),
        )
    )
    return rows


MEASUREMENT = Measurement("consume", finish=_finish, rows=_rows)
