"""Topic statistics as Prometheus metrics (``broker.operations.topic_stats``), sampled from Redis at
each scrape; registered beside ``broker.operations.metrics.RedisCollector`` by its registries.

Bounded label set: the ``metrics_max_topics`` topic strings with the most publications each get a
series labelled ``topic``; every other one (and "(other topics)") is added up in one series without
the label (``topic=""``), so a publisher cycling random topic strings cannot grow what Prometheus stores.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.core import keys, wire
from broker.core.config import Settings
from broker.operations.topic_stats import read_count, routing_table

log = logging.getLogger("broker.metrics")

#: The metric families the topic statistics add (name -> (type, help)), beside
#: ``broker.operations.metrics.METRICS``; labelled by ``topic``, the ``metrics_max_topics`` topics with
#: the most publications; the rest are one series without the label (``topic=""``).
TOPIC_METRICS: dict[str, tuple[str, str]] = {
    "broker_topic_publications_total": ("counter", "Publications delivered, per topic string (the busiest)."),
    "broker_topic_deliveries_total": (
        "counter",
        "Copies put on subscriber queues, per topic string (the busiest).",
    ),
    "broker_topic_last_publication_timestamp_seconds": (
        "gauge",
        "When the last publication on a topic string was delivered, seconds since the epoch.",
    ),
    "broker_topic_subscriptions": (
        "gauge",
        "Subscriptions a publication on the topic string reaches (the busiest topic strings).",
    ),
}


class TopicStatsCollector(Collector):
    """The topic statistics as Prometheus metrics (``TOPIC_METRICS``), sampled at each scrape: the
    ``metrics_max_topics`` topic strings with the most publications labelled by ``topic``, every other
    one added up in one series without the label. A failed sample is logged; nothing is yielded.

    Args:
        client: a redis-py client of the queue manager's server.
        settings: ``qm``, ``metrics_max_topics``, ``default_maxdepth``.
    """

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.settings = settings

    def describe(self) -> list[Any]:
        return []  # sampled: nothing to check at registration

    def collect(self) -> Iterator[Any]:
        if not self.settings.topic_stats_max_topics:
            return
        try:
            families = self._families()
        except Exception as exc:  # a scrape reports what it can; the cause is logged
            log.warning("metrics: sampling topic statistics failed: %s: %s", type(exc).__name__, exc)
            return
        yield from families

    def _families(self) -> list[Any]:
        client, qm = self.client, self.settings.qm
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.topic_publications(qm))
        pipe.hgetall(keys.topic_copies(qm))
        pipe.zrange(keys.topic_last_publication(qm), 0, -1, withscores=True)
        counts, copied, scored = pipe.execute()
        times = dict(scored)
        ranked = sorted(counts, key=lambda t: (t == b"", -read_count(counts[t]), t))
        shown = [t for t in ranked[: self.settings.metrics_max_topics] if t != b""]
        table = routing_table(client, self.settings)
        names = list(TOPIC_METRICS)
        pubs, copies = (
            CounterMetricFamily(n[: -len("_total")], TOPIC_METRICS[n][1], labels=["topic"]) for n in names[:2]
        )
        last, subs = (GaugeMetricFamily(n, TOPIC_METRICS[n][1], labels=["topic"]) for n in names[2:])
        for field in shown:
            topic = wire.exact_text(field)
            pubs.add_metric([topic], read_count(counts[field]))
            copies.add_metric([topic], read_count(copied.get(field)))
            if field in times:
                last.add_metric([topic], times[field] / 1000)
            subs.add_metric([topic], len(table.resolve(topic).sub_ids))
        rest = ranked[len(shown) :]
        if rest:
            pubs.add_metric([""], sum(read_count(counts[t]) for t in rest))
            copies.add_metric([""], sum(read_count(copied.get(t)) for t in rest))
            rest_times = [times[t] for t in rest if t in times]
            if rest_times:
                last.add_metric([""], max(rest_times) / 1000)
        return [pubs, copies, last, subs]
