"""Topic statistics: per topic string, publications, copies delivered, the last publication's time
and the subscriptions it reaches (IBM MQ ``DISPLAY TPSTATUS``: ``TYPE(TOPIC)``'s SUBCOUNT, and
``TYPE(PUB)``'s NUMPUBS and LPUBDATE/LPUBTIME, which MQ keeps per publisher, added up per topic
string here; SwiftMQ's usage counters). MQ's PUBCOUNT is the applications publishing on the topic
now: ``broker topic status`` shows the publishers among the newest stream entries instead
(``broker.operations.status.topic_status``).

**Counted in the worker, flushed on a timer.** The worker's apply step (``worker.loop``) hands each
committed batch to its ``TopicCounter``: a dict update per delivered publication, no Redis call.
Its housekeeping (``worker.housekeeping``) flushes the counts every ``topic_stats_flush_ms`` (1 s by
default) in calls of ``topic_stats.lua`` off the hot path (``FLUSH_CHUNK`` topics a call, one
command to build: a pipeline of three commands per topic kept a worker from its publications for
about 5 ms per flush with a hundred topics): it admits the topics Redis does not
know yet within the bound, then ``HINCRBY`` of ``{qm}:topic_stats:publications`` and ``:copies``
and ``ZADD GT`` of ``:last`` (``broker.core.keys``); a warm stop flushes too. These are statistics, not guarantees: a worker
killed between two flushes loses the counts of at most one interval, and a failed flush (a lost
connection) drops what it was sending rather than counting it twice.

**Bounded.** A worker keeps at most ``topic_stats_max_topics`` topic strings in memory between two
flushes, and Redis keeps at most that many (checked at each flush; two workers admitting new
topics at the same moment may pass it by what they admit in that flush). Every publication on a
topic past the bound is counted under the ``""`` field (``OTHER``, shown as "(other topics)":
no topic string is empty), so a publisher cycling random topic strings grows neither. Setting
``topic_stats_max_topics = 0`` turns the statistics off: the workers do no work for them at all.

**The subscription count** is not stored: it is read when asked, from the routing table (the
subscriptions a publication on the topic reaches, once each, as the workers resolve it), so it
follows subscribe and unsubscribe at once.

Publications counted are those delivered (to any number of subscriptions, zero included);
expired, refused and duplicate ones are not (``broker_publications_total`` counts those by outcome).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import keys, wire
from broker.core.config import Settings
from broker.core.errors import ForeignKey, script_error, translate_errors
from broker.core.scripts import register
from broker.core.unit_of_work import Outcome, UnitOfWork
from broker.topics.routing import RoutingTable

log = logging.getLogger("broker.worker")

#: The field that counts every topic past ``topic_stats_max_topics`` (no topic string is empty).
OTHER = ""

#: How ``OTHER`` is shown.
OTHER_SHOWN = "(other topics)"

#: Most topics per ``topic_stats.lua`` call: a flush of more is several calls, so that none holds
#: the server long (about 4 commands per topic; 1,000 topics in one call held it about 10 ms).
FLUSH_CHUNK = 200

_EXPECTED = (
    ("hash", keys.topic_publications),
    ("hash", keys.topic_copies),
    ("zset", keys.topic_last_publication),
)


class TopicCounter:
    """One worker's topic counts between two flushes (module text); bounded by ``max_topics``.

    Args:
        max_topics: most topic strings counted on their own (in memory and in Redis); the others
            are counted under ``OTHER``. At least 1.
    """

    def __init__(self, max_topics: int) -> None:
        self.max_topics = max_topics
        #: topic string -> [publications, copies, last publication ms]
        self.topics: dict[str, list[int]] = {}
        self.other = [0, 0, 0]
        self._problem = ""
        self._registered: tuple[redis.Redis, Any] | None = None

    def note(self, decoded: Iterable[tuple[UnitOfWork, Outcome, int, bool]], now_ms: int) -> None:
        """Count a committed batch (``decode_outcomes``): each delivered publication and its copies.

        Args:
            decoded: ``[(unit, outcome, subscriptions delivered to, released)]``.
            now_ms: when the batch was committed, ms since the epoch.
        """
        topics, most, delivered = self.topics, self.max_topics, Outcome.DELIVERED
        for unit, outcome, copies, _ in decoded:
            if outcome is not delivered:
                continue
            row = topics.get(unit.topic)
            if row is None:
                row = self.other if len(topics) >= most else topics.setdefault(unit.topic, [0, 0, 0])
            row[0] += 1
            row[1] += copies
            row[2] = now_ms

    def __bool__(self) -> bool:
        return bool(self.topics) or self.other[0] > 0

    def flush(self, client: redis.Redis, qm: str) -> int:
        """Add the counts to Redis and start again from zero; returns the publications flushed.

        Topics Redis does not know yet are admitted while it holds fewer than ``max_topics``; the
        others go to ``OTHER``. A foreign key (another type at a statistics key) is logged at
        WARNING, once until it changes, and the counts are kept for the next flush (bounded).

        Raises:
            redis.RedisError: a lost connection (the counts being sent are dropped, not sent twice).
        """
        if not self:
            return 0
        topics, other = self.topics, self.other
        self.topics, self.other = {}, [0, 0, 0]
        rows = [(name.encode("utf-8", "surrogateescape"), p, c, t) for name, (p, c, t) in topics.items()]
        if other[0]:
            rows.append((b"", other[0], other[1], other[2]))
        stat_keys = [key(qm) for _, key in _EXPECTED]
        flushed = 0
        for start in range(0, len(rows), FLUSH_CHUNK):
            args: list[bytes | int] = [self.max_topics]
            for row in rows[start : start + FLUSH_CHUNK]:
                args += row
            try:
                done, refused, first = self._script(client)(keys=stat_keys, args=args)
            except redis.ResponseError as exc:
                error = script_error(exc, "topic statistics")
                if not isinstance(error, ForeignKey):
                    raise error from exc
                self._keep(rows[start:])  # kept for the next flush (bounded: the counter's own bound)
                if str(error) != self._problem:
                    log.warning("topic statistics not flushed: %s", error)
                    self._problem = str(error)
                return flushed
            flushed += int(done)
            if refused and wire.text(first) != self._problem:  # a field that is not an integer
                self._problem = wire.text(first)
                log.warning("topic statistics: %d of the flush's writes refused: %s", refused, self._problem)
            elif not refused:
                self._problem = ""
        return flushed

    def _script(self, client: redis.Redis) -> Any:
        """``topic_stats.lua`` registered on ``client`` (once per client)."""
        if self._registered is None or self._registered[0] is not client:
            self._registered = (client, register(client, "topic_stats"))
        return self._registered[1]

    def _keep(self, rows: list[tuple[bytes, int, int, int]]) -> None:
        """Counts a flush could not send (a foreign key) added back, within the bound."""
        for field, publications, copies, last_ms in rows:
            name = field.decode("utf-8", "surrogateescape")
            row = self.other if not name else self.topics.get(name)
            if row is None:
                row = (
                    self.other
                    if len(self.topics) >= self.max_topics
                    else self.topics.setdefault(name, [0, 0, 0])
                )
            row[0] += publications
            row[1] += copies
            row[2] = max(row[2], last_ms)


@dataclass(frozen=True)
class TopicStatistics:
    """One topic string's statistics (IBM MQ ``DISPLAY TPSTATUS``).

    Attributes:
        topic: the topic string; ``OTHER`` ("") for every topic past the bound.
        publications: publications delivered on it (MQ's NUMPUBS, of every publisher), as flushed by the workers.
        copies: copies of them put on subscriber queues.
        last_publication_ms: when the last one was delivered, ms since the epoch (MQ's LPUBDATE and
            LPUBTIME), or None.
        subscriptions: the subscriptions a publication on it reaches now (SUBCOUNT); None for ``OTHER``.
    """

    topic: str
    publications: int
    copies: int
    last_publication_ms: int | None
    subscriptions: int | None

    @property
    def shown(self) -> str:
        """The topic string, or "(other topics)"."""
        return self.topic if self.topic != OTHER else OTHER_SHOWN


def read_count(raw: bytes | float | None) -> int:
    """A count read back; 0 for one that is not an integer (written by hand: shown, never raised)."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _statistics(
    client: redis.Redis, qm: str, topics: list[str], table: RoutingTable
) -> list[TopicStatistics]:
    fields = [t.encode("utf-8", "surrogateescape") for t in topics]
    if not fields:
        return []
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.topic_publications(qm), fields)
    pipe.hmget(keys.topic_copies(qm), fields)
    pipe.zmscore(keys.topic_last_publication(qm), fields)  # type: ignore[arg-type]
    publications, copies, last = pipe.execute()
    return [
        TopicStatistics(
            topic,
            read_count(publications[i]),
            read_count(copies[i]),
            None if last[i] is None else int(last[i]),
            None if topic == OTHER else len(table.resolve(topic).sub_ids),
        )
        for i, topic in enumerate(topics)
    ]


