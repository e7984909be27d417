"""Delay-based flow control on a real server (issue 12; SwiftMQ's Topic Manager, seed 003).

The curve used here: start depth 10, full depth 110, max delay 60,000 ms, so a
publication that brings its deepest queue to depth ``d`` (itself included) is
asked for ``600 * (d - 10)`` ms, capped at 60,000. The max is large so that a
flow key (PX the delay) outlives any pause of a slow test machine; nothing here
sleeps: publishers get a fake clock and sleep.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.models import publication_fields
from broker.testing import FakeTime, drain, make_workers, work_while
from broker.topics.subscriptions import subscribe
from tests.conftest import QM


@pytest.fixture
def flow_settings(settings):
    return settings.model_copy(
        update={
            "flow_control_start_depth": 10,
            "flow_control_full_depth": 110,
            "flow_control_max_delay_ms": 60_000,
        }
    )


def _fill(client, sub_id: str, depth: int) -> None:
    """Put ``depth`` placeholder messages in a subscription's default band (no consumer takes them)."""
    client.delete(keys.sub_queue(QM, sub_id))
    if depth:
        client.lpush(keys.sub_queue(QM, sub_id), *[b"old"] * depth)


def _publish_for_result(client, topic: str, msgid: str, publisher: str = "p", **options) -> None:
    client.xadd(
        keys.publish_stream(QM),
        publication_fields(publisher, topic, b"x", msgid=msgid, reply=True, **options),
    )


def _result(client, msgid: str, publisher: str = "p") -> dict:
    raw = client.lpop(keys.reply(QM, publisher, msgid))
    assert raw is not None, f"no result for {msgid}"
    return json.loads(raw)


@pytest.mark.parametrize(
    ("depth_before", "delay"),
    [(0, 0), (5, 0), (9, 0), (10, 600), (59, 30_000), (109, 60_000), (500, 60_000)],
)
def test_the_delay_follows_the_curve_of_the_queue_depth(real_redis, flow_settings, depth_before, delay):
    # Given a subscriber queue holding depth_before messages
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, depth_before)
    # When a publication goes to it and its result is asked for
    _publish_for_result(real_redis, "/q", "m1")
    drain(make_workers(real_redis, flow_settings, 1))
    # Then the result carries the delay of depth_before + 1 (the publication itself)
    result = _result(real_redis, "m1")
    assert result["status"] == "delivered"
    assert result["flow_control_delay_ms"] == delay
    assert real_redis.llen(keys.sub_queue(QM, sub.sub_id)) == depth_before + 1
    # And the publisher's flow key holds it, living as long as the delay; absent when 0
    flow = keys.flow_key(QM, "p")
    if delay:
        assert real_redis.get(flow) == str(delay).encode()
        assert 0 < real_redis.pttl(flow) <= delay
    else:
        assert real_redis.exists(flow) == 0


def test_the_delay_is_the_slowest_subscribers(real_redis, flow_settings):
    # Given three subscribers of /m at depths 20, 70 and 0, and a very slow one elsewhere
    depths = {"a": 20, "b": 70, "c": 0}
    for name, depth in depths.items():
        _fill(real_redis, subscribe(real_redis, QM, "/m", "c", name).sub_id, depth)
    _fill(real_redis, subscribe(real_redis, QM, "/other", "c", "elsewhere").sub_id, 500)
    # When a publication on /m asks for its result
    _publish_for_result(real_redis, "/m", "m1")
    drain(make_workers(real_redis, flow_settings, 1))
    # Then its delay is that of the deepest queue it went to (71 messages), not the others'
    result = _result(real_redis, "m1")
    assert result["subscriptions"] == 3
    assert result["flow_control_delay_ms"] == 600 * (71 - 10)


def test_the_depth_counts_the_publications_of_the_same_batch(real_redis, flow_settings):
    # Given a queue at the start depth and three publications of p handled in one batch
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, 10)
    for i in range(3):
        _publish_for_result(real_redis, "/q", f"m{i}")
    worker = make_workers(real_redis, flow_settings, 1)[0]
    assert worker.run_once() == 3
    # Then each one's delay counts the ones before it, and the flow key holds the largest
    assert [_result(real_redis, f"m{i}")["flow_control_delay_ms"] for i in range(3)] == [600, 1_200, 1_800]
    assert real_redis.get(keys.flow_key(QM, "p")) == b"1800"


def test_a_publisher_that_does_not_wait_waits_the_delay_before_its_next_publication(
    real_redis, flow_settings
):
    # Given a slow subscriber (59 messages waiting) and a publisher with a fake clock and sleep
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, 59)
    t = FakeTime()
    pub = Publisher(real_redis, QM, "p", clock_ms=t.clock, sleep_ms=t.sleep)
    workers = make_workers(real_redis, flow_settings, 1)
    # When it publishes without waiting and a worker handles it
    assert pub.publish("/q", b"1").flow_control_delay_ms == 0  # nothing asked yet
    drain(workers)
    # Then the next publication learns the delay in the same round trip as its XADD ...
    second = pub.publish("/q", b"2")
    assert second.status == "sent" and second.flow_control_delay_ms == 30_000
    assert t.slept == []
    # ... and the one after waits it first
    pub.publish("/q", b"3")
    assert t.slept == [30_000]
    drain(workers)
    assert real_redis.llen(keys.sub_queue(QM, sub.sub_id)) == 62


