"""``broker status``: the queue manager's snapshot, ``--json``, ``--network`` and the live ``--watch``."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from broker.cli.common import State
from broker.cli.render import _console, _print_network, _print_snapshot
from broker.core.connection import redact_url
from broker.network.network_admin import network_status
from broker.operations.status import status as status_of
from broker.operations.watch import take_sample, watch


@click.command("status", short_help="Show stream, queues, dead letters and workers.")
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
        click.echo(json.dumps(asdict(snapshot), indent=2, sort_keys=True))
        return
    _print_snapshot(snapshot, state.settings.qm, redact_url(state.settings.redis_url))


def _print_network_status(state: State, as_json: bool) -> None:
    settings = state.settings
    found = network_status(state.client(), settings.qm, settings.redis_url, settings.tls)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2, sort_keys=True))
        return
    if found.network is None:
        click.echo(f"{settings.qm} is in no network (broker network apply configs/network.toml)")
        return
    _print_network(found, settings.qm)


#: The commands this module adds to ``broker``.
COMMANDS = (status_command,)
