"""The unit of work as the function ``broker_commit`` of the library ``broker`` (issue 25): its helpers
are made once, when the library loads, and each call starts afresh from its own KEYS and ARGV."""

from __future__ import annotations

import json

import pytest
import redis

from broker import subscribe
from broker.core import keys
from broker.core.library import COMMIT
from broker.core.models import publication_fields
from broker.core.unit_of_work import Action, CommitBatch, UnitOfWork
from broker.testing import drain, library_functions, make_workers, queue_messages
from worker.loop import Worker

QM = "TEST"


def _fcalls(client) -> int:
    return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def test_the_unit_of_work_is_one_fcall_of_broker_commit_without_flags(real_redis, settings):
    # Given a worker set up and a subscription
    sub = subscribe(real_redis, QM, "t/#", "app", "a")
    workers = make_workers(real_redis, settings, 1)
    real_redis.config_resetstat()
    # When three publications are delivered
    for i in range(3):
        real_redis.xadd(keys.publish_stream(QM), publication_fields("p", "t/x", b"%d" % i))
    drain(workers)
    # Then the library holds broker_commit, without flags (a full server refuses the call whole,
    # before it runs), and the worker called it
    assert library_functions(real_redis)[COMMIT] == []
    assert _fcalls(real_redis) >= 1
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"0", b"1", b"2"]


def test_a_worker_whose_server_lost_the_library_loads_it_and_sends_the_same_units_again(real_redis, settings):
    # Given a worker set up, publications waiting, and the library gone (FUNCTION FLUSH)
    sub = subscribe(real_redis, QM, "t/#", "app", "a")
    workers = make_workers(real_redis, settings, 1)
    for i in range(3):
        real_redis.xadd(keys.publish_stream(QM), publication_fields("p", "t/x", b"%d" % i))
    real_redis.function_flush()
    # When it runs: its commit finds no function
    drain(workers)
    # Then it loaded the library and delivered each publication once, in order
    assert COMMIT in library_functions(real_redis)
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"0", b"1", b"2"]
    assert workers[0].counts == {"delivered": 3}


def test_a_call_keeps_nothing_of_the_call_before_it(real_redis, settings):
    # Given a subscription, and a first worker with flow control in force from depth 0 and the journal
    subscribe(real_redis, QM, "t/#", "app", "a")
    flowing = settings.model_copy(
        update={
            "journal": True,
            "flowcontrol_enabled": True,
            "flow_control_start_depth": 0,
            "flow_control_full_depth": 10,
            "flow_control_max_delay_ms": 1_000,
        }
    )
    stream = keys.publish_stream(QM)
    for i in range(3):
        real_redis.xadd(stream, publication_fields("p", "t/x", b"%d" % i, msgid=f"m{i}", reply=True))
    drain(make_workers(real_redis, flowing, 1))
    first = json.loads(real_redis.lpop(keys.reply(QM, "p", "m2")))
    assert first["flow_control_delay_ms"] > 0 and real_redis.exists(keys.flow_key(QM, "p"))
    real_redis.delete(keys.flow_key(QM, "p"))
    journaled = real_redis.xlen(keys.journal(QM))
    # When a second worker, without flow control or journal, commits the next publication
    plain = settings.model_copy(update={"journal": False, "flowcontrol_enabled": False})
    worker = Worker(real_redis, plain, name="plain")
    worker.setup()
    real_redis.xadd(stream, publication_fields("p", "t/x", b"3", msgid="m3", reply=True))
    drain([worker])
    # Then its call used none of the first one's flow control, journal or units
    second = json.loads(real_redis.lpop(keys.reply(QM, "p", "m3")))
    assert (second["status"], second["subscriptions"]) == ("delivered", 1)
    assert "flow_control_delay_ms" not in second
    assert real_redis.exists(keys.flow_key(QM, "p")) == 0
    assert real_redis.xlen(keys.journal(QM)) == journaled
    assert worker.counts == {"delivered": 1}


def _unit(publisher: str, entry_id: str, body: bytes, queue: str) -> UnitOfWork:
    return UnitOfWork(publisher, entry_id, Action.DELIVER, f"m-{entry_id}", envelope=body, queues=(queue,))


def test_a_call_stopped_by_a_malformed_unit_leaves_none_of_its_copies_to_the_next_call(real_redis, settings):
    # Given a subscription, and a worker holding the turns of p1 and p2, each with one entry
    sub = subscribe(real_redis, QM, "t/#", "app", "a")
    queue = keys.sub_queue(QM, sub.sub_id)
    worker = Worker(real_redis, settings, name="w")
    worker.setup()
    for publisher, entry_id in (("p1", "1-1"), ("p2", "1-2")):
        real_redis.set(keys.turn_key(QM, publisher), "w")
        real_redis.rpush(keys.fifo_key(QM, publisher), entry_id)
    # When a call's first unit gives the queue a copy and its second names a key the call lacks
    batch = CommitBatch()
    batch.add(_unit("p1", "1-1", b"planned, never pushed", queue))
    batch.add(_unit("p2", "1-2", b"malformed", queue))
    batch.args[-2] = b"\x00\x00\x63"  # the second unit's recipients: KEYS index 99
    with pytest.raises(redis.ResponseError, match="BROKER malformed unit of work"):
        worker.scripts.commit(None, "w", 30_000, batch)
    # and then a call for p1 alone
    after = CommitBatch()
    after.add(_unit("p1", "1-1", b"delivered", queue))
    worker.scripts.commit(None, "w", 30_000, after)
    # Then the queue holds only that call's copy: the stopped call's was not kept for it
    assert real_redis.lrange(queue, 0, -1) == [b"delivered"]
    assert real_redis.llen(keys.fifo_key(QM, "p2")) == 1  # nothing of p2's unit was written
