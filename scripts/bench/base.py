"""What every measurement shares: the run's context, the typed table row, the registry entry, formatting.

A measurement is a ``Measurement``: its ``--only`` name, the runs it keeps per repeat (medians
go to the figures), and up to four steps that ``scripts.bench.cli`` calls in registry order:
``setup`` once, ``repeat`` once per repeat (side by side with the others), ``finish`` once
after the repeats, and ``rows`` (the figures -> the table's ``Row`` s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from rich.console import Console

from broker.core.config import Settings
from broker.core.server import Server
from scripts.bench.pool import run_broker, wait_idle
from scripts.bench.workload import BenchError

#: The benchmark's queue manager.
QM = "BENCH"

Figures = dict[str, Any]
Runs = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Row:
    """One row of the table.

    Attributes:
        label: the row's number and name (``"2. broker 2 workers"``): tests and docs refer to them.
        pubs: publications/s (or resolves/s, tx/s), formatted; ``"-"`` where it means nothing.
        deliveries: deliveries/s, formatted.
        details: what was measured and how, with the secondary figures.
        cpu: CPU in % of one core, redis / our Python / foreign (``cpu3``), or ``""``.
    """

    label: str
    pubs: str
    deliveries: str
    details: str
    cpu: str = ""


@dataclass
class Ctx:
    """One bench run's state: the server, the client, the topologies, the runs and the figures.

    Attributes:
        args: the parsed command line (``scripts.bench.cli``).
        figures: everything measured, written as ``--json``.
        errors: measurement name -> its ``BenchError`` (a failed run does not stop the others).
        runs: per-repeat runs by name (``broker_2w``, ``selectors_on``...), medians go to ``figures``.
        state: what a measurement's ``setup`` made for its ``repeat``/``finish`` (a topology, a peer).
        closers: called at the end whatever happens (peers, clusters, checkouts).
    """

    args: argparse.Namespace
    console: Console
    figures: Figures
    errors: dict[str, str] = field(default_factory=dict)
    runs: Runs = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)
    server: Server | None = None
    client: redis.Redis | None = None
    settings: Settings | None = None
    topo: Any = None

    @property
    def only(self) -> set[str]:
        return set(self.args.only)

    def log(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}", highlight=False)

    def idle(self, what: str) -> dict[str, Any] | None:
        """Wait up to ``--idle-wait`` s for foreign CPU under 12% of a core; say so when it was not."""
        if self.args.idle_wait <= 0:
            return None
        assert self.server is not None and self.server.process is not None
        got = wait_idle([self.server.process.pid, os.getpid()], self.args.idle_wait)
        if not got["idle"]:
            self.log(
                f"[yellow]box not idle before {what}: foreign load {got['foreign_pct']:.0f}% of a core "
                f"after {got['waited_s']:.0f} s; measuring anyway[/yellow]"
            )
        return got

    def attempt(self, name: str, fn: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        """``fn(*a, **kw)``; a ``BenchError`` is recorded under ``name`` and gives None."""
        try:
            return fn(*a, **kw)
        except BenchError as exc:
            self.errors[name] = str(exc)[:2000]
            self.log(f"[red]{name} failed: {str(exc)[:500]}[/red]")
            return None

    def keep(self, name: str, got: dict[str, Any] | None, text: str | None = None) -> None:
        """Append a run to ``runs[name]`` and log its rate (``text``, default pubs/s)."""
        if got:
            self.runs[name].append(got)
            self.log(text or f"   {got['pubs_per_s']:,} pubs/s")


@dataclass(frozen=True)
class Measurement:
    """One registered measurement (see the module docstring for when each step runs).

    Attributes:
        name: its ``--only`` name.
        runs: the names of its per-repeat runs; each run's median (by ``median_key``) goes to
            ``figures[name]``.
        medians: put the medians of ``runs`` in the figures (False: ``finish`` places them).
        topology: it needs the shared topology (``Ctx.topo``).
    """

    name: str
    runs: tuple[str, ...] = ()
    median_key: str = "pubs_per_s"
    medians: bool = True
    topology: bool = False
    setup: Callable[[Ctx], None] | None = None
    repeat: Callable[[Ctx, int, str], None] | None = None
    finish: Callable[[Ctx], None] | None = None
    rows: Callable[[Figures], list[Row]] | None = None


# ------------------------------------------------------------------------------------ formatting


def fmt(value: Any, digits: int = 0) -> str:
    """A number with thousands separators, ``-`` for None or NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def cpu3(cpu: dict[str, float] | None, py_keys: tuple[str, ...]) -> str:
    """CPU in % of one core: redis / the sum of ``py_keys`` / foreign."""
    if not cpu:
        return ""
    py = sum(cpu.get(k, 0.0) for k in py_keys)
    return f"{cpu.get('redis', 0):.0f} / {py:.0f} / {cpu.get('foreign', 0):.0f}"


