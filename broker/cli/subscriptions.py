"""Subscriptions: ``broker subscribe``, ``browse``, ``unsubscribe``, ``subscriptions``, and SwiftMQ's
usage lists ``durables`` (with ``durables delete``) and ``subscribers``.
"""

from __future__ import annotations

import signal

import click
import redis

from broker.cli.common import State
from broker.cli.render import (
    _describe_subscription,
    _format_message,
    _print_deletion,
    _print_problems,
    _print_subscriptions,
    _print_usage,
)
from broker.clients.consumer import Subscriber, browse
from broker.clients.control import DEFAULT_TIMEOUT_MS, request_subscription
from broker.clients.loads import subscription_load
from broker.core.errors import (
    NoSuchSubscription,
    ServerError,
    SubscriptionRefused,
)
from broker.operations.durables import delete_durables
from broker.operations.status import usage_list
from broker.topics.subscriptions import SubscriptionRecord, read_subscriptions
from broker.topics.subscriptions import subscribe as subscribe_to
from broker.topics.subscriptions import unsubscribe as unsubscribe_from
from broker.topics.topic_objects import topic_of

#: How long one blocking receive waits when ``subscribe`` has no ``--timeout-ms``, ms.
POLL_MS = 1_000


@click.command("subscribe", short_help="Subscribe to a topic filter and print messages.")
@click.argument("topic_filter", metavar="FILTER")
@click.option("--client-id", required=True, help="Subscriber client id (A-Z a-z 0-9 _ . -).")
@click.option(
    "--durable",
    "durable_name",
    metavar="NAME",
    default=None,
    help="Make (or re-attach to) the durable subscription NAME; it keeps collecting "
    "after this command exits. Default: non-durable, removed on exit.",
)
@click.option(
    "--selector",
    default=None,
    help="Message selector (Jakarta Messaging SQL-92 subset), e.g. \"JMSPriority > 4 AND region = 'eu'\".",
)
@click.option("--no-local", is_flag=True, help="Skip publications sent with the same --client-id.")
@click.option(
    "--no-retained",
    is_flag=True,
    help="A new subscription receives no retained publications (MQTT 5 Retain Handling 2, IBM MQ "
    "MQSO_NEW_PUBLICATIONS_ONLY). Default: those of the topics FILTER matches, flagged retained.",
)
@click.option(
    "--topic-object",
    default=None,
    metavar="NAME",
    help="Subscribe through topic object NAME: its topic string, joined with '/' to FILTER unless FILTER is ''.",
)
@click.option(
    "--shared",
    is_flag=True,
    help="Shared subscription: every consumer of it gets a share of the messages (also: FILTER "
    "'$share/<ShareName>/<filter>').",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many messages (default: run until Ctrl-C).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Stop when no message arrives within this long, ms (default: wait forever).",
)
@click.option(
    "--request-timeout-ms",
    type=click.IntRange(min=1),
    default=DEFAULT_TIMEOUT_MS,
    show_default=True,
    help="With security on, a subscriber user asks the broker for a new subscription (a control "
    "request); how long to wait for the answer, ms.",
)
@click.pass_obj
def subscribe_command(
    state: State,
    topic_filter: str,
    client_id: str,
    durable_name: str | None,
    selector: str | None,
    no_local: bool,
    no_retained: bool,
    topic_object: str | None,
    shared: bool,
    count: int | None,
    timeout_ms: int | None,
    request_timeout_ms: int,
) -> None:
    """Subscribe to FILTER ('+' one level, '#' the rest) and print each message as it arrives.

    With topic_scheme = "swiftmq", FILTER is a dot topic (iit.sales.US) that also
    receives its parents' and sub-nodes' publications, and its nodes after the
    root may be SQL-LIKE predicates (iit.%.US; '%' any run, '_' one character,
    '\\' escapes them).

    Each line is: topic, publisher, sequence number, priority, "non-persistent" for a
    NON_PERSISTENT message (its own delivery mode, or its queue controller's), "retained" for
    a retained publication the new subscription received (--no-retained: none), "group=G#N" for a
    message of a message group (JMSXGroupID G, JMSXGroupSeq N), body (text, or a
    Python bytes literal when not UTF-8), and "redelivered=N" for a message
    delivered before to a consumer that died. Each message is acknowledged after
    it is printed. Ctrl-C or SIGTERM stops it orderly: messages not yet acknowledged are given
    back for redelivery, a non-durable subscription is removed, and it exits 0 (as `broker
    worker` does on SIGTERM). Exits 3 when the subscription is exclusive and another consumer holds it,
    has max_consumers_per_subscription consumers already, or is new and the client id has
    max_subscriptions_per_client subscriptions already; 2 when FILTER is over max_topic_bytes
    or max_topic_levels, or the selector is invalid or over max_selector_bytes or the
    bounds of a selector's terms and nesting.

    With security on, a user that may not write the subscription registry (a subscriber user)
    attaches to an existing subscription directly, and asks the broker for a new one with a control
    request (docs/security.md): refused with exit code 3 outside its subscribe grants.
    """
    client = state.client()
    settings = state.settings
    qm = settings.qm
    try:
        record = subscribe_to(
            client,
            qm,
            topic_filter,
            client_id,
            durable_name,
            shared=shared,
            selector=selector,
            no_local=no_local,
            settings=settings,
            topic_object=topic_object,
            retained=not no_retained,
        )
    except ServerError as exc:
        if not (settings.security and _refused_by_acl(exc)):
            raise
        if shared:
            raise SubscriptionRefused(
                "a shared subscription is made by an admin user; a subscriber user consumes it", ""
            ) from exc
        if topic_object is not None:
            topic_filter = topic_of(client, qm, topic_object, topic_filter)
        record = _by_request(
            state,
            topic_filter,
            client_id,
            durable_name,
            selector,
            no_local,
            request_timeout_ms,
            not no_retained,
        )
    subscriber = Subscriber(client, qm, record, settings)
    received = [0]  # counted as they come: a Ctrl-C in the loop keeps the count
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM closes as Ctrl-C does
        # printed once attached (its lease taken) and stoppable by SIGTERM: a script may wait for it
        click.echo(_describe_subscription(record), err=True)
        _receive(subscriber, count, timeout_ms, received)
    except KeyboardInterrupt:
        click.echo("", err=True)
    finally:
        # closed orderly whatever stopped it; a second Ctrl-C or SIGTERM does not cut that short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            subscriber.close()
        finally:
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)
    click.echo(f"received {received[0]} message(s)", err=True)


