"""The Node.js examples (``examples/node``, the npm ``redis`` package) run against the suite's real server.

Each example runs as ``node <example>.mjs`` in a subprocess with ``BROKER_REDIS_URL`` and
``BROKER_QM`` set, while the broker's workers run in the test's process (``broker.testing``);
its output is checked, and so is what it left in Redis. Without ``node`` or
``examples/node/node_modules`` (``npm ci --prefix examples/node``) these tests skip with the
reason, unless ``BROKER_REQUIRE_NODE=1`` (``.ci/run`` sets it): then they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.core import keys
from broker.core.server import Server
from broker.operations.acl import RoleSpec
from broker.operations.grants import grant
from broker.testing import drain, make_workers, queue_messages, wait_for
from broker.topics.subscriptions import list_subscriptions, subscribe

QM = "TEST"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "node"
#: seconds an example may run before it is killed and the test fails
TIMEOUT_S = 30


def node_or_skip() -> str:
    """The ``node`` executable, or a skip (a failure with ``BROKER_REQUIRE_NODE=1``) naming what is missing."""
    node = shutil.which("node")
    if node is None:
        missing = "node is not installed (apt-get install nodejs npm)"
    elif not (EXAMPLES / "node_modules" / "redis").is_dir():
        missing = "examples/node/node_modules is missing (npm ci --prefix examples/node)"
    else:
        return node
    if os.environ.get("BROKER_REQUIRE_NODE") == "1":
        pytest.fail(f"BROKER_REQUIRE_NODE=1 but {missing}")
    pytest.skip(missing)


@pytest.fixture
def node() -> str:
    return node_or_skip()


class Example:
    """One example running as ``node <script> <args>`` against ``url`` and queue manager ``TEST``."""

    def __init__(self, node: str, url: str, script: str, *args: str) -> None:
        env = {**os.environ, "BROKER_REDIS_URL": url, "BROKER_QM": QM}
        self.proc = subprocess.Popen(
            [node, script, *args], cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.stderr = ""

    def finish(self, returncode: int = 0) -> list[str]:
        """Wait for the example to exit with ``returncode``; returns its output lines (``stderr`` keeps its errors).

        Raises:
            AssertionError: it exited with another status (its stderr in the message).
            subprocess.TimeoutExpired: still running after ``TIMEOUT_S`` (it is killed).
        """
        try:
            out, err = self.proc.communicate(timeout=TIMEOUT_S)
        finally:
            self.kill()
        self.stderr = err.decode(errors="replace")
        assert self.proc.returncode == returncode, (self.proc.returncode, self.stderr)
        return out.decode().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def example(node: str, real_server: Server) -> Iterator[Callable[..., Example]]:
    """A factory ``(script, *args, url=the suite's server) -> Example``; every example still running
    is killed after the test."""
    started: list[Example] = []

    def start(script: str, *args: str, url: str = real_server.url) -> Example:
        started.append(Example(node, url, script, *args))
        return started[-1]

    yield start
    for one in started:
        one.kill()


def _lines(output: list[str], word: str) -> list[str]:
    """The rest of each output line that starts with ``word`` and a space."""
    return [line.removeprefix(word + " ") for line in output if line.startswith(word + " ")]


#: a body that is not UTF-8 (0xff and 0x80 are never valid), with a newline byte inside
BINARY_BODY = b"\x00\xff\x80binary\nbody\xfe"


def _publish(
    example, client, workers, *args: str, url: str | None = None, stream: str = keys.publish_stream(QM)
) -> list[str]:
    """Run publish.mjs with ``args`` (as the user of ``url``, the suite's server's by default) while
    the workers handle its entry, once its XADD is in ``stream``, so its BLPOP gets the result;
    returns its output lines."""
    before = _entries_added(client, stream)
    run = example("publish.mjs", *args, **({"url": url} if url else {}))
    wait_for(
        lambda: run.proc.poll() is not None or _entries_added(client, stream) > before,
        TIMEOUT_S,
        "the example's XADD",
    )
    drain(workers)
    return run.finish()


def _entries_added(client, stream: str) -> int:
    """How many entries ``stream`` was ever given (an ingress stream's are moved out at once)."""
    return int(client.xinfo_stream(stream)["entries-added"]) if client.exists(stream) else 0


def _result(output: list[str]) -> dict:
    """The result publish.mjs printed (its "result <JSON>" line)."""
    [line] = _lines(output, "result")
    return json.loads(line)


def _message_lines(output: list[str]) -> list[dict[str, str]]:
    """receive.mjs's "message k=v ..." lines as dicts."""
    return [dict(part.split("=", 1) for part in line.split()) for line in _lines(output, "message")]


def _server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_publish_example_publishes_with_one_xadd_and_prints_the_result_it_blpops(
    example, real_redis, settings
):
    # Given a subscription on /ORDERS/+ and a worker
    record = subscribe(real_redis, QM, "/ORDERS/+", "shop")
    workers = make_workers(real_redis, settings, 1)
    # When publish.mjs publishes with a result asked for, and the worker handles its entry
    output = _publish(
        example, real_redis, workers, "--publisher", "svc-7", "--msgid", "o-1", "/ORDERS/EU", "hello"
    )
    # Then it printed the entry id and the result the broker posted to its reply key
    [entry_id] = _lines(output, "entry")
    result = _result(output)
    assert result["status"] == "delivered" and result["subscriptions"] == 1
    assert result["publisher"] == "svc-7" and result["msgid"] == "o-1" and result["entry_id"] == entry_id
    # and the subscriber queue holds the publication
    [message] = queue_messages(real_redis, QM, record.sub_id)
    assert message.body == b"hello" and message.msgid == "o-1" and message.topic == "/ORDERS/EU"
    assert real_redis.exists(keys.reply(QM, "svc-7", "o-1")) == 0  # the example took the result


def test_publish_example_prints_a_refusal_with_its_reason(example, real_redis, settings):
    # Given a worker, when publish.mjs publishes on a topic with a wildcard
    workers = make_workers(real_redis, settings, 1)
    result = _result(_publish(example, real_redis, workers, "--msgid", "o-2", "/ORDERS/+", "hello"))
    # Then the result it prints says refused, with the reason and the suggested topic
    assert result["status"] == "refused" and "wildcard" in result["reason"]
    assert result["suggestion"] == "/ORDERS"


def test_subscribe_example_creates_a_subscription_the_workers_deliver_to(example, real_redis, settings):
    # Given workers of the queue manager
    workers = make_workers(real_redis, settings, 1)
    # When subscribe.mjs subscribes app$orders to /ORDERS/+ (MULTI: HSET the record, INCR the version)
    output = example("subscribe.mjs", "--client-id", "app", "--name", "orders", "/ORDERS/+").finish()
    # Then the record is there, durable, and the version was bumped
    assert output[0] == "subscribed app$orders to /ORDERS/+"
    [record] = list_subscriptions(real_redis, QM)
    assert record.sub_id == "app$orders" and record.topic_filter == "/ORDERS/+" and record.durable
    assert int(real_redis.get(keys.version(QM))) >= 1
    # and the workers deliver a publication on /ORDERS/EU to it, and nothing on /OTHER
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "svc-7", "topic": "/ORDERS/EU", "body": "hi"})
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "svc-7", "topic": "/OTHER", "body": "no"})
    drain(workers)
    assert [m.body for m in queue_messages(real_redis, QM, "app$orders")] == [b"hi"]


