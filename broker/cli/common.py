"""The shared part of the ``broker`` commands: ``State`` (the settings and a client, made on first
use), ``BrokerGroup`` (every broker, Redis and bad-name error as one line and an exit code),
``_fail``, logging for the long-running processes and the shared ``--wait-ms`` option.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import click
import redis

from broker.core.config import Settings, load_settings
from broker.core.connection import connect, redact_url, tls_hint
from broker.core.errors import (
    BrokerError,
    ConnectionLost,
    ServerError,
    redis_error,
)
from broker.core.logs import configure_logging

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
            self._report(ctx, exc, exc.__cause__)
        except redis.RedisError as exc:  # a command that called redis-py itself: translated here
            error = redis_error(exc, ctx.invoked_subcommand or "the command")
            if isinstance(error, ServerError):  # named with the server it came from
                error = ServerError(f"Redis at {self._url(ctx)} answered with an error: {exc}")
            assert isinstance(error, BrokerError)
            self._report(ctx, error, exc)
        except ValueError as exc:
            _fail(str(exc), BAD_INPUT)

    def _report(self, ctx: click.Context, exc: BrokerError, cause: BaseException | None) -> NoReturn:
        """``exc`` as one line (a lost connection names the server, and a hint) and its exit code."""
        message = str(exc)
        if isinstance(exc, ConnectionLost) and "cannot reach Redis at" not in message:
            shown_cause = cause or message
            message = f"cannot reach Redis at {self._url(ctx)}: {shown_cause}{self._hint(ctx, shown_cause)}"
        if isinstance(cause, redis.exceptions.NoPermissionError):
            message += self._refusal(ctx)
        _fail(message, exc.exit_code)

    @staticmethod
    def _refusal(ctx: click.Context) -> str:
        """What a refusal by the ACL (NOPERM) means for the URL's user: its role, when known, and what
        that role may do (``broker.operations.acl.refusal_for``)."""
        from broker.operations.acl import refusal_for, role_of

        if not isinstance(ctx.obj, State):
            return refusal_for(None, None)
        user = ctx.obj.settings.url_credentials()[0]
        return refusal_for(user, role_of(ctx.obj.client(), ctx.obj.settings.qm, user))

    @staticmethod
    def _url(ctx: click.Context) -> str:
        return ctx.obj.target_url() if isinstance(ctx.obj, State) else "the configured server"

    @staticmethod
    def _hint(ctx: click.Context, error: BaseException | str) -> str:
        return ctx.obj.tls_hint(error) if isinstance(ctx.obj, State) else ""


def _start_logging(settings: Settings, notice: str) -> None:
    """Configure this process's logging (``broker.core.logs``) and say what it runs: on stderr, or as a
    log record with ``--log-format json`` (a log shipper reads only JSON lines there)."""
    configure_logging(settings.log_format, settings.log_level)
    if settings.log_format == "json":
        logging.getLogger("broker.cli").info("%s", notice)
    else:
        click.echo(notice, err=True)


#: ``--wait-ms`` of the long-running commands (worker, scheduler, channel).
_wait_ms_option = click.option(
    "--wait-ms",
    type=click.IntRange(0),
    default=30_000,
    show_default=True,
    help="How long to wait for the Redis server to come up, ms.",
)