def _refused_by_acl(exc: BaseException) -> bool:
    """Whether the server refused ``exc``'s command by the URL's user's ACL (NOPERM), anywhere in its chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.exceptions.NoPermissionError) or "NOPERM" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _by_request(
    state: State,
    topic_filter: str,
    client_id: str,
    durable_name: str | None,
    selector: str | None,
    no_local: bool,
    timeout_ms: int,
    retained: bool = True,
) -> SubscriptionRecord:
    """The subscription asked of the broker with a control request (``broker.clients.control``)."""
    click.echo(f"asking the broker for the subscription (control request of client id {client_id})", err=True)
    return request_subscription(
        state.client(),
        state.settings.qm,
        topic_filter,
        client_id,
        durable_name,
        selector=selector,
        no_local=no_local,
        timeout_ms=timeout_ms,
        retained=retained,
    )


def _receive(subscriber: Subscriber, count: int | None, timeout_ms: int | None, received: list[int]) -> None:
    """Print and acknowledge messages until ``count`` (``received[0]`` counts them) or, with
    ``timeout_ms``, until none arrives within that long (ms)."""
    was_standby = False
    while count is None or received[0] < count:
        if subscriber.standby and not was_standby:
            click.echo("standby: another consumer is active; waiting to take over", err=True)
        was_standby = subscriber.standby
        delivery = subscriber.receive(timeout_ms=timeout_ms or POLL_MS)
        if delivery is None:
            if timeout_ms is not None:
                click.echo(f"no message within {timeout_ms} ms", err=True)
                return
            continue
        line = _format_message(delivery.message)
        if delivery.redelivered:
            line += f"  redelivered={delivery.delivery_count - 1}"
        click.echo(line)
        subscriber.ack(delivery)
        received[0] += 1


def _interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C stops (``KeyboardInterrupt``)."""
    raise KeyboardInterrupt


