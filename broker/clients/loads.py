"""A subscription's load: live consumers, messages waiting, messages in flight, redelivered.

The one reader of it: ``read_loads`` reads many subscriptions in two pipelined round trips
(the second only for the in-flight lists of the consumers the first found). ``broker status``,
``broker subscriptions``, ``broker durables delete``, the usage lists and the Prometheus
collector all read it here. Keys: ``broker.core.keys`` (``sub_consumers``, ``sub_bands``,
``consumer_inflight``, ``sub_redelivered``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import clock, keys, wire
from broker.core.errors import translate_errors


@dataclass(frozen=True)
class Load:
    """How busy a subscription is: live consumers, messages waiting, messages in flight."""

    consumers: int
    depth: int
    in_flight: int


@dataclass
class LoadReading:
    """One subscription's load as read; a part is None when one of its keys holds another Redis type.

    Attributes:
        sub_id: the subscription id.
        consumers: consumers with a live lease (lease deadline at or after ``now_ms``).
        depth: messages waiting, every priority band.
        in_flight: messages taken and not acknowledged, every consumer (0 when not read).
        redelivered: messages with a redelivery count (0 when not read).
        foreign: ``(key, the Redis type expected)`` of each key of another type.
    """

    sub_id: str
    consumers: int | None = 0
    depth: int | None = 0
    in_flight: int | None = 0
    redelivered: int | None = 0
    foreign: list[tuple[str, str]] = field(default_factory=list)

    def load(self) -> Load:
        """As a ``Load``, a foreign key counting as empty (``broker status`` names foreign keys)."""
        return Load(self.consumers or 0, self.depth or 0, self.in_flight or 0)


def _count(reading: LoadReading, part: str, key: str, expected: str, reply: Any) -> None:
    """Add ``reply`` (a count) to ``reading.<part>``, or mark the part unknown for a foreign key."""
    if isinstance(reply, redis.ResponseError):
        reading.foreign.append((key, expected))
        setattr(reading, part, None)
    elif isinstance(reply, int) and getattr(reading, part) is not None:
        setattr(reading, part, getattr(reading, part) + reply)


def read_loads(
    client: redis.Redis,
    qm: str,
    sub_ids: Sequence[str],
    now_ms: int,
    in_flight: bool = True,
    redelivered: bool = False,
) -> list[LoadReading]:
    """The load of each subscription of ``sub_ids``, in their order, in two round trips at most.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        sub_ids: the subscription ids.
        now_ms: the time a live consumer's lease must reach, ms since the epoch.
        in_flight: also read the consumers' in-flight lists (a second round trip).
        redelivered: also read the redelivery counts (``HLEN {qm}:sub:<id>:redelivered``).

    Raises:
        redis.RedisError: as redis-py raises it (a lost connection; an error reply of one key is
            a foreign key, in ``LoadReading.foreign``).
    """
    pipe = client.pipeline(transaction=False)
    for sub_id in sub_ids:
        consumers = keys.sub_consumers(qm, sub_id)
        pipe.zcount(consumers, now_ms, "+inf")
        for band in keys.sub_bands(qm, sub_id):
            pipe.llen(band)
        if in_flight:
            pipe.zrange(consumers, 0, -1)
        if redelivered:
            pipe.hlen(keys.sub_redelivered(qm, sub_id))
    replies = iter(pipe.execute(raise_on_error=False))
    readings: list[LoadReading] = []
    owners: list[tuple[LoadReading, str]] = []
    second = client.pipeline(transaction=False)
    for sub_id in sub_ids:
        reading = LoadReading(sub_id)
        readings.append(reading)
        consumers = keys.sub_consumers(qm, sub_id)
        _count(reading, "consumers", consumers, "zset", next(replies))
        for band in keys.sub_bands(qm, sub_id):
            _count(reading, "depth", band, "list", next(replies))
        if in_flight:
            members = next(replies)
            for member in members if isinstance(members, list) else ():
                inflight = keys.consumer_inflight(qm, sub_id, wire.exact_text(member))
                second.llen(inflight)
                owners.append((reading, inflight))
        if redelivered:
            _count(reading, "redelivered", keys.sub_redelivered(qm, sub_id), "hash", next(replies))
    if owners:
        for (reading, inflight), reply in zip(owners, second.execute(raise_on_error=False), strict=True):
            _count(reading, "in_flight", inflight, "list", reply)
    return readings


@translate_errors
def subscription_load(client: redis.Redis, qm: str, sub_id: str, now_ms: int | None = None) -> Load:
    """Live consumers, waiting messages (every band) and in-flight messages (every consumer) of a subscription.

    A key of another type counts as empty (``broker status`` names foreign keys).

    Raises:
        ConnectionLost: the server cannot be reached.
    """
    now = clock.now_ms() if now_ms is None else now_ms
    return read_loads(client, qm, [sub_id], now)[0].load()
