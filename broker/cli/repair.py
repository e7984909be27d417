"""``broker repair stream``: move the publish stream's work to a fresh stream."""

from __future__ import annotations

import click

from broker.cli.common import State
from broker.core import keys
from broker.operations.repair import repair_stream


@click.group("repair", short_help="Repair the publish stream: move its work to a fresh stream.")
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


#: The commands this module adds to ``broker``.
COMMANDS = (repair_group,)
