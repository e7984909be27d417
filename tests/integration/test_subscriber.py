"""Subscribers: reliable pop with an in-flight list, durable versus non-durable."""

from __future__ import annotations

from broker import Publisher, Subscriber, keys, list_subscriptions, subscribe
from tests.harness.testing import drain, make_workers

QM = "TEST"


def test_a_subscriber_that_dies_mid_message_loses_nothing(real_redis, settings):
    record = subscribe(real_redis, QM, "/A", "c", "d")
    pub = Publisher(real_redis, QM, "p")
    for body in (b"1", b"2"):
        pub.publish("/A", body)
    drain(make_workers(real_redis, settings, 1))
    first = Subscriber(real_redis, QM, record)
    taken = first.receive()
    assert taken is not None and taken.message.body == b"1"
    # the subscriber dies here without acknowledging; a new one recovers the message first
    second = Subscriber(real_redis, QM, record)
    got = [second.receive(timeout_ms=100) for _ in range(2)]
    assert [d.message.body for d in got if d] == [b"1", b"2"]
    for delivery in got:
        assert delivery is not None
        second.ack(delivery)
    assert real_redis.llen(keys.sub_inflight(QM, record.sub_id)) == 0
    assert second.receive() is None


def test_durable_subscription_keeps_collecting_after_close_and_non_durable_is_removed(real_redis, settings):
    durable = subscribe(real_redis, QM, "/A", "c", "keep")
    temporary = subscribe(real_redis, QM, "/A", "c")
    Subscriber(real_redis, QM, durable).close()
    Subscriber(real_redis, QM, temporary).close()
    Publisher(real_redis, QM, "p").publish("/A", b"while away")
    drain(make_workers(real_redis, settings, 1))
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["c$keep"]
    back = Subscriber(real_redis, QM, subscribe(real_redis, QM, "/A", "c", "keep"))
    delivery = back.receive()
    assert delivery is not None and delivery.message.body == b"while away"
    assert real_redis.exists(keys.sub_queue(QM, temporary.sub_id)) == 0
