"""Rows 9-12, 14-16, 23, 24 and 26: what a feature costs when it is on, 2 workers with and without it, side by side.

Each is a ``Measurement`` made by ``_comparison``: a ``setup`` that prepares the variant
(topic objects, a scheme's topology, settings, an earlier commit's pool), a ``repeat`` that runs
``<name>_off`` and ``<name>_on`` side by side (the order alternating per repeat), and a
``finish`` that keeps their ratios per repeat as ``<ratios key>``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.config import SlowSubscriberCondition
from broker.core.server import free_port
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
from scripts.bench.baseline import BaselineCheckout, BaselineError, pool_factory
from scripts.bench.match import run_hierarchy_matching, swiftmq_matching_rows
from scripts.bench.topology import Topology
from scripts.bench.workload import (
    TOPIC_OBJECTS,
    swiftmq_subscription_plan,
    topic_object_coverage,
    topic_object_plan,
)

#: The repository this bench runs from (the regression row checks an earlier commit of it out).
REPO = Path(__file__).resolve().parents[2]

Variant = Callable[[Ctx], tuple[str, dict[str, Any]]]


def _comparison(
    name: str,
    label: str,
    off: Variant,
    on: Variant,
    rows: Callable[[Figures], list[Row]],
    setup: Callable[[Ctx], None] | None = None,
    finish: Callable[[Ctx], None] | None = None,
    ratios_key: str | None = None,
) -> Measurement:
    """A side-by-side measurement: ``off``/``on`` give (what it is, keyword arguments of ``two_workers``)."""

    def repeat(ctx: Ctx, rep: int, tag: str) -> None:
        if ctx.state.get(f"{name}_skip"):
            return
        side_by_side(ctx, rep, label, (f"{name}_off", *off(ctx)), (f"{name}_on", *on(ctx)), tag)

    def done(ctx: Ctx) -> None:
        ctx.figures[ratios_key or f"{name}_ratios"] = ratios(ctx.runs[f"{name}_off"], ctx.runs[f"{name}_on"])
        if finish is not None:
            finish(ctx)

    return Measurement(
        name,
        runs=(f"{name}_off", f"{name}_on"),
        topology=True,
        setup=setup,
        repeat=repeat,
        finish=done,
        rows=rows,
    )


def _on_off_rows(
    name: str, off_row: tuple[str, str], on_row: tuple[str, str]
) -> Callable[[Figures], list[Row]]:
    """Rows of a plain comparison: the notes of each run, on/off per repeat on the ``on`` row."""

    def rows(f: Figures) -> list[Row]:
        out = []
        for key, (label, what) in ((f"{name}_off", off_row), (f"{name}_on", on_row)):
            if key not in f:
                continue
            b = f[key]
            notes = run_notes(b, what)
            off = f.get(f"{name}_off", {}).get("pubs_per_s")
            if key.endswith("_on") and off:
                repeats = ", ".join(str(x) for x in f.get(f"{name}_ratios") or [])
                notes += f"; on/off {b['pubs_per_s'] / off:.2f} (per repeat {repeats})"
            out.append(broker_row(label, b, notes))
        return out

    return rows


# ------------------------------------------------------------------------------ 9. topic objects


def _topics_setup(ctx: Ctx) -> None:
    objects = topic_object_plan()
    ctx.state["objects"] = objects
    ctx.figures["topic_objects"] = {
        "count": len(objects),
        "coverage": round(topic_object_coverage(objects), 3),
        "examples": [f"{o.name} -> {o.topic_string}" for o in objects[::40]],
    }


def _topics_rows(f: Figures) -> list[Row]:
    rows = []
    if "topics_off" in f:
        b = f["topics_off"]
        rows.append(
            broker_row("9. no topic objects", b, run_notes(b, "as 2 with 2 workers, {qm}:topics absent"))
        )
    if "topics_on" in f:
        b = f["topics_on"]
        off = f.get("topics_off", {}).get("pubs_per_s")
        ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
        notes = (
            f"same topology and publications, {b['topic_objects']} objects defined "
            f"({b['topic_objects_define_s']} s, untimed) over bench/r, audit/r, bench/r/c, "
            f"leaf topics; {b['topic_objects_coverage']:.0%} of topics under one; attributes "
            f"that change nothing; F={b['fanout_measured']}, {b['dead_lettered']} dead-lettered; "
            f"with/without {ratio} (per repeat "
            f"{', '.join(str(x) for x in f.get('topic_objects_ratios') or [])}); "
            f"steady 10-90% {fmt(b['steady_10_90_pubs_per_s'])}/s; "
            f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
        )
        rows.append(broker_row(f"9. {TOPIC_OBJECTS} topic objects", b, notes))
    return rows


TOPIC_OBJECTS_ROW = _comparison(
    "topics",
    "9. broker, 2 workers",
    lambda ctx: ("no topic objects", dict(topology=ctx.topo, topic_objects=[])),
    lambda ctx: (
        f"{len(ctx.state['objects'])} topic objects",
        dict(topology=ctx.topo, topic_objects=ctx.state["objects"]),
    ),
    _topics_rows,
    setup=_topics_setup,
    ratios_key="topic_objects_ratios",
)

# ------------------------------------------------------------------------------ 10. flow control

FLOW = _comparison(
    "flow",
    "10. broker, 2 workers",
    lambda ctx: (
        "flow control off",
        dict(topology=ctx.topo, run_settings=ctx.settings.model_copy(update={"flowcontrol_enabled": False})),
    ),
    lambda ctx: ("flow control on (the default)", dict(topology=ctx.topo)),
    _on_off_rows(
        "flow",
        ("10. flow control off", "as 2 with 2 workers, flowcontrol_enabled false"),
        (
            "10. flow control on",
            "same, flow control on (the default curve; queues are never drained, so past 1,000 "
            "messages every publication gets a delay and its publisher's flow key is set)",
        ),
    ),
)

# ------------------------------------------------------------------------------ 11. slow subscribers

_NEVER_SLOW = SlowSubscriberCondition(name="bench", max_messages=10**9, persistence_mode="all")

SLOW = _comparison(
    "slow",
    "11. broker, 2 workers",
    lambda ctx: ("no slow-subscriber condition", dict(topology=ctx.topo)),
    lambda ctx: (
        "a condition on root topic bench, never met",
        dict(
            topology=ctx.topo,
            run_settings=ctx.settings.model_copy(update={"slow_subscriber_conditions": [_NEVER_SLOW]}),
        ),
    ),
    _on_off_rows(
        "slow",
        ("11. no slow condition", "as 2 with 2 workers, no slow-subscriber condition"),
        (
            "11. slow condition",
            "same, a slow-subscriber condition on root topic 'bench' (every publication, "
            "persistence_mode all) never met (max_messages 10**9): every recipient queue watched",
        ),
    ),
)

# ------------------------------------------------------------------------------ 23. retained publications

RETAINED = _comparison(
    "retained",
    "23. broker, 2 workers",
    lambda ctx: ("no retained publication", dict(topology=ctx.topo)),
    lambda ctx: ("every publication retained", dict(topology=ctx.topo, retain=True)),
    _on_off_rows(
        "retained",
        ("23. not retained", "as 2 with 2 workers, no publication retained"),
        (
            "23. all retained",
            "same, every publication retained (retain 1: commit.lua keeps each topic's last in "
            "{qm}:retained, one HSET per publication and one TYPE per call)",
        ),
    ),
)

# ------------------------------------------------------------------------------ 24. delivery delay

#: Row 24.'s delivery delay, ms: every publication is due by the time a worker reads it (the preload
#: comes first), so the row prices the way through ``{qm}:delayed``, not a wait.
DELAY_MS = 5

DELAY = _comparison(
    "delay",
    "24. broker, 2 workers",
    lambda ctx: ("nothing delayed", dict(topology=ctx.topo)),
    lambda ctx: (f"every publication delayed {DELAY_MS} ms", dict(topology=ctx.topo, delay_ms=DELAY_MS)),
    _on_off_rows(
        "delay",
        ("24. not delayed", "as 2 with 2 workers, no delivery_time field"),
        (
            "24. all delayed",
            f"same, every publication with a delivery time {DELAY_MS} ms after its XADD (due when read: "
            "dequeue.lua moves each into {qm}:delayed, a ZADD, and the release XADDs it back to the "
            "publish stream, read and committed as any)",
        ),
    ),
)

# ------------------------------------------------------------------------------ 26. topic statistics

TOPIC_STATS = _comparison(
    "topic_stats",
    "26. broker, 2 workers",
    lambda ctx: (
        "topic statistics off",
        dict(topology=ctx.topo, run_settings=ctx.settings.model_copy(update={"topic_stats_max_topics": 0})),
    ),
    lambda ctx: ("topic statistics on (the default)", dict(topology=ctx.topo)),
    _on_off_rows(
        "topic_stats",
        ("26. topic statistics off", "as 2 with 2 workers, topic_stats_max_topics 0"),
        (
            "26. topic statistics on",
            "same, topic statistics on (the default topic_stats_max_topics 1,000: a dict update per "
            "delivered publication in the worker, flushed every topic_stats_flush_ms off the hot path)",
        ),
    ),
)

# ------------------------------------------------------------------------------ 12. swiftmq scheme


def _swiftmq_setup(ctx: Ctx) -> None:
    ctx.log("the same topology in the swiftmq scheme (dot topics, % predicates) ...")
    swift_topo = Topology.build(ctx.client, QM, scheme="swiftmq")
    ctx.state["swift_topo"] = swift_topo
    ctx.figures["topology_swiftmq"] = {
        "subscriptions": len(swift_topo.sub_ids),
        "predicates": sum(1 for f, _, _ in swiftmq_subscription_plan() if "%" in f),
        "setup_s": round(swift_topo.setup_s, 2),
        "example_route": swift_topo.via.get("example"),
    }


def _swiftmq_finish(ctx: Ctx) -> None:
    sizes = ctx.args.match_sizes
    ctx.idle("swiftmq matching")
    ctx.log(f"12. swiftmq matching: indexes of {', '.join(f'{n:,}' for n in sizes)}")
    ctx.figures["swiftmq_matching"] = run_hierarchy_matching(sizes, min_s=0.2 if ctx.args.quick else 0.4)


def _swiftmq_rows(f: Figures) -> list[Row]:
    rows = []
    if "swiftmq_off" in f:
        b = f["swiftmq_off"]
        notes = f"as 2 with 2 workers (the same runs as 12. swiftmq, alternating); F={b['fanout_measured']}"
        rows.append(broker_row("12. mqtt scheme", b, notes))
    if "swiftmq_on" in f:
        b = f["swiftmq_on"]
        off = f.get("swiftmq_off", {}).get("pubs_per_s")
        ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
        topo = f.get("topology_swiftmq", {})
        notes = (
            f"the same workload as dot topics bench.r.c.j: {topo.get('subscriptions')} subscriptions, "
            f"{topo.get('predicates')} with % predicates, 1,000 links; F={b['fanout_measured']}; "
            f"swiftmq/mqtt {ratio} (per repeat {', '.join(str(x) for x in f.get('swiftmq_ratios') or [])}); "
            f"steady 10-90% {fmt(b['steady_10_90_pubs_per_s'])}/s; redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
        )
        rows.append(broker_row("12. swiftmq scheme", b, notes))
    return rows + swiftmq_matching_rows(f)


SWIFTMQ = _comparison(
    "swiftmq",
    "12. broker, 2 workers",
    lambda ctx: ("mqtt scheme", dict(topology=ctx.topo)),
    lambda ctx: ("swiftmq scheme, dot topics", dict(topology=ctx.state["swift_topo"])),
    _swiftmq_rows,
    setup=_swiftmq_setup,
    finish=_swiftmq_finish,
)

# ------------------------------------------------------------------------------ 14. security

SECURITY = _comparison(
    "security",
    "14. broker, 2 workers",
    lambda ctx: ("security off", dict(topology=ctx.topo)),
    lambda ctx: (
        "security on: principal users through ingress streams, a worker user",
        dict(topology=ctx.topo, security=True),
    ),
    _on_off_rows(
        "security",
        ("14. security off", "as 2 with 2 workers, publishers XADD to the publish stream"),
        (
            "14. security on",
            "same, each publisher id as its own principal ACL user XADDing to its ingress stream "
            "(moved into the publish stream by the queue mutex), the workers as a worker user",
        ),
    ),
)

# ------------------------------------------------------------------------------ 15. metrics

METRICS = _comparison(
    "metrics",
    "15. broker, 2 workers",
    lambda ctx: ("metrics off (metrics_port 0, the default)", dict(topology=ctx.topo)),
    lambda ctx: (
        "metrics on: the workers record, the pool serves /metrics",
        dict(topology=ctx.topo, run_settings=ctx.settings.model_copy(update={"metrics_port": free_port()})),
    ),
    lambda f: [],  # printed as a line of its own before the last one
)

# ------------------------------------------------------------------------------ 16. regression


def _regression_setup(ctx: Ctx) -> None:
    try:
        baseline = BaselineCheckout(REPO, ctx.args.baseline)
    except BaselineError as exc:
        ctx.errors["regression"] = str(exc)
        ctx.log(f"[red]regression: {exc}[/red]")
        ctx.state["regression_skip"] = True
        return
    ctx.closers.append(baseline.close)
    ctx.state["baseline_factory"] = pool_factory(baseline.path)
    ctx.figures["baseline"] = {
        "ref": ctx.args.baseline,
        "commit": baseline.short,
        "subject": baseline.subject,
    }
    ctx.log(f"16. baseline: {baseline.short} {baseline.subject} in {baseline.path}")


def _regression_rows(f: Figures) -> list[Row]:
    commit = f.get("baseline", {}).get("commit", "?")
    return _on_off_rows(
        "regression",
        ("16. earlier commit", f"as 2 with 2 workers, the worker pool of {commit}"),
        ("16. this commit", "same, this commit's pool (nothing configured)"),
    )(f)


REGRESSION = _comparison(
    "regression",
    "16. broker, 2 workers",
    lambda ctx: (
        f"earlier commit {ctx.figures.get('baseline', {}).get('commit', '')}",
        dict(topology=ctx.topo, pool_factory=ctx.state["baseline_factory"]),
    ),
    lambda ctx: ("this commit", dict(topology=ctx.topo)),
    _regression_rows,
    setup=_regression_setup,
)
