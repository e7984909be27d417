"""How idle workers wait for work: one waits on the publish stream, the others on a wake-up list.

Without it, every idle worker blocks on the publish stream (XREAD) and every one wakes on each
XADD, each then running ``dequeue.lua`` (the queue mutex) for one publication that only one of
them can read: at low rates most script calls are wasted.

- **The waiter**: the one idle worker holding ``{qm}:waiter`` (SET NX, PX its lease, renewed
  at each wait) blocks on the publish stream (and the principals' ingress streams) from the
  group's last-delivered id, and runs the dequeue when an entry comes. It keeps the role while
  it can handle what it read alone, returning to the stream after its commit (no prefetched
  dequeue: ``Worker._round``).
- **The others** block on ``{qm}:wake`` (BLPOP). A worker rings it (LPUSH, trimmed to one
  element) when work is left for another: the waiter that stays busy after its round (it
  gives up the role too, so an idle worker takes the stream), entries it read for turns it does
  not hold, or turns it gave up (named in the element, so the worker woken takes them with its
  dequeue, with no sweep).
- **At a high rate** (a worker's last wait for work was short: entries keep coming) the idle
  worker waits on the stream directly (``wait(direct=True)``), as every worker did before this
  module: no round trip for the role, and the next entry finds an idle worker on the stream
  however busy the waiter is (one worker serving alone queues the publications behind its
  rounds: p99 at 2,000/s was about 2x). Each wake-up then costs a dequeue, but at that rate
  nearly every dequeue finds work. The wake-up a busy worker rings rides in its commit's round
  trip (``hand_on_in``); one nobody waited for is taken by the next dequeue of any worker
  (``dequeue.lua`` LPOPs it), which takes the turns it names.
- **Crash safety**: a waiter killed with SIGKILL keeps the role until its lease runs out
  (``waiter_lease_ms``: its wait, plus ``LEASE_MARGIN_MS``); every idle worker also
  dequeues once after each wait that timed out, so nothing read late waits longer than one wait.
  A foreign ``{qm}:wake`` or ``{qm}:waiter`` (another type) is logged once, and the workers
  wait on the stream as before until it is removed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import redis

from broker.core import keys, wire

log = logging.getLogger("broker.worker")

#: The waiter's lease beyond its wait, ms: the round it runs between two waits (the role is
#: renewed at each wait; should a round run longer, another idle worker may wait on the stream
#: too for a while, which costs a dequeue, never a publication).
LEASE_MARGIN_MS = 500


def waiter_lease_ms(wait_ms: int) -> int:
    """The lease of the waiter's role for a wait of ``wait_ms`` ms, ms."""
    return wait_ms + LEASE_MARGIN_MS


def _publishers(raw: bytes | str) -> tuple[str, ...]:
    """The publishers a wake-up names (a JSON list of str, ``hand_on_in``); () for anything else
    (a wake-up written by something other than a worker)."""
    try:
        named = json.loads(raw)
    except ValueError:  # UnicodeDecodeError too
        return ()
    if not isinstance(named, list):
        return ()
    return tuple(p for p in named if isinstance(p, str) and p)


