"""Row 19, memory per waiting message: one queue, and a fan-out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from scripts.bench.base import Ctx, Figures, Measurement, Row
from scripts.bench.pool import run_broker
from scripts.bench.preload import preload_queue
from scripts.bench.topology import Topology
from scripts.bench.workload import BODY_BYTES, POLL_S


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


def _finish(ctx: Ctx) -> None:
    a = ctx.args
    ctx.idle("memory")
    ctx.log(
        f"19. memory per waiting message: {a.memory_n:,} envelopes in one queue, "
        f"{a.memory_n // 5:,} publications fanned out"
    )
    got = ctx.attempt(
        "memory", run_memory, ctx.client, ctx.settings, ctx.topo, a.memory_n, a.memory_n // 5, a.interleave
    )
    if got:
        ctx.figures["memory"] = got
        ctx.log(
            f"   {got['single']['bytes_per_msg']} B/message in one queue, "
            f"{got['fanout']['bytes_per_element']} B per queue element fanned out"
        )


def _rows(f: Figures) -> list[Row]:
    if "memory" not in f:
        return []
    m = f["memory"]
    one, fan = m["single"], m["fanout"]
    return [
        Row(
            "19. memory, one queue",
            "-",
            "-",
            f"{one['k']:,} envelopes of {m['body_bytes']} B bodies ({one['envelope_bytes']} B each) in one "
            f"subscriber queue: {one['bytes_per_msg']} B of used_memory per message "
            f"(body + {one['bytes_per_msg'] - m['body_bytes']:.0f}; target <= {m['target_bytes']}), "
            f"the list's MEMORY USAGE {one['key_bytes_per_msg']} B",
        ),
        Row(
            "19. memory, fanned out",
            "-",
            "-",
            f"{fan['k']:,} publications through the broker, {fan['elements']:,} queue elements "
            f"({fan['envelope_bytes']} B envelopes, {fan['elements_per_queue']} per queue): "
            f"{fan['bytes_per_element']} B of used_memory per element (body + "
            f"{fan['bytes_per_element'] - m['body_bytes']:.0f}), of which the queues "
            f"{fan['queue_bytes_per_element']} B; per publication the publish stream "
            f"{fan['stream_bytes_per_pub']} B and the rest (dedup records, ...) {fan['other_bytes_per_pub']} B",
        ),
    ]


MEASUREMENT = Measurement("memory", topology=True, finish=_finish, rows=_rows)
