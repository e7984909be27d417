"""``broker.clients.loads``: the one reader of a subscription's load, on a real server."""

from __future__ import annotations

from broker.clients.loads import Load, read_loads, subscription_load
from broker.core import keys

QM = "LOADS"


def test_read_loads_counts_live_consumers_every_band_and_every_in_flight_list(real_redis) -> None:
    # Given a subscription with 2 live consumers and 1 expired, messages in two bands, 3 in flight
    sub = "c1$s"
    real_redis.zadd(keys.sub_consumers(QM, sub), {"a": 2_000, "b": 3_000, "old": 500})
    real_redis.rpush(keys.sub_queue(QM, sub), "m1", "m2")
    real_redis.rpush(keys.sub_band(QM, sub, 9), "m3")
    real_redis.rpush(keys.consumer_inflight(QM, sub, "a"), "x", "y")
    real_redis.rpush(keys.consumer_inflight(QM, sub, "old"), "z")
    real_redis.hset(keys.sub_redelivered(QM, sub), "x", 2)
    # When read at 1,000 ms
    reading = read_loads(real_redis, QM, [sub, "c2$none"], 1_000, redelivered=True)
    # Then every part is counted, and a subscription with no keys is empty
    assert (reading[0].consumers, reading[0].depth, reading[0].in_flight, reading[0].redelivered) == (
        2,
        3,
        3,
        1,
    )
    assert reading[1].load() == Load(0, 0, 0) and reading[1].foreign == []
    assert subscription_load(real_redis, QM, sub, now_ms=1_000) == Load(2, 3, 3)


def test_a_foreign_key_makes_its_part_unknown_and_is_named_but_counts_as_empty_in_a_load(real_redis) -> None:
    # Given a subscription whose default band is a string (written by something else)
    sub = "c1$s"
    real_redis.set(keys.sub_queue(QM, sub), "not a list")
    real_redis.zadd(keys.sub_consumers(QM, sub), {"a": 2_000})
    # When read
    reading = read_loads(real_redis, QM, [sub], 1_000)[0]
    # Then the depth is unknown and the key named; the rest is read
    assert reading.depth is None and reading.consumers == 1
    assert reading.foreign == [(keys.sub_queue(QM, sub), "list")]
    assert reading.load() == Load(1, 0, 0)
