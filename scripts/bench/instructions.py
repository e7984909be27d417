"""Bench row 21: the server's instructions per publication, counted by valgrind's callgrind.

Rates on a shared box drift by 2x within minutes, so a throughput ratio needs many repeats to
mean anything. Instructions do not drift: the same workload executes the same instructions
whatever else runs on the host. This row runs the server (this install's, ``server_binary()``)
under ``valgrind --tool=callgrind`` with instrumentation off, and turns it on
(``callgrind_control -i on``) only around

- the broker: one in-process ``worker.loop.Worker`` of this commit handling ``n`` preloaded
  publications of the bench workload (F=10), after a warm-up round of its own, and
- the ceiling: ``ceiling.run_ceiling``'s timed loop (MULTI + F x LPUSH + XACK + EXEC) over
  ``n`` entries,

so ``ceiling_ir_per_tx / broker_ir_per_pub`` is the ceiling ratio in server work alone: what
``ceiling_ratio`` would be if the server were the only bottleneck and had no other load.
Instructions are not time (cache misses, memory bandwidth and system calls are not counted),
so the figure complements the timed rows; it does not replace them.

The functions of the server that cost the most per publication (self cost, from
``callgrind_annotate``) come with it, to say where the instructions go.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import redis

from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.server import Server, server_binary
from scripts.bench.base import Ctx, Figures, Measurement, Row
from scripts.bench.ceiling import run_ceiling
from scripts.bench.preload import preload
from scripts.bench.topology import Topology
from scripts.bench.workload import BenchError

#: Publications (and ceiling transactions) counted by default: under callgrind the server runs
#: ~50x slower, so 3,000 take about a minute.
DEFAULT_N = 3_000

#: Functions listed per run, by self cost.
TOP_FUNCTIONS = 12


def available() -> str | None:
    """None when valgrind and callgrind_control are installed, else why this row cannot run."""
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install valgrind)"
    return None


class CallgrindServer:
    """The server under ``valgrind --tool=callgrind --instr-atstart=no``; counts only between
    ``on()`` and ``off()``, and ``dump()`` writes what was counted to a file of its own."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        wrapper = work_dir / "server-under-callgrind.sh"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="{work_dir}/callgrind.out" '
            f'"{server_binary()}" "$@"\n'
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        self.server = Server(binary=str(wrapper))

    def start(self) -> redis.Redis:
        self.server.start()
        return connect(self.server.url)

    def _control(self, *args: str) -> None:
        assert self.server.process is not None
        subprocess.run(
            ["callgrind_control", *args, str(self.server.process.pid)], check=True, capture_output=True
        )

    def on(self) -> None:
        self._control("-i", "on")

    def off(self) -> None:
        self._control("-i", "off")

    def dump(self) -> Path:
        """Write the counts since the last dump; returns the file (``callgrind.out.<k>``)."""
        before = set(self.work_dir.glob("callgrind.out*"))
        self._control("-d")
        new = sorted(set(self.work_dir.glob("callgrind.out*")) - before)
        if not new:
            raise BenchError("callgrind wrote no dump")
        return new[-1]

    def stop(self) -> None:
        self.server.stop()


def total_instructions(dump: Path) -> int:
    """The ``totals:`` line of a callgrind dump (its ``summary:`` line says 0 when the
    instrumentation was switched on at run time): instructions (Ir) counted."""
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise BenchError(f"no totals in {dump}")


_ANNOTATE_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)\s*(\[.*\])?$")


