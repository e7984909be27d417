"""Every table and text line the ``broker`` commands print: rich tables (``_table``) on a console
without markup (``_console``), problems after a listing, results of a publication, messages,
usage lists, the status snapshot and the network status. Nothing here reads Redis.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from broker.clients.loads import Load
from broker.clients.publish import PublishResult
from broker.core.models import Message
from broker.network.network_admin import NetworkStatus, ProxyRow
from broker.operations.acl import UserRow
from broker.operations.dead_letters import DeadLetter
from broker.operations.durables import Deletion
from broker.operations.status import Snapshot, TopicNode, TopicStatus
from broker.operations.topic_stats import TopicStatistics
from broker.topics.declared import Declared
from broker.topics.explain import Route
from broker.topics.retained import RetainedPublication
from broker.topics.subscriptions import SubscriptionRecord
from broker.topics.topic_objects import TopicObject

if TYPE_CHECKING:  # broker.operations.schedules imports croniter: only `broker jobs` needs it
    from broker.operations.schedules import Schedule


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
    """One line per message: topic, publisher, seq, priority, ``non-persistent`` for a NON_PERSISTENT
    message (JMSDeliveryMode), ``retained`` for a retained publication sent to a new subscription,
    the route, ``group=G#N`` for a message of a message group
    (JMSXGroupID, JMSXGroupSeq); a body that is not one line of printable UTF-8 is printed as a
    bytes literal."""
    try:
        body = message.body.decode("utf-8")
        if not body.isprintable():
            body = repr(message.body)
    except UnicodeDecodeError:
        body = repr(message.body)
    seq = "-" if message.seq is None else str(message.seq)
    via = f"  from={'>'.join(message.route)}" if message.origin else ""
    mode = "" if message.persistent else "  non-persistent"
    group = message.group_id
    if group is not None:
        via += f"  group={group}" if message.group_seq is None else f"  group={group}#{message.group_seq}"
    if message.retained:  # sent from the retained store when the subscription was made (MQIsRetained)
        mode += "  retained"
    return (
        f"{message.topic}  publisher={message.publisher}  seq={seq}  priority={message.priority}"
        f"{mode}{via}  {body}"
    )


def _describe_subscription(record: SubscriptionRecord) -> str:
    """The line ``broker subscribe`` prints once attached: id, filter, kind, selector, no-local, mode."""
    kind = "durable" if record.durable else "non-durable, removed on exit"
    extra = "".join(
        [
            f", selector {record.selector!r}" if record.selector else "",
            ", no-local" if record.no_local else "",
            f", {record.mode}",
        ]
    )
    return f"subscribed {record.sub_id} to {record.shown_filter!r} ({kind}{extra})"


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


def _print_proxy_rows(console: Console, rows: list[ProxyRow], qm: str) -> None:
    if not rows:
        console.print(f"{qm} holds no proxy subscriptions")
        return
    table = _table(
        "for queue manager", "topic key", "source", "since (UTC)", title=f"proxy subscriptions held at {qm}"
    )
    for row in rows:
        source = (
            row.source
            if row.source == "dynamic"
            else (f"static at {row.at}" + (", keep_on_unsubscribe" if row.keep else ""))
        )
        table.add_row(row.qm, row.topic, source, _utc(row.since_ms))
    console.print(table)


def _print_snapshot(snapshot: Snapshot, qm: str, url: str) -> None:
    """``broker status``: the summary, the subscriptions and the workers, then the problems.

    Args:
        snapshot: ``broker.operations.status.status``.
        qm: the queue manager's name.
        url: its Redis URL, password redacted.
    """
    console = _console()
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    rows = (
        ("publish stream length", "stream_length"),
        ("pending (read, not committed)", "pending"),
        ("lag (not yet read)", "lag"),
        ("dead-lettered", "dead_lettered"),
        ("poison messages", "poison"),
        ("delayed (waiting for their delivery time)", "delayed"),
        ("active publishers", "active_publishers"),
        ("retained publications", "retained"),
        ("links", "links"),
        ("topic scheme", "topic_scheme"),
        ("index version", "version"),
    )
    for label, name in rows:
        value = getattr(snapshot, name)
        style = "bold red" if name in ("dead_lettered", "poison") and value else ""
        if name == "delayed" and snapshot.next_delivery_ms is not None:
            value = f"{value} (next due {_utc(snapshot.next_delivery_ms)})"
        summary.add_row(label, Text(str(value), style=style))
    console.print(Text.assemble("queue manager ", (qm, "bold"), f" on {url}"))
    console.print(summary)
    if snapshot.subscriptions:
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
        for sub in snapshot.subscriptions:
            subs.add_row(
                sub.id,
                sub.filter,
                "yes" if sub.durable else "no",
                sub.mode,
                *("?" if getattr(sub, k) is None else str(getattr(sub, k)) for k in counts),
            )
        console.print(subs)
    else:
        console.print("no subscriptions")
    if snapshot.workers:
        workers = _table("worker", "pid", "processed", "heartbeat age (ms)", "state")
        for beat in snapshot.workers:
            workers.add_row(
                beat.name,
                str(beat.pid),
                str(beat.processed),
                "never" if beat.heartbeat_age_ms is None else str(beat.heartbeat_age_ms),
                beat.state,
            )
        console.print(workers)
    else:
        console.print("no workers")
    _print_problems(snapshot.problems)


def _print_network(found: NetworkStatus, qm: str) -> None:
    """``broker status --network``: queue managers, channels, proxy subscriptions, problems.

    Args:
        found: ``broker.network.network_admin.network_status`` of a queue manager in a network.
        qm: the queue manager it was seen from.
    """
    console = _console()
    console.print(Text.assemble("network ", (found.network or "", "bold"), " as seen from ", (qm, "bold")))
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
    for row in found.queue_managers:
        if row.reachable:
            cells: list[str | Text] = [
                str(row.state),
                ", ".join(row.announced or ()) or "-",
                str(row.proxies),
                str(row.workers),
                str(row.channel_processes),
            ]
        else:
            cells = [Text((row.error or "")[:60], style="bold red"), "", "", "", ""]
        qms.add_row(
            row.qm,
            row.parent or "-",
            ", ".join(row.clusters) or "-",
            "yes" if row.reachable else Text("no", style="bold red"),
            *cells,
        )
    console.print(qms)
    channels = _table(
        "channel", "state", "moved", "lag", "in-flight", "backoff (ms)", "withheld (slow)", "last error"
    )
    for channel in found.channels:
        bad = channel.state == "retrying" or channel.error
        channels.add_row(
            f"{channel.sender} -> {channel.to}",
            Text(_known(channel.state), style="bold red" if bad else ""),
            _known(channel.moved),
            _known(channel.lag),
            _known(channel.in_flight),
            _known(channel.backoff_ms),
            Text(", ".join(channel.withheld or ()) or "-", style="bold yellow" if channel.withheld else ""),
            (channel.error or channel.last_error or "")[:60],
        )
    console.print(channels)
    _print_proxy_rows(console, found.proxies, qm)
    _print_problems(found.problems)


def _known(value: object) -> str:
    """A figure, or "?" when it could not be read."""
    return "?" if value is None else str(value)


def _progress_bars(label: str, shown: bool) -> Progress:
    """A progress bar on stderr for the Spark commands: ``label`` (a rich column template), the bar,
    done/total, time elapsed; ``shown`` False: disabled."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not shown,
    )


