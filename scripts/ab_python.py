"""The worker's Python per publication: one in-process worker drains the bench's topology and preload.

Run by ``scripts/bench_ab.py`` (row ``python``) with each side's interpreter and code (``PYTHONPATH``
its checkout), against a server that process started::

    python scripts/ab_python.py redis://127.0.0.1:PORT 20000

It builds the bench's topology (1,000 topics, F=10, links: ``scripts.bench.topology``, or
``scripts/bench_lib.py`` in commits from before the bench was a package), preloads N publications
from 50 publishers as the broker row does, and times one worker (``worker.loop.Worker`` on a
client of that commit's ``connect``, as the pool's; no pool, no second worker) draining them with
``run_once``: the process's CPU time (``time.process_time``) per publication is the worker's
Python (decide, the commit's arguments, the replies' parsing, the apply step), the wall time per
publication that plus the server's. Three drains after a warm-up;
the least CPU is reported, as the last line: ``{"python_cpu_us": ..., "wall_us": ...,
"server_user_us": ..., "server_sys_us": ...}``, the last two the server's CPU per publication
through the same drains (``INFO cpu``, the drain with the least), the work per publication the
2-worker drain is bound by once the server is busy.

Why: the 2-worker drain on 2 cores is decided by how often both workers decide at once while the
server waits; their Python per round is the one figure of that which a single process measures
without the other worker's noise (``docs/design.md``: the drain).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))
sys.path.insert(0, str(Path.cwd() / "scripts"))

QM = "BENCH"
DRAINS = 3


def _setup(url: str) -> tuple[Any, Any, Any]:
    """``(client, preload(n), worker)`` of the side under test, its own harness and code."""
    import redis

    client = redis.Redis.from_url(url)
    from worker.loop import Worker

    try:
        from broker import Settings
        from scripts.bench.preload import preload
        from scripts.bench.topology import Topology

        topo = Topology.build(client, QM)
        topo.restore(client)
        settings = Settings(redis_url=url, qm=QM, topic_scheme=topo.scheme)  # type: ignore[arg-type]

        def load(n: int) -> None:
            preload(client, QM, n, hot=False, chunk=20, topics=topo.topics)

    except ImportError:  # a commit from before scripts.bench was a package (6644fac)
        import bench_lib as lib  # type: ignore[import-not-found]
        from broker.config import Settings  # type: ignore[import-not-found,no-redef]

        old_topo = lib.Topology.build(client, QM)
        old_topo.restore(client)
        settings = Settings(redis_url=url, qm=QM)

        def load(n: int) -> None:
            lib.preload(client, QM, n, False, 20)

    try:  # the worker's client as the pool makes it (its own connection settings)
        from broker.core.connection import connect
    except ImportError:
        from broker.connection import connect  # type: ignore[import-not-found,no-redef]
    worker = Worker(connect(url), settings, name="ab-python")
    worker.setup()
    return client, load, worker


def _drain(worker: Any, n: int) -> None:
    done = rounds = 0
    while done < n:
        done += worker.run_once(block=False)
        rounds += 1
        if rounds > 10 * n:
            raise RuntimeError(f"drained {done} of {n} in {rounds} rounds")


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    client, load, worker = _setup(url)
    load(1_000)
    _drain(worker, 1_000)
    best: tuple[float, ...] | None = None
    server: list[tuple[float, float]] = []
    for _ in range(DRAINS):
        load(n)
        user0, sys0 = _server_cpu(client)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        _drain(worker, n)
        got = ((time.process_time() - cpu0) / n * 1e6, (time.perf_counter() - wall0) / n * 1e6)
        user1, sys1 = _server_cpu(client)
        server.append(((user1 - user0) / n * 1e6, (sys1 - sys0) / n * 1e6))
        best = got if best is None or got[0] < best[0] else best
    assert best is not None
    user, system = min(server, key=sum)
    print(
        json.dumps(
            {
                "python_cpu_us": round(best[0], 2),
                "wall_us": round(best[1], 2),
                "server_user_us": round(user, 2),
                "server_sys_us": round(system, 2),
            }
        )
    )


def _server_cpu(client: Any) -> tuple[float, float]:
    """The server's CPU time so far, ``(user, system)`` in seconds (``INFO cpu``)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]), float(info["used_cpu_sys"])


if __name__ == "__main__":
    main()
