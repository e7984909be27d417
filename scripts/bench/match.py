"""Row 6 (and 12's swiftmq matching), matching alone: TopicIndex + LinkGraph, and the SwiftMQ hierarchy index, at 1k to 1M subscriptions."""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from broker.core.errors import LinkCycle
from broker.core.hierarchy import HierarchyIndex
from broker.core.topic_rules import LinkGraph, TopicIndex
from scripts.bench.base import Ctx, Figures, Measurement, Row, fmt

_METRICS = ("temp", "rh", "wind", "rain", "power", "door", "alarm", "cpu", "disk", "net")


def _random_topic(rng: random.Random) -> str:
    return (
        f"region{rng.randrange(100)}/site{rng.randrange(1000)}/dev{rng.randrange(1000)}/"
        f"{_METRICS[rng.randrange(len(_METRICS))]}"
    )


def filter_stream(seed: int = 5) -> Iterator[str]:
    """An endless, reproducible stream of subscription filters (a prefix of it is each index).

    Mix: 80% exact topics (1 in 20 re-uses an earlier exact topic: several subscribers
    on one topic), 12% with one ``+`` level (2nd, 3rd or 4th), 8% ``#`` under a 2- or
    3-level prefix. Topic space: 100 regions x 1,000 sites x 1,000 devices x 10 metrics.
    """
    rng = random.Random(seed)
    exact: list[str] = []
    while True:
        x = rng.random()
        if x < 0.80:
            if exact and rng.random() < 0.05:
                yield exact[rng.randrange(len(exact))]
            else:
                topic = _random_topic(rng)
                exact.append(topic)
                yield topic
        elif x < 0.92:
            levels = _random_topic(rng).split("/")
            levels[rng.choice((1, 2, 3))] = "+"
            yield "/".join(levels)
        else:
            levels = _random_topic(rng).split("/")[: rng.choice((2, 3))]
            yield "/".join(levels) + "/#"


def _exact_prefix(count: int) -> list[str]:
    stream = filter_stream()
    return [f for f in (next(stream) for _ in range(count)) if "+" not in f and "#" not in f]


def match_sample(size: int = 4000, seed: int = 9) -> list[str]:
    """The fixed topic sample: 90% exact topics of the first 1,000 filters (present in every index), 10% random."""
    rng = random.Random(seed)
    base = _exact_prefix(1000)
    return [rng.choice(base) if rng.random() < 0.9 else _random_topic(rng) for _ in range(size)]


