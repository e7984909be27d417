"""A RabbitMQ node of our own for row 17: Debian's ``rabbitmq-server`` (no plugins) on loopback with
free ports, everything in a temporary directory, and an ``epmd`` of its own; ``stop`` ends both."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.core.server import free_port
from scripts.bench.workload import (
    BenchError,
)

#: Where Debian puts the server script that runs as the calling user (``/usr/sbin``'s ``su``\\ s to rabbitmq).
DEBIAN_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitUnavailable(BenchError):
    """``rabbitmq-server`` (or pika) is not installed: the RabbitMQ rows are skipped."""


# --------------------------------------------------------------------------------------------
# A node of our own
# --------------------------------------------------------------------------------------------


def server_path() -> str | None:
    """The ``rabbitmq-server`` script to run (``$BENCH_RABBITMQ_SERVER``, Debian's, or on PATH), or None."""
    wanted = os.environ.get("BENCH_RABBITMQ_SERVER")
    if wanted:
        return wanted if os.access(wanted, os.X_OK) else None
    if os.access(DEBIAN_SERVER, os.X_OK):
        return DEBIAN_SERVER
    return shutil.which("rabbitmq-server")


def unavailable() -> str | None:
    """Why the RabbitMQ rows cannot run here, or None when they can."""
    if server_path() is None:
        return "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
    if shutil.which("epmd") is None:
        return "epmd (Erlang) is not on PATH"
    try:
        import pika  # noqa: F401
    except ImportError:
        return "pika is not installed (pip install pika: the bench extra)"
    return None


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"nothing listens on 127.0.0.1:{port} (exit code {process.poll()})")
        time.sleep(0.05)


class RabbitNode:
    """A RabbitMQ node of our own on 127.0.0.1: free ports, a temporary directory, no plugins.

    Args:
        server: the ``rabbitmq-server`` script; None means ``server_path()``.
        keep: keep the temporary directory (logs, data) after ``stop``.
        definitions: a definitions document (``definitions``) the node loads while it boots, or None.

    Attributes:
        nodename: ``bench-<pid>@localhost``.
        port: the AMQP port.
        directory: the temporary directory (config, logs, data, the Erlang cookie).
    """

    def __init__(
        self, server: str | None = None, keep: bool = False, definitions: dict[str, Any] | None = None
    ) -> None:
        found = server or server_path()
        if found is None:
            raise RabbitUnavailable("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.server = found
        self.keep = keep
        self.nodename = f"bench-{os.getpid()}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="bench-rabbit-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.start_s = 0.0
        self.definitions = definitions

    def environment(self) -> dict[str, str]:
        """The environment of the server and of ``rabbitmq-diagnostics`` against it."""
        d = self.directory
        return os.environ | {
            "HOME": str(d),  # the Erlang cookie
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self, timeout_s: float = 120.0) -> RabbitNode:
        """Start epmd and the node; wait until a pika connection succeeds.

        Raises:
            BenchError: the node exited or did not accept a connection within ``timeout_s`` (its log
                tail in the message); everything started is stopped first.
        """
        d = self.directory
        (d / "log").mkdir()
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "log.console = false\n"
            "log.file.level = warning\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        if self.definitions is not None:
            (d / "definitions.json").write_text(json.dumps(self.definitions))
            conf = (d / "rabbitmq.conf").read_text()
            (d / "rabbitmq.conf").write_text(conf + f"load_definitions = {d / 'definitions.json'}\n")
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")  # management and every other plugin off
        started = time.perf_counter()
        try:
            env = self.environment()
            self.epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _wait_port(self.epmd_port, self.epmd, 10)
            with (d / "startup.log").open("wb") as out:
                self.process = subprocess.Popen(
                    [self.server],
                    env=env,
                    cwd=d,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - started
        return self

    def parameters(self) -> Any:
        """pika ``ConnectionParameters`` of the node (guest from loopback)."""
        import pika

        return pika.ConnectionParameters(
            host="127.0.0.1", port=self.port, heartbeat=0, blocked_connection_timeout=300
        )

    def _wait_ready(self, timeout_s: float) -> None:
        import pika

        deadline = time.monotonic() + timeout_s
        params = self.parameters()
        params.socket_timeout = 2
        params.connection_attempts = 1
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise BenchError(f"rabbitmq-server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                pika.BlockingConnection(params).close()
                return
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"RabbitMQ did not accept a connection in {timeout_s:.0f} s: {self.log_tail()}"
                    ) from None
                time.sleep(0.25)

    def log_tail(self, chars: int = 1500) -> str:
        """The end of the startup output and of the node's log."""
        texts = []
        for path in (self.directory / "startup.log", *sorted((self.directory / "log").glob("*.log"))):
            with contextlib.suppress(OSError):
                texts.append(f"[{path.name}] " + path.read_text(errors="replace")[-chars:])
        return "\n".join(texts)

    def beam_pids(self) -> list[int]:
        """The Erlang VM's pids (``beam*`` processes of the node's session), for the CPU meter."""
        if self.process is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            name = stat[stat.index(b"(") + 1 : stat.rindex(b")")]
            fields = stat[stat.rindex(b")") + 2 :].split()
            if name.startswith(b"beam") and int(fields[3]) == self.process.pid:  # session id
                pids.append(int(entry.name))
        return pids

    def version(self) -> str:
        """The server's version (from the AMQP connection's server properties)."""
        import pika

        conn = pika.BlockingConnection(self.parameters())
        try:
            props = conn._impl.server_properties  # what the broker said in connection.start
            version = props.get("version", b"?")
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            conn.close()

    def stop(self) -> None:
        """Stop the node (SIGTERM to its session: a clean shutdown; SIGKILL after 30 s), then our epmd,
        and remove the directory unless ``keep``. Safe to call twice."""
        if self.process is not None:
            _stop_session(self.process, 30)
            self.process = None
        if self.epmd is not None:
            _stop_session(self.epmd, 5)
            self.epmd = None
        if not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RabbitNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_session(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the session ``process`` leads (we started it with ``start_new_session``), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + wait_s  # the session's other processes (beam under the script)
        while _session_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _session_alive(process.pid):
            return


def _session_alive(sid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != b"Z":
                return True
    return False
