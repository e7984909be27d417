"""The summary of a bench run: the figures the last line prints, the targets, the per-command text blocks."""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

from scripts.bench.base import Figures, paired
from scripts.bench.federation import federation_summary
from scripts.bench.workload import BODY_BYTES

#: Targets the team is working towards (F=10, this box): issue 16's (performance round two).
TARGETS = {
    "broker_pubs_per_s": (">=", 20_000),
    "ceiling_ratio": (">=", 0.85),
    "kombu_ratio": (">=", 30),
    "hot_publisher_ratio": (">=", 0.9),
    "p99_ms": ("<=", 2.0),
    "match_1m_over_1k": ("<=", 2.0),
    "consume_large_per_s": (">=", 100_000),
    "memory_over_body_bytes": ("<=", 150),
    "regression_ratio": (">=", 0.95),
    "ceiling_ratio_instructions": (">=", 0.85),
}

#: Runs whose Redis commandstats per publication ``redis_text`` prints, with their labels.
_COMMANDSTATS = (
    ("ceiling", "ceiling"),
    ("broker_1w", "1 worker"),
    ("broker_2w", "2 workers"),
    ("aof_2w", "2 workers, AOF everysec"),
    ("hot_2w", "hot publisher"),
    ("selectors_off", "no selectors"),
    ("selectors_on", "20% selectors"),
    ("topics_off", "no topic objects"),
    ("topics_on", "200 topic objects"),
    ("flow_off", "flow control off"),
    ("flow_on", "flow control on"),
    ("slow_off", "no slow condition"),
    ("slow_on", "slow condition"),
    ("security_off", "security off"),
    ("security_on", "security on"),
    ("regression_off", "earlier commit"),
    ("regression_on", "this commit"),
)


def _median(f: Figures, key: str) -> float:
    return statistics.median(f[key]) if f.get(key) else float("nan")


def summary(f: Figures) -> dict[str, Any]:
    """The headline figures (``figures["summary"]`` in the JSON; NaN where not measured)."""
    nan = float("nan")
    broker = f.get("broker_2w", {}).get("pubs_per_s", nan)
    ceiling = f.get("ceiling", {}).get("tx_per_s", nan)
    kombu = f.get("kombu", {}).get("pubs_per_s", nan)
    hot = f.get("hot_2w", {}).get("pubs_per_s", nan)
    matching = f.get("matching") or []
    by_n = {m["n"]: m for m in matching}
    small = by_n.get(1000) or (matching[0] if matching else None)
    large = matching[-1] if matching else None
    sel_off = f.get("selectors_off", {}).get("pubs_per_s", nan)
    sel_on = f.get("selectors_on", {}).get("pubs_per_s", nan)
    consume = f.get("consume") or {}
    rabbit = f.get("rabbit") or {}
    rabbit_persistent = (rabbit.get("persistent") or {}).get("pubs_per_s", nan)
    aof = f.get("aof_2w", {}).get("pubs_per_s", nan)
    memory = f.get("memory") or {}
    fanout_bytes = (memory.get("fanout") or {}).get("bytes_per_element", nan)

    def on_over_off(name: str) -> float:
        off = f.get(f"{name}_off", {}).get("pubs_per_s", nan)
        on = f.get(f"{name}_on", {}).get("pubs_per_s", nan)
        return on / off if off == off and off else nan

    out = {
        "broker_pubs_per_s": broker,
        "ceiling_ratio": paired(f, "broker_2w", "ceiling", "tx_per_s", broker / ceiling if ceiling else nan),
        "kombu_ratio": broker / kombu if kombu == kombu and kombu else nan,
        "rabbit_ratio": _median(f, "rabbit_ratios"),
        "rabbit_installed": "skipped" not in rabbit,
        "rabbit_persistent_pubs_per_s": rabbit_persistent,
        "rabbit_transient_pubs_per_s": (rabbit.get("transient") or {}).get("pubs_per_s", nan),
        "rabbit_aof_ratio": aof / rabbit_persistent if rabbit_persistent == rabbit_persistent else nan,
        "aof_pubs_per_s": aof,
        "aof_ratio": _median(f, "aof_ratios"),
        "memory_bytes_per_msg": (memory.get("single") or {}).get("bytes_per_msg", nan),
        "memory_bytes_per_element": fanout_bytes,
        "hot_publisher_ratio": paired(
            f, "hot_2w", "broker_2w", "pubs_per_s", hot / broker if broker else nan
        ),
        "p99_ms": f.get("latency", {}).get("p99_ms", nan),
        "match_1m_over_1k": large["resolve_us"] / small["resolve_us"] if small and large else nan,
        "match_ratio_sizes": f"{large['n']:,} / {small['n']:,}" if small and large else None,
        "selector_ratio": sel_on / sel_off if sel_off == sel_off and sel_off else nan,
        "selector_eval_us": f.get("selector_eval", {}).get("median_us", nan),
        "consume_per_s": consume.get("msgs_per_s", nan),
        "consume_large_per_s": consume.get("large_msgs_per_s", nan),
        "memory_over_body_bytes": fanout_bytes - BODY_BYTES,
        "regression_ratio": _median(f, "regression_ratios"),
        "ceiling_ratio_instructions": (f.get("instructions") or {}).get("ratio", nan),
        "consume_batch_ratio": consume.get("batch_over_single", nan),
        "topic_objects_ratio": on_over_off("topics"),
        "flow_control_ratio": on_over_off("flow"),
        "slow_condition_ratio": on_over_off("slow"),
        "swiftmq_ratio": on_over_off("swiftmq"),
        "security_ratio": _median(f, "security_ratios"),
        **federation_summary(f),
    }
    f["summary"] = out
    return out


