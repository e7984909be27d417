"""The dead-letter queue: list, show, replay and purge dead letters (``broker dlq``). What a dead
letter is, its id, the ``Selection`` and the reading of the streams are in
``broker.operations.dead_letter_selection`` (re-exported here).

The dead-letter queue is the broker's stream ``{qm}:dlq``, which only the broker's roles write,
and each subscription's poison stream ``{qm}:sub:<id>:poison``, which its consumers write through
the function library (``broker.core.library``). A dead letter is one entry of either
(``broker.core.keys``, "Dead letter"); a poison message's id is ``<sub id>/<ms>-<n>``, a dead
letter of ``{qm}:dlq`` just ``<ms>-<n>``. Two kinds:

- a **refused publication** (``dequeue.lua``, ``commit.lua``): the publication's own fields, then
  ``dlq.reason`` and ``dlq.entry_id`` (the publish-stream entry it was); ``dlq.principal`` when
  ``dequeue.lua`` refused it as published under a publisher id not bound to the principal of the
  ingress stream it came by. Replay **re-publishes** it: its fields are added again as a new
  publication, with its message id (``msgid``; when it had none, its default, the original
  ``dlq.entry_id``), so that the dedup record of the first replay that is delivered makes any
  later copy a duplicate (within ``dedup_window_ms``). A refused publication left no dedup record
  (``commit.lua`` removes the one it made when it refuses), so the first replay is delivered.
- a **poison message** of one subscription (``broker_recover``: delivered more than
  ``max_redeliveries`` times; ``broker_receive``: expired while waiting; ``broker_reject``: a
  malformed envelope a consumer took, reason ``malformed envelope: ...``): ``envelope``,
  ``dlq.reason``, ``dlq.entry_id``, ``dlq.subscription``, in that subscription's poison
  stream. Replay **re-queues** the envelope to the subscription whose poison stream holds it
  only (never to the others, which had their copy, whatever its ``dlq.subscription`` says), at
  the head of its priority band. An entry of a poison stream is never re-published: its
  subscription's consumers can write anything there, so only the broker's ``{qm}:dlq`` is
  trusted for that. (Protocol 5 kept poison messages in ``{qm}:dlq``: those are still
  re-queued to their ``dlq.subscription``.)

Where a publication is re-published: a publication that came through a principal's ingress
stream (field ``principal``, or ``dlq.principal``) goes back into that ingress stream
``{qm}:in:<principal>``, so that the queue mutex checks the binding again and stamps
``principal``: a replay is never refused as impersonation while the publisher id is bound to
its principal, and a publication refused as impersonation is delivered only once an operator
has bound the id. Any other goes to the publish stream ``{qm}:publish``, which only the broker's
own users (worker, channel, admin) may write: a dead letter whose publisher id is bound to a
principal but which names none (so it cannot have come through an ingress stream and was not
forwarded by a channel: no ``origin``) is skipped as unverifiable.

Each replay is one Lua call (``lua/replay.lua``, ``lua/requeue.lua``): the XADD (or RPUSH) and
the XDEL of the dead letter are one atomic step (the dead-letter stream and its targets share the
``{qm}`` hash slot), checked before the first write: key types, the dead letter still there.
A MULTI/EXEC would run the XDEL even when its XADD failed on a key of another type.

What is never replayed (skipped, with the reason, and left in the dead-letter queue): a dead
letter missing a field (a body, props or topic over ``max_body_bytes``: ``dlq.<field>_bytes``;
more than 1,000 fields: ``dlq.fields``), with no valid publisher id, whose fields would be
refused again (``broker.core.entries.parse_entry``), that has expired, of a principal no longer bound
to its publisher id, or of a subscription that no longer exists; a poison message with
``keep`` (the subscriber queue has no dedup record: each replay would deliver it again).
Order: dead letters are replayed in the dead-letter stream's order; once one publication of a
publisher is skipped, the later ones of that publisher are skipped too, so that none passes it
(an expired one, which can never be delivered, holds nothing back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis

from broker.core import keys, wire
from broker.core.connection import is_cluster
from broker.core.entries import parse_entry
from broker.core.errors import (
    DeadLetterNotFound,
    EmptySelection,
    ForeignKey,
    InvalidMessage,
    translate_errors,
)
from broker.core.models import decode_envelope
from broker.core.scripts import register
from broker.operations.dead_letter_selection import (
    DLQ_ID,
    POISON_ID,
    SCAN_CHUNK,
    DeadLetter,
    Selection,
    all_entries,
    check_dlq,
    check_id,
    is_dead_letter_id,
    json_value,
    parse_dead_letter,
    poison_streams,
    select,
)
from broker.operations.reasons import dead_letter_reason, topic_check

__all__ = [  # with what it re-exports from broker.operations.dead_letter_selection
    "DLQ_ID",
    "POISON_ID",
    "PURGE_CHUNK",
    "REPLAY_CHUNK",
    "SCAN_CHUNK",
    "DeadLetter",
    "ReplayReport",
    "Selection",
    "count_by_reason",
    "dumps",
    "is_dead_letter_id",
    "json_value",
    "list_dead_letters",
    "parse_dead_letter",
    "poison_streams",
    "purge",
    "replay",
    "show",
]

#: Every dead letter: the default selection of a listing.
_EVERY = Selection()

#: Replays sent per pipeline round trip (each is its own atomic script call).
REPLAY_CHUNK = 200

#: Dead letters deleted per XDEL.
PURGE_CHUNK = 1_000

#: Fields of a dead letter that are not the publication's: never re-published.
_NOT_PUBLISHED = (b"reply", b"principal")


@dataclass
class ReplayReport:
    """What ``replay`` did (or, with ``dry_run``, would do).

    Attributes:
        replayed: dead-letter ids re-published or re-queued, in order.
        skipped: ``(dead-letter id, why)`` of those left in the dead-letter queue.
        kept: True when the replayed dead letters were kept in the dead-letter queue.
        dry_run: True when nothing was written.
        live_workers: workers with a heartbeat in the last ``keys.LIVENESS_MS``: replay only
            re-publishes, a worker delivers.
    """

    replayed: list[str]
    skipped: list[tuple[str, str]]
    kept: bool
    dry_run: bool = False
    live_workers: int = 0
    requeued: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line: ``replayed N (M re-queued to their subscription), skipped K``."""
        verb = "would replay" if self.dry_run else "replayed"
        text = f"{verb} {len(self.replayed)}"
        if self.requeued:
            text += f" ({len(self.requeued)} re-queued to their subscription)"
        text += f", skipped {len(self.skipped)}"
        if self.kept and self.replayed:
            text += " (kept in the dead-letter queue)"
        return text