@click.command("browse", short_help="Show waiting messages of a subscription without taking them.")
@click.argument("sub_id")
@click.option(
    "--count", "-n", type=click.IntRange(min=1), default=10, show_default=True, help="How many messages."
)
@click.pass_obj
def browse_command(state: State, sub_id: str, count: int) -> None:
    """Print the next messages SUB_ID would receive, in order, without consuming them (a QueueBrowser)."""
    client = state.client()
    qm = state.settings.qm
    records = {r.sub_id: r for r in read_subscriptions(client, qm)[0]}
    record = records.get(sub_id)
    if record is None:
        raise NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {qm!r}")
    messages = browse(client, qm, record, count)
    for message in messages:
        click.echo(_format_message(message))
    click.echo(f"{len(messages)} message(s) shown", err=True)


@click.command("unsubscribe", short_help="Delete a subscription and its queue.")
@click.argument("sub_id")
@click.pass_obj
def unsubscribe_command(state: State, sub_id: str) -> None:
    """Delete subscription SUB_ID ('clientid$name'; quote the '$') and its queued messages."""
    unsubscribe_from(state.client(), state.settings.qm, sub_id)
    click.echo(f"unsubscribed {sub_id}")


@click.command("subscriptions")
@click.pass_obj
def subscriptions_command(state: State) -> None:
    """List every subscription: id, filter, selector, no-local, durable, consumer mode,
    live consumers, messages waiting and in flight."""
    client = state.client()
    qm = state.settings.qm
    records, problems = read_subscriptions(client, qm)
    if not records:
        click.echo("no subscriptions")
    else:
        _print_subscriptions([(record, subscription_load(client, qm, record.sub_id)) for record in records])
    _print_problems(problems)


@click.group("durables", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print {rows, problems} as one JSON object.")
@click.pass_context
def durables_group(ctx: click.Context, as_json: bool) -> None:
    """List durable subscriptions: name, durable name, client id, topic, selector, no-local,
    the queue each is bound to and its depth (messages waiting, every priority band).

    A record that cannot be read, or a key of another Redis type, is listed as a problem.
    """
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    rows, problems = usage_list(state.client(), state.settings.qm, "durables")
    _print_usage(rows, problems, "depth", "no durable subscriptions", as_json)


@durables_group.command("delete")
@click.option(
    "--client-id",
    "client_id_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on client ids: '%' any run, '_' one character, '\\' escapes (mandatory).",
)
@click.option(
    "--durable-name",
    "durable_name_predicate",
    required=True,
    metavar="PREDICATE",
    help="SQL LIKE on durable names (mandatory; '%' for every name).",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted, with the messages each holds.")
@click.pass_obj
def durables_delete(
    state: State, client_id_predicate: str, durable_name_predicate: str, dry_run: bool
) -> None:
    """Delete the durable subscriptions whose client id and durable name match the predicates,
    with every message they hold (SwiftMQ's Delete Durable). Non-durable ones are never touched.

    Quote the predicates: --client-id 'sales' --durable-name '%'.
    """
    done = delete_durables(
        state.client(), state.settings.qm, client_id_predicate, durable_name_predicate, dry_run=dry_run
    )
    if done.deleted:
        _print_deletion(done, dry_run)
    click.echo(done.summary())
    _print_problems(done.problems)


@click.command("subscribers")
@click.option("--json", "as_json", is_flag=True, help="Print {rows, problems} as one JSON object.")
@click.pass_obj
def subscribers_command(state: State, as_json: bool) -> None:
    """List active subscribers: subscriptions (durable or not) with at least one live consumer,
    with client id, topic, selector, no-local, the queue each is bound to and its live consumers."""
    rows, problems = usage_list(state.client(), state.settings.qm, "subscribers")
    _print_usage(rows, problems, "consumers", "no active subscribers", as_json)


#: The commands this module adds to ``broker``.
COMMANDS = (
    subscribe_command,
    browse_command,
    unsubscribe_command,
    subscriptions_command,
    durables_group,
    subscribers_command,
)
