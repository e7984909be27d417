"""Slow-subscriber conditions on a real server (issue 12; SwiftMQ's Topic Manager, seed 003).

A condition is defined per root topic; during a publication's unit of work, a
subscriber queue at or past ``max_messages`` gets no copy of a publication whose
delivery mode the condition looks at, the others get theirs, and the subscriber
gets publications again once its queue is below ``max_messages``. The disconnect
options remove the matched subscription right after the unit of work.
"""

from __future__ import annotations

import json
import logging

import pytest

from broker.core import keys
from broker.core.config import SlowSubscriberCondition
from broker.core.models import publication_fields
from broker.operations.status import status
from broker.testing import drain, make_workers
from broker.topics.subscriptions import remove_subscription, subscribe
from broker.topics.topic_objects import Attributes, define
from tests.conftest import QM


def _fill(client, sub_id: str, depth: int) -> None:
    """Put ``depth`` placeholder messages in a subscription's default band (no consumer takes them)."""
    client.lpush(keys.sub_queue(QM, sub_id), *[b"old"] * depth)


def _depth(client, sub_id: str) -> int:
    return sum(client.llen(band) for band in keys.sub_bands(QM, sub_id))


def _publish(client, topic: str, msgid: str, persistent: bool) -> None:
    client.xadd(
        keys.publish_stream(QM),
        publication_fields("p", topic, b"x", msgid=msgid, reply=True, persistent=persistent),
    )


def _result(client, msgid: str) -> dict:
    raw = client.lpop(keys.reply(QM, "p", msgid))
    assert raw is not None, f"no result for {msgid}"
    return json.loads(raw)


def _counter(client, key: str, sub_id: str) -> int:
    return int(client.hget(key, sub_id) or 0)


@pytest.mark.parametrize(
    ("scheme", "bloomberg", "reuters"),
    [("swiftmq", "feed.bloomberg", "feed.reuters"), ("mqtt", "feed/bloomberg", "feed/reuters")],
)
def test_the_seed_example(real_redis, settings, scheme, bloomberg, reuters):
    # Given the seed's two conditions and topics:
    #   <topic name="feed" max-messages="100" persistence-mode="non_persistent" subscription-type="local"/>
    #   <topic name="events" max-messages="300" persistence-mode="all" subscription-type="remote"/>
    conditions = [
        SlowSubscriberCondition(
            name="feed", max_messages=100, persistence_mode="non_persistent", subscription_type="local"
        ),
        SlowSubscriberCondition(
            name="events", max_messages=300, persistence_mode="all", subscription_type="remote"
        ),
    ]
    settings = settings.model_copy(
        update={
            "topic_scheme": scheme,
            "topics": ["feed", bloomberg, reuters, "events"],
            "slow_subscriber_conditions": conditions,
        }
    )
    slow = subscribe(real_redis, QM, bloomberg, "trader", "slow").sub_id
    fast = subscribe(real_redis, QM, bloomberg, "trader", "fast").sub_id
    reuters_sub = subscribe(real_redis, QM, reuters, "trader", "reuters").sub_id
    events = subscribe(real_redis, QM, "events", "ops", "events").sub_id
    _fill(real_redis, slow, 99)
    _fill(real_redis, events, 400)  # past the events condition's 300, but it is for remote subscriptions
    workers = make_workers(real_redis, settings, 1)

    def publish(topic: str, msgid: str, persistent: bool) -> dict:
        _publish(real_redis, topic, msgid, persistent)
        drain(workers)
        return _result(real_redis, msgid)

    # The slow subscriber at 99 still gets a non-persistent feed message (now 100) ...
    assert publish(bloomberg, "n1", persistent=False)["subscriptions"] == 2
    assert _depth(real_redis, slow) == 100
    # ... and at 100 it stops getting them; the fast one still does, and it is "delivered"
    for msgid in ("n2", "n3"):
        result = publish(bloomberg, msgid, persistent=False)
        assert (result["status"], result["subscriptions"]) == ("delivered", 1)
    assert _depth(real_redis, slow) == 100
    assert _counter(real_redis, keys.skipped(QM), slow) == 2
    assert _counter(real_redis, keys.slow(QM), slow) == 2
    # A persistent feed message is not for this condition: the slow subscriber gets it
    assert publish(bloomberg, "p1", persistent=True)["subscriptions"] == 2
    assert _depth(real_redis, slow) == 101
    # Another topic under the same root: the same rule, for another subscription
    assert publish(reuters, "r1", persistent=False)["subscriptions"] == 1
    # Once the slow subscriber has taken 2 messages (99 left), it gets them again
    real_redis.rpop(keys.sub_queue(QM, slow), 2)
    assert publish(bloomberg, "n4", persistent=False)["subscriptions"] == 2
    assert _depth(real_redis, slow) == 100
    # The fast subscriber got every feed message
    assert _depth(real_redis, fast) == 5
    assert _counter(real_redis, keys.skipped(QM), fast) == 0
    # events: a remote condition never holds back a local subscriber, even past 300
    for i in range(3):
        assert publish("events", f"e{i}", persistent=i == 0)["subscriptions"] == 1
    assert _depth(real_redis, events) == 403
    assert _counter(real_redis, keys.skipped(QM), events) == 0
    # The operator sees the withheld deliveries
    rows = {row.id: row for row in status(real_redis, QM).subscriptions}
    assert (rows[slow].skipped, rows[slow].slow) == (2, 2)
    assert (rows[fast].slow, rows[reuters_sub].slow, rows[events].slow) == (0, 0, 0)