def routing_table(client: redis.Redis, settings: Settings) -> RoutingTable:
    table = RoutingTable(settings.qm, settings.default_maxdepth)
    table.load(client)
    return table


@translate_errors
def topic_statistics(client: redis.Redis, settings: Settings, topic: str) -> TopicStatistics:
    """``topic``'s statistics: publications, copies, last publication (ms) and subscriptions reached.

    Counts are as the workers last flushed them (every ``topic_stats_flush_ms``). A topic past the
    bound reads 0 publications: it is counted under ``OTHER``.

    Raises:
        ForeignKey: a statistics key or a record hash holds another Redis type.
        ConnectionLost: Redis cannot be reached.
    """
    return _statistics(client, settings.qm, [topic], routing_table(client, settings))[0]


@translate_errors
def top_topics(client: redis.Redis, settings: Settings, count: int) -> list[TopicStatistics]:
    """The ``count`` topic strings with the most publications, most first (ties by topic string),
    then ``OTHER`` when anything was counted there.

    Reads the whole publications hash: at most ``topic_stats_max_topics`` + 1 fields.

    Raises:
        ForeignKey: a statistics key or a record hash holds another Redis type.
        ConnectionLost: Redis cannot be reached.
    """
    counts: dict[bytes, bytes] = client.hgetall(keys.topic_publications(settings.qm))  # type: ignore[assignment]
    ranked = sorted(
        ((read_count(n), wire.exact_text(t)) for t, n in counts.items() if t != b""),
        key=lambda p: (-p[0], p[1]),
    )
    wanted = [topic for _, topic in ranked[:count]]
    if b"" in counts:
        wanted.append(OTHER)
    return _statistics(client, settings.qm, wanted, routing_table(client, settings))