def _print_users(rows: list[UserRow]) -> None:
    """``broker acl list``: user, role, bindings, enabled, rules."""
    table = _table("user", "role", "bindings", "enabled", "rules")
    for row in rows:
        table.add_row(row.user, row.role, row.bindings or "-", "yes" if row.enabled else "no", row.rules)
    _console().print(table)


def _print_dead_letters(rows: list[DeadLetter]) -> None:
    """``broker dlq list``: id, time (UTC), reason, publisher, msgid, topic or subscription, bytes."""
    table = _table("id", "time (UTC)", "reason", "publisher", "msgid", "topic / subscription", "bytes")
    for row in rows:
        where = row.topic or "-"
        if row.subscription is not None:
            where = f"{where} -> {row.subscription}"
        table.add_row(
            row.id,
            _utc(row.time_ms).removesuffix(" UTC"),
            row.reason,
            row.publisher or "-",
            row.msgid or "-",
            where,
            "-" if row.body_size is None else str(row.body_size),
        )
    _console().print(table)


def _print_dead_letter(letter: DeadLetter) -> None:
    """``broker dlq show``: every field of one dead letter, long values cut (``SHOWN_CHARS``)."""
    table = _table("field", "value", title=f"dead letter {letter.id} ({_utc(letter.time_ms)})")
    for name, value in letter.fields.items():
        if name.startswith("dlq.") and name.endswith("_bytes"):
            value_text = f"{_shown_value(value)} bytes: not copied (over max_body_bytes)"
        else:
            value_text = _shown_value(value)
        table.add_row(name, value_text)
    _console().print(table)


