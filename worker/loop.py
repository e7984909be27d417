"""One worker: dequeue -> decide -> commit -> apply, in a loop (``Worker._round`` reads in that order).

Around it: ``worker.housekeeping`` (sweeps on their timers, the heartbeat, disconnects),
``worker.waiting`` (how an idle worker waits: one on the stream, the others woken),
``worker.suspects`` (delivery counting: a poison entry handled alone).

Seed 004 (IPCOM000031305D), on Redis:

1. **Dequeue** (``FCALL broker_dequeue``, ``lua/library/dequeue.lua``, the queue mutex): one
   atomic call reads up to ``batch_size`` entries, appends each entry id to its publisher's FIFO
   in stream order, takes the turn of every publisher nobody holds the turn of, and returns the
   FIFO heads of every publisher whose turn this worker holds, together with the index version.
2. **Turn**: a worker only ever handles entries at the head of a FIFO whose
   turn it holds. Entries it dequeued for a publisher another worker holds are
   left to that worker (handed over, never waited for), which claims them from
   the stream (XCLAIM) when they reach the head. No worker blocks while another
   publisher has work. While a backlog is drained, a turn follows its entries instead: the
   holder leaves it to the live worker that read the next heads, and a worker that read only
   entries of turns others hold keeps them and reads nothing more until their turns come
   (``FOLLOW_POLLS``), rather than reading on and having everything it read taken over again.
3. **Decide** (``worker.decide``, pure: no Redis): the routing table (exact hash +
   wildcard trie + links) is brought to the version the dequeue saw whenever it is
   newer: the logged subscription changes alone, or a whole reload for any other
   change (``RoutingTable.refresh``); each head becomes a unit of work (deliver to
   which queues, expire, refuse with the reason, skip).
4. **Unit of work** (``FCALL broker_commit``, ``lua/library/commit.lua``: one call per batch,
   the next dequeue in the same round trip): fenced on the turn and the FIFO head; LPUSH to
   every queue, dedup record, XACK, reply, pop the head, give up the turn when the FIFO is empty,
   all or nothing; with flow control on, the publication's flow-control delay (its slowest
   subscriber's); a slow-subscriber condition withholds it from subscriber queues too deep.
5. **Disconnect** (only when a slow-subscriber condition says so): the subscriptions it matched
   are removed after the commit (``remove_subscription.lua``, only if still that deep), each
   logged at WARNING; should the worker die first, the next matching publication asks again.

An idle worker waits for work as ``worker.waiting`` says (one on the publish stream, the others for a
wake-up), and a round whose commit ends every turn it held sends no dequeue with it: at low rates a
publication costs one dequeue and one commit. The sweeps, the heartbeat and the disconnects run on
their timers in ``worker.housekeeping``.

A worker never dies on one message: an entry that cannot be parsed, has an
invalid topic or is over a limit against abuse (``max_body_bytes``,
``max_properties_bytes``, ``max_topic_bytes``, ``max_topic_levels``) is
dead-lettered (``{qm}:dlq``) with the reason, in its place in the publisher's order.

An entry its workers keep dying on is dead-lettered after ``max_deliveries`` deliveries,
and only that entry: a FIFO head taken over from a worker that may have died counts a
delivery, a head delivered ``SUSPECT_DELIVERIES`` times is a suspect, and a round holding
one handles exactly one entry alone (the suspect, then the entries behind it that the dead
worker's batch may have held), recorded in ``{qm}:alone`` so that a death in that round is
charged to it alone (``worker.suspects``). A worker that only waited (a foreign
queue-manager-wide key, a lost connection) and takes its own entries back counts nothing.

Nor on a full server (``maxmemory`` reached): a refused script writes nothing
(``broker/lua/lib.lua``), so the worker logs it once, pauses ``RETRY_PAUSE_MS``
and sends the same units of work again, keeping the entries it read (a retry is
not counted as a new delivery), until memory is freed.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from broker.core import clock, keys
from broker.core.config import Settings
from broker.core.connection import block_slice_ms, wait_for_server
from broker.core.errors import (
    BrokerError,
    ConnectionLost,
    ForeignKey,
    ServerError,
    ServerFull,
)
from broker.core.library import missing
from broker.core.schemes import record_manager
from broker.core.scripts import (
    Dequeued,
    Refusals,
    Scripts,
    checked,
    flow_control_arg,
    parse_dequeue,
    parse_take_over,
)
from broker.core.stream import ensure_group
from broker.core.unit_of_work import (
    CommitBatch,
    Outcome,
    decode_disconnects,
    decode_outcomes,
)
from broker.core.wire import publisher_fifo
from broker.operations.metrics import recorder
from broker.topics.declared import seed_declared
from broker.topics.routing import RoutingTable
from worker.decide import Decider, log_refused
from worker.delays import Delays
from worker.housekeeping import Housekeeping
from worker.problems import Problems, out_of_memory
from worker.suspects import Suspects, record_alone
from worker.turns import MIN_SHARE, missing_heads, ready_heads, turns_to_ask, turns_to_give_up
from worker.turns import next_read as plan_next_read
from worker.waiting import Waiting

log = logging.getLogger("broker.worker")

#: Named points where tests and the chaos harness inject faults:
#: after_dequeue: entries read and filed in FIFOs, nothing handled yet;
#: waiting_for_turn: some entries read are for publishers another worker holds;
#: holding_turn: this worker holds turns and is about to build units of work;
#: before_commit: units of work built, not sent; after_commit: sent and applied
#: (the release is part of the unit of work, so there is no later point).
CRASH_POINTS = ("after_dequeue", "waiting_for_turn", "holding_turn", "before_commit", "after_commit")


#: A round after a wait for work at least this long is at a low rate: when it read one entry at
#: most, no dequeue rides with its commit (it would most likely find nothing). After a shorter wait
#: (entries keep coming) the dequeue rides along, one round trip instead of a wait and a dequeue, ms.
QUIET_WAIT_MS = 2

#: How long a worker with nothing to do waits while others hold waiting publishers, and how often
#: it then sweeps for turns nobody holds, ms (p99 at 2,000/s: 23 ms with 20; 8 with 5).
BUSY_POLL_MS = 5

#: A worker whose dequeue read entries only of publishers another worker holds, while a backlog is
#: drained (``Dequeued.plenty``), keeps them and asks for their turns, reading nothing more, for up
#: to this many dequeues (``BUSY_POLL_MS`` apart, or woken) before it forgets them and reads on: the
#: holder leaves each turn to the reader of its next heads (``dequeue.lua``, ``left_to_reader``).
#: Reading on instead read 25-35% of a 2-worker drain's entries twice (forgotten, taken over again).
FOLLOW_POLLS = 10

#: Each outcome's name (``Outcome.value`` is a property call per access).
_OUTCOME_NAMES = {outcome: outcome.value for outcome in Outcome}

#: Pause before starting a round again after a Redis error, ms.
RETRY_PAUSE_MS = 500


Hook = Callable[[str], None]

#: How long a process (re)started by its pool waits for the server, ms: a child restarted
#: while its server (or the cluster node its URL names) is down waits instead of dying.
START_WAIT_MS = 60_000


class Worker:
    """A single worker of a queue manager.

    Args:
        client: a redis-py client with ``decode_responses=False``.
        settings: the broker settings.
        name: the consumer name and fencing token; default ``<host>-<pid>-<random>``.
        clock_ms: returns the time in ms since the epoch (injectable for tests).
        hook: called with a name from ``CRASH_POINTS`` at each crash point.
    """

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        name: str | None = None,
        clock_ms: Callable[[], int] | None = None,
        hook: Hook | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.qm = settings.qm
        self.name = name or keys.process_name()
        self.clock_ms = clock_ms or clock.now_ms
        self.hook = hook or (lambda point: None)
        self.scripts = Scripts(
            client,
            self.qm,
            Refusals(settings.reply_ttl_ms, settings.dead_letter_max_len, settings.max_body_bytes),
        )
        self.table = RoutingTable(
            self.qm,
            default_maxdepth=settings.default_maxdepth,
            max_selector_bytes=settings.max_selector_bytes,
        )
        self.turns: set[str] = set()
        self.stopping = False
        self.processed = 0
        self.counts: dict[str, int] = {}
        self._entries: dict[str, tuple[str, dict[bytes, bytes]]] = {}
        #: the suspects among the heads it holds, and its careful publishers (``worker.suspects``)
        self._suspects = Suspects()
        #: this worker's record in ``{qm}:alone`` may be there (removed with the next commit)
        self._alone_recorded = False
        self._stream = keys.publish_stream(self.qm)
        self._prefetched: Dequeued | None = None
        #: the last entry id this worker read from the publish stream itself ("" before any)
        self._last_read_id = ""
        #: the last round kept a saturated publisher alone (``_next_read``)
        self._saturated = False
        #: the sweeps, heartbeat and disconnects, on their timers (``worker.housekeeping``)
        self.housekeeping = Housekeeping(self)
        #: the earliest delivery time of the delayed publications it knows of (``worker.delays``)
        self.delays = Delays()
        #: one idle worker waits on the stream, the others on a wake-up (``worker.waiting``)
        self.waiting = Waiting(client, self.qm, self.name)
        #: the group's last-delivered id as last seen: an idle worker waits for entries after it
        self._wait_from = ""
        #: this round's commit ends every turn it holds: no dequeue rides with it (``_send``)
        self._no_prefetch = False
        #: this round's wake-up of another worker, naming publishers (``worker.waiting``); None: none
        self._wake: tuple[str, ...] | None = None
        #: heads taken over with the last commit, ``{entry_id: times delivered}`` (``_take_over``)
        self._taken: dict[str, int] = {}
        #: how long the last wait for work lasted, ms (0 after a round without a wait): a short one
        #: means entries keep coming; a worker starts as after a quiet while
        self._waited_ms = QUIET_WAIT_MS
        self._active = 0  # publishers with entries waiting, as the last dequeue saw them
        self._plenty = False  # a backlog, as the last dequeue saw it: turns follow their entries
        self._next_busy_sweep_ms = 0
        self._follows = 0  # dequeues left asking for the turns of the entries kept (FOLLOW_POLLS)
        #: why rounds fail, logged once per problem; whether the server is full (``worker.problems``)
        self.problems = Problems(self.name, RETRY_PAUSE_MS)
        self._started_ms = self.clock_ms()
        self._flow_control = flow_control_arg(settings)
        #: the pure step of the round: entries in, units of work out (``worker.decide``)
        self.decide = Decider(settings, self.table)
        #: Prometheus metrics (``broker.operations.metrics``): a no-op unless ``metrics_port`` is set
        self.metrics = recorder(settings)

    def _load(self) -> None:
        """Load the scripts and the function library ``broker`` (``Scripts.load``: the queue mutex, the
        unit of work, the consumers' functions). Raises ``redis.exceptions.NoPermissionError`` for a
        worker user made before protocol 6 (``broker acl add`` again; ``run`` logs it and retries)."""
        if self.scripts.load():
            log.info("loaded the broker function library (protocol %d)", keys.PROTOCOL_VERSION)

    def setup(self) -> None:
        """Record (or check) the queue manager's topic scheme, declare the configured topics,
        create the stream's consumer group if needed and load the routing table.

        Raises:
            ConfigError: the settings' topic scheme or subscriber selection differs from
                the queue manager's (``broker.core.schemes.record_manager``), or a declared topic is invalid.
        """
        record_manager(self.client, self.settings)
        if self.settings.topics:
            seed_declared(self.client, self.qm, self.settings.topics)
        ensure_group(self.client, self.qm)
        self._load()
        self.table.load(self.client)
        self.housekeeping.heartbeat(self.clock_ms())

    def run(self) -> None:
        """Loop until ``stopping`` is set, then give up held turns and deregister.

        A Redis error or a foreign key (a key of the wrong type where the broker
        keeps a queue-manager-wide key) never ends the loop: nothing is half-done
        (every step is one atomic script that checks before it writes), so the
        worker logs it, pauses ``RETRY_PAUSE_MS`` and starts the round again. On a
        full server (out of memory) it keeps what it read, so the retried units of
        work are the same and no entry counts as delivered again.
        """
        ready = False
        try:
            while not self.stopping:
                try:
                    if not ready:
                        self.setup()
                        ready = True
                    self.problems.round_starts()
                    self.problems.round_done(self.run_once(block=True))
                except (
                    redis.RedisError,
                    RedisClusterException,
                    ForeignKey,
                    ConnectionLost,
                    ServerError,
                ) as exc:
                    if self.stopping and isinstance(exc, (redis.ConnectionError, ConnectionLost)):
                        log.info("worker %s: the server went away while stopping", self.name)
                        break
                    self.problems.report(exc)
                    if not out_of_memory(exc):  # full: the same units again, keeping the entries read
                        self._forget_entries()
                        self._prefetched = None
                    time.sleep(RETRY_PAUSE_MS / 1000)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Give up every turn this worker holds and remove its heartbeat."""
        try:
            self.scripts.give_up(self.name, sorted(self.turns))
            self.waiting.release()
            self.metrics.stopped(len(self.turns))
            self.client.hdel(keys.workers(self.qm), self.name)
            self.client.zrem(keys.alive(self.qm), self.name)
            self.housekeeping.flush_topic_stats()
            self.client.hdel(keys.saturated(self.qm), self.name)
            if self._alone_recorded:
                self.client.hdel(keys.alone(self.qm), self.name)
        except (redis.RedisError, RedisClusterException, BrokerError) as exc:  # BrokerError: a script wrapper
            log.warning("worker %s: could not release turns on stop: %s", self.name, exc)
        self.turns.clear()

    def run_once(self, block: bool = False) -> int:
        """One round: dequeue, handle the heads of the publishers whose turn it holds, commit.

        When the consumer group is gone (NOGROUP: an operator deleted the publish stream or
        destroyed the group), the worker creates it again (``_regroup``) and does the round.

        Args:
            block: when there is nothing to do, wait up to ``block_ms`` for new entries.

        Returns:
            How many publications were committed (delivered, refused, ...).

        Raises:
            redis.RedisError: a connection or server error; nothing half-done is
                left, since every unit of work is one atomic script.
        """
        try:
            return self._round(block)
        except redis.ResponseError as exc:
            if not str(exc).startswith("NOGROUP"):
                raise
        self._regroup()
        return self._round(block)

    @property
    def server_full(self) -> bool:
        """The server was full (``maxmemory`` reached) in a round since the last one that committed."""
        return self.problems.server_full

    @property
    def following(self) -> bool:
        """Whether it holds no turn and keeps entries it read, asking for their turns (``FOLLOW_POLLS``)."""
        return self._follows > 0

    def _regroup(self) -> None:
        """Create the consumer group again after it was lost (``broker.core.stream.ensure_group``), and
        forget what was read from the old one (the FIFOs and turns stay: their entries are handled
        from them)."""
        self._entries.clear()
        self._taken.clear()
        self._follows = 0
        self._prefetched = None
        self.housekeeping.entry_sweep_start = "-"
        self._wait_from = ""
        start = ensure_group(self.client, self.qm, (self._last_read_id,))
        if start is None:
            log.info("worker %s: the consumer group was created again by another worker", self.name)
        else:
            log.warning(
                "worker %s: the consumer group %r on %s was gone (the stream deleted or the group "
                "destroyed); created it again, reading the entries after %s",
                self.name,
                keys.WORKER_GROUP,
                self._stream,
                "the start" if start == "0" else start,
            )

    def _round(self, block: bool) -> int:
        """``run_once`` without the recovery of a lost group: housekeeping due, then dequeue ->
        decide -> commit -> apply (``_work``), then wake another worker if work is left."""
        now = self.clock_ms()
        self.housekeeping.due(now, self._saturated, self._unless_full)
        dequeued = self._dequeue()
        times, handed_over = self._file(dequeued)
        wait_ms = self.delays.wait_ms(now, min(self.settings.block_ms, block_slice_ms(self.client)))
        if not dequeued.turns:
            return self._without_turns(dequeued, now, block, wait_ms)
        self.hook("holding_turn")
        give_up = self._turns_to_give_up(dequeued)
        next_read = self._next_read(dequeued, give_up)
        # A low rate (the last wait lasted QUIET_WAIT_MS or more, this dequeue read one entry at most,
        # each FIFO no longer than its heads): the
        # commit ends every turn it holds, so no dequeue rides with it (it would most likely find
        # nothing); the worker waits for the next entry instead. At higher rates the dequeue rides along.
        self._no_prefetch = (
            block
            and self._waited_ms >= QUIET_WAIT_MS
            and len(dequeued.entries) <= 1
            and next_read[1] is None
            and all(dequeued.backlog.get(p, 0) <= len(ids) for p, ids in dequeued.turns.items())
        )
        if (
            handed_over
            or give_up
            or (not self._no_prefetch and not self.stopping and self.waiting.holds(now))
        ):
            # work left for another worker (entries for turns it does not hold, turns it gave up),
            # or this waiter stays busy (its next dequeue rides with the commit): wake an idle one,
            # naming those publishers: its dequeue takes the turns nobody holds (a free turn is
            # otherwise found only by a sweep). The wake-up rides with the commit (``_send``).
            self._wake = (*give_up, *sorted(handed_over - set(give_up)))
        try:
            done = self._work(dequeued.turns, now, give_up, times, next_read)
        finally:
            self._no_prefetch = False
            self._wake = None
        self.housekeeping.heartbeat(now)
        busy = bool(self.turns) or self._prefetched is not None
        if block and not busy:
            self._idle(now, wait_ms)
        return done

    def _dequeue(self) -> Dequeued:
        """The queue mutex (``broker_dequeue``), or the dequeue that rode with the last commit; the
        routing table brought to the version it read."""
        settings = self.settings
        dequeued = self._prefetched
        self._prefetched = None
        if dequeued is not None:
            self._waited_ms = 0  # no wait between two rounds: entries keep coming
        else:
            # with the turns it holds, those another worker gave up and woke it for (worker.waiting)
            given_up = self.waiting.take_given_up()
            now = self.clock_ms()
            asked = self.turns.union(given_up)
            following = self.following
            if following:
                asked.update(publisher for publisher, _ in self._entries.values())
            dequeued = self.scripts.dequeue(
                self.name,
                0 if following else settings.batch_size,
                settings.lease_ms,
                settings.heads,
                sorted(asked),
                liveness_ms=keys.LIVENESS_MS,
                now_ms=now,
                release=self.delays.release(now),
                ingress=bool(self.table.ingress),
                min_share=MIN_SHARE,
                take_missing=not self._entries,
            )
            assert dequeued is not None
        self.delays.learned(dequeued)
        self.metrics.dequeued(len(dequeued.entries))
        self._active, self._plenty = dequeued.active, dequeued.plenty or self.following
        if dequeued.turns:
            self._follows = 0
        self.hook("after_dequeue")
        if dequeued.version != self.table.version:
            self.table.refresh(self.client)
        return dequeued

    def _file(self, dequeued: Dequeued) -> tuple[dict[str, int], set[str]]:
        """Keep the entries the dequeue read and took over, and note the turns it holds.

        Returns:
            ``({entry id: times delivered}`` of the heads it took over, counted as a delivery;
            the publishers it read entries of without holding their turn: another worker holds
            it, or nobody does (beyond this worker's fair share)``)``.
        """
        held = dequeued.turns
        handed_over: set[str] = set()
        for entry_id, fields in dequeued.entries:
            publisher = publisher_fifo(fields.get(b"publisher"))
            self._entries[entry_id] = (publisher, fields)
            if publisher not in held:
                handed_over.add(publisher)
        if dequeued.entries:
            self._last_read_id = dequeued.entries[-1][0]
        self._wait_from = dequeued.last_delivered_id or self._last_read_id or self._wait_from
        times: dict[str, int] = {}
        for entry_id, fields, delivered in dequeued.taken_over:
            self._entries[entry_id] = (publisher_fifo(fields.get(b"publisher")), fields)
            if delivered:
                times[entry_id] = delivered
        if handed_over:
            self.hook("waiting_for_turn")
        self.turns = set(held)
        self._saturated = False
        return times, handed_over

    def _without_turns(self, dequeued: Dequeued, now: int, block: bool, wait_ms: int) -> int:
        """A round that holds no turn: keep what was read for a while under a backlog (``FOLLOW_POLLS``),
        else forget it (its holders take it over), and wait."""
        self.housekeeping.heartbeat(now)
        if not self._follows and dequeued.plenty and dequeued.spare and dequeued.entries:
            # keep them: the next dequeue asks for their turns (FOLLOW_POLLS); not when the other workers
            # each keep a saturated publisher, whose turn is not left to a reader
            self._follows = FOLLOW_POLLS
            return 0
        if self._follows > 1:
            self._follows -= 1
            if block:  # not on the stream: a backlog is there, but not for this worker yet
                self.waiting.wait_wake(BUSY_POLL_MS)
            return 0
        self._forget_entries()
        if dequeued.active:
            # Others hold every waiting publisher: look for turns they gave up (at most every
            # BUSY_POLL_MS), and wait only briefly, so this worker starts as soon as one is given up.
            wait_ms = min(wait_ms, BUSY_POLL_MS)
            if not block or now >= self._next_busy_sweep_ms:
                self._next_busy_sweep_ms = now + BUSY_POLL_MS
                if self.housekeeping.sweep_turns():
                    return 0
        if block and not dequeued.entries and not dequeued.delayed_moves:  # moved: more may wait
            self._idle(now, wait_ms)
        return 0

    def _forget_entries(self) -> None:
        """Forget the entries read (a take-over reads them again, with their delivery counts)."""
        self._entries.clear()
        self._taken.clear()
        self._suspects.clear()
        self._follows = 0

    def _idle(self, now_ms: int, wait_ms: int) -> bool:
        """Wait up to ``wait_ms`` for work (``worker.waiting``): on the publish stream and the principals'
        ingress streams when this worker is the waiter, else for a wake-up. The next round dequeues,
        woken or not (a wait that timed out is followed by one dequeue: nothing waits on a lost wake-up).

        Returns:
            True when woken, False after ``wait_ms``.
        """
        self.housekeeping.before_wait(now_ms, self._active, self._unless_full)
        direct = self._waited_ms < QUIET_WAIT_MS  # a short last wait: on the stream directly
        woken = self.waiting.wait(now_ms, self._wait_from or "$", wait_ms, self.table.ingress, direct)
        # a wait that timed out lasted wait_ms (whatever the clock says: tests inject one)
        self._waited_ms = self.clock_ms() - now_ms if woken else max(wait_ms, QUIET_WAIT_MS)
        return woken

    def _unless_full(self, step: Callable[[], object]) -> None:
        """Run ``step``; a full server's refusal (nothing written) is noted, not raised."""
        try:
            step()
        except (redis.exceptions.OutOfMemoryError, ServerFull) as exc:  # ServerFull: a script wrapper
            self.problems.report(exc)

    def _turns_to_give_up(self, dequeued: Dequeued) -> tuple[str, ...]:
        """Publishers beyond this worker's fair share of the work (``worker.turns.turns_to_give_up``)."""
        return turns_to_give_up(dequeued, self._entries, self.settings.heads)

    def _next_read(self, dequeued: Dequeued, give_up: tuple[str, ...]) -> tuple[int, tuple[str, str] | None]:
        """What the next dequeue reads (``worker.turns.next_read``); notes a saturated publisher kept."""
        settings = self.settings
        count, ahead = plan_next_read(
            dequeued, give_up, settings.heads, settings.batch_size, self._last_read_id
        )
        self._saturated = ahead is not None
        return count, ahead

    def _work(
        self,
        heads: dict[str, list[str]],
        now_ms: int,
        give_up: tuple[str, ...] = (),
        times: dict[str, int] | None = None,
        next_read: tuple[int, tuple[str, str] | None] | None = None,
    ) -> int:
        """Handle the FIFO heads of the publishers whose turn this worker holds: take over, decide
        (``worker.decide``), commit (``_send``: one ``commit.lua`` call per batch), apply.

        Args:
            heads: ``{publisher: [entry ids]}``, in FIFO order.
            now_ms: the time, ms since the epoch.
            give_up: publishers whose turn to give up after this round.
            times: ``{entry_id: times delivered}`` of heads the dequeue took over already.
            next_read: ``(count, ahead)`` for the next dequeue (``_next_read``); default: read ``batch_size``.

        Returns:
            How many publications were committed (delivered, refused, ...).
        """
        started_ms = self.clock_ms() if self.metrics.enabled else 0
        if times:
            self.metrics.turns(len(self.turns), entries_taken_over=len(times))
        times = {**(times or {}), **self._taken}
        self._taken = {}
        ready, later, waiting = ready_heads(heads, self._entries, self._plenty)
        if waiting and (not ready or not waiting.isdisjoint(give_up)):
            # nothing else to commit, or a turn to give up after this round: fetch them now
            times.update(self._take_over(heads))
            ready, later = heads, ([], [])
        suspects = self._suspects
        if times:
            suspects.note(times)
        alone = suspects.choose(ready, self.settings.heads, self._entries) if suspects else None
        if alone is None:
            batches = self.decide.batches(ready, self._entries, times, now_ms)
        else:  # one entry alone (worker.suspects): every other turn held, not worked, not given up
            publisher, entry_id, delivered = alone
            self._alone_recorded = True  # removed by _send, also when the reply to this is lost
            record_alone(self.client, self.qm, self.name, entry_id)
            batches = self.decide.batches(
                {publisher: [entry_id]}, self._entries, {entry_id: delivered}, now_ms
            )
            give_up, later = (), ([], [])
        self.hook("before_commit")
        results = self._send(batches, heads, give_up, next_read or (self.settings.batch_size, None), later)
        self.hook("after_commit")
        applied = [(b, r) for b, r in zip(batches, results, strict=True) if not isinstance(r, Exception)]
        done = self._apply([b for b, _ in applied], [r for _, r in applied], give_up, started_ms)
        for reply in results:
            if isinstance(reply, Exception):  # a refused script wrote nothing: sent again next round
                checked(reply, "unit of work")  # raises ForeignKey, ServerFull or the reply
        return done

    def _take_over(self, heads: dict[str, list[str]]) -> dict[str, int]:
        """Fetch the heads this worker has not read itself (``take_over.lua``) in a round trip of their
        own; ``{entry_id: times delivered}`` for the counted ones (``worker.turns.missing_heads``)."""
        counted, uncounted = missing_heads(heads, self._entries)
        if not counted and not uncounted:
            return {}
        return self._taken_over(self.scripts.take_over(self.name, counted, uncounted), len(counted))

    def _taken_over(self, taken: list[tuple[str, dict[bytes, bytes], int]], counted: int) -> dict[str, int]:
        """Keep the entries taken over; ``{entry_id: times delivered}`` of the counted ones."""
        entries = self._entries
        times: dict[str, int] = {}
        for entry_id, fields, delivered in taken:
            entries[entry_id] = (publisher_fifo(fields.get(b"publisher")), fields)
            if delivered:
                times[entry_id] = delivered
        if counted:
            self.metrics.turns(len(self.turns), entries_taken_over=counted)
        return times

    def _send(
        self,
        batches: list[CommitBatch],
        heads: dict[str, list[str]],
        give_up: tuple[str, ...],
        next_read: tuple[int, tuple[str, str] | None],
        later: tuple[list[str], list[str]] = ([], []),
    ) -> list[Any]:
        """Send every batch (one ``commit.lua`` call each) and, in the same round trip: the take-over of
        the heads another worker read (``later``: counted, uncounted; see ``worker.turns.ready_heads``), the next dequeue
        (``next_read``: how many entries it reads, and which heads it takes over, see ``_next_read``),
        and this round's wake-up of another worker (``_wake``).

        Returns:
            One ``commit.lua`` reply per batch, or the error it answered (a full server); the
            prefetched dequeue is kept in ``_prefetched``, also when a commit failed (it read
            after the commits, which wrote nothing); the heads taken over in ``_taken``.
        """
        settings = self.settings
        journal = settings.journal_max_len if settings.journal else 0
        prefetch = not self.stopping and not self._no_prefetch
        recorded = self._alone_recorded
        wake = self._wake
        now = self.clock_ms()
        release = self.delays.release(now)
        counts: dict[str, Any] = {"take_over": 0, "wake": 0}

        def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for batch in batches:
                self.scripts.commit(
                    pipe,
                    self.name,
                    settings.lease_ms,
                    batch,
                    journal,
                    give_up,
                    self.table.version or b"",
                    self._flow_control,
                )
            if recorded:  # the entry handled alone is committed: this worker's death is no longer its
                pipe.hdel(keys.alone(self.qm), self.name)
            counts["riders"] = self.housekeeping.ride(pipe, now)  # the trim and heartbeat when due
            counts["take_over"] = self.scripts.take_over_in(pipe, self.name, *later) if later[0] else 0
            if prefetch:  # the next dequeue rides in the same round trip as this commit
                kept = turns_to_ask(heads, give_up, self._entries, self._plenty)
                # holding nothing but what these commits handle: the next heads other workers read
                # come back taken over with it (no take_over round trip, no round's wait)
                committed = {unit.entry_id for batch in batches for unit in batch.units}
                take_missing = not later[0] and not later[1] and self._entries.keys() <= committed
                self.scripts.dequeue(
                    self.name,
                    next_read[0],
                    settings.lease_ms,
                    settings.heads,
                    kept,
                    pipe=pipe,
                    liveness_ms=keys.LIVENESS_MS,
                    ahead=next_read[1],
                    now_ms=now,
                    release=release,
                    ingress=bool(self.table.ingress),
                    min_share=MIN_SHARE,
                    take_missing=take_missing,
                )
            counts["wake"] = self.waiting.hand_on_in(pipe, now, wake) if wake is not None else 0
            return pipe.execute(raise_on_error=False)

        results = send()
        if any(isinstance(r, redis.exceptions.NoScriptError) or missing(r) for r in results):
            # The server lost its script cache, or has no broker_commit / broker_dequeue (FUNCTION
            # FLUSH, or an older broker's library loaded meanwhile): load the scripts and the library
            # and send the same units and dequeue again (each unit is fenced: one that was applied is
            # refused the second time; a dequeue "Function not found" answered did nothing).
            self._load()
            results = send()
        replies = iter(results[len(batches) :])
        if recorded and not isinstance(next(replies), Exception):
            self._alone_recorded = False
        self.housekeeping.rode(counts["riders"], replies, now)
        taken = [next(replies) for _ in range(counts["take_over"])]
        if prefetch:
            dequeued = next(replies)
            if not isinstance(dequeued, Exception):  # else the next round dequeues afresh (and reports it)
                self._prefetched = parse_dequeue(dequeued)
        self.waiting.handed_on(replies)
        for i, reply in enumerate(taken):  # a refused take-over: those heads are taken over next round
            if not isinstance(reply, Exception):
                self._taken.update(self._taken_over(parse_take_over(reply), 0 if i else len(later[0])))
        return results[: len(batches)]

    def _apply(
        self,
        batches: list[CommitBatch],
        results: list[Any],
        give_up: tuple[str, ...] = (),
        started_ms: int = 0,
    ) -> int:
        """Record what ``commit.lua`` did: counts, turns given up or lost, metrics (``broker.operations.metrics``,
        from ``started_ms``, when the units were built); returns how many were committed."""
        entries = self._entries
        done = 0
        counts = self.counts
        refused, retry = Outcome.REFUSED, Outcome.RETRY
        disconnects: dict[str, int] = {}
        metrics = self.metrics
        committed_ms = self.clock_ms() if metrics.enabled else 0
        stats = self.housekeeping.topic_stats  # None when off: no work per publication
        stats_ms = self.clock_ms() if stats is not None else 0
        for batch, reply in zip(batches, results, strict=True):
            if self.decide.slow:
                disconnects.update(decode_disconnects(batch, reply))
            decoded = decode_outcomes(batch, reply)
            if stats is not None:
                stats.note(decoded, stats_ms)
            if metrics.enabled:
                metrics.committed(decoded, give_up, started_ms, committed_ms)
            for unit, outcome, _subscriptions, released in decoded:
                if outcome is retry:  # a retained publication: its entry and turn kept, decided again
                    continue
                entries.pop(unit.entry_id, None)
                if outcome is Outcome.FENCED:  # the turn is no longer ours
                    self.turns.discard(unit.publisher)
                    continue
                done += 1
                name = _OUTCOME_NAMES[outcome]
                counts[name] = counts.get(name, 0) + 1
                if outcome is refused:
                    log_refused(unit)
                if released:
                    self.turns.discard(unit.publisher)
        self.processed += done
        suspects = self._suspects
        if suspects.counts:
            for batch in batches:
                suspects.handled([unit.entry_id for unit in batch.units])
        if self._prefetched is not None:
            self.turns = set(self._prefetched.turns)
        metrics.turns(len(self.turns))
        if len(entries) > 4 * self.settings.batch_size:
            self._entries = {k: v for k, v in entries.items() if v[0] in self.turns}
            suspects.counts = {k: v for k, v in suspects.counts.items() if k in self._entries}
        for sub_id, max_messages in disconnects.items():
            self._disconnect(sub_id, max_messages)
        return done

    def _disconnect(self, sub_id: str, max_messages: int) -> bool:
        """Remove a subscription a slow-subscriber condition matched (``Housekeeping.disconnect``)."""
        return self.housekeeping.disconnect(sub_id, max_messages)


def main(settings: Settings, hook: Hook | None = None) -> None:
    """Entry point of one worker process (the pool calls it): run until SIGTERM.

    Args:
        settings: the broker settings.
        hook: crash-point hook (the chaos harness).
    """
    import signal

    client = wait_for_server(settings.redis_url, START_WAIT_MS, tls=settings.tls)  # an outage: it waits
    worker = Worker(client, settings, hook=hook)

    def _stop(signum: int, frame: object) -> None:
        worker.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()  # what the imports made lives as long as the process: no full collection walks it
    worker.run()
