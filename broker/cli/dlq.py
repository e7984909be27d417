"""``broker dlq``: the dead-letter queue (list, show, replay, purge) and its shared filters."""

from __future__ import annotations

from typing import Any

import click

from broker.cli.common import State, _fail
from broker.cli.render import (
    _print_dead_letter,
    _print_dead_letters,
    _print_problems,
)
from broker.operations.dead_letters import Selection, dumps, list_dead_letters, purge, replay, show


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

    return Selection(ids=ids, everything=everything, **given)


@click.group("dlq", short_help="The dead-letter queue: list, show, replay, purge.")
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
    rows, problems = list_dead_letters(state.client(), state.settings.qm, _dlq_selection(**given), count)
    if as_json:
        click.echo(dumps({"dead_letters": [r.to_json() for r in rows], "problems": problems}))
        return
    if not rows:
        click.echo("no dead letters")
    else:
        _print_dead_letters(rows)
        if len(rows) == count:
            click.echo(f"the first {count} shown (--count)")
    _print_problems(problems)


@dlq_group.command("show")
@click.argument("entry")
@click.option("--json", "as_json", is_flag=True, help="Print the dead letter as one JSON object.")
@click.pass_obj
def dlq_show(state: State, entry: str, as_json: bool) -> None:
    """Show every field of dead letter ENTRY (an id from `broker dlq list`)."""
    letter = show(state.client(), state.settings.qm, entry)
    if as_json:
        click.echo(dumps(letter.to_json()))
        return
    _print_dead_letter(letter)


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


#: The commands this module adds to ``broker``.
COMMANDS = (dlq_group,)
