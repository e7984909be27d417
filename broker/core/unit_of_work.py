"""The unit of work of one publication, and its encoding for ``lua/library/commit.lua``.

A worker decides, for each publication at the head of a FIFO whose turn it
holds, one ``UnitOfWork``: deliver it (to these subscriber queues, with this
envelope), expire it, refuse it (with this reason), or skip it (its entry is
gone from the stream). ``CommitBatch`` encodes a batch of them into one
``commit.lua`` call; the script applies each all or nothing and answers one
``Outcome`` per unit.

The ARGV layout of a unit is named in ``UNIT_FIELDS`` and written out in the
header of ``commit.lua`` (``-- unit field <n> <name>``); a test checks that both
list the same fields in the same order. The last field, ``journal``, is sent only
when the journal is on: every field costs Redis and Lua per unit, whether empty or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker.core import wire
from broker.core.config import SlowSubscriberCondition

#: First KEYS index of the subscriber queues in ``commit.lua`` (KEYS[1..9] are fixed keys).
FIRST_QUEUE_KEY = 10

#: The ARGV fields of one unit of work in ``commit.lua``, in order. Few, because every
#: argument costs Redis (a string object, then a Lua string): what most units of a batch
#: share is packed into ``options`` and ``recipients``, which the script parses once per
#: distinct value (``encode_options``, ``CommitBatch``). The last one, ``journal``, only
#: when the journal is on (``CommitBatch(journal=True)``); without, a unit has the others.
UNIT_FIELDS = (
    "publisher",
    "entry_id",
    "payload",
    "msgid",
    "recipients",
    "options",
    "journal",
)

#: Most KEYS indexes a recipient set can name: each is packed in 3 bytes.
MAX_KEY_INDEX = 2**24 - 1


#: IBM MQ's PMSGDLV / NPMSGDLV: what a publication does when a recipient queue is full.
DELIVERY_POLICIES = ("ALL", "ALLDUR", "ALLAVAIL")


class Retain(StrEnum):
    """What a delivered unit of work does to its topic's retained publication (``{qm}:retained``)."""

    NONE = ""
    #: keep this publication as its topic's retained one (``retain 1``)
    STORE = "s"
    #: remove the topic's retained publication (``retain 1`` with an empty body)
    CLEAR = "c"


class Action(StrEnum):
    """What a unit of work does with its publication."""

    DELIVER = "deliver"
    EXPIRE = "expire"
    REFUSE = "refuse"
    SKIP = "skip"


class Outcome(StrEnum):
    """What ``commit.lua`` did with a unit of work (its reply code is the position, 0-6)."""

    FENCED = "fenced"
    DELIVERED = "delivered"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    REFUSED = "refused"
    SKIPPED = "skipped"
    #: a retained publication resolved at an older index version (and its publisher's units after
    #: it in the call): nothing written, the turn kept; the worker decides it again
    RETRY = "retry"


#: ``commit.lua`` reply codes, by position.
OUTCOMES = tuple(Outcome)


@dataclass(slots=True, eq=False)
class UnitOfWork:
    """One publication's unit of work. Not frozen, on purpose: a frozen dataclass sets each of its
    18 fields through ``object.__setattr__``, 2.5 µs a publication where this takes 0.8 (nothing
    changes a unit once made: it is built by ``worker.decide`` and read by ``CommitBatch.add`` and
    the apply step). Units compare by identity (``eq=False``).

    Attributes:
        publisher: the publisher id (its FIFO and turn).
        entry_id: the publish stream entry id.
        action: deliver, expire, refuse or skip.
        msgid: the message id (dedup record and reply key): its bytes as sent, decoded with
            ``surrogateescape`` (``CommitBatch`` encodes it back byte for byte).
        envelope: what every subscriber queue gets (deliver), bytes.
        queues: the de-duplicated subscriber queue keys (deliver).
        reason: why it is refused (refuse): one line of text.
        suggestion: a corrected topic when the topic was refused, or "".
        dedup_window_ms: how long the msgid is remembered, ms; 0 for no record.
        reply_ttl_ms: how long the result is kept for the publisher, ms; 0 when
            no result was asked for.
        seq: the publisher's sequence number, or None (journal).
        topic: the topic string (journal).
        enqueued_ms: the publication's time, ms since the epoch (journal).
        delivery: ``ALL``, ``ALLDUR`` or ``ALLAVAIL``: what to do when a recipient queue
            is at its MAXDEPTH (``broker.topics.topic_objects``).
        dead_letter: a refused publication goes to the dead-letter stream (USEDLQ).
        slow: the slow-subscriber condition of the publication's root topic, when it
            applies to the publication (``SlowSubscriberCondition.applies``); the
            queues are then watched (``CommitBatch.watch``). None: no condition.
        policy: refused by a topic object's policy (PUB(DISABLED)), not for what the
            publication is: ``broker.operations.metrics`` counts it as skipped by policy. Not sent
            to ``commit.lua``.
        retain: what a delivered publication does to ``topic``'s retained publication: store its
            envelope, clear it (an empty body) or nothing (``Retain``).
    """

    publisher: str
    entry_id: str
    action: Action
    msgid: str
    envelope: bytes = b""
    queues: tuple[str, ...] = ()
    reason: str = ""
    suggestion: str = ""
    dedup_window_ms: int = 0
    reply_ttl_ms: int = 0
    seq: int | None = None
    topic: str = ""
    enqueued_ms: int = 0
    delivery: str = "ALLAVAIL"
    dead_letter: bool = True
    slow: SlowSubscriberCondition | None = None
    policy: bool = False
    retain: Retain = Retain.NONE


