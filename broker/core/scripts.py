"""The broker's Lua scripts, loaded from ``broker/lua/*.lua``, one typed wrapper each.

Every script is registered here and only here: ``register(client, name)`` (``SCRIPTS``
names them), once per client, with redis-py's ``register_script``, whose ``Script``
object reloads the script on NOSCRIPT. The removal, replay, repair, channel and
change-log modules get their scripts from ``register`` and wrap them themselves. The
consumer operations, and the workers' unit of work (``broker_commit``, ``commit``) and queue mutex
(``broker_dequeue``, ``dequeue``), are not scripts but functions of the library ``broker``
(``broker.core.library``, ``lua/library/``).
Inside a pipeline, though, redis-py's ``Script`` sends a ``SCRIPT EXISTS`` round trip before
every ``execute``; the hot path (commit + the next dequeue, pipelined) therefore
sends plain ``FCALL`` and ``EVALSHA`` and, on NOSCRIPT (a ``SCRIPT FLUSH`` or a restarted
server) or "Function not found" (``FUNCTION FLUSH``, or an older broker's library loaded
meanwhile), calls ``load`` and sends the pipeline again, which is safe because
every unit of work is fenced. The wrappers take and return plain Python
values; the key layout they assume is documented in ``broker.core.keys``.

Errors: a wrapper raises ``ForeignKey`` when its script stopped on a foreign
queue-manager-wide key (the script's error reply ``BROKER foreign key: <key> holds a
<type>, not a <type>``, before any write) and ``ServerFull`` when the server is out of
memory (its first write refused: nothing written). A pipelined call (``pipe``) leaves its
reply, error or not, in the pipeline's results: pass it to ``checked``, which raises the same.
Callers never read an error's text.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis

from broker.core import clock, keys, library, wire
from broker.core.config import Settings
from broker.core.connection import is_cluster
from broker.core.errors import script_error
from broker.core.unit_of_work import CommitBatch

#: Security events the workers see (impersonation attempts), at WARNING.
_SECURITY_LOG = logging.getLogger("broker.security")


def flow_control_arg(settings: Settings) -> str:
    """The flow-control curve as ``commit.lua`` takes it: ``"<start depth>:<full depth>:<max delay ms>"``,
    or "" when ``flowcontrol_enabled`` is off."""
    if not settings.flowcontrol_enabled:
        return ""
    return (
        f"{settings.flow_control_start_depth}:{settings.flow_control_full_depth}:"
        f"{settings.flow_control_max_delay_ms}"
    )


def checked(reply: Any, what: str) -> Any:
    """A pipelined script call's reply, or raise the broker error it stands for (``script_error``).

    Raises:
        ForeignKey: the script stopped on a foreign queue-manager-wide key, before any write.
        ServerFull: the server is out of memory; nothing was written.
        redis.RedisError: any other error reply, as redis-py gave it.
    """
    if isinstance(reply, BaseException):
        raise script_error(reply, what) from reply
    return reply


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Raise a script's foreign-key and out-of-memory replies as ``ForeignKey`` and ``ServerFull``."""
    try:
        yield
    except redis.ResponseError as exc:
        error = script_error(exc, what)
        if error is exc:
            raise
        raise error from exc


#: Every script in ``broker/lua/`` (but ``lib.lua``, which starts each; ``lua/library/`` is the
#: function library, ``broker.core.library``, the unit of work's ``broker_commit`` and the queue
#: mutex's ``broker_dequeue`` among them): the registry.
SCRIPTS = frozenset(
    {
        "channel_in",
        "consumers_probe",
        "give_up",
        "remove_subscription",
        "repair_stream",
        "replay",
        "requeue",
        "sub_changes",
        "sweep_entries",
        "sweep_turns",
        "take_over",
        "topic_stats",
        "trim",
    }
)


def _read(name: str) -> str:
    return resources.files("broker").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def register(client: Any, name: str) -> Any:
    """Script ``name`` registered on ``client``: the one place the broker registers a script.

    Returns redis-py's ``Script`` (loaded into the server on its first call, and again on
    NOSCRIPT; usable in a pipeline). Registering computes its SHA1 only: no round trip.

    Raises:
        KeyError: ``name`` is not one of ``SCRIPTS``.
    """
    if name not in SCRIPTS:
        raise KeyError(f"no script {name!r} in broker/lua (scripts: {', '.join(sorted(SCRIPTS))})")
    return client.register_script(script_source(name))


