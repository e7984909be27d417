"""The publish stream and the workers' consumer group on it: creating the group, reading its state.

Every reader of the group's state (status, trimming, flow control, the demo,
the benchmark, the chaos harness) goes through ``group_state``, the one place
that parses ``XINFO GROUPS``.

The group is created again when it is gone (an operator's ``DEL {qm}:publish`` or
``XGROUP DESTROY``): ``ensure_group`` starts it after the last entry the workers are
known to have read, so that entries added before it is back are read and none read
before is read again (see ``ensure_group``). ``clock_problem`` names a stream whose
last entry id is exhausted or far ahead of the server's clock (a client chose the id).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.errors import ForeignKey


@dataclass(frozen=True)
class GroupState:
    """The workers' consumer group on ``{qm}:publish``.

    Attributes:
        exists: the stream and the group exist.
        length: entries in the stream (``XLEN``).
        pending: entries read by a worker and not yet acknowledged.
        lag: entries not yet read by any worker, or None when the server cannot
            tell (after an ``XDEL`` of an entry not yet read).
        last_delivered_id: the id of the last entry read ("0-0" when none).
        entries_read: how many entries the group has read, or None when unknown.
    """

    exists: bool
    length: int = 0
    pending: int = 0
    lag: int | None = 0
    last_delivered_id: str = "0-0"
    entries_read: int | None = 0

    @property
    def acknowledged(self) -> int:
        """Entries read and acknowledged (from ``entries_read``, or the length when unknown)."""
        read = self.entries_read
        if read is None:
            read = self.length - (self.lag or 0)
        return max(0, read - self.pending)


#: The largest stream entry id: a stream whose last id is this one takes no more entries
#: (every ``XADD`` fails: "The stream has exhausted the last possible ID").
MAX_ID = "18446744073709551615-18446744073709551615"

#: A last entry id more than this far ahead of the server's clock is named by ``clock_problem``, ms
#: (a day: far more than any clock skew between servers; the stream's ids only ever grow).
FUTURE_MS = 86_400_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id ``"ms-seq"`` as numbers, to compare two ids exactly (64-bit parts)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def known_reads(client: redis.Redis, qm: str) -> list[str]:
    """Entry ids the workers are known to have read from the group: the last one each worker's
    heartbeat names (``last_read_id``) and the newest one in each publisher's FIFO.

    Used by ``ensure_group`` when the group is gone. Foreign or corrupt records are passed over.
    """
    found: list[str] = []
    try:
        beats = client.hgetall(keys.workers(qm))
    except redis.ResponseError:
        beats = {}
    for raw in beats.values():
        try:
            last = json.loads(raw).get("last_read_id")
        except (ValueError, AttributeError):
            continue
        if isinstance(last, str) and last:
            found.append(last)
    try:
        publishers = list(client.sscan_iter(keys.active_publishers(qm), count=1000))
    except redis.ResponseError:
        publishers = []
    for start in range(0, len(publishers), 1000):
        pipe = client.pipeline(transaction=False)
        for pub in publishers[start : start + 1000]:
            pipe.lindex(keys.fifo_key(qm, pub.decode("utf-8", "surrogateescape")), -1)
        found += [_text(t) for t in pipe.execute(raise_on_error=False) if isinstance(t, bytes)]
    return found


def ensure_group(client: redis.Redis, qm: str, read_up_to: Iterable[str] = ()) -> str | None:
    """Create the publish stream and the workers' consumer group if they do not exist.

    A group that is gone while the stream is there (``XGROUP DESTROY``) starts after the
    newest entry the workers are known to have read (``read_up_to``, the heartbeats and the
    FIFOs: ``known_reads``) that the stream can hold (not after its last generated id: ids
    of a stream deleted and made again by a publisher's ``XADD``, or of a stream before
    ``broker repair stream``, are passed over), else at its start. So an entry added while
    the group was gone is read, and an entry read before is not read again, except one a
    worker read in its last heartbeat interval (about 1 s) and committed, leaving no trace
    in a FIFO: that one may be delivered twice (at least once; a second copy of an entry
    with a ``msgid`` is a duplicate within the dedup window). A stream that is gone is made
    again (``MKSTREAM``) with the group at its start: every entry in it is new.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        read_up_to: entry ids the caller read itself (a worker's last one).

    Returns:
        The entry id the group was created after ("0" for the start), or None when it existed.

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    stream = keys.publish_stream(qm)
    if group_state(client, qm).exists:  # read first: a worker starting on a full server writes nothing
        return None
    start = "0"
    if _text(client.type(stream)) == "stream":
        last = id_key(_text(client.xinfo_stream(stream)["last-generated-id"]))
        held = [c for c in (*read_up_to, *known_reads(client, qm)) if c and id_key(c) <= last]
        if held:
            start = max(held, key=id_key)
    try:
        client.xgroup_create(stream, keys.WORKER_GROUP, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return None
        if "WRONGTYPE" in str(exc):
            raise ForeignKey(stream, _text(client.type(stream)), "stream") from exc
        raise
    return start


def clock_problem(client: redis.Redis, qm: str) -> str | None:
    """What is wrong with the publish stream's last entry id, or None.

    An entry added with an id chosen by the client (``XADD {qm}:publish <id> ...`` instead of
    ``*``) may leave the stream's last id exhausted (``MAX_ID``: every later ``XADD`` fails) or
    far in the future (more than ``FUTURE_MS`` ahead of the server's ``TIME``, or of this
    machine's clock for an ACL user that may not run ``TIME``: every later
    entry gets an id, and a default publish time ``ts``, after it). The way out is
    ``broker repair stream`` (``broker.operations.repair``).

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    stream = keys.publish_stream(qm)
    kind = _text(client.type(stream))
    if kind == "none":
        return None
    if kind != "stream":
        raise ForeignKey(stream, kind, "stream")
    last = _text(client.xinfo_stream(stream)["last-generated-id"])
    try:
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
    except redis.exceptions.NoPermissionError:  # a monitor's ACL user: this machine's clock will do
        now_ms = int(time.time() * 1000)
    ahead_ms = id_key(last)[0] - now_ms
    way_out = (
        "run `broker repair stream` to move the pending and unread entries to a fresh stream "
        "(docs/operations.md)"
    )
    if last == MAX_ID:
        return (
            f"publish stream {stream} is exhausted: its last entry id is {last}, the largest there is, "
            f"so every XADD to it fails; {way_out}"
        )
    if ahead_ms > FUTURE_MS:
        return (
            f"publish stream {stream} has its last entry id {last} {ahead_ms // 86_400_000} days ahead "
            f"of the server's clock (a client chose the id): every new entry gets an id after it; {way_out}"
        )
    return None


def group_state(client: redis.Redis, qm: str) -> GroupState:
    """The state of the workers' group, from one ``XINFO GROUPS`` and one ``XLEN``.

    Returns:
        A ``GroupState``; ``exists`` is False when the stream or the group is missing.

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type.
        redis.RedisError: as redis-py raises it (a connection error).
    """
    stream = keys.publish_stream(qm)
    kind = _text(client.type(stream))
    if kind == "none":
        return GroupState(exists=False)
    if kind != "stream":
        raise ForeignKey(stream, kind, "stream")
    pipe = client.pipeline(transaction=False)
    pipe.xlen(stream)
    pipe.xinfo_groups(stream)
    length, groups = pipe.execute()
    for group in groups:
        if _text(group["name"]) != keys.WORKER_GROUP:
            continue
        lag = group.get("lag")
        read = group.get("entries-read")
        return GroupState(
            exists=True,
            length=int(length),
            pending=int(group["pending"]),
            lag=None if lag is None else int(lag),
            last_delivered_id=_text(group["last-delivered-id"]),
            entries_read=None if read is None else int(read),
        )
    return GroupState(exists=False, length=int(length))