def build_index(n: int) -> tuple[TopicIndex, LinkGraph, dict[str, Any]]:
    """Build the index of the first ``n`` filters under tracemalloc, then the links.

    Links: every 10th exact topic of the first 1,000 filters (about 80, so ~9% of the
    sample) links to a random exact topic of the index, plus n/100 links between
    random exact topics; links that would close a cycle are skipped.

    Returns:
        ``(index, links, {"build_s", "bytes_per_sub", "links", "wildcards"})``.
    """
    gc.collect()
    stream = filter_stream()
    exact: list[str] = []
    wildcards = 0
    tracemalloc.start()
    start = time.perf_counter()
    index = TopicIndex()
    for i in range(n):
        topic_filter = next(stream)
        index.add(topic_filter, f"sub{i}")
        if "+" in topic_filter or "#" in topic_filter:
            wildcards += 1
        else:
            exact.append(topic_filter)
    traced = tracemalloc.get_traced_memory()[0] - sys.getsizeof(exact)
    tracemalloc.stop()
    build_s = time.perf_counter() - start
    rng = random.Random(n)
    graph = LinkGraph()
    head = _exact_prefix(1000)
    sources = head[::10] + [exact[rng.randrange(len(exact))] for _ in range(n // 100)]
    made = 0
    for source in sources:
        target = exact[rng.randrange(len(exact))]
        if target == source:
            continue
        try:
            graph.add(source, target)
            made += 1
        except LinkCycle:
            pass
    return (
        index,
        graph,
        {
            "build_s": round(build_s, 2),
            "bytes_per_sub": round(traced / n),
            "links": made,
            "wildcard_share": round(wildcards / n, 3),
        },
    )


def _time_per_call(fn: Callable[[str], Any], sample: list[str], min_s: float) -> float:
    calls = 0
    start = time.perf_counter()
    while True:
        for topic in sample:
            fn(topic)
        calls += len(sample)
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def run_matching(sizes: Sequence[int], min_s: float = 0.3, rounds: int = 5) -> list[dict[str, Any]]:
    """Build every index, then time ``match`` and resolve (closure + match) on each, interleaved.

    The indexes are timed in turn for ``rounds`` rounds of ``min_s / rounds`` s each and
    the best round is kept, so that a burst of foreign load hits every size alike.

    Returns:
        One dict per size: ``n``, ``match_us``, ``resolve_us``, ``resolves_per_s``,
        ``bytes_per_sub``, ``avg_results``, ``matched_share``, ``build_s``, ``links``.
    """
    sample = match_sample()
    built = []
    for n in sizes:
        index, graph, info = build_index(n)

        def resolve(topic: str, index: TopicIndex = index, graph: LinkGraph = graph) -> set[str]:
            found: set[str] = set()
            for linked in graph.closure(topic):
                found |= index.match(linked)
            return found

        sizes_found = [len(resolve(t)) for t in sample]
        info |= {
            "n": n,
            "avg_results": round(statistics.mean(sizes_found), 2),
            "matched_share": round(sum(1 for s in sizes_found if s) / len(sample), 3),
        }
        built.append((info, index.match, resolve))
    best: dict[int, list[float]] = {n: [float("inf"), float("inf")] for n in sizes}
    for _ in range(rounds):
        for info, match, resolve in built:
            times = best[info["n"]]
            times[0] = min(times[0], _time_per_call(match, sample, min_s / rounds))
            times[1] = min(times[1], _time_per_call(resolve, sample, min_s / rounds))
    results = []
    for info, _, _ in built:
        match_s, resolve_s = best[info["n"]]
        results.append(
            {
                **info,
                "match_us": round(match_s * 1e6, 3),
                "resolve_us": round(resolve_s * 1e6, 3),
                "resolves_per_s": round(1 / resolve_s),
            }
        )
    built.clear()
    gc.collect()
    return results


def hierarchy_filters(n: int, predicate_share: float, seed: int = 17) -> list[str]:
    """``n`` distinct swiftmq subscriptions of depth 4 (``r<a>.c<b>.d<c>.e<d>``); every
    ``1 / predicate_share``-th one has a node after the root turned into a predicate that
    matches about ten values (``d12_``, ``e4_``; ``c%`` for one-digit values)."""
    rng = random.Random(seed)
    found: dict[str, None] = {}
    while len(found) < n:
        nodes = [
            f"r{rng.randrange(20)}",
            f"c{rng.randrange(100)}",
            f"d{rng.randrange(100)}",
            f"e{rng.randrange(1000)}",
        ]
        found[".".join(nodes)] = None
    filters = list(found)
    if predicate_share:
        every = round(1 / predicate_share)
        for i in range(every - 1, n, every):
            nodes = filters[i].split(".")
            k = 1 + i % 3
            nodes[k] = nodes[k][:-1] + "_" if len(nodes[k]) > 2 else nodes[k][0] + "%"
            filters[i] = ".".join(nodes)
    return filters


def run_hierarchy_matching(
    sizes: Sequence[int], min_s: float = 0.3, rounds: int = 5, predicate_share: float = 0.1
) -> list[dict[str, Any]]:
    """Time ``match`` of the swiftmq ``HierarchyIndex`` against ``TopicIndex`` (mqtt) on the same topics.

    For each size: the mqtt index of the plain filters (``/`` levels), the swiftmq index of the
    same plain filters, and the swiftmq index with ``predicate_share`` of them predicates.
    The sample: 90% topics that are plain filters of the index, 10% random depth-4 topics.
    Best of ``rounds`` interleaved rounds, as ``run_matching``.

    Returns:
        One dict per size: ``n``, ``mqtt_us``, ``plain_us``, ``predicates_us``, ``avg_results``
        (with predicates), ``predicates``.
    """
    rng = random.Random(23)
    built = []
    for n in sizes:
        plain = hierarchy_filters(n, 0.0)
        mixed = hierarchy_filters(n, predicate_share)
        mqtt, swift, swift_mixed = TopicIndex(), HierarchyIndex(), HierarchyIndex()
        for i, f in enumerate(plain):
            mqtt.add(f.replace(".", "/"), f"s{i}")
            swift.add(f, f"s{i}")
        for i, f in enumerate(mixed):
            swift_mixed.add(f, f"s{i}")
        exact = [f for f in mixed if "%" not in f and "_" not in f][:1000]  # in all three indexes
        sample = [
            rng.choice(exact)
            if rng.random() < 0.9
            else hierarchy_filters(1, 0.0, seed=rng.randrange(10**9))[0]
            for _ in range(2000)
        ]
        slashed = [t.replace(".", "/") for t in sample]
        results = statistics.mean(len(swift_mixed.match(t)) for t in sample)
        built.append((n, sample, slashed, mqtt, swift, swift_mixed, results))
    out = []
    for n, sample, slashed, mqtt, swift, swift_mixed, results in built:
        best = [float("inf")] * 3
        for _ in range(rounds):
            best[0] = min(best[0], _time_per_call(mqtt.match, slashed, min_s / rounds))
            best[1] = min(best[1], _time_per_call(swift.match, sample, min_s / rounds))
            best[2] = min(best[2], _time_per_call(swift_mixed.match, sample, min_s / rounds))
        out.append(
            {
                "n": n,
                "mqtt_us": round(best[0] * 1e6, 3),
                "plain_us": round(best[1] * 1e6, 3),
                "predicates_us": round(best[2] * 1e6, 3),
                "avg_results": round(results, 2),
                "predicates": swift_mixed.predicate_count,
            }
        )
    built.clear()
    gc.collect()
    return out


def _finish(ctx: Ctx) -> None:
    sizes = ctx.args.match_sizes
    ctx.idle("matching")
    ctx.log(f"6. matching: indexes of {', '.join(f'{n:,}' for n in sizes)} subscriptions")
    ctx.figures["matching"] = run_matching(sizes, min_s=0.2 if ctx.args.quick else 0.4)


def _rows(f: Figures) -> list[Row]:
    return [
        Row(
            f"6. matching {m['n']:,}",
            fmt(m["resolves_per_s"]),
            "-",
            f"resolve (closure + match) {m['resolve_us']:.2f} us, match {m['match_us']:.2f} us; "
            f"{m['bytes_per_sub']} B/sub; {m['links']:,} links, {m['wildcard_share']:.0%} wildcards; "
            f"{m['avg_results']} results avg, {m['matched_share']:.0%} of topics match; "
            f"build {m['build_s']} s",
        )
        for m in f.get("matching") or []
    ]


def swiftmq_matching_rows(f: Figures) -> list[Row]:
    """12.'s matching rows: the SwiftMQ hierarchy index against the MQTT TopicIndex."""
    return [
        Row(
            f"12. swiftmq match {m['n']:,}",
            "-",
            "-",
            f"match per topic: mqtt TopicIndex {m['mqtt_us']:.2f} us, swiftmq plain {m['plain_us']:.2f} us, "
            f"swiftmq with {m['predicates']:,} predicates (10%) {m['predicates_us']:.2f} us; "
            f"{m['avg_results']} results avg (depth-4 topics, 90% in the index)",
        )
        for m in f.get("swiftmq_matching") or []
    ]


MEASUREMENT = Measurement("match", finish=_finish, rows=_rows)