class Waiting:
    """One worker's side of the waiting (module text).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        name: the worker's name (the value of ``{qm}:waiter`` while it waits on the stream).
    """

    def __init__(self, client: redis.Redis, qm: str, name: str) -> None:
        self.client = client
        self.name = name
        self.waiter_key = keys.waiter(qm)
        self.wake_key = keys.wake(qm)
        self.stream = keys.publish_stream(qm)
        #: until when (the worker's clock, ms) it holds the waiter's role, as far as it knows
        self.holds_until_ms = 0
        #: the publishers named by the last wake-up taken (turns given up by another worker)
        self.given_up: tuple[str, ...] = ()
        #: a waiting key found of another type ("" for none): idle workers wait on the stream meanwhile
        self._foreign_key = ""

    def holds(self, now_ms: int) -> bool:
        """Whether this worker holds the waiter's role (as far as it knows) at ``now_ms``."""
        return self.holds_until_ms > now_ms

    def wait(
        self,
        now_ms: int,
        last_id: str,
        wait_ms: int,
        ingress: Iterable[bytes | str] = (),
        direct: bool = False,
    ) -> bool:
        """Wait up to ``wait_ms`` ms for work: on the publish stream after ``last_id`` as the waiter
        (or ``direct``), else on the wake-up list.

        Args:
            now_ms: the worker's clock, ms.
            last_id: the group's last-delivered id the worker knows ("ms-seq").
            wait_ms: the longest block, ms.
            ingress: the principals' ingress streams, waited on from their start (the waiter only).
            direct: wait on the stream without the waiter's role (entries keep coming: the worker's
                last wait was short, ``worker.loop.QUIET_WAIT_MS``): no round trip for the role, and
                every such worker wakes on the next entry, as the herd did.

        Returns:
            True when woken (an entry after ``last_id``, or a wake-up), False after ``wait_ms``.

        Raises:
            redis.RedisError: as redis-py raises it.
        """
        if direct:
            return self._read(last_id, wait_ms, ingress)
        lease = waiter_lease_ms(wait_ms)
        if self.holds(now_ms):
            self.client.set(self.waiter_key, self.name, px=lease)
            mine = True
        else:
            mine = bool(self.client.set(self.waiter_key, self.name, nx=True, px=lease))
        if self._foreign_key and self._type_ok(self._foreign_key):
            log.info("worker %s: %s is no longer foreign; waiting as before", self.name, self._foreign_key)
            self._foreign_key = ""
        if mine or self._foreign_key:
            self.holds_until_ms = now_ms + lease if mine else 0
            return self._read(last_id, wait_ms, ingress)
        self.holds_until_ms = 0
        woken = self._pop_wake(wait_ms)
        if woken is None:  # a foreign wake-up key: wait on the stream, as every worker
            return self._read(last_id, wait_ms, ingress)
        if not woken and not self._type_ok(self.waiter_key):
            # nobody woke it for a whole wait: a foreign waiter key would keep every worker off the stream
            self._foreign(self.waiter_key)
        return woken

    def wait_wake(self, wait_ms: int) -> bool:
        """Wait up to ``wait_ms`` ms on the wake-up list alone (a worker waiting for turns others hold,
        ``worker.loop.FOLLOW_POLLS``: the stream has entries, none for it yet).

        Returns:
            True when woken (the publishers named are kept for ``take_given_up``), False after
            ``wait_ms`` or when the wake-up list is of another type (logged once).
        """
        return bool(self._pop_wake(wait_ms))

    def _pop_wake(self, wait_ms: int) -> bool | None:
        """Block up to ``wait_ms`` ms on ``{qm}:wake``: True when woken (the publishers it names kept in
        ``given_up``), False after ``wait_ms``, None when the key is of another type (noted, logged once)."""
        try:
            popped = self.client.blpop([self.wake_key], timeout=wait_ms / 1000)
        except redis.ResponseError:
            self._foreign(self.wake_key)
            return None
        if popped is None:
            return False
        self.given_up = _publishers(popped[1])
        return True

    def _read(self, last_id: str, wait_ms: int, ingress: Iterable[bytes | str]) -> bool:
        """Block on the publish stream after ``last_id`` (and the ingress streams from their start)."""
        streams: dict[bytes | str, str] = {self.stream: last_id}
        for stream in ingress:
            streams[stream] = "0-0"
        try:
            reply = self.client.xread(streams, count=1, block=wait_ms)  # type: ignore[arg-type]
        except redis.ResponseError:  # an ingress key of another type: wait on the publish stream alone
            reply = self.client.xread({self.stream: last_id}, count=1, block=wait_ms)
        return bool(reply)

    def take_given_up(self) -> tuple[str, ...]:
        """The publishers the last wake-up named (turns given up), once."""
        given_up, self.given_up = self.given_up, ()
        return given_up

    def hand_on_in(self, pipe: redis.client.Pipeline, now_ms: int, given_up: Iterable[str] = ()) -> int:
        """Wake one idle worker: give up the waiter's role if this worker holds it (it stays busy),
        and name the turns it gave up (``given_up``) for that worker's dequeue. The commands are
        added to ``pipe`` (the worker's commit round trip: no round trip of their own); their
        replies go to ``handed_on``.

        Args:
            pipe: a redis-py pipeline, not yet executed.
            now_ms: the worker's clock, ms.
            given_up: publishers whose turn this worker gave up.

        Returns:
            How many commands were added (their replies are the last ones of ``pipe``).
        """
        added = 2
        if self.holds(now_ms):
            pipe.delete(self.waiter_key)
            self.holds_until_ms = 0
            added = 3
        # JSON: any publisher id (bytes as sent, surrogateescape; a newline in it) in ASCII
        pipe.lpush(self.wake_key, json.dumps(list(given_up)))
        pipe.ltrim(self.wake_key, 0, 0)
        return added

    def handed_on(self, replies: Iterable[object]) -> None:
        """Note a foreign ``{qm}:wake`` among the replies to ``hand_on_in``'s commands."""
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                self._foreign(self.wake_key)

    def release(self) -> None:
        """Give up the waiter's role on a warm stop (when this worker holds it)."""
        if self.holds_until_ms:
            self.client.delete(self.waiter_key)
            self.holds_until_ms = 0

    def _type_ok(self, key: str) -> bool:
        """Whether ``key`` is absent or of the type the waiting keeps there."""
        return self._type(key) in ("list" if key == self.wake_key else "string", "none")

    def _type(self, key: str) -> str:
        found = self.client.type(key)
        return wire.text(found)

    def _foreign(self, key: str) -> None:
        """Note a foreign ``{qm}:wake`` or ``{qm}:waiter``: logged once, then idle workers wait on the stream."""
        if not self._foreign_key:
            wanted = "a list" if key == self.wake_key else "a string"
            log.error(
                "worker %s: foreign key: %s holds a %s, not %s; idle workers all wait on the publish stream "
                "until it is removed",
                self.name,
                key,
                self._type(key),
                wanted,
            )
        self._foreign_key = key
