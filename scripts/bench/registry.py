"""Every measurement of the benchmark, in the order of the table (``cli.run`` and ``cli.table`` loop here).

The steps of each run in this order too: ``setup`` of all, then per repeat ``repeat`` of all
(side by side), then ``finish`` of all. A measurement that another's figures feed (the
2-worker rate feeds 17., 18. and 20.) comes before it.
"""

from __future__ import annotations

from scripts.bench import (
    aof,
    ceiling,
    consume,
    e2e,
    features,
    federation,
    groups,
    instructions,
    kombu,
    latency,
    match,
    memory,
    publish,
    rabbit,
    selectors,
    throughput,
)
from scripts.bench.base import Measurement

REGISTRY: tuple[Measurement, ...] = (
    ceiling.MEASUREMENT,  # 1.
    throughput.BROKER,  # 2.
    throughput.HOT,  # 3.
    aof.MEASUREMENT,  # 18.
    latency.MEASUREMENT,  # 4.
    publish.MEASUREMENT,  # 22.
    kombu.MEASUREMENT,  # 5.
    rabbit.MEASUREMENT,  # 17.
    instructions.MEASUREMENT,  # 21.
    memory.MEASUREMENT,  # 19.
    match.MEASUREMENT,  # 6.
    selectors.MEASUREMENT,  # 7.
    features.TOPIC_OBJECTS_ROW,  # 9.
    features.FLOW,  # 10.
    features.SLOW,  # 11.
    features.RETAINED,  # 23.
    features.DELAY,  # 24.
    features.TOPIC_STATS,  # 26.
    features.SECURITY,  # 14.
    features.REGRESSION,  # 16.
    features.METRICS,  # 15.
    features.SWIFTMQ,  # 12.
    federation.MEASUREMENT,  # 13.
    consume.MEASUREMENT,  # 8.
    groups.MEASUREMENT,  # 25.
    e2e.MEASUREMENT,  # 20.
)

#: The ``--only`` names.
NAMES: tuple[str, ...] = tuple(m.name for m in REGISTRY)
