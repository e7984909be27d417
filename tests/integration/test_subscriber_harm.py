"""Issue 27's "Done when": after a subscriber tries every harmful operation, delivery to every other
subscription goes on, with nothing lost and no dead letter removed.

A subscriber user (``broker.operations.acl``, security on: the publisher publishes through its own
ingress stream) tries each harmful operation of the issue's probe as that user: destroy the dead
letters, plant keys of another type on keys shared by every subscription and on its own
subscription's keys, forge a dead letter, write other clients' keys and the registries, and, only
when its ACL lets it, run a busy loop in ``EVAL`` under a short ``busy-reply-threshold``. Then a
publisher's publications must reach every *other* subscription (counted, consumed by their own
consumers), and every dead letter the broker wrote before must still be there. Workers are
``broker.testing``'s, in the test's process, driven round by round; the consumers' clock is
injected; nothing sleeps.

One test per harmful operation, then one with all of them. The subscriber has no write on
``{qm}:dlq``, ``{qm}:expired``, ``{qm}:last_active`` and no scripts of its own; a subscription whose
own queue holds another type is unavailable, not a refusal for everyone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import BrokerError
from broker.core.server import Server
from broker.operations.acl import RoleSpec
from broker.testing import drain, make_workers, wait_for
from broker.topics.subscriptions import SubscriptionRecord, subscribe
from tests.integration.test_security import Users

QM = "TEST"
EVIL, GOOD = "harm-evil", ("harm-good1", "harm-good2")
PUBLISHER, PUBLISHER_ID = "harm-pub", "svc-h"
#: The consumers' clock, ms since the epoch (injected: no consumer reads the wall clock).
NOW_MS = 1_800_000_000_000
BUSY_LOOP = "while true do end"
#: The body of the dead letter the subscriber forges: it must not be in the dead-letter queue after.
FORGED = b"forged by a subscriber"


@dataclass
class Scene:
    """The harmed queue manager: subscriptions, the subscriber user, and the harm seen so far."""

    admin: redis.Redis
    evil: redis.Redis
    users: Users
    server: Server
    evil_sub: SubscriptionRecord
    good_subs: list[SubscriptionRecord]
    #: what went wrong, in words (empty: no harm)
    harms: list[str] = field(default_factory=list)

    def raw(self, user: str) -> redis.Redis:
        """A client of ``user`` with no retries and one connection (a busy server answers BUSY at once)."""
        return redis.Redis(
            port=self.server.port,
            username=user,
            password=self.users.passwords.get(user),
            single_connection_client=True,
            retry=Retry(NoBackoff(), 0),
        )


def _plant(key: Callable[[Scene], str]) -> Callable[[Scene], None]:
    """Delete a key and set a string in its place, as the subscriber."""

    def run(scene: Scene) -> None:
        scene.evil.delete(key(scene))
        scene.evil.set(key(scene), "planted")

    return run


def _forge_dead_letter(scene: Scene) -> None:
    # a dead letter claiming another principal's publisher id, addressed to another subscription
    good = scene.good_subs[0].sub_id
    scene.evil.xadd(
        keys.dead_letter(QM),
        {
            "publisher": PUBLISHER_ID,
            "principal": PUBLISHER,
            "topic": "t/a",
            "msgid": "forged-1",
            "body": FORGED,
            "dlq.reason": "forged",
            "dlq.subscription": good,
        },
    )


def _busy_loop(scene: Scene) -> None:
    """EVAL ``while true do end`` as the subscriber, only when its ACL lets it: the server answers
    BUSY to everyone else (recorded as harm) until the test kills the script."""
    user = scene.evil.connection_pool.connection_kwargs["username"]
    answer = scene.admin.execute_command("ACL", "DRYRUN", user, "EVAL", BUSY_LOOP, "0")
    if answer != b"OK":
        raise redis.exceptions.NoPermissionError(f"ACL DRYRUN: {answer!r}")
    before = scene.admin.config_get("busy-reply-threshold")["busy-reply-threshold"]
    scene.admin.config_set("busy-reply-threshold", 20)
    evil, probe = scene.raw(user), scene.raw("default")
    thread = threading.Thread(target=_swallow, args=(evil.eval, BUSY_LOOP, 0))
    thread.start()
    try:
        wait_for(lambda: _busy(probe), timeout_s=10, what="the subscriber's busy loop to freeze the server")
        scene.harms.append("EVAL of a busy loop: every other client was answered BUSY")
    finally:
        while _busy(probe):
            _swallow(probe.script_kill)
        thread.join(timeout=10)
        evil.close()
        probe.close()
        scene.admin.config_set("busy-reply-threshold", before)


def _busy(probe: redis.Redis) -> bool:
    try:
        probe.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


def _swallow(call: Callable[..., Any], *args: Any) -> None:
    """Call, and let an error reply be (the killed script's, SCRIPT KILL's NOTBUSY)."""
    with contextlib.suppress(redis.RedisError):
        call(*args)


@dataclass(frozen=True)
class Harm:
    """One harmful operation of issue 27's probe, tried as the subscriber user."""

    id: str
    attempt: Callable[[Scene], None]


