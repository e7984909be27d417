"""One command, one server, every figure side by side: the broker against its ceiling and its peer.

Usage::

    .venv/bin/python -m scripts.bench --quick            # under a minute
    .venv/bin/python -m scripts.bench --json bench.json  # full run (N=100k, 3 repeats), about 5 minutes
    .venv/bin/python -m scripts.bench --quick --profile /tmp/prof   # + py-spy of the workers

The script starts one server (``broker.core.server.Server()``: the embedded Valkey,
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
with the broker's own admin API (``broker.subscribe``, ``broker.topics.links.link``)
once, DUMPed and RESTOREd after each flush. Every topic reaches exactly F=10
subscriber queues: one exact subscription, six through ``+``/``#`` filters
(one of which, ``+/<r>/#``, matches the topic and both of its linked topics
and must be delivered once), and two that only links reach
(``bench/r/c/j -> audit/r/c -> audit/r``). F is checked with
``broker.topics.explain.explain`` on a sample of topics before, and as
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
   ``broker.clients.consumer.Subscriber`` of one durable subscription): N envelopes
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
   administrative topic objects (``broker.topics.topic_objects.define``, after the
   restore, untimed) are bound to prefixes of the benchmark's topics --
   ``bench/r``, ``audit/r`` and ``bench/r/c`` of regions 0-8 and 92 leaf topics
   (``workload.topic_object_plan``) -- so 90% of the publications fall under an
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
   (``workload.swiftmq_subscription_plan``: ``+`` levels become ``%``
   predicates, 320 of 1,540 subscriptions; ``bench/r/#`` becomes the node
   ``bench.r``; only the 1,000 links ``bench.r.c.j -> audit.r.c``, as ``audit.r``
   receives its sub-nodes' publications; F=10 checked the same way). swiftmq/mqtt =
   pubs/s ratio. Then matching alone: per-topic ``match`` of ``TopicIndex``
   (mqtt), of the swiftmq ``HierarchyIndex`` with the same plain depth-4
   subscriptions, and of one where every 10th is a predicate (``d12_``), at the
   ``match`` sizes (``match.run_hierarchy_matching``).

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
   own principal (a ``publisher`` ACL user bound to it, ``topology.Principals``) by
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
23. **Retained publications** (``--only retained``): as 2 with 2 workers, twice side by side: no
   publication retained, and every one retained (``commit.lua`` keeps each topic's last).
24. **Delivery delay** (``--only delay``): as 2 with 2 workers, twice side by side: no
   publication delayed, and every one with a delivery time 5 ms after its XADD (due by the time
   a worker reads it: the price of the way through ``{qm}:delayed``, moved in and released
   back to the publish stream, not of a wait).
25. **Message groups** (``--only groups``): one shared subscription, its queue preloaded (untimed),
   drained by 2 consumers (threads of the bench process, ``receive_many(100)`` + ``ack_many``),
   three times side by side: no ``JMSXGroupID`` (envelopes as the workers write them: a message
   of no group is told by its first bytes), no ``JMSXGroupID`` in protocol-6 envelopes (searched
   for the group, as before protocol 7), and 10 groups; consumer-side messages/s and their
   ratios to the first (``scripts/bench/groups.py``; the server side alone:
   ``scripts.bench_receive_groups``).
26. **Topic statistics** (``--only topic_stats``): as 2 with 2 workers, twice side by side:
   ``topic_stats_max_topics = 0`` (off) and the default (on; the Python and flush costs alone:
   ``scripts.bench_topic_stats``).

Rows 9-11, 14-16 and 23-26 are ratios of two runs made side by side (the order alternating per
repeat): on this shared box compare the ratios, not the rates.

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

Layout
------
``python -m scripts.bench`` runs ``cli.main``. Each measurement is a module that registers a
``base.Measurement`` (its steps and its typed ``base.Row`` s) in ``registry.REGISTRY``, in the
table's order: ``ceiling`` (1.), ``throughput`` (2.-3.), ``latency`` (4.), ``kombu`` (5.),
``match`` (6.), ``selectors`` (7.), ``consume`` (8.), ``features`` (9.-12., 14.-16., 23., 24.,
26.), ``groups`` (25.),
``federation`` (13.), ``rabbit`` + ``rabbit_node`` (17.), ``aof`` (18.), ``memory`` (19.),
``e2e`` (20.), ``instructions`` (21., callgrind), ``publish`` (22.). Shared pieces:
``workload`` (topics, subscriptions, links, bodies), ``topology`` (the admin-API load),
``preload`` (filling the stream), ``cpu`` (CPU from /proc), ``pool`` (the worker-pool runs),
``baseline`` (an earlier commit's pool), ``summary`` (the last line and the targets).
Nothing here imports ``tests``.
"""
