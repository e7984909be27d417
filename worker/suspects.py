"""Delivery counting (``max_deliveries``): which suspect a round handles alone, and its record.

An entry's delivery count is its pending entry's ``times_delivered`` (``broker.keys``,
"Delivery counting"): a worker that takes a FIFO head over from another worker, which may
have died on it, counts one (``take_over`` in ``broker/lua/lib.lua``). A worker that dies
holding several publishers' heads cannot tell which one killed it, so every head it held is
charged: a poison entry's deaths bring the healthy heads held beside it to
``SUSPECT_DELIVERIES`` together. A round holding a suspect therefore handles exactly one
suspect alone, nothing else (the other turns are held, not worked, not given up), and the
worker records that entry in ``{qm}:alone`` first: a take-over of a worker that died with
such a record charges that entry only. A poison entry so reaches ``max_deliveries`` and is
dead-lettered; a healthy suspect is committed, and no healthy entry is charged for another
publisher's poison. This is the broker's form of what message brokers do for a batch
that kills its consumer: retry the suspects one at a time.

Nothing here runs while no head held is a suspect.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from broker import keys
from broker.errors import ForeignKey
from broker.logs import publication_extra

log = logging.getLogger("broker.worker")

#: A FIFO head delivered this many times (a normal hand-over makes 2) is a suspect.
SUSPECT_DELIVERIES = 3


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def choose_alone(
    suspects: dict[str, int],
    heads: dict[str, list[str]],
    entries: Mapping[str, tuple[str, dict[bytes, bytes]]],
) -> tuple[str, str] | None:
    """The suspect a round handles alone: ``(publisher, entry id)``, or None when no head is one.

    The most delivered goes first (a poison entry, once its deaths are charged to it alone),
    then the oldest.

    Args:
        suspects: entry id -> times delivered, of the suspects the worker knows of.
        heads: ``{publisher: [entry ids]}`` of the turns it holds, FIFO heads first.
        entries: entry id -> (publisher, fields) of the entries it read (for the log line).
    """
    found = [(suspects[ids[0]], ids[0], p) for p, ids in heads.items() if ids and ids[0] in suspects]
    if not found:
        return None
    delivered, entry_id, publisher = min(found, key=lambda f: (-f[0], _stream_id(f[1])))
    log.warning(
        "entry %s delivered %d times (workers may have died on it): handling it alone",
        entry_id,
        delivered,
        extra=publication_extra(entry_id, entries.get(entry_id, (publisher, None))[1], publisher=publisher),
    )
    return publisher, entry_id


def record_alone(client: redis.Redis, qm: str, worker: str, entry_id: str) -> None:
    """Record in ``{qm}:alone`` that ``worker`` handles ``entry_id`` alone (the worker removes the
    record with the round's commit), and forget the records of workers with no entry pending
    (one that died in such a round, all of whose entries were taken over or handled since).

    Raises:
        ForeignKey: ``{qm}:alone`` holds another Redis type (nothing was written).
        redis.RedisError: as redis-py raises it.
    """
    key = keys.alone(qm)
    try:
        others = [n for n in client.hkeys(key) if n not in (worker, worker.encode())]
        pipe = client.pipeline(transaction=False)
        if others:
            for name in others:
                pipe.xpending_range(
                    keys.publish_stream(qm), keys.WORKER_GROUP, "-", "+", 1, consumername=name
                )
            stale = [n for n, pending in zip(others, pipe.execute(), strict=True) if not pending]
            if stale:
                pipe.hdel(key, *stale)
        pipe.hset(key, worker, entry_id)
        pipe.execute()
    except redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        found = client.type(key)
        raise ForeignKey(key, found.decode() if isinstance(found, bytes) else str(found), "hash") from exc
