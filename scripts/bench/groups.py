"""Row 25, message groups: a shared subscription consumed by 2 consumers, no groups against 10
groups, consumer-side messages/s side by side (the order alternating per repeat).

The subscription's queue is filled directly (``preload_queue``, untimed) with ``n`` envelopes that
carry no ``JMSXGroupID`` (off) or one of 10 (on: message ``i`` in group ``g<i % 10>``); two
``Subscriber`` s of one shared subscription (threads of the bench process, each with its own
connection and its default heartbeat) ``receive_many(100)`` + ``ack_many`` until all ``n`` came
(``--n`` x 5); the clock stops at the last acknowledgement. A consumer's first batch usually takes a
message of every group, so it owns them all and the other receives nothing while they last: the
row shows the split, and the calls per message: the other consumer's calls each pass over the
band's messages of groups it does not own (``receive.lua``'s cap per call) and come back empty. With groups, ``broker_receive`` records each group's owner and passes over the messages
of another consumer's groups (``broker/lua/library/receive.lua``); without, it costs one
``HLEN`` of the empty groups hash per call. ``scripts.bench_receive_groups`` times the server side
alone.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.topics.subscriptions import subscribe, unsubscribe
from scripts.bench.base import QM, Ctx, Figures, Measurement, Row, cpu3, fmt
from scripts.bench.cpu import CpuMeter, commandstats, redis_pid
from scripts.bench.preload import preload_queue
from scripts.bench.workload import BenchError

#: The shared subscription of row 25. (ShareName ``bench``; nothing is published to its topic).
GROUPS_FILTER = "$share/bench/bench/grouped"

#: Message groups in the ``on`` run.
GROUPS = 10

#: Consumers of the shared subscription.
CONSUMERS = 2

#: Messages of row 25. per ``--n`` publication of the other rows (a drain of ``--n`` alone is too
#: short to time).
N_FACTOR = 5

#: Most seconds a drain may take before the row fails.
DRAIN_TIMEOUT_S = 120.0


def run_groups(client: redis.Redis, settings: Settings, qm: str, n: int, groups: int) -> dict[str, Any]:
    """Drain ``n`` preloaded messages (``groups`` groups, 0: none) of a new shared subscription with
    ``CONSUMERS`` consumers; ``{"msgs_per_s", "elapsed_s", "per_consumer", "cpu", ...}``.

    Raises:
        BenchError: a message was not received or acknowledged once, or a group went to two consumers.
    """
    from broker.clients.consumer import Subscriber
    from broker.core.connection import connect

    record = subscribe(client, qm, GROUPS_FILTER, client_id="groups", durable_name=f"g{groups}")
    queue = keys.sub_queue(qm, record.sub_id)
    preload_queue(client, queue, n, groups=groups)
    conns = [connect(settings.redis_url) for _ in range(CONSUMERS)]
    subscribers = [
        Subscriber(conn, qm, record, settings, consumer_id=f"c{i}") for i, conn in enumerate(conns)
    ]
    counts = [0] * CONSUMERS
    last = [0.0] * CONSUMERS  # when each consumer's last acknowledgement returned
    owners: dict[str, set[int]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    start_line = threading.Barrier(CONSUMERS + 1)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S

    def consume(i: int) -> None:
        start_line.wait()
        try:  # every consumer goes on until all n are in (one may own every group and the other wait)
            while sum(counts) < n and time.monotonic() < deadline and not errors:
                got = subscribers[i].receive_many(100, timeout_ms=50)
                if not got:
                    continue
                with lock:
                    for d in got:
                        if d.message.group_id is not None:
                            owners.setdefault(d.message.group_id, set()).add(i)
                subscribers[i].ack_many(got)
                counts[i] += len(got)
                last[i] = time.perf_counter()
        except Exception as exc:  # reported below, with the counts
            errors.append(f"consumer {i}: {exc!r}")

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    client.config_resetstat()
    meter = CpuMeter({"redis": [redis_pid(client)], "bench": [os.getpid()]})
    start_line.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = max(last) - start
    cpu = meter.stop()
    stats = commandstats(client)
    left = client.llen(queue)
    for s in subscribers:
        s.close()
    for conn in conns:
        conn.close()
    unsubscribe(client, qm, record.sub_id)
    shared = sorted(g for g, who in owners.items() if len(who) > 1)
    if errors or sum(counts) != n or left or shared:
        raise BenchError(
            f"groups ({groups}): received {sum(counts)} of {n} ({counts}), {left} left, "
            f"groups on two consumers {shared[:5]}, errors {errors[:2]}"
        )
    return {
        "n": n,
        "groups": groups,
        "msgs_per_s": round(n / elapsed),
        "elapsed_s": round(elapsed, 3),
        "per_consumer": counts,
        "cpu": cpu,
        "redis_cpu_us_per_msg": round(cpu["redis"] / 100 * elapsed * 1e6 / n, 2),
        # (command, calls per message, usec per message): the receive calls that came back empty show here
        "redis_commands": sorted(
            ((k, round(v["calls"] / n, 3), round(v["usec"] / n, 2)) for k, v in stats.items()),
            key=lambda x: -x[2],
        )[:4],
    }


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    n = ctx.args.n * N_FACTOR
    runs = (("groups_off", 0), ("groups_on", GROUPS))
    for name, groups in runs if rep % 2 == 0 else runs[::-1]:
        ctx.idle(name)
        ctx.log(f"25. shared subscription, {CONSUMERS} consumers, {groups or 'no'} groups, N={n:,}{tag}")
        got = ctx.attempt(name, run_groups, ctx.client, ctx.settings, QM, n, groups)
        ctx.keep(name, got, got and f"   {got['msgs_per_s']:,} msgs/s {got['per_consumer']}")


def _finish(ctx: Ctx) -> None:
    off, on = ctx.runs["groups_off"], ctx.runs["groups_on"]
    ctx.figures["groups_ratios"] = [
        round(b["msgs_per_s"] / a["msgs_per_s"], 3) for a, b in zip(off, on, strict=False)
    ]


def _rows(f: Figures) -> list[Row]:
    rows = []
    for key, label in (
        ("groups_off", "25. shared, no groups"),
        ("groups_on", f"25. shared, {GROUPS} groups"),
    ):
        if key not in f:
            continue
        b = f[key]
        notes = (
            f"{CONSUMERS} Subscribers (threads of the bench process) of {GROUPS_FILTER}: receive_many(100) "
            f"+ ack_many of {b['n']:,} preloaded messages, {b['groups'] or 'no'} JMSXGroupID; "
            f"per consumer {b['per_consumer']}; redis {b['redis_cpu_us_per_msg']} CPU-us/msg; "
            f"calls/msg {', '.join(f'{c} {k}' for c, k, _ in b.get('redis_commands', [])[:2])}"
        )
        off = f.get("groups_off", {}).get("msgs_per_s")
        if key == "groups_on" and off:
            repeats = ", ".join(str(x) for x in f.get("groups_ratios") or [])
            notes += f"; groups/none {b['msgs_per_s'] / off:.2f} (per repeat {repeats})"
        rows.append(Row(label, "-", fmt(b["msgs_per_s"]), notes, cpu3(b["cpu"], ("bench",))))
    return rows


MEASUREMENT = Measurement(
    "groups",
    runs=("groups_off", "groups_on"),
    median_key="msgs_per_s",
    repeat=_repeat,
    finish=_finish,
    rows=_rows,
)
