"""``python -m scripts.bench``: the command line, the run (loops over ``registry.REGISTRY``) and the table.

What each row measures: the ``scripts.bench`` package docstring.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import scripts.bench
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.server import Server
from scripts.bench import instructions, rabbit
from scripts.bench.base import QM, Ctx, median_run
from scripts.bench.baseline import DEFAULT_BASELINE
from scripts.bench.e2e import e2e_text
from scripts.bench.federation import federation_text
from scripts.bench.pool import run_broker
from scripts.bench.registry import NAMES, REGISTRY
from scripts.bench.summary import final_line, profile_text, ratio_lines, redis_text, summary, targets_table
from scripts.bench.topology import Topology
from scripts.bench.workload import TOPICS, code_state, link_plan

#: The repository this bench runs from.
REPO = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    """The options of the run as a whole (sizes, repeats, --only); ``_row_options`` adds the rows' own."""
    parser = argparse.ArgumentParser(
        description=(scripts.bench.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: the whole run takes under a minute"
    )
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument(
        "--n",
        type=int,
        help="publications per broker run and ceiling, messages consumed (default 100k, quick 20k)",
    )
    parser.add_argument("--kombu-n", type=int, help="kombu publications (default 3,000, quick 1,000)")
    parser.add_argument("--rate", type=float, default=2000.0, help="paced publications/s for latency (2,000)")
    parser.add_argument("--latency-s", type=float, help="latency run length, s (default 10, quick 3)")
    parser.add_argument(
        "--match-sizes", help="comma-separated index sizes (default 1000,100000,1000000; quick 1000,100000)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        help="runs of measurements 1-3, 7, 9-11, 13-16, 23-26, medians reported (default 3, quick 1)",
    )
    parser.add_argument("--interleave", type=int, default=20, help="publications per publish_many call (20)")
    parser.add_argument(
        "--idle-wait",
        type=float,
        help="before each measurement wait up to this many s for foreign CPU < 12%% of a core "
        "(default 5, quick 0)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated subset of: ceiling,broker,hot,latency,kombu,match,selectors,consume,topics,flow,"
        "slow,swiftmq,federation,security,metrics,regression,rabbit,aof,memory,e2e,instructions,publish,retained,"
        "delay,groups,topic_stats",
    )
    _row_options(parser)
    return parser


def _row_options(parser: argparse.ArgumentParser) -> None:
    """The options of single rows: federation, RabbitMQ, memory, e2e, profile, instructions, regression."""
    parser.add_argument(
        "--fed-n", type=int, help="federation: publications per queue manager (default 10,000, quick 3,000)"
    )
    parser.add_argument(
        "--fed-workers", type=int, default=1, help="federation: workers per queue manager (1)"
    )
    parser.add_argument(
        "--fed-rate", type=float, default=200.0, help="federation: paced publications/s for latency (200)"
    )
    parser.add_argument(
        "--rabbit-n", type=int, help="RabbitMQ: publications per mode (default 20,000, quick 2,000)"
    )
    parser.add_argument(
        "--rabbit-procs", type=int, default=2, help="RabbitMQ: publisher processes for the 50 channels (2)"
    )
    parser.add_argument(
        "--rabbit-window",
        type=int,
        default=rabbit.WINDOW,
        help="RabbitMQ: unconfirmed messages per channel, persistent mode (100)",
    )
    parser.add_argument(
        "--memory-n",
        type=int,
        help="memory: envelopes in one queue, and 5x the publications fanned out (default N)",
    )
    parser.add_argument(
        "--e2e-saturated",
        type=float,
        help="20.: take this as the saturated 2-worker rate, pubs/s, instead of measuring it",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="also run 2 workers once more under py-spy (raw stacks in DIR, summary printed)",
    )
    parser.add_argument(
        "--instructions-n",
        type=int,
        help=f"21.: publications (and ceiling transactions) counted under callgrind "
        f"(default {instructions.DEFAULT_N:,}, quick 1,000)",
    )
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"16. the earlier commit to compare with (default {DEFAULT_BASELINE}: before the features of issues 13-15)",
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with the defaults of --quick or of a full run filled in."""
    parser = _parser()
    args = parser.parse_args(argv)
    quick = args.quick
    args.n = args.n or (20_000 if quick else 100_000)
    args.kombu_n = args.kombu_n or (1_000 if quick else 3_000)
    args.latency_s = args.latency_s or (3.0 if quick else 10.0)
    args.match_sizes = [
        int(x) for x in (args.match_sizes or ("1000,100000" if quick else "1000,100000,1000000")).split(",")
    ]
    args.repeat = args.repeat or (1 if quick else 3)
    args.fed_n = args.fed_n or (3_000 if quick else 10_000)
    args.rabbit_n = args.rabbit_n or (2_000 if quick else 20_000)
    args.memory_n = args.memory_n or args.n
    args.instructions_n = args.instructions_n or (1_000 if quick else instructions.DEFAULT_N)
    args.idle_wait = args.idle_wait if args.idle_wait is not None else (0.0 if quick else 5.0)
    sections = set(NAMES)
    args.only = set(args.only.split(",")) if args.only else sections
    if args.only - sections:
        parser.error(f"--only: unknown {sorted(args.only - sections)}")
    return args


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _environment(ctx: Ctx) -> None:
    """Record the server, the box and the code state in the figures."""
    assert ctx.server is not None and ctx.client is not None
    info: dict[str, Any] = ctx.client.info("server")
    ctx.figures["environment"] = {
        "server": (
            f"valkey {info['valkey_version']}"
            if "valkey_version" in info
            else f"redis {info['redis_version']}"
        ),
        "binary": ctx.server.binary,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "host": platform.node(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    ctx.figures["code"] = code_state(REPO)
    ctx.log(
        f"server {ctx.figures['environment']['server']} on {ctx.server.url} (pid {info['process_id']}); "
        f"code {ctx.figures['code']['describe']}"
    )


def _topology(ctx: Ctx) -> None:
    """Load the shared topology (admin API) when a selected measurement needs it."""
    if not any(m.topology and m.name in ctx.only for m in REGISTRY):
        return
    ctx.log("subscriptions and links (admin API) ...")
    topo = Topology.build(ctx.client, QM)
    ctx.topo = topo
    ctx.figures["topology"] = {
        "topics": len(TOPICS),
        "subscriptions": len(topo.sub_ids),
        "links": len(link_plan()),
        "setup_s": round(topo.setup_s, 2),
        "explain_checked": topo.checked,
        "example_route": topo.via.get("example"),
    }
    ctx.state["routes"] = topo.routes(ctx.client)


def _profile(ctx: Ctx) -> None:
    """``--profile``: one more 2-worker run under py-spy."""
    a = ctx.args
    Path(a.profile).mkdir(parents=True, exist_ok=True)
    ctx.log(f"profile: 2 workers under py-spy (100 Hz, --idle), N={a.n:,}; stacks in {a.profile}")
    got = ctx.attempt(
        "profile",
        run_broker,
        ctx.client,
        ctx.settings,
        ctx.topo,
        a.n,
        2,
        False,
        a.interleave,
        profile_dir=a.profile,
        label="worker",
    )
    if got:
        ctx.figures["profile"] = got


def run(ctx: Ctx) -> None:
    """Every selected measurement: ``setup`` of each, then the repeats side by side, the medians, ``finish``."""
    args = ctx.args
    ctx.server = Server().start()
    client = ctx.client = connect(ctx.server.url)
    _environment(ctx)
    settings = ctx.settings = Settings(redis_url=ctx.server.url, qm=QM)
    ctx.figures["settings"] = settings.model_dump(
        include={"batch_size", "heads", "lease_ms", "block_ms", "journal", "dedup_window_ms"}
    )
    _topology(ctx)
    selected = [m for m in REGISTRY if m.name in ctx.only]
    ctx.runs.update({name: [] for m in REGISTRY for name in m.runs})
    for m in selected:
        if m.setup is not None:
            m.setup(ctx)
    for rep in range(args.repeat):
        tag = f" (repeat {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
        for m in selected:
            if m.repeat is not None:
                m.repeat(ctx, rep, tag)
    ctx.figures["runs"] = ctx.runs
    for m in REGISTRY:
        for name in m.runs if m.medians else ():
            if ctx.runs[name]:
                ctx.figures[name] = median_run(ctx.runs[name], m.median_key)
    for m in selected:
        if m.finish is not None:
            m.finish(ctx)
    if args.profile and ctx.topo is not None:
        _profile(ctx)
    client.flushdb()


def stop(ctx: Ctx) -> None:
    """Stop every peer, cluster, checkout and the server, whatever happened."""
    for close in reversed(ctx.closers):
        close()
    if ctx.server is not None:
        ctx.server.stop()


def table(ctx: Ctx) -> Table:
    """The table: the rows of every measurement, in registry order."""
    f = ctx.figures
    reps = f"median of {ctx.args.repeat} runs" if ctx.args.repeat > 1 else "1 run each"
    env = f.get("environment", {})
    code = f.get("code", {}).get("describe", "?")
    out = Table(
        title=f"F=10, 50 publishers, 1,000 topics, 200 B bodies; code {code}; {env.get('server', '')}, "
        f"{env.get('cpus')} CPUs; {reps}; CPU in % of one core (redis / our Python / foreign)",
        title_justify="left",
        show_lines=True,
    )
    out.add_column("measurement", no_wrap=True)
    out.add_column("pubs/s", justify="right", no_wrap=True)
    out.add_column("deliv/s", justify="right", no_wrap=True)
    out.add_column("details", ratio=1)
    out.add_column("CPU r/py/fgn", no_wrap=True)
    for m in REGISTRY:
        for row in m.rows(f) if m.rows is not None else []:
            out.add_row(row.label, row.pubs, row.deliveries, row.details, row.cpu)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    console = Console(width=max(150, Console().width))
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    ctx = Ctx(
        args, console, {"args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}}
    )
    started = time.perf_counter()
    try:
        run(ctx)
    finally:
        stop(ctx)
    f = ctx.figures
    f["errors"] = ctx.errors
    f["elapsed_s"] = round(time.perf_counter() - started, 1)
    s = summary(f)
    console.print(table(ctx))
    console.print(targets_table(s))
    for text in (redis_text(f), federation_text(f), profile_text(f), e2e_text(f)):
        if text:
            console.print(text, highlight=False)
    for name, error in ctx.errors.items():
        console.print(f"[red]{name}: {error[:300]}[/red]")
    console.print(f"total {f['elapsed_s']:.0f} s", highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(f, indent=2, default=str) + "\n")
    for line in ratio_lines(f):
        console.print(line, highlight=False)
    print(final_line(s), flush=True)
    return 1 if ctx.errors else 0


if __name__ == "__main__":
    sys.exit(main())