def _b(text: str) -> bytes:
    """A publisher id or message id back as the bytes Redis holds (ids that were not UTF-8
    round-trip: they were decoded with ``surrogateescape``)."""
    return text.encode("utf-8", "surrogateescape")


class CommitBatch:
    """The arguments of one ``commit.lua`` call: a batch of units of work, in FIFO order per publisher.

    Queue keys are interned: each is one KEYS entry of the call, and a unit names its
    recipient queues by their KEYS indexes, packed 3 bytes each (``recipients``).

    Args:
        journal: send each unit's journal field (seq, enqueued_ms, topic); without, a
            unit has no ``journal`` field (``unit_size`` fields) and the call writes no journal.
    """

    __slots__ = ("_key_index", "_set_index", "args", "journal", "limits", "queue_keys", "units")

    def __init__(self, journal: bool = False) -> None:
        #: KEYS index -> (MAXDEPTH, durable) of the bounded queues in this batch
        self.limits: dict[int, tuple[int, bool]] = {}
        self.queue_keys: list[str] = []
        #: queue key -> its KEYS index, packed as ``_recipients`` sends it (3 bytes, big-endian)
        self._key_index: dict[str, bytes] = {}
        self._set_index: dict[tuple[str, ...], bytes] = {}
        self.args: list[bytes | str | int] = []
        self.units: list[UnitOfWork] = []
        self.journal = journal

    def __len__(self) -> int:
        return len(self.units)

    @property
    def unit_size(self) -> int:
        """How many ARGV fields each unit has: ``UNIT_FIELDS``, without ``journal`` when it is off."""
        return len(UNIT_FIELDS) if self.journal else len(UNIT_FIELDS) - 1

    def _recipients(self, queues: tuple[str, ...]) -> bytes:
        """The recipient set ``queues`` as ``commit.lua`` takes it: KEYS indexes, 3 bytes each, big-endian.

        Raises:
            ValueError: the batch names more than ``MAX_KEY_INDEX`` keys.
        """
        found = self._set_index.get(queues)
        if found is not None:
            return found
        key_index = self._key_index
        parts = []
        for queue in queues:
            code = key_index.get(queue)
            if code is None:
                pos = len(self.queue_keys) + FIRST_QUEUE_KEY
                if pos > MAX_KEY_INDEX:
                    raise ValueError(f"a commit batch names at most {MAX_KEY_INDEX} keys")
                code = key_index[queue] = pos.to_bytes(3, "big")
                self.queue_keys.append(queue)
            parts.append(code)
        found = self._set_index[queues] = b"".join(parts)
        return found

    def _position(self, queue: str) -> int:
        """``queue``'s KEYS index in this batch (added by ``add``)."""
        return int.from_bytes(self._key_index[queue], "big")

    def limit(self, queue: str, maxdepth: int, durable: bool) -> None:
        """Bound ``queue`` (already added by ``add``) at ``maxdepth`` messages for this batch."""
        self.limits[self._position(queue)] = (maxdepth, durable)

    def watch(self, queue: str, durable: bool) -> None:
        """Have ``commit.lua`` count the messages waiting in ``queue``'s subscription (every band),
        for a slow-subscriber condition; ``queue`` was added by ``add``. A bounded queue keeps its bound."""
        self.limits.setdefault(self._position(queue), (0, durable))

    def encoded_limits(self) -> str:
        """The watched queues for ``commit.lua``: ``"<KEYS index>:<maxdepth, 0 = none>:<1 durable|0> ..."``."""
        return " ".join(f"{k}:{depth}:{int(durable)}" for k, (depth, durable) in self.limits.items())

    def add(self, unit: UnitOfWork) -> None:
        """Encode one unit of work (``UNIT_FIELDS`` order) at the end of the batch."""
        payload: bytes | str = unit.envelope if unit.action is Action.DELIVER else unit.reason
        recipients = self._recipients(unit.queues) if unit.queues else b""
        self.args += (
            _b(unit.publisher),
            unit.entry_id,
            payload,
            _b(unit.msgid),
            recipients,
            encode_options(unit),
        )
        if self.journal:
            self.args.append(f"{'' if unit.seq is None else unit.seq}|{unit.enqueued_ms}|{unit.topic}")
        self.units.append(unit)


