"""Row 5, the peer: kombu's topic exchange on the same Redis."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import redis

from scripts.bench.base import Ctx, Figures, Measurement, Row, cpu3, fmt
from scripts.bench.cpu import CpuMeter, redis_pid
from scripts.bench.workload import FANOUT, PUBLISHERS, BenchError, bodies


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


def _finish(ctx: Ctx) -> None:
    assert ctx.server is not None
    ctx.idle("kombu")
    ctx.log(f"5. kombu topic exchange, N={ctx.args.kombu_n:,}")
    got = ctx.attempt("kombu", run_kombu, ctx.client, ctx.server.url, ctx.args.kombu_n)
    if got:
        ctx.figures["kombu"] = got


def _rows(f: Figures) -> list[Row]:
    if "kombu" not in f:
        return []
    k = f["kombu"]
    return [
        Row(
            "5. kombu publish",
            fmt(k["pubs_per_s"]),
            fmt(k["published_deliveries_per_s"]),
            f"topic exchange, 10 queues bound t.#, sequential Producer.publish, N={k['n']:,}",
            cpu3(k["cpu_publish"], ("bench",)),
        ),
        Row(
            "5. kombu consume",
            "-",
            fmt(k["consumed_deliveries_per_s"]),
            f"1 Consumer on the 10 queues, ack each, {k['n'] * FANOUT:,} messages",
            cpu3(k["cpu_consume"], ("bench",)),
        ),
    ]


MEASUREMENT = Measurement("kombu", finish=_finish, rows=_rows)
