"""The script wrappers of ``broker.core.scripts`` raise ``ForeignKey`` and ``ServerFull`` themselves (issue 25):
a caller never reads an error's text to tell a foreign key or a full server from another error."""

from __future__ import annotations

import pytest
import redis

from broker.core import keys
from broker.core.errors import ForeignKey, ServerFull
from broker.core.scripts import Scripts, checked
from broker.core.unit_of_work import Action, CommitBatch, UnitOfWork

QM = "TEST"


def test_a_wrapper_raises_foreign_key_with_the_key_and_both_types(real_redis):
    # Given the active publishers set holding a string (written by something other than the broker)
    real_redis.set(keys.active_publishers(QM), "oops")
    scripts = Scripts(real_redis, QM)
    # When a worker sweeps the turns, then Then the wrapper raises ForeignKey naming the key
    with pytest.raises(ForeignKey) as raised:
        scripts.sweep_turns("w-1", 30_000, "0", 100)
    assert (raised.value.key, raised.value.found, raised.value.expected) == (
        keys.active_publishers(QM),
        "string",
        "set",
    )
    # and nothing was written over it
    assert real_redis.get(keys.active_publishers(QM)) == b"oops"


def test_a_pipelined_unit_of_work_on_a_foreign_subscription_hash_is_raised_as_foreign_key(real_redis):
    # Given the subscription hash holding a list
    real_redis.rpush(keys.subscriptions(QM), "oops")
    scripts = Scripts(real_redis, QM)
    scripts.load()
    batch = CommitBatch()
    batch.add(UnitOfWork("p", "1-0", Action.SKIP, "m"))
    # When the unit of work is sent in a pipeline, as the worker sends it
    pipe = real_redis.pipeline(transaction=False)
    scripts.commit(pipe, "w-1", 30_000, batch)
    (reply,) = pipe.execute(raise_on_error=False)
    # Then checked() raises ForeignKey, not the server's error reply
    with pytest.raises(ForeignKey) as raised:
        checked(reply, "unit of work")
    assert raised.value.key == keys.subscriptions(QM) and raised.value.found == "list"


def test_a_unit_of_work_on_a_full_server_is_raised_as_server_full_and_writes_nothing(real_redis):
    # Given a publisher whose turn the worker holds, one entry in its FIFO, and a full server
    entry_id = real_redis.xadd(keys.publish_stream(QM), {"publisher": "p"}).decode()
    real_redis.xgroup_create(keys.publish_stream(QM), keys.WORKER_GROUP, id="0")
    real_redis.set(keys.turn_key(QM, "p"), "w-1")
    real_redis.rpush(keys.fifo_key(QM, "p"), entry_id)
    scripts = Scripts(real_redis, QM)
    batch = CommitBatch()
    batch.add(UnitOfWork("p", entry_id, Action.DELIVER, "m-1", envelope=b"x", dedup_window_ms=60_000))
    real_redis.config_set("maxmemory", 1)
    try:
        # When the unit of work is committed
        with pytest.raises(ServerFull) as raised:
            scripts.commit(None, "w-1", 30_000, batch)
    finally:
        real_redis.config_set("maxmemory", 0)
    # Then it is ServerFull (the dedup record was the first write, refused) and nothing was written
    assert raised.value.what == "unit of work"
    assert real_redis.exists(keys.dedup(QM, "p", "m-1")) == 0
    assert real_redis.lrange(keys.fifo_key(QM, "p"), 0, -1) == [entry_id.encode()]


def test_another_error_reply_is_left_as_redis_raised_it(real_redis):
    # Given an error reply that is neither a foreign key nor a full server
    error = redis.ResponseError("NOGROUP No such key or consumer group")
    # Then checked() raises it unchanged
    with pytest.raises(redis.ResponseError) as raised:
        checked(error, "dequeue")
    assert raised.value is error
