"""The wire protocol from any language: raw commands through valkey-cli, no broker client code."""

from __future__ import annotations

import json
import subprocess

from broker import keys
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
    # Then a raw LMOVE takes the envelope into the in-flight list
    queue, inflight = keys.sub_queue(QM, sub_id), keys.sub_inflight(QM, sub_id)
    assert _cli(real_server, "LLEN", queue).strip() == b"1"
    envelope = _cli(real_server, "LMOVE", queue, inflight, "RIGHT", "LEFT")[:-1]  # --raw adds one newline
    header_line, _, got_body = envelope.partition(b"\n")
    header = json.loads(header_line)
    assert got_body == body
    assert header["v"] == keys.PROTOCOL_VERSION
    assert header["topic"] == "/ORDERS/EU" and header["publisher"] == "svc-7" and header["seq"] == 1
    assert header["msgid"] == "o-1" and header["props"] == {"region": "eu"}
    assert header["entry_id"] == entry_id.decode() and header["size"] == len(body)
    # And the raw ack (LREM of the same bytes, passed on stdin) empties the in-flight list
    assert _cli(real_server, "-x", "LREM", inflight, "1", stdin=envelope).strip() == b"1"
    assert real_redis.llen(inflight) == 0


def test_raw_blmove_receives_what_the_worker_pushes(real_server, real_redis, settings):
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
    _cli(real_server, "XADD", keys.publish_stream(QM), "*", "publisher", "svc", "topic", "a/b", "body", "hi")
    drain(workers)
    out = _cli(
        real_server, "BLMOVE", keys.sub_queue(QM, sub_id), keys.sub_inflight(QM, sub_id), "RIGHT", "LEFT", "1"
    )
    header, _, body = out.rstrip(b"\n").partition(b"\n")
    assert json.loads(header)["topic"] == "a/b"
    assert body == b"hi"


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
