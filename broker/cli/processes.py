"""The long-running processes: ``broker worker``, ``scheduler``, ``server``, ``channel``, ``metrics``,
``console``, and ``broker cli`` (valkey-cli against the configured server).

The worker pool, rq, prometheus_client and the console's Starlette app are imported inside the
command that runs them, so ``broker --help`` and the other commands start without them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import click

from broker.cli.common import State, _fail, _start_logging, _wait_ms_option
from broker.core.connection import redact_url, wait_for_server
from broker.core.server import Server
from broker.core.server import cli_command as cli_argv
from broker.network.channel import ChannelProcess
from broker.operations.acl import admin_acl_file


@click.command("worker", short_help="Run the worker pool (fan-out) in the foreground.")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes to run (default: the 'concurrency' setting).",
)
@_wait_ms_option
@click.pass_obj
def worker_command(state: State, concurrency: int | None, wait_ms: int) -> None:
    """Run the worker pool in the foreground until SIGTERM or Ctrl-C.

    Each worker fans publications out to subscriber queues; a worker that dies
    is restarted. On SIGTERM each finishes its unit of work and exits within
    stop_grace_ms (ms).
    """
    # lazy: the worker pool (multiprocessing, the worker loop) only when this command runs
    from worker.pool import Pool

    settings = state.settings
    if concurrency is not None:
        settings = settings.model_copy(update={"concurrency": concurrency})
    wait_for_server(settings.redis_url, wait_ms, tls=settings.tls).close()
    _start_logging(
        settings,
        f"running {settings.concurrency} worker(s) for queue manager {settings.qm} "
        f"on {redact_url(settings.redis_url)}; Ctrl-C stops them",
    )
    Pool(settings).run()


@click.command("scheduler", short_help="Run the rq worker for the scheduled admin jobs.")
@click.option(
    "--interval-ms",
    type=click.IntRange(1_000),
    default=60_000,
    show_default=True,
    help="How often each admin job runs, ms.",
)
@_wait_ms_option
@click.pass_obj
def scheduler_command(state: State, interval_ms: int, wait_ms: int) -> None:
    """Schedule the admin jobs (trim acknowledged stream entries, usage snapshots, and with
    durable_idle_expiry_ms the deletion of idle durable subscriptions) and run an rq worker with
    its scheduler on the broker-admin queue until Ctrl-C; it also runs `broker jobs` schedules."""
    # lazy: rq is imported only by the commands that schedule or run admin jobs
    from broker.jobs import run_scheduler

    settings = state.settings
    wait_for_server(settings.redis_url, wait_ms, tls=settings.tls).close()
    _start_logging(
        settings,
        f"admin jobs every {interval_ms} ms for queue manager {settings.qm} on {redact_url(settings.redis_url)}",
    )
    run_scheduler(
        settings.redis_url, settings.qm, interval_ms, settings.durable_idle_expiry_ms, tls=settings.tls
    )


@click.command("server", short_help="Run the embedded Valkey server in the foreground.")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="TCP port on 127.0.0.1 (default: the 'server_port' setting, 6380).",
)
@click.option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Data directory for the AOF/RDB files (default: the 'server_dir' setting, .broker).",
)
@click.pass_obj
def server_command(state: State, port: int | None, data_dir: str | None) -> None:
    """Run the embedded Redis-protocol server (Valkey) in the foreground until SIGTERM or Ctrl-C.

    Loads the 'server_config' redis.conf (default: the one shipped in the
    package: AOF every second, noeviction), then the function library
    'broker' (when missing or older). The server logs
    to this terminal. On SIGTERM or Ctrl-C it waits up to stop_grace_ms (ms)
    for connected clients to leave (workers give up their turns), then stops.
    """
    settings = state.settings
    config_file = settings.server_config_file()
    args: tuple[str, ...] = ()
    directory = data_dir or settings.server_dir
    if settings.security:
        user, password = settings.url_credentials()
        if not user or not password:
            _fail(
                "security = true needs the administrator's credentials in the Redis URL: "
                "BROKER_REDIS_URL=redis://<user>:<password>@127.0.0.1:<port>/0",
                2,
            )
        # the server's files are its own: ACL SAVE writes the users' file anew (password hashes),
        # and the AOF holds every message
        os.umask(0o077)
        acl = Path(directory) / "users.acl"
        acl.parent.mkdir(parents=True, exist_ok=True)
        if not acl.exists():  # made once; later users are added with broker acl (ACL SAVE keeps them)
            acl.write_text(admin_acl_file(user, password))
            acl.chmod(0o600)
        args = ("--aclfile", str(acl.resolve()))
    server = Server(port=port or settings.server_port, data_dir=directory, config_file=config_file, args=args)
    server.username, server.password = settings.url_credentials() if settings.security else (None, None)

    def _on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code = 0
    stopping = False
    try:
        server.start(foreground_output=True, own_session=True)
        _load_library(server)
        click.echo(f"broker server listening on {server.url} (data in {server.data_dir})")
        assert server.process is not None
        code = server.process.wait()
    except KeyboardInterrupt:
        stopping = True
    finally:
        # Controlled shutdown: clients (workers giving up their turns, the scheduler) finish first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.stop(grace_ms=settings.stop_grace_ms if stopping else 0)
        signal.signal(signal.SIGTERM, previous)
    if code:
        _fail(f"the server exited with code {code}", 1)


def _load_library(server: Server) -> None:
    """Load (or upgrade) the function library (the consumers' and the unit of work's) on the server
    just started; a failure is said and the server runs on (the workers load it when they start)."""
    import redis

    from broker.core.library import load_library

    try:
        with redis.Redis(
            host="127.0.0.1", port=server.port, username=server.username, password=server.password
        ) as client:
            load_library(client)
    except redis.RedisError as exc:
        click.echo(f"the broker function library was not loaded: {exc} (workers load it)", err=True)


@click.command(
    "cli",
    short_help="Run valkey-cli (shipped with the broker) against the configured server.",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def cli_command(state: State, args: tuple[str, ...]) -> None:
    """Run the valkey-cli that the install brings with ARGS, against the configured server.

    Host, port, database, user and password come from the Redis URL (the
    password through REDISCLI_AUTH, never on the command line); a rediss://
    URL adds --tls and the tls_* settings (--cacert, --cert, --key, --insecure),
    and needs a valkey-cli or redis-cli built with TLS. For example:
    broker cli XADD '{QM1}:publish' '*' publisher svc-7 topic /ORDERS/EU body hello
    """
    argv, extra_env = cli_argv(state.settings.redis_url, args, state.settings.tls)
    code = subprocess.run(argv, env={**os.environ, **extra_env}, check=False).returncode
    if code:
        raise click.exceptions.Exit(code)


@click.command("channel", short_help="Run the channel process: proxy subscriptions and channel movers.")
@click.option(
    "--once", is_flag=True, help="One round (announce, reconcile, one move per channel), then exit."
)
@_wait_ms_option
@click.pass_obj
def channel_command(state: State, once: bool, wait_ms: int) -> None:
    """Run this queue manager's channel process until SIGTERM or Ctrl-C: it announces its
    subscriptions, keeps its proxy subscriptions in step with the network, and moves its
    transmission streams to the receiving queue managers, in order, each entry once."""
    settings = state.settings
    wait_for_server(settings.redis_url, wait_ms, tls=settings.tls).close()
    if once:
        process = ChannelProcess(state.client(), settings)
        process.rejoin()
        moved = process.run_once()
        process.close()
        click.echo(
            f"{settings.qm}: moved {moved} transmission entries; channels: {', '.join(sorted(process.movers)) or '-'}"
        )
        return
    # lazy: the worker pool (multiprocessing, the worker loop) only when this command runs
    from worker.pool import Pool, run_channel

    _start_logging(
        settings,
        f"channel process for queue manager {settings.qm} on {redact_url(settings.redis_url)} "
        "(restarted if it dies); Ctrl-C stops it",
    )
    Pool(
        settings.model_copy(update={"concurrency": 1}),
        entry_point=run_channel,
        name="broker-channel",
        serve_metrics=False,
    ).run()


@click.command("metrics", short_help="Serve the metrics sampled from Redis on /metrics (Prometheus).")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="TCP port (default: the 'metrics_port' setting, or 9464 when it is 0).",
)
@click.option("--once", is_flag=True, help="Print the metrics once (Prometheus text format) and exit.")
@_wait_ms_option
@click.pass_obj
def metrics_command(state: State, port: int | None, once: bool, wait_ms: int) -> None:
    """Serve on /metrics what is sampled from Redis at each scrape (stream, subscriptions, dead
    letters by reason, channel lag) until Ctrl-C, for when the workers run elsewhere: the
    workers' own counters and latencies are served by `broker worker` with metrics_port set.
    Names and meanings: docs/operations.md, section Metrics."""
    # lazy: prometheus_client only when the metrics are served
    from broker.operations.metrics import MetricsServer, exposition, sampled_registry

    settings = state.settings
    if once:
        state.client().ping()  # an unreachable server is an error, not an empty exposition
        click.echo(exposition(sampled_registry(state.client(), settings)), nl=False)
        return
    wait_for_server(settings.redis_url, wait_ms, tls=settings.tls).close()
    port = port or settings.metrics_port or 9464
    server = MetricsServer(sampled_registry(state.client(), settings), port, settings.metrics_host)
    click.echo(
        f"metrics of queue manager {settings.qm} on http://{settings.metrics_host}:{port}/metrics; Ctrl-C stops",
        err=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@click.command("console", short_help="Run the web console (monitor and admin logins).")
@click.option(
    "--host", default=None, help="Address to listen on (default: the 'console_host' setting, 127.0.0.1)."
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="TCP port (default: the 'console_port' setting, 8470).",
)
@click.pass_obj
def console_command(state: State, host: str | None, port: int | None) -> None:
    """Serve the web console until Ctrl-C: overview, subscriptions, topic tree, dead letters
    (replay, purge), workers and channels, refreshed live.

    Log in as a Redis ACL user made with 'broker acl add NAME --role monitor' (sees) or
    '--role admin' (acts). It listens on the loopback address unless told otherwise: put a
    TLS proxy in front of it to serve it further (docs/operations.md).
    """
    # lazy: uvicorn and the console's Starlette app only when the console runs
    import uvicorn

    from broker.operations.console import create_app

    settings = state.settings
    host = host or settings.console_host
    port = port or settings.console_port
    app = create_app(settings)
    shown = f"[{host}]" if ":" in host else host
    click.echo(
        f"broker console for queue manager {settings.qm} on {redact_url(settings.redis_url)}: "
        f"http://{shown}:{port}/ (Ctrl-C stops it)",
        err=True,
    )
    # uvicorn stops serving on SIGTERM / SIGINT and then raises the signal again, to the handler
    # in place before it: this one lets the orderly stop exit 0, as a Procfile expects.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: None)
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False)


#: The commands this module adds to ``broker``.
COMMANDS = (
    worker_command,
    scheduler_command,
    server_command,
    cli_command,
    channel_command,
    metrics_command,
    console_command,
)
