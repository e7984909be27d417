"""Row 7, selectors: the cost of one evaluation (the fan-out runs are ``run_broker(properties=True)``)."""

from __future__ import annotations

import random
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from broker.models import parse_entry, publication_fields
from broker.selectors import compile_selector
from scripts.bench.workload import PUBLISHERS, SELECTOR, TOPICS, bodies, selector_props


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