@translate_errors
def list_dead_letters(
    client: redis.Redis, qm: str, selection: Selection = _EVERY, count: int = 100
) -> tuple[list[DeadLetter], list[str]]:
    """The dead letters ``selection`` selects (every one when it is empty), oldest first.

    Args:
        count: the most dead letters to return (the oldest that match).

    Returns:
        ``(dead letters, problems)``: problems are one line each: a dead letter whose envelope
        cannot be read (listed all the same), an id named that is not in the dead-letter queue.

    Raises:
        ForeignKey: ``{qm}:dlq`` holds another Redis type.
        DeadLetterNotFound: an id in ``selection.ids`` is not of the form ``<ms>-<n>``.
    """
    rows, problems, missing = select(client, qm, selection, count)
    problems += [f"no dead letter {i} in the dead-letter queue" for i in missing]
    return rows, problems


@translate_errors
def count_by_reason(client: redis.Redis, qm: str, by_kind: bool = False) -> dict[str, int]:
    """How many dead letters carry each ``dlq.reason`` (the exact text), most frequent first; with
    ``by_kind``, each reason code instead (``broker.operations.reasons``: the metrics' label).

    Raises:
        ForeignKey: ``{qm}:dlq`` holds another Redis type.
    """
    counts: dict[str, int] = {}
    valid = topic_check(client, qm) if by_kind else None
    for _, raw, _ in all_entries(client, qm, []):
        reason = wire.lenient_text(raw.get(b"dlq.reason") or b"")
        if by_kind:
            topic = raw.get(b"topic")
            reason = dead_letter_reason(reason, None if topic is None else wire.lenient_text(topic), valid)
        counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@translate_errors
