"""Maintenance of a queue manager: trimming acknowledged stream entries, deleting every key.

``trim_acknowledged`` is what the scheduler's rq job runs; ``reset`` is for the
demo and the tests.
"""

from __future__ import annotations

import redis

from broker.core import keys
from broker.core.errors import script_error, translate_errors
from broker.core.scripts import register


@translate_errors
def reset(client: redis.Redis, qm: str) -> int:
    """Delete every key of the queue manager (the demo and tests start clean); returns how many."""
    deleted = 0
    for key in client.scan_iter(match=keys.all_keys_pattern(qm), count=1000):
        deleted += client.delete(key)
    return deleted


@translate_errors
def trim_acknowledged(client: redis.Redis, qm: str, lock: tuple[str, int] | None = None) -> int:
    """Remove from the publish stream only entries every worker has acknowledged, in one call of
    ``trim.lua``.

    An entry is safe to remove when it is older than both the oldest pending
    entry and the first entry never delivered (trimming a pending entry would
    make XCLAIM drop it: a lost publication).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        lock: ``(owner, px_ms)``: first take ``{qm}:trim_lock`` (SET NX PX) with that value and
            expiry, and trim only when it was free (the workers' housekeeping); None: no lock (the
            scheduler's job).

    Returns:
        How many entries were removed; -1 when another worker holds the lock.

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type (nothing was written).
        redis.RedisError: as redis-py raises it.
    """
    stream_keys = [keys.publish_stream(qm)]
    args: list[str | int] = [keys.WORKER_GROUP]
    if lock is not None:
        stream_keys.append(keys.trim_lock(qm))
        args += lock
    try:
        return trimmed(register(client, "trim")(keys=stream_keys, args=args))[0]
    except redis.ResponseError as exc:
        error = trim_error(exc)
        if error is exc:
            raise
        raise error from exc


def trimmed(reply: list[int]) -> tuple[int, int]:
    """``trim.lua``'s reply: ``(entries removed, or -1 when another worker holds the lock; entries
    the group has pending, which stopped the trim)``."""
    return int(reply[0]), int(reply[1])


def trim_error(exc: BaseException) -> BaseException:
    """What a refused ``trim.lua`` call raises: ``ForeignKey`` for a key of another type, else ``exc``."""
    return script_error(exc, "trim of the publish stream")
