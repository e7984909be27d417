"""Delete Durable (seed 003's examples, verbatim) and idle durable expiry, on a real server."""

from __future__ import annotations

import json
import time

import pytest
from rq import Queue, SimpleWorker

from broker import Publisher, Subscriber, subscribe
from broker.clients.consumer import recover
from broker.core import keys
from broker.core.errors import InvalidSelector
from broker.jobs import ADMIN_QUEUE, periodic
from broker.operations.durables import delete_durables, expire_idle_durables
from broker.testing import drain, make_workers
from broker.topics.subscriptions import Removal, list_subscriptions, remove_subscription

QM = "TEST"


def ids(client) -> list[str]:
    return [r.sub_id for r in list_subscriptions(client, QM)]


def make(client, *sub_ids: str, durable: bool = True) -> None:
    for sub_id in sub_ids:
        client_id, _, name = sub_id.partition("$")
        subscribe(client, QM, "/a/#", client_id, name if durable else None)


def test_seed_example_client_id_sales_and_durable_name_percent_deletes_every_durable_of_client_sales(
    real_redis,
):
    # Given durables of sales, salesx and other, and a non-durable subscription of sales
    make(real_redis, "sales$d1", "sales$dur2003", "salesx$d1", "other$d1")
    make(real_redis, "sales$x", durable=False)
    # When Delete Durable runs with client id predicate 'sales' and durable name predicate '%'
    done = delete_durables(real_redis, QM, "sales", "%")
    # Then every durable of client id sales is deleted, and nothing else
    assert [d.sub_id for d in done.deleted] == ["sales$d1", "sales$dur2003"]
    left = ids(real_redis)
    assert "salesx$d1" in left and "other$d1" in left
    assert len([i for i in left if i.startswith("sales$nd-")]) == 1  # the non-durable one


def test_seed_example_both_predicates_percent_delete_every_durable_and_no_non_durable(real_redis):
    make(real_redis, "sales$d1", "s__es1$dur2003", "saukestaand$dur2003", "other$d1")
    make(real_redis, "app$x", "ops$y", durable=False)
    done = delete_durables(real_redis, QM, "%", "%")
    assert len(done.deleted) == 4
    assert all(r.durable is False for r in list_subscriptions(real_redis, QM))
    assert len(ids(real_redis)) == 2


def test_seed_example_s_escaped_underscores_es_percent_deletes_literal_s__es_not_saukestaand(real_redis):
    # SQL LIKE with '\' as the escape (the seed's own definition): s\_\_es% is "s__es" then anything
    make(real_redis, "s__es1$dur2003", "saukestaand$dur2003", "s__es1$other", "sales$dur1")
    done = delete_durables(real_redis, QM, r"s\_\_es%", "dur%")
    assert [d.sub_id for d in done.deleted] == ["s__es1$dur2003"]
    assert ids(real_redis) == ["s__es1$other", "sales$dur1", "saukestaand$dur2003"]


@pytest.mark.parametrize("client_id_predicate", ["s_u%", "sa%"])
def test_unescaped_predicates_select_saukestaand_dur2003(real_redis, client_id_predicate):
    make(real_redis, "saukestaand$dur2003", "saukestaand$other", "xsaukestaand$dur2003")
    done = delete_durables(real_redis, QM, client_id_predicate, "dur%")
    assert [d.sub_id for d in done.deleted] == ["saukestaand$dur2003"]
    assert ids(real_redis) == ["saukestaand$other", "xsaukestaand$dur2003"]


def test_delete_counts_the_messages_lost_waiting_and_in_flight_and_removes_every_key(real_redis, settings):
    # Given a durable with 3 messages published, one of them taken by a consumer and not acknowledged
    record = subscribe(real_redis, QM, "/a", "sales", "d1")
    pub = Publisher(real_redis, QM, "p")
    for i in range(3):
        pub.publish("/a", str(i).encode(), priority=4 if i else 7)
    drain(make_workers(real_redis, settings, 1))
    consumer = Subscriber(real_redis, QM, record, settings, heartbeat=False)
    assert consumer.receive() is not None
    # When it is deleted
    done = delete_durables(real_redis, QM, "sales", "d%")
    # Then all three messages are counted lost, and no key of it is left
    assert [(d.sub_id, d.messages) for d in done.deleted] == [("sales$d1", 3)]
    assert done.summary() == "deleted 1 durable subscription (3 message(s))"
    assert real_redis.keys(keys.sub_queue(QM, "sales$d1") + "*") == []
    assert real_redis.exists(keys.sub_last_active(QM, "sales$d1")) == 0


def test_dry_run_lists_what_would_go_with_the_messages_held_and_deletes_nothing(real_redis):
    make(real_redis, "sales$d1", "sales$d2")
    real_redis.lpush(keys.sub_queue(QM, "sales$d1"), b"m1", b"m2")
    done = delete_durables(real_redis, QM, "sales", "%", dry_run=True)
    assert [(d.sub_id, d.messages) for d in done.deleted] == [("sales$d1", 2), ("sales$d2", 0)]
    assert done.summary() == "would delete 2 durable subscriptions (2 message(s))"
    assert ids(real_redis) == ["sales$d1", "sales$d2"]
    assert real_redis.llen(keys.sub_queue(QM, "sales$d1")) == 2


