"""``broker network`` (apply, show, withdraw) and ``broker proxies`` (list, remove)."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from broker.cli.common import State, _fail
from broker.cli.render import _console, _print_problems, _print_proxy_rows
from broker.network.channel import read_network
from broker.network.network_admin import (
    apply_network,
    describe_network,
    list_proxies,
    remove_proxies,
    withdraw,
)
from broker.topics.topology import load_network


@click.group("network", short_help="The network of queue managers: apply, show, withdraw.")
def network_group() -> None:
    """Many queue managers, one topic space: hierarchies, clusters, proxy subscriptions."""


@network_group.command("apply")
@click.argument("network_file", default="configs/network.toml", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Check the file and print the topology; change nothing.")
@click.pass_obj
def network_apply(state: State, network_file: str, dry_run: bool) -> None:
    """Store NETWORK_FILE's topology in every queue manager it names (their workers reload at once)."""
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
    settings = state.settings
    record = withdraw(state.client(), settings.qm, settings.redis_url, settings.tls)
    click.echo(f"{settings.qm}: withdrawn ({len(record['keys'])} keys announced)")


@click.group("proxies", invoke_without_command=True, short_help="List the proxy subscriptions held here.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print {proxies, announced, problems} as one JSON object."
)
@click.pass_context
def proxies_command(ctx: click.Context, as_json: bool) -> None:
    """List the proxy subscriptions this queue manager holds for others (remote queue manager,
    topic key, dynamic or static), and what it announces itself."""
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
    _print_proxy_rows(console, rows, qm)
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
    node). They come back only when REMOTE_QM announces again (a newer announcement: its channel
    process starting), not from its old one; static ones stay (network file)."""
    removed = remove_proxies(state.client(), state.settings.qm, remote_qm)
    click.echo(f"{state.settings.qm}: removed {removed} proxy subscription(s) for {remote_qm}")


#: The commands this module adds to ``broker``.
COMMANDS = (
    network_group,
    proxies_command,
)