@functools.cache
def script_source(name: str) -> str:
    """A script's source: ``lua/lib.lua`` (the shared helpers) followed by ``lua/<name>.lua``.

    A script whose first line is a shebang (``#!lua flags=allow-oom``: one that must run on a
    full server) keeps it first.
    """
    body = _read(name)
    shebang = ""
    if body.startswith("#!"):
        shebang, _, body = body.partition("\n")
        shebang += "\n"
    return shebang + _read("lib") + "\n" + body


@dataclass(frozen=True)
class Dequeued:
    """What one call of the queue mutex (``broker_dequeue``, ``lua/library/dequeue.lua``) returned.

    Attributes:
        version: the index version counter, read in the same atomic call (bytes,
            opaque: compared with ``RoutingTable.version``, never parsed).
        last_delivered_id: the group's last delivered entry id when nothing was
            read (to block on with XREAD), else "".
        entries: ``[(entry_id, {field: value})]`` with bytes keys and values.
        turns: ``{publisher: [fifo head entry ids]}`` for every publisher whose
            turn this worker holds.
        active: publishers with entries waiting (in any worker's hands).
        live: workers that sent a heartbeat within the liveness window.
        backlog: ``{publisher: entries in its FIFO}`` for the publishers whose turn it holds.
        fair: entries waiting per live worker: a worker's fair share of the work.
        taken_over: ``[(entry_id, fields, times_delivered)]``: the next heads of a saturated
            publisher that other workers read, taken over in the same call (``ahead``);
            ``times_delivered`` is 0 for those not counted as a delivery.
        spare: other live workers not known to hold a saturated publisher: a worker keeps a
            saturated publisher alone only while one is spare (else no publisher would be
            served but by the sweeps).
        impersonations: ``[(principal, claimed publisher id, ingress entry id)]``: the entries of an
            ingress stream dead-lettered in this call under a publisher id not bound to the principal
            whose stream they came by (``parse_dequeue`` logs each at WARNING); usually empty.
        delay_seen: the call looked at ``{qm}:delayed`` (it delayed or released a publication, or
            was asked to release): ``next_due_ms`` and ``delayed_moves`` are then its answer.
        next_due_ms: the earliest delivery time still waiting in ``{qm}:delayed``, ms since the
            epoch; None when none waits (or ``delay_seen`` is False).
        delayed_moves: publications this call moved into or out of ``{qm}:delayed``.
        plenty: plenty is left to read (a backlog: the group's lag is a batch or more per other live
            worker): a turn follows its entries (``worker.turns.ready_heads``' ``leave``; the
            dequeue gave up the turns whose next head another live worker read).
    """

    version: bytes
    last_delivered_id: str
    entries: list[tuple[str, dict[bytes, bytes]]]
    turns: dict[str, list[str]]
    active: int = 0
    live: int = 1
    backlog: dict[str, int] = field(default_factory=dict)
    fair: int = 0
    taken_over: list[tuple[str, dict[bytes, bytes], int]] = field(default_factory=list)
    spare: int = 0
    impersonations: list[tuple[str, str, str]] = field(default_factory=list)
    delay_seen: bool = False
    next_due_ms: int | None = None
    delayed_moves: int = 0
    plenty: bool = False


#: Most entry ids per ``take_over.lua`` call (Lua's unpack() takes a few thousand values at most).
TAKE_OVER_CHUNK = 1_000


@dataclass(frozen=True)
class Refusals:
    """How scripts refuse a publication they cannot hand to a worker (see ``lua/lib.lua``).

    Attributes:
        reply_ttl_ms: how long a posted result is kept, ms.
        dead_letter_max_len: approximate cap of the dead-letter stream, records.
        max_body_bytes: a dead letter keeps a field (the body, a huge props) only up to this size, bytes.
    """

    reply_ttl_ms: int = 60_000
    dead_letter_max_len: int = 100_000
    max_body_bytes: int = 1_048_576


