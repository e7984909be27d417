"""Row 25, message groups: a shared subscription consumed by 2 consumers, three runs side by side
(the order turning per repeat), consumer-side messages/s:

- ``groups_off``: no message of a group, envelopes as the workers write them (protocol 7: a
  message of no group is told by its envelope's first bytes, no search): what every shared
  subscription pays for groups being always on;
- ``groups_legacy``: no message of a group either, envelopes as protocol 6 wrote them (``v`` 6,
  searched for the group property: what the first bytes save; only envelopes left in a queue
  from before an upgrade are read this way now);
- ``groups_on``: 10 groups (message ``i`` in group ``g<i % 10>``).

The subscription's queue is filled directly (``preload_queue``, untimed) with ``n`` envelopes; two
``Subscriber`` s of one shared subscription (threads of the bench process, each with its own
connection and its default heartbeat) ``receive_many(100)`` + ``ack_many`` until all ``n`` came
(``--n`` x 5); the clock stops at the last acknowledgement. A consumer's first batch usually takes a
message of every group, so it owns them all and the other receives nothing while they last: the
row shows the split, and the calls per message: the other consumer's calls each look at no more
than twice their batch of messages of groups it does not own (``receive.lua``'s cap per call),
write nothing, come back empty and clear the bell, so it waits for the bell (rung by the owner's
full batches) instead of looking again. With groups, ``broker_receive`` records each group's owner
and passes over the messages of another consumer's groups (``broker/lua/library/receive.lua``);
without, it costs one ``TYPE`` of the absent groups hash per call. ``scripts.bench_receive_groups``
times the server side alone. A quick check that the row runs:
``python -m scripts.bench --only groups --n 200`` (``--n`` x 5 messages per run).
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

#: The runs of row 25: (name, groups, protocol-6 envelopes), in the first repeat's order.
RUNS: tuple[tuple[str, int, bool], ...] = (
    ("groups_off", 0, False),
    ("groups_legacy", 0, True),
    ("groups_on", GROUPS, False),
)

#: Consumers of the shared subscription.
CONSUMERS = 2

#: Messages of row 25. per ``--n`` publication of the other rows (a drain of ``--n`` alone is too
#: short to time).
N_FACTOR = 5

#: Most seconds a drain may take before the row fails.
DRAIN_TIMEOUT_S = 120.0


def run_groups(
    client: redis.Redis, settings: Settings, qm: str, n: int, groups: int, legacy: bool = False
) -> dict[str, Any]:
    """Drain ``n`` preloaded messages (``groups`` groups, 0: none; ``legacy``: protocol-6 envelopes)
    of a new shared subscription with ``CONSUMERS`` consumers;
    ``{"msgs_per_s", "elapsed_s", "per_consumer", "cpu", ...}``.

    Raises:
        BenchError: a message was not received or acknowledged once, or a group went to two consumers.
    """
    from broker.clients.consumer import Subscriber
    from broker.core.connection import connect

    name = f"g{groups}{'v6' if legacy else ''}"
    record = subscribe(client, qm, GROUPS_FILTER, client_id="groups", durable_name=name)
    queue = keys.sub_queue(qm, record.sub_id)
    preload_queue(client, queue, n, groups=groups, legacy=legacy)
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
        "legacy": legacy,
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
    runs = RUNS[rep % len(RUNS) :] + RUNS[: rep % len(RUNS)]
    for name, groups, legacy in runs:
        ctx.idle(name)
        what = f"{groups or 'no'} groups{', protocol-6 envelopes' if legacy else ''}"
        ctx.log(f"25. shared subscription, {CONSUMERS} consumers, {what}, N={n:,}{tag}")
        got = ctx.attempt(name, run_groups, ctx.client, ctx.settings, QM, n, groups, legacy)
        ctx.keep(name, got, got and f"   {got['msgs_per_s']:,} msgs/s {got['per_consumer']}")


def _finish(ctx: Ctx) -> None:
    off = ctx.runs["groups_off"]
    for key in ("groups_legacy", "groups_on"):
        ctx.figures[f"{key}_ratios"] = [
            round(b["msgs_per_s"] / a["msgs_per_s"], 3)
            for a, b in zip(off, ctx.runs.get(key) or [], strict=False)
            if a and b
        ]


def _rows(f: Figures) -> list[Row]:
    rows = []
    for key, label in (
        ("groups_off", "25. shared, no groups"),
        ("groups_legacy", "25. shared, no groups, v6 envelopes"),
        ("groups_on", f"25. shared, {GROUPS} groups"),
    ):
        if key not in f:
            continue
        b = f[key]
        notes = (
            f"{CONSUMERS} Subscribers (threads of the bench process) of {GROUPS_FILTER}: receive_many(100) "
            f"+ ack_many of {b['n']:,} preloaded messages, {b['groups'] or 'no'} JMSXGroupID"
            f"{' (protocol-6 envelopes: searched)' if b.get('legacy') else ''}; "
            f"per consumer {b['per_consumer']}; redis {b['redis_cpu_us_per_msg']} CPU-us/msg; "
            f"calls/msg {', '.join(f'{c} {k}' for c, k, _ in b.get('redis_commands', [])[:2])}"
        )
        off = f.get("groups_off", {}).get("msgs_per_s")
        if key != "groups_off" and off:
            repeats = ", ".join(str(x) for x in f.get(f"{key}_ratios") or [])
            notes += f"; this/no groups {b['msgs_per_s'] / off:.2f} (per repeat {repeats})"
        rows.append(Row(label, "-", fmt(b["msgs_per_s"]), notes, cpu3(b["cpu"], ("bench",))))
    return rows


MEASUREMENT = Measurement(
    "groups",
    runs=tuple(name for name, _, _ in RUNS),
    median_key="msgs_per_s",
    repeat=_repeat,
    finish=_finish,
    rows=_rows,
)
