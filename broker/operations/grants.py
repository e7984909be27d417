"""Granting and revoking per-topic authorization (``broker acl grant / revoke``), and reading it back.

A user's grants are topic filters and topic object names, for publishing and for subscribing
(``broker.topics.grants`` holds the rules: without a grant of a kind a user is unrestricted for
that kind; with one, only what its grants match). They live in ``{qm}:grants`` (user -> JSON),
written here only, by an admin user; every change bumps ``{qm}:version`` in the same MULTI, so the
workers reload their routing table (which carries the publish grants) before their next decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from broker.core import keys, wire
from broker.core.connection import KEEP, change_field, read_hash
from broker.core.errors import (
    CorruptRecord,
    ForeignKey,
    InvalidName,
    NoSuchGrant,
    NoSuchTopicObject,
    translate_errors,
)
from broker.core.principals import check_principal
from broker.core.schemes import recorded_scheme, separator
from broker.topics.grants import KINDS, GrantRecord, Grants, parse_grants, validate_grant_filter
from broker.topics.topic_objects import TopicTree, read_tree


def _asked(
    publish: Sequence[str],
    subscribe: Sequence[str],
    publish_objects: Sequence[str],
    subscribe_objects: Sequence[str],
) -> dict[str, list[str]]:
    return dict(
        zip(
            KINDS,
            (list(publish), list(publish_objects), list(subscribe), list(subscribe_objects)),
            strict=True,
        )
    )


def _check_types(pipe: Any, qm: str) -> None:
    """Raises: ForeignKey: ``{qm}:grants`` or ``{qm}:version`` holds another type (nothing is written)."""
    for key, expected in ((keys.grants(qm), "hash"), (keys.version(qm), "string")):
        found = wire.text(pipe.type(key))
        if found not in ("none", expected):
            raise ForeignKey(key, found, expected)


@translate_errors
def grant(
    client: redis.Redis,
    qm: str,
    user: str,
    publish: Sequence[str] = (),
    subscribe: Sequence[str] = (),
    publish_objects: Sequence[str] = (),
    subscribe_objects: Sequence[str] = (),
) -> GrantRecord:
    """Add grants to ``user`` (those it has already are kept once).

    Args:
        publish: topic filters (the queue manager's scheme) it may publish on.
        subscribe: topic filters it may subscribe within.
        publish_objects: topic object names: it may publish on each one's subtree.
        subscribe_objects: topic object names: it may subscribe within each one's subtree.

    Returns:
        The user's grants now.

    Raises:
        InvalidName: a bad user name, a user the broker did not make (``broker acl add`` first),
            or nothing to grant.
        InvalidTopicFilter: a filter is invalid under the queue manager's scheme.
        NoSuchTopicObject: a topic object does not exist.
        ForeignKey: ``{qm}:grants`` or ``{qm}:version`` holds another Redis type.
        CorruptRecord: the user's stored grants cannot be read (revoke ``--all`` first).
        Nothing is written when any of these is raised.
    """
    check_principal(user)
    asked = _asked(publish, subscribe, publish_objects, subscribe_objects)
    if not any(asked.values()):
        raise InvalidName(
            "nothing to grant: give --publish, --subscribe, --publish-object or --subscribe-object"
        )
    if not client.hexists(keys.acl_users(qm), user):
        raise InvalidName(f"no broker user {user!r} on {qm}; make it with 'broker acl add' first")
    scheme = recorded_scheme(client, qm)
    for kind in ("publish", "subscribe"):
        for topic_filter in asked[kind]:
            validate_grant_filter(topic_filter, scheme)
    tree = read_tree(client, qm)
    for kind in ("publish_objects", "subscribe_objects"):
        for name in asked[kind]:
            if name not in tree.objects:
                raise NoSuchTopicObject(f"no topic object {name!r} in queue manager {qm!r}")
    found: list[GrantRecord] = []

    def decide(pipe: Any) -> str:
        _check_types(pipe, qm)
        record = _stored(pipe, qm, user) or GrantRecord()
        for kind, values in asked.items():
            setattr(record, kind, list(dict.fromkeys([*getattr(record, kind), *values])))
        found.append(record)
        return record.to_json()

    change_field(client, keys.grants(qm), user, decide, keys.version(qm))
    return found[-1]


@translate_errors
def revoke(
    client: redis.Redis,
    qm: str,
    user: str,
    publish: Sequence[str] = (),
    subscribe: Sequence[str] = (),
    publish_objects: Sequence[str] = (),
    subscribe_objects: Sequence[str] = (),
    everything: bool = False,
) -> GrantRecord:
    """Take grants from ``user``; with ``everything`` all of them (a user left with none of a kind is
    unrestricted again for that kind: ``broker.topics.grants``).

    Returns:
        The user's grants left (empty: its record was removed).

    Raises:
        InvalidName: a bad user name, or nothing to revoke.
        NoSuchGrant: the user does not have one of the grants named (nothing is changed).
        ForeignKey: ``{qm}:grants`` or ``{qm}:version`` holds another Redis type.
    """
    check_principal(user)
    asked = _asked(publish, subscribe, publish_objects, subscribe_objects)
    if not everything and not any(asked.values()):
        raise InvalidName(
            "nothing to revoke: give --publish, --subscribe, --publish-object, --subscribe-object or --all"
        )
    left: list[GrantRecord] = []

    def decide(pipe: Any) -> Any:
        _check_types(pipe, qm)
        if everything:
            left.append(GrantRecord())
            return None if pipe.hexists(keys.grants(qm), user) else KEEP
        record = _stored(pipe, qm, user) or GrantRecord()
        for kind, values in asked.items():
            missing = [v for v in values if v not in getattr(record, kind)]
            if missing:
                raise NoSuchGrant(f"user {user!r} has no {kind.replace('_', ' ')} grant {missing[0]!r}")
            setattr(record, kind, [v for v in getattr(record, kind) if v not in values])
        left.append(record)
        return record.to_json() if record else None

    change_field(client, keys.grants(qm), user, decide, keys.version(qm))
    return left[-1]


def _stored(pipe: Any, qm: str, user: str) -> GrantRecord | None:
    raw = pipe.hget(keys.grants(qm), user)
    return None if raw is None else GrantRecord.from_json(user, raw, qm)


@translate_errors
def list_grants(client: redis.Redis, qm: str) -> tuple[dict[str, GrantRecord], list[CorruptRecord]]:
    """Every user's grants as stored (user -> record), and the records that cannot be read.

    Raises:
        ForeignKey: ``{qm}:grants`` holds another Redis type.
    """
    records, problems = {}, []
    for raw_user, raw in sorted(read_hash(client, keys.grants(qm)).items()):
        user = wire.lenient_text(raw_user)
        try:
            records[user] = GrantRecord.from_json(user, raw, qm)
        except CorruptRecord as exc:
            problems.append(exc)
    return records, problems


@translate_errors
def read_grants(client: redis.Redis, qm: str) -> Grants | None:
    """Every user's grants compiled with the topic objects (as the workers hold them); None: no grant.

    Raises:
        ForeignKey: ``{qm}:grants`` or ``{qm}:topics`` holds another Redis type.
    """
    scheme = recorded_scheme(client, qm)
    tree = TopicTree.parse(qm, read_hash(client, keys.topic_objects(qm)), separator(scheme))
    grants, _ = parse_grants(qm, read_hash(client, keys.grants(qm)), tree, scheme)
    return grants


def describe(record: GrantRecord) -> str:
    """A record as ``broker acl list`` shows it: ``publish a/#, object:ORDERS; subscribe b/+``."""
    parts = []
    for verb in ("publish", "subscribe"):
        shown = [*getattr(record, verb), *(f"object:{n}" for n in getattr(record, f"{verb}_objects"))]
        if shown:
            parts.append(f"{verb} {', '.join(shown)}")
    return "; ".join(parts)