def test_receive_example_prints_a_binary_body_as_hex_and_acknowledges_it(example, real_redis, settings):
    # Given a subscription and a publication whose body is not UTF-8, published by publish.mjs
    record = subscribe(real_redis, QM, "/ORDERS/+", "app", "orders")
    workers = make_workers(real_redis, settings, 1)
    args = ("--msgid", "b-1", "--body-hex", BINARY_BODY.hex(), "/ORDERS/EU")
    result = _result(_publish(example, real_redis, workers, *args))
    assert result["status"] == "delivered" and result["subscriptions"] == 1
    # When receive.mjs receives as consumer c1 (FCALL broker_receive) and acknowledges (FCALL broker_ack)
    output = example("receive.mjs", "--consumer", "c1", record.sub_id).finish()
    # Then it printed the message with the body's exact bytes in hex, delivered for the first time,
    assert output[0] == "status ok expired=0"
    [message] = _message_lines(output)
    assert message["body_hex"] == BINARY_BODY.hex() and message["delivery_count"] == "1"
    assert message["msgid"] == "b-1" and message["topic"] == "/ORDERS/EU" and message["publisher"] == "svc-7"
    # and its acknowledgement, with the bytes received, removed it: nothing left in flight or queued
    assert _lines(output, "acked") == ["1"]
    assert real_redis.llen(keys.consumer_inflight(QM, record.sub_id, "c1")) == 0
    assert queue_messages(real_redis, QM, record.sub_id) == []


