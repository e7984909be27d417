"""One command, one server, every figure side by side: the broker against its ceiling and its peer.

Usage::

    .venv/bin/python -m scripts.bench --quick            # under a minute
    .venv/bin/python -m scripts.bench --json bench.json  # full run (N=100k, 3 repeats), about 5 minutes
    .venv/bin/python -m scripts.bench --quick --profile /tmp/prof   # + py-spy of the workers

The script starts one server (``broker.server.Server()``: the embedded Valkey,
or ``$BROKER_REDIS_SERVER_BIN``) on 127.0.0.1 and runs every measurement
against it in the same run, because the machine is shared and noisy: the
*ratios* between side-by-side figures are what to read (see
``../shared/research/perf-anchors.md`` for how the reference figures were
taken). Before each measurement it can wait for the box to be quiet
(``--idle-wait``), and every row reports the CPU of Redis, of our Python
processes and of *foreign* processes (everything else on the box), as % of one
core (the box maximum is ``100 x cores``). The database is flushed between runs.
Every child process and the server are stopped at the end, whatever happens.

Workload (measurements 2-4)
---------------------------
1,000 topics ``bench/<r>/<c>/<j>``, 1,450 subscriptions and 1,100 links, made
with the broker's own admin API (``broker.subscribe``, ``broker.links.link``)
once, DUMPed and RESTOREd after each flush. Every topic reaches exactly F=10
subscriber queues: one exact subscription, six through ``+``/``#`` filters
(one of which, ``+/<r>/#``, matches the topic and both of its linked topics
and must be delivered once), and two that only links reach
(``bench/r/c/j -> audit/r/c -> audit/r``). F is checked with
``broker.routing.explain`` on a sample of topics before, and as
deliveries / N after every run. Publications have a 200-byte body and come
from 50 publishers (``p00``..``p49``) through ``broker.Publisher``, which
always sets a msgid (so every unit of work writes a dedup record); the pool
runs with its default settings (``BROKER_*`` variables apply).

Full mode: N=100k publications per run, measurements 1-3 repeated 3 times
(interleaved, medians), kombu N=3,000, RabbitMQ N=20k per mode, 10 s of latency, indexes up to 1M.
``--quick``: N=20k once, kombu 1,000, RabbitMQ 2,000, 3 s, indexes up to 100k.

Measurements
------------
1. **Ceiling** -- no broker logic: N publication-shaped entries are XADDed and
   read into a consumer group's PEL (untimed); then one Python process runs
   ``MULTI``, F x ``LPUSH``, ``XACK``, ``EXEC`` per entry, 50 transactions per
   round trip, RESP packed by hand into one buffer per round trip (pre-encoded
   ``LPUSH <key>`` prefixes, payload encoded once) on a raw socket, replies
   read with a bare ``hiredis.Reader``. Reports tx/s (= publications/s) and
   deliveries/s: what one Python client on this box can push through Redis.
2. **Broker end to end**, pool of 1 and of 2 worker processes
   (``worker.pool.Pool``): N publications are preloaded with
   ``Publisher.publish_many`` (one call per chunk of ``--interleave`` items,
   publishers round robin), then the pool starts. The clock starts when all
   workers have registered (their first heartbeat, written after their first
   round: what was acknowledged before that is subtracted) and stops when the
   group has nothing pending and no lag; then the subscriber queues must hold
   exactly N x F envelopes. Also reported: the 10%->90% "steady" rate, the
   rate from the spawn, the preload's XADD rate, Redis CPU-us per publication,
   per-publisher order checked in three queues, and dedup records sampled.
3. **Hot publisher**: as 2 with 2 workers, but ``p00`` sends half of all
   publications (its chunks alternate with the others'). Per-publisher FIFO
   order must not serialise the whole pool: hot_publisher_ratio = this /
   the uniform 2-worker run.
4. **Latency** at a paced rate (``--rate``, 2,000/s) with 2 workers: a
   publisher process on an absolute ``time.perf_counter`` schedule makes one
   ``Publisher.publish`` (one XADD) per publication, rotating over 50
   publishers and the 100 topics of region 0, with ``time.time_ns()`` in the
   property ``sent_ns``; the bench process BRPOPs the queue of ``bench/0/#``
   (which receives all of them), takes any backlog with one ``RPOP key count``
   right after (so the consumer is not the bottleneck), and takes receive-time
   minus send-time (same clock). The first 0.25 s is warm-up. Reports
   p50/p90/p99/p99.9/max and how far the publisher fell behind its schedule (it
   catches up at full speed: open loop). On a 2-vCPU box the publisher, the
   consumer, 2 workers and Redis share two cores: read p99 with the foreign CPU.
5. **Peer**: kombu's topic exchange (Redis transport, defaults: JSON,
   persistent, ack per message) on the same Redis, 10 queues bound ``t.#``:
   publish N (smaller N: it runs at a few hundred per second), then one
   Consumer on the 10 queues takes all N x 10. kombu_ratio = broker (2
   workers) publications/s / kombu publications/s.
6. **Matching alone**: ``TopicIndex`` indexes of 1k, 100k and 1M
   subscriptions (80% exact, 12% one ``+``, 8% ``#``; each index is a prefix
   of the next) and a ``LinkGraph`` (~80 links from sampled topics plus n/100
   others). Time per ``match`` and per resolve (``closure`` + ``match`` of each
   linked topic, union: what ``RoutingTable.resolve`` does before caching) over
   a fixed sample of 4,000 topics, 90% of which match something (best of 3),
   and bytes per subscription (tracemalloc over the build: index + its strings).
   match_1m_over_1k = resolve time at 1M / at 1k; in ``--quick`` the largest
   index is 100k and the table says so (the key keeps its name).
7. **Selectors**: as 2 with 2 workers, twice side by side (in alternating
   order when repeated): every publication carries the properties ``region``
   ('eu' 70%, 'us', 'apac') and ``amount`` (0-99), in both runs; in one of
   them every 5th subscription of the plan (290 of 1,450) was made with the
   selector ``region = 'eu' AND amount >= 30`` (it selects ~49% of the
   publications), in the other none. The queues must then hold exactly what
   the selectors select (counted in the bench with the broker's
   ``RoutingTable``). selector_ratio = pubs/s with / without. The preload
   XADDs the fields ``publish_many`` writes, one round trip per chunk, as in 2
   (``publish_many`` takes one set of properties per call). Also: the cost of
   one ``compile_selector(s).matches(props)`` call, timed in a tight loop over
   1,000 property dicts as a worker builds them (``Entry.selector_properties``):
   median of 7 rounds, us (selector_eval_us; the bare loop's cost is shown).
8. **One consumer** (in the bench process, its own connection; a
   ``broker.consumer.Subscriber`` of one durable subscription): N envelopes
   (as a worker writes them, 200-byte bodies) are LPUSHed straight into the
   subscriber queue (untimed), then drained with ``receive_many(100)`` +
   ``ack_many``; N others with ``receive_many(1000)`` + ``ack_many``; N others with
   ``receive_many(100)``, reading every message (``Delivery.message``: the
   envelope is decoded when first read), + ``ack_many``; then N/5 others one at a
   time with ``receive()`` + ``ack()``. consume_per_s = messages/s of the first;
   consume_batch_ratio = that / the last's. Python and Redis CPU-us per message are
   shown for each.
9. **Topic objects**: as 2 with 2 workers, twice side by side (in alternating
   order when repeated), same topology and publications: in one run 200
   administrative topic objects (``broker.topic_objects.define``, after the
   restore, untimed) are bound to prefixes of the benchmark's topics --
   ``bench/r``, ``audit/r`` and ``bench/r/c`` of regions 0-8 and 92 leaf topics
   (``bench_lib.topic_object_plan``) -- so 90% of the publications fall under an
   object and region 9 inherits from ``SYSTEM.BASE.TOPIC``; in the other none
   (the restore flushes them, and the run checks ``{qm}:topics`` is absent).
   Their attributes change nothing (``pubscope=ALL``, ``defprty=ASPARENT``,
   ``usedlq=YES``, ``pub=ENABLED``, ``capexpry=NOLIMIT``, every fifth
   ``maxdepth=10**9``), so both runs must deliver exactly N x F with nothing
   dead-lettered. topic_objects_ratio = pubs/s with / without: the cost of
   resolving each topic's effective attributes in the worker and of enforcing
   them (on a branch where the worker does not read the objects, ~1.00).
10. **Flow control**: as 2 with 2 workers, twice side by side (in alternating
   order when repeated), same topology and publications: with
   ``flowcontrol_enabled`` off, and on (the default curve: 0 ms up to 1,000
   messages, 1,000 ms at 100,000). The queues are never drained, so from 1,000
   messages on every unit of work asks for a delay and sets its publishers'
   flow keys; the preload is done before the workers start, so nothing waits:
   the figure is the workers' cost of working the delay out (an ``LLEN`` per
   queue per batch, the curve, a ``SET`` per publisher per batch).
   flow_control_ratio = pubs/s on / off.
11. **Slow-subscriber condition**: as 2 with 2 workers, twice side by side:
   with no condition, and with one on the root topic ``bench`` (every
   publication) for every delivery mode whose ``max_messages`` (10**9) is never
   reached, so both runs deliver N x F. The cost of watching every recipient
   queue: its subscription's depth read once per batch (an ``LLEN`` and an
   ``EXISTS`` of the other bands), compared per delivery.
   slow_condition_ratio = pubs/s with / without.
12. **swiftmq scheme** (seed 003): as 2 with 2 workers, twice side by side
   (alternating): the workload above, and the same workload as dot topics
   ``bench.r.c.j`` in a queue manager with ``topic_scheme = "swiftmq"``
   (``bench_lib.swiftmq_subscription_plan``: ``+`` levels become ``%``
   predicates, 320 of 1,540 subscriptions; ``bench/r/#`` becomes the node
   ``bench.r``; only the 1,000 links ``bench.r.c.j -> audit.r.c``, as ``audit.r``
   receives its sub-nodes' publications; F=10 checked the same way). swiftmq/mqtt =
   pubs/s ratio. Then matching alone: per-topic ``match`` of ``TopicIndex``
   (mqtt), of the swiftmq ``HierarchyIndex`` with the same plain depth-4
   subscriptions, and of one where every 10th is a predicate (``d12_``), at the
   ``match`` sizes (``bench_lib.run_hierarchy_matching``).

13. **Federation** (``--only federation``): a local 3-master Redis Cluster (in
   memory, ``broker.demo.local_cluster``) with one queue manager per master
   (``FEDA``, ``FEDB``, ``FEDC``, numbered when needed to land on distinct
   masters), each with the workload above (built on its own master). Runs with
   1, 2 and 3 queue managers (side by side in each repeat): each gets
   ``--fed-n`` publications preloaded (publishers of its own) and a pool of
   ``--fed-workers`` (1) worker(s); with 2 and 3 they are one network (the
   first the hierarchy's root, the others its children, announcing their
   subscriptions' root topics) with a channel process each, so every
   publication is also forwarded to, and delivered F=10 times at, every other
   queue manager (from a child to the other child through the root). The clock
   starts when every worker has registered and stops when every transmission
   stream is filed by its receiver and every queue manager's group is drained;
   every queue manager's queues must then hold k x N x F envelopes. pubs/s =
   origin publications delivered network-wide per second (entries handled / k);
   fed_kqm_ratio = that / the 1-queue-manager run's, per repeat, median. Also
   per master: Redis CPU-us per publication (``INFO CPU`` ``used_cpu_sys`` +
   ``used_cpu_user`` deltas / publications), and the workers' and channel
   processes' CPU-us per publication, so that scaling can be predicted where
   cores are not shared. Then the latency of a forwarded publication: two queue
   managers (root and child, one worker each), a publisher paced at
   ``--fed-rate`` (200/s) at the root, timed from ``time.time_ns()`` before the
   XADD to the BRPOP of the child's queue of ``bench/0/#`` (as 4., through the
   root's worker, its transmission stream, the channel, the child's worker).
14. **Security** (issue 14, docs/security.md): as 2 with 2 workers, twice side by side
   (alternating): security off, and on -- each of the 50 publisher ids publishes as its
   own principal (a ``publisher`` ACL user bound to it, ``bench_lib.Principals``) by
   XADDing to its ingress stream ``{qm}:in:<user>``, and the workers connect as a
   ``worker`` user; the queue mutex moves every entry into the publish stream (one more
   XADD per publication, and a look at the 50 ingress streams per dequeue). The clock
   stops when the ingress streams are empty too; both runs must deliver N x F, and
   sampled envelopes must carry their publisher's principal. security_ratio = pubs/s on /
   off, per repeat, median.
15. **Metrics** (``--only metrics``, docs/operations.md): as 2 with 2 workers, side by
   side (alternating): metrics off (``metrics_port`` 0, the default: the workers hold the
   no-op recorder) and on (the pool's children in prometheus_client's multiprocess mode,
   recording outcomes, deliveries and both latency histograms per publication, the pool
   serving ``/metrics``, not scraped). metrics_ratio = pubs/s on / off, per repeat, median
   (printed before the last line and in ``--json``).
16. **No regression** (``--only regression``, ``--baseline REF``, default the commit before the
   features of issues 13-15): as 2 with 2 workers, side by side (alternating), the worker pool of
   REF (a detached worktree, removed at the end, its own ``worker.pool.Pool`` in a subprocess:
   ``scripts/bench/baseline.py``) and this commit's, nothing configured (no selectors,
   topic objects, predicates, ACLs, metrics). regression_ratio = this / REF, per repeat, median
   (printed before the last line and in ``--json``). The costs of each feature when configured
   are rows 7, 9-12, 14 and 15.
17. **RabbitMQ** (``--only rabbit``; skipped with a note when ``rabbitmq-server`` is not
   installed: ``apt-get install rabbitmq-server``, and pika, the ``bench`` extra): a node of its
   own on loopback (free ports, a temporary directory, its own epmd, no plugins; stopped at the
   end whatever happens) with the workload above as AMQP (``scripts/bench/rabbit.py``): a
   durable topic exchange, 1,450 durable classic queues bound with the filters' AMQP patterns
   (``+`` -> ``*``), a fanout exchange per link target with exchange-to-exchange bindings for the
   1,100 links (1,670 queue and 1,200 exchange bindings), loaded while the node boots. 50
   publishers, one pika channel each, in ``--rabbit-procs`` (2) processes (asynchronous
   ``SelectConnection``s), publish ``--rabbit-n`` publications (200 B bodies, topics drawn as in
   2) in two modes: persistent with publisher confirms, at most ``--rabbit-window`` (100)
   unconfirmed per channel (the clock stops at the last confirm), and transient without
   confirms (it stops at a synchronous round trip on every channel). Every queue's depth must
   then be what the broker would deliver (its ``TopicIndex`` and ``LinkGraph``); they are purged
   after each run. The node starts once (it idles at under 1% of a core while the broker's
   rows run); both modes run in every repeat, after the broker's rows. rabbit_ratio = broker (2 workers) pubs/s / RabbitMQ persistent-confirms pubs/s, per
   repeat, median (``n/a`` when not installed); the table also gives it against the AOF row.
18. **AOF everysec** (``--only aof``): as 2 with 2 workers, with ``appendonly yes`` and
   ``appendfsync everysec`` set on the server for the run (``CONFIG SET``, after its first
   rewrite), side by side with 2 in every repeat: the broker's row like RabbitMQ's persistent
   messages (on disk, fsynced once a second). aof_ratio = pubs/s with / without.
19. **Memory** (``--only memory``): bytes of Redis memory per waiting message, 200 B bodies:
   ``--memory-n`` envelopes LPUSHed into one subscriber queue, (``used_memory`` after - before)
   / K; and ``--memory-n`` / 5 publications through the broker into the topology, so F=10 queue
   elements each: bytes per queue element (used_memory and the queues' ``MEMORY USAGE``), the
   publish stream's and the rest's per publication. Target: at most body + 150 B per element.

20. **End to end** (``--only e2e``; issue 16): paced publishers (``Publisher.publish``,
   one XADD each, ``sent_ns`` in a property, one process per 6,000/s, each with its own
   publisher ids) -> 2 workers -> one consumer *process* (a ``Subscriber`` doing
   ``receive_many(100, timeout_ms=100)``, reading each message's ``sent_ns``, then
   ``ack_many``) on the subscription of ``bench/0/#``. Latency = the time ``ack_many``
   returned - the send time (same clock, as 4.); the first 0.25 s is warm-up. Run at
   ``--rate`` (2,000/s) and at 80% of the saturated rate: the 2-worker rate of 2. when
   it ran, else one 2-worker run made for it. Prints ``e2e_p99_ms=`` and
   ``e2e_p99_80pct_ms=`` before the last line (and in ``--json``).
21. **Instructions** (``--only instructions``; ``scripts/bench/instructions.py``): the
   server under ``valgrind --tool=callgrind`` (instrumentation switched on only around what is
   counted): one in-process worker of this commit handling ``--instructions-n`` (3,000)
   preloaded publications after a warm-up, and the ceiling's timed loop over as many entries.
   Instructions per publication and per ceiling transaction, their ratio
   (``ceiling_ratio_instructions``: the ceiling ratio in server work alone), and the functions
   that cost the most. Deterministic: the figure for comparing two commits on a box whose speed
   drifts by 2x in minutes (it does not see cache misses, system calls or a second worker's
   take-overs). Skipped (n/a) when valgrind is not installed.

22. **publish() call** (``--only publish``): microseconds per ``Publisher.publish()`` call, wall
   and this process's CPU, with flow control on (the flow key read with the XADD, one round trip)
   and off, and a bare redis-py ``XADD`` of the same fields alongside (``scripts/ab_publish.py``).
   Two commits side by side: ``python -m scripts.bench_ab OLD NEW --rows publish``.

The last line is, exactly::

    broker_pubs_per_s=<n> ceiling_ratio=<x.xx> kombu_ratio=<x.x> rabbit_ratio=<x.xx> hot_publisher_ratio=<x.xx> p99_ms=<x.x> match_1m_over_1k=<x.xx> selector_ratio=<x.xx> selector_eval_us=<x.xx> consume_per_s=<n> consume_batch_ratio=<x.x> topic_objects_ratio=<x.xx> flow_control_ratio=<x.xx> slow_condition_ratio=<x.xx> swiftmq_ratio=<x.xx> fed_3qm_ratio=<x.xx> security_ratio=<x.xx>

with broker_pubs_per_s the 2-worker uniform run and ceiling_ratio = that /
the ceiling's tx/s. With ``--repeat R`` measurements 1-3, 7, 9-11, 13-18 run R times,
interleaved, and the medians are used; ceiling_ratio and hot_publisher_ratio are the
medians of the ratios within each repeat (1., the 2-worker run and 3. run one after the
other), since this shared box drifts by 2x in minutes. ``--json PATH`` writes every figure.
The table "against the targets" holds issue 16's: ceiling_ratio >= 0.85, hot >= 0.9,
p99 <= 2 ms at 2,000/s, a consumer with batches of 1,000 >= 100k msgs/s, queue memory <=
body + 150 B per waiting message, regression_ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from broker.config import Settings, SlowSubscriberCondition
from broker.connection import connect
from broker.server import Server
from scripts import ab_publish
from scripts.bench import instructions as bench_callgrind
from scripts.bench import rabbit as bench_rabbit
from scripts.bench.aof import run_broker_aof
from scripts.bench.baseline import DEFAULT_BASELINE, BaselineCheckout, BaselineError, pool_factory
from scripts.bench.ceiling import run_ceiling
from scripts.bench.consume import run_consume
from scripts.bench.e2e import run_e2e
from scripts.bench.federation import Federation, run_federation, run_federation_latency
from scripts.bench.kombu import run_kombu
from scripts.bench.latency import run_latency
from scripts.bench.match import run_hierarchy_matching, run_matching
from scripts.bench.memory import run_memory
from scripts.bench.pool import run_broker, wait_idle
from scripts.bench.selectors import run_selector_cost
from scripts.bench.topology import Topology
from scripts.bench.workload import (
    BODY_BYTES,
    FANOUT,
    SELECTOR,
    SELECTOR_EVERY,
    TOPIC_OBJECTS,
    TOPICS,
    BenchError,
    code_state,
    link_plan,
    swiftmq_subscription_plan,
    topic_object_coverage,
    topic_object_plan,
)

QM = "BENCH"

#: Queue managers in the federation runs (13.).
FED_SIZES = (1, 2, 3)

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


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
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
        help="runs of measurements 1-3, 7, 9-11, 13-16, medians reported (default 3, quick 1)",
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
        "slow,swiftmq,federation,security,metrics,regression,rabbit,aof,memory,e2e,instructions,publish",
    )
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
        default=bench_rabbit.WINDOW,
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
        f"(default {bench_callgrind.DEFAULT_N:,}, quick 1,000)",
    )
    parser.add_argument(
        "--baseline",
        default=DEFAULT_BASELINE,
        help=f"16. the earlier commit to compare with (default {DEFAULT_BASELINE}: before the features of issues 13-15)",
    )
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
    args.instructions_n = args.instructions_n or (1_000 if quick else bench_callgrind.DEFAULT_N)
    args.idle_wait = args.idle_wait if args.idle_wait is not None else (0.0 if quick else 5.0)
    sections = {
        "ceiling",
        "broker",
        "hot",
        "latency",
        "kombu",
        "match",
        "selectors",
        "consume",
        "topics",
        "flow",
        "slow",
        "swiftmq",
        "federation",
        "security",
        "metrics",
        "regression",
        "rabbit",
        "aof",
        "memory",
        "e2e",
        "instructions",
        "publish",
    }
    args.only = set(args.only.split(",")) if args.only else sections
    if args.only - sections:
        parser.error(f"--only: unknown {sorted(args.only - sections)}")
    return args


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def _cpu(cpu: dict[str, float] | None) -> str:
    if not cpu:
        return ""
    return " ".join(f"{k} {v:.0f}" for k, v in cpu.items())


def _percentiles(lat: dict[str, Any]) -> str:
    """A latency run's percentiles, as the table shows them."""
    return (
        f"p50 {lat['p50_ms']:.2f} / p90 {lat['p90_ms']:.2f} / p99 {lat['p99_ms']:.2f} / "
        f"p99.9 {lat['p999_ms']:.2f} / max {lat['max_ms']:.1f} ms ({lat['measured']:,} msgs)"
    )