def test_the_depth_counts_the_publications_of_the_same_batch(real_redis, settings):
    # Given a slow-subscriber condition at 100 and a queue at 98
    settings = settings.model_copy(
        update={"slow_subscriber_conditions": [SlowSubscriberCondition(name="feed", max_messages=100)]}
    )
    sub = subscribe(real_redis, QM, "feed/x", "c", "slow").sub_id
    _fill(real_redis, sub, 98)
    # When three non-persistent publications are handled in one unit-of-work batch
    for i in range(3):
        _publish(real_redis, "feed/x", f"m{i}", persistent=False)
    assert make_workers(real_redis, settings, 1)[0].run_once() == 3
    # Then the first two bring it to 100 and the third is withheld
    assert [_result(real_redis, f"m{i}")["subscriptions"] for i in range(3)] == [1, 1, 0]
    assert _depth(real_redis, sub) == 100
    # And a message of priority 9 (another band of the same subscription) counts the same way
    _publish(real_redis, "feed/x", "hi", persistent=False)
    real_redis.xadd(
        keys.publish_stream(QM),
        publication_fields("p", "feed/x", b"x", msgid="p9", reply=True, persistent=False, priority=9),
    )
    drain(make_workers(real_redis, settings, 1))
    assert _result(real_redis, "p9")["subscriptions"] == 0
    assert real_redis.llen(keys.sub_band(QM, sub, 9)) == 0


def test_a_withheld_subscriber_is_not_the_slowest_for_flow_control(real_redis, settings):
    # Given flow control from depth 10 and a condition at 50: the slow queue is withheld
    settings = settings.model_copy(
        update={
            "flow_control_start_depth": 10,
            "flow_control_full_depth": 110,
            "flow_control_max_delay_ms": 60_000,
            "slow_subscriber_conditions": [SlowSubscriberCondition(name="feed", max_messages=50)],
        }
    )
    slow = subscribe(real_redis, QM, "feed/x", "c", "slow").sub_id
    subscribe(real_redis, QM, "feed/x", "c", "fast")
    _fill(real_redis, slow, 80)
    _publish(real_redis, "feed/x", "m1", persistent=False)
    drain(make_workers(real_redis, settings, 1))
    # Then the publisher keeps its pace: the delay is the fast subscriber's (0), not the slow one's
    result = _result(real_redis, "m1")
    assert (result["subscriptions"], result["flow_control_delay_ms"]) == (1, 0)
    assert real_redis.exists(keys.flow_key(QM, "p")) == 0


