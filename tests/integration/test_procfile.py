"""The Procfile: `honcho start -c worker=N` runs the server, N worker pools, the admin scheduler,
the channel process and the web console."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from broker.core.connection import connect
from broker.core.server import free_port
from broker.operations.status import status

ROOT = Path(__file__).resolve().parents[2]


def test_honcho_scales_workers_from_the_procfile(tmp_path):
    # Given the Procfile pointed at a private port and data directory
    port, console_port = free_port(), free_port()
    env = dict(
        os.environ,
        BROKER_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        BROKER_SERVER_PORT=str(port),
        BROKER_SERVER_DIR=str(tmp_path / "data"),
        BROKER_QM="PROC",
        BROKER_CONSOLE_PORT=str(console_port),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    honcho = subprocess.Popen(
        [sys.executable, "-m", "honcho", "start", "-c", "worker=3"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # When it starts, Then three worker processes register with the queue manager
        deadline = time.monotonic() + 60
        workers = 0
        while workers < 3:
            assert honcho.poll() is None, (
                honcho.stdout.read().decode(errors="replace") if honcho.stdout else ""
            )
            assert time.monotonic() < deadline, "workers did not register"
            try:
                client = connect(env["BROKER_REDIS_URL"])
                try:
                    workers = len(status(client, "PROC").workers)
                finally:
                    client.close()
            except Exception:
                workers = 0
            time.sleep(0.1)
        assert workers == 3
        # And the web console answers its login page
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{console_port}/login", timeout=5) as page:
                    assert page.status == 200 and b"<form" in page.read()
                    break
            except OSError:
                assert time.monotonic() < deadline, "the console did not answer"
                time.sleep(0.1)
    finally:
        # When the operator presses Ctrl-C (honcho signals every process, the server included)
        os.killpg(honcho.pid, signal.SIGINT)
        try:
            honcho.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            honcho.wait()
    # Then every process stops quietly: no traceback, no connection error logged, turns given up
    output = honcho.stdout.read().decode(errors="replace") if honcho.stdout else ""
    assert "Traceback" not in output, output
    assert "Error" not in output and "could not" not in output, output
    assert "rc=-15" not in output and "rc=1" not in output, (
        output
    )  # each process exits 0 (exec: no shell in between)
