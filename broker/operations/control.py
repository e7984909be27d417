"""Subscribing as a request: the broker's side of the control streams (seed 000).

"The subscriber sends a request subscription message to a control queue on the broker. A
response message is sent by the broker to a reply queue on the subscriber." With security on, a
subscriber user may not write the subscription registry (``{qm}:subs``); it asks for a
subscription with one ``XADD`` to its own control stream ``{qm}:ctl:<client id>`` (its ACL
allows no other), and waits for the answer with ``BLPOP {qm}:ctl:<client id>:reply:<request id>``
(``broker.clients.control`` does both).

A request's fields (UTF-8):

=============  ===============================================================================
``op``         ``subscribe`` or ``unsubscribe``
``topic``      subscribe: the topic filter (the queue manager's scheme; no ``$share/``)
``name``       the subscription's name (its id is ``<client id>$<name>``); required for a durable
               subscription and for ``unsubscribe``; a non-durable one without it gets ``nd-<hex>``
``durable``    ``1`` for a durable subscription (default ``0``)
``selector``   a message selector (Jakarta Messaging), optional
``no_local``   ``1``: not the publications sent with this client id (default ``0``)
``retained``   ``0``: a new subscription receives no retained publications (MQTT 5 Retain Handling
               2, IBM MQ MQSO_NEW_PUBLICATIONS_ONLY; default ``1``: those its filter matches)
``reply``      the request id (1-64 of ``A-Z a-z 0-9 _ . -``); default: the entry id XADD returned
=============  ===============================================================================

The answer, one JSON element pushed on ``{qm}:ctl:<client id>:reply:<request id>`` (a list that
expires after ``Settings.reply_ttl_ms``): ``{"ok": true, "subscription": "<sub id>", "record":
{...}}``, or ``{"ok": false, "error": "<why>", "kind": "<error name>", "exit_code": n}``. A
subscription is made only when every subscriber user bound to the client id (``{qm}:acl``; several
users may share one) may subscribe to the filter by its grants (``broker.topics.grants``), through
``broker.topics.subscriptions.subscribe``, with the queue manager's limits.

Served by the workers of a queue manager run with ``security = true``, in their housekeeping
(``ControlServer.poll``, every ``POLL_MS``, off the publication path), one worker at a time
(``{qm}:ctl_lock``). Each request is answered once and deleted from its stream (``XDEL``, in the
MULTI that posts the answer): a malformed one gets an error answer and is never read again; a
control stream or answer key of another type (planted by its own subscriber) is skipped, logged,
and stops nobody else's requests.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from broker.core import keys, wire
from broker.core.config import Settings
from broker.core.errors import BrokerError, InvalidMessage, NotAuthorized, SubscriptionRefused
from broker.core.schemes import recorded_scheme
from broker.core.topic_rules import SHARE_PREFIX
from broker.operations.acl import RoleSpec
from broker.operations.grants import read_grants
from broker.topics.grants import Grants, validate_grant_filter
from broker.topics.subscriptions import check_name, subscribe, unsubscribe

log = logging.getLogger("broker.control")
security_log = logging.getLogger("broker.security")

#: How often a worker looks at the control streams, ms (a request waits about this long).
POLL_MS = 200

#: How often the control streams to look at (the subscriber users' client ids) are read again, ms.
LIST_MS = 2_000

#: Most requests read per control stream per poll.
COUNT = 20

#: The lease of the worker answering control requests, ms.
LOCK_MS = 10_000

#: Request ids: what may follow ``:reply:`` in the answer key.
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

#: The fields a request may have.
FIELDS = frozenset({"op", "topic", "name", "durable", "selector", "no_local", "retained", "reply"})


def _flag(fields: dict[str, str], name: str) -> bool:
    value = fields.get(name, "0")
    if value not in ("0", "1"):
        raise InvalidMessage(f"field {name!r} must be 1 or 0, not {value[:40]!r}")
    return value == "1"


def parse_request(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A request's fields as text, checked for shape (not yet for the filter or the grants).

    Raises:
        InvalidMessage: a field is not UTF-8, unknown, or ``op`` is missing or unknown.
    """
    try:
        fields = {wire.text(k): wire.text(v) for k, v in raw.items()}
    except UnicodeDecodeError:
        raise InvalidMessage("a control request's fields must be UTF-8") from None
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        raise InvalidMessage(f"unknown field {unknown[0][:40]!r}; a request has {', '.join(sorted(FIELDS))}")
    if fields.get("op") not in ("subscribe", "unsubscribe"):
        raise InvalidMessage(
            f"field 'op' must be subscribe or unsubscribe, not {fields.get('op', '')[:40]!r}"
        )
    return fields


