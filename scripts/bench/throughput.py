"""Rows 2-3: the broker's throughput with 1 and 2 workers, and with one hot publisher (half of N)."""

from __future__ import annotations

from scripts.bench.base import Ctx, Figures, Measurement, Row, broker_row, fmt
from scripts.bench.pool import run_broker


def run_hot(ctx: Ctx, tag: str) -> None:
    """3.: 2 workers, one hot publisher; appended to ``runs["hot_2w"]``."""
    a = ctx.args
    ctx.idle("hot publisher")
    ctx.log(f"3. broker, 2 workers, one hot publisher (half of N={a.n:,}){tag}")
    got = ctx.attempt("hot_2w", run_broker, ctx.client, ctx.settings, ctx.topo, a.n, 2, True, a.interleave)
    ctx.keep("hot_2w", got)


def _repeat_broker(ctx: Ctx, rep: int, tag: str) -> None:
    """2. (and 3. between the 2- and the 1-worker run: the three side by side)."""
    a = ctx.args
    for workers in (2, 1):
        if workers == 1 and "hot" in ctx.only:
            run_hot(ctx, tag)
        ctx.idle(f"broker {workers}w")
        ctx.log(f"2. broker, {workers} worker(s), N={a.n:,}{tag}")
        name = f"broker_{workers}w"
        got = ctx.attempt(
            name, run_broker, ctx.client, ctx.settings, ctx.topo, a.n, workers, False, a.interleave
        )
        ctx.keep(name, got)


def _repeat_hot(ctx: Ctx, rep: int, tag: str) -> None:
    if "broker" not in ctx.only:  # else measured with the broker's runs
        run_hot(ctx, tag)


def _rows(f: Figures) -> list[Row]:
    rows = []
    for key, label, conf in (
        ("broker_1w", "2. broker 1 worker", ""),
        ("broker_2w", "2. broker 2 workers", ""),
        ("hot_2w", "3. hot publisher", "p00 sends 50%; "),
    ):
        if key not in f:
            continue
        b = f[key]
        split = "/".join(f"{x:.0%}" for x in b["work_split"]) if b.get("work_split") else "?"
        notes = (
            f"{conf}N={b['n']:,} preloaded ({fmt(b['preload_xadd_per_s'])} XADD/s); steady 10-90% "
            f"{fmt(b['steady_10_90_pubs_per_s'])}/s, from spawn {fmt(b['from_spawn_pubs_per_s'])}/s; "
            f"F={b['fanout_measured']}; order inversions {b['order_inversions']}/{b['order_checked']:,}; "
            f"work split {split}; "
            f"dedup records {b['dedup_records_found']}; redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
        )
        rows.append(broker_row(label, b, notes))
    return rows


BROKER = Measurement(
    "broker", runs=("broker_1w", "broker_2w"), topology=True, repeat=_repeat_broker, rows=_rows
)
HOT = Measurement("hot", runs=("hot_2w",), topology=True, repeat=_repeat_hot)