def test_receive_example_waits_on_the_bell_until_a_publication_arrives(example, real_redis, settings):
    # Given a subscription with nothing waiting, and receive.mjs blocked on its bell (BLMOVE)
    record = subscribe(real_redis, QM, "/ORDERS/+", "app", "orders")
    workers = make_workers(real_redis, settings, 1)
    run = example("receive.mjs", "--consumer", "c1", "--wait-s", str(TIMEOUT_S), record.sub_id)

    def blocked() -> bool:
        return any(c["cmd"] == "blmove" for c in real_redis.client_list())

    wait_for(lambda: run.proc.poll() is not None or blocked(), TIMEOUT_S, "receive.mjs on the bell")
    assert blocked(), run.finish()  # it exited instead: finish() raises with its error
    # When a publication is delivered (its unit of work rings the bell)
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "svc-7", "topic": "/ORDERS/EU", "body": "late"})
    drain(workers)
    # Then the example wakes, receives it and acknowledges it
    output = run.finish()
    [message] = _message_lines(output)
    assert message["body_hex"] == b"late".hex() and _lines(output, "acked") == ["1"]
    assert queue_messages(real_redis, QM, record.sub_id) == []


def test_recover_example_gives_a_killed_consumers_message_back_and_it_is_received_again(
    example, real_redis, settings
):
    # Given a subscription with one binary publication
    record = subscribe(real_redis, QM, "/ORDERS/+", "app", "orders")
    workers = make_workers(real_redis, settings, 1)
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "svc-7", "topic": "/ORDERS/EU", "body": BINARY_BODY}
    )
    drain(workers)
    # and a consumer c1 that received it and exited without acknowledging, its 30 s lease
    # taken a minute ago (the clock injected: the lease has passed, nothing sleeps)
    lease_taken_ms = _server_ms(real_redis) - 60_000
    killed = example(
        "receive.mjs",
        "--consumer",
        "c1",
        "--no-ack",
        "--lease-ms",
        "30000",
        "--now-ms",
        str(lease_taken_ms),
        record.sub_id,
    ).finish()
    assert [m["delivery_count"] for m in _message_lines(killed)] == ["1"] and _lines(killed, "acked") == []
    inflight = keys.consumer_inflight(QM, record.sub_id, "c1")
    assert real_redis.llen(inflight) == 1
    # When recover.mjs runs (FCALL broker_recover, the server's clock)
    output = example("recover.mjs", record.sub_id).finish()
    # Then c1 is found dead and its message given back,
    assert output == ["recovered consumers=1 given_back=1 poison=0"]
    assert real_redis.llen(inflight) == 0
    # and consumer c2 receives it again, its delivery count 2 (JMSXDeliveryCount), and acknowledges it
    again = example("receive.mjs", "--consumer", "c2", record.sub_id).finish()
    [message] = _message_lines(again)
    assert message["body_hex"] == BINARY_BODY.hex() and message["delivery_count"] == "2"
    assert _lines(again, "acked") == ["1"]
    assert queue_messages(real_redis, QM, record.sub_id) == []


