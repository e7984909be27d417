"""What the console's pages show, read with the broker's own readers (``broker.operations.status`` and others).

Every function takes the session's Redis client (the logged-in user's rights) and
returns plain dicts and lists for the templates. Rates come from two readings of
monotonic counters kept between refreshes (``RateMeter``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.core.stream import group_state
from broker.network.network_admin import NetworkStatus, network_status
from broker.operations.status import TopicNode, status, topic_status, topic_tree
from broker.operations.topic_stats import topic_statistics
from broker.topics.subscriptions import read_subscriptions
from broker.topics.topic_objects import BASE, read_tree

#: Readings older than this are forgotten by ``RateMeter``, ms.
RATE_WINDOW_MS = 10_000

#: Two readings closer than this give no new rate (the last one is kept), ms.
MIN_RATE_SPAN_MS = 500


@dataclass(frozen=True)
class Counters:
    """Monotonic counters of one queue manager at one moment.

    Attributes:
        at_ms: when they were read, ms (the meter's clock).
        published: entries ever added to the publish stream (``XINFO STREAM`` ``entries-added``).
        handled: entries the workers read and acknowledged (a unit of work done: delivered,
            refused, duplicate or expired).
    """

    at_ms: float
    published: int
    handled: int


def read_counters(client: redis.Redis, qm: str, at_ms: float) -> Counters:
    """The publish stream's counters now (0 and 0 when it does not exist yet).

    Raises:
        ForeignKey: the publish stream holds another Redis type.
    """
    state = group_state(client, qm)
    added = 0
    if state.exists or state.length:
        info: dict[Any, Any] = client.xinfo_stream(keys.publish_stream(qm))
        added = int(info.get("entries-added", info.get(b"entries-added", state.length)) or 0)
    return Counters(at_ms, added, state.acknowledged if state.exists else 0)


class RateMeter:
    """Publications per second in and out, from readings of ``Counters`` taken at each refresh.

    The rate is the change over the readings of the last ``RATE_WINDOW_MS`` (at least
    ``MIN_RATE_SPAN_MS`` apart); several browsers refreshing at once share one meter.

    Args:
        clock_ms: a monotonic clock in ms (injectable for tests).
    """

    def __init__(self, clock_ms: Callable[[], float] | None = None) -> None:
        self.clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._readings: deque[Counters] = deque()
        self._lock = threading.Lock()
        self._last: dict[str, float | None] = {"published_per_s": None, "handled_per_s": None}

    def add(self, reading: Counters) -> dict[str, float | None]:
        """Record ``reading``; returns ``{"published_per_s", "handled_per_s"}`` (None until two readings)."""
        with self._lock:
            readings = self._readings
            if readings and (
                reading.published < readings[-1].published or reading.handled < readings[-1].handled
            ):
                readings.clear()  # the stream was deleted or the queue manager reset: start again
            readings.append(reading)
            while len(readings) > 2 and reading.at_ms - readings[0].at_ms > RATE_WINDOW_MS:
                readings.popleft()
            first = readings[0]
            span_ms = reading.at_ms - first.at_ms
            if span_ms >= MIN_RATE_SPAN_MS:
                self._last = {
                    "published_per_s": (reading.published - first.published) * 1000 / span_ms,
                    "handled_per_s": (reading.handled - first.handled) * 1000 / span_ms,
                }
            return dict(self._last)


def memory(client: redis.Redis) -> dict[str, Any]:
    """``INFO memory``: ``{"used_bytes", "max_bytes" (0: no limit), "used_human", "max_human", "fraction"}``."""
    info: dict[str, Any] = client.info("memory")
    used = int(info.get("used_memory", 0))
    maximum = int(info.get("maxmemory", 0))
    return {
        "used_bytes": used,
        "max_bytes": maximum,
        "used_human": human_bytes(used),
        "max_human": human_bytes(maximum) if maximum else "no limit",
        "fraction": used / maximum if maximum else None,
    }


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop returns


def overview(client: redis.Redis, qm: str, meter: RateMeter) -> dict[str, Any]:
    """The overview page: the status snapshot's totals, rates, workers and memory.

    Returns:
        ``broker.operations.status.status`` (``dataclasses.asdict``) plus ``"rates"`` (``RateMeter.add``), ``"memory"`` (``memory``),
        ``"totals"`` ``{"subscriptions", "depth", "inflight", "consumers"}`` (messages) and
        ``"workers_alive"``.
    """
    found = status(client, qm, keyspace=False)  # refreshed live: no SCAN of the whole database
    snap: dict[str, Any] = asdict(found)
    snap["rates"] = meter.add(read_counters(client, qm, meter.clock_ms()))
    snap["memory"] = memory(client)
    subs = found.subscriptions
    snap["totals"] = {
        "subscriptions": len(subs),
        "depth": sum(s.depth or 0 for s in subs),
        "inflight": sum(s.inflight or 0 for s in subs),
        "consumers": sum(s.consumers or 0 for s in subs),
    }
    snap["workers_alive"] = sum(1 for w in found.workers if w.state == "alive")
    return snap


def subscriptions(client: redis.Redis, qm: str, search: str = "") -> dict[str, Any]:
    """The subscriptions page: each subscription and its subscriber queue.

    Args:
        search: keep the rows whose id, filter or selector contains this text (case-insensitive).

    Returns:
        ``{"rows": [{"id", "filter", "selector", "no_local", "durable", "mode", "consumers",
        "depth", "inflight", "skipped", "slow", "expired"}], "total": n, "problems": [str]}``;
        the figures are messages, None for a queue key of another Redis type.
    """
    snap = status(client, qm, keyspace=False)  # its rows and their queues' problems only
    records, _ = read_subscriptions(client, qm)
    by_id = {r.sub_id: r for r in records}
    rows = []
    needle = search.strip().lower()
    for sub in snap.subscriptions:
        record = by_id.get(sub.id)
        row = dict(
            asdict(sub),
            selector=record.selector if record else "",
            no_local=record.no_local if record else False,
        )
        if needle and not any(needle in str(row[k]).lower() for k in ("id", "filter", "selector")):
            continue
        rows.append(row)
    return {"rows": rows, "total": len(snap.subscriptions), "problems": snap.problems}


def topics(client: redis.Redis, qm: str) -> dict[str, Any]:
    """The topic tree page: one row per node, depth first.

    Returns:
        ``{"rows": [{"path", "level", "depth", "topic_object", "subscriptions", "links_to",
        "attributes": [(name, value, source)]}], "separator", "problems": [str]}``; ``attributes``
        are the effective ones of a node that has a topic object (with the object each comes from).
    """
    root = topic_tree(client, qm)
    tree = read_tree(client, qm)
    sep = tree.separator
    rows: list[dict[str, Any]] = []

    def walk(node: TopicNode, path: str, level: str, depth: int) -> None:
        attributes: list[tuple[str, Any, str]] = []
        if node.topic_object:
            effective = tree.effective(path)
            attributes = [(n, effective.values[n], effective.source[n]) for n in sorted(effective.values)]
        rows.append(
            {
                "path": path if depth else "",
                "level": level,
                "depth": depth,
                "topic_object": node.topic_object,
                "subscriptions": node.subscriptions,
                "links_to": sorted(node.links_to),
                "attributes": attributes,
            }
        )
        for name in sorted(node.children):
            child_path = name if depth == 0 else f"{path}{sep}{name}"
            walk(node.children[name], child_path, name, depth + 1)

    walk(root, "", BASE, 0)
    return {"rows": rows, "separator": sep, "problems": [str(p) for p in tree.problems]}


def topic(client: redis.Redis, settings: Settings, topic_string: str) -> dict[str, Any]:
    """One topic string's status (``broker.operations.status.topic_status``) and its statistics
    (``broker.operations.topic_stats.topic_statistics``; None when turned off) as a dict.

    Raises:
        InvalidTopic: the topic string is invalid.
    """
    found = topic_status(client, settings.qm, topic_string, default_maxdepth=settings.default_maxdepth)
    return {
        "topic": found.topic,
        "attributes": found.attributes,
        "via": found.via,
        "subscriptions": found.subscriptions,
        "publishers": found.publishers,
        "last_publication_ms": found.last_publication_ms,
        "scanned": found.scanned,
        "blocked": found.blocked,
        "blocked_by": found.blocked_by,
        # IBM MQ DISPLAY TPSTATUS's SUBCOUNT, NUMPUBS, LPUBDATE/LPUBTIME (broker.operations.topic_stats)
        "statistics": (
            asdict(topic_statistics(client, settings, topic_string))
            if settings.topic_stats_max_topics
            else None
        ),
    }


def workers_and_channels(client: redis.Redis, settings: Settings, url: str) -> dict[str, Any]:
    """The workers page: worker heartbeats and, in a network, queue managers and channels.

    Args:
        url: the Redis URL the session's client uses (a peer without its own URL in the
            network record is reached at it).

    Returns:
        ``{"workers": [...] (``status``), "network": ``network_status`` or None, "problems": [str]}``.
    """
    snap = status(client, settings.qm)
    try:
        found: NetworkStatus | None = network_status(client, settings.qm, url, settings.tls)
    except redis.exceptions.NoPermissionError as exc:
        found = None
        snap.problems.append(f"network: {exc}")
    network = found.as_dict() if found is not None and found.network is not None else None
    return {"workers": [asdict(w) for w in snap.workers], "network": network, "problems": snap.problems}