def _print_schedules(found: list[Schedule]) -> None:
    """``broker jobs list``: id, job, parameters, cron (UTC), next and last run, last result."""
    table = _table("id", "job", "parameters", "schedule (UTC)", "next run", "last run", "last result")
    for item in found:
        params = " ".join(f"{k}={v}" for k, v in item.params.items())
        table.add_row(
            item.schedule_id,
            item.job,
            params,
            item.cron,
            _utc(item.next_run_ms),
            _utc(item.last_run_ms),
            item.last_result or "-",
        )
    _console().print(table)


def _print_subscriptions(rows: list[tuple[SubscriptionRecord, Load]]) -> None:
    """``broker subscriptions``: id, filter, selector, no-local, durable, mode, consumers, depth,
    in flight (messages)."""
    table = _table(
        "id", "filter", "selector", "no-local", "durable", "mode", "consumers", "depth", "in-flight"
    )
    for record, load in rows:
        table.add_row(
            record.sub_id,
            record.shown_filter,
            record.selector or "-",
            "yes" if record.no_local else "no",
            "yes" if record.durable else "no",
            record.mode,
            str(load.consumers),
            str(load.depth),
            str(load.in_flight),
        )
    _console().print(table)


def _print_deletion(done: Deletion, dry_run: bool) -> None:
    """``broker durables delete``: each subscription deleted (or, ``dry_run``, that would be) and
    the messages it held."""
    table = _table("subscription", "messages held" if dry_run else "messages lost")
    for item in done.deleted:
        table.add_row(item.sub_id, str(item.messages))
    _console().print(table)


def _print_links(found: list[tuple[str, str, bool]]) -> None:
    """``broker links``: source, target, backward."""
    table = _table("source", "target", "backward")
    for source, target, backward in found:
        table.add_row(source, target, "yes" if backward else "no")
    _console().print(table)


def _print_filters(by_filter: dict[str, list[str]]) -> None:
    """``broker topics``: each filter, sorted, and the subscriptions made with it."""
    table = _table("filter", "subscriptions")
    for topic_filter in sorted(by_filter):
        table.add_row(topic_filter, ", ".join(by_filter[topic_filter]))
    _console().print(table)


def _print_route(route: Route) -> None:
    """``broker topics TOPIC``: each topic reached (published on, or linked), the subscriptions
    matched through it, then the subscriptions that get one copy each."""
    table = _table(
        "topic reached",
        "how",
        "subscriptions matched",
        "kept out (WILDCARD(BLOCK))",
        title=f"route of {route.topic}",
    )
    for reached, matched in route.via.items():
        how = "published on" if reached == route.topic else "linked"
        table.add_row(
            reached, how, ", ".join(matched) or "-", ", ".join(route.blocked.get(reached, [])) or "-"
        )
    _console().print(table)
    n = len(route.subscriptions)
    listed = ": " + ", ".join(route.subscriptions) if route.subscriptions else ""
    click.echo(f"delivered once to {n} subscription{'' if n == 1 else 's'}{listed}")
    click.echo(f"rule: {route.rule}")
    for client_id, left_out in route.left_out.items():
        click.echo(f"no copy (one per subscriber for {client_id}): {', '.join(left_out)}")
    for group in route.one_of:
        click.echo(f"one copy to the first that selects it: {', '.join(group)}")
    if route.conditional:
        click.echo(f"decided per publication (selector or no-local): {', '.join(route.conditional)}")


def _print_declared(found: list[Declared]) -> None:
    """``broker topic list``: each declared topic, where it was declared (cli or config), when (UTC)."""
    table = _table("topic", "source", "declared")
    for item in found:
        table.add_row(item.topic, item.source, _utc(item.declared_ms))
    _console().print(table)


def _print_topic_objects(objects: list[TopicObject], names: list[str]) -> None:
    """``broker topic display``: each topic object's name, topic string and the attributes ``names``."""
    table = _table("name", "topic string", *(n.upper() for n in names))
    for obj in objects:
        attrs = obj.attributes
        table.add_row(obj.name, obj.topic_string or "''", *(str(getattr(attrs, n)) for n in names))
    _console().print(table)


