"""Every table and text line the ``broker`` commands print: rich tables (``_table``) on a console
without markup (``_console``), problems after a listing, results of a publication, messages,
usage lists, the status snapshot and the network status. Nothing here reads Redis.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from broker.models import Message
from broker.publish import PublishResult


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


def _utc(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