def top_functions(dump: Path, per: int, count: int = TOP_FUNCTIONS) -> list[tuple[str, int]]:
    """The ``count`` functions with the highest self cost, as ``(name, instructions per unit)``;
    [] when ``callgrind_annotate`` is missing or says nothing parseable."""
    if shutil.which("callgrind_annotate") is None:
        return []
    text = subprocess.run(
        ["callgrind_annotate", str(dump)], capture_output=True, text=True, check=False
    ).stdout
    out: list[tuple[str, int]] = []
    listing = False
    for line in text.splitlines():
        if "file:function" in line:
            listing = True
            continue
        if not listing or line.startswith("-"):
            continue
        m = _ANNOTATE_LINE.match(line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        name = m.group(2).split(":")[-1]
        out.append((name, round(int(m.group(1).replace(",", "")) / per)))
        if len(out) >= count:
            break
    return out


def run_instructions(topo: Topology, n: int = DEFAULT_N, chunk: int = 20) -> dict[str, Any]:
    """Count the server's instructions per publication (broker) and per transaction (ceiling).

    Args:
        topo: the bench topology (restored into the server under callgrind).
        n: publications, and ceiling transactions, counted.
        chunk: publications per publisher in a row in the preload (``--interleave``).

    Returns:
        ``{"n", "broker_ir_per_pub", "ceiling_ir_per_tx", "ratio", "broker_top", "ceiling_top",
        "worker_rounds"}``; ``*_top``: ``[(function, instructions per unit)]``.

    Raises:
        BenchError: valgrind is missing, the worker did not handle every publication, or a
            dump had no totals.
    """
    from worker.loop import Worker

    why = available()
    if why:
        raise BenchError(f"21. instructions: {why}")
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        cg = CallgrindServer(Path(tmp))
        client = cg.start()
        try:
            topo.restore(client)
            settings = Settings(redis_url=cg.server.url, qm=topo.qm, topic_scheme=topo.scheme)
            worker = Worker(client, settings, name="bench-callgrind")
            worker.setup()
            # warm-up: the routing table, the scripts, the first turns (not counted)
            preload(client, topo.qm, 200, hot=False, chunk=chunk, topics=topo.topics, seed=2)
            _drain(worker, 200)
            preload(client, topo.qm, n, hot=False, chunk=chunk, topics=topo.topics)
            cg.on()
            rounds = _drain(worker, n)
            cg.off()
            broker_dump = cg.dump()
            topo.restore(client)
            routes = topo.routes(client)
            ceiling = run_ceiling(client, "127.0.0.1", cg.server.port, routes, n, around=(cg.on, cg.off))
            ceiling_dump = cg.dump()
            broker_ir = total_instructions(broker_dump) / n
            ceiling_ir = total_instructions(ceiling_dump) / ceiling["n"]
            return {
                "n": n,
                "worker_rounds": rounds,
                "broker_ir_per_pub": round(broker_ir),
                "ceiling_ir_per_tx": round(ceiling_ir),
                "ratio": round(ceiling_ir / broker_ir, 3),
                "broker_top": top_functions(broker_dump, n),
                "ceiling_top": top_functions(ceiling_dump, ceiling["n"]),
                "valgrind": subprocess.run(
                    ["valgrind", "--version"], capture_output=True, text=True
                ).stdout.strip(),
                "server": Path(server_binary()).name,
            }
        finally:
            cg.stop()


def _drain(worker: Any, n: int, max_rounds: int = 100_000) -> int:
    """Run ``worker.run_once()`` until it has handled ``n`` publications; returns the rounds taken."""
    done = rounds = 0
    while done < n:
        done += worker.run_once()
        rounds += 1
        if rounds > max_rounds:
            raise BenchError(f"21. instructions: the worker handled {done} of {n} in {max_rounds} rounds")
    return rounds


def _finish(ctx: Ctx) -> None:
    skip = available()
    if skip:  # as RabbitMQ's row without rabbitmq-server: n/a, not a failure
        ctx.log(f"21. instructions: skipped, {skip}")
        ctx.figures["instructions"] = {"skipped": skip}
        return
    n = ctx.args.instructions_n
    ctx.idle("instructions")
    ctx.log(
        f"21. instructions: the server under callgrind, 1 worker in process and the ceiling, N={n:,} each"
    )
    got = ctx.attempt("instructions", run_instructions, ctx.topo, n, ctx.args.interleave)
    if got:
        ctx.figures["instructions"] = got
        ctx.log(
            f"   broker {got['broker_ir_per_pub']:,} instructions/publication, ceiling "
            f"{got['ceiling_ir_per_tx']:,}/tx: ratio {got['ratio']}"
        )


def _rows(f: Figures) -> list[Row]:
    ins = f.get("instructions")
    if ins is None:
        return []
    if "skipped" in ins:
        return [Row("21. instructions", "-", "-", f"skipped: {ins['skipped']}")]

    def top(rows: list[Any], k: int = 5) -> str:
        return ", ".join(f"{name} {count:,}" for name, count in rows[:k])

    return [
        Row(
            "21. instructions",
            "-",
            "-",
            f"the server's instructions (callgrind Ir), N={ins['n']:,}: broker {ins['broker_ir_per_pub']:,}/publication "
            f"(1 worker in process, {ins['worker_rounds']} rounds), ceiling {ins['ceiling_ir_per_tx']:,}/tx: "
            f"ratio {ins['ratio']} (the ceiling ratio in server work alone, deterministic); most per "
            f"publication: {top(ins['broker_top'])}; per ceiling tx: {top(ins['ceiling_top'])}",
        )
    ]


MEASUREMENT = Measurement("instructions", topology=True, finish=_finish, rows=_rows)
