"""``broker status``: the queue manager's snapshot, ``--json``, ``--network`` and the live ``--watch``."""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from broker.cli.common import State
from broker.cli.render import _console, _print_problems, _print_proxy_rows, _table
from broker.connection import redact_url
from broker.network_admin import network_status
from broker.status import status as status_of
from broker.watch import take_sample, watch


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


#: The commands this module adds to ``broker``.
COMMANDS = (status_command,)