def show(client: redis.Redis, qm: str, dlq_id: str) -> DeadLetter:
    """One dead letter, every field.

    Raises:
        DeadLetterNotFound: no such entry in ``{qm}:dlq`` (or, for ``<sub id>/<ms>-<n>``, in that
            subscription's poison stream), or ``dlq_id`` is neither form.
        ForeignKey: ``{qm}:dlq`` holds another Redis type.
    """
    check_id(dlq_id)
    sub, _, entry = dlq_id.rpartition("/")
    stream = keys.sub_poison(qm, sub) if sub else keys.dead_letter(qm)
    if not sub and not check_dlq(client, qm):
        raise DeadLetterNotFound(dlq_id, f"no dead letter in {stream}")
    try:
        found = cast(list[Any], client.xrange(stream, entry, entry))
    except redis.ResponseError:  # a poison key of another type: its consumers' own
        found = []
    if not found:
        raise DeadLetterNotFound(dlq_id, f"no dead letter in {stream}")
    return parse_dead_letter(entry, found[0][1], sub or None)[0]


# --- replay ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Publish:
    target: str  # the stream: publish or a principal's ingress
    fields: list[bytes]


@dataclass(frozen=True)
class _Requeue:
    sub_id: str
    band: str
    stream: str  # the dead letter's stream: {qm}:dlq (protocol 5) or the subscription's poison stream


def _expired(expiration_ms: int, now_ms: int) -> str | None:
    if expiration_ms and expiration_ms <= now_ms:
        return f"expired at {expiration_ms} ms (it could never be delivered; purge it)"
    return None


def _plan_requeue(qm: str, letter: DeadLetter, keep: bool, now_ms: int) -> _Requeue | str:
    """How to re-queue a poison message, or why not."""
    if keep:
        return (
            "a poison message is re-queued to its subscription, where no dedup record guards it: "
            "kept, every replay would deliver it again (replay it without --keep)"
        )
    try:
        header, _ = decode_envelope(letter.fields["envelope"])
    except InvalidMessage as exc:
        return f"corrupt: {exc}"
    priority = header.get("priority", keys.DEFAULT_PRIORITY)
    if not isinstance(priority, int) or not wire.is_priority(priority):
        return f"corrupt: envelope priority {priority!r}"
    expiration = header.get("expiration", 0)
    if isinstance(expiration, int) and (why := _expired(expiration, now_ms)):
        return why
    sub_id = letter.source if letter.source is not None else letter.subscription
    assert sub_id is not None
    return _Requeue(sub_id, keys.sub_band(qm, sub_id, priority), letter.stream(qm))


def _plan_publish(
    qm: str, letter: DeadLetter, owners: dict[str, list[str]], now_ms: int
) -> _Publish | tuple[str, bool]:
    """How to re-publish a refused publication, or ``(why not, holds later ones back)``."""
    fields = letter.fields
    if "dlq.fields" in fields:
        return f"only the first 1,000 of its {wire.lenient_text(fields['dlq.fields'])} fields were kept", True
    left_out = sorted(n[4:-6] for n in fields if n.startswith("dlq.") and n.endswith("_bytes"))
    if left_out:
        sizes = ", ".join(f"{n} ({wire.lenient_text(fields[f'dlq.{n}_bytes'])} bytes)" for n in left_out)
        return f"not copied into the dead letter (over max_body_bytes): {sizes}", True
    entry_id = letter.entry_id
    if not entry_id or not DLQ_ID.match(entry_id):
        return "corrupt: no dlq.entry_id (the message id it was published with is unknown)", True
    raw = {k.encode(): v for k, v in fields.items() if not k.startswith("dlq.")}
    try:
        entry = parse_entry(entry_id, raw, max_body_bytes=2**62)
    except InvalidMessage as exc:
        return f"it would be refused again: {exc}", True
    if why := _expired(entry.expiration_ms, now_ms):
        return why, False
    principal = wire.utf8_or_none(fields.get("dlq.principal")) or wire.utf8_or_none(fields.get("principal"))
    if principal is not None:
        if entry.publisher not in owners.get(principal, ()):
            return (
                f"publisher id {entry.publisher!r} is not bound to principal {principal!r}, whose "
                "ingress stream it came by: bind it ('broker acl') and replay again, or purge it",
                True,
            )
        target = keys.ingress(qm, principal)
    else:
        owned_by = sorted(p for p, ids in owners.items() if entry.publisher in ids)
        if owned_by and "origin" not in fields:
            return (
                f"publisher id {entry.publisher!r} is bound to principal {', '.join(owned_by)} but the "
                "dead letter names no principal: it cannot be told from a forged publication",
                True,
            )
        target = keys.publish_stream(qm)
    out: list[bytes] = []
    for name, value in raw.items():
        if name not in _NOT_PUBLISHED and name != b"msgid":
            out += [name, value]
    out += [b"msgid", entry.msgid.encode("utf-8", "surrogateescape")]
    return _Publish(target, out)


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _owners(client: redis.Redis, qm: str) -> dict[str, list[str]]:
    key = keys.principals(qm)
    found = wire.lenient_text(client.type(key))
    if found not in ("none", "hash"):
        raise ForeignKey(key, found, "hash")
    return {
        wire.lenient_text(p): wire.lenient_text(ids).split("\n") for p, ids in client.hgetall(key).items()
    }


