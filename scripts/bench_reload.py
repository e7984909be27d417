"""Publication latency under subscription churn: the routing table applied incrementally or reloaded whole.

Issue 24, bug 7: with 3,000 subscriptions and 200 subscription changes/s, a worker that
reloads its whole routing table on every change spends most of its time loading. This
script prints figures (it is not a timed test):

* the time of a first load of the table, of a whole reload (nothing changed) and of one
  incremental apply (``RoutingTable.refresh`` after one subscription change), medians, ms;
* p50/p99/max publication latency, ms (XADD -> result: ``Publisher.publish(wait=True)``,
  the worker's unit of work and the reply; and the p99 from each publication's scheduled
  send time, which also counts the time a publisher fell behind its pace),
  without churn and with ~``--churn`` subscription changes/s made by another thread, for
  both modes: ``incremental`` (the worker applies logged changes alone) and ``full`` (the
  worker's table has ``incremental = False``: a whole reload on every version change, the
  behaviour before the change log).

The machine is shared and noisy: the modes alternate in every round and the ratios
between them are what to read. Usage (from the worktree)::

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_reload.py [--rounds 3] [--seconds 5]

Run it as a file (not ``-m``): the worker processes (spawned) import it by path, so it
also runs against another checkout's ``broker`` package (``PYTHONPATH=/other/tree``),
where only ``full`` exists when that tree has no ``RoutingTable.refresh``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import threading
import time
from typing import Any

import redis

from broker import Publisher, subscribe
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.server import Server
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import unsubscribe
from worker.loop import Worker

QM = "BENCH"
ROWS, COLUMNS = 50, 20  # published topics t/<row>/<column>
WARMUP_S = 0.5  # publications in the first half second are not counted


def _filter(rng: random.Random) -> str:
    row, column = rng.randrange(ROWS), rng.randrange(COLUMNS)
    draw = rng.random()
    if draw < 0.80:
        return f"t/{row}/{column}"
    if draw < 0.90:
        return f"t/{row}/+"
    if draw < 0.95:
        return f"t/+/{column}"
    return f"t/{row}/#"


def populate(client: redis.Redis, count: int, seed: int = 1) -> None:
    """``count`` durable subscriptions ``c<k % 50>$s<k>`` (80% exact filters, 20% wildcards)."""
    rng = random.Random(seed)
    for k in range(count):
        subscribe(client, QM, _filter(rng), f"c{k % 50}", f"s{k}")


def run_worker(url: str, incremental: bool, stop: Any, stats: Any) -> None:
    """One worker process: loop until ``stop`` is set; put its refresh counts on ``stats``."""
    client = connect(url)
    worker = Worker(
        client, Settings(redis_url=url, qm=QM), name=f"bench-{multiprocessing.current_process().pid}"
    )
    worker.table.incremental = incremental
    counts = {"full": 0, "incremental": 0}
    table = worker.table
    original_load = table.load

    def load(c: redis.Redis) -> None:
        counts["full"] += 1
        original_load(c)

    table.load = load  # type: ignore[method-assign]
    if hasattr(table, "refresh"):
        original_refresh = table.refresh

        def refresh(c: redis.Redis) -> bool:
            applied = original_refresh(c)
            counts["incremental"] += int(applied)
            return applied

        table.refresh = refresh  # type: ignore[method-assign]
    worker.setup()
    while not stop.is_set():
        worker.run_once(block=True)
    worker.stopping = True
    stats.put(counts)


def churn(url: str, rate: float, stop: Any, done: Any) -> None:
    """Make ``rate`` subscription changes/s (a subscribe, then an unsubscribe of the oldest made here),
    in a process of its own (not competing with the publishers for the GIL); puts the changes/s on ``done``."""
    client = connect(url)
    rng = random.Random(7)
    made: list[str] = []
    start, n = time.perf_counter(), 0
    while not stop.is_set():
        if len(made) < 20 or n % 2 == 0:
            made.append(subscribe(client, QM, _filter(rng), "churn", f"x{n}").sub_id)
        else:
            unsubscribe(client, QM, made.pop(0))
        n += 1
        pause = start + n / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    for sub_id in made:
        unsubscribe(client, QM, sub_id)
    done.put(n / (time.perf_counter() - start))


def publish_paced(
    url: str, pid: str, rate: float, seconds: float, out: list[tuple[float, float]], seed: int
) -> None:
    """Publish at ``rate``/s for ``seconds`` (after ``WARMUP_S`` not counted), each waited for;
    ``out`` gets (XADD -> result, scheduled send -> result) per publication, ms."""
    publisher = Publisher(connect(url), QM, pid)
    rng = random.Random(seed)
    start = time.perf_counter() + WARMUP_S
    for i in range(-int(rate * WARMUP_S), int(rate * seconds)):
        due = start + i / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent = time.perf_counter()
        publisher.publish(f"t/{rng.randrange(ROWS)}/{rng.randrange(COLUMNS)}", b"x" * 100, wait=True)
        done = time.perf_counter()
        if i >= 0:
            out.append(((done - sent) * 1000, (done - due) * 1000))


def phase(url: str, rate: float, seconds: float, churn_rate: float, publishers: int) -> dict[str, Any]:
    """One measurement: paced publications, with churn when ``churn_rate`` > 0."""
    ctx = multiprocessing.get_context("spawn")
    stop, changes = ctx.Event(), ctx.Queue()
    churner = ctx.Process(target=churn, args=(url, churn_rate, stop, changes)) if churn_rate else None
    if churner:
        churner.start()
        time.sleep(1.0)  # the process started, churning before the first publication
    latencies: list[list[tuple[float, float]]] = [[] for _ in range(publishers)]
    threads = [
        threading.Thread(
            target=publish_paced, args=(url, f"p{i}", rate / publishers, seconds, latencies[i], i)
        )
        for i in range(publishers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    made = 0.0
    if churner:
        made = changes.get(timeout=60)
        churner.join()
    flat = sorted(x for part in latencies for x, _ in part)
    late = sorted(y for part in latencies for _, y in part)
    return {
        "n": len(flat),
        "p50": flat[len(flat) // 2],
        "p99": flat[int(len(flat) * 0.99)],
        "max": flat[-1],
        "sched_p99": late[int(len(late) * 0.99)],
        "changes_per_s": made,
    }


def time_loads(client: redis.Redis, repeats: int = 15) -> dict[str, float]:
    """Medians, ms: a first load (a new table), a full reload of the same table (nothing changed),
    and an incremental apply of one subscription change."""
    first, full = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        RoutingTable(QM).load(client)
        first.append((time.perf_counter() - t0) * 1000)
    table = RoutingTable(QM)
    table.load(client)
    for _ in range(repeats):
        t0 = time.perf_counter()
        table.load(client)
        full.append((time.perf_counter() - t0) * 1000)
    out = {"first_load_ms": statistics.median(first), "full_load_ms": statistics.median(full)}
    if hasattr(table, "refresh"):
        rng, applied = random.Random(3), []
        for i in range(repeats * 4):
            if i % 2 == 0:
                subscribe(client, QM, _filter(rng), "timing", "one")
            else:
                unsubscribe(client, QM, "timing$one")
            t0 = time.perf_counter()
            assert table.refresh(client), "the change was not applied alone"
            applied.append((time.perf_counter() - t0) * 1000)
        out["incremental_apply_ms"] = statistics.median(applied)
    return out


def run_mode(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    stop, stats = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=run_worker, args=(url, mode == "incremental", stop, stats))
        for _ in range(args.workers)
    ]
    for p in procs:
        p.start()
    client = connect(url)
    while client.hlen(f"{{{QM}}}:workers") < args.workers:  # the workers' heartbeats
        time.sleep(0.05)
    quiet = phase(url, args.rate, args.seconds, 0, args.publishers)
    churned = phase(url, args.rate, args.seconds, args.churn, args.publishers)
    stop.set()
    counts = [stats.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    client.delete(f"{{{QM}}}:workers", f"{{{QM}}}:alive")
    return {
        "quiet": quiet,
        "churn": churned,
        "full_loads": sum(c["full"] for c in counts),
        "incremental": sum(c["incremental"] for c in counts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="an existing server (flushed!); default: start one")
    parser.add_argument("--subscriptions", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=200.0, help="paced publications/s (200)")
    parser.add_argument("--churn", type=float, default=200.0, help="subscription changes/s (200)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each phase, s (5)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--publishers", type=int, default=4)
    args = parser.parse_args()
    server = None if args.redis_url else Server().start()
    url = args.redis_url or server.url  # type: ignore[union-attr]
    try:
        client = connect(url)
        client.flushall()
        t0 = time.perf_counter()
        populate(client, args.subscriptions)
        print(f"{args.subscriptions} subscriptions made in {time.perf_counter() - t0:.1f} s")
        print("table:", {k: round(v, 3) for k, v in time_loads(client).items()})
        modes = ["incremental", "full"] if hasattr(RoutingTable, "refresh") else ["full"]
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                got = run_mode(url, mode, args)
                results[mode].append(got)
                q, c = got["quiet"], got["churn"]
                print(
                    f"round {r + 1} {mode:11s} quiet p50 {q['p50']:6.2f} p99 {q['p99']:7.2f} | churn "
                    f"{c['changes_per_s']:5.0f}/s p50 {c['p50']:6.2f} p99 {c['p99']:7.2f} max {c['max']:7.2f} "
                    f"(from schedule: p99 {c['sched_p99']:7.2f}) ms "
                    f"| worker full loads {got['full_loads']}, incremental {got['incremental']}"
                )
        if not args.rounds:
            return
        print("medians over rounds, ms:")
        for mode, runs in results.items():
            row = {
                f"{when}_{p}": statistics.median(run[when][p] for run in runs)
                for when in ("quiet", "churn")
                for p in ("p50", "p99", "max", "sched_p99")
            }
            print(f"  {mode:11s}", {k: round(v, 2) for k, v in row.items()})
        if len(modes) == 2:
            for p in ("p50", "p99"):
                ratios = [
                    f["churn"][p] / i["churn"][p]
                    for i, f in zip(results["incremental"], results["full"], strict=True)
                ]
                print(f"  churn {p} full/incremental per round: {[round(x, 1) for x in ratios]}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
