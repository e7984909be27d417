"""Principals: who may publish under which publisher ids (issue 14's unforgeable identity).

A *principal* is a Redis ACL user allowed to publish (``broker.operations.acl``'s ``publisher`` role).
Its ACL lets it ``XADD`` to one key only, its ingress stream ``{qm}:in:<principal>``, so the
stream an entry arrives in says who published it: Redis itself enforces the identity. The
queue mutex (``dequeue.lua``) moves each ingress stream's entries, in order, into the publish
stream, stamping ``principal``; an entry whose ``publisher`` field is not one of the ids bound
to its principal here is dead-lettered with the reason. Per-publisher order, the single short
dequeue and the one-command raw protocol are kept: a service publishes with
``XADD {qm}:in:<principal> * publisher <id> topic <t> body <b>``.

Bindings live in ``{qm}:principals`` (principal -> publisher ids, one per line), writable
by the ``admin`` role only; every change bumps ``{qm}:version`` in the same MULTI so that the
workers also wait on the new ingress stream. A publisher id is bound to one principal at most:
binding it to a second one is refused (``PublisherIdBound``) unless it is moved (``move=True``).
"""

from __future__ import annotations

import re

import redis

from broker.core import keys, wire
from broker.core.errors import InvalidName, PublisherIdBound, translate_errors

#: Principal names: ACL user names the broker accepts (they are part of a key name).
PRINCIPAL = re.compile(r"^[A-Za-z0-9_.@\-]{1,64}$")


def check_principal(name: str) -> str:
    """Raises: InvalidName: not 1-64 of ``A-Z a-z 0-9 _ . @ -``."""
    if not PRINCIPAL.match(name):
        raise InvalidName(f"principal {name!r} must be 1-64 of A-Z a-z 0-9 _ . @ -")
    return name


def check_publisher_ids(ids: list[str]) -> list[str]:
    """Raises: InvalidName: an id is empty, longer than ``wire.MAX_PUBLISHER_BYTES`` or holds a newline."""
    if not ids:
        raise InvalidName("bind at least one publisher id")
    for pid in ids:
        # strict UTF-8 (a lone surrogate raises): the principals hash holds the ids as text
        if not wire.is_publisher_id(pid.encode()) or "\n" in pid:
            raise InvalidName(
                f"publisher id {pid!r} must be 1-{wire.MAX_PUBLISHER_BYTES} bytes without a newline"
            )
    return ids


@translate_errors
def holders(client: redis.Redis, qm: str, principal: str, publisher_ids: list[str]) -> dict[str, list[str]]:
    """The other principals already bound to any of ``publisher_ids``.

    Returns:
        ``{other principal: [its ids among publisher_ids]}``; empty when none is bound elsewhere.
    """
    wanted = set(publisher_ids)
    found: dict[str, list[str]] = {}
    for other, ids in bindings(client, qm).items():
        taken = [pid for pid in ids if pid in wanted]
        if other != principal and taken:
            found[other] = taken
    return found


@translate_errors
def bind(
    client: redis.Redis, qm: str, principal: str, publisher_ids: list[str], move: bool = False
) -> dict[str, list[str]]:
    """Bind ``principal`` to ``publisher_ids`` (replacing what it had).

    Args:
        move: take ids bound to other principals away from them (a principal left with none
            loses its binding) instead of refusing.

    Returns:
        ``{other principal: [ids moved from it]}`` (empty unless ``move``).

    Raises:
        InvalidName: a bad principal or publisher id.
        PublisherIdBound: an id is bound to another principal and ``move`` is false; nothing changed.
    """
    check_principal(principal)
    check_publisher_ids(publisher_ids)
    taken = holders(client, qm, principal, publisher_ids)
    if taken and not move:
        raise PublisherIdBound(principal, taken)
    current = bindings(client, qm)
    pipe = client.pipeline(transaction=True)
    for other, ids in taken.items():
        left = [pid for pid in current[other] if pid not in ids]
        if left:
            pipe.hset(keys.principals(qm), other, "\n".join(left))
        else:
            pipe.hdel(keys.principals(qm), other)
    pipe.hset(keys.principals(qm), principal, "\n".join(dict.fromkeys(publisher_ids)))
    pipe.incr(keys.version(qm))
    pipe.execute()
    return taken


@translate_errors
def unbind(client: redis.Redis, qm: str, principal: str) -> bool:
    """Remove ``principal``'s binding (entries still in its ingress stream are then left there).

    Returns:
        Whether it had one.
    """
    pipe = client.pipeline(transaction=True)
    pipe.hdel(keys.principals(qm), principal)
    pipe.incr(keys.version(qm))
    removed, _ = pipe.execute()
    return bool(removed)


@translate_errors
def bindings(client: redis.Redis, qm: str) -> dict[str, list[str]]:
    """principal -> its publisher ids."""
    found = client.hgetall(keys.principals(qm))
    return {wire.text(k): wire.text(v).split("\n") for k, v in found.items()}
