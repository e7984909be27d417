"""The pool runs (rows 2-3 and every side-by-side comparison): start the worker pool on a preloaded stream, measure the drain, its CPU, order and the work split; the py-spy profiler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.core.models import Message
from broker.core.stream import group_state
from broker.topics.topic_objects import TopicObject
from scripts.bench.cpu import CpuMeter, commandstats, redis_pid
from scripts.bench.preload import preload, publisher_ids
from scripts.bench.topology import Principals, Topology
from scripts.bench.workload import (
    FANOUT,
    POLL_S,
    STALL_S,
    BenchError,
    clear_topic_objects,
    define_topic_objects,
    topic_object_coverage,
)


def group_progress(client: redis.Redis, qm: str) -> tuple[bool, int, int]:
    """``(group exists, pending, lag)`` of the workers' group (``broker.core.stream.group_state``)."""
    state = group_state(client, qm)
    lag = state.lag
    if lag is None:  # unknown (deleted entries): compare ids instead
        last = client.xinfo_stream(keys.publish_stream(qm))["last-generated-id"]
        last_id = last.decode() if isinstance(last, bytes) else str(last)
        lag = 0 if state.last_delivered_id == last_id else 1
    return state.exists, state.pending, lag


def _worker_pids(client: redis.Redis, qm: str) -> list[int]:
    return [int(json.loads(raw)["pid"]) for raw in client.hgetall(keys.workers(qm)).values()]


def _queue_total(client: redis.Redis, queues: Sequence[str], length: str = "LLEN") -> int:
    """Messages in ``queues`` (lists; ``length="XLEN"``: entries in streams), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.execute_command(length, q)
    return sum(pipe.execute())


def order_violations(client: redis.Redis, queue: str) -> tuple[int, int]:
    """Per-publisher order in one subscriber queue: ``(inversions, envelopes checked)``."""
    raw = client.lrange(queue, 0, -1)
    last: dict[str, int] = {}
    bad = 0
    for envelope in reversed(raw):  # LPUSHed: the oldest is on the right
        header = json.loads(envelope.partition(b"\n")[0])
        pub, seq = header["publisher"], header["seq"]
        if seq <= last.get(pub, -1):
            bad += 1
        last[pub] = seq
    return bad, len(raw)


def work_split(client: redis.Redis, qm: str, n: int, timeout_s: float = 3.0) -> list[float] | None:
    """Share of the publications each worker handled, from their heartbeats (written about once a second).

    Waits up to ``timeout_s`` for the heartbeats to add up to ``n``; None if they do not.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [
            int(json.loads(raw).get("processed") or 0) for raw in client.hgetall(keys.workers(qm)).values()
        ]
        if sum(counts) >= n:
            return sorted((round(c / sum(counts), 3) for c in counts), reverse=True)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _pool(settings: Settings, k: int) -> Any:
    from worker.pool import Pool

    return Pool(settings.model_copy(update={"concurrency": k}))