class Scripts:
    """The broker's scripts bound to one client and one queue manager.

    Args:
        client: a redis-py client (``decode_responses=False``).
        qm: the queue manager name.
        refusals: how publications are refused inside a script (dead-letter cap,
            reply TTL, largest body kept).
    """

    def __init__(self, client: redis.Redis, qm: str, refusals: Refusals | None = None) -> None:
        self.client = client
        self.qm = qm
        self.refusals = refusals or Refusals()
        self._take_over_script = register(client, "take_over")
        self._sweep_turns_script = register(client, "sweep_turns")
        self._give_up = register(client, "give_up")
        self._sweep_entries_script = register(client, "sweep_entries")
        self._trim_script = register(client, "trim")
        self._prefix = keys.pub_prefix(qm)
        self._fixed = (keys.publish_stream(qm), keys.active_publishers(qm), keys.dead_letter(qm))
        self._dedup_prefix = keys.dedup_prefix(qm)
        self._reply_prefix = keys.reply_prefix(qm)
        self._sub_prefix = keys.sub_prefix(qm)
        #: the cluster client (``RedisCluster``), None for one server: where ``commit`` and ``dequeue``
        #: route their calls
        self._cluster: Any = client if is_cluster(client) else None

    def load(self) -> int:
        """Load every script into the server's script cache (SCRIPT LOAD) and the function library,
        whose ``broker_commit`` is the unit of work and ``broker_dequeue`` the queue mutex
        (``broker.core.library.load_library``: when the server has none, an older one or other
        code); needed before pipelined calls.

        Returns:
            How many nodes the library was loaded on (0: every node had it).

        Raises:
            redis.exceptions.NoPermissionError: the client's ACL user may not ``FUNCTION LIST`` /
                ``FUNCTION LOAD`` (a worker user made before protocol 6: ``broker acl add`` again).
        """
        for script in (
            self._take_over_script,
            self._sweep_turns_script,
            self._give_up,
            self._sweep_entries_script,
            self._trim_script,
        ):
            self.client.script_load(script.script)
        return library.load_library(self.client)

    def _call(self, script: Any, keys_: list[Any], args: list[Any], pipe: Any, what: str) -> Any:
        if pipe is None:
            with _translated(what):
                return script(keys=keys_, args=args)
        pipe.execute_command("EVALSHA", script.sha, len(keys_), *keys_, *args)
        return None

    def _fcall(self, function: str, keys_: list[Any], args: list[Any], pipe: Any, what: str) -> Any:
        """One ``FCALL`` of the library's worker function ``function``: queued on ``pipe`` (None
        returned), or sent at once (its reply returned, the library loaded once when the server has
        none: ``library.ensure_loaded``; errors translated, ``_translated``).

        On a Redis Cluster a pipelined call goes to the master of the queue manager's slot, from
        the client's slot map: redis-py would otherwise ask the server for an FCALL's keys
        (``COMMAND GETKEYS``, twice, every argument sent) before each call; after a MOVED it
        finds them itself. A call sent at once goes the same way, in a pipeline of its own
        (``_send_now``).
        """
        call = ("FCALL", function, len(keys_), *keys_, *args)
        if pipe is not None:
            if self._cluster is not None:
                pipe.execute_command(*call, target_nodes=self._cluster.get_node_from_key(keys_[0]))
            else:
                pipe.execute_command(*call)
            return None
        with _translated(what):
            try:
                return self._send_now(call)
            except redis.ResponseError as exc:
                if not library.missing(exc):
                    raise
            library.ensure_loaded(self.client)
            return self._send_now(call)

    def _send_now(self, call: tuple[Any, ...]) -> Any:
        """``call`` sent at once; on a cluster as a pipeline of one, routed as ``_fcall`` routes a
        pipelined call (a direct call given ``target_nodes`` is never retried after a MOVED)."""
        if self._cluster is None:
            return self.client.execute_command(*call)
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command(*call, target_nodes=self._cluster.get_node_from_key(call[3]))
        (reply,) = pipe.execute(raise_on_error=False)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def dequeue(
        self,
        token: str,
        count: int,
        lease_ms: int,
        heads: int,
        turns: list[str],
        pipe: Any = None,
        liveness_ms: int = keys.LIVENESS_MS,
        ahead: tuple[str, str] | None = None,
        now_ms: int | None = None,
        release: bool = False,
        ingress: bool = False,
        min_share: int = 0,
        take_missing: bool = False,
    ) -> Dequeued | None:
        """Read up to ``count`` entries, file them in their publishers' FIFOs, take free turns: one
        ``FCALL broker_dequeue`` (``lua/library/dequeue.lua``, the queue mutex).

        A reply "Function not found" (``library.missing``: ``FUNCTION FLUSH``, or an older broker's
        library loaded meanwhile) wrote nothing: without ``pipe`` the library is loaded and the call
        sent again here; with one, the caller does it (``worker.loop``'s ``_send``). The function
        has the flag ``allow-oom``: it runs on a full server, as the script it was did (its first
        write, ``XREADGROUP``'s, was not refused); the commit is what a full server refuses.

        Args:
            token: the worker's consumer name and fencing token.
            count: the most entries to read; 0 reads nothing.
            lease_ms: lease of a publisher's turn, in milliseconds.
            heads: the most FIFO entry ids returned per publisher whose turn the worker holds.
            turns: publishers whose turn the worker believes it holds.
            pipe: queue the call on this pipeline instead (returns None; parse
                its reply with ``parse_dequeue``).
            liveness_ms: workers whose last heartbeat is older are not counted live, ms (``keys.LIVENESS_MS``).
            ahead: ``(publisher, entry_id)``: take over, in the same call, the heads of that
                publisher (if the worker holds its turn) after ``entry_id`` ("ms-seq"), which
                the worker has not read (``Dequeued.taken_over``; the FIFO head counts as a
                delivery when it is one of them, as in ``take_over``).
            now_ms: the worker's clock, ms since the epoch: an entry's delivery time is compared
                with it (default ``clock.now_ms()``).
            release: move the delayed publications due by ``now_ms`` back to the publish stream
                (``{qm}:delayed``; the worker asks only when it knows one is due).
            ingress: move the principals' ingress streams' entries into the publish stream
                (``{qm}:principals``, ``broker.core.principals``); the worker asks when its routing
                table has ingress streams (``RoutingTable.ingress``). Without it the call reads no
                principals: a broker without security pays nothing for them.
            min_share: under this many entries of fair share, every free turn read is taken
                (``worker.turns.MIN_SHARE``); 0: the fair share always applies.
            take_missing: the worker holds no entry in memory but those its commit in the same
                round trip handles: every head of its turns that this call does not read is taken
                over in it (``Dequeued.taken_over``), none is left for a ``take_over`` round trip.

        Returns:
            A ``Dequeued``, or None with ``pipe``.

        Raises:
            ForeignKey: a queue-manager-wide key holds another Redis type; nothing was written.
            LibraryMissing: the library is not loaded and this client's user may not load it.
            redis.RedisError: any other error, as redis-py raises it.
            (With ``pipe`` nothing is raised: pass the reply to ``checked``.)
        """
        qm = self.qm
        refusals = self.refusals
        raw = self._fcall(
            library.DEQUEUE,
            [
                keys.publish_stream(qm),
                keys.version(qm),
                keys.active_publishers(qm),
                keys.alive(qm),
                keys.dead_letter(qm),
                keys.principals(qm),
                keys.saturated(qm),
                keys.alone(qm),
                keys.wake(qm),
                keys.delayed(qm),
            ],
            [
                keys.WORKER_GROUP,
                token,
                count,
                self._prefix,
                lease_ms,
                heads,
                keys.MALFORMED_PUBLISHER,
                liveness_ms,
                wire.MAX_PUBLISHER_BYTES,
                self._reply_prefix,
                refusals.reply_ttl_ms,
                refusals.dead_letter_max_len,
                refusals.max_body_bytes,
                keys.ingress_prefix(qm) if ingress else "",
                wire.publisher_bytes(ahead[0]) if ahead else b"",
                ahead[1] if ahead else "",
                clock.now_ms() if now_ms is None else now_ms,
                "1" if release else "0",
                min_share,
                "1" if take_missing else "0",
                *map(wire.publisher_bytes, turns),
            ],
            pipe,
            "dequeue",
        )
        return None if pipe is not None else parse_dequeue(raw)

    def commit(
        self,
        pipe: Any,
        token: str,
        lease_ms: int,
        batch: CommitBatch,
        journal_max_len: int = 0,
        give_up: tuple[str, ...] = (),
        version: bytes | str = b"",
        flow_control: str = "",
    ) -> Any:
        """Queue one ``FCALL broker_commit`` (``lua/library/commit.lua``) on ``pipe``; its reply is
        3 integers per publication, then the subscriptions a slow-subscriber condition asks to
        disconnect.

        Decode the reply (after ``checked(reply, "unit of work")``, which raises ``ForeignKey``
        for a foreign queue-manager-wide key and ``ServerFull`` for a full server, nothing
        written either way) with ``broker.core.unit_of_work.decode_outcomes`` and
        ``decode_disconnects``. A reply "Function not found" (``library.missing``) wrote
        nothing: ``load``, then send the call again.

        Args:
            pipe: a redis-py pipeline (its ``execute`` returns the replies), or None to call at once
                (then the reply is returned, and the library loaded once when the server has none).
            token: the worker's fencing token.
            lease_ms: lease of the publishers' turns, renewed by the commit, ms.
            batch: the units of work, in FIFO order per publisher.
            journal_max_len: approximate cap of the delivery journal; 0 = no journal.
            give_up: publishers whose turn to give up after this call even if
                their FIFO is not empty (fair share between workers).
            version: the index version the recipients were resolved at
                (``RoutingTable.version``); when the server's differs, the script
                checks that each recipient subscription still exists.
            flow_control: the delay curve, ``"<start depth>:<full depth>:<max delay ms>"``
                (``flow_control_arg``); "" when flow control is off (nothing is read for it).

        Returns:
            None with ``pipe``; else the reply.

        Raises:
            ValueError: ``batch`` was built with the journal (``CommitBatch(journal=True)``) and
                ``journal_max_len`` is 0, or the other way round: its units' fields would be misread.
            ForeignKey, ServerFull, LibraryMissing: without ``pipe`` (``checked`` with one).
        """
        if batch.journal != (journal_max_len > 0):
            raise ValueError(
                f"a batch built with journal={batch.journal} needs journal_max_len "
                f"{'> 0' if batch.journal else '0'}, not {journal_max_len}"
            )
        qm = self.qm
        keys_ = [
            *self._fixed,
            keys.journal(qm),
            keys.subscriptions(qm),
            keys.version(qm),
            keys.skipped(qm),
            keys.slow(qm),
            keys.retained(qm),
            *batch.queue_keys,
        ]
        args = [
            keys.WORKER_GROUP,
            token,
            lease_ms,
            self._prefix,
            self._dedup_prefix,
            self._reply_prefix,
            journal_max_len,
            self._sub_prefix,
            self.refusals.dead_letter_max_len,
            self.refusals.max_body_bytes,
            version,
            batch.encoded_limits(),
            flow_control,
            len(give_up),
            *map(wire.publisher_bytes, give_up),
            *batch.args,
        ]
        return self._fcall(library.COMMIT, keys_, args, pipe, "unit of work")

    def take_over(
        self, token: str, counted: list[str], uncounted: list[str]
    ) -> list[tuple[str, dict[bytes, bytes], int]]:
        """Take over entries (XCLAIM); only ``counted`` ones may count as a new delivery.

        A counted head is not counted when it is taken back from ``token``'s own pending
        entries, or from a worker that recorded in ``{qm}:alone`` another entry it was handling
        alone (``take_over`` in ``lua/lib.lua``).

        Args:
            token: the worker's consumer name.
            counted: entry ids whose delivery count may go up (each publisher's FIFO head).
            uncounted: entry ids claimed without changing their delivery count.

        Returns:
            ``[(entry_id, fields, times_delivered)]`` for entries that still exist;
            ``times_delivered`` is 0 for uncounted entries.
        """
        out = []
        stream, alone = keys.publish_stream(self.qm), keys.alone(self.qm)
        for start in range(0, max(len(counted), len(uncounted)), TAKE_OVER_CHUNK):
            head = counted[start : start + TAKE_OVER_CHUNK]
            rest = uncounted[start : start + TAKE_OVER_CHUNK]
            with _translated("take-over"):
                raw = self._take_over_script(
                    keys=[stream, alone], args=[keys.WORKER_GROUP, token, len(head), *head, *rest]
                )
            out.extend(parse_take_over(raw))
        return out

    def trim(self, token: str, lock_ms: int, pipe: Any = None) -> Any:
        """One ``trim.lua`` call under the trim lock (``broker.operations.maintenance.trim_acknowledged``
        with a lock): queued on ``pipe`` (a worker's commit round trip; None returned), or sent.

        Args:
            token: the lock's value, the worker's name.
            lock_ms: the lock's PX, ms.

        Returns:
            The reply (``maintenance.trimmed`` reads it), None with ``pipe``.

        Raises:
            ForeignKey: ``{qm}:publish`` holds another type (without ``pipe``; nothing written).
        """
        stream_keys = [keys.publish_stream(self.qm), keys.trim_lock(self.qm)]
        args = [keys.WORKER_GROUP, token, lock_ms]
        return self._call(self._trim_script, stream_keys, args, pipe, "trim of the publish stream")

    def take_over_in(self, pipe: Any, token: str, counted: list[str], uncounted: list[str]) -> int:
        """``take_over``'s calls added to ``pipe`` (the worker's commit round trip), not sent.

        Returns:
            How many calls were added; each reply goes to ``parse_take_over`` (or ``checked``).
        """
        stream, alone = keys.publish_stream(self.qm), keys.alone(self.qm)
        calls = 0
        for start in range(0, max(len(counted), len(uncounted)), TAKE_OVER_CHUNK):
            head = counted[start : start + TAKE_OVER_CHUNK]
            rest = uncounted[start : start + TAKE_OVER_CHUNK]
            args = [keys.WORKER_GROUP, token, len(head), *head, *rest]
            self._call(self._take_over_script, [stream, alone], args, pipe, "take-over")
            calls += 1
        return calls

    def sweep_turns(self, token: str, lease_ms: int, cursor: str, count: int) -> tuple[str, list[str]]:
        """Take the turn of orphaned publishers (FIFO not empty, nobody holds the turn).

        Args:
            token: the worker's fencing token.
            lease_ms: lease of a publisher's turn, ms.
            cursor: the SSCAN cursor, "0" to start.
            count: SSCAN count hint.

        Returns:
            ``(next cursor, publishers taken)``.

        Raises:
            ForeignKey: ``{qm}:publishers`` holds another Redis type; nothing was written.
            redis.RedisError: any other error, as redis-py raises it.
        """
        with _translated("turn sweep"):
            nxt, taken = self._sweep_turns_script(
                keys=[keys.active_publishers(self.qm)],
                args=[self._prefix, token, lease_ms, cursor, count],
            )
        return nxt.decode(), [wire.exact_text(p) for p in taken]

    def sweep_entries(self, min_idle_ms: int, start: str = "-", count: int = 100) -> tuple[str, list[str]]:
        """Refuse pending entries that are in no publisher's FIFO any more (see ``lua/sweep_entries.lua``).

        Args:
            min_idle_ms: only entries pending at least this long are looked at, ms.
            start: the smallest entry id to look at, "-" for the oldest.
            count: the most pending entries looked at in this call.

        Returns:
            ``(next start id, or "" when the pending list was read to its end; refused entry ids)``.

        Raises:
            ForeignKey: the stream or the dead-letter stream holds another Redis type; nothing
                was written.
            ServerFull: the server is out of memory; nothing was written.
            redis.RedisError: any other error, as redis-py raises it.
        """
        refusals = self.refusals
        with _translated("entry sweep"):
            nxt, refused = self._sweep_entries_script(
                keys=[keys.publish_stream(self.qm), keys.dead_letter(self.qm)],
                args=[
                    keys.WORKER_GROUP,
                    min_idle_ms,
                    count,
                    start,
                    self._prefix,
                    keys.MALFORMED_PUBLISHER,
                    wire.MAX_PUBLISHER_BYTES,
                    self._reply_prefix,
                    refusals.reply_ttl_ms,
                    refusals.dead_letter_max_len,
                    refusals.max_body_bytes,
                ],
            )
        return nxt.decode(), [r.decode() for r in refused]

    def give_up(self, token: str, publishers: list[str]) -> int:
        """Give up the turns this worker holds on ``publishers``; returns how many.

        The turn keys are passed as KEYS (all in the ``{qm}`` slot), so that a
        cluster client sends the call to the master that holds them.
        """
        if not publishers:
            return 0
        turns = [wire.publisher_bytes(keys.turn_key(self.qm, p)) for p in publishers]
        with _translated("giving up turns"):
            return int(self._give_up(keys=turns, args=[token]))


