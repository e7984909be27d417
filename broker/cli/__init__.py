"""The ``broker`` command line: one click group, ``main``, and one module per command group.

Each command parses its arguments, calls one library function and prints the
result (``render`` holds every table and text rendering). Errors are turned into
one line on stderr, once, in ``common.BrokerGroup``: ``error: <message>`` and the
error's ``exit_code`` (2 bad input, 3 refused by the broker, 4 Redis unreachable),
never a traceback.

Global options (``--config``, ``--redis-url``, ``--qm``, ``--log-format``,
``--log-level``) also come from the ``BROKER_CONFIG``, ``BROKER_REDIS_URL``,
``BROKER_QM``, ``BROKER_LOG_FORMAT`` and ``BROKER_LOG_LEVEL`` environment variables.
Settings are loaded on first use, so ``broker CMD --help`` works even when the
configuration is broken.

Modules: ``common`` (the shared ``State``, error translation, shared options),
``render`` (tables and text), ``processes`` (worker, scheduler, server, cli,
channel, metrics, console), ``demo``, ``publish``, ``subscriptions`` (subscribe,
browse, unsubscribe, subscriptions, durables, subscribers), ``jobs``, ``dlq``,
``repair``, ``topics`` (link, unlink, links, topics, topic), ``status``, ``acl``,
``network`` (network, proxies) and ``pipeline`` (pipeline, journal; PySpark is
imported only when one of their commands runs).

This is the application layer: it sits on top of the broker's core
(``broker``) and of the worker pool (``worker``), and is the only place besides
``broker.demo.replay`` (the demo package) that imports ``worker`` (lazily).
"""

from __future__ import annotations

import click

from broker.cli import (
    acl,
    definitions,
    demo,
    dlq,
    jobs,
    network,
    pipeline,
    processes,
    publish,
    repair,
    status,
    subscriptions,
    topics,
)
from broker.cli.common import BrokerGroup, State


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


for _module in (
    processes,
    demo,
    publish,
    subscriptions,
    jobs,
    dlq,
    repair,
    topics,
    status,
    acl,
    definitions,
    network,
    pipeline,
):
    for _command in _module.COMMANDS:
        main.add_command(_command)

__all__ = ["main"]
