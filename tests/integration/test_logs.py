"""Structured logs of real workers: a refused publication's line carries msgid, publisher, entry_id."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.core import keys
from broker.core.logs import configure_logging
from broker.core.models import publication_fields
from broker.testing import drain, make_workers

QM = "TEST"
ROOT = Path(__file__).resolve().parents[2]

#: A publisher id that tries to end its log line and forge another.
HOSTILE = 'evil\n2025-01-01T00:00:00.000Z MainProcess broker.worker ERROR forged {"level": "x"}\u2028'


def _publish_refused(client, publisher: str = HOSTILE, msgid: str = "m-1") -> str:
    """XADD a publication on an invalid topic (a wildcard in a topic name); returns its entry id."""
    fields = publication_fields(publisher, "sport/+/tennis", b"x", msgid=msgid)
    entry_id = client.xadd(keys.publish_stream(QM), fields)
    return entry_id.decode()


def _json_lines(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8", errors="replace")
    complete = text[: text.rfind("\n") + 1]  # a line being written is left for the next look
    return [json.loads(line) for line in complete.splitlines() if line]


def test_worker_pool_run_with_log_format_json_logs_a_refused_publication_with_its_keys(
    real_server, real_redis, tmp_path
):
    # Given `broker --log-format json worker` (a pool of spawned worker processes), stderr to a file
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("BROKER_") or k == "BROKER_REDIS_SERVER_BIN"
    }
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log_file = tmp_path / "worker.log"
    with log_file.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from broker.cli import main; main()",
                "--redis-url",
                real_server.url,
                "--qm",
                QM,
                "--log-format",
                "json",
                "worker",
                "--concurrency",
                "2",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        # When a publication on an invalid topic, from a hostile publisher id, is refused
        entry_id = _publish_refused(real_redis)
        deadline = time.monotonic() + 60
        found: list[dict] = []
        while not found:
            assert proc.poll() is None, log_file.read_text(errors="replace")
            assert time.monotonic() < deadline, log_file.read_text(errors="replace")
            found = [line for line in _json_lines(log_file) if line.get("entry_id") == entry_id]
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Then the worker's line about it is JSON with the three keys, exact
    (line,) = found
    assert line["msgid"] == "m-1"
    assert line["publisher"] == HOSTILE
    assert line["level"] == "WARNING" and line["logger"] == "broker.worker"
    assert line["process"].startswith("broker-worker-")
    assert "refused" in line["message"] and "dead-lettered" in line["message"]
    assert line["ts"].endswith("Z")
    # And every line every process wrote is one JSON object (none was forged)
    assert all("message" in record for record in _json_lines(log_file))
    assert proc.returncode == 0


def test_refused_publication_line_in_text_is_one_line_with_escaped_keys(real_redis, settings):
    # Given an in-process worker logging text to a buffer
    stream = io.StringIO()
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    configure_logging("text", "INFO", stream=stream)
    try:
        (worker,) = make_workers(real_redis, settings, 1)
        # When a hostile publisher's publication on an invalid topic is refused
        entry_id = _publish_refused(real_redis, msgid="m 2")
        drain([worker])
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        root.setLevel(level)
    # Then its line is one line ending with the keys, the publisher quoted and escaped
    (line,) = [text for text in stream.getvalue().splitlines() if "publication refused" in text]
    assert line.endswith(f" entry_id={entry_id}")
    assert ' msgid="m 2" ' in line
    assert ' publisher="evil\\n2025-01-01T00:00:00.000Z MainProcess broker.worker ERROR forged ' in line
    assert "\\u2028" in line
    assert all(not text.startswith("2025-01-01") for text in stream.getvalue().splitlines())
