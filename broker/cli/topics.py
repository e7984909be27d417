"""Topic administration: ``broker link``, ``unlink``, ``links``, ``topics`` (list filters, explain a
topic), the ``broker topic`` group (IBM MQ's DEFINE/ALTER/DELETE/DISPLAY TOPIC, DISPLAY TPSTATUS,
declared topics, the topic tree) and ``broker retained list/clear`` (retained publications).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click
from pydantic import ValidationError

from broker.cli.common import State
from broker.cli.render import (
    _print_declared,
    _print_filters,
    _print_links,
    _print_problems,
    _print_retained,
    _print_route,
    _print_top_topics,
    _print_topic_objects,
    _print_topic_statistics,
    _print_topic_status,
    _print_topic_tree,
)
from broker.operations.status import topic_status, topic_tree
from broker.operations.topic_stats import top_topics, topic_statistics
from broker.topics import copies as copies_setting
from broker.topics import declared, explain, links, topic_objects
from broker.topics.retained import clear_retained, list_retained
from broker.topics.subscriptions import read_subscriptions


@click.command("link", short_help="Link a source topic to a target topic.")
@click.argument("source")
@click.argument("target")
@click.option(
    "--backward",
    is_flag=True,
    help="Allow the link even if it closes a cycle; the loop is cut at publish time.",
)
@click.pass_obj
def link_command(state: State, source: str, target: str, backward: bool) -> None:
    """Link topic SOURCE to topic TARGET: publications on SOURCE also reach TARGET's subscribers.

    Links are transitive. A link that would close a cycle is refused (exit 2)
    unless --backward is given. A link of a topic to itself is accepted and changes
    nothing (seed 000: linked topics "can be recursive ... simply by referring to
    themselves").
    """
    links.link(state.client(), state.settings.qm, source, target, backward=backward)
    click.echo(f"linked {source} -> {target}" + (" (backward)" if backward else ""))


@click.command("unlink")
@click.argument("source")
@click.argument("target", required=False)
@click.option(
    "--all",
    "remove_all",
    is_flag=True,
    help="Remove every link from SOURCE: its whole record, even one that cannot be read.",
)
@click.pass_obj
def unlink_command(state: State, source: str, target: str | None, remove_all: bool) -> None:
    """Remove the link from topic SOURCE to topic TARGET (or, with --all, every link from SOURCE)."""
    if remove_all == (target is not None):
        raise click.UsageError("give TARGET, or --all to remove every link from SOURCE")
    if target is None:
        links.unlink_all(state.client(), state.settings.qm, source)
        click.echo(f"removed every link from {source}")
        return
    links.unlink(state.client(), state.settings.qm, source, target)
    click.echo(f"unlinked {source} -> {target}")


@click.command("links")
@click.pass_obj
def links_command(state: State) -> None:
    """List every topic link: source, target, backward."""
    graph, problems = links.read_links(state.client(), state.settings.qm)
    found = graph.links()
    if not found:
        click.echo("no links")
    else:
        _print_links(found)
    _print_problems(problems)


@click.command("copies", short_help="One copy per subscriber or per subscription, per client id.")
@click.argument("client_id", required=False)
@click.argument("copies", required=False, type=click.Choice(copies_setting.COPIES))
@click.pass_obj
def copies_command(state: State, client_id: str | None, copies: str | None) -> None:
    """Show or set how many copies of a publication CLIENT_ID's subscriptions get.

    COPIES is "subscription" (the default, Jakarta Messaging: one copy per matching
    subscription) or "subscriber" (seed 000's duplicate-subscriber check: one copy, to the
    client's earliest-made subscription that matches the topic or a topic linked from it).
    Without COPIES, show CLIENT_ID's setting; without CLIENT_ID, list the client ids set to
    "subscriber". The workers apply a change before the next publication they resolve.
    """
    client, qm = state.client(), state.settings.qm
    if client_id is not None and copies is not None:
        copies_setting.set_copies(client, qm, client_id, copies)
        click.echo(f"{client_id}: one copy per {copies}")
        return
    subscribers, problems = copies_setting.read_copies(client, qm)
    if client_id is not None:
        per = copies_setting.PER_SUBSCRIBER if client_id in subscribers else copies_setting.PER_SUBSCRIPTION
        click.echo(f"{client_id}: one copy per {per}")
    elif not subscribers:
        click.echo("every client id: one copy per subscription")
    else:
        for found in sorted(subscribers):
            click.echo(f"{found}: one copy per subscriber")
    _print_problems(problems)


@click.command("topics", short_help="List filters, or explain where a topic goes.")
@click.argument("topic", required=False)
@click.pass_obj
def topics_command(state: State, topic: str | None) -> None:
    """Without TOPIC, list subscription filters with their subscriptions; with TOPIC, explain its route.

    The route lists each topic a publication on TOPIC reaches (TOPIC itself,
    then linked topics), the subscriptions matched through each (and those a
    WILDCARD(BLOCK) topic object keeps out), the subscriptions that receive one
    copy each, as the workers resolve it, and the copies rule that applied
    (``broker copies``).
    """
    client, qm = state.client(), state.settings.qm
    if topic is None:
        by_filter: dict[str, list[str]] = {}
        records, problems = read_subscriptions(client, qm)
        for record in records:
            by_filter.setdefault(record.topic_filter, []).append(record.sub_id)
        if not by_filter:
            click.echo("no subscriptions")
        else:
            _print_filters(by_filter)
        _print_problems([*problems, *links.read_links(client, qm)[1]])
        return
    route = explain.explain(client, qm, topic)
    _print_route(route)
    _print_problems(route.problems)


# --- topic objects (IBM MQ's DEFINE/ALTER/DELETE/DISPLAY TOPIC, DISPLAY TPSTATUS) ----------------

_ATTRIBUTE_OPTIONS = (
    ("pub", "ENABLED | DISABLED | ASPARENT: publishing under the node"),
    ("sub", "ENABLED | DISABLED | ASPARENT: new subscriptions under the node"),
    ("dursub", "YES | NO | ASPARENT: durable subscriptions may be made"),
    ("defpsist", "YES | NO | ASPARENT: persistence of a publication that gives none"),
    ("defprty", "0-9 | ASPARENT: priority of a publication that gives none"),
    ("capexpry", "ms | NOLIMIT | ASPARENT: cap on a publication's expiry"),
    ("maxdepth", "messages | NOLIMIT | ASPARENT: bound of the queues of subscriptions made under the node"),
    (
        "pmsgdlv",
        "ALL | ALLDUR | ALLAVAIL | ASPARENT: persistent publications when a queue is full or unavailable",
    ),
    (
        "npmsgdlv",
        "ALL | ALLDUR | ALLAVAIL | ASPARENT: non-persistent publications when a queue is full or unavailable",
    ),
    ("usedlq", "YES | NO | ASPARENT: refused publications go to the dead-letter stream"),
    ("wildcard", "PASSTHRU | BLOCK: wildcard subscriptions above the node get nothing at or below it"),
    ("pubscope", "QMGR | ALL | ASPARENT: QMGR keeps publications made here from other queue managers"),
    ("subscope", "QMGR | ALL | ASPARENT: QMGR keeps subscriptions made here from being announced"),
    ("cluster", "cluster name | '' (local) | ASPARENT: topics under the node are cluster topics"),
    ("clroute", "DIRECT | TOPICHOST: cluster routing, straight to members or through the topic hosts"),
    ("proxysub", "FIRSTUSE | FORCE: FORCE announces the node even with no subscription under it"),
)


def _attribute_options(func: Any) -> Any:
    for name, text in reversed(_ATTRIBUTE_OPTIONS):
        func = click.option(f"--{name}", default=None, metavar="VALUE", help=text)(func)
    return click.option("--description", default=None, help="Free text.")(func)


def _attribute_values(given: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _ in _ATTRIBUTE_OPTIONS:
        value = given.get(name)
        if value is None:
            continue
        text = str(value).strip()
        out[name] = int(text) if text.isdigit() else (text if name == "cluster" else text.upper())
    return out


def _attributes_error(exc: ValidationError) -> click.BadParameter:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "attributes"
    return click.BadParameter(f"{where}: {err['msg']}")


@click.group(
    "topic",
    short_help="Administrative topic objects: define, alter, delete, display, apply, status, stats, tree.",
)
def topic_group() -> None:
    """Topic objects (IBM MQ): a name bound to a topic string, with attributes that topics below
    inherit from the closest object up to SYSTEM.BASE.TOPIC. Durations in ms."""


@topic_group.command("define")
@click.argument("name")
@click.option("--topic-string", required=True, help="The topic string (cannot be changed later).")
@click.option("--replace", is_flag=True, help="Redefine an existing object (same topic string).")
@_attribute_options
@click.pass_obj
def topic_define(
    state: State, name: str, topic_string: str, replace: bool, description: str | None, **given: Any
) -> None:
    """Define topic object NAME for --topic-string; unset attributes are ASPARENT."""
    try:
        attributes = topic_objects.Attributes(**_attribute_values(given))
    except ValidationError as exc:
        raise _attributes_error(exc) from exc
    obj = topic_objects.define(
        state.client(), state.settings.qm, name, topic_string, attributes, description or "", replace=replace
    )
    click.echo(f"defined topic object {obj.name} for {obj.topic_string!r}")


@topic_group.command("alter")
@click.argument("name")
@_attribute_options
@click.pass_obj
def topic_alter(state: State, name: str, description: str | None, **given: Any) -> None:
    """Change attributes of topic object NAME (others keep their values); SYSTEM.BASE.TOPIC holds the defaults."""
    changes = _attribute_values(given)
    if not changes and description is None:
        raise click.UsageError("name at least one attribute to change")
    try:
        obj = topic_objects.alter(state.client(), state.settings.qm, name, description=description, **changes)
    except ValidationError as exc:
        raise _attributes_error(exc) from exc
    click.echo(f"altered topic object {obj.name}")


@topic_group.command("declare")
@click.argument("topics", nargs=-1, required=True)
@click.pass_obj
def topic_declare(state: State, topics: tuple[str, ...]) -> None:
    """Declare TOPICS (swiftmq scheme: indirect selection picks among the declared topics)."""
    for topic in topics:
        done = declared.declare(state.client(), state.settings.qm, topic)
        click.echo(f"declared {topic}" if done else f"{topic} was declared already")


@topic_group.command("undeclare")
@click.argument("topics", nargs=-1, required=True)
@click.pass_obj
def topic_undeclare(state: State, topics: tuple[str, ...]) -> None:
    """Undeclare TOPICS; their subscriptions stay."""
    for topic in topics:
        declared.undeclare(state.client(), state.settings.qm, topic)
        note = " (the topics setting declares it again when a worker starts)"
        click.echo(f"undeclared {topic}" + (note if topic in state.settings.topics else ""))


@topic_group.command("list")
@click.pass_obj
def topic_list(state: State) -> None:
    """List the declared topics (name, source: cli or config, when)."""
    found, problems = declared.list_declared(state.client(), state.settings.qm)
    _print_declared(found)
    _print_problems(problems)


@topic_group.command("delete")
@click.argument("name")
@click.pass_obj
def topic_delete(state: State, name: str) -> None:
    """Delete topic object NAME; topics below it inherit from the next object up."""
    topic_objects.delete(state.client(), state.settings.qm, name)
    click.echo(f"deleted topic object {name}")


@topic_group.command("display")
@click.argument("name", default="*")
@click.pass_obj
def topic_display(state: State, name: str) -> None:
    """Show topic objects: NAME, or a generic name ending in '*' (default: all)."""
    objects = topic_objects.display(state.client(), state.settings.qm, name)
    _print_topic_objects(objects, [n for n, _ in _ATTRIBUTE_OPTIONS])


@topic_group.command("apply")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--prune", is_flag=True, help="Also delete topic objects that are not in FILE.")
@click.pass_obj
def topic_apply(state: State, file: str, prune: bool) -> None:
    """Make the topic objects match FILE (TOML, [[topic]] tables), idempotently."""
    applied = topic_objects.apply(
        state.client(), state.settings.qm, topic_objects.load_file(file), prune=prune
    )
    for what in ("defined", "altered", "deleted", "unchanged"):
        names = getattr(applied, what)
        click.echo(f"{what}: {len(names)}" + (f" ({', '.join(names)})" if names else ""))


@topic_group.command("status")
@click.argument("topic_string")
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@click.pass_obj
def topic_status_command(state: State, topic_string: str, as_json: bool) -> None:
    """Show TOPIC_STRING's effective attributes (and the object each comes from), the subscriptions it
    reaches (and through which link), the publishers seen among the newest stream entries, and its
    statistics: publications, copies delivered, last publication (as the workers last flushed them), and
    its retained publication."""
    client, settings = state.client(), state.settings
    found = topic_status(client, settings.qm, topic_string, default_maxdepth=settings.default_maxdepth)
    stats = topic_statistics(client, settings, topic_string) if settings.topic_stats_max_topics else None
    if as_json:
        click.echo(json.dumps({**asdict(found), "statistics": stats and asdict(stats)}))
        return
    _print_topic_status(found)
    if stats is not None:
        _print_topic_statistics(stats)


@topic_group.command("stats")
@click.option(
    "--top", "count", type=click.IntRange(min=1), default=20, show_default=True, help="Topics shown."
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list.")
@click.pass_obj
def topic_stats_command(state: State, count: int, as_json: bool) -> None:
    """List the topic strings with the most publications: publications, copies delivered, subscriptions
    reached and the last publication (IBM MQ DISPLAY TPSTATUS), then "(other topics)", every topic
    string past topic_stats_max_topics added up."""
    rows = top_topics(state.client(), state.settings, count)
    if as_json:
        click.echo(json.dumps([asdict(row) for row in rows]))
        return
    _print_top_topics(rows)


@topic_group.command("tree")
@click.pass_obj
def topic_tree_command(state: State) -> None:
    """Draw the topic tree: topic objects, subscription counts, links."""
    root = topic_tree(state.client(), state.settings.qm)
    _print_topic_tree(root)


@click.group("retained")
def retained_group() -> None:
    """Retained publications (IBM MQ MQPMO_RETAIN, MQTT RETAIN): the last one published with
    --retain on each topic string, which each new subscription to it receives."""


@retained_group.command("list")
@click.argument("topic_filter", metavar="[FILTER]", required=False)
@click.pass_obj
def retained_list(state: State, topic_filter: str | None) -> None:
    """List the retained publications (of the topics FILTER matches): topic, msgid, publisher,
    time, priority, size and body."""
    _print_retained(list_retained(state.client(), state.settings.qm, topic_filter))


@retained_group.command("clear")
@click.argument("topic", required=False)
@click.option("--all", "everything", is_flag=True, help="Clear every topic's retained publication.")
@click.pass_obj
def retained_clear(state: State, topic: str | None, everything: bool) -> None:
    """Clear TOPIC's retained publication (IBM MQ CLEAR TOPICSTR CLRTYPE(RETAINED)), or every one with --all."""
    if (topic is None) == (not everything):
        raise click.UsageError("give TOPIC or --all (one of them)")
    removed = clear_retained(state.client(), state.settings.qm, topic)
    click.echo(f"cleared {removed} retained publication(s)")


#: The commands this module adds to ``broker``.
COMMANDS = (
    link_command,
    unlink_command,
    links_command,
    copies_command,
    topics_command,
    topic_group,
    retained_group,
)
