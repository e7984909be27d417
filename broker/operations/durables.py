"""Deleting durable subscriptions administratively: by SQL-LIKE predicates, and when idle.

Two of SwiftMQ's Topic Manager tools (seed 003):

- **Delete Durable**: the durable subscriptions whose client id and durable name
  match two SQL-LIKE predicates (``%`` any run, ``_`` one character, ``\\`` the
  escape, as ``broker.core.selectors.like`` reads them) are deleted with every
  message they hold. A subscription id is ``<client id>$<durable name>``; for
  an MQTT shared subscription the part before ``$`` is its ShareName.
  Non-durable subscriptions are never touched.
- **Idle expiry**: with ``Settings.durable_idle_expiry_ms``, the scheduler's admin
  job deletes durable subscriptions that no consumer has used for that long (a
  client made one and went away for good, and its queue grows and grows).

A subscription's last use is the newest of: its consumers' lease deadlines
(``{qm}:sub:<id>:consumers``), its last-use time ``{qm}:sub:<id>:last_active`` (written by
``broker_recover`` when a consumer closes and when dead consumers are forgotten;
never per message; protocol 5 kept it in the hash ``{qm}:last_active``, still read:
the newer counts) and its ``created_ms``. One with neither consumers nor a
``last_active`` time (made before that was recorded, or by hand) is given the
time the job first sees it, so that it is not deleted on information nobody
wrote. The removal itself (``remove_subscription.lua``) checks idleness again,
atomically, so a consumer that attaches meanwhile keeps its subscription.

Every deletion is logged (logger ``broker.operations.durables``) with the messages lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker.clients.loads import subscription_load
from broker.core import clock, keys, wire
from broker.core.errors import BrokerError, ForeignKey, InvalidSelector, translate_errors
from broker.core.selectors import like
from broker.topics.subscriptions import SubscriptionRecord, read_subscriptions, remove_subscription

log = logging.getLogger("broker.durables")

#: The escape character of Delete Durable's predicates (SwiftMQ: "The escape character is '\\'").
ESCAPE = "\\"


def check_predicate(what: str, pattern: str) -> None:
    """Check a mandatory SQL-LIKE predicate.

    Args:
        what: what it selects ("client id", "durable name"), for the message.
        pattern: ``%`` any run, ``_`` one character, ``\\`` makes the next ``%``, ``_`` or ``\\`` literal.

    Raises:
        InvalidSelector: it is empty, or an escape ends it or precedes another character.
    """
    if not pattern:
        raise InvalidSelector(
            pattern, 0, f"the {what} predicate is mandatory ('%' matches every {what})", f"{what} predicate"
        )
    try:
        like(pattern, "", ESCAPE)
    except InvalidSelector as exc:
        raise InvalidSelector(pattern, exc.position, exc.reason, f"{what} predicate") from None


def matching(
    records: Iterable[SubscriptionRecord], client_id_predicate: str, durable_name_predicate: str
) -> list[SubscriptionRecord]:
    """The durable subscriptions among ``records`` whose client id and durable name match the predicates.

    Raises:
        InvalidSelector: a predicate is invalid (see ``check_predicate``).
    """
    check_predicate("client id", client_id_predicate)
    check_predicate("durable name", durable_name_predicate)
    found = []
    for record in records:
        client_id, _, name = record.sub_id.partition("$")
        if (
            record.durable
            and like(client_id_predicate, client_id, ESCAPE)
            and like(durable_name_predicate, name, ESCAPE)
        ):
            found.append(record)
    return found


@dataclass(frozen=True)
class Deleted:
    """One durable subscription deleted (or, in a dry run, that would be).

    Attributes:
        sub_id: ``<client id>$<durable name>``.
        messages: messages lost with it (waiting in every band and in flight);
            in a dry run, the messages it holds now.
    """

    sub_id: str
    messages: int


@dataclass(frozen=True)
class Deletion:
    """What ``delete_durables`` or ``expire_idle_durables`` did.

    Attributes:
        deleted: the subscriptions deleted, by id.
        problems: records that could not be read and subscriptions that could
            not be deleted (a foreign key), one line each; they were left alone.
        dry_run: nothing was deleted; ``deleted`` is what would have been.
    """

    deleted: list[Deleted]
    problems: list[str]
    dry_run: bool = False

    def summary(self) -> str:
        """One line: how many were deleted and the messages lost."""
        n, lost = len(self.deleted), sum(d.messages for d in self.deleted)
        verb = "would delete" if self.dry_run else "deleted"
        return f"{verb} {n} durable subscription{'' if n == 1 else 's'} ({lost} message(s))"


def _delete(
    client: redis.Redis, qm: str, record: SubscriptionRecord, why: str, idle_before_ms: int | None = None
) -> tuple[Deleted | None, str | None]:
    """Remove one durable subscription; ``(Deleted or None when it was not removed, problem)``."""
    try:
        removal = remove_subscription(
            client, qm, record.sub_id, idle_before_ms, durable=idle_before_ms is not None
        )
    except (redis.ResponseError, BrokerError) as exc:
        return None, f"{record.sub_id}: not deleted: {exc}"
    if not removal:
        return None, None
    lost = removal.messages
    log.warning("deleted durable subscription %s (%s): %d message(s) lost", record.sub_id, why, lost)
    return Deleted(record.sub_id, lost), None


@translate_errors
def delete_durables(
    client: redis.Redis,
    qm: str,
    client_id_predicate: str,
    durable_name_predicate: str,
    *,
    dry_run: bool = False,
) -> Deletion:
    """Delete Durable (SwiftMQ): delete the durable subscriptions selected by two SQL-LIKE predicates.

    Each goes with its queue (every priority band), its consumers' in-flight
    lists and its other keys, in one atomic call per subscription; its consumers
    receive nothing more. Non-durable subscriptions and records that cannot be
    read are never touched (the latter are named in ``problems``).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        client_id_predicate: SQL LIKE on the client id (the part of the id before ``$``).
        durable_name_predicate: SQL LIKE on the durable name (the part after ``$``).
        dry_run: list what would be deleted, with the messages each holds now; delete nothing.

    Returns:
        The deletion: subscriptions (sorted by id) with the messages lost, and problems.

    Raises:
        InvalidSelector: a predicate is empty or invalid (nothing is deleted).
        ForeignKey: ``{qm}:subs`` holds another Redis type.
    """
    records, corrupt = read_subscriptions(client, qm)
    chosen = matching(records, client_id_predicate, durable_name_predicate)
    problems = [str(p) for p in corrupt]
    why = f"Delete Durable, client id {client_id_predicate!r}, durable name {durable_name_predicate!r}"
    if dry_run:
        held = []
        for record in chosen:
            load = subscription_load(client, qm, record.sub_id)
            held.append(Deleted(record.sub_id, load.depth + load.in_flight))
        return Deletion(held, problems, dry_run=True)
    deleted = []
    for record in chosen:
        done, problem = _delete(client, qm, record, why)
        if done is not None:
            deleted.append(done)
        if problem is not None:
            problems.append(problem)
    return Deletion(deleted, problems)


def last_use(
    record: SubscriptionRecord, newest_deadline_ms: int | None, last_active_ms: int | None
) -> int | None:
    """A subscription's last use, ms since the epoch; None when nothing says (see the module docstring)."""
    if newest_deadline_ms is None and last_active_ms is None:
        return None
    return max(record.created_ms, newest_deadline_ms or 0, last_active_ms or 0)