def reply_key(qm: str, client_id: str, entry_id: str, raw: dict[bytes, bytes]) -> tuple[str, str | None]:
    """Where to answer a request: ``(key, problem)``; a missing or bad ``reply`` answers on the entry id."""
    given = raw.get(b"reply")
    if given is None:
        return keys.control_reply(qm, client_id, entry_id), None
    text = wire.utf8_or_none(given)
    if text is None or not REQUEST_ID.match(text):
        problem = "field 'reply' must be 1-64 of A-Z a-z 0-9 _ . -; answered on the entry id"
        return keys.control_reply(qm, client_id, entry_id), problem
    return keys.control_reply(qm, client_id, text), None


@dataclass
class ControlServer:
    """Answers the control requests of one queue manager (module text); one per worker.

    Args:
        client: a client of a user allowed every key of the queue manager (a worker).
        settings: the broker settings (the queue manager, limits, ``reply_ttl_ms``).
        name: the worker's name (the lock's token).
    """

    client: redis.Redis
    settings: Settings
    name: str
    #: client id -> the subscriber users bound to it
    users: dict[str, list[str]] = field(default_factory=dict)
    next_list_ms: int = 0
    _foreign: set[str] = field(default_factory=set)

    def poll(self, now_ms: int) -> int:
        """Answer the requests waiting now (none read: one XREAD at most; nothing when there are no
        subscriber users). Returns how many were answered.

        Raises:
            redis.RedisError: the server could not be asked (the requests stay for the next poll).
        """
        if now_ms >= self.next_list_ms:
            self.next_list_ms = now_ms + LIST_MS
            self.users = self._bound_users()
            self._foreign.clear()  # a planted key removed since: its requests are read again
        if not self.users:
            return 0
        pending = self._read(self.users)
        if not pending or not self._lock():
            return 0
        try:
            grants = read_grants(self.client, self.settings.qm)
            done = 0
            for client_id, entries in pending.items():
                for entry_id, raw in entries:
                    self.answer(client_id, entry_id, raw, grants)
                    done += 1
            return done
        finally:
            self._unlock()

    def _bound_users(self) -> dict[str, list[str]]:
        users: dict[str, list[str]] = {}
        for raw_user, raw in self.client.hgetall(keys.acl_users(self.settings.qm)).items():
            try:
                spec = RoleSpec.from_json(raw)
            except (ValueError, TypeError):
                continue
            if spec.role == "subscriber" and spec.client_id and ":" not in spec.client_id:
                users.setdefault(spec.client_id, []).append(wire.lenient_text(raw_user))
        return users

    def _read(self, client_ids: Iterable[str]) -> dict[str, list[tuple[str, dict[bytes, bytes]]]]:
        """The waiting requests by client id; a control stream of another type is skipped (logged once)."""
        qm = self.settings.qm
        streams: dict[Any, Any] = {
            keys.control(qm, c): "0" for c in client_ids if keys.control(qm, c) not in self._foreign
        }
        if not streams:
            return {}
        try:
            replies: Any = self.client.xread(streams, count=COUNT)
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            replies = []
            for key in streams:  # one planted key must not stop the others' requests
                try:
                    replies += list(self.client.xread({key: "0"}, count=COUNT) or [])  # type: ignore[arg-type]
                except redis.ResponseError:
                    self._foreign.add(key)
                    log.warning("control stream %s holds another type; its requests are not read", key)
        items = replies.items() if isinstance(replies, dict) else replies or []
        prefix = keys.control_prefix(qm)
        found: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
        for key, entries in items:
            if isinstance(entries, list) and entries and isinstance(entries[0], list):
                entries = entries[0]  # RESP3 shapes
            client_id = wire.lenient_text(key)[len(prefix) :]
            found[client_id] = [(wire.text(eid), dict(fields or {})) for eid, fields in entries]
        return found

    def answer(
        self, client_id: str, entry_id: str, raw: dict[bytes, bytes], grants: Grants | None
    ) -> dict[str, Any]:
        """Decide one request, post the answer and delete the request, in one MULTI. Never raises but
        for a lost connection (the request is then read again)."""
        qm = self.settings.qm
        key, problem = reply_key(qm, client_id, entry_id, raw)
        try:
            if problem is not None:
                raise InvalidMessage(problem)
            result = self.decide(client_id, parse_request(raw), grants)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except BrokerError as exc:
            result = {"ok": False, "error": str(exc), "kind": type(exc).__name__, "exit_code": exc.exit_code}
            level = logging.WARNING if isinstance(exc, NotAuthorized) else logging.INFO
            (security_log if isinstance(exc, NotAuthorized) else log).log(
                level, "control request %s of client id %s refused: %s", entry_id, client_id, exc
            )
        except Exception as exc:  # a bug must not stop the worker, nor the request be read forever
            log.exception("control request %s of client id %s could not be handled", entry_id, client_id)
            result = {"ok": False, "error": f"internal error: {exc!r}", "kind": "internal", "exit_code": 1}
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(key, json.dumps(result, separators=(",", ":")))
        pipe.pexpire(key, self.settings.reply_ttl_ms)
        pipe.xdel(keys.control(qm, client_id), entry_id)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception):  # an answer key of another type: the request is gone still
                log.warning(
                    "control request %s of client id %s: answer not posted on %s: %s",
                    entry_id,
                    client_id,
                    key,
                    reply,
                )
                break
        return result

    def decide(self, client_id: str, fields: dict[str, str], grants: Grants | None) -> dict[str, Any]:
        """The answer to a parsed request (``{"ok": true, ...}``), its subscription made or removed.

        Raises:
            InvalidMessage, InvalidName, InvalidTopicFilter, InvalidSelector: a malformed request.
            NotAuthorized: a user bound to the client id may not subscribe to the filter.
            SubscriptionRefused, SubscriptionConflict, TooManySubscriptions, NoSuchSubscription: as
                ``subscribe`` / ``unsubscribe`` raise them.
        """
        qm, settings = self.settings.qm, self.settings
        name = fields.get("name")
        if name is not None:
            check_name("subscription name", name)
        if fields["op"] == "unsubscribe":
            if name is None:
                raise InvalidMessage("an unsubscribe request needs the field 'name'")
            sub_id = f"{client_id}${name}"
            unsubscribe(self.client, qm, sub_id)
            log.info("control request: subscription %s removed for client id %s", sub_id, client_id)
            return {"ok": True, "subscription": sub_id, "removed": True}
        topic = fields.get("topic")
        if not topic:
            raise InvalidMessage("a subscribe request needs the field 'topic'")
        durable, no_local = _flag(fields, "durable"), _flag(fields, "no_local")
        retained = _flag({"retained": fields.get("retained", "1")}, "retained")
        if durable and name is None:
            raise InvalidMessage("a durable subscription needs the field 'name'")
        scheme = recorded_scheme(self.client, qm)
        if scheme == "mqtt" and topic.startswith(SHARE_PREFIX):
            raise SubscriptionRefused(
                "a shared subscription ($share/) is made by an admin user, not by request", ""
            )
        validate_grant_filter(topic, scheme)
        if grants is not None:
            for user in self.users.get(client_id, []):
                if not grants.may_subscribe(user, topic):
                    raise NotAuthorized(
                        f"not authorized: user {user} (client id {client_id}) may not subscribe to {topic!r}: "
                        "no subscribe grant of it covers that filter ('broker acl list' shows them)"
                    )
        record = subscribe(
            self.client,
            qm,
            topic,
            client_id,
            name if durable else None,
            name=name,
            selector=fields.get("selector") or None,
            no_local=no_local,
            retained=retained,
            settings=settings,  # its queue controllers, scheme and limits, as ``broker subscribe``
        )
        log.info("control request: subscription %s made for client id %s", record.sub_id, client_id)
        return {"ok": True, "subscription": record.sub_id, "record": json.loads(record.to_json())}

    def _lock(self) -> bool:
        return bool(self.client.set(keys.control_lock(self.settings.qm), self.name, nx=True, px=LOCK_MS))

    def _unlock(self) -> None:
        key = keys.control_lock(self.settings.qm)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                if pipe.get(key) == self.name.encode():
                    pipe.multi()
                    pipe.delete(key)
                    pipe.execute()
            except redis.WatchError:
                pass  # taken by another worker meanwhile (this one's lease ran out): its lock now
