"""``broker repair stream``: move the publish stream's pending and unread work to a fresh stream.

A client that chose an entry id (``XADD {qm}:publish 18446744073709551615-18446744073709551615 ...``
or ``9999999999999-0``; the protocol says ``*``) leaves the stream's last id exhausted (every
later ``XADD`` fails) or far in the future (every later entry gets an id, and a default publish
time, after it). A stream's last id never goes back, so the way out is a fresh stream under the
same name: ``lua/repair_stream.lua`` does it in one atomic call, checking everything before its
first write. It moves, in stream order and with new ids, every entry pending in the workers'
group, in a publisher's FIFO, or not read yet; drops the acknowledged ones; creates the group at
the fresh stream's start; and deletes the FIFOs and turns, so the workers file the moved entries
again in the same order. It is safe while workers run: a worker holding units of work built from
the old entries is fenced in ``commit.lua`` (its turn is gone), so nothing is delivered twice.
``broker status`` names a stream that needs it (``broker.core.stream.clock_problem``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.connection import translate_errors
from broker.core.errors import RepairRefused
from broker.core.scripts import script_source
from broker.core.stream import FUTURE_MS

#: The most entries one repair moves by default: the call holds the server meanwhile (1.8 s for
#: 100,000 small unread entries on a shared 2-core box: ``SLOWLOG GET 1`` after the repair).
MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class RepairReport:
    """What ``repair_stream`` moved (or, in a dry run, would move).

    Attributes:
        moved: entries added to the fresh stream (``pending + unread``), in the old stream's order.
        pending: of those, entries read by a worker and not committed (pending or in a FIFO).
        unread: of those, entries not read yet.
        gone: ids pending or in a FIFO whose entry was no longer in the stream (not moved).
        dropped: acknowledged entries left behind (handled already).
        publishers: publishers whose FIFO (and turn) was deleted, to be filed again.
        first_id: the first moved entry's new id, "" when none moved or a dry run.
        last_id: the last moved entry's new id, "" when none moved or a dry run.
        old_last_id: the old stream's last generated id, "" when there was no stream.
        dry_run: nothing was written.
    """

    moved: int
    pending: int
    unread: int
    gone: int
    dropped: int
    publishers: int
    first_id: str
    last_id: str
    old_last_id: str
    dry_run: bool


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@translate_errors
def repair_stream(
    client: redis.Redis, qm: str, max_entries: int = MAX_ENTRIES, dry_run: bool = False
) -> RepairReport:
    """Move the pending and unread entries of ``{qm}:publish`` to a fresh stream, in order.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        max_entries: the most entries to move; more refuses the repair (nothing written).
        dry_run: check and count only.

    Returns:
        A ``RepairReport``; all zero when there is no stream.

    Raises:
        RepairRefused: nothing was written: a foreign key, no consumer group, over
            ``max_entries``, or an entry with more fields than one ``XADD`` takes.
        ServerFull: the server is out of memory (nothing written).
        ConnectionLost, ServerError: as ``translate_errors`` says.
    """
    script = client.register_script(script_source("repair_stream"))
    try:
        raw = script(
            keys=[keys.publish_stream(qm), keys.active_publishers(qm), keys.publish_repair(qm)],
            args=[keys.WORKER_GROUP, keys.pub_prefix(qm), max_entries, int(dry_run), FUTURE_MS],
        )
    except redis.ResponseError as exc:
        text = str(exc)
        if text.startswith("BROKER "):
            raise RepairRefused(text.removeprefix("BROKER ").split(" script: ", 1)[0]) from exc
        raise
    moved, pending, unread, gone, dropped, publishers = (int(x) for x in raw[:6])
    first, last, old_last = (_text(x) for x in raw[6:9])
    return RepairReport(moved, pending, unread, gone, dropped, publishers, first, last, old_last, dry_run)
