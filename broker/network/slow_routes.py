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
With a ``disconnect_*`` option, withholding also disconnects the remote subscriptions: the
dynamic proxy subscriptions of the root topic held for the queue managers behind that
channel are removed, and stay removed until those queue managers announce again (as after
``broker proxies remove``, ``{qm}:proxies_removed``).
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
from broker.core.connection import read_hash
from broker.core.schemes import scheme_of, separator
from broker.topics.topology import (
    EVERYTHING,
    LOCAL,
    ProxySubscription,
    RouteClass,
    Topology,
    announce_key,
    read_withheld,
)

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

    def check(self, channels: dict[str, str | None], now_ms: int, topology: Topology | None = None) -> bool:
        """Work out which root topics each channel withholds, write ``{qm}:withheld`` and bump the
        index version when that changed; returns whether it changed. When withholding starts
        under a condition with a ``disconnect_*`` option, the proxy subscriptions of its root
        topic behind that channel are removed too (``disconnect``), in the same MULTI.

        Args:
            channels: receiving qm -> the last channel sequence its receiver filed (None: unknown).
            now_ms: the time, ms since the epoch (recorded when withholding starts).
            topology: the network (which queue managers are behind a channel); None: no disconnect.
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
        disconnected = self.disconnect(pipe, wanted, topology) if topology is not None else []
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
        if disconnected:
            log.warning(
                "%s: slow remote route(s): proxy subscriptions %s removed (disconnect), until their queue "
                "managers announce again",
                self.qm,
                disconnected,
            )
        self.withheld = wanted
        return True

    def disconnect(self, pipe: Any, wanted: dict[str, dict[str, str]], topology: Topology) -> list[str]:
        """Queue on ``pipe`` the removal of the dynamic proxy subscriptions that a condition with a
        ``disconnect_*`` option, starting to withhold on a channel (in ``wanted``, not yet in
        ``withheld``), disconnects: those of its root topic for the queue managers behind that
        channel (its next hop towards them, in the hierarchy or one of this queue manager's
        clusters). A remote subscription is the remote queue manager's interest, neither durable
        nor not: either option disconnects it. Each removal is recorded in ``{qm}:proxies_removed``
        (``<qm> <topic key>`` -> the announcement ``seq``), so that it stays removed until that
        queue manager announces again (as ``broker proxies remove``). Returns the fields removed.
        """
        disconnecting = {
            c.name
            for c in self.conditions
            if c.disconnect_non_durable_subscriber or c.disconnect_delete_durable_subscriber
        }
        pairs = {
            (to, root)
            for to, roots in wanted.items()
            for root in roots
            if root in disconnecting and root not in self.withheld.get(to, {})
        }
        if not pairs:
            return []
        qm = self.qm
        node = topology.network.queue_managers.get(qm)
        classes: list[RouteClass] = [LOCAL, *((c, ()) for c in (node.clusters if node else ()))]
        behind: dict[str, set[str]] = {}
        for route in classes:
            for dest in topology.network.queue_managers:
                path = topology.path(route, qm, dest)
                if path is not None and len(path) > 1:
                    behind.setdefault(path[1], set()).add(dest)
        sep = separator(scheme_of(qm, read_hash(self.client, keys.manager(qm))))
        removed: dict[str, int] = {}
        fields: list[Any] = []
        for raw_field, raw in self.client.hgetall(keys.proxies(qm)).items():
            try:
                proxy = ProxySubscription.from_json(raw)
            except (ValueError, TypeError):
                continue
            if proxy.source != "dynamic" or proxy.topic == EVERYTHING:
                continue
            root = announce_key(proxy.topic, "root", sep)
            if any(root == r and proxy.qm in behind.get(to, ()) for to, r in pairs):
                fields.append(raw_field)
                removed[f"{proxy.qm} {proxy.topic}"] = proxy.seq
        if fields:
            pipe.hdel(keys.proxies(qm), *fields)
            pipe.hset(keys.proxies_removed(qm), mapping=removed)
        return sorted(removed)
