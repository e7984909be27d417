"""Dead-letter reason codes: the one classifier of a dead letter's free-text ``dlq.reason``.

``dlq.reason`` is a sentence with details (sizes, topics, subscription ids), so two refusals of
one kind differ in text. ``dead_letter_reason`` maps it to a fixed code (``DEAD_LETTER_REASONS``):
the ``reason`` label of ``broker_dead_letters_total`` (``broker.operations.metrics``), the
console's "By reason" groups and its ``kind`` filter (``broker.operations.dead_letters``'s
``Selection.kind``, ``count_by_kind``) all use it, so they agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from broker.core import keys

#: ``reason`` label values of ``broker_dead_letters_total`` (``dead_letter_reason``).
DEAD_LETTER_REASONS = (
    "invalid_topic",
    "invalid_message",
    "over_limit",
    "pub_disabled",
    "queue_full",
    "subscription_unavailable",
    "foreign_key",
    "max_deliveries",
    "max_redeliveries",
    "expired",
    "not_authorized",
    "orphaned_entry",
    "channel",
    "internal_error",
    "other",
)

#: Free-text reasons -> code: the first rule whose text occurs in the reason wins. The texts
#: are those the worker (``worker.loop``), the Lua scripts and the channel movers write.
_REASON_RULES = (
    ("has PUB(DISABLED)", "pub_disabled"),
    ("(MAXDEPTH ", "queue_full"),
    ("subscription unavailable: ", "subscription_unavailable"),
    ("foreign key", "foreign_key"),
    ("(max_deliveries ", "max_deliveries"),
    ("consumers that died without acknowledging", "max_redeliveries"),
    ("expired while waiting in subscription", "expired"),
    ("malformed envelope: ", "invalid_message"),
    ("is not bound to principal", "not_authorized"),
    ("not in its publisher's FIFO", "orphaned_entry"),
    ("unreadable transmission entry", "channel"),
    ("internal error", "internal_error"),
    ("(max_body_bytes)", "over_limit"),
    ("(max_properties_bytes)", "over_limit"),
    ("(max_topic_bytes ", "over_limit"),
    ("(max_topic_levels ", "over_limit"),
)

#: Reasons starting with these are a publication entry's field out of its range (``broker.core.models``).
_MESSAGE_PREFIXES = ("field ", "missing field", "envelope", "priority ", "expiration", "property ")


def dead_letter_reason(reason: str, topic: str | None = None, topic_valid: Any = None) -> str:
    """The code (one of ``DEAD_LETTER_REASONS``) of a dead letter's free-text ``dlq.reason``.

    Args:
        reason: the ``dlq.reason`` field.
        topic: the dead letter's ``topic`` field, if any.
        topic_valid: ``topic_valid(topic)`` says whether a topic is valid under the queue
            manager's scheme (a reason the rules do not know, on an invalid topic, is
            ``invalid_topic``).
    """
    for text, code in _REASON_RULES:
        if text in reason:
            return code
    if reason.startswith(_MESSAGE_PREFIXES) or reason.startswith("body of"):
        return "invalid_message"
    if topic is not None and topic_valid is not None and not topic_valid(topic):
        return "invalid_topic"
    return "other"


def topic_check(client: redis.Redis, qm: str) -> Callable[[str], bool]:
    """``valid(topic)``: whether a topic is valid under the queue manager's topic scheme
    (``{qm}:manager``; MQTT when it cannot be read), for ``dead_letter_reason``'s ``topic_valid``."""
    from broker.core import hierarchy
    from broker.core.connection import read_hash
    from broker.core.errors import BrokerError
    from broker.core.schemes import scheme_of
    from broker.core.topic_rules import validate_topic

    try:
        scheme = scheme_of(qm, read_hash(client, keys.manager(qm)))
    except BrokerError:
        scheme = "mqtt"
    check = hierarchy.validate_topic if scheme == "swiftmq" else validate_topic

    def valid(topic: str) -> bool:
        try:
            check(topic)
        except ValueError:
            return False
        return True

    return valid
