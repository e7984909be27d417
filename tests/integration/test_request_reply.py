"""Request/reply: a temporary reply destination, a responder, a timeout."""

from __future__ import annotations

import threading

import pytest

from broker import ReplyTimeout, list_subscriptions, subscribe
from broker.clients.consumer import sweep_subscriptions
from broker.clients.request_reply import ERROR_PROPERTY, Requestor, Responder
from broker.core import keys
from broker.testing import make_workers

QM = "TEST"


@pytest.fixture
def running_worker(real_redis, settings):
    (worker,) = make_workers(real_redis, settings.model_copy(update={"block_ms": 20}), 1)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            worker.run_once(block=True)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield worker
    stop.set()
    thread.join(5)


def test_request_gets_the_reply_with_its_correlation_id_and_the_reply_destination_goes_away(
    real_redis, settings, running_worker
):
    record = subscribe(real_redis, QM, "/svc/upper", "svc", "requests")

    def handler(message):
        if message.body == b"boom":
            raise RuntimeError("no")
        return message.body.upper()

    responder = Responder(real_redis, QM, record, handler, settings)
    served = threading.Thread(target=responder.serve, kwargs={"timeout_ms": 50}, daemon=True)
    served.start()
    try:
        with Requestor(real_redis, QM, "client1", settings) as requestor:
            reply_sub = requestor.record.sub_id
            assert requestor.reply_topic.startswith("$tmp/client1/")
            reply = requestor.request("/svc/upper", b"hello", timeout_ms=10_000)
            assert reply.body == b"HELLO" and reply.topic == requestor.reply_topic
            failed = requestor.request("/svc/upper", b"boom", timeout_ms=10_000)
            assert failed.body == b"" and "RuntimeError: no" in str(failed.properties[ERROR_PROPERTY])
        # closing the requester removes its temporary destination
        assert reply_sub not in {r.sub_id for r in list_subscriptions(real_redis, QM)}
    finally:
        responder.stopping.set()
        served.join(5)


def test_request_without_a_responder_times_out_and_a_dead_requesters_destination_expires(
    real_redis, settings, running_worker
):
    requestor = Requestor(real_redis, QM, "client2", settings)
    with pytest.raises(ReplyTimeout):
        requestor.request("/nobody/home", b"?", timeout_ms=200)
    # The requester dies (no close): its destination is removed once its lease and the expiry have passed
    requestor.subscriber.abandon()
    sub_id = requestor.record.sub_id
    later = int(real_redis.zscore(keys.sub_consumers(QM, sub_id), requestor.subscriber.consumer_id))
    _, removed = sweep_subscriptions(
        real_redis, QM, settings, now_ms=later + settings.subscription_expiry_ms + 1
    )
    assert removed == [sub_id]
