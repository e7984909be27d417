"""Two commits side by side, each running its OWN benchmark from its own checkout, in alternating rounds.

Usage::

    .venv/bin/python -m scripts.bench_ab 6644fac HEAD                  # 5 rounds of every row
    .venv/bin/python -m scripts.bench_ab 6644fac . --rows instructions  # the working tree as is
    .venv/bin/python -m scripts.bench_ab 6644fac HEAD --rounds 3 --n 40000 --latency-s 8

Why: the bench's own regression row runs an older commit's code under THIS commit's harness,
which cannot run a commit that speaks an older protocol. Here each side is a clone of the
repository at that commit (``--workdir``, default ``/tmp/bench-ab/<sha>``) with a venv of its
own (``pip install -e .``, made once and kept), and runs its own ``python -m scripts.bench``:

- ``broker``: ``--only broker --n N --repeat 1``: the 2-worker pool's publications/s;
- ``latency``: ``--only latency --latency-s S``: p99 and p50 (ms) at 2,000/s, XADD -> BRPOP, and
  the rate the paced publisher reached;
- ``publish``: microseconds per ``Publisher.publish()`` call (wall and CPU), flow control on and
  off, with bare redis-py XADDs as the reference (``scripts/ab_publish.py``, that commit's code,
  against one server this process starts);
- ``python``: the worker's Python per publication (CPU µs, ``python_cpu_us``), one in-process worker
  of that commit draining the bench's topology and preload (``scripts/ab_python.py``, that commit's
  code and harness), against one server this process starts; alternating rounds. With it, the
  server's CPU per publication through those drains, user and system apart (``server_user_us``,
  ``server_sys_us``, ``INFO cpu``): what the 2-worker drain is bound by once the server is busy;
- ``instructions``: the server's instructions per publication, counted by valgrind's callgrind
  around one in-process worker of that commit draining N publications of one fixed workload
  (``scripts/ab_instructions.py``, run by that commit's interpreter on that commit's code). It
  is deterministic, so it runs once per side: the figure this box's drift does not move.
  The worker's clock stands still while the publications are counted (its timers cost per second,
  not per publication, and callgrind slows the server 15-50x: ``ab_instructions.py``); the
  instructions of one second of its timers (sweeps, heartbeat, topic statistics' flush) are
  counted apart: ``ir_timers_per_s``.
- ``paced``: the same count with each publication published alone and handled before the next
  (``AB_PACED=1``: one publication per dequeue and per commit, the shape of the latency row at
  2,000/s, where a call's fixed cost is not shared by a batch): server instructions per
  publication at the low rate.

The timed rows alternate sides (old, new, then new, old, ...) so that a drift of the box
weighs on both alike. What to read are the *paired* ratios new/old of each round and their
median. ``.`` as a side is the working tree as it is, run with this interpreter.

The last line is ``ab: broker_ratio=… p99_ratio=… rate_old=… rate_new=… ir_ratio=…``
(ratios new/old; for broker higher is better, for p99 and instructions lower is better).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = ("broker", "latency", "publish", "python", "instructions", "paced")


@dataclass
class Side:
    """One commit under test: where its checkout is and which interpreter runs it."""

    rev: str
    label: str
    root: Path
    python: Path
    figures: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.figures.setdefault(name, []).append(value)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def prepare(rev: str, workdir: Path) -> Side:
    """A checkout of ``rev`` with its own venv (made once, then reused); ``.``: this working tree."""
    if rev == ".":
        return Side(".", "worktree", REPO, Path(sys.executable))
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    root = workdir / sha[:12]
    python = root / ".venv" / "bin" / "python"
    if not python.exists():
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        print(f"preparing {rev} ({sha[:12]}) in {root}: clone and venv (once)", flush=True)
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "checkout", "--quiet", sha], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(root / ".venv")], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", str(root)], check=True)
    return Side(rev, f"{rev} ({sha[:7]})", root, python)


def _env(side: Side) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("BROKER_") or k == "BROKER_REDIS_SERVER_BIN"
    }
    env["PYTHONPATH"] = str(side.root)
    return env


def run_bench(side: Side, args: list[str]) -> dict:
    """Run the side's own ``scripts.bench`` with ``args``; returns its ``--json`` figures."""
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        out = Path(tmp) / "figures.json"
        proc = subprocess.run(
            [str(side.python), "-m", "scripts.bench", *args, "--json", str(out)],
            cwd=side.root,
            env=_env(side),
            capture_output=True,
            text=True,
        )
        if not out.exists():
            raise RuntimeError(
                f"{side.label}: bench {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return json.loads(out.read_text())


def timed_round(side: Side, rows: set[str], n: int, latency_s: float) -> None:
    if "broker" in rows:
        got = run_bench(side, ["--only", "broker", "--n", str(n), "--repeat", "1"])
        if "broker_2w" not in got:  # the run failed (its log says why): this round's figure is missing
            raise RuntimeError(
                f"{side.label}: the broker row gave no 2-worker figure ({', '.join(sorted(got))})"
            )
        side.add("broker_pubs_per_s", float(got["broker_2w"]["pubs_per_s"]))
    if "latency" in rows:
        got = run_bench(side, ["--only", "latency", "--latency-s", str(latency_s)])["latency"]
        side.add("p99_ms", float(got["p99_ms"]))
        side.add("p50_ms", float(got["p50_ms"]))
        side.add("rate_reached", float(got["achieved_rate"]))


def _driver(side: Side, name: str, url: str, n: int) -> dict:
    """Run ``scripts/<name>.py URL N`` with the side's code; its last line of output, JSON."""
    proc = subprocess.run(
        [str(side.python), str(Path(__file__).with_name(f"{name}.py")), url, str(n)],
        cwd=side.root,
        env=_env(side),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{side.label}: {name} driver failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def publish_round(side: Side, url: str, n: int) -> None:
    """One run of ``scripts/ab_publish.py`` with the side's code against ``url``."""
    got = _driver(side, "ab_publish", url, n)
    for name in ("flow_on_us", "flow_on_cpu_us", "flow_off_us", "flow_off_cpu_us", "xadd_cpu_us"):
        if name in got:
            side.add(f"publish_{name}", float(got[name]))


def python_round(side: Side, url: str, n: int) -> None:
    """One run of ``scripts/ab_python.py`` with the side's code against ``url``."""
    got = _driver(side, "ab_python", url, n)
    for name in ("python_cpu_us", "server_user_us", "server_sys_us"):
        side.add(name, float(got[name]))


def instructions(sides: list[Side], n: int, paced: bool = False) -> None:
    """Each side's server instructions per publication (``scripts/ab_instructions.py``); ``paced``:
    one publication at a time (``AB_PACED=1``), figure ``ir_paced_per_pub``."""
    from broker.core.server import Server, server_binary

    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            print(f"instructions: {tool} is not installed (Debian: apt-get install valgrind): row skipped")
            return
    driver = Path(__file__).with_name("ab_instructions.py")
    for side in sides:
        with tempfile.TemporaryDirectory(prefix="bench-ab-cg-") as tmp:
            work = Path(tmp)
            wrapper = work / "server.sh"
            wrapper.write_text(
                "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
                f'--callgrind-out-file="{work}/callgrind.out" "{server_binary()}" "$@"\n'
            )
            wrapper.chmod(0o755)
            server = Server(binary=str(wrapper)).start()
            try:
                assert server.process is not None
                pid = str(server.process.pid)
                env = {**_env(side), "AB_PACED": "1" if paced else "0"}
                proc = subprocess.run(
                    [str(side.python), str(driver), server.url, pid, str(n)],
                    cwd=side.root,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    raise RuntimeError(f"{side.label}: instructions driver failed:\n{proc.stderr[-3000:]}")
                subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
                # the driver dumped the publications' counts; the dump just made holds its timers' second
                dumps = sorted(work.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
                publications, timers = (_totals(d) for d in dumps[-2:])
                side.add("ir_paced_per_pub" if paced else "ir_per_pub", publications / n)
                if not paced:
                    side.add("ir_timers_per_s", timers)
            finally:
                server.stop()


def _totals(dump: Path) -> int:
    """The instructions a callgrind dump counted (its ``totals:`` line)."""
    return next(int(line.split()[1]) for line in dump.read_text().splitlines() if line.startswith("totals:"))


def _ratios(new: list[float], old: list[float]) -> list[float]:
    return [b / a for a, b in zip(old, new, strict=False) if a]


def report(old: Side, new: Side) -> str:
    print(f"\n{'figure':<20} {'old ' + old.label:>34} {'new ' + new.label:>34}   paired new/old")
    summary: dict[str, str] = {}
    names = ["broker_pubs_per_s", "p99_ms", "p50_ms", "rate_reached", "python_cpu_us", "server_user_us"]
    names += ["server_sys_us", "ir_per_pub", "ir_paced_per_pub", "ir_timers_per_s"]
    names += sorted(k for k in {**old.figures, **new.figures} if k.startswith("publish_"))
    for name in names:
        a, b = old.figures.get(name), new.figures.get(name)
        if not a or not b:
            continue
        ratios = _ratios(b, a)
        shown_a = " / ".join(f"{x:.0f}" if x >= 100 else f"{x:.2f}" for x in a)
        shown_b = " / ".join(f"{x:.0f}" if x >= 100 else f"{x:.2f}" for x in b)
        med = statistics.median(ratios)
        print(
            f"{name:<20} {shown_a:>34} {shown_b:>34}   {' '.join(f'{r:.2f}' for r in ratios)} (median {med:.3f})"
        )
        key = {
            "broker_pubs_per_s": "broker_ratio",
            "p99_ms": "p99_ratio",
            "p50_ms": "p50_ratio",
            "ir_per_pub": "ir_ratio",
            "python_cpu_us": "python_ratio",
            "server_user_us": "server_user_ratio",
            "server_sys_us": "server_sys_ratio",
            "ir_paced_per_pub": "ir_paced_ratio",
            "publish_flow_on_cpu_us": "publish_cpu_ratio",
            "publish_flow_off_cpu_us": "publish_noflow_cpu_ratio",
        }.get(name)
        if key:
            summary[key] = f"{med:.3f}"
        if name == "rate_reached":
            summary["rate_old"] = f"{min(a):.0f}"
            summary["rate_new"] = f"{min(b):.0f}"
    return "ab: " + " ".join(f"{k}={v}" for k, v in summary.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the commit to compare against (any git revision)")
    parser.add_argument(
        "new", nargs="?", default="HEAD", help="the commit under test (default HEAD; '.': the working tree)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating rounds of the timed rows (default 5)"
    )
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--n", type=int, default=40_000, help="publications per broker run (default 40,000)")
    parser.add_argument("--latency-s", type=float, default=8.0, help="latency run length, s (default 8)")
    parser.add_argument(
        "--publish-n", type=int, default=20_000, help="publish() calls timed per run (default 20,000)"
    )
    parser.add_argument(
        "--python-n", type=int, default=20_000, help="publications drained per python run (default 20,000)"
    )
    parser.add_argument(
        "--ir-n", type=int, default=3_000, help="publications counted under callgrind (default 3,000)"
    )
    parser.add_argument(
        "--paced-n", type=int, default=500, help="publications counted one at a time (default 500)"
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bench-ab")
    args = parser.parse_args(argv)
    rows = set(args.rows.split(","))
    unknown = rows - set(ROWS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    old, new = prepare(args.old, args.workdir), prepare(args.new, args.workdir)
    started = time.monotonic()
    if rows & {"broker", "latency"}:
        for r in range(args.rounds):
            order = (old, new) if r % 2 == 0 else (new, old)
            for side in order:
                try:
                    timed_round(side, rows, args.n, args.latency_s)
                except RuntimeError as exc:  # a failed run: its figures are missing, the rest go on
                    print(f"round {r + 1}: {exc}", file=sys.stderr)
            print(f"round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s)", flush=True)
    failed = []
    for row, run_one, count in (
        ("publish", publish_round, args.publish_n),
        ("python", python_round, args.python_n),
    ):
        if row not in rows:
            continue
        from broker.core.server import Server

        server = Server().start()
        try:
            for r in range(args.rounds):
                for side in (old, new) if r % 2 == 0 else (new, old):
                    run_one(side, server.url, count)
        except RuntimeError as exc:  # one row failing must not lose the others' figures
            failed.append(f"{row}: {exc}")
        finally:
            server.stop()
    if "instructions" in rows:
        try:
            instructions([old, new], args.ir_n)
        except RuntimeError as exc:
            failed.append(f"instructions: {exc}")
    if "paced" in rows:
        try:
            instructions([old, new], args.paced_n, paced=True)
        except RuntimeError as exc:
            failed.append(f"paced: {exc}")
    for why in failed:
        print(f"row failed: {why}", file=sys.stderr)
    print(report(old, new))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
