"""``broker definitions export/import``: the queue manager's definitions as one JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import click

from broker.cli.common import State
from broker.operations.definitions import export_definitions, import_definitions


@click.group(
    "definitions", short_help="Export or import definitions (subscriptions, links, topics, users) as JSON."
)
def definitions_group() -> None:
    """The queue manager's definitions as one JSON document, like RabbitMQ's: durable
    subscriptions, links, topic objects, declared topics, users (never a password), grants and
    the queue controllers. The management API's GET/POST /api/definitions does the same."""


@definitions_group.command("export")
@click.argument("file", required=False, type=click.Path(dir_okay=False, writable=True))
@click.pass_obj
def definitions_export(state: State, file: str | None) -> None:
    """Write the definitions to FILE (standard output without one)."""
    text = json.dumps(export_definitions(state.client(), state.settings), indent=2, sort_keys=True)
    if file is None:
        click.echo(text)
        return
    Path(file).write_text(text + "\n", encoding="utf-8")
    click.echo(f"definitions of {state.settings.qm} written to {file}")


@definitions_group.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option(
    "--skip-users",
    is_flag=True,
    help="Leave out the users this queue manager lacks, and their grants (an admin may not make ACL "
    "users: an operator makes them with `broker acl add`).",
)
@click.pass_obj
def definitions_import(state: State, file: str, skip_users: bool) -> None:
    """Create what FILE defines that the queue manager lacks ('-': standard input).

    The whole document is checked first: a bad one is refused (exit 2) and nothing is written.
    What exists with the same settings is kept; a user that exists keeps its password. A user
    made here has no password and cannot log in until you give it one:
    `broker acl rotate NAME --password-env VAR`. Making users takes ACL rights (an operator's
    user): as the broker's admin role, a document naming users this queue manager lacks is
    refused (exit 3) unless --skip-users is given.
    """
    with click.open_file(file, encoding="utf-8") as source:
        text = source.read()
    report = import_definitions(state.client(), state.settings, text, skip_users=skip_users)
    for section, names in sorted(report.created.items()):
        click.echo(f"created {len(names)} {section}: {', '.join(names)}")
    for section, names in sorted(report.kept.items()):
        click.echo(f"kept {len(names)} {section} (already there)")
    for section, names in sorted(report.skipped.items()):
        click.echo(f"skipped {len(names)} {section} (--skip-users): {', '.join(names)}")
    for note in report.notes:
        click.echo(f"note: {note}")
    made = [n for n in report.created.get("users", [])]
    if made:
        click.echo(f"users made without a password: set one with `broker acl rotate NAME`: {', '.join(made)}")


#: The commands this module adds to ``broker``.
COMMANDS = (definitions_group,)
