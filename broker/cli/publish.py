"""``broker publish``: one publication, its properties (``KEY=VALUE``, ``KEY:=JSON``) and its result."""

from __future__ import annotations

import json
from typing import Any

import click
import redis

from broker.cli.common import State
from broker.cli.render import _describe_result
from broker.clients.publish import Publisher, PublishResult
from broker.core.errors import (
    PublicationRefused,
    ServerError,
)
from broker.core.models import MAX_DELIVERY_DELAY_MS, PropertyValue
from broker.operations.acl import role_of


def _parse_properties(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, PropertyValue]:
    properties: dict[str, PropertyValue] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name or name == ":":
            raise click.BadParameter(f"{item!r} is not KEY=VALUE or KEY:=JSON", ctx=ctx, param=param)
        if name.endswith(":"):  # KEY:=JSON, a typed value (httpie's syntax): 99, 2.5, true, null, "007"
            try:
                typed = json.loads(value)
            except ValueError as exc:
                raise click.BadParameter(f"{item!r}: {value!r} is not JSON", ctx=ctx, param=param) from exc
            if isinstance(typed, (dict, list)):
                raise click.BadParameter(f"{item!r}: a property is a scalar", ctx=ctx, param=param)
            properties[name[:-1]] = typed
        else:
            properties[name] = value
    return properties


@click.command("publish", short_help="Publish one message on a topic.")
@click.argument("topic")
@click.argument("body", required=False)
@click.option(
    "--body-file",
    type=click.File("rb"),
    default=None,
    help="Read the body from this file, bytes as they are ('-' for stdin).",
)
@click.option(
    "--publisher",
    "publisher_id",
    default="cli",
    show_default=True,
    help="Publisher id; order is kept per publisher id.",
)
@click.option(
    "--property",
    "-p",
    "properties",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_properties,
    help="A user property, a string; KEY:=JSON for a number, boolean or null (amount:=99); repeatable.",
)
@click.option(
    "--msgid",
    default=None,
    help="Message id; re-publishing the same id is delivered once (default: a new UUID).",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait for a worker's result (delivered to how many subscriptions, or refused and why).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="How long --wait waits for the result, ms.",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=None,
    help="Priority 0 (lowest) to 9; higher is received first. Default: the topic's DEFPRTY (4).",
)
@click.option(
    "--persistent/--non-persistent",
    default=None,
    help="Delivery mode. Default: the topic's DEFPSIST (persistent).",
)
@click.option(
    "--client-id",
    default=None,
    help="The publishing client id: subscriptions made with --no-local by the same client id skip it.",
)
@click.option("--type", "message_type", default=None, help="JMSType of the message (selectors can test it).")
@click.option(
    "--topic-object",
    default=None,
    metavar="NAME",
    help="Publish through topic object NAME: its topic string, joined with '/' to TOPIC unless TOPIC is ''.",
)
@click.option(
    "--group",
    default=None,
    metavar="GROUP",
    help="Message group (JMSXGroupID): on a shared subscription all of a group's messages go to one "
    "consumer, in order, until it closes or dies.",
)
@click.option(
    "--group-seq",
    type=int,
    default=None,
    metavar="N",
    help="Sequence number in the group (JMSXGroupSeq), with --group; negative closes the group.",
)
@click.option(
    "--delay-ms",
    "delivery_delay_ms",
    type=click.IntRange(0, MAX_DELIVERY_DELAY_MS),
    default=0,
    metavar="MS",
    help="Delivery delay (JMS deliveryDelay): no subscriber receives it before now + MS; "
    "--wait waits that long too. At most 365 days.",
)
@click.option(
    "--retain",
    is_flag=True,
    help="A retained publication (IBM MQ MQPMO_RETAIN, MQTT RETAIN): kept as the topic's last, "
    "which each new subscription to it receives; an empty BODY clears the topic's.",
)
@click.option(
    "--validate/--no-validate",
    default=True,
    show_default=True,
    help="Check the topic here; with --no-validate the broker checks it and refuses "
    "(and dead-letters) an invalid one.",
)
@click.pass_obj
def publish_command(
    state: State,
    topic: str,
    body: str | None,
    body_file: Any,
    publisher_id: str,
    properties: dict[str, PropertyValue],
    msgid: str | None,
    wait: bool,
    timeout_ms: int,
    priority: int | None,
    persistent: bool | None,
    client_id: str | None,
    message_type: str | None,
    topic_object: str | None,
    group: str | None,
    group_seq: int | None,
    delivery_delay_ms: int,
    retain: bool,
    validate: bool,
) -> None:
    """Publish one message with BODY (text) on TOPIC and print where it went.

    Exits 3 when the broker refuses the publication (the reason and a corrected
    topic are printed) or no result comes within --timeout-ms (ms).
    """
    if body is not None and body_file is not None:
        raise click.UsageError("give BODY or --body-file, not both")
    if group_seq is not None and group is None:
        raise click.UsageError("--group-seq needs --group")
    payload: bytes = body_file.read() if body_file is not None else (body or "").encode()
    result = _publish(
        state,
        publisher_id,
        validate,
        client_id,
        topic,
        payload,
        properties=properties or None,
        msgid=msgid,
        persistent=persistent,
        priority=priority,
        message_type=message_type,
        topic_object=topic_object,
        group=group,
        group_seq=group_seq,
        delivery_delay_ms=delivery_delay_ms,
        wait=wait,
        timeout_ms=timeout_ms,
        retain=retain,
    )
    if not result.ok:
        raise PublicationRefused(result.reason or "no reason given", result.suggestion)
    click.echo(_describe_result(result))


def _publish(
    state: State,
    publisher_id: str,
    validate: bool,
    client_id: str | None,
    topic: str,
    payload: bytes,
    **options: Any,
) -> PublishResult:
    """``Publisher.publish`` with the settings; with security on, through the ingress stream of the
    user the URL authenticates as (a refusal for another publisher id says which ids it may use)."""
    principal = state.settings.url_credentials()[0] if state.settings.security else None
    publisher = Publisher(
        state.client(),
        state.settings.qm,
        publisher_id,
        validate=validate,
        client_id=client_id,
        scheme=state.settings.topic_scheme,
        principal=principal,
    )
    try:
        return publisher.publish(topic, payload, **options)
    except ServerError as exc:
        if principal and isinstance(exc.__cause__, redis.exceptions.NoPermissionError):
            raise ServerError(
                _publish_refusal(str(exc), principal, role_of(state.client(), state.settings.qm, principal))
            ) from exc
        raise


def _publish_refusal(refused: str, principal: str, role: str | None) -> str:
    """A publication the ACL refused, worded for the URL user's role (``broker.operations.acl.role_of``)."""
    if role == "publisher":
        return (
            f"{refused}: user {principal} may publish only under the publisher ids bound to it, so this "
            f"publication is not delivered; give one of them with --publisher"
        )
    if role is not None:
        return (
            f"{refused}: user {principal} has role {role}, which may not publish at all; publish as a user "
            f"with role publisher ('broker acl add NAME --role publisher --publisher-id ID')"
        )
    return (
        f"{refused}: user {principal} may not publish here: only a user with role publisher may, under "
        f"the publisher ids bound to it ('broker acl list' shows each user's role)"
    )


#: The commands this module adds to ``broker``.
COMMANDS = (publish_command,)