@translate_errors
def replay(
    client: redis.Redis, qm: str, selection: Selection, *, keep: bool = False, dry_run: bool = False
) -> ReplayReport:
    """Replay the selected dead letters, in the dead-letter stream's order (see the module docstring).

    A refused publication is re-published (to the publish stream, or to the ingress stream of
    its principal) with its message id; a poison message is re-queued to its subscription.
    Each dead letter replayed is removed from the dead-letter queue in the same atomic step,
    unless ``keep``. Replay only re-publishes: running workers deliver.

    Args:
        selection: which dead letters; an empty one is refused.
        keep: leave re-published dead letters in the dead-letter queue (a second replay is then
            a duplicate by message id, within ``dedup_window_ms``); poison messages are skipped.
        dry_run: decide, write nothing.

    Returns:
        The ``ReplayReport``: ids replayed, ids skipped with the reason (left in the queue).

    Raises:
        EmptySelection: ``selection.is_empty()``.
        ForeignKey: ``{qm}:dlq``, ``{qm}:publish``, ``{qm}:subs`` or ``{qm}:principals`` holds
            another Redis type (nothing is written).
        DeadLetterNotFound: an id in ``selection.ids`` is not of the form ``<ms>-<n>``.
    """
    if selection.is_empty():
        raise EmptySelection(
            "select dead letters to replay: ids, --reason, --publisher, --topic, --subscription or --all"
        )
    letters, _, missing = select(client, qm, selection)
    report = ReplayReport([], [(i, "no such dead letter") for i in missing], kept=keep, dry_run=dry_run)
    for key, want in ((keys.publish_stream(qm), "stream"), (keys.subscriptions(qm), "hash")):
        found = wire.lenient_text(client.type(key))
        if found not in ("none", want):
            raise ForeignKey(key, found, want)
    owners = _owners(client, qm)
    now_ms = _server_ms(client)
    subs = {wire.lenient_text(s) for s in client.hkeys(keys.subscriptions(qm))}
    stream_ok: dict[str, str | None] = {}

    def target_problem(key: str, want: str) -> str | None:
        if key not in stream_ok:
            found = wire.lenient_text(client.type(key))
            stream_ok[key] = None if found in ("none", want) else str(ForeignKey(key, found, want))
        return stream_ok[key]

    held_back: dict[str, str] = {}  # publisher -> the dead letter skipped before
    plans: list[tuple[DeadLetter, _Publish | _Requeue]] = []
    for letter in letters:
        if letter.source is not None and not letter.poison:
            report.skipped.append(
                (
                    letter.id,
                    f"not a poison message (no envelope) in subscription {letter.source}'s poison "
                    "stream, which its consumers write: never re-published; purge it",
                )
            )
            continue
        if letter.poison:
            plan = _plan_requeue(qm, letter, keep, now_ms)
            if isinstance(plan, _Requeue):
                if plan.sub_id not in subs:
                    plan = f"subscription {plan.sub_id} no longer exists"
                else:
                    plan = (
                        target_problem(plan.band, "list")
                        or target_problem(keys.sub_bell(qm, plan.sub_id), "list")
                        or plan
                    )
            if isinstance(plan, str):
                report.skipped.append((letter.id, plan))
            else:
                plans.append((letter, plan))
            continue
        if letter.publisher is not None and letter.publisher in held_back:
            report.skipped.append(
                (
                    letter.id,
                    f"held back: an earlier dead letter of publisher {letter.publisher!r} "
                    f"({held_back[letter.publisher]}) was skipped, and order is kept per publisher",
                )
            )
            continue
        planned = _plan_publish(qm, letter, owners, now_ms)
        if isinstance(planned, _Publish) and (why := target_problem(planned.target, "stream")):
            planned = (why, True)
        if isinstance(planned, tuple):
            why, holds = planned
            report.skipped.append((letter.id, why))
            if holds and letter.publisher is not None:
                held_back[letter.publisher] = letter.id
            continue
        plans.append((letter, planned))
    if dry_run:
        for letter, step in plans:
            report.replayed.append(letter.id)
            if isinstance(step, _Requeue):
                report.requeued.append(letter.id)
    else:
        _run(client, qm, plans, keep, report)
    report.live_workers = _live_workers(client, qm, now_ms)
    return report


