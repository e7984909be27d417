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
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.core import keys
from broker.core.server import Server
from broker.testing import drain, make_workers, queue_messages, wait_for
from broker.topics.subscriptions import subscribe

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
    """One example running as ``node <script> <args>`` against the suite's server and queue manager ``TEST``."""

    def __init__(self, node: str, server: Server, script: str, *args: str) -> None:
        env = {**os.environ, "BROKER_REDIS_URL": server.url, "BROKER_QM": QM}
        self.proc = subprocess.Popen(
            [node, script, *args], cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def finish(self) -> list[str]:
        """Wait for the example to exit 0; returns its output lines.

        Raises:
            AssertionError: it exited non-zero (its stderr in the message).
            subprocess.TimeoutExpired: still running after ``TIMEOUT_S`` (it is killed).
        """
        try:
            out, err = self.proc.communicate(timeout=TIMEOUT_S)
        finally:
            self.kill()
        assert self.proc.returncode == 0, (self.proc.returncode, err.decode(errors="replace"))
        return out.decode().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def example(node: str, real_server: Server) -> Iterator[type[Example]]:
    """A factory ``(script, *args) -> Example``; every example still running is killed after the test."""
    started: list[Example] = []

    def start(script: str, *args: str) -> Example:
        started.append(Example(node, real_server, script, *args))
        return started[-1]

    yield start  # type: ignore[misc]
    for one in started:
        one.kill()


def _lines(output: list[str], word: str) -> list[str]:
    """The rest of each output line that starts with ``word`` and a space."""
    return [line.removeprefix(word + " ") for line in output if line.startswith(word + " ")]


def test_publish_example_publishes_with_one_xadd_and_prints_the_result_it_blpops(
    example, real_redis, settings
):
    # Given a subscription on /ORDERS/+ and a worker
    record = subscribe(real_redis, QM, "/ORDERS/+", "shop")
    workers = make_workers(real_redis, settings, 1)
    # When publish.mjs publishes with a result asked for, and the worker handles its entry
    run = example("publish.mjs", "--publisher", "svc-7", "--msgid", "o-1", "/ORDERS/EU", "hello")
    wait_for(lambda: real_redis.xlen(keys.publish_stream(QM)) == 1, TIMEOUT_S, "the example's XADD")
    drain(workers)
    output = run.finish()
    # Then it printed the entry id and the result the broker posted to its reply key
    [entry_id] = _lines(output, "entry")
    [result_line] = _lines(output, "result")
    result = json.loads(result_line)
    assert result["status"] == "delivered" and result["subscriptions"] == 1
    assert result["publisher"] == "svc-7" and result["msgid"] == "o-1" and result["entry_id"] == entry_id
    # and the subscriber queue holds the publication
    [message] = queue_messages(real_redis, QM, record.sub_id)
    assert message.body == b"hello" and message.msgid == "o-1" and message.topic == "/ORDERS/EU"
    assert real_redis.exists(keys.reply(QM, "svc-7", "o-1")) == 0  # the example took the result


def test_publish_example_prints_a_refusal_with_its_reason(example, real_redis, settings):
    # Given a worker, when publish.mjs publishes on a topic with a wildcard
    workers = make_workers(real_redis, settings, 1)
    run = example("publish.mjs", "--msgid", "o-2", "/ORDERS/+", "hello")
    wait_for(lambda: real_redis.xlen(keys.publish_stream(QM)) == 1, TIMEOUT_S, "the example's XADD")
    drain(workers)
    # Then the result it prints says refused, with the reason and the suggested topic
    [result_line] = _lines(run.finish(), "result")
    result = json.loads(result_line)
    assert result["status"] == "refused" and "wildcard" in result["reason"]
    assert result["suggestion"] == "/ORDERS"


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
