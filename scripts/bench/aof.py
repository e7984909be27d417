"""Row 18, the broker with AOF on (appendfsync everysec), as RabbitMQ's persistent messages."""

from __future__ import annotations

import time
from typing import Any

import redis

from broker.core.config import Settings
from scripts.bench.base import Ctx, Figures, Measurement, Row, broker_row, ratios, run_notes
from scripts.bench.pool import run_broker
from scripts.bench.topology import Topology
from scripts.bench.workload import POLL_S, BenchError


def set_aof(client: redis.Redis, on: bool, timeout_s: float = 60.0) -> dict[str, Any]:
    """Turn the server's AOF on (``appendonly yes``, ``appendfsync everysec``) or off, at run time.

    Turning it on starts a rewrite of the data set into a new AOF: this waits until it is done
    (``aof_rewrite_in_progress`` and ``aof_rewrite_scheduled`` 0), so that the run measures
    appending, not the first rewrite.

    Returns:
        The server's ``appendonly``, ``appendfsync`` and ``aof_enabled`` afterwards.

    Raises:
        BenchError: the first rewrite did not finish within ``timeout_s``, or the setting did not take.
    """
    if on:
        client.config_set("appendfsync", "everysec")
    client.config_set("appendonly", "yes" if on else "no")
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.info("persistence")
        busy = info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
        if int(info.get("aof_enabled", 0)) == int(on) and not busy:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"AOF {'on' if on else 'off'}: not settled after {timeout_s:.0f} s: {info}")
        time.sleep(POLL_S)
    config = client.config_get("append*")
    return {
        "appendonly": config.get("appendonly"),
        "appendfsync": config.get("appendfsync"),
        "aof_enabled": int(info.get("aof_enabled", 0)),
    }


def run_broker_aof(
    client: redis.Redis, settings: Settings, topo: Topology, n: int, chunk: int
) -> dict[str, Any]:
    """``run_broker`` with 2 workers while the server appends to its AOF (``appendfsync everysec``);
    the AOF is turned off again afterwards, whatever happens."""
    aof = set_aof(client, True)
    try:
        result = run_broker(client, settings, topo, n, 2, False, chunk)
    finally:
        set_aof(client, False)
    return result | {"aof": aof}


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    a = ctx.args
    ctx.idle("broker aof")
    ctx.log(f"18. broker, 2 workers, AOF on (appendfsync everysec), N={a.n:,}{tag}")
    got = ctx.attempt("aof_2w", run_broker_aof, ctx.client, ctx.settings, ctx.topo, a.n, a.interleave)
    ctx.keep("aof_2w", got)


def _finish(ctx: Ctx) -> None:
    ctx.figures["aof_ratios"] = ratios(ctx.runs["broker_2w"], ctx.runs["aof_2w"])


def _rows(f: Figures) -> list[Row]:
    if "aof_2w" not in f:
        return []
    b = f["aof_2w"]
    off = f.get("broker_2w", {}).get("pubs_per_s")
    repeats = ", ".join(str(x) for x in f.get("aof_ratios") or [])
    return [
        broker_row(
            "18. broker 2 workers, AOF everysec",
            b,
            run_notes(b, "as 2 with 2 workers, appendonly yes + appendfsync everysec on the server")
            + (f"; AOF/no AOF {b['pubs_per_s'] / off:.2f} (per repeat {repeats})" if off else ""),
        )
    ]


MEASUREMENT = Measurement("aof", runs=("aof_2w",), topology=True, repeat=_repeat, finish=_finish, rows=_rows)
