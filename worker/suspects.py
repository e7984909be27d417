"""Delivery counting (``max_deliveries``): which suspect a round handles alone, and its record.

An entry's delivery count is its pending entry's ``times_delivered`` (``broker.core.keys``,
"Delivery counting"): a worker that takes a FIFO head over from another worker, which may
have died on it, counts one (``take_over`` in ``broker/lua/lib.lua``). A worker that dies
holding several publishers' heads cannot tell which one killed it, so every head it held is
charged: a poison entry's deaths bring the healthy heads held beside it to
``SUSPECT_DELIVERIES`` together. A round holding a suspect therefore handles exactly one
suspect alone, nothing else (the other turns are held, not worked, not given up), and the
worker records that entry in ``{qm}:alone`` first: a take-over of a worker that died with
such a record charges that entry only. A poison entry so reaches ``max_deliveries`` and is
dead-lettered; a healthy suspect is committed, and no healthy entry is charged for another
publisher's poison. A dead worker's batch also held the entries behind each head (up to
``heads`` per publisher), which are not counted: once a publisher's head is a suspect, its
next entries in that window are handled alone too (``Suspects.careful``), so an entry
that kills its workers from behind the head costs a few deaths, not one per entry ahead of
it. This is the broker's form of what message brokers do for a batch that kills its
consumer: retry the suspects one at a time.

Nothing here runs while no head held is a suspect.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from broker.core import keys, wire
from broker.core.errors import ForeignKey
from broker.core.logs import publication_extra
from worker.turns import stream_id

log = logging.getLogger("broker.worker")

#: A FIFO head delivered this many times (a normal hand-over makes 2) is a suspect.
SUSPECT_DELIVERIES = 3


class Suspects:
    """The suspects a worker knows of among the heads it holds, and its careful publishers.

    A dead worker held up to ``heads`` entries of each of its publishers in its batch, and
    only each FIFO head is counted when taken over: once a publisher's head is a suspect,
    the entries behind it in that window are handled alone as well (the publisher is
    *careful*), so that an entry that kills its workers from behind the head is found
    without one death per entry ahead of it.

    Attributes:
        counts: entry id -> times delivered, of heads delivered ``SUSPECT_DELIVERIES`` times or more.
        careful: publisher -> how many of its next entries are still handled alone.
    """

    __slots__ = ("careful", "counts")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.careful: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.counts or self.careful)

    def note(self, times: Mapping[str, int]) -> None:
        """Remember the heads just taken over (``{entry id: times delivered}``) that are suspects."""
        for entry_id, delivered in times.items():
            if delivered >= SUSPECT_DELIVERIES:
                self.counts[entry_id] = delivered

    def clear(self) -> None:
        self.counts.clear()
        self.careful.clear()

    def handled(self, entry_ids: list[str]) -> None:
        """Forget entries whose unit of work was applied (or fenced)."""
        for entry_id in entry_ids:
            self.counts.pop(entry_id, None)

    def choose(
        self,
        heads: dict[str, list[str]],
        window: int,
        entries: Mapping[str, tuple[str, dict[bytes, bytes]]],
    ) -> tuple[str, str, int] | None:
        """The entry a round handles alone: ``(publisher, entry id, times delivered)``, or None.

        A suspect head first, the most delivered (a poison entry, once its deaths are
        charged to it alone), then the oldest; its publisher becomes careful for the rest
        of ``window`` entries. Else the head of a careful publisher, oldest first. State
        about heads no longer held is forgotten.

        Args:
            heads: ``{publisher: [entry ids]}`` of the turns the worker holds, FIFO heads first.
            window: the most entries of one publisher a dead worker held (``heads`` setting).
            entries: entry id -> (publisher, fields) of the entries read (for the log line).
        """
        counts, careful = self.counts, self.careful
        found = [(counts[ids[0]], ids[0], p) for p, ids in heads.items() if ids and ids[0] in counts]
        if found:
            delivered, entry_id, publisher = min(found, key=lambda f: (-f[0], stream_id(f[1])))
            careful[publisher] = window - 1
            log.warning(
                "entry %s delivered %d times (workers may have died on it): handling it alone",
                entry_id,
                delivered,
                extra=publication_extra(
                    entry_id, entries.get(entry_id, (publisher, None))[1], publisher=publisher
                ),
            )
            return publisher, entry_id, delivered
        counts.clear()  # none is a head held any more
        waiting = [(ids[0], p) for p, ids in heads.items() if ids and careful.get(p, 0) > 0]
        if not waiting:
            careful.clear()
            return None
        entry_id, publisher = min(waiting, key=lambda w: stream_id(w[0]))
        careful[publisher] -= 1
        return publisher, entry_id, 1


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
        raise ForeignKey(key, wire.text(found), "hash") from exc
