"""Flow control for bulk publishing: wait while the workers are too far behind.

A bulk publisher (``broker pipeline publish``) can add entries to the publish
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

from broker import keys
from broker.errors import BacklogTimeout, ConnectionLost
from broker.stream import group_state


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