def test_a_corrupt_record_and_a_foreign_key_are_reported_and_left_while_the_rest_is_deleted(real_redis):
    make(real_redis, "sales$d1", "sales$d2")
    real_redis.hset(keys.subscriptions(QM), "sales$bad", "not json")
    real_redis.set(keys.sub_consumers(QM, "sales$d2"), "not a zset")
    done = delete_durables(real_redis, QM, "%", "%")
    assert [d.sub_id for d in done.deleted] == ["sales$d1"]
    assert any("sales$bad" in p and "not JSON" in p for p in done.problems)
    assert any(p.startswith("sales$d2: not deleted") and "foreign key" in p for p in done.problems)
    assert real_redis.hexists(keys.subscriptions(QM), "sales$bad")
    assert real_redis.hexists(keys.subscriptions(QM), "sales$d2")


@pytest.mark.parametrize("client_id,name", [("", "%"), ("%", ""), ("sales\\", "%")])
def test_an_empty_or_invalid_predicate_deletes_nothing(real_redis, client_id, name):
    make(real_redis, "sales$d1")
    with pytest.raises(InvalidSelector):
        delete_durables(real_redis, QM, client_id, name)
    assert ids(real_redis) == ["sales$d1"]


# --- idle durable expiry ---------------------------------------------------------------------------


def by_hand(client, sub_id: str, durable: bool = True) -> None:
    """A subscription record made as a service in another language makes it, created in 1970."""
    record = {"filter": "/a", "durable": durable, "created_ms": 0}
    client.hset(keys.subscriptions(QM), sub_id, json.dumps(record))


def later_than_creation() -> int:
    """A clock reading after every subscription these tests make (their created_ms is the real time)."""
    return int(time.time() * 1000) + 60_000


def test_a_durable_is_deleted_once_idle_for_the_expiry_after_its_last_consumer_closed(real_redis, settings):
    # Given a durable whose consumer closed at T, with a message left waiting
    t = later_than_creation()
    record = subscribe(real_redis, QM, "/a", "app", "d")
    real_redis.lpush(keys.sub_queue(QM, record.sub_id), b"m")
    Subscriber(real_redis, QM, record, settings, heartbeat=False, clock_ms=lambda: t).close()
    assert int(real_redis.get(keys.sub_last_active(QM, record.sub_id))) == t
    # When the expiry runs just before T + idle, Then it is kept
    assert expire_idle_durables(real_redis, QM, 5_000, now_ms=t + 4_999).deleted == []
    # When it runs at T + idle, Then it is deleted with its message, and its last-active time with it
    done = expire_idle_durables(real_redis, QM, 5_000, now_ms=t + 5_000)
    assert [(d.sub_id, d.messages) for d in done.deleted] == [("app$d", 1)]
    assert ids(real_redis) == []
    assert real_redis.exists(keys.sub_last_active(QM, record.sub_id)) == 0


def test_a_live_consumer_keeps_its_durable_and_its_lease_deadline_counts_as_use(real_redis, settings):
    t = later_than_creation()
    record = subscribe(real_redis, QM, "/a", "app", "d")
    Subscriber(real_redis, QM, record, settings, heartbeat=False, clock_ms=lambda: t)  # lease to t + 10 s
    lease = settings.consumer_lease_ms
    assert expire_idle_durables(real_redis, QM, 1_000, now_ms=t + lease).deleted == []
    # its lease ran out at t + lease and nobody came: idle from then on
    assert expire_idle_durables(real_redis, QM, 1_000, now_ms=t + lease + 999).deleted == []
    assert [
        d.sub_id for d in expire_idle_durables(real_redis, QM, 1_000, now_ms=t + lease + 1_000).deleted
    ] == ["app$d"]


def test_forgetting_a_dead_consumer_keeps_its_lease_deadline_as_the_last_use(real_redis, settings):
    t = later_than_creation()
    record = subscribe(real_redis, QM, "/a", "app", "d")
    consumer = Subscriber(real_redis, QM, record, settings, heartbeat=False, clock_ms=lambda: t)
    consumer.abandon()
    deadline = t + settings.consumer_lease_ms
    recover(real_redis, QM, record.sub_id, forget_ms=1_000, now_ms=deadline + 1_001)
    assert real_redis.zcard(keys.sub_consumers(QM, record.sub_id)) == 0
    assert int(real_redis.get(keys.sub_last_active(QM, record.sub_id))) == deadline


