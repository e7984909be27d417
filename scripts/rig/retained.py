"""The chaos checker of retained publications (issue 28 row 10): what a subscription made during the
run received of the topics' retained publications.

One publisher (``r0``) publishes retained publications on a few topics, each waiting for its result
before the next (so a topic's retained publications are in a total order, and one is in flight at
most). Subscriptions made now and then during the run (``late<k>``, a filter matching every such
topic) are consumed as the others are. For each late subscription S made at time T (``subscribed``:
before its first attempt) and each topic X, after the drain:

- S received at most one publication of X flagged retained, and one when a retained publication of
  X had its result before T (``missing``, ``duplicated``);
- the flagged one is no older than the last of X whose result came before T (``stale``: the retained
  store must hold it when S is made);
- after it, S received every later retained publication of X with a result, once each, in order,
  and none before it (``lost``, ``reordered``: a publication in flight while S was made is decided
  again by the workers, ``commit.lua``'s ``retry``).

A receipt flagged redelivered (a consumer died holding it) may repeat one before it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.core.models import Message


@dataclass
class _Receipts:
    flagged: dict[str, list[int]] = field(default_factory=dict)  # topic -> numbers received flagged
    plain: dict[str, list[int]] = field(default_factory=dict)  # topic -> numbers in receipt order
    duplicated: int = 0
    seen: set[str] = field(default_factory=set)


class RetainedLog:
    """What the retained publisher had answered, when each late subscription was made, what each received."""

    def __init__(self, publisher: str) -> None:
        self.publisher = publisher
        self.lock = threading.Lock()
        #: topic -> [(number, monotonic time its result came)]
        self.results: dict[str, list[tuple[int, float]]] = {}
        #: late sub id -> monotonic time before it was asked for
        self.made: dict[str, float] = {}
        self.receipts: dict[str, _Receipts] = {}

    def answered(self, topic: str, number: int, at: float) -> None:
        """Publication ``number`` of ``topic`` had its result at ``at`` (``time.monotonic``)."""
        with self.lock:
            self.results.setdefault(topic, []).append((number, at))

    def subscribed(self, sub_id: str, started: float) -> None:
        """Late subscription ``sub_id`` was asked for at ``started`` and made."""
        with self.lock:
            self.made[sub_id] = started
            self.receipts[sub_id] = _Receipts()

    def receive(self, sub_id: str, message: Message, redelivered: bool) -> None:
        """A late subscription's consumer received ``message``."""
        prefix = f"{self.publisher}."
        if not message.msgid.startswith(prefix):
            return
        number = int(message.msgid[len(prefix) :])
        with self.lock:
            got = self.receipts[sub_id]
            key = f"{message.retained}:{message.msgid}"
            if key in got.seen:
                if not redelivered:
                    got.duplicated += 1
                return
            got.seen.add(key)
            (got.flagged if message.retained else got.plain).setdefault(message.topic, []).append(number)

    def check(self, topics: tuple[str, ...]) -> list[str]:
        """The problems found, one line each (none: every late subscription got what it should)."""
        problems = []
        for sub_id, started in sorted(self.made.items()):
            got = self.receipts[sub_id]
            if got.duplicated:
                problems.append(f"retained: {sub_id} received {got.duplicated} duplicates")
            for topic in topics:
                problems += self._check_topic(sub_id, started, got, topic)
        return problems

    def report(self, topics: tuple[str, ...], log: Callable[[str], None]) -> list[str]:
        """``check``, with a summary line given to ``log``; the problems found."""
        problems = self.check(topics)
        log(
            f"retained: {len(self.made)} subscriptions made during the run, "
            f"{sum(len(r) for r in self.results.values())} retained publications answered, "
            f"{len(problems)} problems"
        )
        return problems

    def _check_topic(self, sub_id: str, started: float, got: _Receipts, topic: str) -> list[str]:
        results = self.results.get(topic, [])
        before = [n for n, at in results if at < started]
        last = max(before, default=None)
        flagged = got.flagged.get(topic, [])
        where = f"retained: {sub_id} on {topic}"
        if len(flagged) > 1:
            return [f"{where}: {len(flagged)} flagged retained ({flagged})"]
        if not flagged:
            return [f"{where}: no retained publication (the last before it: {last})"] if last else []
        kept = flagged[0]
        if last is not None and kept < last:
            return [f"{where}: stale retained publication {kept} (the last before it: {last})"]
        plain = got.plain.get(topic, [])
        problems = []
        if plain != sorted(set(plain)) or (plain and plain[0] <= kept):
            problems.append(f"{where}: after retained {kept}, out of order: {plain[:10]}")
        lost = sorted({n for n, _ in results if n > kept} - set(plain))
        if lost:
            problems.append(f"{where}: lost {lost[:10]} after retained {kept}")
        return problems