def _server_cpu_us(run: dict[str, Any]) -> float:
    """CPU-us per publication of Redis and the workers in a broker run (from its % of one core)."""
    cpu = run.get("cpu") or {}
    share = (cpu.get("redis", 0.0) + cpu.get("workers", 0.0)) / 100
    return share * run["elapsed_s"] * 1e6 / max(run["measured_publications"], 1)


def _ratios(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> list[float]:
    """pubs/s with / without, per repeat (the runs of one repeat are side by side)."""
    return [round(b["pubs_per_s"] / a["pubs_per_s"], 3) for a, b in zip(off, on, strict=False)]


def _paired(figures: dict[str, Any], num: str, den: str, den_key: str, fallback: float) -> float:
    """The median over repeats of ``num``'s pubs/s / ``den``'s ``den_key``, each pair measured in the same
    repeat (side by side, minutes apart at most: this shared box drifts by more than that between
    repeats); ``fallback`` (the ratio of the medians) when the repeats do not pair up."""
    runs = figures.get("runs") or {}
    a, b = runs.get(num) or [], runs.get(den) or []
    if not a or len(a) != len(b):
        return fallback
    return statistics.median(x["pubs_per_s"] / y[den_key] for x, y in zip(a, b, strict=True))


def _median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the lower middle for an even count)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


