"""Preloading publications: the publishers, their interleaved schedule, the stream filled with ``Publisher.publish_many`` (properties, principals) before a pool drains it."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.models import (
    GROUP_ID,
    GROUP_SEQ,
    GROUPED_FIELD,
    delivery_time,
    encode_envelope,
    publication_fields,
)
from broker.topics.routing import RoutingTable
from scripts.bench.topology import Principals
from scripts.bench.workload import PUBLISHERS, TOPICS, BenchError, bodies, selector_props


def publisher_ids(prefix: str = "p") -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(PUBLISHERS)]


def schedule(n: int, hot: bool, chunk: int, prefix: str = "p") -> list[tuple[str, int]]:
    """The preload order: ``(publisher, how many)`` chunks, interleaved across publishers.

    Uniform: every publisher gets n/50, taken round robin ``chunk`` at a time. Hot:
    ``p00`` gets n/2 and its chunks alternate with chunks of the 49 others (round
    robin over them), so it is half of the stream all along.
    """
    ids = publisher_ids(prefix)
    if hot:
        quota = {ids[0]: n // 2}
        rest = n - n // 2
        for i, pid in enumerate(ids[1:]):
            quota[pid] = rest // (len(ids) - 1) + (1 if i < rest % (len(ids) - 1) else 0)
    else:
        quota = {pid: n // len(ids) + (1 if i < n % len(ids) else 0) for i, pid in enumerate(ids)}
    order: list[tuple[str, int]] = []
    if hot:
        others = [p for p in ids[1:]]
        k = 0
        while quota[ids[0]] > 0 or any(quota[p] for p in others):
            if quota[ids[0]] > 0:
                take = min(chunk, quota[ids[0]])
                quota[ids[0]] -= take
                order.append((ids[0], take))
            for _ in range(len(others)):
                pid = others[k % len(others)]
                k += 1
                if quota[pid] > 0:
                    take = min(chunk, quota[pid])
                    quota[pid] -= take
                    order.append((pid, take))
                    break
    else:
        while any(quota.values()):
            for pid in ids:
                if quota[pid] > 0:
                    take = min(chunk, quota[pid])
                    quota[pid] -= take
                    order.append((pid, take))
    return order


def _publish_with_props(
    pipe: Any, stream: str, pub: Publisher, prefix: str, items: list[tuple[str, bytes]], props: list[dict]
) -> str:
    """XADD ``items`` as ``Publisher.publish_many`` would (its seq, a msgid), each with its own
    properties, in one round trip; returns the last msgid. (``publish_many`` takes one set of
    properties per call.)"""
    msgid = ""
    for (topic, body), properties in zip(items, props, strict=True):
        seq = pub.next_seq
        pub.next_seq += 1
        msgid = f"{prefix}-{seq}"
        pipe.xadd(
            stream,
            publication_fields(pub.publisher_id, topic, body, msgid=msgid, seq=seq, properties=properties),
        )
    pipe.execute()
    return msgid


def preload(
    client: redis.Redis,
    qm: str,
    n: int,
    hot: bool,
    chunk: int,
    seed: int = 1,
    properties: bool = False,
    topics: Sequence[str] = TOPICS,
    prefix: str = "p",
    principals: Principals | None = None,
    retain: bool = False,
    delay_ms: int = 0,
) -> dict[str, Any]:
    """XADD ``n`` publications with ``Publisher.publish_many``, one call per chunk, interleaved;
    with ``retain``, every one retained (``retain 1``: row 23.); with ``delay_ms``, every one
    delayed by that many ms from its chunk's call (a ``delivery_time`` field: row 24.).

    Publisher ids are ``<prefix>00``..``<prefix>49`` (queue managers of one network each use their own).
    With ``principals``, each publisher id publishes as its principal user, through its ingress stream.

    With ``properties``, every publication carries its own ``selector_props`` (same topics
    and bodies as without), XADDed with the fields ``publish_many`` writes, one round trip
    per chunk; the deliveries expected after the subscriptions' selectors are counted with
    the broker's ``RoutingTable`` (loaded from the server) and ``Selector.matches``.

    Returns:
        ``{"n", "elapsed_s", "xadd_per_s", "per_publisher": {id: count}, "msgids": sample}``,
        and with ``properties`` ``expected_deliveries``, ``selector_evaluations``, ``selected_share``.
    """
    rng = random.Random(seed)
    props_rng = random.Random(seed + 1000)
    body_list = bodies()
    # no flow control: the preload runs before any worker, so there is no delay to learn
    # (and its round trips stay as they were: no GET of the flow key)
    if principals is not None and properties:
        raise BenchError("preload: properties are XADDed to the publish stream, not through ingress streams")
    pubs = {
        pid: Publisher(client, qm, pid, flow_control=False)
        if principals is None
        else Publisher(
            principals.clients[pid], qm, pid, flow_control=False, principal=principals.principal(pid)
        )
        for pid in publisher_ids(prefix)
    }
    prefixes = {pid: uuid.uuid4().hex for pid in pubs}
    counts: Counter[str] = Counter()
    msgids: list[tuple[str, str]] = []
    table: RoutingTable | None = None
    expected = evaluations = selected = 0
    published: list[tuple[str, dict[str, str | int]]] = []
    if properties:
        table = RoutingTable(qm)
        table.load(client)
    pipe = client.pipeline(transaction=False)
    stream = keys.publish_stream(qm)
    start = time.perf_counter()
    for pid, take in schedule(n, hot, chunk, prefix):
        items = [(rng.choice(topics), body_list[rng.randrange(len(body_list))]) for _ in range(take)]
        if properties:
            props = [selector_props(props_rng) for _ in range(take)]
            last = _publish_with_props(pipe, stream, pubs[pid], prefixes[pid], items, props)
        else:
            options: dict[str, Any] = {"retain": True} if retain else {}
            if delay_ms:
                options["delivery_time_ms"] = delivery_time(delay_ms)
            last = pubs[pid].publish_many(items, batch=take, **options)[-1].msgid
        counts[pid] += take
        if rng.random() < 0.02:
            msgids.append((pid, last))
        if properties:
            published += [(topic, p) for (topic, _), p in zip(items, props, strict=True)]
    elapsed = time.perf_counter() - start
    if table is not None:
        for topic, p in published:
            for sub_id in table.resolve(topic).sub_ids:
                selector = table.selectors.get(sub_id)
                if selector is None:
                    expected += 1
                else:
                    evaluations += 1
                    hit = selector.matches(p)
                    selected += hit
                    expected += hit
    out = {
        "n": n,
        "elapsed_s": round(elapsed, 3),
        "xadd_per_s": round(n / elapsed),
        "hot_share": round(counts[f"{prefix}00"] / n, 3),
        "msgids": msgids[:100],
    }
    if properties:
        out |= {
            "expected_deliveries": expected,
            "selector_evaluations": evaluations,
            "selected_share": round(selected / evaluations, 3) if evaluations else None,
        }
    return out


#: The last protocol whose envelopes do not say whether they belong to a group in their first
#: bytes (``broker_receive`` searches them for the group property): row 25's ``legacy`` run.
LEGACY_PROTOCOL = 6


def preload_queue(
    client: redis.Redis,
    queue: str,
    n: int,
    per_push: int = 1000,
    groups: int = 0,
    legacy: bool = False,
) -> float:
    """LPUSH ``n`` envelopes as a worker writes them (``encode_envelope`` of a ``parse_entry``-shaped
    header, 200-byte body, 50 publishers) into ``queue``; returns the envelopes pushed per second.
    With ``groups``, message ``i`` belongs to group ``g<i % groups>`` (``JMSXGroupID``, and its
    ``JMSXGroupSeq``, the header's ``grouped`` first: row 25.). With ``legacy``, the envelopes are
    ``LEGACY_PROTOCOL`` ones (``v`` 6, no ``grouped`` field), as written before protocol 7."""
    body_list = bodies()
    now_ms = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    envelopes: list[bytes] = []
    start = time.perf_counter()
    for i in range(n):
        body = body_list[i % len(body_list)]
        header: dict[str, Any] = {GROUPED_FIELD: True} if groups and not legacy else {}
        header |= {
            "v": LEGACY_PROTOCOL if legacy else keys.PROTOCOL_VERSION,
            "msgid": f"c{i}",
            "publisher": f"p{i % PUBLISHERS:02d}",
            "seq": i // PUBLISHERS + 1,
            "topic": TOPICS[i % len(TOPICS)],
            "entry_id": f"{now_ms}-{i}",
        }
        if groups:
            header["props"] = {GROUP_ID: f"g{i % groups}", GROUP_SEQ: i // groups + 1}
        envelopes.append(encode_envelope(header, body))
        if len(envelopes) >= per_push:
            pipe.lpush(queue, *envelopes)
            envelopes = []
            if len(pipe) >= 10:
                pipe.execute()
    if envelopes:
        pipe.lpush(queue, *envelopes)
    pipe.execute()
    return n / (time.perf_counter() - start)
