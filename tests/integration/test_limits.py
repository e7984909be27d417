"""Limits against abuse on the real server (issue 14 item 4): each refused with a clear reason, nothing lost.

A publication over a limit is dead-lettered with the reason and the publisher that waits is told;
a subscribe or a consumer over a limit is refused with an error naming the setting, writing
nothing; ``default_maxdepth`` bounds the queues no topic object bounds. A full server
(``maxmemory``) is in ``test_memory_full.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.connection import connect
from broker.core.errors import InvalidTopicFilter, TooManyConsumers, TooManySubscriptions
from broker.core.models import publication_fields
from broker.operations.status import topic_status
from broker.testing import drain, make_workers, queue_messages, work_while
from broker.topics.subscriptions import subscribe, unsubscribe
from broker.topics.topic_objects import BASE, Attributes, alter, define
from tests.conftest import QM


def _dead_letters(client) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(keys.dead_letter(QM))]


def _published_and_result(client, settings, publish) -> object:
    """Run ``publish`` (it waits for its result) while a worker handles rounds; returns what it returned."""
    worker = make_workers(client, settings, 1)[0]
    out: list[object] = []
    work_while(worker, lambda: out.append(publish()))
    return out[0]


# -- properties --------------------------------------------------------------------------------


def test_properties_over_the_limit_are_refused_to_the_publisher_dead_lettered_and_the_next_goes_on(
    real_redis, settings
):
    settings = settings.model_copy(update={"max_properties_bytes": 100})
    subscribe(real_redis, QM, "t/#", "app", "a")
    publisher = Publisher(real_redis, QM, "p")
    big = {"note": "x" * 200}
    refused = _published_and_result(
        real_redis, settings, lambda: publisher.publish("t/1", b"big", properties=big, wait=True)
    )
    assert refused.status == "refused"
    assert refused.reason.startswith("properties of 211 bytes (the 'props' field) are larger than the limit")
    assert "(max_properties_bytes)" in refused.reason
    delivered = _published_and_result(
        real_redis, settings, lambda: publisher.publish("t/2", b"ok", properties={"n": 1}, wait=True)
    )
    assert (delivered.status, delivered.subscriptions) == ("delivered", 1)
    # nothing lost: the refused one is in the dead-letter stream with its reason and its properties
    (dead,) = _dead_letters(real_redis)
    assert b"max_properties_bytes" in dead[b"dlq.reason"] and dead[b"body"] == b"big"
    assert dead[b"props"] == b'{"note":"' + b"x" * 200 + b'"}'
    assert [m.body for m in queue_messages(real_redis, QM, "app$a")] == [b"ok"]


def test_properties_larger_than_max_body_bytes_are_not_copied_into_the_dead_letter(real_redis, settings):
    settings = settings.model_copy(update={"max_properties_bytes": 100, "max_body_bytes": 1_000})
    fields = publication_fields("p", "t/1", b"b", properties={"k": "x" * 5_000})
    real_redis.xadd(keys.publish_stream(QM), fields)
    drain(make_workers(real_redis, settings, 1))
    (dead,) = _dead_letters(real_redis)
    assert b"props" not in dead and dead[b"dlq.props_bytes"] == str(len(fields["props"])).encode()
    assert dead[b"body"] == b"b"  # small fields are kept; the entry id refers to the whole entry
    assert b"max_properties_bytes" in dead[b"dlq.reason"]


# -- topics and filters ------------------------------------------------------------------------


def test_a_publication_over_the_topic_limits_is_refused_and_one_at_the_limits_delivered(real_redis, settings):
    settings = settings.model_copy(update={"max_topic_bytes": 20, "max_topic_levels": 4})
    subscribe(real_redis, QM, "#", "app", "all")
    publisher = Publisher(real_redis, QM, "p")  # validates the MQTT rules only: the broker has the limits
    for topic, why in (
        ("a/b/c/d/e", "the topic has 5 levels, more than the broker allows (max_topic_levels 4)"),
        ("a/" + "x" * 19, "the topic is 21 bytes long, more than the broker allows (max_topic_bytes 20)"),
    ):
        result = _published_and_result(real_redis, settings, lambda t=topic: publisher.publish(t, wait=True))
        assert (result.status, result.reason, result.suggestion) == ("refused", why, None)
    for topic in ("a/b/c/d", "a/" + "x" * 18):
        result = _published_and_result(real_redis, settings, lambda t=topic: publisher.publish(t, wait=True))
        assert result.status == "delivered", result.reason
    assert [d[b"topic"] for d in _dead_letters(real_redis)] == [b"a/b/c/d/e", b"a/" + b"x" * 19]
    assert len(queue_messages(real_redis, QM, "app$all")) == 2


def test_a_subscription_over_the_topic_limits_is_refused_naming_the_limit_and_nothing_is_made(real_redis):
    with pytest.raises(InvalidTopicFilter) as refused:
        subscribe(real_redis, QM, "a/+/c/#", "app", "d", max_topic_levels=3)
    assert str(refused.value) == (
        "invalid topic filter 'a/+/c/#': it has 4 levels, more than the broker allows (max_topic_levels 3)"
    )
    with pytest.raises(InvalidTopicFilter, match=r"5002 bytes long, more than the broker allows"):
        subscribe(real_redis, QM, "a/" + "x" * 5_000, "app", "d")  # the default, 4,096 bytes
    assert real_redis.hlen(keys.subscriptions(QM)) == 0
    assert subscribe(real_redis, QM, "a/+/#", "app", "d", max_topic_levels=3).sub_id == "app$d"


def test_swiftmq_topics_count_dot_nodes_for_publications_and_subscriptions(real_redis, settings):
    settings = settings.model_copy(update={"topic_scheme": "swiftmq", "max_topic_levels": 2})
    with pytest.raises(InvalidTopicFilter, match=r"it has 3 nodes, .*\(max_topic_levels 2\)"):
        subscribe(real_redis, QM, "iit.%.US", "app", "us", scheme="swiftmq", max_topic_levels=2)
    subscribe(real_redis, QM, "iit.sales", "app", "sales", scheme="swiftmq", max_topic_levels=2)
    publisher = Publisher(real_redis, QM, "p", scheme="swiftmq")
    deep = _published_and_result(real_redis, settings, lambda: publisher.publish("iit.sales.US", wait=True))
    assert deep.status == "refused" and deep.reason.startswith("the topic has 3 nodes")
    ok = _published_and_result(real_redis, settings, lambda: publisher.publish("iit.sales", wait=True))
    assert (ok.status, ok.subscriptions) == ("delivered", 1)


# -- subscriptions per client ----------------------------------------------------------------


def test_subscriptions_per_client_are_counted_in_the_subscribe_transaction_even_when_racing(
    real_server, real_redis
):
    # Given 16 subscribes of one client id at once, with room for 5
    limit, made, refused = 5, [], []
    barrier = threading.Barrier(16)

    def one(i: int) -> None:
        client = connect(real_server.url)
        barrier.wait()
        try:
            made.append(subscribe(client, QM, "t/#", "app", f"s{i}", max_subscriptions_per_client=limit))
        except TooManySubscriptions as exc:
            refused.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then exactly 5 exist, and every other one was told why
    assert len(made) == limit and len(refused) == 16 - limit
    assert sorted(real_redis.hkeys(keys.subscriptions(QM))) == sorted(r.sub_id.encode() for r in made)
    # attaching to an existing one is never refused; after an unsubscribe there is room again
    assert subscribe(
        real_redis, QM, "t/#", "app", made[0].sub_id.split("$")[1], max_subscriptions_per_client=limit
    )
    unsubscribe(real_redis, QM, made[0].sub_id)
    subscribe(real_redis, QM, "t/#", "app", "again", max_subscriptions_per_client=limit)


# -- consumers per subscription ----------------------------------------------------------------


def test_a_consumer_beyond_the_limit_is_refused_writing_nothing_and_joins_once_a_lease_runs_out(
    real_redis, settings
):
    settings = settings.model_copy(update={"max_consumers_per_subscription": 2, "consumer_lease_ms": 10_000})
    record = subscribe(real_redis, QM, "t/#", "app", "work", shared=True)
    now = [1_000_000]

    def consumer(name: str) -> Subscriber:
        return Subscriber(
            real_redis, QM, record, settings, consumer_id=name, heartbeat=False, clock_ms=lambda: now[0]
        )

    first, second = consumer("c1"), consumer("c2")
    consumers_key = keys.sub_consumers(QM, record.sub_id)
    with pytest.raises(TooManyConsumers) as refused:
        consumer("c3")
    assert refused.value.exit_code == 3
    assert str(refused.value) == (
        "subscription 'app$work' has 2 live consumers already, the most allowed "
        "(max_consumers_per_subscription); close one, or wait for a dead one's lease to run out"
    )
    assert sorted(real_redis.zrange(consumers_key, 0, -1)) == [b"c1", b"c2"]  # c3 wrote nothing
    # the consumers already there are never refused
    now[0] += 5_000
    first.heartbeat()
    second.receive_many(10)
    # once c1 is gone (closed) there is room; once c2's lease runs out, too
    first.close()
    third = consumer("c3")
    with pytest.raises(TooManyConsumers):
        consumer("c4")
    now[0] += 20_000  # c2 and c3 stop renewing: their leases run out
    fourth = consumer("c4")
    assert fourth.receive_many(1) == []
    third.abandon()
    second.abandon()
    fourth.close()


# -- default MAXDEPTH --------------------------------------------------------------------------


def test_default_maxdepth_bounds_every_queue_no_topic_object_bounds(real_redis, settings):
    settings = settings.model_copy(update={"default_maxdepth": 2})
    subscribe(real_redis, QM, "t/#", "app", "durable")
    subscribe(real_redis, QM, "free/#", "app", "free")
    define(real_redis, QM, "FREE", "free", Attributes(maxdepth="NOLIMIT"))  # an object's NOLIMIT wins
    alter(real_redis, QM, BASE, pmsgdlv="ALLDUR")  # the base's default is ALLAVAIL (issue 27)
    stream = keys.publish_stream(QM)
    for i in range(3):
        real_redis.xadd(stream, publication_fields("p", "t/x", b"np%d" % i, persistent=False, msgid=f"n{i}"))
    for i in range(4):
        real_redis.xadd(stream, publication_fields("p", "free/x", b"f%d" % i, msgid=f"f{i}"))
    real_redis.xadd(stream, publication_fields("p", "t/x", b"persistent", msgid="p1", reply=True))
    drain(make_workers(real_redis, settings, 1))
    # NPMSGDLV(ALLAVAIL): the third non-persistent one skipped the full queue (counted)
    assert [m.body for m in queue_messages(real_redis, QM, "app$durable")] == [b"np0", b"np1"]
    assert int(real_redis.hget(keys.skipped(QM), "app$durable")) == 1
    assert len(queue_messages(real_redis, QM, "app$free")) == 4
    # PMSGDLV(ALLDUR): a persistent one to a full durable queue is refused as a whole, dead-lettered
    (dead,) = _dead_letters(real_redis)
    assert b"is full (MAXDEPTH 2, delivery ALLDUR)" in dead[b"dlq.reason"] and dead[b"body"] == b"persistent"
    assert b'"status":"refused"' in real_redis.lpop(keys.reply(QM, "p", "p1"))
    # the base's own MAXDEPTH wins over the setting; `broker topic status` shows the effective one
    assert ("maxdepth", 2, BASE) in topic_status(real_redis, QM, "t/x", default_maxdepth=2).attributes
    alter(real_redis, QM, BASE, maxdepth=3)
    real_redis.xadd(stream, publication_fields("p", "t/x", b"third", msgid="p2"))
    drain(make_workers(real_redis, settings, 1))
    assert [m.body for m in queue_messages(real_redis, QM, "app$durable")][-1] == b"third"


def test_without_default_maxdepth_queues_stay_unbounded(real_redis, settings):
    assert settings.default_maxdepth == 0
    subscribe(real_redis, QM, "t/#", "app", "durable")
    Publisher(real_redis, QM, "p").publish_many(("t/x", b"%d" % i) for i in range(50))
    drain(make_workers(real_redis, settings, 1))
    assert len(queue_messages(real_redis, QM, "app$durable")) == 50 and not _dead_letters(real_redis)


# -- the command line, as a new user meets the limits -------------------------------------------


def _config(text: str) -> None:
    Path("configs").mkdir(exist_ok=True)
    Path("configs/broker.toml").write_text(text)


def test_the_cli_reports_each_limit_in_one_line_with_its_exit_code(run, real_redis, settings):
    # run's working directory is a temporary one: its configs/broker.toml is the operator's
    _config("max_topic_levels = 3\nmax_properties_bytes = 50\nmax_subscriptions_per_client = 1\n")
    deep = run("subscribe", "a/b/c/d", "--client-id", "app", "--timeout-ms", "1")
    assert deep.exit_code == 2
    assert deep.stderr.strip() == (
        "error: invalid topic filter 'a/b/c/d': it has 4 levels, more than the broker allows (max_topic_levels 3)"
    )
    assert (
        run("subscribe", "a/#", "--client-id", "app", "--durable", "one", "--timeout-ms", "1").exit_code == 0
    )
    second = run("subscribe", "b/#", "--client-id", "app", "--durable", "two", "--timeout-ms", "1")
    assert second.exit_code == 3
    assert second.stderr.strip() == (
        "error: client id 'app' has 1 subscription already, the most allowed "
        "(max_subscriptions_per_client); unsubscribe one first"
    )
    worker = make_workers(real_redis, settings.model_copy(update={"max_properties_bytes": 50}), 1)[0]
    results: list = []
    work_while(worker, lambda: results.append(run("publish", "a/x", "hi", "-p", "k=" + "v" * 60)))
    (published,) = results
    assert published.exit_code == 3
    assert published.stderr.strip() == (
        "error: publication refused: properties of 68 bytes (the 'props' field) are larger than "
        "the limit of 50 bytes (max_properties_bytes)"
    )


@pytest.mark.parametrize("scheme", ["mqtt", "swiftmq"])
@pytest.mark.parametrize("size", [5_000, 70_000])
def test_broker_subscribe_over_long_filter_names_max_topic_bytes_the_limit_in_force(
    run, real_redis, monkeypatch, scheme, size
):
    # Given a filter over max_topic_bytes (4,096 by default), and one over MQTT's 65,535 bytes too
    monkeypatch.setenv("BROKER_TOPIC_SCHEME", scheme)
    separator = "/" if scheme == "mqtt" else "."
    topic_filter = "a" + separator + "x" * (size - 2)
    # When broker subscribe is given it
    result = run("subscribe", topic_filter, "--client-id", "app", "--timeout-ms", "1")
    # Then it exits 2 quoting the setting in force, not MQTT's own limit, and makes nothing
    assert result.exit_code == 2, result.output
    assert f"it is {size} bytes long, more than the broker allows (max_topic_bytes 4096)" in result.stderr
    assert "65535" not in result.stderr
    assert real_redis.hlen(keys.subscriptions(QM)) == 0
