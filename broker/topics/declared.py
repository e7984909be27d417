"""Declared topics (SwiftMQ's ``<topics>`` list, seed 003): declare, undeclare, list.

Under the swiftmq scheme with indirect subscriber selection, a publication's topic is
a SQL-LIKE predicate that selects among the declared topics (``broker.core.hierarchy``);
a topic that is not declared reaches nobody. Declared topics live in ``{qm}:declared``
(topic -> ``{"declared_ms": n, "source": "cli" | "config"}``); the ``topics`` setting
declares more when a worker starts (``seed_declared``). Every change bumps
``{qm}:version`` in the same MULTI, so workers reload their routing table before the
next publication they route.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys
from broker.core.connection import KEEP, can_name, change_field, read_hash, translate_errors
from broker.core.errors import CorruptRecord, InvalidTopic, NoSuchTopic
from broker.core.hierarchy import DeclaredTopics, validate_topic


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class Declared:
    """One declared topic.

    Attributes:
        topic: the topic name (plain, ``.``-separated nodes).
        declared_ms: when it was declared, ms since the epoch.
        source: ``cli`` (``broker topic declare``) or ``config`` (the ``topics`` setting).
    """

    topic: str
    declared_ms: int
    source: str


def parse_declared(qm: str, raw: dict[Any, Any]) -> tuple[DeclaredTopics, list[CorruptRecord]]:
    """Build the declared topics from the ``{qm}:declared`` hash, skipping what cannot be read.

    Returns:
        ``(declared, problems)``; a field that is not a valid topic name is a problem
        (the value is not needed to route, so a corrupt value is not).
    """
    declared = DeclaredTopics()
    problems: list[CorruptRecord] = []
    for field in raw:
        try:
            declared.add(_text(field))
        except (UnicodeDecodeError, InvalidTopic) as exc:
            problems.append(
                CorruptRecord(keys.declared_topics(qm), repr(field), f"not a valid topic name: {exc}")
            )
    return declared, problems


def _record(source: str) -> str:
    return json.dumps({"declared_ms": int(time.time() * 1000), "source": source}, separators=(",", ":"))


@translate_errors
def declare(client: redis.Redis, qm: str, topic: str, source: str = "cli") -> bool:
    """Declare a topic (a plain swiftmq topic name).

    Returns:
        True when it was declared now, False when it was already.

    Raises:
        InvalidTopic: the topic name is invalid (with a suggestion).
        ForeignKey: ``{qm}:declared`` holds another Redis type.
    """
    validate_topic(topic)
    key = keys.declared_topics(qm)
    read_hash(client, key)  # names a foreign key instead of a bare WRONGTYPE

    def decide(pipe: Any) -> Any:
        return KEEP if pipe.hexists(key, topic) else _record(source)

    return change_field(client, key, topic, decide, keys.version(qm)) is not KEEP


@translate_errors
def undeclare(client: redis.Redis, qm: str, topic: str) -> None:
    """Remove a declared topic (its subscriptions stay; indirect selection no longer picks it).

    Raises:
        NoSuchTopic: the topic is not declared.
        ForeignKey: ``{qm}:declared`` holds another Redis type.
    """
    key = keys.declared_topics(qm)
    read_hash(client, key)
    if not can_name(topic):
        raise NoSuchTopic(f"topic {topic!r} is not declared in queue manager {qm!r}")

    def decide(pipe: Any) -> Any:
        if not pipe.hexists(key, topic):
            raise NoSuchTopic(f"topic {topic!r} is not declared in queue manager {qm!r}")
        return None

    change_field(client, key, topic, decide, keys.version(qm))


@translate_errors
def list_declared(client: redis.Redis, qm: str) -> tuple[list[Declared], list[CorruptRecord]]:
    """Every declared topic, sorted, and the records that cannot be read.

    Raises:
        ForeignKey: ``{qm}:declared`` holds another Redis type.
    """
    key = keys.declared_topics(qm)
    found: list[Declared] = []
    problems: list[CorruptRecord] = []
    for field, value in read_hash(client, key).items():
        try:
            topic = _text(field)
            validate_topic(topic)
            data = json.loads(value)
            found.append(Declared(topic, int(data.get("declared_ms", 0)), str(data.get("source", "cli"))))
        except (UnicodeDecodeError, InvalidTopic, ValueError, TypeError, AttributeError) as exc:
            problems.append(CorruptRecord(key, repr(field), f"cannot be read: {exc}"))
    return sorted(found, key=lambda d: d.topic), problems


@translate_errors
def seed_declared(client: redis.Redis, qm: str, topics: Iterable[str]) -> list[str]:
    """Declare the ``topics`` setting's topics that are not declared yet (a worker does it at start).

    Returns:
        The topics declared now.

    Raises:
        InvalidTopic: a topic of the setting is invalid.
    """
    return [topic for topic in topics if declare(client, qm, topic, source="config")]
