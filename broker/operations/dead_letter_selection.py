"""Finding dead letters: what one is (``DeadLetter``, read by ``parse_dead_letter``), its id, the
``Selection`` of the commands, and reading them from ``{qm}:dlq`` and the subscriptions' poison
streams (``{qm}:sub:<id>:poison``). ``broker.operations.dead_letters`` lists, shows, replays and
purges what this module finds; it re-exports the public names, so callers import from there.

Reads only: a rare operator's path (``broker dlq``, the console), never the hot path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from broker.core import keys, wire
from broker.core.errors import DeadLetterNotFound, ForeignKey, InvalidMessage
from broker.core.models import decode_envelope
from broker.operations.reasons import dead_letter_reason

#: A dead-letter id: a stream entry id, ``<ms>-<n>``.
DLQ_ID = re.compile(r"^\d{1,20}-\d{1,20}$")

#: A poison message's id: ``<sub id>/<ms>-<n>``, its entry in the subscription's poison stream.
POISON_ID = re.compile(r"^(?P<sub>[A-Za-z0-9_.$\-]{1,300})/(?P<id>\d{1,20}-\d{1,20})$")


def is_dead_letter_id(text: str) -> bool:
    """Whether ``text`` names a dead letter: ``<ms>-<n>`` or ``<sub id>/<ms>-<n>``."""
    return bool(DLQ_ID.match(text) or POISON_ID.match(text))


#: Dead letters read per XRANGE while scanning, records.
SCAN_CHUNK = 500


def json_value(raw: bytes) -> Any:
    """A field value, JSON-safe: its text when it is UTF-8, else ``{"hex": ..., "bytes": n}``."""
    text = wire.utf8_or_none(raw)
    if text is not None:
        return text
    return {"hex": raw.hex(), "bytes": len(raw)}


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead-letter stream ``{qm}:dlq`` or of a subscription's poison stream.

    Attributes:
        id: the dead-letter stream entry id (``<ms>-<n>``); a poison stream's ``<sub id>/<ms>-<n>``.
        time_ms: when it was dead-lettered, ms since the epoch (from the id).
        reason: ``dlq.reason``, one line ("" when missing).
        entry_id: ``dlq.entry_id``: the publish-stream entry it was, or None.
        publisher: the publisher id (the field, or the envelope header's), or None.
        msgid: the message id given (the field, or the envelope header's), or None.
        topic: the topic string (the field, or the envelope header's), or None.
        subscription: the subscription a poison message was dead-lettered from: the one whose
            poison stream holds it (its ``dlq.subscription`` field for protocol 5's in
            ``{qm}:dlq``), or None for a refused publication.
        body_size: the body's size, bytes (from the body, the envelope or ``dlq.body_bytes``), or
            None when unknown.
        fields: every raw field, bytes to bytes, in the entry's order.
        source: the subscription whose poison stream holds it, or None for ``{qm}:dlq``.
    """

    id: str
    time_ms: int
    reason: str
    entry_id: str | None
    publisher: str | None
    msgid: str | None
    topic: str | None
    subscription: str | None
    body_size: int | None
    fields: dict[str, bytes]
    source: str | None = None

    @property
    def poison(self) -> bool:
        """True for a poison message of one subscription (an ``envelope`` to re-queue to it)."""
        return self.subscription is not None and "envelope" in self.fields

    @property
    def stream_id(self) -> str:
        """Its entry id in its stream (``<ms>-<n>``)."""
        return self.id.rpartition("/")[2]

    def stream(self, qm: str) -> str:
        """The stream that holds it: ``{qm}:dlq`` or ``{qm}:sub:<source>:poison``."""
        return keys.dead_letter(qm) if self.source is None else keys.sub_poison(qm, self.source)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe: every attribute, ``fields`` mapped through ``json_value`` (text, or hex and size)."""
        return {
            "id": self.id,
            "time_ms": self.time_ms,
            "reason": self.reason,
            "entry_id": self.entry_id,
            "publisher": self.publisher,
            "msgid": self.msgid,
            "topic": self.topic,
            "subscription": self.subscription,
            "body_size": self.body_size,
            "fields": {name: json_value(value) for name, value in self.fields.items()},
            "source": self.source,
        }


def parse_dead_letter(
    dlq_id: str, raw: dict[Any, Any], source: str | None = None
) -> tuple[DeadLetter, str | None]:
    """Read one dead-letter entry (fields as XRANGE returns them); ``source``: the subscription
    whose poison stream it is in (its id is then ``<source>/<dlq_id>``), None for ``{qm}:dlq``.

    Returns:
        ``(dead letter, problem)``: the problem is one line naming what cannot be read (an
        envelope that is not one), or None.
    """
    fields = {wire.lenient_text(k): (v if isinstance(v, bytes) else str(v).encode()) for k, v in raw.items()}
    problem = None
    publisher, msgid, topic = (wire.utf8_or_none(fields.get(n)) for n in ("publisher", "msgid", "topic"))
    body_size: int | None = None
    if "envelope" in fields:
        try:
            header, env_body = decode_envelope(fields["envelope"])
        except InvalidMessage as exc:
            problem = f"dead letter {dlq_id} in the dead-letter queue: {exc}"
        else:
            publisher = _str_or_none(header.get("publisher"))
            msgid = _str_or_none(header.get("msgid"))
            topic = _str_or_none(header.get("topic"))
            body_size = len(env_body)
    elif "body" in fields:
        body_size = len(fields["body"])
    elif "dlq.body_bytes" in fields:
        body_size = _int_or_none(fields["dlq.body_bytes"])
    elif "dlq.fields" not in fields:
        body_size = 0  # no body field: the body was empty
    return (
        DeadLetter(
            id=dlq_id if source is None else f"{source}/{dlq_id}",
            time_ms=int(dlq_id.split("-", 1)[0]),
            reason=wire.lenient_text(fields.get("dlq.reason") or b""),
            entry_id=wire.utf8_or_none(fields.get("dlq.entry_id")),
            publisher=publisher,
            msgid=msgid,
            topic=topic,
            subscription=source if source is not None else wire.utf8_or_none(fields.get("dlq.subscription")),
            body_size=body_size,
            fields=fields,
            source=source,
        ),
        problem,
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


@dataclass(frozen=True)
class Selection:
    """Which dead letters a command applies to. Every criterion given must hold (they narrow).

    Attributes:
        ids: dead-letter ids (``<ms>-<n>``, a poison message's ``<sub id>/<ms>-<n>``); empty: any.
        reason: a substring of ``dlq.reason``, case-insensitive.
        kind: the reason's code (``broker.operations.reasons.dead_letter_reason``: ``queue_full``...),
            with ``topic_valid`` (``reasons.topic_check``) telling an invalid topic apart.
        publisher: the publisher id, exactly.
        topic: the topic string, exactly.
        subscription: the subscription a poison message came from, exactly.
        everything: select every dead letter (needed by replay and purge when nothing else is given).
    """

    ids: tuple[str, ...] = ()
    reason: str | None = None
    kind: str | None = None
    topic_valid: Any = field(default=None, compare=False, repr=False)
    publisher: str | None = None
    topic: str | None = None
    subscription: str | None = None
    everything: bool = False

    def is_empty(self) -> bool:
        """True when nothing is selected: no id, no filter, and not ``everything``."""
        return not (
            self.ids
            or self.reason is not None
            or self.kind is not None
            or self.publisher is not None
            or self.topic is not None
            or self.subscription is not None
            or self.everything
        )

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` meets every criterion given."""
        return (
            (not self.ids or letter.id in self.ids)
            and (self.reason is None or self.reason.casefold() in letter.reason.casefold())
            and (
                self.kind is None
                or dead_letter_reason(letter.reason, letter.topic, self.topic_valid) == self.kind
            )
            and (self.publisher is None or letter.publisher == self.publisher)
            and (self.topic is None or letter.topic == self.topic)
            and (self.subscription is None or letter.subscription == self.subscription)
        )


def check_dlq(client: redis.Redis, qm: str) -> bool:
    """Whether the dead-letter stream exists. Raises ForeignKey when it holds another type."""
    found = wire.lenient_text(client.type(keys.dead_letter(qm)))
    if found not in ("none", "stream"):
        raise ForeignKey(keys.dead_letter(qm), found, "stream")
    return found == "stream"


def check_id(dlq_id: str) -> str:
    """``dlq_id`` itself. Raises: DeadLetterNotFound: not of the form ``<ms>-<n>`` or ``<sub id>/<ms>-<n>``."""
    if not is_dead_letter_id(dlq_id):
        raise DeadLetterNotFound(
            dlq_id, "not a dead-letter id (<ms>-<n> or <sub id>/<ms>-<n>, as 'broker dlq list' shows)"
        )
    return dlq_id


def poison_streams(client: redis.Redis, qm: str) -> tuple[list[str], list[str]]:
    """The subscriptions that have a poison stream (removed ones too: it is kept), sorted, and
    problems: a subscription's poison key of another type (its consumers' own key), named.

    One ``SCAN`` over ``{qm}:sub:*:poison``: a rare operator's read, never on the hot path.
    """
    prefix, found, problems = keys.sub_prefix(qm), set(), []
    pattern = keys.glob_escape(prefix) + "*:poison"
    for raw in client.scan_iter(match=pattern, count=1_000):
        key = wire.lenient_text(raw)
        sub_id = key[len(prefix) : -len(":poison")]
        if not sub_id or ":" in sub_id:  # an in-flight list of a consumer named "poison"
            continue
        kind = wire.lenient_text(client.type(key))
        if kind == "stream":
            found.add(sub_id)
        elif kind != "none":
            problems.append(f"not read: {ForeignKey(key, kind, 'stream')}")
    return sorted(found), problems


def scan_stream(client: redis.Redis, key: str) -> Iterator[tuple[str, dict[Any, Any]]]:
    """Every entry of stream ``key``, oldest first, read ``SCAN_CHUNK`` at a time."""
    start = "-"
    while True:
        chunk = cast(list[Any], client.xrange(key, start, "+", count=SCAN_CHUNK))
        for entry_id, raw in chunk:
            yield wire.lenient_text(entry_id), raw
        if len(chunk) < SCAN_CHUNK:
            return
        start = "(" + wire.lenient_text(chunk[-1][0])


def entries_by_id(
    client: redis.Redis, qm: str, ids: tuple[str, ...]
) -> tuple[list[tuple[str, dict[Any, Any], str | None]], list[str]]:
    """The named entries (``{qm}:dlq``'s in stream order, then each poison stream's), and the ids
    not found."""

    def order(i: str) -> tuple[str, int, int]:
        sub, _, entry = i.rpartition("/")
        ms, n = entry.split("-")
        return sub, int(ms), int(n)

    wanted = sorted(dict.fromkeys(check_id(i) for i in ids), key=order)
    pipe = client.pipeline(transaction=False)
    for dlq_id in wanted:
        sub, _, entry = dlq_id.rpartition("/")
        stream = keys.sub_poison(qm, sub) if sub else keys.dead_letter(qm)
        pipe.xrange(stream, entry, entry)
    found, missing = [], []
    for dlq_id, reply in zip(wanted, pipe.execute(raise_on_error=False), strict=True):
        if reply and not isinstance(reply, Exception):
            sub, _, entry = dlq_id.rpartition("/")
            found.append((entry, reply[0][1], sub or None))
        else:
            missing.append(dlq_id)
    return found, missing


def all_entries(
    client: redis.Redis, qm: str, problems: list[str]
) -> Iterator[tuple[str, dict[Any, Any], str | None]]:
    """Every dead letter: ``{qm}:dlq``'s, then each subscription's poison stream's, oldest first."""
    if check_dlq(client, qm):
        for entry_id, raw in scan_stream(client, keys.dead_letter(qm)):
            yield entry_id, raw, None
    subs, found = poison_streams(client, qm)
    problems += found
    for sub_id in subs:
        for entry_id, raw in scan_stream(client, keys.sub_poison(qm, sub_id)):
            yield entry_id, raw, sub_id


def select(
    client: redis.Redis, qm: str, selection: Selection, count: int | None = None
) -> tuple[list[DeadLetter], list[str], list[str]]:
    """(selected dead letters, ``{qm}:dlq``'s then the poison streams', oldest first; problems;
    ids named but not found)."""
    check_dlq(client, qm)
    rows: list[DeadLetter] = []
    problems: list[str] = []
    missing: list[str] = []
    if selection.ids:
        entries, missing = entries_by_id(client, qm, selection.ids)
        source: Any = iter(entries)
    else:
        source = all_entries(client, qm, problems)
    for dlq_id, raw, sub_id in source:
        letter, problem = parse_dead_letter(dlq_id, raw, sub_id)
        if not selection.matches(letter):
            continue
        if problem:
            problems.append(problem)
        rows.append(letter)
        if count is not None and len(rows) >= count:
            break
    return rows, problems, missing