def percentiles(lat: dict[str, Any]) -> str:
    """A latency run's percentiles, as the table shows them."""
    return (
        f"p50 {lat['p50_ms']:.2f} / p90 {lat['p90_ms']:.2f} / p99 {lat['p99_ms']:.2f} / "
        f"p99.9 {lat['p999_ms']:.2f} / max {lat['max_ms']:.1f} ms ({lat['measured']:,} msgs)"
    )


def server_cpu_us(run: dict[str, Any]) -> float:
    """CPU-us per publication of Redis and the workers in a broker run (from its % of one core)."""
    cpu = run.get("cpu") or {}
    share = (cpu.get("redis", 0.0) + cpu.get("workers", 0.0)) / 100
    return share * run["elapsed_s"] * 1e6 / max(run["measured_publications"], 1)


def ratios(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> list[float]:
    """pubs/s with / without, per repeat (the runs of one repeat are side by side)."""
    return [round(b["pubs_per_s"] / a["pubs_per_s"], 3) for a, b in zip(off, on, strict=False)]


def paired(figures: Figures, num: str, den: str, den_key: str, fallback: float) -> float:
    """The median over repeats of ``num``'s pubs/s / ``den``'s ``den_key``, each pair measured in the same
    repeat (side by side, minutes apart at most: this shared box drifts by more than that between
    repeats); ``fallback`` (the ratio of the medians) when the repeats do not pair up."""
    runs = figures.get("runs") or {}
    a, b = runs.get(num) or [], runs.get(den) or []
    if not a or len(a) != len(b):
        return fallback
    return statistics.median(x["pubs_per_s"] / y[den_key] for x, y in zip(a, b, strict=True))


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the lower middle for an even count)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def run_notes(b: dict[str, Any], what: str) -> str:
    """The notes of a plain side-by-side broker run: what it is, N, XADD/s, steady rate, F, Redis CPU."""
    return (
        f"{what}; N={b['n']:,} ({fmt(b['preload_xadd_per_s'])} XADD/s); steady 10-90% "
        f"{fmt(b['steady_10_90_pubs_per_s'])}/s; F={b['fanout_measured']}; "
        f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
    )


def broker_row(label: str, b: dict[str, Any], notes: str) -> Row:
    """The row of a broker run (pool drain): pubs/s, deliveries/s, ``notes``, CPU of workers + bench."""
    return Row(
        label, fmt(b["pubs_per_s"]), fmt(b["deliveries_per_s"]), notes, cpu3(b["cpu"], ("workers", "bench"))
    )


def two_workers(ctx: Ctx, topology: Any, run_settings: Settings | None = None, **extra: Any) -> Any:
    """The 2-worker broker run of a side-by-side comparison (7., 9.-16.)."""
    a = ctx.args
    return run_broker(
        ctx.client, run_settings or ctx.settings, topology, a.n, 2, False, a.interleave, **extra
    )


def side_by_side(
    ctx: Ctx,
    rep: int,
    label: str,
    off: tuple[str, str, dict[str, Any]],
    on: tuple[str, str, dict[str, Any]],
    tag: str,
) -> None:
    """Measure both variants of one comparison, the order alternating from one repeat to the next.

    ``off``/``on``: ``(run name, what it is, keyword arguments of two_workers)``.
    """
    for name, what, kwargs in (off, on) if rep % 2 == 0 else (on, off):
        ctx.idle(name)
        ctx.log(f"{label}, {what}, N={ctx.args.n:,}{tag}")
        got = ctx.attempt(name, two_workers, ctx, **dict(kwargs))
        ctx.keep(name, got, got and f"   {got['pubs_per_s']:,} pubs/s, F={got['fanout_measured']}")
