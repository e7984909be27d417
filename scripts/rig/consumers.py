"""Consumer processes for the tests that kill consumers (SIGKILL) mid-batch.

``run_consumer`` attaches a ``Subscriber`` and records every message it gets in
the Redis list ``<log>`` as ``"<consumer>|<msgid>|<delivery count>"`` before
acknowledging it. A *holding* consumer instead takes one batch, records its
msgids in ``<log>:held`` and ``<consumer>`` in ``<log>:holding``, and waits to
be killed without acknowledging anything. ``run_crashing_consumer`` consumes the
same way and SIGKILLs itself at a named crash point (``broker.clients.consumer.CRASH_POINTS``).
"""

from __future__ import annotations

import threading

from broker.clients.consumer import Subscriber
from broker.core.config import Settings
from broker.core.connection import connect
from broker.topics.subscriptions import SubscriptionRecord


def run_consumer(
    url: str, qm: str, sub_id: str, record_json: str, consumer_id: str, lease_ms: int, log: str, hold: int = 0
) -> None:
    """Entry point of a consumer process (spawned).

    Args:
        url: the server.
        qm: the queue manager.
        sub_id, record_json: the subscription (``SubscriptionRecord.to_json``).
        consumer_id: this consumer's id.
        lease_ms: ``consumer_lease_ms``.
        log: the Redis list receipts are recorded in.
        hold: take a batch of this many and hold it until killed (0: consume normally).
    """
    client = connect(url)
    record = SubscriptionRecord.from_json(sub_id, record_json, qm)
    settings = Settings(redis_url=url, qm=qm, consumer_lease_ms=lease_ms)
    subscriber = Subscriber(client, qm, record, settings, consumer_id=consumer_id)
    if hold:
        got = subscriber.receive_many(hold, timeout_ms=30_000)
        if got:
            client.rpush(f"{log}:held", *[d.message.msgid for d in got])
        client.rpush(f"{log}:holding", consumer_id)
        threading.Event().wait()  # until SIGKILL
    while True:
        got = subscriber.receive_many(10, timeout_ms=200)
        if got:
            client.rpush(log, *[f"{consumer_id}|{d.message.msgid}|{d.delivery_count}" for d in got])
            subscriber.ack_many(got)


def run_crashing_consumer(
    url: str,
    qm: str,
    sub_id: str,
    record_json: str,
    consumer_id: str,
    log: str,
    control_dir: str,
    plan_json: str,
) -> None:
    """Entry point of a consumer process that SIGKILLs itself at a crash point (spawned).

    It consumes as ``run_consumer`` does (batches of 10, each recorded in ``<log>`` before it is
    acknowledged), with a ``scripts.rig.hook.CrashHook`` armed with ``plan_json``
    (``{"point": one of broker.clients.consumer.CRASH_POINTS, "after": n}``) as its hook.
    """
    import json

    from scripts.rig.hook import CrashHook

    hook = CrashHook(control_dir)
    plan = json.loads(plan_json)
    hook.plan, hook.point = dict(plan), plan["point"]
    client = connect(url)
    record = SubscriptionRecord.from_json(sub_id, record_json, qm)
    settings = Settings(redis_url=url, qm=qm)
    subscriber = Subscriber(client, qm, record, settings, consumer_id=consumer_id, hook=hook)
    while True:
        got = subscriber.receive_many(10, timeout_ms=200)
        if got:
            client.rpush(log, *[f"{consumer_id}|{d.message.msgid}|{d.delivery_count}" for d in got])
            subscriber.ack_many(got)
