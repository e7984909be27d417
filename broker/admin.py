"""Administration: topic links (seed 000), status, and explaining where a topic goes.

Links are made and removed at run time; no subscriber changes anything. Each
change is checked for cycles against every existing link (unless requested as
a backward link) and written in one MULTI with an index version bump, under
WATCH so that two administrators cannot together close a cycle.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from broker import keys
from broker.errors import InvalidLink, InvalidTopic
from broker.routing import RoutingTable, read_links
from broker.subscriptions import list_subscriptions
from broker.topics import validate_topic


def _change_links(client: redis.Redis, qm: str, source: str, target: str, add: bool, backward: bool) -> None:
    for topic in (source, target):
        try:
            validate_topic(topic)
        except InvalidTopic as exc:
            raise InvalidLink(f"cannot link {source!r} -> {target!r}: {exc}") from exc
    links_key = keys.links(qm)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(links_key)
                graph = read_links(pipe.hgetall(links_key))
                if add:
                    graph.add(source, target, backward=backward)
                else:
                    graph.remove(source, target)
                targets = graph.targets(source)
                pipe.multi()
                if targets:
                    pipe.hset(links_key, source, json.dumps(targets, sort_keys=True))
                else:
                    pipe.hdel(links_key, source)
                pipe.incr(keys.version(qm))
                pipe.execute()
                return
            except redis.WatchError:
                continue


def link(client: redis.Redis, qm: str, source: str, target: str, backward: bool = False) -> None:
    """Link ``source`` to ``target``: publications on source also reach target's subscribers.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        source: the topic string publications are made on.
        target: the topic string whose subscribers also receive them (transitively).
        backward: allow the link even if it closes a cycle (seed 000); loops
            are then cut at publish time.

    Raises:
        InvalidLink: a topic is invalid, or source equals target.
        LinkCycle: the link would close a cycle and ``backward`` is False.
    """
    _change_links(client, qm, source, target, add=True, backward=backward)


def unlink(client: redis.Redis, qm: str, source: str, target: str) -> None:
    """Remove the link from ``source`` to ``target``.

    Raises:
        InvalidLink: a topic is invalid.
        NoSuchLink: there is no such link.
    """
    _change_links(client, qm, source, target, add=False, backward=False)


def list_links(client: redis.Redis, qm: str) -> list[tuple[str, str, bool]]:
    """Every link as ``(source, target, backward)``, sorted."""
    return read_links(client.hgetall(keys.links(qm))).links()


@dataclass
class Route:
    """Where a publication on one topic goes.

    Attributes:
        topic: the topic published on.
        via: topic reached (the topic itself, then linked ones) -> subscription ids matching it.
        subscriptions: the de-duplicated subscription ids that receive one copy each.
    """

    topic: str
    via: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: list[str] = field(default_factory=list)


def explain(client: redis.Redis, qm: str, topic: str) -> Route:
    """Resolve ``topic`` the way a worker does and say through which topics each subscription matched.

    Raises:
        InvalidTopic: the topic is invalid (with a suggestion).
    """
    validate_topic(topic)
    table = RoutingTable(qm)
    table.load(client)
    route = Route(topic)
    seen: set[str] = set()
    for linked in table.links.closure(topic):
        matched = sorted(table.index.match(linked))
        route.via[linked] = matched
        seen.update(matched)
    route.subscriptions = sorted(seen)
    return route


def status(client: redis.Redis, qm: str) -> dict[str, Any]:
    """A snapshot of the queue manager.

    Returns:
        ``{"stream_length", "pending", "lag", "dead_lettered", "active_publishers",
        "version", "subscriptions": [{"id", "filter", "durable", "depth", "inflight"}],
        "links": n, "workers": [{"name", "pid", "processed", "heartbeat_age_ms"}]}``.
    """
    stream = keys.publish_stream(qm)
    pending = lag = 0
    try:
        for group in client.xinfo_groups(stream):
            if group["name"] == keys.WORKER_GROUP.encode():
                pending = int(group["pending"])
                lag = int(group.get("lag") or 0)
    except redis.ResponseError:
        pass
    subs = list_subscriptions(client, qm)
    pipe = client.pipeline(transaction=False)
    for record in subs:
        pipe.llen(keys.sub_queue(qm, record.sub_id))
        pipe.llen(keys.sub_inflight(qm, record.sub_id))
    depths = pipe.execute()
    now_ms = int(time.time() * 1000)
    workers = []
    for name, raw in sorted(client.hgetall(keys.workers(qm)).items()):
        beat = json.loads(raw)
        workers.append({"name": name.decode(), "pid": beat.get("pid"), "processed": beat.get("processed"),
                        "heartbeat_age_ms": now_ms - int(beat.get("heartbeat_ms", 0))})
    return {
        "stream_length": int(client.xlen(stream)),
        "pending": pending,
        "lag": lag,
        "dead_lettered": int(client.xlen(keys.dead_letter(qm))),
        "active_publishers": int(client.scard(keys.active_publishers(qm))),
        "version": int(client.get(keys.version(qm)) or 0),
        "subscriptions": [
            {"id": r.sub_id, "filter": r.topic_filter, "durable": r.durable,
             "depth": depths[2 * i], "inflight": depths[2 * i + 1]}
            for i, r in enumerate(subs)
        ],
        "links": len(list_links(client, qm)),
        "workers": workers,
    }


def reset(client: redis.Redis, qm: str) -> int:
    """Delete every key of the queue manager (the demo and tests start clean); returns how many."""
    deleted = 0
    for key in client.scan_iter(match=keys.all_keys_pattern(qm), count=1000):
        deleted += client.delete(key)
    return deleted




def _next_id(entry_id: str) -> str:
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


def trim_acknowledged(client: redis.Redis, qm: str) -> int:
    """Remove from the publish stream only entries every worker has acknowledged.

    An entry is safe to remove when it is older than both the oldest pending
    entry and the first entry never delivered (trimming a pending entry would
    make XCLAIM drop it: a lost publication).

    Returns:
        How many entries were removed.
    """
    stream = keys.publish_stream(qm)
    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return 0
    group = next((g for g in groups if g["name"] == keys.WORKER_GROUP.encode()), None)
    if group is None:
        return 0
    last = group["last-delivered-id"].decode()
    if last == "0-0":
        return 0
    floor = _next_id(last)
    summary = client.xpending(stream, keys.WORKER_GROUP)
    if summary["pending"]:
        oldest = summary["min"].decode()
        floor = min(floor, oldest, key=lambda i: tuple(int(x) for x in i.split("-")))
    return int(client.xtrim(stream, minid=floor, approximate=False))