def wait_registered(client: redis.Redis, qm: str, pool: Any, k: int, timeout_s: float = 60.0) -> None:
    """Wait until ``k`` workers have a heartbeat.

    Raises:
        BenchError: a worker died or they did not register within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while client.hlen(keys.workers(qm)) < k:
        if pool.alive() < k:
            raise BenchError("a worker process died at start (see its log above)")
        if time.monotonic() > deadline:
            raise BenchError(f"workers did not register within {timeout_s:.0f} s")
        time.sleep(POLL_S)


class Profiler:
    """py-spy ``record --format raw`` on some pids until stopped, then a text summary."""

    def __init__(self, pids: list[int], out_dir: str, label: str, rate: int = 100) -> None:
        self.procs: list[tuple[int, str, subprocess.Popen[bytes]]] = []
        exe = str(Path(sys.executable).parent / "py-spy")
        for pid in pids:
            path = str(Path(out_dir) / f"{label}-{pid}.txt")
            cmd = [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--idle",
                "--format",
                "raw",
                "--output",
                path,
                "--nonblocking",
            ]
            self.procs.append(
                (pid, path, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            )

    def stop(self) -> dict[str, Any]:
        """SIGINT every py-spy (it writes its file) and summarise the collapsed stacks."""
        for _, _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for _, _, proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        per_worker = []
        for pid, path, _ in self.procs:
            stacks: Counter[str] = Counter()
            try:
                with Path(path).open() as handle:
                    for line in handle:
                        stack, _, count = line.rstrip("\n").rpartition(" ")
                        if stack and count.isdigit():
                            stacks[stack] += int(count)
            except OSError:
                continue
            per_worker.append({"pid": pid, "file": path, **summarise_stacks(stacks)})
        return {"workers": per_worker}


def _frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"; py-spy raw frames carry the line number.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    return f"{name} ({Path(path).name})" if path else name


def summarise_stacks(stacks: Counter[str], top: int = 25) -> dict[str, Any]:
    """Self and inclusive shares of the hottest functions in collapsed stacks."""
    total = sum(stacks.values())
    if not total:
        return {"samples": 0, "self": [], "inclusive": []}
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = [_frame_name(f) for f in stack.split(";") if f]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    share = lambda c: round(100 * c / total, 1)  # noqa: E731
    return {
        "samples": total,
        "self": [(name, share(c)) for name, c in own.most_common(top)],
        "inclusive": [(name, share(c)) for name, c in inclusive.most_common(top)],
    }


@dataclass
class _Drain:
    """What ``_watch_drain`` saw: when every worker had registered (``t0``, None if never) and
    how much was acknowledged then, when the drain ended, (time, acknowledged) samples, CPU, the
    py-spy profile, the work split."""

    t0: float | None
    acked0: int
    t_end: float
    samples: list[tuple[float, int]]
    cpu: dict[str, float]
    profile: dict[str, Any] | None
    split: list[float] | None


def _watch_drain(
    client: redis.Redis,
    qm: str,
    n: int,
    workers: int,
    pool: Any,
    ingress: Sequence[str],
    profile_dir: str | None,
    label: str,
) -> _Drain:
    """Poll the group until nothing is pending or lagging; the clock starts when all ``workers`` registered.

    Raises:
        BenchError: no progress for ``STALL_S``, or a worker died.
    """
    profiler: Profiler | None = None
    samples: list[tuple[float, int]] = []
    try:
        t0: float | None = None
        acked0 = 0
        meter: CpuMeter | None = None
        last_acked, last_change = -1, time.monotonic()
        while True:
            now = time.perf_counter()
            exists, pending, lag = group_progress(client, qm)
            lag += _queue_total(client, ingress, "XLEN") if ingress else 0  # not yet moved in
            acked = n - pending - lag if exists else 0
            samples.append((now, acked))
            if t0 is None and client.hlen(keys.workers(qm)) >= workers:
                t0, acked0 = now, acked
                pids = _worker_pids(client, qm)
                meter = CpuMeter({"redis": [redis_pid(client)], "workers": pids, "bench": [os.getpid()]})
                if profile_dir:
                    profiler = Profiler(pids, profile_dir, label)
            if exists and pending == 0 and lag == 0:
                t_end = now
                break
            if acked != last_acked:
                last_acked, last_change = acked, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                raise BenchError(f"no progress for {STALL_S:.0f} s at {acked}/{n} acknowledged")
            if pool.alive() < workers:
                raise BenchError("a worker process died during the run")
            time.sleep(POLL_S)
        cpu = meter.stop() if meter else {}
        profile = profiler.stop() if profiler else None
        profiler = None
        split = work_split(client, qm, n)
    finally:
        if profiler is not None:
            profiler.stop()
    return _Drain(t0, acked0, t_end, samples, cpu, profile, split)


def _queue_checks(client: redis.Redis, qm: str, msgids: Sequence[tuple[str, str]]) -> tuple[int, int, int]:
    """Order inversions and envelopes checked in three sampled queues; dedup records found of ``msgids``."""
    inversions = checked = 0
    for sub in ("hash$r3", "exact$bench_3_3_3", "dedup$r7"):
        bad, count = order_violations(client, keys.sub_queue(qm, sub))
        inversions += bad
        checked += count
    pipe = client.pipeline(transaction=False)
    for pid, msgid in msgids:
        pipe.exists(keys.dedup(qm, pid, msgid))
    return inversions, checked, sum(pipe.execute())


def _variant_figures(
    client: redis.Redis,
    qm: str,
    topo: Topology,
    loaded: dict[str, Any],
    properties: bool,
    principals: Principals | None,
    topic_objects: Sequence[TopicObject] | None,
    define_s: float | None,
) -> dict[str, Any]:
    """The figures of a comparison's variant (selectors, security, topic objects) of a ``run_broker`` run.

    Raises:
        BenchError: with ``principals``, a sampled envelope without its publisher's principal.
    """
    result: dict[str, Any] = {}
    if properties:
        result |= {
            "properties": True,
            "selective_subscriptions": len(topo.selective),
            "expected_deliveries": loaded.get("expected_deliveries"),
            "selector_evaluations": loaded["selector_evaluations"],
            "selected_share": loaded["selected_share"],
        }
    if principals is not None:
        sample = [Message.from_envelope(raw) for raw in client.lrange(keys.sub_queue(qm, "hash$r3"), 0, 199)]
        strays = [m.msgid for m in sample if m.principal != principals.principal(m.publisher)]
        if strays or not sample:
            raise BenchError(f"envelopes without their publisher's principal: {strays[:5]} of {len(sample)}")
        result |= {"security": True, "principals": len(principals.clients), "principal_checked": len(sample)}
    if topic_objects is not None:
        result |= {
            "topic_objects": len(topic_objects),
            "topic_objects_define_s": round(define_s, 3) if define_s is not None else None,
            "topic_objects_coverage": round(topic_object_coverage(topic_objects), 3),
        }
    return result


def _define_objects(
    client: redis.Redis, qm: str, topic_objects: Sequence[TopicObject] | None
) -> float | None:
    """Define ``topic_objects`` (s taken, untimed) after a restore; without, check there are none.

    Raises:
        BenchError: topic objects left over from an earlier run.
    """
    if topic_objects:
        return define_topic_objects(client, qm, topic_objects)
    objects_key = keys.topic_objects(qm)
    if client.exists(objects_key):
        raise BenchError(f"{objects_key} holds {client.hlen(objects_key)} topic objects after the restore")
    return None


def _steady_rate(samples: list[tuple[float, int]], n: int, t0: float, t_end: float) -> int | None:
    """Publications/s in the steady window, from 10% to 90% acknowledged (None when too short to tell)."""
    t10 = next((t for t, a in samples if a >= 0.1 * n), t0)
    t90 = next((t for t, a in samples if a >= 0.9 * n), t_end)
    return round(0.8 * n / (t90 - t10)) if t90 > t10 else None


def run_broker(
    client: redis.Redis,
    settings: Settings,
    topo: Topology,
    n: int,
    workers: int,
    hot: bool,
    chunk: int,
    profile_dir: str | None = None,
    label: str = "",
    properties: bool = False,
    topic_objects: Sequence[TopicObject] | None = None,
    security: bool = False,
    pool_factory: Callable[[Settings, int], Any] | None = None,
    retain: bool = False,
    delay_ms: int = 0,
) -> dict[str, Any]:
    """Preload ``n`` publications (``retain``: every one retained; ``delay_ms``: every one delayed), then time the pool draining them into the subscriber queues.

    The clock starts when all ``workers`` have registered (a worker writes its first
    heartbeat after its first round, so whatever was acknowledged before that is
    subtracted) and stops when the group has nothing pending and no lag. Then the
    subscriber queues must hold exactly ``n x FANOUT`` envelopes (with ``properties``:
    every publication carries ``selector_props``, and the queues must hold what the
    topology's selectors select, counted by ``preload``). With ``topic_objects``, they are
    defined after the topology is restored and before the preload (untimed), must still all
    be there when the drain ends, and are removed afterwards; without, the queue manager must
    have none. With ``security``, every publisher id publishes as its own principal user through
    its ingress stream (``Principals``, made after the restore, untimed) and the workers connect as a
    worker user: the drain ends when the ingress streams are empty too, and every envelope of a
    sampled queue must carry its publisher's principal. ``pool_factory(settings, workers)`` makes
    the pool instead of this commit's ``worker.pool.Pool`` (``baseline``: an earlier
    commit's, for the no-regression row).

    Returns:
        Figures: pubs/s, deliveries/s, measured F, CPU, Redis time per publication, ...

    Raises:
        BenchError: the drain stalled, a worker died, or deliveries are missing.
    """
    qm = topo.qm
    topo.restore(client)
    objects_key = keys.topic_objects(qm)
    define_s = _define_objects(client, qm, topic_objects)
    principals = Principals.make(client, qm, settings.redis_url, publisher_ids()) if security else None
    loaded = preload(
        client,
        qm,
        n,
        hot=hot,
        chunk=chunk,
        properties=properties,
        topics=topo.topics,
        principals=principals,
        retain=retain,
        delay_ms=delay_ms,
    )
    worker_url = {"redis_url": principals.worker_url} if principals is not None else {}
    settings = settings.model_copy(update={"topic_scheme": topo.scheme, **worker_url})
    ingress = principals.ingress() if principals is not None else []
    expected = loaded.get("expected_deliveries", n * FANOUT)
    client.config_resetstat()
    pool = (pool_factory or _pool)(settings, workers)
    t_spawn = time.perf_counter()
    pool.start()
    try:
        drain = _watch_drain(client, qm, n, workers, pool, ingress, profile_dir, label)
    finally:
        pool.stop()
        objects_left = client.hlen(objects_key)
        if topic_objects:
            clear_topic_objects(client, qm)
        if principals is not None:
            principals.close(client)
    stats = commandstats(client)
    t0, acked0, t_end, samples, cpu = drain.t0, drain.acked0, drain.t_end, drain.samples, drain.cpu
    if t0 is None or t0 >= t_end:  # done before (or as) every worker registered: time from the spawn
        t0, acked0 = t_spawn, 0
    elapsed = t_end - t0
    measured = n - acked0
    delivered = _queue_total(client, topo.queues)
    dead = client.xlen(keys.dead_letter(qm))
    steady = _steady_rate(samples, n, t0, t_end)
    inversions, checked, dedup_found = _queue_checks(client, qm, loaded["msgids"])
    redis_cpu_us = cpu.get("redis", 0.0) / 100 * elapsed * 1e6
    result = {
        "n": n,
        "workers": workers,
        "hot": hot,
        "elapsed_s": round(elapsed, 3),
        "measured_publications": measured,
        "pubs_per_s": round(measured / elapsed),
        "deliveries_per_s": round(measured * FANOUT / elapsed)
        if expected == n * FANOUT
        else round(measured * expected / n / elapsed),
        "steady_10_90_pubs_per_s": steady,
        "from_spawn_pubs_per_s": round(n / (t_end - t_spawn)),
        "spawn_to_registered_s": round(t0 - t_spawn, 3),
        "acked_before_registered": acked0,
        "deliveries": delivered,
        "fanout_measured": round(delivered / n, 3),
        "dead_lettered": dead,
        "work_split": drain.split,
        "order_inversions": inversions,
        "order_checked": checked,
        "dedup_records_found": f"{dedup_found}/{len(loaded['msgids'])}",
        "preload_xadd_per_s": loaded["xadd_per_s"],
        "preload_s": loaded["elapsed_s"],
        "hot_share": loaded["hot_share"],
        "cpu": cpu,
        "redis_cpu_us_per_pub": round(redis_cpu_us / max(measured, 1), 2),
        # (command, calls per publication, usec per publication); commands run inside
        # scripts are counted both on their own and inside evalsha
        "redis_commands": sorted(
            ((k, round(v["calls"] / n, 3), round(v["usec"] / n, 2)) for k, v in stats.items()),
            key=lambda x: -x[2],
        )[:8],
    }
    if drain.profile is not None:
        result["profile"] = drain.profile
    result |= _variant_figures(client, qm, topo, loaded, properties, principals, topic_objects, define_s)
    if objects_left != len(topic_objects or ()):
        raise BenchError(
            f"{objects_key} held {objects_left} topic objects at the end of the run, "
            f"not {len(topic_objects or ())}"
        )
    if delivered != expected or dead:
        raise BenchError(
            f"expected {expected} deliveries, found {delivered} ({dead} dead-lettered): {result}"
        )
    return result


# --------------------------------------------------------------------------------------------
# 4. Latency at a paced rate
# --------------------------------------------------------------------------------------------


def wait_idle(
    own_pids: list[int], max_wait_s: float, busy_pct: float = 12.0, window_s: float = 1.0
) -> dict[str, Any]:
    """Wait until the box is quiet: other processes use < ``busy_pct`` % of one core for ``window_s``.

    Gives up after ``max_wait_s`` (the measurement then runs anyway; its CPU
    figures show the foreign load).

    Returns:
        ``{"waited_s", "foreign_pct" (last window), "idle" (True when quiet)}``.
    """
    start = time.monotonic()
    while True:
        meter = CpuMeter({"ours": own_pids})
        time.sleep(window_s)
        cpu = meter.stop()
        if cpu["foreign"] < busy_pct or time.monotonic() - start >= max_wait_s:
            return {
                "waited_s": round(time.monotonic() - start, 1),
                "foreign_pct": cpu["foreign"],
                "idle": cpu["foreign"] < busy_pct,
            }


# --------------------------------------------------------------------------------------------
# 7. Selectors: the cost of one evaluation (the fan-out runs are run_broker(properties=True))
# --------------------------------------------------------------------------------------------
