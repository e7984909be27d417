"""Topic links (seed 000): their records in ``{qm}:links`` and the administration of them.

A link from a source topic to a target topic makes every publication on the
source reach the target's subscribers too, transitively, in the same unit of
work. Links are made and removed at run time; no subscriber changes anything.
Each change is checked for cycles against every existing link (unless
requested as a backward link) and written in one MULTI with an index version
bump, under WATCH so that two administrators cannot together close a cycle.

Record format (one hash field per source topic): ``{qm}:links`` maps the source
topic string to a JSON object ``{"<target topic>": <backward: true|false>}``.
A record that cannot be read (not JSON, an invalid topic, a forward link that
would close a cycle, written by hand) is skipped and reported as a
``CorruptRecord``; it never stops a worker.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from broker.core import keys, wire
from broker.core.connection import change_field, read_hash
from broker.core.errors import (
    CorruptRecord,
    ForeignKey,
    InvalidLink,
    InvalidTopic,
    LinkCycle,
    NoSuchLink,
    shown,
    translate_errors,
)
from broker.core.topic_rules import LinkGraph, validate_topic


def parse_links(qm: str, raw: dict[Any, Any]) -> tuple[LinkGraph, list[CorruptRecord]]:
    """Build the link graph from the ``{qm}:links`` hash, skipping records that cannot be read.

    Args:
        qm: the queue manager (to name the hash in problems).
        raw: the hash as read (source -> JSON), bytes or str.

    Returns:
        ``(graph, problems)``: the links that could be read, and one
        ``CorruptRecord`` per record (or link) that could not.
    """
    key = keys.links(qm)
    graph = LinkGraph()
    problems: list[CorruptRecord] = []
    pairs: list[tuple[str, str, bool]] = []
    for raw_source, raw_targets in raw.items():
        try:
            source = wire.text(raw_source)
        except UnicodeDecodeError:
            problems.append(CorruptRecord(key, repr(raw_source), "the source topic is not UTF-8"))
            continue
        try:
            validate_topic(source)
            targets = json.loads(raw_targets)
        except InvalidTopic as exc:
            problems.append(CorruptRecord(key, source, f"invalid source topic: {exc.reason}"))
            continue
        except (ValueError, RecursionError):  # too deeply nested is not JSON either
            problems.append(CorruptRecord(key, source, "not JSON"))
            continue
        if not isinstance(targets, dict):
            problems.append(CorruptRecord(key, source, 'not a JSON object {"<target>": <backward>}'))
            continue
        for target, backward in targets.items():
            if not isinstance(backward, bool):
                problems.append(
                    CorruptRecord(key, source, f"link to {target!r}: backward must be true or false")
                )
                continue
            pairs.append((source, target, backward))
    # Forward links were cycle-checked against a superset when made, so they form
    # a DAG on their own; backward links go in after them, unchecked.
    for source, target, backward in sorted(pairs, key=lambda p: p[2]):
        try:
            graph.add(source, target, backward=backward)
        except (InvalidLink, LinkCycle) as exc:
            problems.append(CorruptRecord(key, source, f"link to {target!r} skipped: {exc}"))
    return graph, problems


@translate_errors
def read_links(client: redis.Redis, qm: str) -> tuple[LinkGraph, list[CorruptRecord]]:
    """Read ``{qm}:links`` and parse it (``parse_links``).

    Raises:
        ForeignKey: ``{qm}:links`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    return parse_links(qm, read_hash(client, keys.links(qm)))


def _change_links(
    client: redis.Redis, qm: str, source: str, target: str | None, add: bool, backward: bool
) -> None:
    for topic in (source, target):
        if topic is None:
            continue
        try:
            validate_topic(topic)
        except InvalidTopic as exc:
            raise InvalidLink(f"cannot link {shown(source)} -> {shown(target)}: {exc.reason}") from exc
    links_key = keys.links(qm)

    def decide(pipe: Any) -> str | None:
        if pipe.type(links_key) not in (b"none", b"hash", "none", "hash"):
            raise ForeignKey(links_key, wire.text(pipe.type(links_key)), "hash")
        graph, problems = parse_links(qm, pipe.hgetall(links_key))
        if target is None:  # remove the whole record of source, readable or not
            if not pipe.hexists(links_key, source):
                raise NoSuchLink(f"there is no link record for {shown(source)}")
            return None
        broken = [p for p in problems if p.field == source]
        if broken:
            raise broken[0]
        if add:
            graph.add(source, target, backward=backward)
        else:
            graph.remove(source, target)
        targets = graph.targets(source)
        return json.dumps(targets, sort_keys=True) if targets else None

    change_field(client, links_key, source, decide, keys.version(qm))


@translate_errors
def link(client: redis.Redis, qm: str, source: str, target: str, backward: bool = False) -> None:
    """Link ``source`` to ``target``: publications on source also reach target's subscribers.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        source: the topic string publications are made on.
        target: the topic string whose subscribers also receive them (transitively).
        backward: allow the link even if it closes a cycle (seed 000); loops
            are then cut at publish time.

    A link of a topic to itself is accepted as the no-op seed 000 describes (linked topics
    "can be recursive, either simply by referring to themselves or cyclically"): its
    subscribers get one copy, as without it; it is listed and removed like any other.

    Raises:
        InvalidLink: a topic is invalid.
        LinkCycle: the link would close a cycle and ``backward`` is False.
        CorruptRecord: the stored record of ``source`` cannot be read (remove it
            with ``unlink_all``).
        ForeignKey: ``{qm}:links`` holds another Redis type.
    """
    _change_links(client, qm, source, target, add=True, backward=backward)


@translate_errors
def unlink(client: redis.Redis, qm: str, source: str, target: str) -> None:
    """Remove the link from ``source`` to ``target``.

    Raises:
        InvalidLink: a topic is invalid.
        NoSuchLink: there is no such link.
        CorruptRecord: the stored record of ``source`` cannot be read (remove it
            with ``unlink_all``).
        ForeignKey: ``{qm}:links`` holds another Redis type.
    """
    _change_links(client, qm, source, target, add=False, backward=False)


@translate_errors
def unlink_all(client: redis.Redis, qm: str, source: str) -> None:
    """Remove every link from ``source``: its whole record, even one that cannot be read.

    Raises:
        InvalidLink: the topic is invalid.
        NoSuchLink: there is no record for ``source``.
        ForeignKey: ``{qm}:links`` holds another Redis type.
    """
    _change_links(client, qm, source, None, add=False, backward=False)


@translate_errors
def list_links(client: redis.Redis, qm: str) -> list[tuple[str, str, bool]]:
    """Every link that can be read, as ``(source, target, backward)``, sorted (see ``read_links``)."""
    return read_links(client, qm)[0].links()