def _other_queue(scene: Scene) -> str:
    """Another client's subscription queue."""
    return keys.sub_queue(QM, scene.good_subs[0].sub_id)


HARMS: tuple[Harm, ...] = (
    # the broker's dead letters
    Harm("trim-the-dead-letters", lambda s: s.evil.xtrim(keys.dead_letter(QM), maxlen=0)),
    Harm("delete-the-dead-letters", lambda s: s.evil.delete(keys.dead_letter(QM))),
    Harm(
        "rename-the-dead-letters",
        lambda s: s.evil.rename(keys.dead_letter(QM), keys.sub_queue(QM, f"{EVIL}$stolen")),
    ),
    Harm("plant-the-dead-letter-queue", _plant(lambda s: keys.dead_letter(QM))),
    Harm("forge-a-dead-letter", _forge_dead_letter),
    # keys shared by every subscription
    Harm("plant-last-active", _plant(lambda s: keys.last_active(QM))),
    Harm("plant-expired", _plant(lambda s: keys.expired(QM))),
    Harm("busy-loop-in-eval", _busy_loop),
    # its own subscription's keys
    Harm("plant-its-own-queue", _plant(lambda s: keys.sub_queue(QM, s.evil_sub.sub_id))),
    Harm("plant-its-own-bell", _plant(lambda s: keys.sub_bell(QM, s.evil_sub.sub_id))),
    Harm("plant-its-own-inflight-list", _plant(lambda s: keys.sub_inflight(QM, s.evil_sub.sub_id))),
    Harm("plant-its-own-consumers", _plant(lambda s: keys.sub_consumers(QM, s.evil_sub.sub_id))),
    # other clients' keys and the registries
    Harm("plant-another-clients-queue", _plant(_other_queue)),
    Harm("forge-into-another-clients-queue", lambda s: s.evil.rpush(_other_queue(s), b"forged")),
    Harm("plant-another-clients-bell", _plant(lambda s: keys.sub_bell(QM, s.good_subs[0].sub_id))),
    Harm(
        "remove-a-subscription-record", lambda s: s.evil.hdel(keys.subscriptions(QM), s.good_subs[0].sub_id)
    ),
    Harm("plant-the-subscription-registry", _plant(lambda s: keys.subscriptions(QM))),
    Harm("plant-the-index-version", _plant(lambda s: keys.version(QM))),
    Harm("bind-a-publisher-id-to-itself", lambda s: s.evil.hset(keys.principals(QM), EVIL, PUBLISHER_ID)),
    Harm("make-itself-admin", lambda s: s.evil.hset(keys.acl_users(QM), EVIL, '{"role":"admin"}')),
    Harm("publish-on-the-publish-stream", lambda s: s.evil.xadd(keys.publish_stream(QM), {"topic": "t/a"})),
)


def _given(real_redis: redis.Redis, real_server: Server, users: Users) -> Scene:
    """Three subscriptions on ``t/a``'s filters (the subscriber's own and two others), made by the admin."""
    evil_sub = subscribe(real_redis, QM, "t/#", EVIL, "d")
    goods = [subscribe(real_redis, QM, "t/#", GOOD[0], "d"), subscribe(real_redis, QM, "t/a", GOOD[1], "d")]
    evil = users.add(EVIL, RoleSpec("subscriber", client_id=EVIL))
    return Scene(real_redis, evil, users, real_server, evil_sub, goods)


def _publish(publisher: Publisher, bodies: list[bytes]) -> None:
    for body in bodies:
        publisher.publish("t/a", body, msgid=body.decode())


def _run_workers(scene: Scene, workers: list[Any]) -> None:
    """Drain the workers; a worker that stops (a foreign key) or never finishes is harm."""
    try:
        drain(workers, max_rounds=200)
    except (BrokerError, AssertionError) as exc:
        scene.harms.append(f"the workers stopped: {type(exc).__name__}: {exc}")


def _consume(
    scene: Scene, record: SubscriptionRecord, client: redis.Redis, settings: Settings
) -> list[bytes]:
    """What the subscription's own consumer receives (and acknowledges); an error is harm."""
    try:
        consumer = Subscriber(
            client, QM, record, settings, consumer_id="c1", heartbeat=False, clock_ms=lambda: NOW_MS
        )
        try:
            got = consumer.receive_many(1000)
            consumer.ack_many(got)
        finally:
            consumer.close()
    except (BrokerError, redis.RedisError) as exc:
        scene.harms.append(f"{record.sub_id}'s consumer failed: {type(exc).__name__}: {exc}")
        return []
    return [delivery.message.body for delivery in got]


