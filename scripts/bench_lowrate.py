"""Script calls per publication at a low, paced rate (issue 25): prints figures, not a timed test.

Runs a pool of worker processes (``worker.pool.Pool``, 2 by default) against a running server,
publishes at ``--rate`` publications/s for ``--duration-s`` seconds, one ``Publisher`` per
publisher id (``--publishers`` ids, round-robin), and prints, per publication:

- script calls: EVALSHA + EVAL + FCALL calls from ``INFO commandstats``, diffed over the run
  (the publishers send none: their XADDs are plain commands);
- XREAD, BLPOP, XADD and all other commands (the consumer's BRPOP and this script's own
  INFO calls included);
- latency from ``XADD`` (the publisher's clock before the call) to the subscriber queue (a
  ``BRPOP`` on the subscription's queue in a thread of its own), p50 and p99 in ms.

    broker server --port 7307 --dir /tmp/7307-data &
    PYTHONPATH=$PWD python -m scripts.bench_lowrate --redis-url redis://127.0.0.1:7307/0

Its queue manager (``--qm``, default ``LOWRATE``) is reset first.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

QM = "LOWRATE"


def _stats(client: Any) -> dict[str, int]:
    raw = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in raw.items()}


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(
    url: str, qm: str, rate: float, duration_s: float, publishers: int, concurrency: int
) -> dict[str, Any]:
    """Measure one run (see the module text); returns the figures printed."""
    from broker.clients.publish import Publisher
    from broker.core import keys
    from broker.core.config import Settings
    from broker.core.connection import connect
    from broker.core.models import decode_header
    from broker.operations.maintenance import reset
    from broker.topics.subscriptions import subscribe
    from worker.pool import Pool

    client = connect(url)
    reset(client, qm)
    record = subscribe(client, qm, "bench/#", "bench", "low")
    queue = keys.sub_queue(qm, record.sub_id)
    settings = Settings(redis_url=url, qm=qm, concurrency=concurrency)
    pool = Pool(settings, daemon=True, serve_metrics=False)
    pool.start()
    sent: dict[str, float] = {}
    latencies: list[float] = []
    total = int(rate * duration_s)
    done = threading.Event()

    def consume() -> None:
        reader = connect(url)
        while len(latencies) < total and not done.is_set():
            got = reader.brpop([queue], timeout=1)
            if got is None:
                continue
            msgid = decode_header(got[1]).get("msgid")
            started = sent.get(msgid)
            if started is not None:
                latencies.append((time.perf_counter() - started) * 1000)

    try:
        # warm up: every worker started, a few publications handled
        warm = Publisher(client, qm, "warm-up")
        for _ in range(5):
            warm.publish("bench/warm", b"w", wait=True)
        time.sleep(1.0)
        client.delete(queue)
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        pubs = [Publisher(client, qm, f"p{i}") for i in range(publishers)]
        before = _stats(client)
        start = time.perf_counter()
        for n in range(total):
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            msgid = f"m{n}"
            sent[msgid] = time.perf_counter()
            pubs[n % publishers].publish(f"bench/{n % publishers}", b"x" * 100, msgid=msgid)
        elapsed = time.perf_counter() - start
        reader.join(timeout=10)
        after = _stats(client)
    finally:
        done.set()
        pool.stop()
    diff = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    scripts = sum(diff.get(name, 0) for name in ("evalsha", "eval", "fcall", "evalsha_ro", "fcall_ro"))
    count = len(latencies)
    per = {
        name: round(calls / total, 3) for name, calls in sorted(diff.items(), key=lambda x: -x[1]) if calls
    }
    return {
        "published": total,
        "rate_per_s": round(total / elapsed, 1),
        "delivered": count,
        "script_calls_per_publication": round(scripts / total, 3),
        "xread_per_publication": round(diff.get("xread", 0) / total, 3),
        "commands_per_publication": per,
        "latency_p50_ms": round(_percentile(latencies, 0.50), 2),
        "latency_p99_ms": round(_percentile(latencies, 0.99), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:7307/0")
    parser.add_argument("--qm", default=QM)
    parser.add_argument("--rate", type=float, default=200.0, help="publications per second")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--publishers", type=int, default=4, help="publisher ids")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    figures = run(args.redis_url, args.qm, args.rate, args.duration_s, args.publishers, args.concurrency)
    for name, value in figures.items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
