"""The publish stream and the workers' consumer group on it: creating the group, reading its state.

Every reader of the group's state (status, trimming, flow control, the demo,
the benchmark, the chaos harness) goes through ``group_state``, the one place
that parses ``XINFO GROUPS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.errors import ForeignKey


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ensure_group(client: redis.Redis, qm: str) -> None:
    """Create the publish stream and the workers' consumer group if they do not exist.

    Raises:
        ForeignKey: ``{qm}:publish`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    stream = keys.publish_stream(qm)
    if group_state(client, qm).exists:  # read first: a worker starting on a full server writes nothing
        return
    try:
        client.xgroup_create(stream, keys.WORKER_GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" in str(exc):
            return
        if "WRONGTYPE" in str(exc):
            raise ForeignKey(stream, _text(client.type(stream)), "stream") from exc
        raise


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