def encode_options(unit: UnitOfWork) -> str:
    """A unit's ``options`` field: ``"<action>|<dedup_window_ms>|<reply_ttl_ms>|<delivery>|<dead_letter 1|0>|
    <slow>|<retain>|<suggestion>"``; ``retain`` is "" (nothing retained: the rest is the
    suggestion) or ``s`` (store) / ``c`` (clear) and the topic's length in bytes, the rest then
    starting with the topic (any bytes, ``|`` too) and ending with the suggestion.

    The options of a unit with no slow-subscriber condition, nothing retained and no suggestion
    (nearly every unit) are kept once made (``_OPTIONS``: a handful of distinct values)."""
    plain = unit.slow is None and unit.retain is Retain.NONE and not unit.suggestion
    if plain:
        key = (unit.action, unit.dedup_window_ms, unit.reply_ttl_ms, unit.delivery, unit.dead_letter)
        found = _OPTIONS.get(key)
        if found is not None:
            return found
    retain = ""
    rest = unit.suggestion
    if unit.retain is not Retain.NONE:
        retain = f"{unit.retain}{len(unit.topic.encode('utf-8', 'surrogateescape'))}"
        rest = unit.topic + rest
    options = (
        f"{unit.action}|{unit.dedup_window_ms}|{unit.reply_ttl_ms}|{unit.delivery}|"
        f"{1 if unit.dead_letter else 0}|{_encoded_condition(unit.slow)}|{retain}|{rest}"
    )
    if plain:
        if len(_OPTIONS) >= _OPTIONS_MAX:
            _OPTIONS.clear()
        _OPTIONS[key] = options
    return options


#: ``encode_options`` of plain units, by their values; cleared when it reaches ``_OPTIONS_MAX``.
_OPTIONS: dict[tuple[Action, int, int, str, bool], str] = {}
_OPTIONS_MAX = 256


def _encoded_condition(condition: SlowSubscriberCondition | None) -> str:
    """A unit's ``slow`` field: ``"<max_messages>:<disconnect non-durable 1|0>:<disconnect durable 1|0>"``, or ""."""
    if condition is None:
        return ""
    return (
        f"{condition.max_messages}:{int(condition.disconnect_non_durable_subscriber)}:"
        f"{int(condition.disconnect_delete_durable_subscriber)}"
    )


def decode_outcomes(
    batch: CommitBatch, reply: list[int | bytes]
) -> list[tuple[UnitOfWork, Outcome, int, bool]]:
    """Pair each unit of ``batch`` with what ``commit.lua`` answered for it.

    Args:
        batch: the batch sent.
        reply: the script's reply, 3 integers per unit (code, subscriptions, released),
            then what ``decode_disconnects`` reads.

    Returns:
        ``[(unit, outcome, subscriptions, turn_given_up)]`` in batch order.
    """
    return [
        (unit, OUTCOMES[int(reply[3 * i])], int(reply[3 * i + 1]), bool(reply[3 * i + 2]))
        for i, unit in enumerate(batch.units)
    ]


def decode_disconnects(batch: CommitBatch, reply: list[int | bytes]) -> list[tuple[str, int]]:
    """The subscriptions a slow-subscriber condition asked to disconnect, after the units' integers.

    Returns:
        ``[(sub id, max_messages of the condition)]``, each subscription once.
    """
    rest = reply[3 * len(batch.units) :]
    out = []
    for i in range(0, len(rest) - 1, 2):
        sub_id, most = rest[i], rest[i + 1]
        out.append((wire.text(sub_id), int(most)))
    return out
