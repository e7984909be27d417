"""Prometheus metrics: what the workers record, what is sampled from Redis at scrape time, serving ``/metrics``.

Two sources, one exposition:

- **Recorded by the workers** (``Recorder``): publications by outcome, deliveries, the
  unit-of-work and end-to-end latency histograms (seconds), dequeue batch sizes, turns held,
  taken over and given up. Counted per batch (one ``inc(n)`` per commit call, histograms
  bucketed locally and added once per batch), and only when ``metrics_port`` is set:
  otherwise a worker holds ``NULL_RECORDER``, whose methods do nothing. The pool
  (``worker.pool``) runs its children in prometheus_client's multiprocess mode
  (``PROMETHEUS_MULTIPROC_DIR``, a private directory per pool) and adds up their files
  when scraped (``pool_registry``).
- **Sampled from Redis at scrape time** (``RedisCollector``): the publish stream's
  length, pending and lag (``broker.core.stream.group_state``), the subscriptions' depth, in
  flight, consumers and redelivered messages (totals over all, series for the
  ``metrics_max_subscriptions`` deepest), deliveries withheld (``{qm}:skipped``,
  ``{qm}:slow``, counted from what this process saw), dead letters by reason code
  (``{qm}:dlq``, read on from its last entry when the process started, then from where the
  last scrape stopped: free-text reasons mapped to ``DEAD_LETTER_REASONS``), live workers, and
  each channel's lag (``{qm}:xmit:<to>``). ``broker metrics`` serves these alone.
- **The process itself**: prometheus-client's process, platform and garbage-collector
  collectors (``process_*``, ``python_info``, ``python_gc_*``), on both endpoints
  (``standard_collectors``).

Every name follows Prometheus's naming rules (https://prometheus.io/docs/practices/naming/):
it starts with ``broker_``, times are in seconds (``_seconds``, the base unit), sizes in bytes
(``_bytes``), and a counter ends in ``_total`` and counts only what this process saw, so it
does not jump when the process restarts (``METRICS`` lists them all; ``docs/operations.md``
documents them, ``docs/observability.md`` the names changed by issue 29).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from broker.clients.loads import read_loads
from broker.core import clock, keys, wire
from broker.core.config import Settings
from broker.core.unit_of_work import Outcome, UnitOfWork
from broker.operations.reasons import DEAD_LETTER_REASONS, dead_letter_reason, topic_check
from broker.operations.topic_metrics import TopicStatsCollector

log = logging.getLogger("broker.metrics")

#: Bucket upper bounds of the latency histograms, ms: the workers slot their ms in these.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000)

#: The same bounds in seconds, Prometheus's base unit: the histograms' ``le`` labels.
LATENCY_BUCKETS_SECONDS = tuple(b / 1_000 for b in LATENCY_BUCKETS_MS)

#: Names changed by issue 29 (Prometheus's base units): old -> new.
RENAMED = {
    "broker_unit_of_work_latency_ms": "broker_unit_of_work_latency_seconds",
    "broker_end_to_end_latency_ms": "broker_end_to_end_latency_seconds",
}

#: Bucket upper bounds of the dequeue batch size histogram, entries.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000)

#: ``outcome`` label values of ``broker_publications_total``: commit.lua's outcomes
#: (``skipped``: the entry was gone from the stream) and ``skipped_by_policy`` (a topic
#: object's PUB(DISABLED) refused it).
OUTCOMES = ("delivered", "duplicate", "expired", "refused", "skipped", "skipped_by_policy")

#: ``why`` label values of ``broker_turns_given_up_total``: the publisher's FIFO was drained,
#: the worker gave it up to keep to its fair share, or the worker stopped.
GIVE_UP_REASONS = ("drained", "fair_share", "stop")

#: Most dead letters one scrape reads (the rest are read by the next ones).
DEAD_LETTERS_PER_SCRAPE = 10_000

#: Subscriptions read per pipeline at a scrape.
_SUBSCRIPTION_CHUNK = 500

#: Every metric family: name -> (type, help). Counters are exposed with ``_total``,
#: histograms with ``_bucket``, ``_count`` and ``_sum``.
METRICS: dict[str, tuple[str, str]] = {
    # recorded by the workers
    "broker_publications_total": ("counter", "Publications handled by a unit of work, by outcome."),
    "broker_deliveries_total": (
        "counter",
        "Copies put on subscriber queues (a publication to 3 subscriptions: 3).",
    ),
    "broker_unit_of_work_latency_seconds": (
        "histogram",
        "Per publication: from the worker building its unit of work to the commit applied, seconds.",
    ),
    "broker_end_to_end_latency_seconds": (
        "histogram",
        "Per publication: from its arrival in the publish stream (entry id) to its unit of work committed, seconds.",
    ),
    "broker_dequeue_batch_entries": ("histogram", "Entries read by one dequeue that read any."),
    "broker_turns_held": ("gauge", "Publishers' turns the workers hold."),
    "broker_turns_taken_over_total": (
        "counter",
        "Turns taken by the orphan sweep (given up or lost by another worker).",
    ),
    "broker_entries_taken_over_total": (
        "counter",
        "FIFO heads claimed from another worker's pending entries (XCLAIM).",
    ),
    "broker_turns_given_up_total": ("counter", "Turns given up, by why: drained, fair_share, stop."),
    "broker_subscriptions_disconnected_total": (
        "counter",
        "Subscriptions removed by a slow-subscriber condition.",
    ),
    # sampled from Redis at scrape time
    "broker_stream_length": ("gauge", "Entries in the publish stream."),
    "broker_stream_pending": ("gauge", "Entries read by a worker and not yet acknowledged."),
    "broker_stream_lag": ("gauge", "Entries not yet read by any worker."),
    "broker_subscriptions": ("gauge", "Subscriptions."),
    "broker_subscription_depth": (
        "gauge",
        "Messages waiting in a subscription (every band); the deepest ones.",
    ),
    "broker_subscription_in_flight": (
        "gauge",
        "Messages taken by consumers, not acknowledged; the deepest ones.",
    ),
    "broker_subscription_consumers": ("gauge", "Consumers with a live lease; the deepest subscriptions."),
    "broker_subscription_redelivered": (
        "gauge",
        "Messages given back at least once, not yet acknowledged; the deepest ones.",
    ),
    "broker_subscriptions_depth": ("gauge", "Messages waiting in every subscription."),
    "broker_subscriptions_in_flight": ("gauge", "Messages in flight in every subscription."),
    "broker_subscriptions_consumers": ("gauge", "Consumers with a live lease, every subscription."),
    "broker_redelivered_messages": (
        "gauge",
        "Messages given back at least once, not yet acknowledged, every subscription.",
    ),
    "broker_deliveries_withheld_total": (
        "counter",
        "Deliveries left out since this process started, by reason: maxdepth (queue full), slow_subscriber.",
    ),
    "broker_dead_letters_total": (
        "counter",
        "Dead letters written to the dead-letter stream since this process started, by reason.",
    ),
    "broker_dead_letter_stream_length": ("gauge", "Entries in the dead-letter stream (capped)."),
    "broker_poison_messages": (
        "gauge",
        "Poison messages kept in the subscriptions' own poison streams (expired, redelivered too often, malformed).",
    ),
    "broker_workers": ("gauge", "Workers with a heartbeat."),
    "broker_channel_lag": (
        "gauge",
        "Entries in a channel's transmission stream not yet moved to the receiver, by peer.",
    ),
    "broker_sample_errors_total": ("counter", "Scrapes whose Redis sampling failed (logged)."),
}


def _family(name: str) -> str:
    """The name prometheus_client is given: a counter's without ``_total``."""
    return name[: -len("_total")] if METRICS[name][0] == "counter" else name


