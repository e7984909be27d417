"""Subscribing as a request: the subscriber's side of the control streams (seed 000).

With security on, a subscriber user may not write the subscription registry; it asks the broker
for a subscription with one ``FCALL broker_request`` (an ``XADD`` to its control stream
``{qm}:ctl:<client id>``, ``lua/library/control.lua``) and waits for
the answer with ``BLPOP {qm}:ctl:<client id>:reply:<request id>`` (the fields and the answer:
``broker.operations.control``, which the workers run). ``broker subscribe`` uses it when the
URL's user may not write ``{qm}:subs`` (a subscriber user); an admin, or any user without
security, makes its subscriptions directly, as before.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

from broker.core import keys
from broker.core.connection import block_slice_ms
from broker.core.errors import ConnectionLost, ReplyTimeout, RequestRefused, ServerError
from broker.core.library import fcall
from broker.topics.subscriptions import SubscriptionRecord

#: How long a request waits for its answer by default, ms (the workers look every 200 ms).
DEFAULT_TIMEOUT_MS = 10_000


def request(
    client: redis.Redis, qm: str, client_id: str, fields: dict[str, str], timeout_ms: int
) -> dict[str, Any]:
    """Send one control request and wait for its answer.

    Args:
        fields: the request's fields (``op``, ``topic``, ``name``...; ``reply`` is added).
        timeout_ms: how long to wait for the answer, ms.

    Returns:
        The answer (``{"ok": true, "subscription": ..., ...}``).

    Raises:
        RequestRefused: the broker answered with an error (its kind and exit code kept).
        ReplyTimeout: no answer within ``timeout_ms`` (no worker with ``security = true`` running).
        ConnectionLost, ServerError: the server could not be reached, or refused the command
            (a user whose ACL lacks this client id's control stream).
    """
    request_id = uuid.uuid4().hex[:16]
    reply = keys.control_reply(qm, client_id, request_id)
    deadline = time.monotonic() + timeout_ms / 1000
    got = None
    try:
        pairs = [part for field, value in {**fields, "reply": request_id}.items() for part in (field, value)]
        fcall(client, "broker_request", keys.control(qm, client_id), *pairs)
        while got is None:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            # in slices: one BLPOP longer than the socket timeout would fail as a lost connection
            slice_s: Any = min(left_ms, block_slice_ms(client)) / 1000
            got = client.blpop([reply], timeout=slice_s)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ConnectionLost(f"control request of client id {client_id} failed: {exc}") from exc
    except redis.ResponseError as exc:
        raise ServerError(f"control request refused by the server: {exc}") from exc
    if got is None:
        raise ReplyTimeout(
            f"no answer to the {fields.get('op')} request of client id {client_id} within {timeout_ms} ms "
            "(are workers running with security = true?)"
        )
    try:
        answer = json.loads(got[1])
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise RequestRefused(f"the answer to the control request is not JSON: {exc}") from exc
    if answer.get("ok") is not True:
        code = answer.get("exit_code")
        raise RequestRefused(
            f"{fields.get('op')} refused by the broker: {answer.get('error', 'no reason given')}",
            str(answer.get("kind", "")),
            code if isinstance(code, int) and code > 0 else 3,
        )
    return answer


def request_subscription(
    client: redis.Redis,
    qm: str,
    topic_filter: str,
    client_id: str,
    durable_name: str | None = None,
    *,
    selector: str | None = None,
    no_local: bool = False,
    name: str | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    retained: bool = True,
) -> SubscriptionRecord:
    """Ask the broker for a subscription (``broker.topics.subscriptions.subscribe``'s meaning), checked
    against the grants of the client id's users; returns its record (attach with ``Subscriber``).

    Args:
        durable_name: the durable subscription's name; None: a non-durable one (named ``name``, or
            ``nd-<hex>``).
        timeout_ms: how long to wait for the answer, ms.
        retained: a new subscription receives the retained publications its filter matches
            (``broker.topics.retained``); False: none (the field ``retained 0``).

    Raises:
        RequestRefused: refused (``kind`` ``NotAuthorized``: outside the grants, exit code 3; an
            invalid filter or selector: exit code 2; ...).
        ReplyTimeout, ConnectionLost, ServerError: as ``request``.
    """
    fields = {"op": "subscribe", "topic": topic_filter, "durable": "1" if durable_name is not None else "0"}
    chosen = durable_name if durable_name is not None else name
    if chosen is not None:
        fields["name"] = chosen
    if selector:
        fields["selector"] = selector
    if no_local:
        fields["no_local"] = "1"
    if not retained:
        fields["retained"] = "0"
    answer = request(client, qm, client_id, fields, timeout_ms)
    try:
        return SubscriptionRecord.from_json(str(answer["subscription"]), json.dumps(answer["record"]), qm)
    except (KeyError, ValueError) as exc:
        raise RequestRefused(f"the answer to the subscribe request lacks its subscription: {exc}") from exc


def request_unsubscribe(
    client: redis.Redis, qm: str, client_id: str, name: str, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> str:
    """Ask the broker to remove subscription ``<client id>$<name>``; returns its id.

    Raises:
        RequestRefused: refused (``kind`` ``NoSuchSubscription``...). ReplyTimeout, ConnectionLost,
            ServerError: as ``request``.
    """
    answer = request(client, qm, client_id, {"op": "unsubscribe", "name": name}, timeout_ms)
    return str(answer.get("subscription", f"{client_id}${name}"))
