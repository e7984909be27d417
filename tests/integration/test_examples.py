"""The runnable examples of docs/protocol.md against the test suite's real server, with a worker
of ``broker.testing`` handling the publications: the redis-cli session
(``examples/redis-cli/consume.sh``) and plain redis-py (``examples/python/consume.py``, no
``broker`` import). Each publishes with a result, receives a body that is not UTF-8,
acknowledges, and recovers the message of a killed consumer (issue 27)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.core import keys
from broker.core.server import cli_binary
from broker.testing import make_workers, work_while

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QM = "QM1"


def _run_with_a_worker(real_redis, settings, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` while a worker of QM1 handles rounds; the library is loaded by the worker."""
    real_redis.function_flush()
    [worker] = make_workers(real_redis, settings.model_copy(update={"qm": QM}), 1)
    done: list[subprocess.CompletedProcess[str]] = []
    work_while(
        worker,
        lambda: done.append(
            subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ})
        ),
    )
    return done[0]


def _expected(prefix: str) -> list[str]:
    return [
        f"published {prefix}-1: delivered",
        f"published {prefix}-2: delivered",
        "c1 received body 68656c6c6f",  # "hello"
        "c1 received body 636166e920fffe",  # not UTF-8: caf\xe9 \xff\xfe, byte for byte
        f"published {prefix}-3: delivered",
        "c2 holds 1 message and is killed",
        "recovered (consumers, given back, poison): 1 1 0",
        "c3 received body 616761696e, delivery count 2",
    ]


def _in_order(lines: list[str], wanted: list[str]) -> bool:
    found = iter(lines)
    return all(any(line.startswith(w) for line in found) for w in wanted)


def _left_nothing(real_redis) -> None:
    key = keys.sub_queue(QM, "app$orders")
    for consumer in ("c1", "c2", "c3"):
        assert real_redis.llen(keys.consumer_inflight(QM, "app$orders", consumer)) == 0
    assert real_redis.llen(key) == 0 and real_redis.xlen(keys.publish_stream(QM)) >= 3


def test_the_redis_cli_example_runs_against_a_real_server(real_server, real_redis, settings):
    script = EXAMPLES / "redis-cli" / "consume.sh"
    env = f"CLI={cli_binary()} PORT={real_server.port} QM={QM}"
    done = _run_with_a_worker(real_redis, settings, ["bash", "-c", f"{env} bash {script}"])
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert _in_order(lines, _expected("o")), lines
    assert [line for line in lines if line.startswith("c1 received")] == [
        "c1 received body 68656c6c6f, acknowledged 1",
        "c1 received body 636166e920fffe, acknowledged 1",
    ]
    assert lines[-1] == "c3 received body 616761696e, delivery count 2, acknowledged 1"
    _left_nothing(real_redis)


def test_the_plain_redis_py_example_runs_against_a_real_server(real_server, real_redis, settings):
    script = EXAMPLES / "python" / "consume.py"
    command = [sys.executable, str(script), "--port", str(real_server.port), "--qm", QM]
    done = _run_with_a_worker(real_redis, settings, command)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert _in_order(lines, _expected("p")), lines
    assert "c1 acknowledged 2" in lines
    assert lines[-1] == "c3 received body 616761696e, delivery count 2, acknowledged 1"
    _left_nothing(real_redis)


@pytest.mark.parametrize("name", ["consume.py"])
def test_the_python_example_imports_nothing_of_the_broker(name):
    tree = ast.parse((EXAMPLES / "python" / name).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "argparse", "json", "redis"}, imported