def entry_fields(flat: list[bytes]) -> dict[bytes, bytes]:
    """A stream entry's ``[field, value, ...]`` as a dict; a field given twice keeps its first value,
    as the scripts read it (``field_of`` in ``lua/lib.lua``), so that the publisher an entry is
    ordered under is the one its envelope names."""
    fields = dict(zip(flat[::2], flat[1::2], strict=False))
    if 2 * len(fields) == len(flat):
        return fields
    fields = {}  # a field given twice (or an odd list): the first value of each, in one more pass
    for i in range(0, len(flat) - 1, 2):
        fields.setdefault(flat[i], flat[i + 1])
    return fields


def parse_take_over(raw: list[Any]) -> list[tuple[str, dict[bytes, bytes], int]]:
    """``take_over.lua``'s reply: ``[(entry_id, fields, times delivered)]`` (0: not counted)."""
    return [(entry_id.decode(), entry_fields(flat), int(times)) for entry_id, flat, times in raw]


def parse_dequeue(raw: list[Any]) -> Dequeued:
    """Turn the reply of ``broker_dequeue`` (``lua/library/dequeue.lua``) into a ``Dequeued``; log each impersonation attempt it names.

    An impersonation attempt (a principal's ingress entry under a publisher id not bound to it,
    dead-lettered by the script) is logged at WARNING on ``broker.security`` with the principal, the
    claimed publisher id and the ingress entry id (``extra``: ``principal``, ``publisher``,
    ``entry_id``). The script names them in a 10th reply element only when there are any, so
    nothing is spent on the way when nobody impersonates.
    """
    version, last_id, entries, turns, active, live, fair, taken, spare, *rest = raw
    impersonations = _impersonations(rest[0]) if rest else []
    delayed = rest[1] if len(rest) > 1 and rest[1] else None
    parsed = []
    for entry_id, flat in entries:
        parsed.append((entry_id.decode(), entry_fields(flat)))
    turns_map = {}
    backlog = {}
    for i in range(0, len(turns), 3):
        publisher = wire.exact_text(turns[i])
        turns_map[publisher] = [x.decode() for x in turns[i + 1]]
        backlog[publisher] = int(turns[i + 2])
    return Dequeued(
        bytes(version),
        last_id.decode(),
        parsed,
        turns_map,
        int(active),
        max(1, int(live)),
        backlog,
        int(fair),
        [(entry_id.decode(), entry_fields(flat), int(times)) for entry_id, flat, times in taken],
        int(spare),
        impersonations,
        delayed is not None,
        int(float(delayed[0])) if delayed and delayed[0] else None,
        int(delayed[1]) if delayed else 0,
        len(rest) > 2,
    )


def _impersonations(flat: list[Any]) -> list[tuple[str, str, str]]:
    """``dequeue.lua``'s impersonation triples, each logged at WARNING (``parse_dequeue``)."""
    found = []
    for i in range(0, len(flat) - 2, 3):
        principal, claimed, entry_id = (wire.lenient_text(x) for x in flat[i : i + 3])
        found.append((principal, claimed, entry_id))
        _SECURITY_LOG.warning(
            "impersonation refused: principal %s published under publisher id %r, which is not bound to it "
            "(ingress entry %s dead-lettered)",
            principal,
            claimed,
            entry_id,
            extra={"principal": principal, "publisher": claimed, "entry_id": entry_id},
        )
    return found
