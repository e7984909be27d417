"""The broker's Lua scripts, loaded from ``broker/lua/*.lua``, one typed wrapper each.

Each script is registered once per client with redis-py's ``register_script``,
whose ``Script`` object reloads the script on NOSCRIPT and works inside
pipelines. The wrappers take and return plain Python values; the key layout
they assume is documented in ``broker.keys``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis

from broker import keys


def _b(text: str) -> bytes:
    """Encode a publisher id back to the bytes Redis holds (ids that were not UTF-8 round-trip)."""
    return text.encode("utf-8", "surrogateescape")


def _source(name: str) -> str:
    return resources.files("broker").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Dequeued:
    """What one call of ``dequeue.lua`` returned.

    Attributes:
        version: the index version counter, read in the same atomic call.
        last_delivered_id: the group's last delivered entry id when nothing was
            read (to block on with XREAD), else "".
        entries: ``[(entry_id, {field: value})]`` with bytes keys and values.
        owned: ``{publisher: [fifo head entry ids]}`` for every publisher whose
            turn this worker holds.
    """

    version: int
    last_delivered_id: str
    entries: list[tuple[str, dict[bytes, bytes]]]
    owned: dict[str, list[str]]


@dataclass(frozen=True)
class Commit:
    """The arguments of one unit of work (``commit.lua``) for one publication.

    Attributes:
        publisher: the publisher id.
        entry_id: the stream entry id.
        action: "deliver", "expire", "refuse" or "skip".
        payload: the envelope (deliver) or the reason (refuse), bytes.
        queues: the subscriber queue keys (deliver), de-duplicated.
        dedup_key: the dedup record key.
        reply_key: the reply list key.
        dedup_window_ms: how long the msgid is remembered; 0 for none.
        reply_ttl_ms: how long the reply is kept; 0 when no reply was asked for.
        msgid: the message id.
        suggestion: a corrected topic for a refused publication, or "".
    """

    publisher: str
    entry_id: str
    action: str
    payload: bytes
    queues: tuple[str, ...]
    dedup_key: str
    reply_key: str
    dedup_window_ms: int
    reply_ttl_ms: int
    msgid: str
    suggestion: str = ""


class Scripts:
    """The broker's scripts bound to one client and one queue manager.

    Args:
        client: a redis-py client (``decode_responses=False``).
        qm: the queue manager name.
    """

    def __init__(self, client: redis.Redis, qm: str) -> None:
        self.client = client
        self.qm = qm
        self._dequeue = client.register_script(_source("dequeue"))
        self._commit = client.register_script(_source("commit"))
        self._reclaim = client.register_script(_source("reclaim"))
        self._release = client.register_script(_source("release"))
        self._prefix = keys.pub_prefix(qm)
        self._bprefix = self._prefix.encode()
        self._fixed = (
            keys.publish_stream(qm),
            keys.active_publishers(qm),
            keys.dead_letter(qm),
        )

    def dequeue(
        self, token: str, count: int, lease_ms: int, heads: int, owned: list[str]
    ) -> Dequeued:
        """Read up to ``count`` entries, file them in their publishers' FIFOs, take free turns.

        Args:
            token: the worker's consumer name and fencing token.
            count: the most entries to read.
            lease_ms: lease of a publisher's turn, in milliseconds.
            heads: the most FIFO entry ids returned per owned publisher.
            owned: publishers whose turn the worker believes it holds.

        Returns:
            A ``Dequeued``.

        Raises:
            redis.RedisError: as redis-py raises it; callers translate.
        """
        qm = self.qm
        raw = self._dequeue(
            keys=[keys.publish_stream(qm), keys.version(qm), keys.active_publishers(qm)],
            args=[keys.WORKER_GROUP, token, count, self._prefix, lease_ms, heads,
                  keys.MALFORMED_PUBLISHER, *map(_b, owned)],
        )
        return _parse_dequeue(raw)

    def commit(self, pipe: Any, token: str, lease_ms: int, unit: Commit) -> None:
        """Queue one unit of work on ``pipe``; its reply is ``[status, count, released]``.

        Args:
            pipe: a redis-py pipeline (its ``execute`` returns the replies).
            token: the worker's fencing token.
            lease_ms: lease of the publisher's turn, renewed by the commit, ms.
            unit: what to commit.
        """
        stream, active, dlq = self._fixed
        pub = _b(unit.publisher)
        self._commit(
            keys=[stream, self._bprefix + pub + b":fifo", self._bprefix + pub + b":owner", active,
                  unit.dedup_key, unit.reply_key, dlq, *unit.queues],
            args=[keys.WORKER_GROUP, unit.entry_id, token, lease_ms, unit.action,
                  unit.payload, unit.dedup_window_ms, unit.reply_ttl_ms, pub, unit.msgid, unit.suggestion],
            client=pipe,
        )

    def reclaim(self, token: str, lease_ms: int, cursor: str, count: int) -> tuple[str, list[str]]:
        """Take the turn of orphaned publishers (FIFO not empty, no owner).

        Args:
            token: the worker's fencing token.
            lease_ms: lease of a publisher's turn, ms.
            cursor: the SSCAN cursor, "0" to start.
            count: SSCAN count hint.

        Returns:
            ``(next cursor, publishers taken)``.
        """
        nxt, taken = self._reclaim(
            keys=[keys.active_publishers(self.qm)],
            args=[self._prefix, token, lease_ms, cursor, count],
        )
        return nxt.decode(), [p.decode("utf-8", "surrogateescape") for p in taken]

    def release(self, token: str, publishers: list[str]) -> int:
        """Give up the turns this worker holds on ``publishers``; returns how many."""
        if not publishers:
            return 0
        return int(self._release(keys=[], args=[self._prefix, token, *map(_b, publishers)]))


def _parse_dequeue(raw: list[Any]) -> Dequeued:
    version, last_id, entries, owned = raw
    parsed = []
    for entry_id, flat in entries:
        fields = {}
        for i in range(0, len(flat), 2):
            fields[flat[i]] = flat[i + 1]
        parsed.append((entry_id.decode(), fields))
    owned_map = {}
    for i in range(0, len(owned), 2):
        owned_map[owned[i].decode("utf-8", "surrogateescape")] = [x.decode() for x in owned[i + 1]]
    return Dequeued(int(version), last_id.decode(), parsed, owned_map)