def test_a_slow_subscriber_is_withheld_before_maxdepth_refuses_the_publication(real_redis, settings):
    # Given a node with MAXDEPTH 5 and NPMSGDLV(ALL): one full queue refuses a publication as a whole
    define(real_redis, QM, "B", "/B", Attributes(maxdepth=5, npmsgdlv="ALL"))
    slow = subscribe(real_redis, QM, "/B/x", "c", "slow").sub_id
    subscribe(real_redis, QM, "/B/x", "c", "fast")
    _fill(real_redis, slow, 5)
    _publish(real_redis, "/B/x", "before", persistent=False)
    drain(make_workers(real_redis, settings, 1))
    assert _result(real_redis, "before")["status"] == "refused"
    # When a condition on the root topic "" (topics beginning with "/") says 3 messages is slow
    settings = settings.model_copy(
        update={"slow_subscriber_conditions": [SlowSubscriberCondition(name="", max_messages=3)]}
    )
    _publish(real_redis, "/B/x", "after", persistent=False)
    drain(make_workers(real_redis, settings, 1))
    # Then the slow subscriber is no recipient, and the fast one gets it
    result = _result(real_redis, "after")
    assert (result["status"], result["subscriptions"]) == ("delivered", 1)
    assert _counter(real_redis, keys.slow(QM), slow) == 1