class _Batched:
    """A histogram observed many times at once: bucket locally, then one ``inc`` per bucket used.

    ``Histogram.observe`` walks the buckets and writes the sum for every value; this walks
    them once per batch. It writes the histogram's own values (``_buckets``, ``_sum``), so the
    exposition (and multiprocess mode) are prometheus_client's own.

    Args:
        histogram: the histogram written to.
        bounds: its bucket bounds in the unit the values are given in (ms for the latencies).
        scale: what one unit of the values is in the histogram's unit (0.001: ms given, seconds
            exposed); applied once per batch, to the sum.
    """

    __slots__ = ("_bounds", "_buckets", "_scale", "_sum")

    def __init__(self, histogram: Histogram, bounds: Sequence[float], scale: float = 1.0) -> None:
        self._bounds = [float(b) for b in bounds]
        self._buckets = histogram._buckets  # one value per bound, then +Inf
        self._sum = histogram._sum
        self._scale = scale

    def add(self, counts: list[int], total: float) -> None:
        """Add ``counts[i]`` observations to bucket ``i`` and ``total`` (in the values' unit) to the sum."""
        for i, n in enumerate(counts):
            if n:
                self._buckets[i].inc(n)
        self._sum.inc(total * self._scale)

    def slot(self, value: float) -> int:
        """The bucket index of ``value``."""
        return bisect_left(self._bounds, value)

    def observe(self, value: float, times: int = 1) -> None:
        """``value`` (in the values' unit) observed ``times`` times."""
        self._buckets[bisect_left(self._bounds, value)].inc(times)
        self._sum.inc(value * times * self._scale)


