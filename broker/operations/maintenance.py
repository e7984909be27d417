"""Maintenance of a queue manager: trimming acknowledged stream entries, deleting every key.

``trim_acknowledged`` is what the scheduler's rq job runs; ``reset`` is for the
demo and the tests.
"""

from __future__ import annotations

import redis

from broker.core import keys
from broker.core.connection import translate_errors
from broker.core.stream import group_state


@translate_errors
def reset(client: redis.Redis, qm: str) -> int:
    """Delete every key of the queue manager (the demo and tests start clean); returns how many."""
    deleted = 0
    for key in client.scan_iter(match=keys.all_keys_pattern(qm), count=1000):
        deleted += client.delete(key)
    return deleted


def _next_id(entry_id: str) -> str:
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


@translate_errors
def trim_acknowledged(client: redis.Redis, qm: str) -> int:
    """Remove from the publish stream only entries every worker has acknowledged.

    An entry is safe to remove when it is older than both the oldest pending
    entry and the first entry never delivered (trimming a pending entry would
    make XCLAIM drop it: a lost publication).

    Returns:
        How many entries were removed.

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    stream = keys.publish_stream(qm)
    state = group_state(client, qm)
    if not state.exists:
        return 0
    last = state.last_delivered_id
    if last == "0-0":
        return 0
    floor = _next_id(last)
    summary = client.xpending(stream, keys.WORKER_GROUP)
    if summary["pending"]:
        oldest = summary["min"].decode() if isinstance(summary["min"], bytes) else str(summary["min"])
        floor = min(floor, oldest, key=lambda i: tuple(int(x) for x in i.split("-")))
    return int(client.xtrim(stream, minid=floor, approximate=False))