def _print_topic_status(found: TopicStatus) -> None:
    """``broker topic status``: effective attributes and their objects, the route, the subscriptions
    reached (and blocked), the publishers among the newest stream entries."""
    console = _console()
    table = _table("attribute", "value", "from", title=f"topic {found.topic!r}")
    for name, value, source in found.attributes:
        table.add_row(name.upper(), str(value), source)
    console.print(table)
    route = _table("topic reached", "how", "subscriptions matched")
    for reached, matched in found.via.items():
        route.add_row(
            reached, "published on" if reached == found.topic else "linked", ", ".join(matched) or "-"
        )
    console.print(route)
    click.echo(f"delivered once to {len(found.subscriptions)}: {', '.join(found.subscriptions) or '-'}")
    click.echo(f"route class: {found.route_class}")
    if found.blocked:
        why = f"WILDCARD(BLOCK) of topic object {found.blocked_by}" if found.blocked_by else "WILDCARD(BLOCK)"
        click.echo(f"blocked by {why}: {', '.join(found.blocked)}")
    seen = ", ".join(f"{p} ({n})" for p, n in sorted(found.publishers.items())) or "none"
    last = "-" if found.last_publication_ms is None else str(found.last_publication_ms)
    click.echo(
        f"publishers in the newest {found.scanned} stream entries: {seen}; last publication (ms): {last}"
    )
    click.echo(f"retained publication: {_retained_text(found.retained)}")


def _retained_text(kept: RetainedPublication | None) -> str:
    """A topic's retained publication in one line: its msgid, publisher, time and body, or "none"."""
    if kept is None:
        return "none"
    message = kept.message
    if message is None:
        return f"{kept.size_bytes} bytes that are not an envelope"
    return (
        f"{message.msgid} from {message.publisher} at {message.timestamp_ms} ms, {_body_text(message.body)}"
    )


def _body_text(body: bytes) -> str:
    """A body to print: one line of printable UTF-8, or a bytes literal."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return repr(body)
    return text if text.isprintable() else repr(body)


def _print_retained(found: list[RetainedPublication]) -> None:
    """``broker retained list``: one row per topic string with a retained publication."""
    table = _table("topic", "msgid", "publisher", "published (ms)", "priority", "bytes", "body")
    for kept in found:
        message = kept.message
        if message is None:
            table.add_row(kept.topic, "-", "-", "-", "-", str(kept.size_bytes), "(not an envelope)")
            continue
        table.add_row(
            kept.topic,
            message.msgid,
            message.publisher,
            str(message.timestamp_ms),
            str(message.priority),
            str(kept.size_bytes),
            _body_text(message.body)[:60],
        )
    _console().print(table)
    click.echo(f"{len(found)} retained publication(s)")


def _print_topic_statistics(found: TopicStatistics) -> None:
    """``broker topic status``'s statistics line (IBM MQ ``DISPLAY TPSTATUS``)."""
    last = _utc(found.last_publication_ms)
    click.echo(
        f"statistics: {found.publications} publications, {found.copies} copies delivered, "
        f"last publication {last} ({found.last_publication_ms or '-'} ms), {found.subscriptions} subscriptions"
    )


def _print_top_topics(rows: list[TopicStatistics]) -> None:
    """``broker topic stats``: the topic strings with the most publications."""
    table = _table(
        "topic", "publications", "copies", "subscriptions", "last publication", title="topic statistics"
    )
    for row in rows:
        subs = "-" if row.subscriptions is None else str(row.subscriptions)
        table.add_row(row.shown, str(row.publications), str(row.copies), subs, _utc(row.last_publication_ms))
    _console().print(table)
    if not rows:
        click.echo("no publications counted (the workers add their counts every topic_stats_flush_ms)")


def _print_topic_tree(root: TopicNode) -> None:
    """``broker topic tree``: each level, its topic object, its subscriptions and its links."""

    def label(level: str, node: Any) -> str:
        parts = [level or "''"]
        if node.topic_object:
            parts.append(f"[{node.topic_object}]")
        if node.subscriptions:
            parts.append(f"{node.subscriptions} subscription{'' if node.subscriptions == 1 else 's'}")
        parts += [f"-> {target}" for target in node.links_to]
        return "  ".join(parts)

    def grow(branch: Tree, node: Any) -> None:
        for level in sorted(node.children):
            child = node.children[level]
            grow(branch.add(label(level, child)), child)

    tree = Tree(label("", root))
    grow(tree, root)
    _console().print(tree)