class Bench:
    """Holds the server, the clients and the figures of one bench run."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console
        self.figures: dict[str, Any] = {
            "args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}
        }
        self.errors: dict[str, str] = {}
        self.server: Server | None = None
        self.fed: Federation | None = None
        self.baseline: BaselineCheckout | None = None
        self.rabbit: bench_rabbit.RabbitPeer | None = None

    def log(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}", highlight=False)

    def idle(self, what: str) -> dict[str, Any] | None:
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

    def attempt(self, name: str, fn: Any, *a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except BenchError as exc:
            self.errors[name] = str(exc)[:2000]
            self.log(f"[red]{name} failed: {str(exc)[:500]}[/red]")
            return None

    def run_hot(
        self, runs: dict[str, list[dict[str, Any]]], client: Any, settings: Settings, topo: Any, tag: str
    ) -> None:
        """3.: 2 workers, one hot publisher; appended to ``runs["hot_2w"]``."""
        args = self.args
        self.idle("hot publisher")
        self.log(f"3. broker, 2 workers, one hot publisher (half of N={args.n:,}){tag}")
        got = self.attempt("hot_2w", run_broker, client, settings, topo, args.n, 2, True, args.interleave)
        if got:
            runs["hot_2w"].append(got)
            self.log(f"   {got['pubs_per_s']:,} pubs/s")

    def side_by_side(
        self,
        runs: dict[str, list[dict[str, Any]]],
        rep: int,
        label: str,
        off: tuple[str, str, dict[str, Any]],
        on: tuple[str, str, dict[str, Any]],
        measure: Any,
        tag: str,
    ) -> None:
        """Measure both variants of one comparison, the order alternating from one repeat to the next.

        ``off``/``on``: ``(run name, what it is, keyword arguments of measure)``.
        """
        for name, what, kwargs in (off, on) if rep % 2 == 0 else (on, off):
            self.idle(name)
            self.log(f"{label}, {what}, N={self.args.n:,}{tag}")
            got = self.attempt(name, measure, **dict(kwargs))
            if got:
                runs[name].append(got)
                self.log(f"   {got['pubs_per_s']:,} pubs/s, F={got['fanout_measured']}")

    def run(self) -> None:
        args = self.args
        self.server = Server().start()
        client = connect(self.server.url)
        info = client.info("server")
        self.figures["environment"] = {
            "server": (
                f"valkey {info['valkey_version']}"
                if "valkey_version" in info
                else f"redis {info['redis_version']}"
            ),
            "binary": self.server.binary,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "host": platform.node(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.figures["code"] = code_state(Path(__file__).resolve().parents[2])
        self.log(
            f"server {self.figures['environment']['server']} on {self.server.url} (pid {info['process_id']}); "
            f"code {self.figures['code']['describe']}"
        )
        settings = Settings(redis_url=self.server.url, qm=QM)
        self.figures["settings"] = settings.model_dump(
            include={"batch_size", "heads", "lease_ms", "block_ms", "journal", "dedup_window_ms"}
        )
        need_topology = args.only & {
            "ceiling",
            "broker",
            "hot",
            "latency",
            "selectors",
            "topics",
            "flow",
            "slow",
            "swiftmq",
            "security",
            "metrics",
            "regression",
            "aof",
            "memory",
            "e2e",
            "instructions",
        }
        topo = None
        if need_topology:
            self.log("subscriptions and links (admin API) ...")
            topo = Topology.build(client, QM)
            self.figures["topology"] = {
                "topics": len(TOPICS),
                "subscriptions": len(topo.sub_ids),
                "links": len(link_plan()),
                "setup_s": round(topo.setup_s, 2),
                "explain_checked": topo.checked,
                "example_route": topo.via.get("example"),
            }
            routes = topo.routes(client)
        sel_topo = None
        if "selectors" in args.only:
            self.log(f"the same with a selector on every {SELECTOR_EVERY}th subscription ...")
            sel_topo = Topology.build(client, QM, selector=SELECTOR)
            self.figures["topology_selectors"] = {
                "selector": SELECTOR,
                "every": SELECTOR_EVERY,
                "selective_subscriptions": len(sel_topo.selective),
                "setup_s": round(sel_topo.setup_s, 2),
            }
        swift_topo = None
        if "swiftmq" in args.only:
            self.log("the same topology in the swiftmq scheme (dot topics, % predicates) ...")
            swift_topo = Topology.build(client, QM, scheme="swiftmq")
            self.figures["topology_swiftmq"] = {
                "subscriptions": len(swift_topo.sub_ids),
                "predicates": sum(1 for f, _, _ in swiftmq_subscription_plan() if "%" in f),
                "setup_s": round(swift_topo.setup_s, 2),
                "example_route": swift_topo.via.get("example"),
            }
        objects = topic_object_plan() if "topics" in args.only else []
        if objects:
            self.figures["topic_objects"] = {
                "count": len(objects),
                "coverage": round(topic_object_coverage(objects), 3),
                "examples": [f"{o.name} -> {o.topic_string}" for o in objects[::40]],
            }
        runs: dict[str, list[dict[str, Any]]] = {
            "ceiling": [],
            "broker_1w": [],
            "broker_2w": [],
            "aof_2w": [],
            "rabbit_persistent": [],
            "rabbit_transient": [],
            "hot_2w": [],
            "selectors_off": [],
            "selectors_on": [],
            "topics_off": [],
            "topics_on": [],
            "swiftmq_off": [],
            "swiftmq_on": [],
            "flow_off": [],
            "flow_on": [],
            "slow_off": [],
            "slow_on": [],
            "security_off": [],
            "security_on": [],
            "metrics_off": [],
            "metrics_on": [],
            "regression_off": [],
            "regression_on": [],
            **{f"fed_{k}qm": [] for k in FED_SIZES},
        }
        if "federation" in args.only:
            self.log(
                "13. federation: a local 3-master cluster, the workload on one queue manager per master ..."
            )
            started = time.perf_counter()
            self.fed = Federation.start(topo)  # the topology above when built, else built there
            self.figures["federation_setup"] = {
                "queue_managers": {qm: self.fed.port(qm) for qm in self.fed.qms},
                "masters": self.fed.cluster.ports,
                "setup_s": round(time.perf_counter() - started, 1),
            }

        if "rabbit" in args.only:
            why = bench_rabbit.unavailable()
            if why:
                self.figures["rabbit"] = {"skipped": why}
                self.log(f"[yellow]17. RabbitMQ skipped: {why}[/yellow]")
            else:
                self.log("17. RabbitMQ: a node of its own loading the topology as a topic exchange ...")
                peer = bench_rabbit.RabbitPeer(args.rabbit_procs, args.rabbit_window)
                self.rabbit = peer
                if self.attempt("rabbit", peer.start) is None:
                    self.rabbit = None
                else:
                    self.figures["rabbit"] = dict(peer.info)
                    self.log(
                        f"   RabbitMQ {peer.info['version']} up in {peer.info['node_start_s']} s "
                        f"({len(peer.topo.queues):,} queues, "
                        f"{len(peer.topo.queue_bindings) + len(peer.topo.exchange_bindings):,} bindings)"
                    )

        def two_workers(topology: Any, run_settings: Settings = settings, **extra: Any) -> Any:
            """The 2-worker broker run of a side-by-side comparison (7. selectors, 9.-11.)."""
            return run_broker(client, run_settings, topology, args.n, 2, False, args.interleave, **extra)

        flow_off = settings.model_copy(update={"flowcontrol_enabled": False})
        never_slow = SlowSubscriberCondition(name="bench", max_messages=10**9, persistence_mode="all")
        slow_on = settings.model_copy(update={"slow_subscriber_conditions": [never_slow]})
        from broker.server import free_port

        metrics_on = settings.model_copy(update={"metrics_port": free_port()})
        baseline_factory = None
        if "regression" in args.only:
            try:
                self.baseline = BaselineCheckout(Path(__file__).resolve().parents[2], args.baseline)
                baseline_factory = pool_factory(self.baseline.path)
                self.figures["baseline"] = {
                    "ref": args.baseline,
                    "commit": self.baseline.short,
                    "subject": self.baseline.subject,
                }
                self.log(
                    f"16. baseline: {self.baseline.short} {self.baseline.subject} in {self.baseline.path}"
                )
            except BaselineError as exc:
                self.errors["regression"] = str(exc)
                self.log(f"[red]regression: {exc}[/red]")

        #: (section, label, (run, what, kwargs) without, (run, what, kwargs) with): 7., 9.-12., 14.
        comparisons = [
            (
                "selectors",
                "7. broker, 2 workers, properties on every publication",
                ("selectors_off", "no selectors", dict(topology=topo, properties=True)),
                (
                    "selectors_on",
                    f"{len(sel_topo.selective) if sel_topo else 0} selectors",
                    dict(topology=sel_topo, properties=True),
                ),
            ),
            (
                "topics",
                "9. broker, 2 workers",
                ("topics_off", "no topic objects", dict(topology=topo, topic_objects=[])),
                ("topics_on", f"{len(objects)} topic objects", dict(topology=topo, topic_objects=objects)),
            ),
            (
                "flow",
                "10. broker, 2 workers",
                ("flow_off", "flow control off", dict(topology=topo, run_settings=flow_off)),
                ("flow_on", "flow control on (the default)", dict(topology=topo)),
            ),
            (
                "slow",
                "11. broker, 2 workers",
                ("slow_off", "no slow-subscriber condition", dict(topology=topo)),
                (
                    "slow_on",
                    "a condition on root topic bench, never met",
                    dict(topology=topo, run_settings=slow_on),
                ),
            ),
            (
                "swiftmq",
                "12. broker, 2 workers",
                ("swiftmq_off", "mqtt scheme", dict(topology=topo)),
                ("swiftmq_on", "swiftmq scheme, dot topics", dict(topology=swift_topo)),
            ),
            (
                "security",
                "14. broker, 2 workers",
                ("security_off", "security off", dict(topology=topo)),
                (
                    "security_on",
                    "security on: principal users through ingress streams, a worker user",
                    dict(topology=topo, security=True),
                ),
            ),
            (
                "metrics",
                "15. broker, 2 workers",
                ("metrics_off", "metrics off (metrics_port 0, the default)", dict(topology=topo)),
                (
                    "metrics_on",
                    "metrics on: the workers record, the pool serves /metrics",
                    dict(topology=topo, run_settings=metrics_on),
                ),
            ),
            (
                "regression" if baseline_factory is not None else "",
                "16. broker, 2 workers",
                (
                    "regression_off",
                    f"earlier commit {self.figures.get('baseline', {}).get('commit', '')}",
                    dict(topology=topo, pool_factory=baseline_factory),
                ),
                ("regression_on", "this commit", dict(topology=topo)),
            ),
        ]
        for rep in range(args.repeat):
            tag = f" (repeat {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
            if "ceiling" in args.only:
                self.idle("ceiling")
                self.log(f"1. ceiling: hand-packed MULTI fan-out, N={args.n:,}{tag}")
                got = self.attempt(
                    "ceiling", run_ceiling, client, "127.0.0.1", self.server.port, routes, args.n
                )
                if got:
                    runs["ceiling"].append(got)
                    self.log(f"   {got['tx_per_s']:,} tx/s")
            # the ceiling, the 2-worker run and the hot publisher side by side: their ratios are per repeat
            if "broker" in args.only:
                for workers in (2, 1):
                    if workers == 1 and "hot" in args.only:
                        self.run_hot(runs, client, settings, topo, tag)
                    self.idle(f"broker {workers}w")
                    self.log(f"2. broker, {workers} worker(s), N={args.n:,}{tag}")
                    got = self.attempt(
                        f"broker_{workers}w",
                        run_broker,
                        client,
                        settings,
                        topo,
                        args.n,
                        workers,
                        False,
                        args.interleave,
                    )
                    if got:
                        runs[f"broker_{workers}w"].append(got)
                        self.log(f"   {got['pubs_per_s']:,} pubs/s")
            elif "hot" in args.only:
                self.run_hot(runs, client, settings, topo, tag)
            if "aof" in args.only:
                self.idle("broker aof")
                self.log(f"18. broker, 2 workers, AOF on (appendfsync everysec), N={args.n:,}{tag}")
                got = self.attempt("aof_2w", run_broker_aof, client, settings, topo, args.n, args.interleave)
                if got:
                    runs["aof_2w"].append(got)
                    self.log(f"   {got['pubs_per_s']:,} pubs/s")
            if self.rabbit is not None:
                for mode in bench_rabbit.MODES:
                    self.idle(f"rabbit {mode}")
                    self.log(
                        f"17. RabbitMQ {mode}, 50 channels in {args.rabbit_procs} processes, "
                        f"N={args.rabbit_n:,}{tag}"
                    )
                    got = self.attempt(f"rabbit_{mode}", self.rabbit.run, mode, args.rabbit_n)
                    if got:
                        runs[f"rabbit_{mode}"].append(got)
                        self.log(f"   {got['pubs_per_s']:,} pubs/s")
            for section, label, off, on in comparisons:
                if section in args.only:
                    self.side_by_side(runs, rep, label, off, on, two_workers, tag)
            if self.fed is not None:
                for k in FED_SIZES:
                    self.idle(f"federation {k}")
                    self.log(
                        f"13. federation, {k} queue manager(s), {args.fed_workers} worker(s) each, "
                        f"N={args.fed_n:,} each{tag}"
                    )
                    got = self.attempt(
                        f"fed_{k}qm",
                        run_federation,
                        self.fed,
                        settings,
                        k,
                        args.fed_n,
                        args.fed_workers,
                        args.interleave,
                    )
                    if got:
                        runs[f"fed_{k}qm"].append(got)
                        self.log(
                            f"   {got['pubs_per_s']:,} pubs/s ({got['entries_per_s']:,} entries/s handled)"
                        )
        self.figures["runs"] = runs
        for name, key in (
            ("swiftmq_off", "pubs_per_s"),
            ("swiftmq_on", "pubs_per_s"),
            ("ceiling", "tx_per_s"),
            ("broker_1w", "pubs_per_s"),
            ("broker_2w", "pubs_per_s"),
            ("aof_2w", "pubs_per_s"),
            ("hot_2w", "pubs_per_s"),
            ("selectors_off", "pubs_per_s"),
            ("selectors_on", "pubs_per_s"),
            ("topics_off", "pubs_per_s"),
            ("topics_on", "pubs_per_s"),
            ("flow_off", "pubs_per_s"),
            ("flow_on", "pubs_per_s"),
            ("slow_off", "pubs_per_s"),
            ("slow_on", "pubs_per_s"),
            ("security_off", "pubs_per_s"),
            ("security_on", "pubs_per_s"),
            ("metrics_off", "pubs_per_s"),
            ("metrics_on", "pubs_per_s"),
            ("regression_off", "pubs_per_s"),
            ("regression_on", "pubs_per_s"),
            *((f"fed_{k}qm", "pubs_per_s") for k in FED_SIZES),
        ):
            if runs[name]:
                self.figures[name] = _median_run(runs[name], key)
        if "selectors" in args.only:
            self.log(f"7. selector evaluation: compile_selector({SELECTOR!r}).matches, timeit")
            self.figures["selector_eval"] = run_selector_cost()
            self.figures["selector_ratios"] = _ratios(runs["selectors_off"], runs["selectors_on"])
        if "topics" in args.only:
            self.figures["topic_objects_ratios"] = _ratios(runs["topics_off"], runs["topics_on"])
        for name in ("flow", "slow", "security", "metrics", "regression"):
            if name in args.only:
                self.figures[f"{name}_ratios"] = _ratios(runs[f"{name}_off"], runs[f"{name}_on"])
        if "swiftmq" in args.only:
            self.figures["swiftmq_ratios"] = _ratios(runs["swiftmq_off"], runs["swiftmq_on"])
            self.idle("swiftmq matching")
            self.log(f"12. swiftmq matching: indexes of {', '.join(f'{n:,}' for n in args.match_sizes)}")
            self.figures["swiftmq_matching"] = run_hierarchy_matching(
                args.match_sizes, min_s=0.2 if args.quick else 0.4
            )
        if self.fed is not None:
            self.figures["federation_ratios"] = {
                f"{k}qm": _ratios(runs["fed_1qm"], runs[f"fed_{k}qm"]) for k in FED_SIZES[1:]
            }
            self.idle("federation latency")
            self.log(
                f"13. forwarded latency: paced {args.fed_rate:,.0f}/s for {args.latency_s:.0f} s, 2 queue managers"
            )
            got = self.attempt(
                "fed_latency", run_federation_latency, self.fed, settings, args.fed_rate, args.latency_s
            )
            if got:
                self.figures["fed_latency"] = got
        if "latency" in args.only:
            self.idle("latency")
            self.log(f"4. latency: paced {args.rate:,.0f}/s for {args.latency_s:.0f} s, 2 workers")
            got = self.attempt("latency", run_latency, client, settings, topo, args.rate, args.latency_s)
            if got:
                self.figures["latency"] = got
        if "publish" in args.only:
            self.idle("publish")
            self.log("22. publish() call: us per call, flow control on and off, bare XADD alongside")
            self.figures["publish_call"] = ab_publish.measure(client, 5_000 if args.quick else 20_000)
        if "e2e" in args.only and topo is not None:
            self.run_e2e(client, settings, topo)
        if "kombu" in args.only:
            self.idle("kombu")
            self.log(f"5. kombu topic exchange, N={args.kombu_n:,}")
            got = self.attempt("kombu", run_kombu, client, self.server.url, args.kombu_n)
            if got:
                self.figures["kombu"] = got
        if "aof" in args.only:
            self.figures["aof_ratios"] = _ratios(runs["broker_2w"], runs["aof_2w"])
        if self.rabbit is not None:
            self.rabbit.stop()
            for mode in bench_rabbit.MODES:
                if runs[f"rabbit_{mode}"]:
                    self.figures["rabbit"][mode] = _median_run(runs[f"rabbit_{mode}"], "pubs_per_s")
            self.figures["rabbit_ratios"] = [
                round(a["pubs_per_s"] / b["pubs_per_s"], 3)
                for a, b in zip(runs["broker_2w"], runs["rabbit_persistent"], strict=False)
            ]
        if "memory" in args.only:
            self.idle("memory")
            self.log(
                f"19. memory per waiting message: {args.memory_n:,} envelopes in one queue, "
                f"{args.memory_n // 5:,} publications fanned out"
            )
            got = self.attempt(
                "memory",
                run_memory,
                client,
                settings,
                topo,
                args.memory_n,
                args.memory_n // 5,
                args.interleave,
            )
            if got:
                self.figures["memory"] = got
                self.log(
                    f"   {got['single']['bytes_per_msg']} B/message in one queue, "
                    f"{got['fanout']['bytes_per_element']} B per queue element fanned out"
                )
        if "consume" in args.only:
            single_n = max(1000, args.n // 5)
            self.idle("consume")
            self.log(
                f"8. one consumer: receive_many(100) + ack_many of {args.n:,}, the same with receive_many(1000), "
                f"and reading each message; receive + ack of {single_n:,}"
            )
            got = self.attempt("consume", run_consume, client, settings, QM, args.n, single_n)
            if got:
                self.figures["consume"] = got
                self.log(
                    f"   {got['msgs_per_s']:,} msgs/s batched, {got['large_msgs_per_s']:,} by 1000, "
                    f"{got['read_msgs_per_s']:,} read, {got['single_msgs_per_s']:,} one at a time"
                )
        if "match" in args.only:
            self.idle("matching")
            self.log(f"6. matching: indexes of {', '.join(f'{n:,}' for n in args.match_sizes)} subscriptions")
            self.figures["matching"] = run_matching(args.match_sizes, min_s=0.2 if args.quick else 0.4)
        skip = bench_callgrind.available() if "instructions" in args.only else None
        if skip:  # as RabbitMQ's row without rabbitmq-server: n/a, not a failure
            self.log(f"21. instructions: skipped, {skip}")
            self.figures["instructions"] = {"skipped": skip}
        elif "instructions" in args.only and topo is not None:
            self.idle("instructions")
            self.log(
                f"21. instructions: the server under callgrind, 1 worker in process and the ceiling, "
                f"N={args.instructions_n:,} each"
            )
            got = self.attempt(
                "instructions", bench_callgrind.run_instructions, topo, args.instructions_n, args.interleave
            )
            if got:
                self.figures["instructions"] = got
                self.log(
                    f"   broker {got['broker_ir_per_pub']:,} instructions/publication, ceiling "
                    f"{got['ceiling_ir_per_tx']:,}/tx: ratio {got['ratio']}"
                )
        if args.profile and topo is not None:
            os.makedirs(args.profile, exist_ok=True)
            self.log(
                f"profile: 2 workers under py-spy (100 Hz, --idle), N={args.n:,}; stacks in {args.profile}"
            )
            got = self.attempt(
                "profile",
                run_broker,
                client,
                settings,
                topo,
                args.n,
                2,
                False,
                args.interleave,
                profile_dir=args.profile,
                label="worker",
            )
            if got:
                self.figures["profile"] = got
        client.flushdb()

    def run_e2e(self, client: Any, settings: Settings, topo: Any) -> None:
        """20. End to end at ``--rate`` and at 80% of the saturated 2-worker rate."""
        args = self.args
        saturated = args.e2e_saturated or self.figures.get("broker_2w", {}).get("pubs_per_s")
        if not saturated:
            self.idle("e2e saturation")
            self.log(f"20. end to end: the saturated rate first (2 workers, N={args.n:,})")
            got = self.attempt(
                "e2e_saturation", run_broker, client, settings, topo, args.n, 2, False, args.interleave
            )
            saturated = got and got["pubs_per_s"]
        if not saturated:
            return
        self.figures["e2e_saturated"] = saturated
        for key, rate in (("e2e", args.rate), ("e2e_80pct", 0.8 * saturated)):
            self.idle(key)
            self.log(
                f"20. end to end: paced {rate:,.0f}/s for {args.latency_s:.0f} s, 2 workers, 1 consumer process"
            )
            got = self.attempt(key, run_e2e, client, settings, topo, rate, args.latency_s)
            if got:
                self.figures[key] = got
                self.log(
                    f"   p50 {got['p50_ms']} ms, p99 {got['p99_ms']} ms, achieved {got['achieved_rate']:,}/s"
                )

    def e2e_text(self) -> str:
        """20.'s figures, printed before the last line."""
        f = self.figures
        if "e2e" not in f and "e2e_80pct" not in f:
            return ""
        nan = float("nan")
        return (
            f"20. end to end (publish -> 2 workers -> consumer ack), saturated {f.get('e2e_saturated', nan):,} pubs/s: "
            f"e2e_p99_ms={f.get('e2e', {}).get('p99_ms', nan)} "
            f"e2e_p99_80pct_ms={f.get('e2e_80pct', {}).get('p99_ms', nan)}"
        )

    def stop(self) -> None:
        if self.baseline is not None:
            self.baseline.close()
        if self.rabbit is not None:
            self.rabbit.stop()
        if self.fed is not None:
            self.fed.stop()
        if self.server is not None:
            self.server.stop()

    # ---------------------------------------------------------------------------------- report

    def summary(self) -> dict[str, Any]:
        f = self.figures
        nan = float("nan")
        broker = f.get("broker_2w", {}).get("pubs_per_s", nan)
        ceiling = f.get("ceiling", {}).get("tx_per_s", nan)
        kombu = f.get("kombu", {}).get("pubs_per_s", nan)
        hot = f.get("hot_2w", {}).get("pubs_per_s", nan)
        p99 = f.get("latency", {}).get("p99_ms", nan)
        matching = f.get("matching") or []
        by_n = {m["n"]: m for m in matching}
        small = by_n.get(1000) or (matching[0] if matching else None)
        large = matching[-1] if matching else None
        ratio = large["resolve_us"] / small["resolve_us"] if small and large else nan
        sel_off = f.get("selectors_off", {}).get("pubs_per_s", nan)
        sel_on = f.get("selectors_on", {}).get("pubs_per_s", nan)
        consume = f.get("consume") or {}
        rabbit = f.get("rabbit") or {}
        rabbit_persistent = (rabbit.get("persistent") or {}).get("pubs_per_s", nan)
        aof = f.get("aof_2w", {}).get("pubs_per_s", nan)
        memory = f.get("memory") or {}

        def on_over_off(name: str) -> float:
            off = f.get(f"{name}_off", {}).get("pubs_per_s", nan)
            on = f.get(f"{name}_on", {}).get("pubs_per_s", nan)
            return on / off if off == off and off else nan

        out = {
            "broker_pubs_per_s": broker,
            "ceiling_ratio": _paired(
                f, "broker_2w", "ceiling", "tx_per_s", broker / ceiling if ceiling else nan
            ),
            "kombu_ratio": broker / kombu if kombu == kombu and kombu else nan,
            "rabbit_ratio": statistics.median(f["rabbit_ratios"]) if f.get("rabbit_ratios") else nan,
            "rabbit_installed": "skipped" not in rabbit,
            "rabbit_persistent_pubs_per_s": rabbit_persistent,
            "rabbit_transient_pubs_per_s": (rabbit.get("transient") or {}).get("pubs_per_s", nan),
            "rabbit_aof_ratio": aof / rabbit_persistent if rabbit_persistent == rabbit_persistent else nan,
            "aof_pubs_per_s": aof,
            "aof_ratio": statistics.median(f["aof_ratios"]) if f.get("aof_ratios") else nan,
            "memory_bytes_per_msg": (memory.get("single") or {}).get("bytes_per_msg", nan),
            "memory_bytes_per_element": (memory.get("fanout") or {}).get("bytes_per_element", nan),
            "hot_publisher_ratio": _paired(
                f, "hot_2w", "broker_2w", "pubs_per_s", hot / broker if broker else nan
            ),
            "p99_ms": p99,
            "match_1m_over_1k": ratio,
            "match_ratio_sizes": f"{large['n']:,} / {small['n']:,}" if small and large else None,
            "selector_ratio": sel_on / sel_off if sel_off == sel_off and sel_off else nan,
            "selector_eval_us": f.get("selector_eval", {}).get("median_us", nan),
            "consume_per_s": consume.get("msgs_per_s", nan),
            "consume_large_per_s": consume.get("large_msgs_per_s", nan),
            "memory_over_body_bytes": (memory.get("fanout") or {}).get("bytes_per_element", nan) - BODY_BYTES,
            "regression_ratio": statistics.median(f["regression_ratios"])
            if f.get("regression_ratios")
            else nan,
            "ceiling_ratio_instructions": (f.get("instructions") or {}).get("ratio", nan),
            "consume_batch_ratio": consume.get("batch_over_single", nan),
            "topic_objects_ratio": on_over_off("topics"),
            "flow_control_ratio": on_over_off("flow"),
            "slow_condition_ratio": on_over_off("slow"),
            "swiftmq_ratio": on_over_off("swiftmq"),
            "security_ratio": statistics.median(f["security_ratios"]) if f.get("security_ratios") else nan,
            **self.federation_summary(),
        }
        f["summary"] = out
        return out

    def federation_summary(self) -> dict[str, Any]:
        """The federation figures (13.): pubs/s and Redis CPU-us per publication (all masters) with
        1, 2 and 3 queue managers, the median ratios to 1, the forwarded latency."""
        f, nan = self.figures, float("nan")
        out: dict[str, Any] = {}
        for k in FED_SIZES:
            run = f.get(f"fed_{k}qm", {})
            out[f"federation_{k}qm_pubs_per_s"] = run.get("pubs_per_s", nan)
            out[f"federation_{k}qm_redis_cpu_us_per_pub"] = run.get("redis_cpu_us_per_pub", nan)
            ratios = f.get("federation_ratios", {}).get(f"{k}qm")
            if k > 1:
                out[f"federation_{k}qm_ratio"] = statistics.median(ratios) if ratios else nan
        out["federation_latency_p50_ms"] = f.get("fed_latency", {}).get("p50_ms", nan)
        out["federation_latency_p99_ms"] = f.get("fed_latency", {}).get("p99_ms", nan)
        return out

    def federation_text(self) -> str:
        """Per master and per process kind, CPU-us per publication in each federation run, and the summary."""
        f = self.figures
        lines = []
        for k in FED_SIZES:
            b = f.get(f"fed_{k}qm")
            if not b:
                continue
            nodes = ", ".join(f"{n['qm']}@{n['port']} {n['cpu_us_per_pub']}" for n in b["nodes"])
            lines.append(
                f"  {k} queue manager(s): redis per master {nodes} (sum {b['redis_cpu_us_per_pub']}); "
                f"workers {b['workers_cpu_us_per_pub']}, channel processes {b['channels_cpu_us_per_pub']}"
            )
        if not lines:
            return ""
        summary = " ".join(
            f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in self.federation_summary().items()
        )
        return (
            "Federation CPU-us per publication (a publication is handled once at every queue manager; "
            "channel_in at each receiver, the transmission stream at each sender):\n"
            + "\n".join(lines)
            + f"\n{summary}"
        )

    def final_line(self, s: dict[str, Any]) -> str:
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

    def table(self) -> Table:
        f = self.figures
        reps = f"median of {self.args.repeat} runs" if self.args.repeat > 1 else "1 run each"
        env = f.get("environment", {})
        code = f.get("code", {}).get("describe", "?")
        table = Table(
            title=f"F=10, 50 publishers, 1,000 topics, 200 B bodies; code {code}; {env.get('server', '')}, "
            f"{env.get('cpus')} CPUs; {reps}; CPU in % of one core (redis / our Python / foreign)",
            title_justify="left",
            show_lines=True,
        )
        table.add_column("measurement", no_wrap=True)
        table.add_column("pubs/s", justify="right", no_wrap=True)
        table.add_column("deliv/s", justify="right", no_wrap=True)
        table.add_column("details", ratio=1)
        table.add_column("CPU r/py/fgn", no_wrap=True)

        def cpu3(cpu: dict[str, float] | None, py_keys: tuple[str, ...]) -> str:
            if not cpu:
                return ""
            py = sum(cpu.get(k, 0.0) for k in py_keys)
            return f"{cpu.get('redis', 0):.0f} / {py:.0f} / {cpu.get('foreign', 0):.0f}"

        def run_notes(b: dict[str, Any], what: str) -> str:
            """The notes of a plain side-by-side broker run: what it is, N, XADD/s, steady rate, F, Redis CPU."""
            return (
                f"{what}; N={b['n']:,} ({_fmt(b['preload_xadd_per_s'])} XADD/s); steady 10-90% "
                f"{_fmt(b['steady_10_90_pubs_per_s'])}/s; F={b['fanout_measured']}; "
                f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
            )

        def broker_row(label: str, b: dict[str, Any], notes: str) -> None:
            table.add_row(
                label,
                _fmt(b["pubs_per_s"]),
                _fmt(b["deliveries_per_s"]),
                notes,
                cpu3(b["cpu"], ("workers", "bench")),
            )

        if "ceiling" in f:
            c = f["ceiling"]
            table.add_row(
                "1. ceiling",
                _fmt(c["tx_per_s"]),
                _fmt(c["deliveries_per_s"]),
                f"MULTI + 10 LPUSH + XACK + EXEC, {c['tx_per_rt']} tx per round trip, hand-packed RESP, "
                f"hiredis.Reader; N={c['n']:,}; redis {c['redis_cpu_us_per_pub']} CPU-us/tx",
                cpu3(c["cpu"], ("bench",)),
            )
        for key, label, conf in (
            ("broker_1w", "2. broker 1 worker", ""),
            ("broker_2w", "2. broker 2 workers", ""),
            ("hot_2w", "3. hot publisher", "p00 sends 50%; "),
        ):
            if key not in f:
                continue
            b = f[key]
            notes = (
                f"{conf}N={b['n']:,} preloaded ({_fmt(b['preload_xadd_per_s'])} XADD/s); steady 10-90% "
                f"{_fmt(b['steady_10_90_pubs_per_s'])}/s, from spawn {_fmt(b['from_spawn_pubs_per_s'])}/s; "
                f"F={b['fanout_measured']}; order inversions {b['order_inversions']}/{b['order_checked']:,}; "
                f"work split {'/'.join(f'{x:.0%}' for x in b['work_split']) if b.get('work_split') else '?'}; "
                f"dedup records {b['dedup_records_found']}; redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
            )
            broker_row(label, b, notes)
        if "aof_2w" in f:
            b = f["aof_2w"]
            off = f.get("broker_2w", {}).get("pubs_per_s")
            repeats = ", ".join(str(x) for x in f.get("aof_ratios") or [])
            broker_row(
                "18. broker 2 workers, AOF everysec",
                b,
                run_notes(b, "as 2 with 2 workers, appendonly yes + appendfsync everysec on the server")
                + (f"; AOF/no AOF {b['pubs_per_s'] / off:.2f} (per repeat {repeats})" if off else ""),
            )
        if "latency" in f:
            lat = f["latency"]
            table.add_row(
                "4. latency 2 workers",
                _fmt(lat["achieved_rate"]),
                _fmt((lat["achieved_rate"] or 0) * FANOUT),
                f"paced {lat['rate']:,.0f}/s for {lat['duration_s']:.0f} s, XADD -> BRPOP: {_percentiles(lat)}; "
                f"publisher at most {lat['publisher_max_behind_ms']} ms behind its schedule",
                cpu3(lat["cpu"], ("workers", "bench", "publisher")),
            )
        if "publish_call" in f:
            pc = f["publish_call"]
            table.add_row(
                "22. publish() call",
                _fmt(1e6 / pc["flow_on_us"]),
                "",
                f"one publisher, 200 B bodies, N={pc['n']:,}: {pc['flow_on_us']} us per call "
                f"({pc['flow_on_cpu_us']} CPU-us) with flow control, {pc['flow_off_us']} us "
                f"({pc['flow_off_cpu_us']} CPU-us) without; a bare redis-py XADD {pc['xadd_us']} us "
                f"({pc['xadd_cpu_us']} CPU-us). Before/after: python -m scripts.bench_ab OLD NEW --rows publish",
                "",
            )
        if "kombu" in f:
            k = f["kombu"]
            table.add_row(
                "5. kombu publish",
                _fmt(k["pubs_per_s"]),
                _fmt(k["published_deliveries_per_s"]),
                f"topic exchange, 10 queues bound t.#, sequential Producer.publish, N={k['n']:,}",
                cpu3(k["cpu_publish"], ("bench",)),
            )
            table.add_row(
                "5. kombu consume",
                "-",
                _fmt(k["consumed_deliveries_per_s"]),
                f"1 Consumer on the 10 queues, ack each, {k['n'] * FANOUT:,} messages",
                cpu3(k["cpu_consume"], ("bench",)),
            )
        rabbit = f.get("rabbit") or {}
        if "skipped" in rabbit:
            table.add_row("17. RabbitMQ", "-", "-", f"skipped: {rabbit['skipped']}", "")
        broker = f.get("broker_2w", {}).get("pubs_per_s")
        aof = f.get("aof_2w", {}).get("pubs_per_s")
        for mode, what in (
            ("persistent", "persistent (delivery mode 2), publisher confirms, window {window}/channel"),
            ("transient", "transient (delivery mode 1), no confirms"),
        ):
            r = rabbit.get(mode)
            if not r:
                continue
            vs = []
            if broker:
                repeats = f.get("rabbit_ratios") if mode == "persistent" else None
                vs.append(
                    f"broker 2 workers / this {broker / r['pubs_per_s']:.2f}"
                    + (f" (per repeat {', '.join(map(str, repeats))})" if repeats else "")
                )
            if aof:
                vs.append(f"broker with AOF everysec / this {aof / r['pubs_per_s']:.2f}")
            server_us = f"RabbitMQ {r['rabbitmq_cpu_us_per_pub']:,.0f} CPU-us/pub"
            b2 = f.get("broker_2w")
            if b2:
                server_us += f" (the broker's Redis + workers {_server_cpu_us(b2):,.0f})"
            topo = rabbit.get("topology", {})
            table.add_row(
                f"17. RabbitMQ {mode}",
                _fmt(r["pubs_per_s"]),
                _fmt(r["deliveries_per_s"]),
                f"RabbitMQ {rabbit.get('version')} (a node of its own), topic exchange: {topo.get('queues')} "
                f"durable classic queues, {topo.get('link_exchanges')} link fanout exchanges, "
                f"{topo.get('queue_bindings')} + {topo.get('exchange_bindings')} e2e bindings; "
                + what.format(window=r["window"])
                + f"; 50 pika channels in {r['procs']} processes; N={r['n']:,}; F={r['fanout_measured']} "
                f"(all {r['queues_checked']:,} queue depths checked, {r['settle_s']} s after the clock)"
                + (f"; {', '.join(vs)}" if vs else "")
                + f"; {server_us}, publishers {r['publishers_cpu_us_per_pub']:,.0f}"
                + "; server column = RabbitMQ's beam",
                f"{r['cpu'].get('rabbitmq', 0):.0f} / {r['cpu'].get('publishers', 0) + r['cpu'].get('bench', 0):.0f}"
                f" / {r['cpu'].get('foreign', 0):.0f}",
            )
        if "instructions" in f and "skipped" in f["instructions"]:
            table.add_row("21. instructions", "-", "-", f"skipped: {f['instructions']['skipped']}", "")
        elif "instructions" in f:
            ins = f["instructions"]

            def top(rows: list[Any], k: int = 5) -> str:
                return ", ".join(f"{name} {count:,}" for name, count in rows[:k])

            table.add_row(
                "21. instructions",
                "-",
                "-",
                f"the server's instructions (callgrind Ir), N={ins['n']:,}: broker {ins['broker_ir_per_pub']:,}/publication "
                f"(1 worker in process, {ins['worker_rounds']} rounds), ceiling {ins['ceiling_ir_per_tx']:,}/tx: "
                f"ratio {ins['ratio']} (the ceiling ratio in server work alone, deterministic); most per "
                f"publication: {top(ins['broker_top'])}; per ceiling tx: {top(ins['ceiling_top'])}",
                "",
            )
        if "memory" in f:
            m = f["memory"]
            one, fan = m["single"], m["fanout"]
            table.add_row(
                "19. memory, one queue",
                "-",
                "-",
                f"{one['k']:,} envelopes of {m['body_bytes']} B bodies ({one['envelope_bytes']} B each) in one "
                f"subscriber queue: {one['bytes_per_msg']} B of used_memory per message "
                f"(body + {one['bytes_per_msg'] - m['body_bytes']:.0f}; target <= {m['target_bytes']}), "
                f"the list's MEMORY USAGE {one['key_bytes_per_msg']} B",
                "",
            )
            table.add_row(
                "19. memory, fanned out",
                "-",
                "-",
                f"{fan['k']:,} publications through the broker, {fan['elements']:,} queue elements "
                f"({fan['envelope_bytes']} B envelopes, {fan['elements_per_queue']} per queue): "
                f"{fan['bytes_per_element']} B of used_memory per element (body + "
                f"{fan['bytes_per_element'] - m['body_bytes']:.0f}), of which the queues "
                f"{fan['queue_bytes_per_element']} B; per publication the publish stream "
                f"{fan['stream_bytes_per_pub']} B and the rest (dedup records, ...) {fan['other_bytes_per_pub']} B",
                "",
            )
        for m in f.get("matching") or []:
            table.add_row(
                f"6. matching {m['n']:,}",
                _fmt(m["resolves_per_s"]),
                "-",
                f"resolve (closure + match) {m['resolve_us']:.2f} us, match {m['match_us']:.2f} us; "
                f"{m['bytes_per_sub']} B/sub; {m['links']:,} links, {m['wildcard_share']:.0%} wildcards; "
                f"{m['avg_results']} results avg, {m['matched_share']:.0%} of topics match; "
                f"build {m['build_s']} s",
                "",
            )
        for key, label in (("selectors_off", "7. no selectors"), ("selectors_on", "7. 20% selectors")):
            if key not in f:
                continue
            b = f[key]
            if key == "selectors_off":
                notes = run_notes(b, "as 2 with 2 workers, region + amount properties on every publication")
            else:
                ev = f.get("selector_eval") or {}
                off = f.get("selectors_off", {}).get("pubs_per_s")
                ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
                notes = (
                    f"same, {b['selective_subscriptions']} subscriptions with {SELECTOR!r}: "
                    f"{b['selector_evaluations'] / b['n']:.2f} evaluations/pub, "
                    f"{b['selected_share']:.0%} selected; F={b['fanout_measured']} "
                    f"(= expected {b['expected_deliveries'] / b['n']:.3f}); with/without {ratio} "
                    f"(per repeat {', '.join(str(x) for x in f.get('selector_ratios') or [])}); "
                    f"steady 10-90% {_fmt(b['steady_10_90_pubs_per_s'])}/s; "
                    f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub; one evaluation "
                    f"{_fmt(ev.get('median_us'), 2)} us median (loop alone {_fmt(ev.get('loop_us'), 2)} us, "
                    f"{ev.get('sample', 0):,} property dicts, {_fmt(ev.get('selected_share'), 2)} selected)"
                )
            broker_row(label, b, notes)
        for key, label in (
            ("topics_off", "9. no topic objects"),
            ("topics_on", f"9. {TOPIC_OBJECTS} topic objects"),
        ):
            if key not in f:
                continue
            b = f[key]
            if key == "topics_off":
                notes = run_notes(b, "as 2 with 2 workers, {qm}:topics absent")
            else:
                off = f.get("topics_off", {}).get("pubs_per_s")
                ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
                notes = (
                    f"same topology and publications, {b['topic_objects']} objects defined "
                    f"({b['topic_objects_define_s']} s, untimed) over bench/r, audit/r, bench/r/c, "
                    f"leaf topics; {b['topic_objects_coverage']:.0%} of topics under one; attributes "
                    f"that change nothing; F={b['fanout_measured']}, {b['dead_lettered']} dead-lettered; "
                    f"with/without {ratio} (per repeat "
                    f"{', '.join(str(x) for x in f.get('topic_objects_ratios') or [])}); "
                    f"steady 10-90% {_fmt(b['steady_10_90_pubs_per_s'])}/s; "
                    f"redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
                )
            broker_row(label, b, notes)
        for name, off_row, on_row in (
            (
                "flow",
                ("10. flow control off", "as 2 with 2 workers, flowcontrol_enabled false"),
                (
                    "10. flow control on",
                    "same, flow control on (the default curve; queues are never drained, so past 1,000 "
                    "messages every publication gets a delay and its publisher's flow key is set)",
                ),
            ),
            (
                "slow",
                ("11. no slow condition", "as 2 with 2 workers, no slow-subscriber condition"),
                (
                    "11. slow condition",
                    "same, a slow-subscriber condition on root topic 'bench' (every publication, "
                    "persistence_mode all) never met (max_messages 10**9): every recipient queue watched",
                ),
            ),
            (
                "security",
                ("14. security off", "as 2 with 2 workers, publishers XADD to the publish stream"),
                (
                    "14. security on",
                    "same, each publisher id as its own principal ACL user XADDing to its ingress stream "
                    "(moved into the publish stream by the queue mutex), the workers as a worker user",
                ),
            ),
            (
                "regression",
                (
                    "16. earlier commit",
                    f"as 2 with 2 workers, the worker pool of {f.get('baseline', {}).get('commit', '?')}",
                ),
                ("16. this commit", "same, this commit's pool (nothing configured)"),
            ),
        ):
            for key, (label, what) in ((f"{name}_off", off_row), (f"{name}_on", on_row)):
                if key not in f:
                    continue
                b = f[key]
                notes = run_notes(b, what)
                off = f.get(f"{name}_off", {}).get("pubs_per_s")
                if key.endswith("_on") and off:
                    repeats = ", ".join(str(x) for x in f.get(f"{name}_ratios") or [])
                    notes += f"; on/off {b['pubs_per_s'] / off:.2f} (per repeat {repeats})"
                broker_row(label, b, notes)
        for key, label in (("swiftmq_off", "12. mqtt scheme"), ("swiftmq_on", "12. swiftmq scheme")):
            if key not in f:
                continue
            b = f[key]
            if key == "swiftmq_off":
                notes = f"as 2 with 2 workers (the same runs as 12. swiftmq, alternating); F={b['fanout_measured']}"
            else:
                off = f.get("swiftmq_off", {}).get("pubs_per_s")
                ratio = f"{b['pubs_per_s'] / off:.2f}" if off else "-"
                topo = f.get("topology_swiftmq", {})
                notes = (
                    f"the same workload as dot topics bench.r.c.j: {topo.get('subscriptions')} subscriptions, "
                    f"{topo.get('predicates')} with % predicates, 1,000 links; F={b['fanout_measured']}; "
                    f"swiftmq/mqtt {ratio} (per repeat {', '.join(str(x) for x in f.get('swiftmq_ratios') or [])}); "
                    f"steady 10-90% {_fmt(b['steady_10_90_pubs_per_s'])}/s; redis {b['redis_cpu_us_per_pub']} CPU-us/pub"
                )
            broker_row(label, b, notes)
        for m in f.get("swiftmq_matching") or []:
            table.add_row(
                f"12. swiftmq match {m['n']:,}",
                "-",
                "-",
                f"match per topic: mqtt TopicIndex {m['mqtt_us']:.2f} us, swiftmq plain {m['plain_us']:.2f} us, "
                f"swiftmq with {m['predicates']:,} predicates (10%) {m['predicates_us']:.2f} us; "
                f"{m['avg_results']} results avg (depth-4 topics, 90% in the index)",
                "",
            )
        for k in FED_SIZES:
            b = f.get(f"fed_{k}qm")
            if not b:
                continue
            ratios = f.get("federation_ratios", {}).get(f"{k}qm") or []
            ratio = (
                f"; {k} QMs / 1 QM {statistics.median(ratios):.2f} (per repeat {', '.join(map(str, ratios))})"
                if ratios
                else ""
            )
            nodes = ", ".join(f"{n['qm']} {n['cpu_us_per_pub']}" for n in b["nodes"])
            table.add_row(
                f"13. federation {k} QM" + ("s" if k > 1 else ""),
                _fmt(b["pubs_per_s"]),
                _fmt(b["deliveries_per_s"]),
                f"{k} of the 3 masters, {b['workers_per_qm']} worker(s) each"
                + (", one network (hierarchy), channel processes" if k > 1 else "")
                + f"; N={b['n_per_qm']:,} each; {_fmt(b['entries_per_s'])} entries/s handled; "
                f"F={b['fanout_measured']} network-wide{ratio}; "
                f"redis CPU-us/pub per master {nodes}; workers {b['workers_cpu_us_per_pub']}, "
                f"channels {b['channels_cpu_us_per_pub']} CPU-us/pub",
                cpu3(b["cpu"], ("workers", "channels", "bench")),
            )
        if "fed_latency" in f:
            lat = f["fed_latency"]
            table.add_row(
                "13. forwarded latency",
                _fmt(lat["achieved_rate"]),
                "-",
                f"{lat['origin']} -> {lat['destination']}, paced {lat['rate']:,.0f}/s for {lat['duration_s']:.0f} s, "
                f"XADD -> worker -> channel -> worker -> BRPOP: {_percentiles(lat)}",
                cpu3(lat["cpu"], ("workers", "channels", "bench", "publisher")),
            )
        if "consume" in f:
            c = f["consume"]
            table.add_row(
                "8. consume batched",
                "-",
                _fmt(c["msgs_per_s"]),
                f"1 Subscriber (in the bench process): receive_many({c['batch']}) + ack_many, "
                f"{c['n']:,} preloaded messages; {c['batch_over_single']:.1f}x one at a time; "
                f"python {c.get('bench_cpu_us_per_msg', '-')}, redis {c['redis_cpu_us_per_msg']} CPU-us/msg",
                cpu3(c["cpu"], ("bench",)),
            )
            if "large_msgs_per_s" in c:
                table.add_row(
                    "8. consume batched 1000",
                    "-",
                    _fmt(c["large_msgs_per_s"]),
                    f"same, receive_many({c['large_batch']}) + ack_many; "
                    f"python {c['large_bench_cpu_us_per_msg']}, redis {c['large_redis_cpu_us_per_msg']} CPU-us/msg",
                    cpu3(c["large_cpu"], ("bench",)),
                )
                table.add_row(
                    "8. consume batched, read",
                    "-",
                    _fmt(c["read_msgs_per_s"]),
                    f"same, receive_many({c['batch']}), every message read (decoded) + ack_many; "
                    f"python {c['read_bench_cpu_us_per_msg']}, redis {c['read_redis_cpu_us_per_msg']} CPU-us/msg",
                    cpu3(c["read_cpu"], ("bench",)),
                )
            table.add_row(
                "8. consume one by one",
                "-",
                _fmt(c["single_msgs_per_s"]),
                f"same, receive() + ack(), {c['single_n']:,} messages; "
                f"redis {c['single_redis_cpu_us_per_msg']} CPU-us/msg",
                cpu3(c["single_cpu"], ("bench",)),
            )
        for key, label in (("e2e", "20. e2e"), ("e2e_80pct", "20. e2e 80% sat.")):
            if key in f:
                e = f[key]
                table.add_row(
                    label,
                    _fmt(e["achieved_rate"]),
                    "-",
                    f"paced {e['rate']:,}/s ({e['publishers']} publisher processes) for {e['duration_s']:.0f} s, "
                    f"XADD -> 2 workers -> receive_many({e['batch']}) + ack_many in 1 consumer process: "
                    f"{_percentiles(e)}; consumer {e['consumer_cpu_us_per_msg']} CPU-us/msg",
                    cpu3(e["cpu"], ("workers", "consumer", "publishers")),
                )
        return table

    def redis_text(self) -> str:
        lines = []
        for key, label in (
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
        ):
            run = self.figures.get(key)
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

    def targets_table(self, s: dict[str, Any]) -> Table:
        table = Table(title="against the targets", title_justify="left")
        for col in ("figure", "value", "target", ""):
            table.add_column(col)
        for key, (op, target) in TARGETS.items():
            value = s[key]
            label = key
            if (
                key == "match_1m_over_1k"
                and s.get("match_ratio_sizes")
                and not s["match_ratio_sizes"].startswith("1,000,000")
            ):
                label = f"{key} (measured {s['match_ratio_sizes']}, no 1M index)"
            if value != value:
                table.add_row(label, "-", f"{op} {target}", "[yellow]not measured[/yellow]")
                continue
            ok = value >= target if op == ">=" else value <= target
            table.add_row(
                label,
                f"{value:,.2f}",
                f"{op} {target:,}",
                "[green]met[/green]" if ok else "[red]missed[/red]",
            )
        return table

    def profile_text(self) -> str:
        run = self.figures.get("profile") or {}
        workers = (run.get("profile") or {}).get("workers") or []
        if not workers:
            return ""
        split = "/".join(f"{x:.0%}" for x in run.get("work_split") or [])
        lines = [
            f"py-spy of each worker (100 Hz, --idle: time blocked on a socket counts) during an extra 2-worker "
            f"run: {run['pubs_per_s']:,} pubs/s, work split {split or '?'}"
        ]
        for prof in workers:
            lines.append(
                f"  worker pid {prof['pid']}: {prof['samples']:,} samples; raw stacks in {prof['file']}"
            )
            lines.append("    self:")
            lines += [f"      {share:5.1f}%  {name}" for name, share in prof["self"][:12]]
            lines.append("    inclusive (frames present in every sample left out):")
            lines += [f"      {share:5.1f}%  {name}" for name, share in prof["inclusive"] if share < 99.5][
                :16
            ]
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    console = Console(width=max(150, Console().width))
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    bench = Bench(args, console)
    started = time.perf_counter()
    try:
        bench.run()
    finally:
        bench.stop()
    bench.figures["errors"] = bench.errors
    bench.figures["elapsed_s"] = round(time.perf_counter() - started, 1)
    summary = bench.summary()
    console.print(bench.table())
    console.print(bench.targets_table(summary))
    for text in (bench.redis_text(), bench.federation_text(), bench.profile_text(), bench.e2e_text()):
        if text:
            console.print(text, highlight=False)
    for name, error in bench.errors.items():
        console.print(f"[red]{name}: {error[:300]}[/red]")
    console.print(f"total {bench.figures['elapsed_s']:.0f} s", highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.figures, indent=2, default=str) + "\n")
    if bench.figures.get("regression_ratios"):
        ratios = bench.figures["regression_ratios"]
        console.print(
            f"16. this commit / {bench.figures.get('baseline', {}).get('commit', '?')}, pubs/s, per repeat: "
            f"{ratios}; median regression_ratio={statistics.median(ratios):.3f}",
            highlight=False,
        )
    if bench.figures.get("metrics_ratios"):
        ratios = bench.figures["metrics_ratios"]
        console.print(
            f"15. metrics on / off, pubs/s, per repeat: {ratios}; median "
            f"metrics_ratio={statistics.median(ratios):.3f}",
            highlight=False,
        )
    print(bench.final_line(summary), flush=True)
    return 1 if bench.errors else 0


if __name__ == "__main__":
    sys.exit(main())