def test_a_durable_nobody_recorded_a_use_of_starts_its_idle_time_when_the_job_first_sees_it(real_redis):
    # Given a durable made by hand long ago (created_ms 0), never consumed
    by_hand(real_redis, "raw$d")
    # When the expiry first sees it, Then it is not deleted on information nobody wrote
    assert expire_idle_durables(real_redis, QM, 5_000, now_ms=1_000_000).deleted == []
    assert int(real_redis.get(keys.sub_last_active(QM, "raw$d"))) == 1_000_000
    assert expire_idle_durables(real_redis, QM, 5_000, now_ms=1_004_999).deleted == []
    assert [d.sub_id for d in expire_idle_durables(real_redis, QM, 5_000, now_ms=1_005_000).deleted] == [
        "raw$d"
    ]


def test_idle_expiry_never_touches_non_durables_and_zero_deletes_nothing(real_redis):
    by_hand(real_redis, "app$nd", durable=False)
    by_hand(real_redis, "app$d")
    real_redis.hset(keys.last_active(QM), mapping={"app$nd": 0, "app$d": 0})  # protocol 5's, still read
    assert expire_idle_durables(real_redis, QM, 0, now_ms=10**13).deleted == []
    assert [d.sub_id for d in expire_idle_durables(real_redis, QM, 1, now_ms=10**13).deleted] == ["app$d"]
    assert ids(real_redis) == ["app$nd"]


def test_the_removal_checks_idleness_again_so_a_consumer_attaching_meanwhile_keeps_it(real_redis, settings):
    t = later_than_creation()
    record = subscribe(real_redis, QM, "/a", "app", "d")
    Subscriber(real_redis, QM, record, settings, heartbeat=False, clock_ms=lambda: t)
    deadline = t + settings.consumer_lease_ms
    assert not remove_subscription(real_redis, QM, record.sub_id, deadline - 1, durable=True)
    assert ids(real_redis) == ["app$d"]
    assert remove_subscription(real_redis, QM, record.sub_id, deadline, durable=True) == Removal(True, 0)
    assert ids(real_redis) == []


def test_the_removal_checks_the_last_active_time_again_so_a_consumer_that_just_closed_keeps_it(
    real_redis, settings
):
    t = later_than_creation()
    record = subscribe(real_redis, QM, "/a", "app", "d")
    Subscriber(real_redis, QM, record, settings, heartbeat=False, clock_ms=lambda: t).close()
    assert not remove_subscription(real_redis, QM, record.sub_id, t - 1, durable=True)
    assert remove_subscription(real_redis, QM, record.sub_id, t, durable=True) == Removal(True, 0)


def test_the_idle_cutoff_never_removes_a_non_durable_in_durable_mode_nor_a_durable_otherwise(real_redis):
    by_hand(real_redis, "app$nd", durable=False)
    by_hand(real_redis, "app$d")
    assert not remove_subscription(real_redis, QM, "app$nd", 10**13, durable=True)
    assert not remove_subscription(real_redis, QM, "app$d", 10**13)
    assert ids(real_redis) == ["app$d", "app$nd"]


def test_the_periodic_expiry_job_deletes_idle_durables_under_rq_and_schedules_its_next_run(
    real_server, real_redis
):
    by_hand(real_redis, "gone$d")
    real_redis.hset(keys.last_active(QM), "gone$d", 0)  # its last consumer closed in 1970
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    job = queue.enqueue(periodic, real_server.url, QM, "expire_idle", 60_000, 3_600_000)
    SimpleWorker([queue], connection=real_redis).work(burst=True)
    assert job.get_status() == "finished"
    assert ids(real_redis) == []
    [following] = queue.scheduled_job_registry.get_job_ids()
    assert queue.fetch_job(following).args[2:] == ("expire_idle", 60_000, 3_600_000)


def test_a_foreign_last_active_key_is_named_and_never_written_over_by_the_expiry(real_redis):
    by_hand(real_redis, "app$d")
    by_hand(real_redis, "app$e")
    real_redis.rpush(keys.sub_last_active(QM, "app$d"), "not a string")
    done = expire_idle_durables(real_redis, QM, 1, now_ms=10**13)
    # its own subscription only is left alone, named; the others' expiry goes on
    assert done.deleted == [] and ids(real_redis) == ["app$d", "app$e"]
    assert done.problems == [
        "app$d: not looked at: foreign key: {TEST}:sub:app$d:last_active holds a list, not a string"
    ]
    assert real_redis.lrange(keys.sub_last_active(QM, "app$d"), 0, -1) == [b"not a string"]


def test_protocol_5s_shared_last_active_hash_of_another_type_stops_no_expiry(real_redis):
    # Given the shared hash of protocol 5 planted with another type (a subscriber could write it then)
    by_hand(real_redis, "app$d")
    real_redis.set(keys.last_active(QM), "planted")
    real_redis.set(keys.sub_last_active(QM, "app$d"), 0)
    # When the expiry runs, Then it reads each subscription's own record and goes on
    done = expire_idle_durables(real_redis, QM, 1, now_ms=10**13)
    assert [d.sub_id for d in done.deleted] == ["app$d"] and done.problems == []