class NullRecorder:
    """The recorder of a worker without metrics: every method does nothing."""

    enabled = False

    def dequeued(self, entries: int) -> None:
        """A dequeue read ``entries`` entries."""

    def committed(
        self,
        decoded: Iterable[tuple[UnitOfWork, Outcome, int, bool]],
        give_up: tuple[str, ...],
        started_ms: int,
        committed_ms: int,
    ) -> None:
        """A batch of units of work was committed (``decode_outcomes`` of its reply)."""

    def turns(self, held: int, taken_over: int = 0, entries_taken_over: int = 0) -> None:
        """The worker holds ``held`` turns; it took ``taken_over`` by the sweep and claimed
        ``entries_taken_over`` FIFO heads since the last call."""

    def stopped(self, given_up: int) -> None:
        """The worker stopped, giving up ``given_up`` turns."""

    def disconnected(self) -> None:
        """A slow-subscriber condition removed a subscription."""


NULL_RECORDER = NullRecorder()


class Recorder(NullRecorder):
    """What one worker process records (in multiprocess mode: in its own files).

    Args:
        registry: where its metrics are registered (a fresh one by default: in a pool the
            supervisor reads the children's files instead).
    """

    enabled = True

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry

        def doc(name: str) -> str:
            return METRICS[name][1]

        publications = Counter(
            _family("broker_publications_total"), doc("broker_publications_total"), ["outcome"], registry=r
        )
        self._outcome = {o: publications.labels(o) for o in OUTCOMES}
        self._deliveries = Counter(
            _family("broker_deliveries_total"), doc("broker_deliveries_total"), registry=r
        )
        uow = Histogram(
            "broker_unit_of_work_latency_seconds",
            doc("broker_unit_of_work_latency_seconds"),
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        e2e = Histogram(
            "broker_end_to_end_latency_seconds",
            doc("broker_end_to_end_latency_seconds"),
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        batch = Histogram(
            "broker_dequeue_batch_entries",
            doc("broker_dequeue_batch_entries"),
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        # the workers measure ms: slotted against the ms bounds, summed in seconds
        self._uow = _Batched(uow, LATENCY_BUCKETS_MS, scale=0.001)
        self._e2e = _Batched(e2e, LATENCY_BUCKETS_MS, scale=0.001)
        self._batch = _Batched(batch, BATCH_BUCKETS)
        self._held = Gauge(
            "broker_turns_held", doc("broker_turns_held"), registry=r, multiprocess_mode="livesum"
        )
        self._taken = Counter(
            _family("broker_turns_taken_over_total"), doc("broker_turns_taken_over_total"), registry=r
        )
        self._claimed = Counter(
            _family("broker_entries_taken_over_total"), doc("broker_entries_taken_over_total"), registry=r
        )
        given_up = Counter(
            _family("broker_turns_given_up_total"), doc("broker_turns_given_up_total"), ["why"], registry=r
        )
        self._given_up = {w: given_up.labels(w) for w in GIVE_UP_REASONS}
        self._disconnected = Counter(
            _family("broker_subscriptions_disconnected_total"),
            doc("broker_subscriptions_disconnected_total"),
            registry=r,
        )
        self._last_held = -1

    def dequeued(self, entries: int) -> None:
        if entries > 0:
            self._batch.observe(entries)

    def committed(
        self,
        decoded: Iterable[tuple[UnitOfWork, Outcome, int, bool]],
        give_up: tuple[str, ...],
        started_ms: int,
        committed_ms: int,
    ) -> None:
        counts: dict[Outcome, int] = {}
        policy = 0
        e2e = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        e2e_total = 0
        deliveries = drained = fair = 0
        bounds = self._e2e._bounds
        fenced, retry = Outcome.FENCED, Outcome.RETRY
        for unit, outcome, subscriptions, released in decoded:
            if outcome is fenced or outcome is retry:  # retry: counted when decided again
                continue
            if unit.policy:
                policy += 1
            else:
                counts[outcome] = counts.get(outcome, 0) + 1
            deliveries += subscriptions
            # the entry id's ms: when the publication entered the publish stream (the server's clock)
            waited = committed_ms - int(unit.entry_id.partition("-")[0] or committed_ms)
            if waited < 0:
                waited = 0
            e2e[bisect_left(bounds, waited)] += 1
            e2e_total += waited
            if released:
                if unit.publisher in give_up:
                    fair += 1
                else:
                    drained += 1
        done = policy
        if policy:
            self._outcome["skipped_by_policy"].inc(policy)
        for outcome, n in counts.items():
            self._outcome[outcome.value].inc(n)
            done += n
        if not done:
            return
        if deliveries:
            self._deliveries.inc(deliveries)
        self._e2e.add(e2e, e2e_total)
        self._uow.observe(max(committed_ms - started_ms, 0), done)
        if drained:
            self._given_up["drained"].inc(drained)
        if fair:
            self._given_up["fair_share"].inc(fair)

    def turns(self, held: int, taken_over: int = 0, entries_taken_over: int = 0) -> None:
        if held != self._last_held:
            self._held.set(held)
            self._last_held = held
        if taken_over:
            self._taken.inc(taken_over)
        if entries_taken_over:
            self._claimed.inc(entries_taken_over)

    def stopped(self, given_up: int) -> None:
        if given_up:
            self._given_up["stop"].inc(given_up)
        self._held.set(0)
        self._last_held = 0

    def disconnected(self) -> None:
        self._disconnected.inc()


def recorder(settings: Settings) -> NullRecorder:
    """A ``Recorder`` when ``settings.metrics_port`` is set, else ``NULL_RECORDER`` (no cost)."""
    return Recorder() if settings.metrics_port else NULL_RECORDER


# --- sampled from Redis at scrape time ------------------------------------------------------------


def _int(raw: Any) -> int:
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class _SubscriptionSample:
    sub_id: str
    depth: int = 0
    in_flight: int = 0
    consumers: int = 0
    redelivered: int = 0


class RedisCollector(Collector):
    """Samples a queue manager's state in Redis at each scrape (a prometheus_client collector).

    A failed sample (Redis down, a foreign key) is logged and counted in
    ``broker_sample_errors_total``; the metrics it could read are still given.

    Its counters count what this process saw: dead letters written after the dead-letter
    stream's last entry at its creation (or, when Redis could not be read then, at its first
    scrape), and the growth of the withheld-delivery counts in Redis from the first sample on,
    so a restart does not make them jump.

    Args:
        client: a redis-py client of the queue manager's server.
        settings: ``qm``, ``metrics_max_subscriptions``, ``redis_url`` and ``tls`` (channel peers).
        clock_ms: ms since the epoch (consumers' leases), injectable.
    """

    def __init__(self, client: redis.Redis, settings: Settings, clock_ms: Any = None) -> None:
        self.client = client
        self.settings = settings
        self.qm = settings.qm
        self.clock_ms = clock_ms or clock.now_ms
        self._lock = threading.Lock()
        self._dlq_last: str | None = None  # None: not read yet (counting starts after it)
        self._dead_letters = dict.fromkeys(DEAD_LETTER_REASONS, 0)
        self._withheld_seen: dict[tuple[str, bytes], int] | None = None  # None: no sample yet
        self._withheld_counts = {"maxdepth": 0, "slow_subscriber": 0}
        self._errors = 0
        try:  # where counting starts: now, when Redis answers
            self._dlq_last = self._dead_letters_end()
            self._withheld_sample()
        except redis.RedisError:
            pass  # the first scrape takes them

    def _dead_letters_end(self) -> str:
        """The id of the dead-letter stream's last entry, ``0-0`` when it has none.

        Raises:
            redis.RedisError: Redis cannot be read, or the key is not a stream.
        """
        last = self.client.xrevrange(keys.dead_letter(self.qm), "+", "-", count=1)
        return wire.lenient_text(last[0][0]) if last else "0-0"

    def describe(self) -> list[Any]:
        return []  # sampled: nothing to check at registration

    def collect(self) -> Iterator[Any]:
        with self._lock:  # two scrapes at once would read the dead letters twice
            yield from self._collect()

    def _collect(self) -> Iterator[Any]:
        steps = (self._stream, self._subscriptions, self._withheld, self._dead_letter_stream, self._channels)
        for step in steps:
            try:
                yield from step()
            except Exception as exc:  # a scrape reports what it can; the cause is logged
                self._errors += 1
                log.warning(
                    "metrics: sampling %s failed: %s: %s", step.__name__.strip("_"), type(exc).__name__, exc
                )
        yield CounterMetricFamily(
            _family("broker_sample_errors_total"),
            METRICS["broker_sample_errors_total"][1],
            value=self._errors,
        )

    @staticmethod
    def _gauge(name: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, METRICS[name][1], value=value)

    def _stream(self) -> Iterator[Any]:
        from broker.core.stream import group_state

        state = group_state(self.client, self.qm)
        yield self._gauge("broker_stream_length", state.length)
        yield self._gauge("broker_stream_pending", state.pending)
        if state.lag is not None:
            yield self._gauge("broker_stream_lag", state.lag)
        yield self._gauge("broker_workers", int(self.client.hlen(keys.workers(self.qm))))

    def _subscriptions(self) -> Iterator[Any]:
        """Every subscription's depth (every band), live consumers, in flight and redelivered, pipelined."""
        qm = self.qm
        ids = sorted(wire.lenient_text(k) for k in self.client.hkeys(keys.subscriptions(qm)))
        now = self.clock_ms()
        samples: list[_SubscriptionSample] = []
        poison = 0
        for start in range(0, len(ids), _SUBSCRIPTION_CHUNK):
            chunk = ids[start : start + _SUBSCRIPTION_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for sub_id in chunk:
                pipe.xlen(keys.sub_poison(qm, sub_id))
            poison += sum(n for n in pipe.execute(raise_on_error=False) if isinstance(n, int))  # foreign: 0
            samples.extend(
                _SubscriptionSample(
                    reading.sub_id,
                    depth=reading.depth or 0,
                    in_flight=reading.in_flight or 0,
                    consumers=reading.consumers or 0,
                    redelivered=reading.redelivered or 0,
                )
                for reading in read_loads(self.client, qm, chunk, now, redelivered=True)  # a foreign key: 0
            )
        yield self._gauge("broker_subscriptions", len(samples))
        yield self._gauge("broker_subscriptions_depth", sum(s.depth for s in samples))
        yield self._gauge("broker_subscriptions_in_flight", sum(s.in_flight for s in samples))
        yield self._gauge("broker_subscriptions_consumers", sum(s.consumers for s in samples))
        yield self._gauge("broker_redelivered_messages", sum(s.redelivered for s in samples))
        yield self._gauge("broker_poison_messages", poison)
        deepest = sorted(samples, key=lambda s: (-s.depth, s.sub_id))[
            : self.settings.metrics_max_subscriptions
        ]
        families = {
            name: GaugeMetricFamily(name, METRICS[name][1], labels=["subscription"])
            for name in (
                "broker_subscription_depth",
                "broker_subscription_in_flight",
                "broker_subscription_consumers",
                "broker_subscription_redelivered",
            )
        }
        for s in deepest:
            families["broker_subscription_depth"].add_metric([s.sub_id], s.depth)
            families["broker_subscription_in_flight"].add_metric([s.sub_id], s.in_flight)
            families["broker_subscription_consumers"].add_metric([s.sub_id], s.consumers)
            families["broker_subscription_redelivered"].add_metric([s.sub_id], s.redelivered)
        yield from families.values()

    def _withheld_sample(self) -> None:
        """Add to the withheld counts what ``{qm}:skipped`` (both reasons) and ``{qm}:slow`` (the
        slow-subscriber ones) grew by since the last sample, field by field (a subscription's).

        The first sample only sets where counting starts; a field seen for the first time later
        counts whole (it was written since). A field that went down (``broker reset``, a removed
        subscription made again) counts from its new value.
        """
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(keys.skipped(self.qm))
        pipe.hgetall(keys.slow(self.qm))
        skipped, slow = pipe.execute()
        now = {("skipped", f): _int(v) for f, v in skipped.items()}
        now.update({("slow", f): _int(v) for f, v in slow.items()})
        seen = self._withheld_seen
        if seen is not None:
            grown = {"skipped": 0, "slow": 0}
            for key, value in now.items():
                before = seen.get(key, 0)
                if value > before:
                    grown[key[0]] += value - before
            self._withheld_counts["slow_subscriber"] += grown["slow"]
            self._withheld_counts["maxdepth"] += max(grown["skipped"] - grown["slow"], 0)
        self._withheld_seen = now

    def _withheld(self) -> Iterator[Any]:
        """Deliveries withheld since this process started, by reason (``_withheld_sample``)."""
        self._withheld_sample()
        family = CounterMetricFamily(
            _family("broker_deliveries_withheld_total"),
            METRICS["broker_deliveries_withheld_total"][1],
            labels=["reason"],
        )
        for reason, n in self._withheld_counts.items():
            family.add_metric([reason], n)
        yield family

    def _dead_letter_stream(self) -> Iterator[Any]:
        """Dead letters by reason: the stream read on from the last scrape's last entry (the
        first scrape, when the collector could not read it at its creation, counts none)."""
        dlq = keys.dead_letter(self.qm)
        length = int(self.client.xlen(dlq))
        if self._dlq_last is None:
            self._dlq_last = self._dead_letters_end()
        valid = None
        read = 0
        while read < DEAD_LETTERS_PER_SCRAPE:
            batch = self.client.xrange(dlq, f"({self._dlq_last}", "+", count=1_000)
            if not batch:
                break
            for entry_id, raw_fields in batch:
                fields = raw_fields or {}
                reason = wire.lenient_text(fields.get(b"dlq.reason", b""))
                topic_raw = fields.get(b"topic")
                topic = None if topic_raw is None else wire.lenient_text(topic_raw)
                if valid is None and topic is not None:
                    valid = topic_check(self.client, self.qm)
                self._dead_letters[dead_letter_reason(reason, topic, valid)] += 1
                self._dlq_last = wire.lenient_text(entry_id)
            read += len(batch)
        family = CounterMetricFamily(
            _family("broker_dead_letters_total"), METRICS["broker_dead_letters_total"][1], labels=["reason"]
        )
        for code, n in self._dead_letters.items():
            family.add_metric([code], n)
        yield family
        yield self._gauge("broker_dead_letter_stream_length", length)

    def _channels(self) -> Iterator[Any]:
        """Each channel's lag, as its sender sees it: entries added to the transmission stream
        minus those filed, dropped as already filed or dead-lettered (``broker.network.mover.Mover``)."""
        from broker.network.channel import read_network
        from broker.topics.topology import Topology

        network = read_network(self.client, self.qm)
        if network is None:
            return
        peers = sorted(Topology(network).neighbours.get(self.qm, ()))
        family = GaugeMetricFamily("broker_channel_lag", METRICS["broker_channel_lag"][1], labels=["peer"])
        for to in peers:
            state = {
                wire.lenient_text(k): v
                for k, v in self.client.hgetall(keys.channel_state(self.qm, to)).items()
            }
            try:
                info: dict[Any, Any] = self.client.xinfo_stream(keys.transmission(self.qm, to))
                added = _int(info.get("entries-added", info.get(b"entries-added", 0)))
            except redis.ResponseError:
                added = 0  # no transmission stream yet
            done = sum(_int(state.get(k)) for k in ("moved", "dropped_as_filed", "dead_lettered"))
            family.add_metric([to], max(added - done, 0))
        yield family


# --- serving ----------------------------------------------------------------------------------------


def standard_collectors(registry: CollectorRegistry) -> CollectorRegistry:
    """Register prometheus-client's default collectors of the serving process in ``registry``:
    ``ProcessCollector`` (``process_cpu_seconds_total``, ``process_resident_memory_bytes``, open
    file descriptors, start time; Linux only), ``PlatformCollector`` (``python_info``) and
    ``GCCollector`` (``python_gc_*``). Returns ``registry``."""
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def sampled_registry(client: redis.Redis, settings: Settings) -> CollectorRegistry:
    """A registry holding the Redis-sampled metrics and the process's own (``broker metrics``)."""
    registry = standard_collectors(CollectorRegistry())
    registry.register(RedisCollector(client, settings))
    registry.register(TopicStatsCollector(client, settings))  # broker.operations.topic_metrics
    return registry


class _StartedFilesCollector(MultiProcessCollector):
    """prometheus_client's multiprocess collector, leaving out the files a worker process is still
    creating: a scrape at that moment read an empty file (``struct.error``) and answered 500."""

    def collect(self) -> Any:
        files = [str(f) for f in Path(self._path).glob("*.db") if _started(f)]
        return self.merge(files, accumulate=True)


def _started(path: Path) -> bool:
    """Whether a multiprocess file holds its header (8 bytes) yet; False when it is gone too."""
    try:
        return path.stat().st_size >= 8
    except OSError:
        return False


def pool_registry(path: str, client: redis.Redis, settings: Settings) -> CollectorRegistry:
    """A registry adding up the worker processes' files in ``path`` (multiprocess mode), the
    Redis-sampled metrics and the supervising process's own (``standard_collectors``)."""
    registry = standard_collectors(CollectorRegistry())
    _StartedFilesCollector(registry, path=path)
    registry.register(RedisCollector(client, settings))
    registry.register(TopicStatsCollector(client, settings))  # broker.operations.topic_metrics
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The registry's metrics in the Prometheus text format."""
    return generate_latest(registry).decode()


class MetricsServer:
    """``/metrics`` over HTTP, on a daemon thread (prometheus_client's own WSGI server).

    Args:
        registry: what to serve.
        port: TCP port.
        host: address to bind to.

    Raises:
        MetricsUnavailable: the port is taken (or the address cannot be bound).
    """

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        from broker.core.errors import MetricsUnavailable

        self.port = port
        self.host = host
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {host}:{port}: {exc}") from exc

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class MultiprocessDir:
    """A pool's private ``PROMETHEUS_MULTIPROC_DIR``: made empty, exported to the children it
    spawns, cleaned after dead children, removed at the end."""

    ENV = "PROMETHEUS_MULTIPROC_DIR"

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="broker-metrics-")

    def wipe(self) -> None:
        """Remove every file in it (a new pool counts from zero)."""
        for entry in Path(self.path).iterdir():
            entry.unlink()

    def exported(self) -> _Exported:
        """A context in which ``os.environ`` names this directory (spawned children inherit it)."""
        return _Exported(self.ENV, self.path)

    def process_dead(self, pid: int | None) -> None:
        """A child died: drop its live gauges (``turns_held``), keep its counters."""
        from prometheus_client import multiprocess

        if pid is not None:
            multiprocess.mark_process_dead(pid, self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class _Exported:
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value
        self._old: str | None = None

    def __enter__(self) -> None:
        self._old = os.environ.get(self.name)
        os.environ[self.name] = self.value

    def __exit__(self, *exc: object) -> None:
        if self._old is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = self._old
