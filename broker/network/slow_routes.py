"""Slow-subscriber conditions on remote subscriptions: a channel whose backlog is too long (seed 003).

SwiftMQ: "for remote subscriptions the subscriber queue is the routing queue of the resp.
router and thus the message count of that queue is taken". Here the routing queue of a
channel is its transmission stream ``{qm}:xmit:<to>``, and its count is the part not yet
delivered: the entries after the last channel sequence the receiver filed (the mover's
``last``). A transmission stream also keeps filed entries for ``retention_ms``; those are not
counted.

The channel process watches each of its channels once per agent round (``network_poll_ms``),
only when a condition with ``subscription_type`` ``remote`` or ``all`` is configured: one
``XRANGE ... COUNT max_messages`` per channel, never on the workers' hot path. When a
channel's backlog reaches a condition's ``max_messages``, the condition's root topic is
*withheld* on that channel: ``{qm}:withheld`` names it, the index version is bumped, and the
workers forward no further publication of that root topic (whose delivery mode the condition
looks at) to that channel (``RoutingTable.forwards``), until the backlog is below
``max_messages`` again. The other channels and the local subscribers get theirs; the
publication counts as delivered. A change is logged once (WARNING when withholding starts,
INFO when it ends); ``broker status --network`` shows the withheld root topics per channel.
A remote route has no subscription here to remove: the ``disconnect_*`` options apply to
local subscriptions only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import keys, wire
from broker.core.config import SlowSubscriberCondition
from broker.topics.topology import read_withheld

log = logging.getLogger("broker.channel")


def remote_conditions(conditions: Iterable[SlowSubscriberCondition]) -> list[SlowSubscriberCondition]:
    """The conditions that look at remote subscriptions (``subscription_type`` ``remote`` or ``all``)."""
    return [c for c in conditions if c.subscription_type in ("remote", "all")]


@dataclass
class SlowRoutes:
    """The remote slow-subscriber conditions of one queue manager's channels.

    Args:
        client: the queue manager's client.
        qm: the sending queue manager.
        conditions: its slow-subscriber conditions (``Settings.slow_subscriber_conditions``);
            only the ``remote`` and ``all`` ones are looked at.
    """

    client: redis.Redis
    qm: str
    conditions: list[SlowSubscriberCondition]
    #: receiving qm -> the root topics withheld on its channel, as last read or written
    withheld: dict[str, dict[str, str]] = field(default_factory=dict)
    _read: bool = False

    def __post_init__(self) -> None:
        self.conditions = remote_conditions(self.conditions)

    def backlog(self, to: str, last: str | None, most: int) -> int:
        """Entries of the channel to ``to`` not yet filed by the receiver, counted up to ``most``.

        Args:
            last: the last channel sequence the receiver filed (the mover's), or None when
                unknown: the one the mover last recorded (``{qm}:channel:<to>``), else none.
        """
        if last is None:
            last = wire.exact_text(self.client.hget(keys.channel_state(self.qm, to), "last")) or "0-0"
        entries: Any = self.client.xrange(keys.transmission(self.qm, to), f"({last}", "+", count=most)
        return len(entries)

    def check(self, channels: dict[str, str | None], now_ms: int) -> bool:
        """Work out which root topics each channel withholds, write ``{qm}:withheld`` and bump the
        index version when that changed; returns whether it changed.

        Args:
            channels: receiving qm -> the last channel sequence its receiver filed (None: unknown).
            now_ms: the time, ms since the epoch (recorded when withholding starts).
        """
        if not self.conditions and self._read:
            return False  # none configured: what was recorded is cleared at the first check
        self._read = True
        # what is recorded, not what this process wrote last: another process of this queue
        # manager (a restart overlapping) may have written since; one HGETALL per round
        self.withheld = read_withheld(self.client.hgetall(keys.withheld(self.qm)))
        most = max((c.max_messages for c in self.conditions), default=0)
        wanted: dict[str, dict[str, str]] = {}
        backlogs: dict[str, int] = {}
        for to, last in sorted(channels.items()):
            if not most:
                break
            backlog = backlogs[to] = self.backlog(to, last, most)
            roots: dict[str, str] = {
                c.name: c.persistence_mode for c in self.conditions if backlog >= c.max_messages
            }
            if roots:
                wanted[to] = roots
        if wanted == self.withheld:
            return False
        pipe = self.client.pipeline(transaction=True)
        gone = [to for to in self.withheld if to not in wanted]
        if gone:
            pipe.hdel(keys.withheld(self.qm), *gone)
        for to, roots in wanted.items():
            if self.withheld.get(to) != roots:
                record = {"roots": roots, "backlog": backlogs.get(to, 0), "since_ms": now_ms}
                pipe.hset(
                    keys.withheld(self.qm), to, json.dumps(record, sort_keys=True, separators=(",", ":"))
                )
        pipe.incr(keys.version(self.qm))
        pipe.execute()
        for to in sorted(set(wanted) | set(self.withheld)):
            before, now = self.withheld.get(to, {}), wanted.get(to, {})
            started, ended = sorted(set(now) - set(before)), sorted(set(before) - set(now))
            if started:
                log.warning(
                    "%s: channel to %s holds at least %d undelivered entries: slow-subscriber condition(s) %s "
                    "withhold their publications from it until fewer are waiting",
                    self.qm,
                    to,
                    backlogs.get(to, 0),
                    started,
                )
            if ended:
                log.info(
                    "%s: channel to %s is below its slow-subscriber condition(s) %s again", self.qm, to, ended
                )
        self.withheld = wanted
        return True
