"""Flow control: the broker's delay for a publisher, and the backlog bound of bulk publishing.

**Delay-based flow control** (SwiftMQ's Topic Manager, seed 003): the unit of
work of each publication works out a delay from the depth of the subscriber
queues it went to, the slowest subscriber's (``Settings.flowcontrol_enabled``,
``flow_control_*``), and asks the publisher to wait that long before its next
publication: in the result (``flow_control_delay_ms``) and in the publisher's
flow key (``{qm}:pub:<publisher>:flow``), which a publisher that does not wait
for results reads in the same round trip as its ``XADD``. ``FlowGate`` is what a
publisher keeps of it: ``learn`` the delay, ``wait`` before the next publication.

**The backlog bound.** A bulk publisher (``broker pipeline publish``) can add entries to the publish
stream much faster than the workers fan them out. Left alone, the stream grows
until the server runs out of memory (``maxmemory-policy noeviction`` then
refuses every write, the workers' included). ``wait_for_room`` lets the
publisher wait instead: before each batch it blocks while the **backlog**, the
publications not yet acknowledged by the workers, is at or above a bound.

The backlog is read from ``XINFO GROUPS {qm}:publish``: the group ``workers``'
``lag`` (entries not yet read by any worker) plus its ``pending`` (read but not
yet committed). Before the first worker creates the group, every entry in the
stream is backlog (``XLEN``). When the server cannot tell the lag (``lag`` is
nil after an ``XDEL`` of an entry not yet read), the entries after the group's
last-delivered id are counted, up to the bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import redis

from broker.core import keys
from broker.core.errors import BacklogTimeout, ConnectionLost
from broker.core.stream import group_state


def parse_delay(raw: bytes | str | int | None) -> int:
    """A flow key's value (``GET {qm}:pub:<publisher>:flow``) as a delay, ms.

    Returns:
        The delay, ms; 0 for an absent key (None) or a value that is not a positive integer.
    """
    if raw is None or isinstance(raw, Exception):
        return 0
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return 0
    return max(value, 0)


class FlowGate:
    """What a publisher owes the broker's flow control: the delay to wait before its next publication.

    Args:
        enabled: False: ``learn`` forgets everything and ``wait`` never waits.
        clock_ms: a monotonic clock in ms (injectable for tests).
        sleep_ms: sleeps for the given ms (injectable for tests).

    Attributes:
        waited_ms: the time waited so far, ms (all ``wait`` calls).
    """

    def __init__(
        self,
        enabled: bool = True,
        clock_ms: Callable[[], float] | None = None,
        sleep_ms: Callable[[float], None] | None = None,
    ) -> None:
        self.enabled = enabled
        self.clock = clock_ms or (lambda: time.monotonic() * 1000)
        self.sleep = sleep_ms or (lambda ms: time.sleep(ms / 1000))
        self.waited_ms = 0.0
        self._until: float | None = None

    def learn(self, delay_ms: int) -> None:
        """The broker asked for ``delay_ms`` (ms, from now) before the next publication; 0: nothing."""
        if self.enabled and delay_ms > 0:
            until = self.clock() + delay_ms
            if self._until is None or until > self._until:
                self._until = until

    def wait(self) -> float:
        """Before a publication: sleep what is left of the delay learnt last, then forget it.

        Returns:
            How long it slept, ms (0 when nothing is owed).
        """
        if self._until is None:
            return 0.0
        left = self._until - self.clock()
        self._until = None
        if left <= 0:
            return 0.0
        self.sleep(left)
        self.waited_ms += left
        return left


def _count_after(client: redis.Redis, stream: str, last_id: str, limit: int) -> int:
    """Entries of ``stream`` after ``last_id``, counted up to ``limit``."""
    if limit <= 0:
        return 0
    return len(cast(list[Any], client.xrange(stream, min="(" + last_id, max="+", count=limit)))


def backlog(client: redis.Redis, qm: str, limit: int | None = None) -> int:
    """How many publications the workers have not acknowledged yet.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        limit: only needed when the server cannot tell the group's lag: the
            unread entries are then counted up to this many (None: all).

    Returns:
        ``lag + pending`` of the group ``workers``, or the stream length when
        the group (or the stream) does not exist yet.

    Raises:
        ConnectionLost: the server cannot be reached.
        ForeignKey: ``{qm}:publish`` holds another Redis type.
    """
    stream = keys.publish_stream(qm)
    try:
        state = group_state(client, qm)
        if not state.exists:  # nothing published yet, or no worker has started
            return state.length
        if state.lag is None:
            cap = state.length if limit is None else limit
            return state.pending + _count_after(client, stream, state.last_delivered_id, cap)
        return state.pending + state.lag
    except redis.ConnectionError as exc:
        raise ConnectionLost(f"cannot read the publish stream's backlog: {exc}") from exc


def wait_for_room(
    client: redis.Redis,
    qm: str,
    max_backlog: int,
    poll_ms: int = 50,
    timeout_ms: int | None = None,
    *,
    clock_ms: Callable[[], float] | None = None,
    sleep_ms: Callable[[float], None] | None = None,
) -> int:
    """Block while the workers' backlog is at or above ``max_backlog``.

    The publisher waits, it does not fail: with no ``timeout_ms`` this returns
    only once the workers have caught up below the bound.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        max_backlog: publications not yet acknowledged at which to wait, >= 1.
        poll_ms: how often the backlog is read while waiting, ms.
        timeout_ms: give up after this long, ms; None waits for as long as it takes.
        clock_ms: a monotonic clock in ms (injectable for tests).
        sleep_ms: sleeps for the given ms (injectable for tests).

    Returns:
        The backlog last seen, below ``max_backlog``.

    Raises:
        ValueError: ``max_backlog`` < 1 or ``poll_ms`` < 1.
        BacklogTimeout: the backlog stayed at or above the bound for ``timeout_ms``.
        ConnectionLost: the server cannot be reached.
    """
    if max_backlog < 1:
        raise ValueError("max_backlog must be at least 1")
    if poll_ms < 1:
        raise ValueError("poll_ms must be at least 1")
    clock = clock_ms or (lambda: time.monotonic() * 1000)
    sleep = sleep_ms or (lambda ms: time.sleep(ms / 1000))
    deadline = None if timeout_ms is None else clock() + timeout_ms
    while True:
        seen = backlog(client, qm, limit=max_backlog)
        if seen < max_backlog:
            return seen
        if deadline is not None and clock() >= deadline:
            raise BacklogTimeout(
                f"the workers' backlog stayed at {seen} >= {max_backlog} publications for {timeout_ms} ms "
                "(are the workers running? see `broker status`)"
            )
        sleep(poll_ms)