def _dead_letters(scene: Scene) -> dict[bytes, dict[bytes, bytes]]:
    try:
        return dict(scene.admin.xrange(keys.dead_letter(QM)))
    except redis.RedisError as exc:
        scene.harms.append(f"the dead letters cannot be read: {exc}")
        return {}


def _after_harm(scene: Scene, harms: tuple[Harm, ...], settings: Settings) -> tuple[list[str], list[str]]:
    """Publish, let the subscriber try ``harms``, publish again, run the workers and consume.

    Returns:
        The harm seen (empty: none), and the harmful operations the ACL let through.
    """
    # Given a publisher user publishing through its ingress, workers, and two dead letters the broker wrote
    client = scene.users.add(PUBLISHER, RoleSpec("publisher", [PUBLISHER_ID]))
    publisher = Publisher(client, QM, PUBLISHER_ID, principal=PUBLISHER)
    workers = make_workers(scene.admin, settings, 2)
    before = [f"before-{i}".encode() for i in range(3)]
    _publish(publisher, before)
    Publisher(client, QM, "svc-not-bound", flow_control=False, principal=PUBLISHER).publish(
        "t/a", b"impersonated"
    )
    Publisher(client, QM, PUBLISHER_ID, validate=False, principal=PUBLISHER).publish("t/+", b"bad topic")
    drain(workers)
    written = _dead_letters(scene)
    assert len(written) == 2 and scene.harms == []
    # When the subscriber tries each harmful operation (its ACL refuses some: NOPERM)
    allowed = []
    for harm in harms:
        try:
            harm.attempt(scene)
            allowed.append(harm.id)
        except redis.exceptions.NoPermissionError:
            pass
        except redis.RedisError:  # let through by the ACL, failed for another reason
            allowed.append(harm.id)
    # ... and the publisher publishes again, the workers run, every other subscription's consumer takes
    after = [f"after-{i}".encode() for i in range(5)]
    _publish(publisher, after)
    _run_workers(scene, workers)
    good_client = scene.users.add(GOOD[0], RoleSpec("subscriber", client_id=GOOD[0]))
    for record, consumer_client in zip(scene.good_subs, (good_client, scene.admin), strict=True):
        got = _consume(scene, record, consumer_client, settings)
        if got != before + after:
            scene.harms.append(f"{record.sub_id} received {len(got)} of {len(before + after)}: {got!r}")
    # (the dead letters the broker wrote are all still there, and none was forged)
    now = _dead_letters(scene)
    removed = [entry for entry, fields in written.items() if now.get(entry) != fields]
    if removed:
        scene.harms.append(f"dead letters the broker wrote were removed or changed: {removed!r}")
    if any(fields.get(b"body") == FORGED for fields in now.values()):
        scene.harms.append("a forged dead letter is in the dead-letter queue")
    return scene.harms, allowed


@pytest.mark.parametrize("harm", [pytest.param(h, id=h.id) for h in HARMS])
def test_a_subscribers_harmful_operation_stops_no_other_subscriptions_delivery(
    real_redis: redis.Redis, real_server: Server, users: Users, settings: Settings, harm: Harm
) -> None:
    # Given a subscriber user with a subscription beside two others; When it tries the operation
    scene = _given(real_redis, real_server, users)
    harms, _ = _after_harm(scene, (harm,), settings)
    # Then every other subscription received every publication, and no broker dead letter was removed
    assert harms == []


def test_after_a_subscriber_tries_every_harmful_operation_delivery_to_every_other_subscription_goes_on(
    real_redis: redis.Redis, real_server: Server, users: Users, settings: Settings
) -> None:
    # Given a subscriber user with a subscription beside two others; When it tries every operation
    scene = _given(real_redis, real_server, users)
    harms, _ = _after_harm(scene, HARMS, settings)
    # Then every other subscription received every publication, and no broker dead letter was removed
    assert harms == []


def test_the_subscribers_acl_refuses_the_harmful_operations_on_other_clients_keys_and_the_registries(
    real_redis: redis.Redis, real_server: Server, users: Users, settings: Settings
) -> None:
    # Given a subscriber user; When it tries every harmful operation on keys that are not its own
    scene = _given(real_redis, real_server, users)
    not_its_own = tuple(h for h in HARMS if "its-own" not in h.id)
    harms, allowed = _after_harm(scene, not_its_own, settings)
    # Then its ACL refused every one (NOPERM), and nothing was harmed
    assert allowed == []
    assert harms == []
