"""A channel's mover: transmission entries into the receiver's publish stream, each once, in order.

See ``broker.network.channel`` for the channel process that runs one mover per neighbour,
and ``lua/channel_in.lua`` for the receiving end.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from broker.core import keys, wire
from broker.core.errors import InvalidMessage
from broker.core.logs import publication_extra
from broker.core.models import decode_envelope, header_timestamp_ms
from broker.core.scripts import register
from broker.network.peers import UNREACHABLE, Clock, Peers

log = logging.getLogger("broker.channel")

#: A channel mover's lease on its channel, ms: a restarted process's mover takes over after
#: it. Only to spare work: two movers on one channel never file an entry twice.
MOVER_LEASE_MS = 3_000

#: Delete a lease only while it is still the caller's (KEYS[1] the lease, ARGV[1] the token).
_RELEASE_LEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

#: The first pause after a failed move, ms; it doubles up to ``channel_max_backoff_ms``.
FIRST_BACKOFF_MS = 100


def forwarded_fields(envelope: bytes, sender: str) -> list[bytes | str]:
    """The publication entry fields of a transmission entry, for the receiver's publish stream.

    Args:
        envelope: the transmission entry's ``e`` field (the envelope subscribers get).
        sender: the queue manager sending it (appended to the route).

    Returns:
        Flat ``[field, value, ...]``: publisher, msgid, topic, body, ts, persistent, priority,
        the optional fields it has (a ``delivery_time`` with ``delayed_from``: the sender released
        it at its delivery time, the receiver does not delay it again), then ``origin`` and
        ``route`` (comma-separated, origin first).

    Raises:
        InvalidMessage: the envelope is not in the protocol's format.
    """
    header, body = decode_envelope(envelope)
    try:
        publisher, msgid, topic, ts = (
            header["publisher"],
            header["msgid"],
            header["topic"],
            header_timestamp_ms(header),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidMessage(f"envelope header lacks {exc}") from exc
    origin, route = header.get("origin") or sender, header.get("route") or []
    if (
        not isinstance(origin, str)
        or not isinstance(route, list)
        or not all(isinstance(r, str) for r in route)
    ):
        raise InvalidMessage("envelope header's origin is not a name or its route not a list of names")
    route = [*route, sender]
    if "msgid_hex" in header:  # a msgid that is not UTF-8: its bytes, so the receiver dedups it as sent
        try:
            msgid = bytes.fromhex(header["msgid_hex"])
        except (TypeError, ValueError) as exc:
            raise InvalidMessage("envelope header's msgid_hex is not hexadecimal") from exc
    flat: list[bytes | str] = [
        b"publisher",
        str(publisher).encode("utf-8", "surrogateescape"),
        b"msgid",
        msgid if isinstance(msgid, bytes) else str(msgid),
        b"topic",
        str(topic),
        b"body",
        body,
        b"ts",
        str(ts),
        b"persistent",
        "1" if header.get("persistent", True) else "0",
        b"priority",
        str(header.get("priority", keys.DEFAULT_PRIORITY)),
    ]
    if header.get("seq") is not None:
        flat += [b"seq", str(header["seq"])]
    if header.get("expiration"):
        flat += [b"expiration", str(header["expiration"])]
    for name, raw_name in (
        ("correlation_id", b"correlation_id"),
        ("reply_to", b"reply_to"),
        ("type", b"type"),
    ):
        if header.get(name) is not None:
            flat += [raw_name, str(header[name])]
    if header.get("props"):
        flat += [b"props", json.dumps(header["props"], separators=(",", ":"))]
    if header.get("delivery_time"):  # delivered here at its time already: not delayed again there
        flat += [b"delivery_time", str(header["delivery_time"]), b"delayed_from", str(header.get("entry_id"))]
    flat += [b"origin", str(origin), b"route", ",".join(route)]
    return flat


@dataclass
class Mover:
    """Moves the channel from ``qm`` to ``to``: transmission entries into ``to``'s publish stream.

    Args:
        client: ``qm``'s client.
        qm: the sending queue manager.
        to: the receiving queue manager.
        peers: clients of the network (``to``'s is used).
        name: the mover's lease token.
        clock_ms: ms since the epoch (injectable).
        batch: most entries per move.
        max_backoff_ms: the longest pause after failures, ms.
        retention_ms: how long a filed entry stays in the transmission stream, ms.
    """

    client: redis.Redis
    qm: str
    to: str
    peers: Peers
    name: str
    clock_ms: Clock
    batch: int = 500
    max_backoff_ms: int = 5_000
    retention_ms: int = 60_000
    hook: Callable[[str], None] = lambda point: None
    last: str | None = None
    backoff_ms: int = 0
    next_try_ms: int = 0
    moved: int = 0
    _lease_until: int = 0
    _script: Any = None

    @property
    def stream(self) -> str:
        return keys.transmission(self.qm, self.to)

    def _lease(self, now: int) -> bool:
        """Hold the channel's mover lease (one mover per channel); False when another holds it."""
        if now < self._lease_until - MOVER_LEASE_MS // 2:
            return True
        key = keys.channel_mover(self.qm, self.to)
        if (
            self.client.set(key, self.name, nx=True, px=MOVER_LEASE_MS)
            or wire.exact_text(self.client.get(key)) == self.name
        ):
            self.client.pexpire(key, MOVER_LEASE_MS)
            self._lease_until = now + MOVER_LEASE_MS
            return True
        return False

    def release(self) -> None:
        """Give up the channel's lease if this mover holds it (an orderly stop: the next process's
        mover takes over at once instead of after ``MOVER_LEASE_MS``)."""
        if self._lease_until:
            self._lease_until = 0
            self.client.eval(_RELEASE_LEASE, 1, keys.channel_mover(self.qm, self.to), self.name)

    def move_once(self, _again: bool = True) -> int:
        """Move up to ``batch`` entries; returns how many were moved (filed or dropped as already filed).

        Never raises for an unreachable server: the failure is recorded in the channel's state
        and the next try waits (doubling pause). A receiver whose record of the last sequence
        filed went back (restarted from an older AOF or snapshot, which this mover's client
        may not notice: it reconnects on its own) is sent again what it lost, in the same call.
        """
        now = self.clock_ms()
        if now < self.next_try_ms:
            return 0
        in_flight = 0
        try:
            if not self._lease(now):
                return 0
            receiver = self.peers.client(self.to)
            if self._script is None or self._script.registered_client is not receiver:
                self._script = register(receiver, "channel_in")
            if self.last is None:  # the receiver says what it has: the only source of truth
                self.last = wire.exact_text(receiver.hget(keys.received(self.to), self.qm)) or "0-0"
            raw = self.client.xrange(self.stream, f"({self.last}", "+", count=self.batch)
            if not raw:
                if self.backoff_ms:
                    self._record(now, "running", "")
                self.backoff_ms = 0
                return 0
            # the sequence this batch is read after: the receiver refuses it when its record is below
            args: list[Any] = [self.qm, self.last]
            bad: list[tuple[str, dict[Any, Any], str]] = []
            for entry_id, fields in raw:
                sequence = wire.exact_text(entry_id)
                try:
                    flat = forwarded_fields(cast(bytes, (fields or {}).get(b"e", b"")), self.qm)
                except InvalidMessage as exc:
                    bad.append((sequence, fields or {}, str(exc)))
                    continue
                args += [sequence, len(flat), *flat]
            if bad:  # deleted from the stream: the next read after self.last does not see them
                self._dead_letter(bad)
            in_flight = len(raw) - len(bad)
            self.hook("before_channel_in")
            filed = dropped = 0
            if len(args) > 2:
                filed, dropped, last, behind = self._script(
                    keys=[keys.publish_stream(self.to), keys.received(self.to)], args=args
                )
                if int(behind):
                    log.warning(
                        "channel %s -> %s: the receiver's last sequence filed is %s, below %s (restarted "
                        "from an older state?): sending again from there",
                        self.qm,
                        self.to,
                        wire.exact_text(last),
                        self.last,
                    )
                    self.client.hincrby(keys.channel_state(self.qm, self.to), "resent_from_behind", 1)
                    self.last = wire.exact_text(last)
                    return self.move_once(_again=False) if _again else 0
                self.last = wire.exact_text(last)
            self.hook("after_channel_in")
            self.moved += int(filed)
            in_flight = 0
            self._after(now, int(filed), int(dropped))
            self.backoff_ms = 0
            return len(raw)
        except UNREACHABLE as exc:
            self.last = None
            self.peers.drop(self.to)
            self.backoff_ms = min(max(FIRST_BACKOFF_MS, self.backoff_ms * 2), self.max_backoff_ms)
            self.next_try_ms = now + self.backoff_ms
            log.warning("channel %s -> %s: %s; retrying in %d ms", self.qm, self.to, exc, self.backoff_ms)
            with contextlib.suppress(*UNREACHABLE):
                self._record(now, "retrying", f"{type(exc).__name__}: {exc}", in_flight)
            return 0

    def _after(self, now: int, filed: int, dropped: int) -> None:
        """Record a successful move on the sending side and trim what the receiver filed long enough ago."""
        assert self.last is not None
        pipe = self.client.pipeline(transaction=True)
        state = keys.channel_state(self.qm, self.to)
        pipe.hincrby(state, "moved", filed)
        if dropped:
            pipe.hincrby(state, "dropped_as_filed", dropped)
        pipe.hset(
            state,
            mapping={
                "last": self.last,
                "state": "running",
                "in_flight": 0,
                "backoff_ms": 0,
                "updated_ms": now,
            },
        )
        minimum = int(self.last.split("-", 1)[0]) - self.retention_ms
        if minimum > 0:
            pipe.xtrim(self.stream, minid=f"{minimum}-0")
        pipe.execute()

    def _record(self, now: int, state: str, error: str, in_flight: int = 0) -> None:
        mapping: dict[Any, Any] = {
            "state": state,
            "backoff_ms": self.backoff_ms,
            "in_flight": in_flight,
            "updated_ms": now,
        }
        if error:
            mapping["last_error"] = error[:500]
            mapping["last_error_ms"] = now
        self.client.hset(keys.channel_state(self.qm, self.to), mapping=mapping)

    def _dead_letter(self, bad: list[tuple[str, dict[Any, Any], str]]) -> None:
        """Move unreadable transmission entries (written by something else) to the dead-letter
        stream: the entry's own fields, then ``dlq.reason`` and ``dlq.entry_id`` (its
        transmission entry id), as every dead letter (``broker.core.keys``)."""
        pipe = self.client.pipeline(transaction=True)
        for sequence, fields, reason in bad:
            record: dict[Any, Any] = {
                k: v for k, v in fields.items() if not wire.exact_text(k).startswith("dlq.")
            }
            record[b"dlq.reason"] = f"channel {self.qm} -> {self.to}: unreadable transmission entry: {reason}"
            record[b"dlq.entry_id"] = sequence
            pipe.xadd(keys.dead_letter(self.qm), record)
            pipe.xdel(self.stream, sequence)
        pipe.hincrby(keys.channel_state(self.qm, self.to), "dead_lettered", len(bad))
        pipe.execute()
        for sequence, _fields, reason in bad:
            log.error(
                "channel %s -> %s: unreadable transmission entry %s dead-lettered: %s",
                self.qm,
                self.to,
                sequence,
                reason,
                extra=publication_extra(sequence),
            )