def test_examples_run_as_a_publisher_and_a_subscriber_user(example, real_redis, settings, users):
    # Given ACL users: a publisher bound to svc-7, a subscriber of client id app; app's
    # subscription (made by the administrator) and a worker
    users.add("node-pub", RoleSpec("publisher", ["svc-7"]))
    users.add("node-sub", RoleSpec("subscriber", client_id="app"))
    record = subscribe(real_redis, QM, "/ORDERS/+", "app", "orders")
    other = subscribe(real_redis, QM, "/ORDERS/+", "shop", "orders")
    workers = make_workers(real_redis, settings, 1)
    # When the publisher publishes through its own ingress stream (--principal), as its user
    args = ("--principal", "node-pub", "--msgid", "s-1", "--body-hex", BINARY_BODY.hex(), "/ORDERS/EU")
    ingress = keys.ingress(QM, "node-pub")
    output = _publish(example, real_redis, workers, *args, url=users.url("node-pub"), stream=ingress)
    # Then it gets its result, and the subscriber user receives and acknowledges the message
    assert _result(output)["status"] == "delivered" and _result(output)["subscriptions"] == 2
    received = example("receive.mjs", record.sub_id, url=users.url("node-sub")).finish()
    [message] = _message_lines(received)
    assert message["body_hex"] == BINARY_BODY.hex() and _lines(received, "acked") == ["1"]
    # but may not receive from another client's subscription: NOPERM, one line, nothing taken
    refused = example("receive.mjs", other.sub_id, url=users.url("node-sub"))
    assert refused.finish(returncode=1) == []
    assert refused.stderr.startswith("error: NOPERM")
    assert [m.body for m in queue_messages(real_redis, QM, other.sub_id)] == [BINARY_BODY]


def test_a_subscriber_user_subscribes_by_request_within_its_grants(example, real_redis, settings, users):
    # Given a subscriber user of client id app, granted orders/eu/#, and a worker with security on
    users.add("node-req", RoleSpec("subscriber", client_id="app"))
    grant(real_redis, QM, "node-req", subscribe=["orders/eu/#"])
    secure = settings.model_copy(update={"security": True})
    (worker,) = make_workers(users.add("node-wk", RoleSpec("worker")), secure, 1)
    url = users.url("node-req")
    # When subscribe.mjs --request asks for a subscription within its grants, and the worker answers
    asked = example("subscribe.mjs", "--request", "--name", "eu", "orders/eu/#", url=url)
    wait_for(lambda: real_redis.xlen(keys.control(QM, "app")) == 1, TIMEOUT_S, "the request's XADD")
    assert worker.housekeeping.serve_requests(0) == 1
    # Then the subscription exists, made by the broker
    assert asked.finish() == ["subscribed app$eu to orders/eu/#", f"key {keys.sub_queue(QM, 'app$eu')}"]
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["app$eu"]
    # and a request outside its grants is refused with the broker's reason, exit status 3
    refused = example("subscribe.mjs", "--request", "--name", "all", "orders/#", url=url)
    wait_for(lambda: real_redis.xlen(keys.control(QM, "app")) == 1, TIMEOUT_S, "the request's XADD")
    worker.housekeeping.control.next_list_ms = 0  # type: ignore[union-attr]
    assert worker.housekeeping.serve_requests(0) == 1
    assert refused.finish(returncode=3) == []
    assert "not authorized" in refused.stderr and "orders/#" in refused.stderr
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["app$eu"]


def test_without_node_the_examples_skip_unless_broker_require_node_is_set(monkeypatch):
    # Given a machine without node
    monkeypatch.setattr(shutil, "which", lambda name: None)
    # Then the examples skip, naming what is missing,
    monkeypatch.delenv("BROKER_REQUIRE_NODE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="node is not installed"):
        node_or_skip()
    # and fail instead when CI requires them
    monkeypatch.setenv("BROKER_REQUIRE_NODE", "1")
    with pytest.raises(pytest.fail.Exception, match="BROKER_REQUIRE_NODE=1 but node is not installed"):
        node_or_skip()
