"""Row 7, selectors: the cost of one evaluation (the fan-out runs are ``run_broker(properties=True)``)."""

from __future__ import annotations

import random
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from broker.core.entries import parse_entry
from broker.core.models import publication_fields
from broker.core.selectors import compile_selector
from scripts.bench.base import (
    QM,
    Ctx,
    Figures,
    Measurement,
    Row,
    broker_row,
    fmt,
    ratios,
    run_notes,
    side_by_side,
)
from scripts.bench.topology import Topology
from scripts.bench.workload import PUBLISHERS, SELECTOR, SELECTOR_EVERY, TOPICS, bodies, selector_props


def selector_sample(size: int = 1000, seed: int = 21) -> list[dict[str, object]]:
    """What a worker's selectors see for ``size`` publications with ``selector_props``: each built
    with ``publication_fields``, parsed with ``parse_entry`` and read with ``Entry.selector_properties``
    (user properties and the JMS header fields)."""
    rng = random.Random(seed)
    body = bodies(1)[0]
    now_ms = int(time.time() * 1000)
    sample = []
    for i in range(size):
        fields = publication_fields(
            f"p{i % PUBLISHERS:02d}",
            TOPICS[i % len(TOPICS)],
            body,
            msgid=f"m{i}",
            seq=i + 1,
            properties=selector_props(rng),
        )
        raw = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}
        sample.append(parse_entry(f"{now_ms}-{i}", raw, 1 << 20).selector_properties())
    return sample


def run_selector_cost(
    selector: str = SELECTOR, size: int = 1000, rounds: int = 7, min_s: float = 0.05
) -> dict[str, Any]:
    """Time ``compile_selector(selector).matches`` over ``selector_sample(size)`` in a tight loop.

    ``rounds`` timeit rounds of at least ``min_s`` each; the loop's own cost (a for loop
    calling a one-argument no-op) is measured the same way and reported, not subtracted.

    Returns:
        ``{"selector", "sample", "selected_share", "median_us", "min_us", "loop_us", "rounds"}``.
    """
    sample = selector_sample(size)
    matches = compile_selector(selector).matches

    def noop(properties: object) -> bool:
        return True

    def per_call(fn: Callable[[Any], Any]) -> list[float]:
        timer = timeit.Timer("for p in sample: fn(p)", globals={"sample": sample, "fn": fn})
        number, taken = timer.autorange()
        number = max(1, round(number * min_s / taken))
        return [t / (number * len(sample)) for t in timer.repeat(rounds, number)]

    times = per_call(matches)
    loop = per_call(noop)
    return {
        "selector": selector,
        "sample": len(sample),
        "selected_share": round(sum(matches(p) for p in sample) / len(sample), 3),
        "median_us": round(statistics.median(times) * 1e6, 3),
        "min_us": round(min(times) * 1e6, 3),
        "loop_us": round(statistics.median(loop) * 1e6, 3),
        "rounds": rounds,
    }


# --------------------------------------------------------------------------------------------
# 8. One consumer: receive_many + ack_many against receive + ack
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Row 7 in the bench's registry: 2 workers with and without selectors, side by side
# --------------------------------------------------------------------------------------------


def _setup(ctx: Ctx) -> None:
    ctx.log(f"the same with a selector on every {SELECTOR_EVERY}th subscription ...")
    sel_topo = Topology.build(ctx.client, QM, selector=SELECTOR)
    ctx.state["sel_topo"] = sel_topo
    ctx.figures["topology_selectors"] = {
        "selector": SELECTOR,
        "every": SELECTOR_EVERY,
        "selective_subscriptions": len(sel_topo.selective),
        "setup_s": round(sel_topo.setup_s, 2),
    }


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    sel_topo = ctx.state["sel_topo"]
    side_by_side(
        ctx,
        rep,
        "7. broker, 2 workers, properties on every publication",
        ("selectors_off", "no selectors", dict(topology=ctx.topo, properties=True)),
        ("selectors_on", f"{len(sel_topo.selective)} selectors", dict(topology=sel_topo, properties=True)),
        tag,
    )


def _finish(ctx: Ctx) -> None:
    ctx.log(f"7. selector evaluation: compile_selector({SELECTOR!r}).matches, timeit")
    ctx.figures["selector_eval"] = run_selector_cost()
    ctx.figures["selector_ratios"] = ratios(ctx.runs["selectors_off"], ctx.runs["selectors_on"])


def _rows(f: Figures) -> list[Row]:
    rows = []
    if "selectors_off" in f:
        b = f["selectors_off"]
        rows.append(
            broker_row(
                "7. no selectors",
                b,
                run_notes(b, "as 2 with 2 workers, region + amount properties on every publication"),
            )
        )
    if "selectors_on" in f:
        b = f["selectors_on"]
        ev = f.get("selector_eval") or {}
        off = f.get("selectors_off", {}).get("pubs_per_s")
        ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
        notes = (
            f"same, {b['selective_subscriptions']} subscriptions with {SELECTOR!r}: "
            f"{b['selector_evaluations'] / b['n']:.2f} evaluations/pub, "
            f"{b['selected_share']:.0%} selected; F={b['fanout_measured']} "
            f"(= expected {b['expected_deliveries'] / b['n']:.3f}); with/without {ratio} "
            f"(per repeat {', '.join(str(x) for x in f.get('selector_ratios') or [])}); "
            f"steady 10-90% {fmt(b['steady_10_90_pubs_per_s'])}/s; "
            f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub; one evaluation "
            f"{fmt(ev.get('median_us'), 2)} us median (loop alone {fmt(ev.get('loop_us'), 2)} us, "
            f"{ev.get('sample', 0):,} property dicts, {fmt(ev.get('selected_share'), 2)} selected)"
        )
        rows.append(broker_row("7. 20% selectors", b, notes))
    return rows


MEASUREMENT = Measurement(
    "selectors",
    runs=("selectors_off", "selectors_on"),
    topology=True,
    setup=_setup,
    repeat=_repeat,
    finish=_finish,
    rows=_rows,
)
