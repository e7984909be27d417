"""The wire protocol from any language: raw commands through valkey-cli, no broker client code."""

from __future__ import annotations

import json
import subprocess
import time

from broker import Subscriber, keys, list_subscriptions
from broker.server import cli_binary
from tests.harness.testing import drain, make_workers

QM = "TEST"


def _cli(server, *args: str, stdin: bytes | None = None) -> bytes:
    cmd = [cli_binary(), "-p", str(server.port), "--raw", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, check=True, timeout=30).stdout


def test_raw_xadd_publish_and_raw_lmove_consume_round_trip(real_server, real_redis, settings):
    # Given a subscription made with raw commands (HSET + INCR, as the protocol documents)
    sub_id = "rawclient$orders"
    record = json.dumps({"filter": "/ORDERS/+", "durable": True, "created_ms": 0})
    _cli(real_server, "HSET", keys.subscriptions(QM), sub_id, record)
    _cli(real_server, "INCR", keys.version(QM))
    workers = make_workers(real_redis, settings, 1)
    # When a service publishes with one XADD (body read from stdin, binary-safe)
    body = b"\x00\xffbinary\nbody"
    entry_id = _cli(
        real_server,
        "-x",
        "XADD",
        keys.publish_stream(QM),
        "*",
        "publisher",
        "svc-7",
        "topic",
        "/ORDERS/EU",
        "msgid",
        "o-1",
        "seq",
        "1",
        "props",
        '{"region":"eu"}',
        "body",
        stdin=body,
    ).strip()
    assert entry_id
    drain(workers)
    # Then a raw consumer renews its lease and LMOVEs the envelope into its own in-flight list
    queue, inflight = keys.sub_queue(QM, sub_id), keys.consumer_inflight(QM, sub_id, "c1")
    assert _cli(real_server, "LLEN", queue).strip() == b"1"
    deadline = int(time.time() * 1000) + 30_000
    _cli(real_server, "ZADD", keys.sub_consumers(QM, sub_id), str(deadline), "c1")
    envelope = _cli(real_server, "LMOVE", queue, inflight, "RIGHT", "LEFT")[:-1]  # --raw adds one newline
    header_line, _, got_body = envelope.partition(b"\n")
    header = json.loads(header_line)
    assert got_body == body
    assert header["v"] == keys.PROTOCOL_VERSION
    assert header["topic"] == "/ORDERS/EU" and header["publisher"] == "svc-7" and header["seq"] == 1
    assert header["msgid"] == "o-1" and header["props"] == {"region": "eu"}
    assert header["entry_id"] == entry_id.decode() and "size" not in header
    assert "ts" not in header  # protocol 5: the publish time is the entry id's milliseconds
    # And the raw ack (LREM of the same bytes, passed on stdin, from the oldest end) empties the list
    assert _cli(real_server, "-x", "LREM", inflight, "-1", stdin=envelope).strip() == b"1"
    assert real_redis.llen(inflight) == 0


def test_raw_consumer_waits_on_the_bell_and_a_dead_raw_consumers_message_is_given_back(
    real_server, real_redis, settings
):
    sub_id = "rawclient$all"
    _cli(
        real_server,
        "HSET",
        keys.subscriptions(QM),
        sub_id,
        json.dumps({"filter": "#", "durable": True, "created_ms": 0}),
    )
    _cli(real_server, "INCR", keys.version(QM))
    workers = make_workers(real_redis, settings, 1)
    bell = keys.sub_bell(QM, sub_id)
    _cli(real_server, "XADD", keys.publish_stream(QM), "*", "publisher", "svc", "topic", "a/b", "body", "hi")
    drain(workers)
    # The bell rings: waiting on it (moved onto itself) returns at once and leaves it as it was
    assert _cli(real_server, "BLMOVE", bell, bell, "RIGHT", "RIGHT", "1").strip() == b"1"
    assert real_redis.llen(bell) == 1
    # A raw consumer with a lease that has already run out takes the message and dies
    consumers, inflight = keys.sub_consumers(QM, sub_id), keys.consumer_inflight(QM, sub_id, "raw1")
    _cli(real_server, "ZADD", consumers, str(int(time.time() * 1000) - 1), "raw1")
    out = _cli(real_server, "LMOVE", keys.sub_queue(QM, sub_id), inflight, "RIGHT", "LEFT")
    assert out.rstrip(b"\n").partition(b"\n")[2] == b"hi"
    # The workers' sweep gives it back; the next consumer gets it with a delivery count of 2
    drain(workers)
    workers[0].sweep_subscriptions()
    assert real_redis.exists(inflight) == 0
    record = next(r for r in list_subscriptions(real_redis, QM) if r.sub_id == sub_id)
    delivery = Subscriber(real_redis, QM, record, settings, heartbeat=False).receive()
    assert delivery is not None and delivery.message.body == b"hi" and delivery.delivery_count == 2


def test_raw_publisher_asking_for_a_reply_gets_the_result_json(real_server, real_redis, settings):
    workers = make_workers(real_redis, settings, 1)
    _cli(
        real_server,
        "XADD",
        keys.publish_stream(QM),
        "*",
        "publisher",
        "svc",
        "topic",
        "bad/#",
        "msgid",
        "m1",
        "reply",
        "1",
    )
    drain(workers)
    out = _cli(real_server, "BLPOP", keys.reply(QM, "svc", "m1"), "1").splitlines()
    result = json.loads(out[1])
    assert result["status"] == "refused"
    assert result["suggestion"] == "bad"
