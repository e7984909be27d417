"""The consumer protocol as the function library ``broker`` (``broker.core.library``, docs/protocol.md),
on the real server: each function called as a client in another language would (one ``FCALL``, the
subscription's key), its errors before any write, loading and upgrading, the caller's ACL bound, and
the keys an untrusted subscriber writes being its own (issue 27).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from broker.clients.consumer import Subscriber
from broker.core import keys, library
from broker.core.errors import LibraryMissing
from broker.operations.acl import RoleSpec
from broker.operations.dead_letters import Selection, list_dead_letters, replay
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.subscriptions import subscribe
from tests.integration.test_security import not_refused, snapshot

QM = "TEST"
NOW = 1_800_000_000_000


def envelope(n: int, priority: int = 4, expiration: int = 0) -> bytes:
    header: dict[str, Any] = {"v": 6, "msgid": f"m{n}", "publisher": "p", "seq": n, "topic": "t"}
    header["entry_id"] = f"1-{n}"
    if priority != 4:
        header["priority"] = priority
    if expiration:
        header["expiration"] = expiration
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + f"body {n}".encode()


def queue(client: redis.Redis, sub_id: str, *envs: bytes) -> None:
    """Put ``envs`` in their bands as the workers do (LPUSH: the oldest ends rightmost), and ring."""
    for env in envs:
        header = json.loads(env.split(b"\n", 1)[0])
        client.lpush(keys.sub_band(QM, sub_id, header.get("priority", 4)), env)
    client.rpush(keys.sub_bell(QM, sub_id), "1")


def fcall(client: redis.Redis, name: str, sub_id: str, *args: Any) -> Any:
    return client.fcall(name, 1, keys.sub_queue(QM, sub_id), *args)


@pytest.fixture
def sub(real_redis) -> str:
    library.load_library(real_redis)
    return subscribe(real_redis, QM, "t", "app", "orders").sub_id


# --- each function ----------------------------------------------------------------------------


def test_broker_version_is_the_protocol_version(real_redis):
    library.load_library(real_redis)
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION


def test_receive_takes_the_highest_band_first_counts_expired_ones_as_its_own_and_acks(real_redis, sub):
    # Given a message of priority 4, one of priority 8, and one expired at NOW
    queue(real_redis, sub, envelope(1), envelope(2, priority=8), envelope(3, expiration=NOW))
    # When consumer c1 receives up to 10 (shared mode), with the clock at NOW
    got = fcall(real_redis, "broker_receive", sub, "c1", 10, 30_000, NOW, "shared", 1)
    # Then it gets priority 8, then 4, each delivered once; the expired one is counted in the
    # subscription's own key and kept in its own poison stream, and the broker's keys are untouched
    assert got[:2] == [b"ok", 1]
    assert got[2::2] == [envelope(2, priority=8), envelope(1)] and got[3::2] == [1, 1]
    assert real_redis.get(keys.sub_expired(QM, sub)) == b"1"
    [(_, poison)] = real_redis.xrange(keys.sub_poison(QM, sub))
    assert poison[b"envelope"] == envelope(3, expiration=NOW) and poison[b"dlq.subscription"] == sub.encode()
    assert not real_redis.exists(keys.dead_letter(QM), keys.expired(QM), keys.last_active(QM))
    assert real_redis.zscore(keys.sub_consumers(QM, sub), "c1") == NOW + 30_000
    # and acknowledging both removes them from its in-flight list
    assert fcall(real_redis, "broker_ack", sub, "c1", *got[2::2]) == 2
    assert real_redis.llen(keys.consumer_inflight(QM, sub, "c1")) == 0


def test_renew_only_renews_the_lease_and_browse_looks_without_taking(real_redis, sub):
    queue(real_redis, sub, envelope(1), envelope(2, expiration=NOW))
    assert fcall(real_redis, "broker_renew", sub, "c1", 5_000, NOW, "shared") == [b"ok", 0]
    assert real_redis.zscore(keys.sub_consumers(QM, sub), "c1") == NOW + 5_000
    assert real_redis.llen(keys.sub_queue(QM, sub)) == 2
    assert real_redis.fcall_ro("broker_browse", 1, keys.sub_queue(QM, sub), 10, NOW) == [envelope(1)]


def test_the_mode_comes_from_the_subscription_record_when_not_given(real_redis, sub):
    # Given the record names no mode (exclusive, as SubscriptionRecord reads it) and c1 holds it
    assert fcall(real_redis, "broker_receive", sub, "c1", 0, 30_000, NOW) == [b"ok", 0]
    # When another consumer asks without a mode, Then it is refused as a second exclusive consumer
    assert fcall(real_redis, "broker_receive", sub, "c2", 1, 30_000, NOW) == [b"standby", 0]
    assert real_redis.get(keys.sub_holder(QM, sub)) == b"c1"


def test_recover_gives_a_dead_consumers_messages_back_and_makes_poison_of_one_redelivered_too_often(
    real_redis, sub
):
    queue(real_redis, sub, envelope(1), envelope(2))
    fcall(real_redis, "broker_receive", sub, "c1", 2, 1_000, NOW, "shared")
    # When c1's lease has passed: recover with max_redeliveries 0 makes both poison messages
    got = fcall(real_redis, "broker_recover", sub, NOW + 1_002, 0, 100, 1)
    assert got == [1, 0, 2]
    assert real_redis.xlen(keys.sub_poison(QM, sub)) == 2 and not real_redis.exists(keys.dead_letter(QM))
    # and the consumer it forgot leaves its lease deadline as the subscription's last use
    assert real_redis.get(keys.sub_last_active(QM, sub)) == str(NOW + 1_000).encode()


def test_reject_moves_a_malformed_envelope_to_the_subscriptions_poison_stream(real_redis, sub):
    real_redis.lpush(keys.consumer_inflight(QM, sub, "c1"), b"no header")
    assert fcall(real_redis, "broker_reject", sub, "c1", 100, b"no header", "malformed envelope: x") == 1
    [(_, poison)] = real_redis.xrange(keys.sub_poison(QM, sub))
    assert poison[b"envelope"] == b"no header" and poison[b"dlq.reason"] == b"malformed envelope: x"


# --- errors, before any write -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "args", "planted"),
    [
        ("broker_receive", ("c1", 1, 1_000, NOW, "shared"), "bell"),
        ("broker_receive", ("c1", 1, 1_000, NOW, "shared", 1), "poison"),
        ("broker_ack", ("c1", b"x"), "redelivered"),
        ("broker_reject", ("c1", 100, b"x", "r"), "poison"),
        ("broker_recover", (NOW,), "last_active"),
    ],
)
def test_a_key_of_another_type_is_named_before_any_write(real_redis, sub, function, args, planted):
    # Given a message waiting, one in flight, and one of the subscription's keys of another type
    queue(real_redis, sub, envelope(1))
    real_redis.lpush(keys.consumer_inflight(QM, sub, "c1"), b"x")
    real_redis.zadd(keys.sub_consumers(QM, sub), {"c1": 0})
    key = f"{keys.sub_queue(QM, sub)}:{planted}"
    real_redis.delete(key)
    real_redis.sadd(key, "planted")
    before = snapshot(real_redis)
    # When the function is called, Then it answers the foreign key and nothing changed
    with pytest.raises(redis.ResponseError, match=f"BROKER foreign key: .*:{planted} holds a set"):
        fcall(real_redis, function, sub, *args)
    assert snapshot(real_redis) == before


@pytest.mark.parametrize(
    ("key", "args", "error"),
    [
        (keys.subscriptions(QM), ("c1",), "BROKER not a subscription key"),
        (keys.consumer_inflight(QM, "app$orders", "c1"), ("c1",), "BROKER not a subscription key"),
        (keys.sub_queue(QM, "app$orders"), ("c:1",), "BROKER bad argument: consumer id"),
        (keys.sub_queue(QM, "app$orders"), ("c1", "-1"), "BROKER bad argument: most messages"),
        (keys.sub_queue(QM, "app$orders"), ("c1", "1", "1000", "", "sometimes"), "BROKER bad argument: mode"),
    ],
)
def test_a_bad_key_or_argument_is_refused_before_any_write(real_redis, sub, key, args, error):
    queue(real_redis, sub, envelope(1))
    before = snapshot(real_redis)
    with pytest.raises(redis.ResponseError, match=error):
        real_redis.fcall("broker_receive", 1, key, *args)
    assert snapshot(real_redis) == before


# --- loading ----------------------------------------------------------------------------------


def test_the_library_is_loaded_when_missing_or_older_and_left_when_the_same_or_newer(real_redis):
    real_redis.function_flush()
    assert library.load_library(real_redis) == 1
    assert library.load_library(real_redis) == 0  # the same code: not loaded again
    older = library.library_source().replace(
        f"local PROTOCOL_VERSION = {keys.PROTOCOL_VERSION}", "local PROTOCOL_VERSION = 1"
    )
    real_redis.function_load(older, replace=True)
    assert library.load_library(real_redis) == 1
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION
    newer = library.library_source().replace(
        f"local PROTOCOL_VERSION = {keys.PROTOCOL_VERSION}", "local PROTOCOL_VERSION = 999"
    )
    real_redis.function_load(newer, replace=True)
    assert library.load_library(real_redis) == 0  # a later broker's: left alone
    assert real_redis.fcall_ro("broker_version", 0) == 999
    real_redis.function_load(library.library_source(), replace=True)


def test_a_worker_loads_the_library_when_it_starts(real_redis, settings):
    real_redis.function_flush()
    make_workers(real_redis, settings, 1)
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION


def test_a_subscriber_finding_no_library_is_told_who_loads_it(real_redis, settings, users, sub):
    client = users.add("lib-sub", RoleSpec("subscriber", client_id="app"))
    real_redis.function_flush()
    record = subscribe(real_redis, QM, "t", "app", "other")
    with pytest.raises(LibraryMissing, match=r"start a worker \(broker worker\) or the server"):
        Subscriber(client, QM, record, settings, consumer_id="c1", heartbeat=False)
    # while an administrator's consumer loads it itself
    Subscriber(real_redis, QM, record, settings, consumer_id="c1", heartbeat=False).close()
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION


# --- the caller's ACL -------------------------------------------------------------------------


def test_a_subscriber_calls_the_library_on_its_own_subscriptions_only_and_runs_no_script(
    real_redis, users, sub
):
    # Given a subscriber user of client "app", and a subscription of client "bob" with a message
    client = users.add("lib-sub", RoleSpec("subscriber", client_id="app"))
    bob = subscribe(real_redis, QM, "t", "bob", "orders").sub_id
    queue(real_redis, bob, envelope(1))
    queue(real_redis, sub, envelope(2))
    # When it calls the library on bob's subscription, runs Lua of its own or loads functions,
    # Then each is refused by its ACL user, and nothing on the server changed
    forbidden = [
        ("FCALL", "broker_receive", "1", keys.sub_queue(QM, bob), "c1", "10", "1000", "", "shared"),
        ("FCALL", "broker_recover", "1", keys.sub_queue(QM, bob), "", "0"),
        ("FCALL_RO", "broker_browse", "1", keys.sub_queue(QM, bob)),
        ("EVAL", "return 1", "0"),
        ("SCRIPT", "LOAD", "return 1"),
        ("FUNCTION", "LOAD", "REPLACE", "#!lua name=broker\nredis.register_function('x', function() end)"),
        ("FUNCTION", "FLUSH"),
    ]
    assert not_refused(real_redis, client, forbidden) == []
    # while on its own it receives with FCALL
    got = client.fcall("broker_receive", 1, keys.sub_queue(QM, sub), "c1", 10, 1_000, "", "shared")
    assert got[:2] == [b"ok", 0] and got[2] == envelope(2)
    assert client.fcall_ro("broker_browse", 1, keys.sub_queue(QM, sub)) == []


@pytest.mark.parametrize(
    "command",
    [
        ("XTRIM", keys.dead_letter(QM), "MAXLEN", "0"),
        ("DEL", keys.dead_letter(QM)),
        ("SET", keys.dead_letter(QM), "planted"),
        ("XADD", keys.dead_letter(QM), "*", "publisher", "svc-7", "principal", "pub1", "dlq.reason", "x"),
        ("SET", keys.last_active(QM), "planted"),
        ("DEL", keys.last_active(QM)),
        ("SET", keys.expired(QM), "planted"),
        ("HSET", keys.expired(QM), "bob$orders", "1"),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_subscriber_writes_none_of_the_brokers_shared_keys(real_redis, users, command):
    # Given a dead letter the broker wrote
    real_redis.xadd(keys.dead_letter(QM), {"publisher": "p", "topic": "t", "dlq.reason": "refused"})
    client = users.add("lib-sub", RoleSpec("subscriber", client_id="app"))
    # When a subscriber user tries one of issue 27's probes, Then it is refused and nothing changed
    assert not_refused(real_redis, client, [command]) == []
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_a_subscriber_planting_its_own_keys_stops_nobody_else(real_redis, settings, users, sub):
    # Given another client's subscription with a message waiting
    client = users.add("lib-sub", RoleSpec("subscriber", client_id="app"))
    bob = subscribe(real_redis, QM, "t", "bob", "orders")
    queue(real_redis, bob.sub_id, envelope(1))
    # When the subscriber plants wrong types in every key its own consumers write
    for key in (keys.sub_poison(QM, sub), keys.sub_expired(QM, sub), keys.sub_last_active(QM, sub)):
        client.delete(key)
        client.sadd(key, "planted")
    # Then bob's consumer receives, and status and the dead-letter queue still read
    consumer = Subscriber(real_redis, QM, bob, settings, consumer_id="b1", heartbeat=False)
    assert [d.raw for d in consumer.receive_many(5)] == [envelope(1)]
    rows = {row.id: row for row in status(real_redis, QM).subscriptions}
    assert rows[bob.sub_id].expired == 0 and rows[sub].expired is None
    _, problems = list_dead_letters(real_redis, QM)
    assert problems == [f"not read: foreign key: {keys.sub_poison(QM, sub)} holds a set, not a stream"]


# --- poison messages in the dead-letter queue -------------------------------------------------


def test_a_forged_entry_in_a_poison_stream_is_never_republished_nor_queued_to_another_subscription(
    real_redis, settings, sub
):
    # Given a subscriber wrote in its own poison stream a publication's fields, and an envelope
    # that names another subscription
    bob = subscribe(real_redis, QM, "t", "bob", "orders").sub_id
    poison = keys.sub_poison(QM, sub)
    real_redis.xadd(poison, {"publisher": "svc-7", "principal": "pub1", "topic": "t", "dlq.entry_id": "1-1"})
    real_redis.xadd(poison, {"envelope": envelope(5), "dlq.reason": "x", "dlq.subscription": bob})
    # When an operator lists and replays every dead letter
    letters, _ = list_dead_letters(real_redis, QM)
    assert [(letter.source, letter.subscription) for letter in letters] == [(sub, sub), (sub, sub)]
    report = replay(real_redis, QM, Selection(everything=True))
    # Then the publication is not re-published, and the envelope goes back to its own subscription
    assert [why for _, why in report.skipped] == [
        f"not a poison message (no envelope) in subscription {sub}'s poison stream, which its "
        "consumers write: never re-published; purge it"
    ]
    assert report.requeued == [letters[1].id]
    assert queue_messages(real_redis, QM, bob) == []
    assert [m.msgid for m in queue_messages(real_redis, QM, sub)] == ["m5"]
    assert real_redis.xlen(keys.publish_stream(QM)) == 0
    drain(make_workers(real_redis, settings, 1))


def test_protocol_5s_shared_expired_counts_are_still_shown(real_redis, sub):
    real_redis.hset(keys.expired(QM), sub, 3)
    real_redis.set(keys.sub_expired(QM, sub), 2)
    [row] = [row for row in status(real_redis, QM).subscriptions if row.id == sub]
    assert row.expired == 5


def test_the_metrics_and_the_status_count_the_poison_messages_of_every_subscription(
    real_redis, settings, sub
):
    from prometheus_client import CollectorRegistry, generate_latest

    from broker.operations.metrics import RedisCollector

    # Given two poison messages in one subscription's poison stream, one in another's
    bob = subscribe(real_redis, QM, "t", "bob", "orders").sub_id
    for sub_id, n in ((sub, 2), (bob, 1)):
        for i in range(n):
            real_redis.xadd(keys.sub_poison(QM, sub_id), {"envelope": envelope(i), "dlq.reason": "x"})
    registry = CollectorRegistry()
    registry.register(RedisCollector(real_redis, settings.model_copy(update={"qm": QM})))
    # When Prometheus scrapes, Then the gauge counts all three
    assert "broker_poison_messages 3.0" in generate_latest(registry).decode().splitlines()
    # and broker status shows them too
    assert status(real_redis, QM).poison == 3


def test_a_worker_user_loads_the_library_but_may_not_flush_or_delete_functions(real_redis, settings, users):
    # Given no library, and a worker ACL user
    real_redis.function_flush()
    client = users.add("lib-wk", RoleSpec("worker"))
    # When a worker starts as that user, Then it loads the library
    make_workers(client, settings, 1)
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION
    # and it may not remove functions
    forbidden = [("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE", "broker"), ("SCRIPT", "FLUSH")]
    assert not_refused(real_redis, client, forbidden) == []
    assert real_redis.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION


def test_purging_by_subscription_deletes_its_poison_messages_only(real_redis, sub):
    from broker.operations.dead_letters import purge

    bob = subscribe(real_redis, QM, "t", "bob", "orders").sub_id
    for sub_id in (sub, sub, bob):
        real_redis.xadd(keys.sub_poison(QM, sub_id), {"envelope": envelope(1), "dlq.reason": "x"})
    real_redis.xadd(keys.dead_letter(QM), {"publisher": "p", "topic": "t", "dlq.reason": "refused"})
    assert purge(real_redis, QM, Selection(subscription=sub)) == 2
    assert real_redis.xlen(keys.sub_poison(QM, sub)) == 0
    assert real_redis.xlen(keys.sub_poison(QM, bob)) == 1 and real_redis.xlen(keys.dead_letter(QM)) == 1