def final_line(s: dict[str, Any]) -> str:
    """The last line of a run (scripts and the docs read it: keep its keys and formats)."""

    def num(v: Any, fmt: str) -> str:
        return "nan" if v is None or v != v else format(v, fmt)

    return (
        f"broker_pubs_per_s={num(s['broker_pubs_per_s'], '.0f')} "
        f"ceiling_ratio={num(s['ceiling_ratio'], '.2f')} kombu_ratio={num(s['kombu_ratio'], '.1f')} "
        f"rabbit_ratio={num(s['rabbit_ratio'], '.2f') if s['rabbit_installed'] else 'n/a'} "
        f"hot_publisher_ratio={num(s['hot_publisher_ratio'], '.2f')} p99_ms={num(s['p99_ms'], '.1f')} "
        f"match_1m_over_1k={num(s['match_1m_over_1k'], '.2f')} "
        f"selector_ratio={num(s['selector_ratio'], '.2f')} "
        f"selector_eval_us={num(s['selector_eval_us'], '.2f')} "
        f"consume_per_s={num(s['consume_per_s'], '.0f')} "
        f"consume_batch_ratio={num(s['consume_batch_ratio'], '.1f')} "
        f"topic_objects_ratio={num(s['topic_objects_ratio'], '.2f')} "
        f"flow_control_ratio={num(s['flow_control_ratio'], '.2f')} "
        f"slow_condition_ratio={num(s['slow_condition_ratio'], '.2f')} "
        f"swiftmq_ratio={num(s['swiftmq_ratio'], '.2f')} "
        f"fed_3qm_ratio={num(s['federation_3qm_ratio'], '.2f')} "
        f"security_ratio={num(s['security_ratio'], '.2f')}"
    )


def targets_table(s: dict[str, Any]) -> Table:
    """The summary against ``TARGETS``: met, missed or not measured."""
    table = Table(title="against the targets", title_justify="left")
    for col in ("figure", "value", "target", ""):
        table.add_column(col)
    for key, (op, target) in TARGETS.items():
        value = s[key]
        label = key
        sizes = s.get("match_ratio_sizes")
        if key == "match_1m_over_1k" and sizes and not sizes.startswith("1,000,000"):
            label = f"{key} (measured {sizes}, no 1M index)"
        if value != value:
            table.add_row(label, "-", f"{op} {target}", "[yellow]not measured[/yellow]")
            continue
        ok = value >= target if op == ">=" else value <= target
        table.add_row(
            label, f"{value:,.2f}", f"{op} {target:,}", "[green]met[/green]" if ok else "[red]missed[/red]"
        )
    return table


def redis_text(f: Figures) -> str:
    """Redis commandstats per publication of each broker run."""
    lines = []
    for key, label in _COMMANDSTATS:
        run = f.get(key)
        if not run or "redis_commands" not in run:
            continue
        parts = ", ".join(
            f"{name} {calls:g} calls {usec:g} us" for name, calls, usec in run["redis_commands"]
        )
        lines.append(f"  {label}: {parts}")
    if not lines:
        return ""
    return (
        "Redis commandstats per publication (commands run inside scripts count both on their own "
        "and inside evalsha):\n" + "\n".join(lines)
    )


def profile_text(f: Figures) -> str:
    """The ``--profile`` run's py-spy summary per worker."""
    run = f.get("profile") or {}
    workers = (run.get("profile") or {}).get("workers") or []
    if not workers:
        return ""
    split = "/".join(f"{x:.0%}" for x in run.get("work_split") or [])
    lines = [
        f"py-spy of each worker (100 Hz, --idle: time blocked on a socket counts) during an extra 2-worker "
        f"run: {run['pubs_per_s']:,} pubs/s, work split {split or '?'}"
    ]
    for prof in workers:
        lines.append(f"  worker pid {prof['pid']}: {prof['samples']:,} samples; raw stacks in {prof['file']}")
        lines.append("    self:")
        lines += [f"      {share:5.1f}%  {name}" for name, share in prof["self"][:12]]
        lines.append("    inclusive (frames present in every sample left out):")
        lines += [f"      {share:5.1f}%  {name}" for name, share in prof["inclusive"] if share < 99.5][:16]
    return "\n".join(lines)


def ratio_lines(f: Figures) -> list[str]:
    """16.'s and 15.'s per-repeat ratios with their medians, printed before the last line."""
    out = []
    if f.get("regression_ratios"):
        rs = f["regression_ratios"]
        out.append(
            f"16. this commit / {f.get('baseline', {}).get('commit', '?')}, pubs/s, per repeat: "
            f"{rs}; median regression_ratio={statistics.median(rs):.3f}"
        )
    if f.get("metrics_ratios"):
        rs = f["metrics_ratios"]
        out.append(
            f"15. metrics on / off, pubs/s, per repeat: {rs}; median metrics_ratio={statistics.median(rs):.3f}"
        )
    return out
