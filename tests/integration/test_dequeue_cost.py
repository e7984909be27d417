"""What one dequeue (``FCALL broker_dequeue``, ``lua/library/dequeue.lua``) costs at a low rate
(issue 25): the commands it calls inside the function.

At 2,000 publications/s most dequeues carry one publication, so each command the script calls is paid
per publication. The reads it makes anyway check their keys' types (``redis.pcall``: an error reply
is a foreign key), so it sends no TYPE but for the dead-letter stream when it may refuse an entry;
a feature nobody configured is not looked at (the principals without ingress streams, the
saturated records with one live worker); nothing is read from the stream when the group's lag is 0.
The counts come from the server's ``INFO commandstats`` (commands called by a function count there,
and the call itself as one ``fcall``).
"""

from __future__ import annotations

import time

import pytest
import redis

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import ForeignKey
from broker.core.principals import bind
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"


def _calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT``, without the test's own commands."""
    stats = client.info("commandstats")
    ran = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    for own in ("config|resetstat", "info"):
        ran.pop(own, None)
    return ran


def test_a_dequeue_of_one_publication_sends_no_type_but_the_dead_letter_streams(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given one worker, a subscription and one publication
    subscribe(real_redis, QM, "t/#", "app", "s")
    (worker,) = make_workers(real_redis, settings, 1)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    real_redis.config_resetstat()
    # When the worker dequeues it
    dequeued = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [])
    calls = _calls(real_redis)
    # Then it holds p1's turn with the entry as its head (known without LRANGE: its FIFO was empty)
    assert dequeued is not None and [entry_id for entry_id, _ in dequeued.entries] == dequeued.turns["p1"]
    assert dequeued.active == real_redis.scard(keys.active_publishers(QM)) == 1
    assert real_redis.pttl(keys.turn_key(QM, "p1")) > 0
    # ... and the script's reads checked the types: one TYPE ({qm}:dlq, which has no read), no
    # principals or saturated records read, the turn's lease given by its SET (no PEXPIRE)
    assert calls.pop("type") == 1, calls
    assert calls == {
        "fcall": 1,
        "xinfo|groups": 1,
        "get": 2,  # the index version, p1's turn
        "scard": 1,
        "time": 1,
        "zcount": 1,
        "xreadgroup": 1,
        "lpop": 1,
        "llen": 1,
        "rpush": 1,
        "sadd": 1,
        "set": 1,
    }


def test_a_dequeue_naming_a_turn_with_nothing_waiting_reads_no_entry_and_takes_no_turn(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given a worker that handled everything, naming the publisher whose turn its commit ended (as the
    # dequeue that rides with a commit does)
    subscribe(real_redis, QM, "t/#", "app", "s")
    (worker,) = make_workers(real_redis, settings, 1)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    drain([worker])
    real_redis.config_resetstat()
    # When it dequeues
    dequeued = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, ["p1"])
    calls = _calls(real_redis)
    # Then it holds nothing, at the group's last-delivered id
    assert dequeued is not None and not dequeued.entries and not dequeued.turns and dequeued.active == 0
    group = real_redis.xinfo_groups(keys.publish_stream(QM))[0]
    assert dequeued.last_delivered_id == group["last-delivered-id"].decode()
    # ... and it sent no TYPE, no XREADGROUP (the group's lag is 0), and took no turn only to give it up
    for command in ("type", "xreadgroup", "set", "del", "pexpire", "lrange", "hgetall", "srem"):
        assert command not in calls, calls
    assert real_redis.exists(keys.turn_key(QM, "p1")) == 0


def test_the_principals_are_read_only_when_the_worker_has_ingress_streams(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given a principal bound to p1 and an entry in its ingress stream
    subscribe(real_redis, QM, "t/#", "app", "s")
    (worker,) = make_workers(real_redis, settings, 1)
    bind(real_redis, QM, "alice", ["p1"])
    real_redis.xadd(keys.ingress(QM, "alice"), {"publisher": "p1", "topic": "t/a", "body": "x"})
    real_redis.config_resetstat()
    # When a dequeue does not ask for ingress, Then it reads no principals and moves nothing
    plain = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [])
    assert plain is not None and not plain.entries
    assert "hgetall" not in _calls(real_redis)
    assert real_redis.xlen(keys.ingress(QM, "alice")) == 1
    # ... and one that asks moves the entry into the publish stream and reads it
    moved = worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [], ingress=True)
    assert moved is not None and [fields[b"principal"] for _, fields in moved.entries] == [b"alice"]
    assert real_redis.xlen(keys.ingress(QM, "alice")) == 0


def test_a_worker_whose_routing_table_has_ingress_streams_moves_their_entries(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given a principal bound to p1 before the worker starts, and an entry in its ingress stream
    sub = subscribe(real_redis, QM, "t/#", "app", "s")
    bind(real_redis, QM, "alice", ["p1"])
    workers = make_workers(real_redis, settings, 1)
    real_redis.xadd(keys.ingress(QM, "alice"), {"publisher": "p1", "topic": "t/a", "body": "x"})
    # When the worker runs, Then the publication is delivered
    drain(workers)
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"x"]


def test_a_worker_alone_goes_on_beside_a_foreign_saturated_record_hash(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given one worker and a string planted where the saturated workers' records belong
    sub = subscribe(real_redis, QM, "t/#", "app", "s")
    workers = make_workers(real_redis, settings, 1)
    real_redis.set(keys.saturated(QM), "planted")
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # When it runs, Then it delivers (it reads and writes the records only beside another live worker)
    drain(workers)
    assert len(queue_messages(real_redis, QM, sub.sub_id)) == 1
    assert real_redis.get(keys.saturated(QM)) == b"planted"
    # ... and beside another live worker it stops before any write, naming the key
    real_redis.zadd(keys.alive(QM), {"w-other": int(time.time() * 1000)})
    Publisher(real_redis, QM, "p1").publish("t/a", b"two", msgid="m2")
    with pytest.raises(ForeignKey, match=keys.saturated(QM)):
        workers[0].scripts.dequeue(workers[0].name, 50, settings.lease_ms, settings.heads, [])
    assert real_redis.xinfo_groups(keys.publish_stream(QM))[0]["lag"] == 1


@pytest.mark.parametrize(("key", "value"), [(keys.alive, "planted"), (keys.version, None)])
def test_a_foreign_key_found_by_a_read_stops_the_dequeue_before_any_write(
    real_redis: redis.Redis, settings: Settings, key, value
) -> None:
    # Given a publication and a key of another type where a queue-manager-wide key the dequeue reads belongs
    (worker,) = make_workers(real_redis, settings, 1)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    real_redis.delete(key(QM))
    if value is None:
        real_redis.rpush(key(QM), "planted")
    else:
        real_redis.set(key(QM), value)
    # When the worker dequeues, Then the broker's error names the key, and nothing was read or filed
    with pytest.raises(ForeignKey, match=key(QM)):
        worker.scripts.dequeue(worker.name, 50, settings.lease_ms, settings.heads, [])
    group = real_redis.xinfo_groups(keys.publish_stream(QM))[0]
    assert (group["lag"], group["pending"]) == (1, 0)
    assert real_redis.exists(keys.fifo_key(QM, "p1"), keys.turn_key(QM, "p1")) == 0