def test_a_publisher_waiting_for_results_learns_the_delay_and_waits_before_its_next(
    real_redis, flow_settings
):
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, 59)
    worker = make_workers(real_redis, flow_settings, 1)[0]
    t = FakeTime()
    pub = Publisher(real_redis, QM, "p", clock_ms=t.clock, sleep_ms=t.sleep)
    results = {}

    def publish() -> None:
        results["first"] = pub.publish("/q", b"1", wait=True)
        results["second"] = pub.publish("/q", b"2", wait=True)

    work_while(worker, publish)
    assert results["first"].flow_control_delay_ms == 30_000
    assert results["second"].flow_control_delay_ms == 30_600
    assert t.slept == [30_000]  # before the second publication, not before the first


def test_flow_control_off_asks_for_nothing_and_writes_no_flow_key(real_redis, flow_settings):
    # Given flow control off and a queue far past the full depth
    settings = flow_settings.model_copy(update={"flowcontrol_enabled": False})
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, 500)
    t = FakeTime()
    pub = Publisher(real_redis, QM, "p", clock_ms=t.clock, sleep_ms=t.sleep)
    pub.publish("/q", b"1")
    _publish_for_result(real_redis, "/q", "m1")
    drain(make_workers(real_redis, settings, 1))
    # Then the result has no delay, there is no flow key, and the publisher never waits
    result = _result(real_redis, "m1")
    assert result["status"] == "delivered" and "flow_control_delay_ms" not in result
    assert real_redis.exists(keys.flow_key(QM, "p")) == 0
    assert pub.publish("/q", b"2").flow_control_delay_ms == 0
    pub.publish("/q", b"3")
    assert t.slept == []


def test_a_foreign_flow_key_is_not_written_over_and_the_result_still_says_the_delay(
    real_redis, flow_settings
):
    sub = subscribe(real_redis, QM, "/q", "c", "slow")
    _fill(real_redis, sub.sub_id, 59)
    real_redis.rpush(keys.flow_key(QM, "p"), "someone else's")
    _publish_for_result(real_redis, "/q", "m1")
    drain(make_workers(real_redis, flow_settings, 1))
    result = _result(real_redis, "m1")
    assert result["status"] == "delivered" and result["flow_control_delay_ms"] == 30_000
    assert real_redis.lrange(keys.flow_key(QM, "p"), 0, -1) == [b"someone else's"]


@pytest.mark.parametrize(("flow_control", "slept"), [(True, [700.0]), (False, [])])
def test_the_bulk_publisher_waits_per_batch_the_largest_delay_of_its_publishers(
    real_server, real_redis, flow_control, slept
):
    from broker.pipeline.publish import _publish_partition

    # Given the broker asked publisher a for 300 ms and b for 700 ms
    real_redis.set(keys.flow_key(QM, "a"), "300", px=600_000)
    real_redis.set(keys.flow_key(QM, "b"), "700", px=600_000)
    rows = [
        {"publisher": p, "topic": "/bulk", "body": f"{p}{n}", "msgid": f"{p}-{n}", "seq": n}
        for p in ("a", "b")
        for n in (1, 2)
    ]
    added: list[int] = []
    t = FakeTime()
    # When a partition publishes them 3 per round trip (a1 a2 b1, then b2)
    done = dict(
        _publish_partition(
            0,
            iter(rows),
            redis_url=real_server.url,
            qm=QM,
            batch=3,
            max_backlog=None,
            backlog_timeout_ms=None,
            counter=SimpleNamespace(add=added.append),
            fail_partition=None,
            marker_dir=None,
            flow_control=flow_control,
            clock_ms=t.clock,
            sleep_ms=t.sleep,
        )
    )
    # Then the second round trip waited the largest delay read with the first (b's), once
    assert t.slept == slept
    assert done == {"a": 2, "b": 2} and added == [3, 1]
    assert real_redis.xlen(keys.publish_stream(QM)) == 4


def test_each_publishers_flow_key_follows_only_the_queues_its_own_publications_went_to(
    real_redis, flow_settings
):
    # Given a deep queue on /slow and an empty one on /fast, and publishers that do not wait for
    # results (no reply: the flow key is all they learn), handled in one batch
    slow = subscribe(real_redis, QM, "/slow", "c", "slow")
    subscribe(real_redis, QM, "/fast", "c", "fast")
    _fill(real_redis, slow.sub_id, 59)
    stream = keys.publish_stream(QM)
    for i in range(3):
        real_redis.xadd(stream, publication_fields("ps", "/slow", b"x", msgid=f"s{i}"))
        real_redis.xadd(stream, publication_fields("pf", "/fast", b"x", msgid=f"f{i}"))
    worker = make_workers(real_redis, flow_settings, 1)[0]
    assert worker.run_once() == 6
    # Then the slow queue's publisher is asked the delay of the depth the call left (62), the other nothing
    assert real_redis.get(keys.flow_key(QM, "ps")) == b"%d" % (600 * (62 - 10))
    assert real_redis.exists(keys.flow_key(QM, "pf")) == 0
