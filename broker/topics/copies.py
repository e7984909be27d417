"""Copies per subscriber (seed 000's duplicate-subscriber check), a per-client-id setting.

By default a publication makes one copy per subscription it reaches, as Jakarta Messaging
has it (each subscription is a destination of its own): a client whose two subscriptions
both match gets two copies. Seed 000 (IBM US 8,874,667, Figure 2) gives a subscriber one
copy instead: "a duplicate subscriber checking component ensures that duplicate messages
are not sent to a subscriber of more than one of the source topic and the target topics".
A client id set to ``subscriber`` here gets that: one copy of a publication, to its
earliest-made subscription (``created_ms``, then the id) whose filter matches the topic or
a topic linked from it and whose selector and no-local let the publication through.

Record format: ``{qm}:client_copies`` maps a client id (the part of a subscription id
before ``$``; for an MQTT shared subscription, its ShareName) to ``subscriber``. A client
id absent from it gets one copy per subscription. Each change bumps ``{qm}:version`` in
the same MULTI, so the workers' routing tables reload it before the next publication
they resolve; the table resolves it per topic when it loads (cached with the recipient
set), so a queue manager without the setting pays nothing per publication. A value that
cannot be read (written by hand) is skipped and reported as a ``CorruptRecord``: that
client gets one copy per subscription.
"""

from __future__ import annotations

from typing import Any

import redis

from broker.core import keys, wire
from broker.core.connection import change_field, read_hash
from broker.core.errors import ConfigError, CorruptRecord, ForeignKey, translate_errors
from broker.topics.subscriptions import check_name

#: One copy per subscription (the default; Jakarta Messaging).
PER_SUBSCRIPTION = "subscription"
#: One copy per subscriber: to the client's earliest-made matching subscription (seed 000).
PER_SUBSCRIBER = "subscriber"
#: The values ``set_copies`` takes.
COPIES = (PER_SUBSCRIPTION, PER_SUBSCRIBER)


def parse_copies(qm: str, raw: dict[Any, Any]) -> tuple[frozenset[str], list[CorruptRecord]]:
    """The client ids that get one copy per subscriber, from the ``{qm}:client_copies`` hash.

    Args:
        qm: the queue manager (to name the hash in problems).
        raw: the hash as read (client id -> value), bytes or str.

    Returns:
        ``(client ids, problems)``: one ``CorruptRecord`` per field that cannot be read.
    """
    key = keys.client_copies(qm)
    found: set[str] = set()
    problems: list[CorruptRecord] = []
    for raw_client, raw_value in raw.items():
        client_id = wire.lenient_text(raw_client)
        exact = raw_client if isinstance(raw_client, str) else wire.utf8_or_none(raw_client)
        value = wire.lenient_text(raw_value)
        if value != PER_SUBSCRIBER or client_id != exact:
            problems.append(CorruptRecord(key, client_id, f"copies {value!r} is not {PER_SUBSCRIBER!r}"))
            continue
        found.add(client_id)
    return frozenset(found), problems


@translate_errors
def set_copies(client: redis.Redis, qm: str, client_id: str, copies: str) -> None:
    """Set how many copies of a publication a client's subscriptions get, with a version bump.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        client_id: the client id (the part of its subscription ids before ``$``).
        copies: ``subscriber`` (one copy, to its earliest-made matching subscription; seed 000)
            or ``subscription`` (one per subscription, the default: removes the setting).

    Raises:
        ConfigError: ``copies`` is neither.
        InvalidName: the client id is not 1-128 characters of ``A-Z a-z 0-9 _ . -``.
        ForeignKey: ``{qm}:client_copies`` holds another Redis type.
    """
    if copies not in COPIES:
        raise ConfigError(f"copies must be one of {', '.join(COPIES)}, not {copies!r}")
    check_name("client id", client_id)
    key = keys.client_copies(qm)

    def decide(pipe: Any) -> str | None:
        kind = wire.text(pipe.type(key))
        if kind not in ("none", "hash"):
            raise ForeignKey(key, kind, "hash")
        return PER_SUBSCRIBER if copies == PER_SUBSCRIBER else None

    change_field(client, key, client_id, decide, keys.version(qm))


@translate_errors
def read_copies(client: redis.Redis, qm: str) -> tuple[frozenset[str], list[CorruptRecord]]:
    """The client ids set to one copy per subscriber, and the fields that cannot be read.

    Raises:
        ForeignKey: ``{qm}:client_copies`` holds another Redis type.
    """
    return parse_copies(qm, read_hash(client, keys.client_copies(qm)))


def one_copy(
    sub_ids: set[str],
    clients: frozenset[str],
    subscriptions: dict[str, Any],
    conditional: set[str] | frozenset[str],
) -> tuple[set[str], tuple[tuple[str, ...], ...]]:
    """Apply the setting to the subscriptions a topic reaches (``RoutingTable.resolve``, per topic).

    Of the subscriptions of a client id in ``clients``, only the earliest-made (``created_ms``,
    then the id) is kept. When it has a selector or no-local (``conditional``: decided per
    publication), the next ones up to the first without either are kept as a group, of which a
    publication goes to the first that lets it through (``RoutingTable.queues``).

    Args:
        sub_ids: the subscription ids the topic reaches (not changed).
        clients: the client ids set to ``subscriber``.
        subscriptions: sub id -> its ``SubscriptionRecord``.
        conditional: the subscription ids with a selector or no-local.

    Returns:
        ``(the ids kept, the groups: each a tuple of ids, earliest-made first)``.
    """
    mine: dict[str, list[str]] = {}
    for sub_id in sub_ids:
        client_id = sub_id.partition("$")[0]
        if client_id in clients:
            mine.setdefault(client_id, []).append(sub_id)
    kept = set(sub_ids)
    groups: list[tuple[str, ...]] = []
    for candidates in mine.values():
        if len(candidates) < 2:
            continue
        candidates.sort(key=lambda s: (subscriptions[s].created_ms, s))
        cut = next((i for i, s in enumerate(candidates) if s not in conditional), len(candidates) - 1)
        kept.difference_update(candidates[cut + 1 :])
        if cut > 0:
            groups.append(tuple(candidates[: cut + 1]))
    return kept, tuple(sorted(groups))
