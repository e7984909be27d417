"""``broker acl``: broker roles as Redis ACL users (add, list, rotate, delete, file), and per-topic
authorization (grant, revoke)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click
import redis

from broker.cli.common import State
from broker.cli.render import (
    _print_problems,
    _print_users,
)
from broker.core.principals import holders
from broker.network.channel import read_network
from broker.operations.acl import RoleSpec, acl_file, add_user, delete_user, list_users, read_password, rotate
from broker.operations.grants import describe, grant, list_grants, revoke


@click.group(
    "acl", short_help="Broker roles as Redis ACL users: add, list, rotate, delete, file, grant, revoke."
)
def acl_group() -> None:
    """Roles as Redis ACL users (broker.operations.acl): publisher, subscriber, worker, channel, admin, monitor.

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
@click.option(
    "--move",
    is_flag=True,
    help="publisher: take a --publisher-id bound to another user away from it (else refused).",
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
    move: bool,
    password_env: str | None,
    password_file: str | None,
) -> None:
    """Create (or replace) ACL user USER with ROLE's rules on this queue manager.

    A publisher id has one principal: one bound to another user is refused (exit code 2) unless
    --move is given."""
    password = read_password(password_env, password_file)
    client, qm = state.client(), state.settings.qm
    peer_list = list(peers)
    if role == "channel" and not peer_list:
        network = read_network(client, qm)
        # every other one: a channel process reads every queue manager's announcement
        if network is not None:
            peer_list = sorted(q for q in network.queue_managers if q != qm)
    spec = RoleSpec(role, list(publisher_ids), client_id, peer_list)  # type: ignore[arg-type]
    moved = holders(client, qm, user, spec.publisher_ids) if move and role == "publisher" else {}
    found = add_user(client, qm, user, spec, password, move=move)
    click.echo(f"user {user}: role {role} on {qm}; {_save_acl(client)}")
    for other, ids in sorted(moved.items()):
        click.echo(f"moved publisher id {', '.join(ids)} from user {other} to {user}")
    click.echo("rules: " + " ".join(found))


@acl_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print {users, problems} as one JSON object.")
@click.pass_obj
def acl_list(state: State, as_json: bool) -> None:
    """List the users broker acl made for this queue manager: role, bindings, rules (no password)."""
    client, qm = state.client(), state.settings.qm
    rows, problems = list_users(client, qm)
    granted, unreadable = list_grants(client, qm)
    problems += [str(p) for p in unreadable]
    if as_json:
        grants = {user: {k: v for k, v in asdict(r).items() if v} for user, r in granted.items()}
        click.echo(
            json.dumps({"users": [asdict(r) for r in rows], "grants": grants, "problems": problems}, indent=2)
        )
        return
    _print_users(rows)
    if granted:
        click.echo("grants (a user without a publish or subscribe grant is unrestricted for it):")
        for user, record in granted.items():
            click.echo(f"  {user}: {describe(record)}")
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
    client = state.client()
    existed = delete_user(client, state.settings.qm, user)
    revoke(client, state.settings.qm, user, everything=True)
    click.echo(f"user {user}: {'deleted' if existed else 'did not exist'}; {_save_acl(client)}")


@acl_group.command("file")
@click.pass_obj
def acl_file_command(state: State) -> None:
    """Print an ACL file (passwords as SHA-256) of this queue manager's broker users, for your own Redis."""
    click.echo(acl_file(state.client(), state.settings.qm), nl=False)


_grant_options = [
    click.option("--publish", "publish", multiple=True, metavar="FILTER", help="A topic filter (repeat)."),
    click.option(
        "--subscribe", "subscribe", multiple=True, metavar="FILTER", help="A topic filter (repeat)."
    ),
    click.option(
        "--publish-object",
        "publish_objects",
        multiple=True,
        metavar="NAME",
        help="A topic object: its topic string's subtree (repeat).",
    ),
    click.option(
        "--subscribe-object",
        "subscribe_objects",
        multiple=True,
        metavar="NAME",
        help="A topic object: its topic string's subtree (repeat).",
    ),
]


def _with_grants(func: Any) -> Any:
    for option in reversed(_grant_options):
        func = option(func)
    return func


@acl_group.command("grant")
@click.argument("user")
@_with_grants
@click.pass_obj
def acl_grant(state: State, user: str, **asked: tuple[str, ...]) -> None:
    """Let USER publish or subscribe on topics (per-topic authorization; docs/security.md).

    A user without a publish grant may publish on any topic; once it has one, only on the topics
    its publish grants match (the same for subscribe grants, checked when it asks for a
    subscription). A grant on a topic object covers its topic string and every topic below."""
    record = grant(state.client(), state.settings.qm, user, **asked)
    click.echo(f"user {user}: {describe(record)}")


@acl_group.command("revoke")
@click.argument("user")
@_with_grants
@click.option("--all", "everything", is_flag=True, help="Every grant of USER (it is unrestricted again).")
@click.pass_obj
def acl_revoke(state: State, user: str, everything: bool, **asked: tuple[str, ...]) -> None:
    """Take grants from USER (exit code 2 for one it does not have; nothing is changed then)."""
    record = revoke(state.client(), state.settings.qm, user, everything=everything, **asked)
    click.echo(f"user {user}: {describe(record) or 'no grants (unrestricted)'}")


#: The commands this module adds to ``broker``.
COMMANDS = (acl_group,)
