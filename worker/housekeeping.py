"""A worker's housekeeping, off the per-publication path and driven by time: the sweeps, the heartbeat,
and the disconnect of slow subscriptions.

- **Orphan turn sweep** (``sweep_turns.lua``, every ``sweep_interval_ms``; ``SATURATED_SWEEP_FACTOR``
  times less often for a worker keeping a saturated publisher): take the turns nobody holds (a worker
  died: its turns expire after ``lease_ms``), so a dead worker's publishers are served again within
  about ``lease_ms + sweep_interval_ms``.
- **Entry sweep** (``sweep_entries.lua``, every ``ENTRY_SWEEP_INTERVAL_MS``): refuse entries pending in
  no FIFO.
- **Subscription sweep** (``broker.clients.consumer.sweep_subscriptions``, every ``sweep_interval_ms``, at
  least ``SUBSCRIPTION_SWEEP_MS``): dead consumers' in-flight messages back, abandoned subscriptions removed.
- **Heartbeat** (at most once a second): ``{qm}:workers`` and ``{qm}:alive``; workers silent for
  ``GONE_AFTER_MS`` are forgotten; in the same round trip, the earliest delivery time waiting in
  ``{qm}:delayed`` (``worker.delays``). A busy worker's heartbeat rides with its commit (``ride``).
- **Disconnect**: a subscription a slow-subscriber condition matched is removed after the commit.
- **Topic statistics** (``broker.operations.topic_stats``, every ``topic_stats_flush_ms``, unless
  ``topic_stats_max_topics = 0``): the topic counts of the worker's apply step added to Redis.
- **Control requests** (``broker.operations.control``, every ``control.POLL_MS``, only with
  ``security = true``): subscribe and unsubscribe requests of subscriber users answered, one worker
  at a time.
- **Stream trim** (``trim.lua``, once the worker has committed ``trim_every_entries`` since its last
  trim and is about to wait, or ``BUSY_TRIM_FACTOR`` times that while busy, then riding with a
  commit): the acknowledged entries leave the publish stream, one worker at a time
  (``{qm}:trim_lock``, ``TRIM_LOCK_MS``); no command per publication.

``Housekeeping.due(now_ms)`` runs the sweeps whose time has come; the worker calls it once per
round, before its dequeue (``worker.loop``). ``ride`` adds the busy worker's trim and heartbeat to
its commit's round trip, and ``rode`` reads their replies: between two commits of a busy worker
there is no round trip of housekeeping in which the server would wait for it (measured: a round
trip of its own cost the server up to a commit's decide time idle, 2-worker drain).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import redis

from broker.clients.consumer import sweep_subscriptions
from broker.core import keys
from broker.core.errors import BrokerError
from broker.core.logs import publication_extra
from broker.operations.control import POLL_MS as CONTROL_POLL_MS
from broker.operations.control import ControlServer
from broker.operations.maintenance import trim_error, trimmed
from broker.operations.topic_stats import TopicCounter
from broker.topics.subscriptions import remove_subscription

if TYPE_CHECKING:
    from broker.core.config import Settings
    from broker.core.scripts import Scripts
    from broker.operations.metrics import NullRecorder
    from broker.topics.routing import RoutingTable
    from worker.delays import Delays
    from worker.problems import Problems


class Worker(Protocol):
    """What housekeeping needs of its worker (``worker.loop.Worker``; named here, not imported,
    so that the two modules do not import each other)."""

    client: redis.Redis
    qm: str
    name: str
    settings: Settings
    scripts: Scripts
    metrics: NullRecorder
    table: RoutingTable
    delays: Delays
    turns: set[str]
    processed: int
    counts: dict[str, int]
    _last_read_id: str
    _started_ms: int

    problems: Problems


log = logging.getLogger("broker.worker")

#: Least time between two subscription sweeps (dead consumers, abandoned subscriptions), ms.
SUBSCRIPTION_SWEEP_MS = 1_000

#: Publishers looked at per orphan sweep (SSCAN COUNT).
SWEEP_COUNT = 100

#: A worker serving a saturated publisher alone sweeps for orphaned turns this many times less
#: often: the other workers take them (a turn it took would delay its publisher by a round).
SATURATED_SWEEP_FACTOR = 10

#: How often a worker looks for pending entries that are in no FIFO (``sweep_entries.lua``), ms.
ENTRY_SWEEP_INTERVAL_MS = 30_000

#: Pending entries looked at per orphan sweep call.
ENTRY_SWEEP_COUNT = 100

#: A worker whose heartbeat is older than this is removed from ``{qm}:workers`` and
#: ``{qm}:alive`` by the live workers (it was killed without a chance to deregister), ms.
GONE_AFTER_MS = 60_000

#: Least time between two heartbeats of a worker, ms.
HEARTBEAT_MS = 1_000

#: Commands a heartbeat sends (``Housekeeping._beat_in``).
HEARTBEAT_COMMANDS = 4

#: Least time between two trims of the publish stream by the workers of a queue manager (the PX of
#: ``{qm}:trim_lock``), and between two tries of a worker that found it taken, ms.
TRIM_LOCK_MS = 100

#: A busy worker trims after this many times ``trim_every_entries`` (an idle one after
#: ``trim_every_entries``): under load the trim's round trips (lock, group state, XTRIM) come
#: every few thousand publications, not every few hundred.
BUSY_TRIM_FACTOR = 16

#: Least time between two trims of an idle worker whose last trim stopped at a pending entry, ms:
#: a trim stops at the oldest pending entry, so one made while another worker still held entries
#: left the rest in the stream, and the few that worker committed after it may never add up to
#: ``trim_every_entries`` of its own: the idle worker trims again, once a second, until a trim
#: finds nothing pending (``Housekeeping.trim_incomplete``). A lone worker's trims find nothing
#: pending: it never does this.
SETTLE_TRIM_MS = 1_000


class Housekeeping:
    """The sweeps, heartbeat and disconnects of one worker (module text); holds the timers and cursors.

    Args:
        worker: the worker it keeps (its client, scripts, settings, name, turns, routing table, metrics).
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.turn_sweep_cursor = "0"
        self.next_turn_sweep_ms = 0
        self.next_entry_sweep_ms = 0
        self.entry_sweep_start = "-"
        self.next_subscription_sweep_ms = 0
        self.subscription_sweep_start = ""
        self.next_heartbeat_ms = 0
        self.next_control_ms = 0
        #: ``worker.processed`` at the worker's last trim, and when it may try again (lock taken)
        self.trimmed_at = 0
        self.next_trim_ms = 0
        #: the last trim found entries pending (it stopped at the oldest), and when to trim again idle
        self.trim_incomplete = False
        self.next_settle_trim_ms = 0
        #: the topic counts the apply step adds to (``worker.loop``); None when turned off
        self.topic_stats = (
            TopicCounter(worker.settings.topic_stats_max_topics)
            if worker.settings.topic_stats_max_topics
            else None
        )
        self.next_topic_stats_ms = 0
        #: answers control requests; None without security (subscribers write their subscriptions)
        self.control = (
            ControlServer(worker.client, worker.settings, worker.name) if worker.settings.security else None
        )

    def due(self, now_ms: int, saturated: bool, unless_full: Callable[[Callable[[], object]], None]) -> None:
        """Run the sweeps whose time has come (``now_ms``, ms since the epoch).

        Args:
            now_ms: the worker's clock, ms.
            saturated: the worker keeps a saturated publisher (its turn sweeps are rarer).
            unless_full: runs a sweep, noting (not raising) a full server's refusal.
        """
        settings = self.worker.settings
        # On a full server, a sweep that must write is refused (writing nothing): the round goes
        # on to the dequeue, which renews the turns this worker holds (their entries stay its own).
        if now_ms >= self.next_turn_sweep_ms:
            factor = SATURATED_SWEEP_FACTOR if saturated else 1
            self.next_turn_sweep_ms = now_ms + settings.sweep_interval_ms * factor
            unless_full(self.sweep_turns)
        if now_ms >= self.next_entry_sweep_ms:
            self.next_entry_sweep_ms = now_ms + ENTRY_SWEEP_INTERVAL_MS
            unless_full(lambda: self.sweep_entries(settings.lease_ms))
        if now_ms >= self.next_subscription_sweep_ms:
            self.next_subscription_sweep_ms = now_ms + max(settings.sweep_interval_ms, SUBSCRIPTION_SWEEP_MS)
            self.sweep_subscriptions()
        if self.topic_stats is not None and now_ms >= self.next_topic_stats_ms:
            self.next_topic_stats_ms = now_ms + settings.topic_stats_flush_ms
            unless_full(self.flush_topic_stats)
        if self.control is not None and now_ms >= self.next_control_ms:
            self.next_control_ms = now_ms + CONTROL_POLL_MS
            unless_full(lambda: self.serve_requests(now_ms))

    def before_wait(
        self, now_ms: int, active: int, unless_full: Callable[[Callable[[], object]], None]
    ) -> None:
        """A worker about to wait for work: the trim (``trim_if_due``) when its last dequeue
        saw no publisher waiting (``active``: 0), so that the trim costs no publication its time; and,
        at most every ``SETTLE_TRIM_MS``, another while its last trim stopped at a pending entry."""
        if not active:
            self.trim_if_due(now_ms, unless_full)
            if (
                self.trim_incomplete
                and self.worker.settings.trim_every_entries  # 0: the workers do not trim
                and now_ms >= max(self.next_settle_trim_ms, self.next_trim_ms)
            ):
                self._trying(now_ms)
                unless_full(self.trim_stream)

    def trim_if_due(self, now_ms: int, unless_full: Callable[[Callable[[], object]], None]) -> None:
        """Trim the publish stream (``trim_stream``) once the worker has committed ``trim_every_entries``
        since its last trim (``trim_due``): a worker about to wait (``worker.loop``: nothing to do, so
        the trim costs nothing). A busy worker's trim rides with a commit (``ride``, ``BUSY_TRIM_FACTOR``)."""
        if self.trim_due(now_ms, 1):
            self._trying(now_ms)
            unless_full(self.trim_stream)

    def trim_due(self, now_ms: int, factor: int) -> bool:
        """Whether the worker has committed ``factor`` x ``trim_every_entries`` since its last trim
        (0: the workers do not trim) and may try (``TRIM_LOCK_MS`` after its last try)."""
        every = self.worker.settings.trim_every_entries * factor
        return (
            bool(every) and self.worker.processed - self.trimmed_at >= every and now_ms >= self.next_trim_ms
        )

    def _trying(self, now_ms: int) -> None:
        self.next_trim_ms = now_ms + TRIM_LOCK_MS
        self.next_settle_trim_ms = now_ms + SETTLE_TRIM_MS

    def trim_stream(self) -> int | None:
        """Remove the acknowledged entries from the publish stream, unless another worker holds
        ``{qm}:trim_lock`` (then None: this worker tries again after ``TRIM_LOCK_MS``): the lock and
        the trim are one call of ``trim.lua``, which runs on a full server too (it frees memory).

        Returns:
            How many entries were removed (0 after a failure, logged at WARNING: a foreign key),
            or None when another worker trims.
        """
        worker = self.worker
        try:
            reply = worker.scripts.trim(worker.name, TRIM_LOCK_MS)
        except (BrokerError, redis.ResponseError) as exc:
            reply = exc
        return self._trimmed(reply)

    def _trimmed(self, reply: Any) -> int | None:
        """Note ``trim.lua``'s reply, or the error it answered (logged at WARNING: counted as a trim)."""
        worker = self.worker
        if isinstance(reply, Exception):
            self.trimmed_at = worker.processed
            log.warning("worker %s: trimming the publish stream: %s", worker.name, trim_error(reply))
            return 0
        removed, pending = trimmed(reply)
        if removed < 0:
            return None
        self.trimmed_at = worker.processed
        # entries still pending stopped it: trim again once idle (SETTLE_TRIM_MS)
        self.trim_incomplete = pending > 0
        return removed

    def ride(self, pipe: Any, now_ms: int) -> tuple[bool, bool]:
        """Add to ``pipe`` (a busy worker's commit round trip, not yet sent) the trim when it is due
        (``BUSY_TRIM_FACTOR``) and the heartbeat when it is due; changes nothing else (the round
        trip may be sent twice: ``worker.loop``).

        Returns:
            ``(trim, heartbeat)``: what was added, for ``rode``.
        """
        trim = self.trim_due(now_ms, BUSY_TRIM_FACTOR)
        if trim:
            self.worker.scripts.trim(self.worker.name, TRIM_LOCK_MS, pipe=pipe)
        beat = now_ms >= self.next_heartbeat_ms
        if beat:
            self._beat_in(pipe, now_ms)
        return trim, beat

    def rode(self, riders: tuple[bool, bool], replies: Iterator[Any], now_ms: int) -> None:
        """Read the replies of what ``ride`` added (``riders``) from ``replies``, in order. A heartbeat
        refused (but by a full server) is sent again on its own by the next ``heartbeat``, which
        raises what it answers."""
        trim, beat = riders
        if trim:
            self._trying(now_ms)
            reply = next(replies)
            if isinstance(reply, redis.exceptions.NoScriptError):  # its script cache was flushed
                self.worker.scripts.load()
            else:
                self._trimmed(reply)
        if beat:
            self.next_heartbeat_ms = now_ms + HEARTBEAT_MS
            if not self._heard([next(replies) for _ in range(HEARTBEAT_COMMANDS)], strict=False):
                self.next_heartbeat_ms = 0

    def serve_requests(self, now_ms: int) -> int:
        """Answer the waiting control requests (``broker.operations.control``); returns how many.
        A refusal by the server (a foreign key, an ACL) is logged at WARNING, never raised."""
        if self.control is None:
            return 0
        self.control.client = self.worker.client
        try:
            return self.control.poll(now_ms)
        except (BrokerError, redis.ResponseError) as exc:
            if isinstance(exc, redis.exceptions.OutOfMemoryError):
                raise
            log.warning("worker %s: control requests: %s", self.worker.name, exc)
            return 0

    def flush_topic_stats(self) -> int:
        """Add the topic counts to Redis (``TopicCounter.flush``); returns the publications flushed.

        Raises:
            redis.RedisError: as redis-py raises it (the round reports it; the counts sent are dropped).
        """
        if self.topic_stats is None:
            return 0
        return self.topic_stats.flush(self.worker.client, self.worker.qm)

    def sweep_turns(self) -> list[str]:
        """Take orphaned turns (and find forgotten ones of the worker's); returns the publishers taken."""
        worker = self.worker
        self.turn_sweep_cursor, taken = worker.scripts.sweep_turns(
            worker.name, worker.settings.lease_ms, self.turn_sweep_cursor, SWEEP_COUNT
        )
        worker.turns.update(taken)
        if taken:
            worker.metrics.turns(len(worker.turns), taken_over=len(taken))
        return taken

    def sweep_entries(self, min_idle_ms: int) -> list[str]:
        """Refuse pending entries that are in no publisher's FIFO (an operator deleted it by hand).

        Looks at up to ``ENTRY_SWEEP_COUNT`` pending entries per call, going on
        from where the last call stopped.

        Args:
            min_idle_ms: only entries pending at least this long are looked at, ms.

        Returns:
            The entry ids refused (dead-lettered with the reason).

        Raises:
            redis.RedisError: as redis-py raises it.
        """
        worker = self.worker
        self.entry_sweep_start, refused = worker.scripts.sweep_entries(
            min_idle_ms, self.entry_sweep_start, ENTRY_SWEEP_COUNT
        )
        if not self.entry_sweep_start:
            self.entry_sweep_start = "-"
        for entry_id in refused:
            log.error(
                "worker %s: entry %s was pending in no publisher's FIFO; dead-lettered",
                worker.name,
                entry_id,
                extra=publication_extra(entry_id),
            )
        return refused

    def sweep_subscriptions(self) -> list[str]:
        """Give back dead consumers' in-flight messages and remove abandoned non-durable subscriptions.

        Looks at up to ``broker.clients.consumer.SWEEP_SUBSCRIPTIONS`` subscriptions per call,
        going on from where the last call stopped. A foreign key in one subscription is
        logged at WARNING (the sweep starts over next time), never raised.

        Returns:
            The subscription ids removed.
        """
        worker = self.worker
        try:
            self.subscription_sweep_start, removed = sweep_subscriptions(
                worker.client,
                worker.qm,
                worker.settings,
                self.subscription_sweep_start,
                records=worker.table.subscriptions.values(),
            )
        except BrokerError as exc:  # a foreign key in one subscription must not stop the worker
            log.warning("worker %s: subscription sweep: %s", worker.name, exc)
            self.subscription_sweep_start = ""
            return []
        return removed

    def heartbeat(self, now_ms: int) -> None:
        """Record the worker in ``{qm}:workers`` and ``{qm}:alive`` (at most every ``HEARTBEAT_MS``),
        forget workers silent for ``GONE_AFTER_MS``, and read the earliest delivery time waiting in
        ``{qm}:delayed`` (``worker.delays``: a worker restarted, or standing by for one that died).

        Raises:
            redis.RedisError: any error but a full server's (reported, not raised: the work goes on).
        """
        if now_ms < self.next_heartbeat_ms:
            return
        self.next_heartbeat_ms = now_ms + HEARTBEAT_MS
        pipe = self.worker.client.pipeline(transaction=False)
        self._beat_in(pipe, now_ms)
        self._heard(pipe.execute(raise_on_error=False), strict=True)

    def _beat_in(self, pipe: Any, now_ms: int) -> None:
        """The heartbeat's ``HEARTBEAT_COMMANDS`` commands, added to ``pipe``."""
        worker = self.worker
        beat: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_ms": worker._started_ms,
            "heartbeat_ms": now_ms,
            "processed": worker.processed,
            "turns": len(worker.turns),
            # the group is created again after the newest of these when it is lost (ensure_group)
            "last_read_id": worker._last_read_id,
        }
        alive = keys.alive(worker.qm)
        pipe.hset(keys.workers(worker.qm), worker.name, json.dumps(beat))
        pipe.zadd(alive, {worker.name: now_ms})
        # the earliest delivery time (worker.delays)
        pipe.zrange(keys.delayed(worker.qm), 0, 0, withscores=True)
        pipe.zrangebyscore(alive, "-inf", now_ms - GONE_AFTER_MS, start=0, num=100)

    def _heard(self, replies: list[Any], strict: bool) -> bool:
        """Read the replies to ``_beat_in``'s commands: the earliest delivery time, the workers gone.

        Returns:
            False when a command was refused (not by a full server: that is reported) and not
            ``strict``.

        Raises:
            redis.ResponseError: that refusal, when ``strict``.
        """
        worker = self.worker
        due = replies[2]
        if not isinstance(due, Exception):  # a foreign key: broker status names it
            worker.delays.heard(int(due[0][1]) if due else None)
        for reply in replies[:2] + replies[3:]:
            if isinstance(reply, redis.exceptions.OutOfMemoryError):
                # a full server: the heartbeat waits (the work goes on; others may count this
                # worker silent meanwhile), the round is not failed for it
                worker.problems.report(reply)
            elif isinstance(reply, Exception):
                if strict:
                    raise reply
                return False
        gone = replies[-1]
        if gone:  # workers killed without deregistering: forget them
            alive = keys.alive(worker.qm)
            pipe = worker.client.pipeline(transaction=False)
            pipe.hdel(keys.workers(worker.qm), *gone)
            pipe.zrem(alive, *gone)
            pipe.execute()
        return True

    def disconnect(self, sub_id: str, max_messages: int) -> bool:
        """Remove a subscription a slow-subscriber condition matched, if it still holds ``max_messages``.

        Logged at WARNING with what was lost. Never raises: the units of work are
        committed already, and a failure here is retried by the next publication
        the condition matches.

        Returns:
            True when it was removed.
        """
        worker = self.worker
        record = worker.table.subscriptions.get(sub_id)
        shown = record.shown_filter if record is not None else "?"
        kind = "durable" if record is not None and record.durable else "non-durable"
        try:
            removal = remove_subscription(worker.client, worker.qm, sub_id, min_depth=max_messages)
        except Exception as exc:  # a foreign key, a lost connection: never stop the worker for this
            log.warning("worker %s: could not disconnect slow subscription %s: %s", worker.name, sub_id, exc)
            return False
        if removal:
            worker.counts["disconnected"] = worker.counts.get("disconnected", 0) + 1
            worker.metrics.disconnected()
            log.warning(
                "worker %s: slow subscriber: %s subscription %s (filter %r) removed by its slow-subscriber "
                "condition (%d messages or more waiting); %d messages lost",
                worker.name,
                kind,
                sub_id,
                shown,
                max_messages,
                removal.messages,
            )
        return removal.removed