def _run(
    client: redis.Redis,
    qm: str,
    plans: list[tuple[DeadLetter, _Publish | _Requeue]],
    keep: bool,
    report: ReplayReport,
) -> None:
    """Send the replays, ``REPLAY_CHUNK`` per round trip (one by one on a Redis Cluster, where
    redis-py pipelines no scripts), each its own atomic script call."""
    publish = register(client, "replay")
    requeue = register(client, "requeue")
    dlq = keys.dead_letter(qm)

    def call(letter: DeadLetter, plan: _Publish | _Requeue, on: Any) -> Any:
        if isinstance(plan, _Publish):
            return publish(
                keys=[dlq, plan.target],
                args=[letter.stream_id, "1" if keep else "0", *plan.fields],
                client=on,
            )
        return requeue(
            keys=[plan.stream, keys.subscriptions(qm), plan.band, keys.sub_bell(qm, plan.sub_id)],
            args=[letter.stream_id, plan.sub_id],
            client=on,
        )

    for start in range(0, len(plans), REPLAY_CHUNK):
        chunk = plans[start : start + REPLAY_CHUNK]
        results: list[Any] = []
        if is_cluster(client):
            for letter, plan in chunk:
                try:
                    results.append(call(letter, plan, client))
                except redis.ResponseError as exc:
                    results.append(exc)
        else:
            pipe = client.pipeline(transaction=False)
            for letter, plan in chunk:
                call(letter, plan, pipe)
            results = pipe.execute(raise_on_error=False)
        for (letter, plan), done in zip(chunk, results, strict=True):
            if done == 1:
                report.replayed.append(letter.id)
                if isinstance(plan, _Requeue):
                    report.requeued.append(letter.id)
            elif isinstance(done, Exception):
                report.skipped.append((letter.id, str(done).removeprefix("BROKER ")))
            elif done == 0:
                report.skipped.append(
                    (letter.id, "no longer in the dead-letter queue (replayed or purged meanwhile)")
                )
            elif done == -1:
                report.skipped.append((letter.id, f"subscription {letter.subscription} no longer exists"))
            else:
                report.skipped.append((letter.id, "the dead letter holds no envelope"))


def _live_workers(client: redis.Redis, qm: str, now_ms: int) -> int:
    try:
        return int(client.zcount(keys.alive(qm), now_ms - keys.LIVENESS_MS, "+inf"))
    except redis.ResponseError:  # a foreign {qm}:alive: unknown
        return 0


# --- purge -------------------------------------------------------------------------------------


@translate_errors
def purge(client: redis.Redis, qm: str, selection: Selection, *, dry_run: bool = False) -> int:
    """Delete the selected dead letters (only those found when it runs: one that arrives while it
    runs is kept, even with ``everything``).

    Args:
        dry_run: count them, delete nothing.

    Returns:
        How many were deleted (with ``dry_run``: would be).

    Raises:
        EmptySelection: ``selection.is_empty()``.
        ForeignKey: ``{qm}:dlq`` holds another Redis type (nothing is deleted).
        DeadLetterNotFound: an id in ``selection.ids`` is not of the form ``<ms>-<n>``.
    """
    if selection.is_empty():
        raise EmptySelection(
            "select dead letters to purge: ids, --reason, --publisher, --topic, --subscription or --all"
        )
    letters, _, _ = select(client, qm, selection)
    if dry_run:
        return len(letters)
    by_stream: dict[str, list[str]] = {}
    for letter in letters:
        by_stream.setdefault(letter.stream(qm), []).append(letter.stream_id)
    deleted = 0
    for stream, ids in by_stream.items():
        for start in range(0, len(ids), PURGE_CHUNK):
            deleted += int(client.xdel(stream, *ids[start : start + PURGE_CHUNK]))
    return deleted


def dumps(value: Any) -> str:
    """``value`` as indented JSON text (the CLI's ``--json``)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
