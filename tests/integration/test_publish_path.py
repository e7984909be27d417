"""The publisher's lean path (issue 25): ``Publisher.publish`` writes its XADD and the flow key's GET
to a pooled connection itself, one round trip, no pipeline object per call; these tests show that the
connection stays in step when the server refuses the XADD or the connection drops."""

from __future__ import annotations

import pytest

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.errors import ServerError

QM = "TEST"


def test_a_plain_server_is_published_to_directly_and_fakeredis_through_commands(real_redis, fake_redis):
    assert Publisher(real_redis, QM, "p")._pool is real_redis.connection_pool
    assert Publisher(fake_redis, QM, "p")._pool is None


def test_the_flow_key_read_with_the_xadd_sets_the_delay(real_redis):
    # Given a flow key the workers set for this publisher
    real_redis.set(keys.flow_key(QM, "p"), "250", px=60_000)
    # When it publishes without waiting for the result
    result = Publisher(real_redis, QM, "p", sleep_ms=lambda ms: None).publish("a/b", b"x")
    # Then the delay comes from that key, and the entry is in the stream
    assert result.flow_control_delay_ms == 250
    assert real_redis.xrange(keys.publish_stream(QM))[0][0].decode() == result.entry_id


def test_a_refused_xadd_leaves_the_connection_in_step(real_redis):
    # Given a publish stream key of another type (a foreign key) and a flow key
    publisher = Publisher(real_redis, QM, "p", sleep_ms=lambda ms: None)
    real_redis.set(keys.publish_stream(QM), "planted")
    real_redis.set(keys.flow_key(QM, "p"), "7", px=60_000)
    # When the XADD is refused
    with pytest.raises(ServerError, match="WRONGTYPE"):
        publisher.publish("a/b", b"x")
    # Then the next publication on the same pooled connection reads its own replies, not the GET's
    real_redis.delete(keys.publish_stream(QM))
    result = publisher.publish("a/b", b"y")
    assert result.status == "sent" and result.seq == 1  # the refused one was not written: same seq
    assert result.flow_control_delay_ms == 7
    assert real_redis.xlen(keys.publish_stream(QM)) == 1


# A lost XADD reply on this path (ConnectionLost, "outcome unknown", the same seq on the retry):
# tests/integration/test_faults.py, test_publisher_retry_after_a_lost_xadd_reply_is_delivered_once_in_order.