def _foreign(client: redis.Redis, key: str, expected: str) -> ForeignKey:
    found: Any = client.type(key)
    return ForeignKey(key, wire.text(found), expected)


def _probe(client: redis.Redis, qm: str, records: list[SubscriptionRecord]) -> list[tuple[Any, Any, Any]]:
    """Per subscription: (newest consumer entry ``[(id, deadline)]`` or an error, its last use in ms
    or None, the error of its own last-use key or None): the last use is the newer of
    ``keys.sub_last_active`` and protocol 5's ``{qm}:last_active`` field.

    A record of last use that is not a number counts as unknown; protocol 5's hash of another
    type too (nobody writes it now).
    """
    pipe = client.pipeline(transaction=False)
    for record in records:
        pipe.zrange(keys.sub_consumers(qm, record.sub_id), -1, -1, withscores=True)
        pipe.get(keys.sub_last_active(qm, record.sub_id))
        pipe.hget(keys.last_active(qm), record.sub_id)
    replies = pipe.execute(raise_on_error=False)
    out = []
    for i in range(len(records)):
        known = [_ms(replies[3 * i + 1]), _ms(replies[3 * i + 2])]
        found = [ms for ms in known if ms is not None]
        own = replies[3 * i + 1]
        out.append(
            (replies[3 * i], max(found) if found else None, own if isinstance(own, Exception) else None)
        )
    return out


def _ms(reply: Any) -> int | None:
    """A record of last use as ms, or None when absent or unreadable."""
    if reply is None or isinstance(reply, Exception):
        return None
    try:
        return int(reply)
    except ValueError:
        return None


@translate_errors
def expire_idle_durables(client: redis.Redis, qm: str, idle_ms: int, now_ms: int | None = None) -> Deletion:
    """Delete the durable subscriptions no consumer has used for ``idle_ms`` (idle expiry).

    A subscription with nothing that says when it was last used is given ``now``
    in ``{qm}:sub:<id>:last_active`` instead (see the module docstring).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        idle_ms: how long unused, ms (``Settings.durable_idle_expiry_ms``); 0 deletes nothing.
        now_ms: the time, ms since the epoch; None for this machine's clock.

    Returns:
        The deletion: the subscriptions deleted with the messages lost, and problems
        (corrupt records, foreign keys), each named and left alone.

    Raises:
        ForeignKey: ``{qm}:subs`` holds another Redis type.
    """
    records, corrupt = read_subscriptions(client, qm)
    problems = [str(p) for p in corrupt]
    if idle_ms <= 0:
        return Deletion([], problems)
    now = clock.now_ms() if now_ms is None else now_ms
    cutoff = now - idle_ms
    durable = [r for r in records if r.durable]
    deleted = []
    for record, (newest, last_active, own) in zip(durable, _probe(client, qm, durable), strict=True):
        asked = (
            (newest, keys.sub_consumers(qm, record.sub_id), "zset"),
            (own, keys.sub_last_active(qm, record.sub_id), "string"),
        )
        foreign = [
            _foreign(client, key, expected) for reply, key, expected in asked if isinstance(reply, Exception)
        ]
        if foreign:  # name it, go on with the others
            problems.append(f"{record.sub_id}: not looked at: {foreign[0]}")
            continue
        seen = last_use(record, int(newest[0][1]) if newest else None, last_active)
        if seen is None:  # nothing says: its idle time starts now
            client.set(keys.sub_last_active(qm, record.sub_id), now, nx=True)
            continue
        if seen > cutoff:
            continue
        why = f"idle since {seen} ms, durable_idle_expiry_ms {idle_ms}"
        done, problem = _delete(client, qm, record, why, idle_before_ms=cutoff)
        if done is not None:
            deleted.append(done)
        if problem is not None:
            problems.append(problem)
    return Deletion(deleted, problems)
