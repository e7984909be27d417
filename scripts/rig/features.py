"""The retained and grouped publications of both chaos runs (issue 28 rows 10 and 12), and where
the federated run puts them.

Each function takes the harness (``scripts.chaos.Harness`` or ``FederatedHarness``, passed as
``h``: its ``args``, ``history``, ``retained``, ``groups``, ``_publish``, ``_thread`` and
``_subscriber``) and the queue manager it works at, so one body serves both runs:

- ``group_publisher``: publisher ``g0``, grouped publications on ``GROUP_TOPICS`` (a group at
  random, its next sequence number), each an ordinary publication of the history too;
- ``retainer``: publisher ``r0``, retained publications on ``RETAINED_TOPICS``, each waiting for
  its result (``scripts.rig.retained``);
- ``late_subscriptions``: every ``LATE_EVERY_S`` a subscription to ``LATE_FILTER`` at that queue
  manager, consumed by a subscriber thread of the harness;
- ``federated_setup`` / ``federated_threads``: in ``--federation``, the retained publisher and the
  late subscriptions at ``EAST`` (retained publications are kept where they are published: a
  channel forwards a retained publication as an ordinary one, and the retained store of another
  queue manager never holds it), and the message groups on a shared subscription at ``WEST`` fed
  by ``g0`` at ``EAST``, so every grouped publication comes over a channel (hierarchy topics: through
  ``ROOT``).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import redis

from broker.clients.publish import Publisher
from broker.core.connection import connect
from broker.core.errors import BrokerError
from broker.topics.subscriptions import subscribe
from scripts.rig.groups import (
    CONSUMERS,
    GROUP_FAULTS,
    GROUP_FILTER,
    GROUP_LEASE_MS,
    GROUP_PUBLISHER,
    GROUP_TOPICS,
    GroupWorkload,
)
from scripts.rig.history import Publication, network_recipients

#: Topics of the retained publisher ``RETAINED_PUBLISHER`` (every publication retained); the
#: harness's filters match them, so its publications are checked as every publisher's too.
RETAINED_TOPICS = ("/retained/a", "/retained/b/c")
RETAINED_PUBLISHER = "r0"
LATE_FILTER = "/retained/#"
LATE_EVERY_S = 3.0


def group_publisher(h: Any, url: str, qm: str, resolved: dict[str, frozenset[str]]) -> None:
    """Publisher ``g0`` at ``qm`` through ``url`` (``scripts.rig.groups``): a group at random, its
    next sequence number; ``resolved``: topic -> the subscription ids of the history it must reach."""
    assert h.groups is not None
    rng = random.Random(h.args.seed * 1_000 + 900)
    client = connect(url)
    publisher = Publisher(client, qm, GROUP_PUBLISHER)
    interval = h.args.publishers / h.args.rate
    counters: dict[str, int] = {}
    number = 0
    next_at = time.monotonic()
    while not h.stop_publishing.is_set():
        number += 1
        group, seq = h.groups.next_group(rng, counters)
        topic = rng.choice(GROUP_TOPICS)
        pub = Publication(GROUP_PUBLISHER, number, f"{GROUP_PUBLISHER}.{number}", topic, resolved[topic])
        h.history.add_publication(pub)
        h.groups.log.publish(pub.msgid, group, seq, pub)
        h._publish(publisher, pub, group=group, group_seq=seq)
        next_at += interval
        ahead = next_at - time.monotonic()  # one reading: two could straddle next_at (a negative sleep)
        if ahead > 0:
            time.sleep(ahead)
        else:
            next_at -= ahead  # behind: from now on
    client.close()


def retainer(h: Any, url: str, qm: str, resolved: dict[str, frozenset[str]]) -> None:
    """Publisher ``r0`` at ``qm`` through ``url``: retained publications on ``RETAINED_TOPICS``,
    each waiting for its result (then recorded in ``h.retained``)."""
    rng = random.Random(h.args.seed * 1_000 + 999)
    client = connect(url)
    publisher = Publisher(client, qm, RETAINED_PUBLISHER)
    number = 0
    while not h.stop_publishing.is_set():
        number += 1
        topic = rng.choice(RETAINED_TOPICS)
        pub = Publication(
            RETAINED_PUBLISHER, number, f"{RETAINED_PUBLISHER}.{number}", topic, resolved[topic]
        )
        h.history.add_publication(pub)
        h._publish(publisher, pub, retain=True, wait=True)
        if pub.acked:
            h.retained.answered(topic, number, time.monotonic())
        h.stop_publishing.wait(rng.uniform(0.02, 0.2))
    client.close()


def late_subscriptions(h: Any, url: str, qm: str, direct: str | None = None) -> None:
    """Every ``LATE_EVERY_S``, a subscription to ``LATE_FILTER`` at ``qm`` through ``url`` (made again
    with the same name until it is: a second attempt attaches), then consumed by a subscriber
    thread of the harness (``direct``: the server of ``qm`` it reads, default the harness's)."""
    client = connect(url)
    k = 0
    while not h.stop_publishing.wait(LATE_EVERY_S):
        k += 1
        started = time.monotonic()
        while not h.stop_publishing.is_set():
            try:
                sub_id = subscribe(client, qm, LATE_FILTER, "late", f"l{k}").sub_id
            except (BrokerError, redis.RedisError):
                time.sleep(0.1)
                continue
            h.retained.subscribed(sub_id, started)
            extra = (qm, direct) if direct else ()
            thread = h._thread(h._subscriber, sub_id, *extra, name=f"sub-{sub_id}")
            h.threads.append(thread)
            thread.start()
            break
    client.close()


def federated_setup(h: Any) -> None:
    """``--federation``: the shared subscription ``GROUP_FILTER`` at ``WEST`` and its consumers'
    workload; the group consumer faults join the fault kinds (``--weight`` still overrides them)."""
    _, _, west = h.qms
    grouped = subscribe(h.admin, west, GROUP_FILTER, "chaos")
    # the network's 3 servers and 9 processes stall this process's threads now and then (GROUP_LEASE_MS)
    lease_ms = max(h.args.consumer_lease_ms, GROUP_LEASE_MS)
    settings = h._settings(h._url(west, cluster=False), west).model_copy(
        update={"consumer_lease_ms": lease_ms}
    )
    h.groups = GroupWorkload(grouped, settings, h.stop_consuming, h._fault)
    h.weights = {**GROUP_FAULTS, **h.weights}


def federated_threads(h: Any) -> list[threading.Thread]:
    """``--federation``: ``r0`` and the late subscriptions at ``EAST``; ``g0`` at ``EAST`` and the
    group consumers at ``WEST`` (not started)."""
    _, east, west = h.qms
    topics = (*RETAINED_TOPICS, *GROUP_TOPICS)
    resolved = {t: network_recipients(t, east, h.filters, h._edges(t)) for t in topics}
    h.origin[RETAINED_PUBLISHER] = h.origin[GROUP_PUBLISHER] = east
    url, direct = h._url(east), h._url(east, cluster=False)
    return [
        h._thread(retainer, h, url, east, resolved, name=f"pub-{RETAINED_PUBLISHER}"),
        h._thread(late_subscriptions, h, url, east, direct, name="pub-late"),
        h._thread(group_publisher, h, url, east, resolved, name=f"pub-{GROUP_PUBLISHER}"),
        *(
            h._thread(h.groups.consume, i, h._url(west, cluster=False), west, name=f"sub-grouped-{i}")
            for i in range(CONSUMERS)
        ),
    ]
