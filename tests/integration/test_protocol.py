"""The wire protocol from any language: raw commands through valkey-cli, no broker client code."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from broker import Subscriber, list_subscriptions
from broker.core import keys
from broker.core.server import cli_binary
from broker.testing import drain, make_workers

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
    workers[0].housekeeping.sweep_subscriptions()
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


PAGE = Path(__file__).parents[2] / "docs" / "protocol.md"


def _documented_commands() -> list[str]:
    """The commands of docs/protocol.md's bash blocks, as written: a here-document, or a pipeline
    continued on the next line, is one command; comments are left out."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S):
        lines = iter(block.splitlines())
        for line in lines:
            if not line.strip() or line.startswith("#"):
                continue
            command = line
            if "<<'EOF'" in line:
                for more in lines:
                    command += "\n" + more
                    if more == "EOF":
                        break
            while command.rstrip().endswith(("|", "\\")):
                command += "\n" + next(lines)
            commands.append(command)
    return commands


def test_every_redis_cli_example_of_docs_protocol_md_runs_as_written(real_server, real_redis, settings):
    # Given the page's commands, each run by bash as written (its port made the test server's),
    # and a worker of the page's queue manager QM1 that runs after the XADD
    qm = "QM1"
    cli = f"{cli_binary()} -p {real_server.port}"
    out: dict[str, bytes] = {}
    for command in _documented_commands():
        assert command.startswith("redis-cli -p 6380 "), command
        done = subprocess.run(
            ["bash", "-c", command.replace("redis-cli -p 6380", cli)], capture_output=True, timeout=30
        )
        # Then each one succeeds (redis-cli prints a refused command as "(error) ..." or "ERR ...")
        assert done.returncode == 0 and not done.stderr, (command, done.stderr)
        assert b"ERR" not in done.stdout and b"(error)" not in done.stdout, (command, done.stdout)
        words = command.split()
        name = "MULTI" if "<<" in command else words[4] if words[3].startswith("FCALL") else words[3]
        out[name] = done.stdout
        if name == "XADD":
            drain(make_workers(real_redis, settings.model_copy(update={"qm": qm}), 1))
    # and does what the page says: the subscription made in one transaction,
    sub_id = "app$orders"
    assert out["MULTI"].split() == [b"OK", b"QUEUED", b"QUEUED", b"1", b"1"]
    assert [r.sub_id for r in list_subscriptions(real_redis, qm)] == [sub_id]
    # the publication delivered to it, with its result,
    assert b'"status":"delivered"' in out["BLPOP"] and b'"subscriptions":1' in out["BLPOP"]
    # taken by broker_receive: status ok, none expired, the envelope, delivery count 1,
    received = out["broker_receive"].splitlines()
    assert received[:2] == [b"ok", b"0"] and received[-1] == b"1"
    assert b"hello" in out["broker_receive"]
    # under a lease that ends 30 s from the server's now (neither passed nor never-ending),
    seconds, micros = real_redis.time()
    now_ms = seconds * 1000 + micros // 1000
    deadline = real_redis.zscore(keys.sub_consumers(qm, sub_id), "c1")
    assert deadline is not None and now_ms + 25_000 < deadline <= now_ms + 30_000
    # then acknowledged with its exact bytes (the LINDEX | FCALL broker_ack pipeline: one removed),
    assert out["--raw"].strip() == b"1"
    assert real_redis.llen(keys.consumer_inflight(qm, sub_id, "c1")) == 0
    # the bell cleared by the receive that emptied the queue (the wait timed out), nothing to
    # recover, and nothing left to browse
    assert out["BLMOVE"].strip() == b"" and real_redis.llen(keys.sub_bell(qm, sub_id)) == 0
    assert out["broker_recover"].split() == [b"0", b"0", b"0"]
    assert out["broker_browse"].strip() == b""