def _llen_calls(client) -> int:
    """Calls that read queue depths: LLEN, and EXISTS (commit.lua asks once whether a watched
    subscription has other priority bands)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("llen", "exists"))


def test_a_condition_on_another_root_topic_costs_nothing(real_redis, settings):
    # Flow control off: it reads queue lengths too (each queue's LLEN is read once per call anyway)
    base = settings.model_copy(update={"flowcontrol_enabled": False})
    sub = subscribe(real_redis, QM, "quotes/x", "c", "s").sub_id
    _fill(real_redis, sub, 10)

    def llen_calls_of_one_publication(conditions: list[SlowSubscriberCondition], msgid: str) -> int:
        workers = make_workers(
            real_redis, base.model_copy(update={"slow_subscriber_conditions": conditions}), 1
        )
        drain(workers)
        workers[0].sweep_subscriptions = list  # its time-driven reads are not the unit of work's
        _publish(real_redis, "quotes/x", msgid, persistent=False)
        real_redis.config_resetstat()
        drain(workers)
        calls = _llen_calls(real_redis)
        assert _result(real_redis, msgid)["subscriptions"] == 1
        return calls

    none = llen_calls_of_one_publication([], "a")
    other_root = llen_calls_of_one_publication([SlowSubscriberCondition(name="feed", max_messages=5)], "b")
    this_root = llen_calls_of_one_publication(
        [SlowSubscriberCondition(name="quotes", max_messages=10**6)], "c"
    )
    assert other_root == none
    assert this_root > none  # the measure can tell: the subscription's depth is read
    assert _counter(real_redis, keys.skipped(QM), sub) == 0


def test_disconnect_non_durable_removes_only_non_durable_subscriptions(real_redis, settings, caplog):
    condition = SlowSubscriberCondition(name="feed", max_messages=10, disconnect_non_durable_subscriber=True)
    settings = settings.model_copy(update={"slow_subscriber_conditions": [condition]})
    transient = subscribe(real_redis, QM, "feed/+", "c").sub_id  # non-durable
    durable = subscribe(real_redis, QM, "feed/+", "c", "keep").sub_id
    fast = subscribe(real_redis, QM, "feed/x", "c", "fast").sub_id
    _fill(real_redis, transient, 12)
    _fill(real_redis, durable, 10)
    worker = make_workers(real_redis, settings, 1)[0]
    _publish(real_redis, "feed/x", "m1", persistent=False)
    with caplog.at_level(logging.WARNING, logger="broker.worker"):
        drain([worker])
    # The publication reached the fast subscriber only
    result = _result(real_redis, "m1")
    assert (result["status"], result["subscriptions"]) == ("delivered", 1)
    # The non-durable slow subscription is gone with its queue; the durable one stays (withheld)
    subs = real_redis.hkeys(keys.subscriptions(QM))
    assert sorted(s.decode() for s in subs) == sorted([durable, fast])
    assert real_redis.exists(*keys.sub_bands(QM, transient)) == 0
    assert _depth(real_redis, durable) == 10
    assert _counter(real_redis, keys.slow(QM), durable) == 1
    assert worker.counts.get("disconnected") == 1
    (line,) = [r.getMessage() for r in caplog.records if "slow subscriber" in r.getMessage()]
    assert f"non-durable subscription {transient} (filter 'feed/+')" in line
    assert "12 messages lost" in line
    # And the next publication does not touch it again
    _publish(real_redis, "feed/x", "m2", persistent=False)
    drain([worker])
    assert _result(real_redis, "m2")["subscriptions"] == 1
    assert worker.counts.get("disconnected") == 1


def test_disconnect_delete_durable_deletes_it_with_all_its_messages(real_redis, settings, caplog):
    condition = SlowSubscriberCondition(
        name="feed", max_messages=10, persistence_mode="all", disconnect_delete_durable_subscriber=True
    )
    settings = settings.model_copy(update={"slow_subscriber_conditions": [condition]})
    dead = subscribe(real_redis, QM, "feed/x", "c", "dead").sub_id
    transient = subscribe(real_redis, QM, "feed/x", "c").sub_id  # non-durable: only withheld
    _fill(real_redis, dead, 10)
    _fill(real_redis, transient, 10)
    # a consumer of the dead subscription holds a message in flight
    real_redis.zadd(keys.sub_consumers(QM, dead), {"c1": 1})
    real_redis.lpush(keys.consumer_inflight(QM, dead, "c1"), b"taken")
    real_redis.lpush(keys.sub_band(QM, dead, 7), b"old high")
    _publish(real_redis, "feed/x", "m1", persistent=True)
    with caplog.at_level(logging.WARNING, logger="broker.worker"):
        drain(make_workers(real_redis, settings, 1))
    assert _result(real_redis, "m1")["subscriptions"] == 0
    # Every key of the durable subscription is gone; the non-durable one is still there
    assert real_redis.hexists(keys.subscriptions(QM), dead) == 0
    assert list(real_redis.scan_iter(match=keys.sub_queue(QM, dead).replace("$", "?") + "*")) == []
    assert real_redis.hexists(keys.subscriptions(QM), transient) == 1
    assert _depth(real_redis, transient) == 10
    (line,) = [r.getMessage() for r in caplog.records if "slow subscriber" in r.getMessage()]
    assert f"durable subscription {dead} (filter 'feed/x')" in line
    assert "12 messages lost" in line  # 11 waiting in two bands + 1 in flight


def test_a_disconnect_that_fails_is_logged_and_the_worker_goes_on(real_redis, settings, caplog):
    condition = SlowSubscriberCondition(name="feed", max_messages=5, disconnect_non_durable_subscriber=True)
    settings = settings.model_copy(update={"slow_subscriber_conditions": [condition]})
    transient = subscribe(real_redis, QM, "feed/x", "c").sub_id
    _fill(real_redis, transient, 5)
    real_redis.set(keys.sub_consumers(QM, transient), "foreign")  # remove_subscription.lua refuses
    worker = make_workers(real_redis, settings, 1)[0]
    _publish(real_redis, "feed/x", "m1", persistent=False)
    with caplog.at_level(logging.WARNING, logger="broker.worker"):
        drain([worker])
    assert _result(real_redis, "m1")["status"] == "delivered"
    assert real_redis.hexists(keys.subscriptions(QM), transient) == 1
    assert any(
        f"could not disconnect slow subscription {transient}" in r.getMessage() for r in caplog.records
    )
    # and it goes on working
    _publish(real_redis, "feed/x", "m2", persistent=True)
    drain([worker])
    assert _result(real_redis, "m2")["subscriptions"] == 1


def test_remove_subscription_with_a_least_depth_removes_only_a_queue_that_deep(real_redis):
    sub = subscribe(real_redis, QM, "/a", "c", "d").sub_id
    _fill(real_redis, sub, 5)
    kept = remove_subscription(real_redis, QM, sub, min_depth=6)
    assert not kept and (kept.removed, kept.messages) == (False, 5)
    assert real_redis.hexists(keys.subscriptions(QM), sub) == 1
    removed = remove_subscription(real_redis, QM, sub, min_depth=5)
    assert removed and removed.messages == 5
    assert real_redis.hexists(keys.subscriptions(QM), sub) == 0
