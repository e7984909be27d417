"""Per-topic authorization and subscribing as a request, on a real server with security on
(issue 27 parts 3 and 4; ``broker.topics.grants``, ``broker.operations.grants``,
``broker.operations.control``, ``broker.clients.control``; docs/security.md).

Every user is a real ACL user made with ``broker.operations.acl.add_user`` (``test_security.Users``);
the workers run in the test's process as a worker user with ``security = true``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from broker.clients.consumer import Subscriber
from broker.clients.control import request_subscription, request_unsubscribe
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import BrokerError, NoSuchGrant, RequestRefused
from broker.core.server import Server
from broker.operations.acl import RoleSpec
from broker.operations.grants import grant, list_grants, revoke
from broker.testing import make_workers
from broker.topics.subscriptions import list_subscriptions, subscribe
from broker.topics.topic_objects import define
from tests.integration.test_security import Users, broker_as
from worker.loop import Worker

QM = "TEST"


@pytest.fixture
def secure(settings: Settings) -> Settings:
    return settings.model_copy(update={"security": True})


def _worker(users: Users, settings: Settings) -> Worker:
    (worker,) = make_workers(users.add("g-wk", RoleSpec("worker")), settings, 1)
    return worker


def _while(worker: Worker, act: Callable[[], Any]) -> Any:
    """``act()`` in a thread (it waits for an answer) while ``worker`` runs rounds; its result or error."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(act())
        except Exception as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    while thread.is_alive():
        worker.run_once(block=True)
        thread.join(timeout=0)
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


@contextlib.contextmanager
def _serving(worker: Worker) -> Iterator[None]:
    """``worker`` runs rounds in a thread while the body runs in the main one (a CLI command that
    installs signal handlers)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            worker.run_once(block=True)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- publish grants, enforced by the workers ------------------------------------------------------


def test_workers_refuse_a_publication_outside_its_principals_publish_grants(
    real_redis: redis.Redis, users: Users, secure: Settings
) -> None:
    # Given a subscription to everything, a topic object at orders/eu, two publishers and a worker
    admin = real_redis
    everything = subscribe(admin, QM, "#", "c1", "all")
    define(admin, QM, "ORDERS.EU", "orders/eu")
    users.add("g-pub", RoleSpec("publisher", ["svc-7"]))
    users.add("g-free", RoleSpec("publisher", ["svc-9"]))
    worker = _worker(users, secure)
    pub = Publisher(users.client("g-pub"), QM, "svc-7", principal="g-pub")
    free = Publisher(users.client("g-free"), QM, "svc-9", principal="g-free")

    def publish(publisher: Publisher, topic: str) -> str:
        result = _while(worker, lambda: publisher.publish(topic, b"x", wait=True, timeout_ms=10_000))
        return str(result.status) if result.reason is None else f"{result.status}: {result.reason}"

    # Without grants: as before
    assert publish(pub, "orders/us/1") == "delivered"
    # When g-pub is granted a wildcard filter and a topic object (its subtree)
    grant(admin, QM, "g-pub", publish=["news/+"], publish_objects=["ORDERS.EU"])
    # Then it publishes inside them only; outside is refused with the reason, answered and dead-lettered
    assert publish(pub, "news/sport") == "delivered"
    assert publish(pub, "orders/eu") == "delivered"
    assert publish(pub, "orders/eu/fr/9") == "delivered"
    depth = admin.llen(keys.sub_queue(QM, everything.sub_id))
    assert (
        publish(pub, "orders/us/1")
        == "refused: not authorized: principal g-pub may not publish on 'orders/us/1'"
    )
    assert (
        publish(pub, "news/sport/today")
        == "refused: not authorized: principal g-pub may not publish on 'news/sport/today'"
    )
    assert admin.llen(keys.sub_queue(QM, everything.sub_id)) == depth
    _, dead = admin.xrange(keys.dead_letter(QM))[-1]
    assert dead[b"topic"] == b"news/sport/today" and dead[b"principal"] == b"g-pub"
    assert dead[b"dlq.reason"] == b"not authorized: principal g-pub may not publish on 'news/sport/today'"
    # ... while a principal without grants still publishes anywhere
    assert publish(free, "orders/us/1") == "delivered"
    # When the topic object's grant is revoked, its subtree is refused; with every grant revoked, nothing is
    revoke(admin, QM, "g-pub", publish_objects=["ORDERS.EU"])
    assert publish(pub, "orders/eu/fr/9").startswith("refused: not authorized")
    revoke(admin, QM, "g-pub", everything=True)
    assert publish(pub, "orders/us/1") == "delivered"
    assert list_grants(admin, QM) == ({}, [])


def test_a_grant_change_bumps_the_version_and_bad_input_writes_nothing(
    real_redis: redis.Redis, users: Users
) -> None:
    admin = real_redis
    users.add("g-pub", RoleSpec("publisher", ["svc-7"]))
    before = int(admin.get(keys.version(QM)) or 0)
    grant(admin, QM, "g-pub", publish=["a/#"], subscribe=["b/+"])
    assert int(admin.get(keys.version(QM))) == before + 1
    stored = json.loads(admin.hget(keys.grants(QM), "g-pub"))
    assert stored == {"publish": ["a/#"], "subscribe": ["b/+"]}
    # Bad input: an invalid filter, a missing topic object, an unknown user, a grant it does not have
    snapshot = (admin.hgetall(keys.grants(QM)), admin.get(keys.version(QM)))
    for bad in (
        lambda: grant(admin, QM, "g-pub", publish=["a/#/b"]),
        lambda: grant(admin, QM, "g-pub", publish=["ok/#"], subscribe=["$share/x/y"]),
        lambda: grant(admin, QM, "g-pub", publish_objects=["NOPE"]),
        lambda: grant(admin, QM, "nobody", publish=["a"]),
        lambda: grant(admin, QM, "g-pub"),
    ):
        with pytest.raises(BrokerError):
            bad()
    with pytest.raises(NoSuchGrant):
        revoke(admin, QM, "g-pub", publish=["a/#", "zzz"])
    assert (admin.hgetall(keys.grants(QM)), admin.get(keys.version(QM))) == snapshot


# --- subscribing as a request ---------------------------------------------------------------------


def _request(client: redis.Redis, client_id: str, **fields: Any) -> str:
    return client.xadd(keys.control(QM, client_id), fields).decode()


def _answer(admin: redis.Redis, client_id: str, request_id: str) -> dict[str, Any]:
    found = admin.lpop(keys.control_reply(QM, client_id, request_id))
    assert found is not None, f"no answer to {request_id}"
    return json.loads(found)


def test_a_subscriber_asks_for_a_subscription_within_its_grants_and_it_delivers(
    real_redis: redis.Redis, users: Users, secure: Settings
) -> None:
    # Given a subscriber user of client id app1 granted orders/#, a publisher and a worker (security on)
    admin = real_redis
    sub = users.add("g-sub", RoleSpec("subscriber", client_id="app1"))
    users.add("g-pub", RoleSpec("publisher", ["svc-7"]))
    grant(admin, QM, "g-sub", subscribe=["orders/#"])
    worker = _worker(users, secure)
    # Then it may not write the registry itself
    with pytest.raises(redis.exceptions.NoPermissionError):
        sub.hset(keys.subscriptions(QM), "app1$x", '{"filter":"#","durable":true,"created_ms":0}')
    # When it asks for a durable subscription within its grants
    record = _while(
        worker, lambda: request_subscription(sub, QM, "orders/eu/#", "app1", "eu", timeout_ms=10_000)
    )
    # Then it is made as app1$eu, and delivers what is published on it
    assert (record.sub_id, record.topic_filter, record.durable) == ("app1$eu", "orders/eu/#", True)
    assert admin.hexists(keys.subscriptions(QM), "app1$eu")
    publisher = Publisher(users.client("g-pub"), QM, "svc-7", principal="g-pub")
    assert _while(worker, lambda: publisher.publish("orders/eu/1", b"hello", wait=True)).status == "delivered"
    consumer = Subscriber(sub, QM, record, secure, heartbeat=False)
    delivery = consumer.receive(timeout_ms=1)
    assert delivery is not None and delivery.message.body == b"hello"
    consumer.ack(delivery)
    consumer.close()
    # When it asks outside its grants: refused with a clear answer, nothing made
    with pytest.raises(RequestRefused) as refused:
        _while(worker, lambda: request_subscription(sub, QM, "orders2/#", "app1", "o2", timeout_ms=10_000))
    assert refused.value.kind == "NotAuthorized" and refused.value.exit_code == 3
    assert "not authorized: user g-sub (client id app1) may not subscribe to 'orders2/#'" in str(
        refused.value
    )
    assert not admin.hexists(keys.subscriptions(QM), "app1$o2")
    with pytest.raises(RequestRefused, match="not authorized"):  # wider than its grant
        _while(worker, lambda: request_subscription(sub, QM, "#", "app1", "all", timeout_ms=10_000))
    # And it removes its subscription by request
    assert _while(worker, lambda: request_unsubscribe(sub, QM, "app1", "eu", timeout_ms=10_000)) == "app1$eu"
    assert not admin.hexists(keys.subscriptions(QM), "app1$eu")


def test_a_subscriber_requests_a_subscription_with_one_fcall_of_the_library(
    real_redis: redis.Redis, users: Users, secure: Settings
) -> None:
    # Given a subscriber user of client id app1 and a worker with security on
    sub = users.add("g-fsub", RoleSpec("subscriber", client_id="app1"))
    worker = _worker(users, secure)
    # When it asks with FCALL broker_request (its own control stream), with and without a request id
    _, answer_key = sub.fcall(
        "broker_request", 1, keys.control(QM, "app1"), "op", "subscribe", "name", "a", "topic", "a/#",
        "durable", "1", "reply", "r1",
    )  # fmt: skip
    entry2, answer2 = sub.fcall(
        "broker_request", 1, keys.control(QM, "app1"), "op", "subscribe", "name", "b", "topic", "b/#"
    )
    # Then the answers' keys are those the broker answers on: the request id, else the entry id
    assert answer_key == keys.control_reply(QM, "app1", "r1").encode()
    assert answer2 == keys.control_reply(QM, "app1", entry2.decode()).encode()
    assert worker.housekeeping.serve_requests(0) == 2
    assert json.loads(sub.blpop([answer_key], 1)[1])["subscription"] == "app1$a"
    assert json.loads(sub.blpop([answer2], 1)[1])["ok"] is True
    assert sorted(r.sub_id for r in list_subscriptions(real_redis, QM)) == ["app1$a", "app1$b"]
    # and another client's control stream, or a key that is not one, is refused before any write
    with pytest.raises(redis.exceptions.NoPermissionError):
        sub.fcall("broker_request", 1, keys.control(QM, "app2"), "op", "subscribe", "topic", "x")
    with pytest.raises(redis.ResponseError, match="not a control stream"):
        sub.fcall("broker_request", 1, keys.sub_queue(QM, "app1$a"), "op", "subscribe", "topic", "x")
    with pytest.raises(redis.ResponseError, match="field, value pairs"):
        sub.fcall("broker_request", 1, keys.control(QM, "app1"), "op")
    assert real_redis.xlen(keys.control(QM, "app1")) == 0


def test_a_malformed_request_is_answered_with_an_error_once_and_removed(
    real_redis: redis.Redis, users: Users, secure: Settings
) -> None:
    admin = real_redis
    sub = users.add("g-sub", RoleSpec("subscriber", client_id="app1"))
    worker = _worker(users, secure)
    asked = {
        "op": _request(sub, "app1", op="bogus", reply="r1"),
        "topic": _request(sub, "app1", op="subscribe", reply="r2"),
        "filter": _request(sub, "app1", op="subscribe", topic="a/#/b", reply="r3"),
        "field": _request(sub, "app1", op="subscribe", topic="a", colour="red", reply="r4"),
        "durable": _request(sub, "app1", op="subscribe", topic="a", durable="1", reply="r5"),
        "utf8": _request(sub, "app1", op="subscribe", topic=b"\xff", reply="r6"),
        "share": _request(sub, "app1", op="subscribe", topic="$share/g/a", name="s", reply="r7"),
        "selector": _request(sub, "app1", op="subscribe", topic="a", selector="a = ", reply="r8"),
    }
    bad_reply = _request(sub, "app1", op="subscribe", topic="a", reply="no:colons")
    assert worker.housekeeping.serve_requests(0) == len(asked) + 1
    assert 0 < admin.pttl(keys.control_reply(QM, "app1", "r1")) <= secure.reply_ttl_ms  # answers expire
    answers = {what: _answer(admin, "app1", f"r{i}") for i, what in enumerate(asked, 1)}
    assert all(a["ok"] is False for a in answers.values()), answers
    assert "field 'op' must be subscribe or unsubscribe" in answers["op"]["error"]
    assert "needs the field 'topic'" in answers["topic"]["error"]
    assert answers["filter"]["kind"] == "InvalidTopicFilter" and answers["filter"]["exit_code"] == 2
    assert "unknown field 'colour'" in answers["field"]["error"]
    assert "durable subscription needs the field 'name'" in answers["durable"]["error"]
    assert "must be UTF-8" in answers["utf8"]["error"]
    assert "shared subscription" in answers["share"]["error"]
    assert answers["selector"]["kind"] == "InvalidSelector"
    assert "field 'reply' must be" in _answer(admin, "app1", bad_reply)["error"]
    # Each is removed once answered: nothing is read again, and nothing was made
    assert admin.xlen(keys.control(QM, "app1")) == 0
    assert worker.housekeeping.serve_requests(0) == 0
    assert admin.hlen(keys.subscriptions(QM)) == 0


def test_a_subscriber_cannot_use_another_clients_control_stream_and_its_planted_key_stops_no_one(
    real_redis: redis.Redis, users: Users, secure: Settings
) -> None:
    admin = real_redis
    sub = users.add("g-sub", RoleSpec("subscriber", client_id="app1"))
    evil = users.add("g-evil", RoleSpec("subscriber", client_id="app2"))
    worker = _worker(users, secure)
    # Another client's control stream and answers are out of reach
    for command in (
        ("XADD", keys.control(QM, "app1"), "*", "op", "subscribe", "topic", "#"),
        ("XRANGE", keys.control(QM, "app1"), "-", "+"),
        ("BLPOP", keys.control_reply(QM, "app1", "r1"), "0.01"),
        ("HSET", keys.grants(QM), "g-evil", "{}"),
        ("SET", keys.control_lock(QM), "x"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            evil.execute_command(*command)
    # Its own control stream of another type (and an answer key planted) stops no other client
    evil.set(keys.control(QM, "app2"), "planted")
    request_id = _request(sub, "app1", op="subscribe", topic="a/#", name="a", durable="1", reply="r1")
    assert request_id and worker.housekeeping.serve_requests(0) == 1
    assert _answer(admin, "app1", "r1")["subscription"] == "app1$a"
    evil.delete(keys.control(QM, "app2"))
    evil.set(keys.control_reply(QM, "app2", "r2"), "planted")
    _request(evil, "app2", op="subscribe", topic="b/#", name="b", durable="1", reply="r2")
    _request(sub, "app1", op="subscribe", topic="c/#", name="c", durable="1", reply="r3")
    worker.housekeeping.next_control_ms = 0
    worker.housekeeping.control.next_list_ms = 0  # type: ignore[union-attr]
    assert worker.housekeeping.serve_requests(0) == 2
    assert admin.xlen(keys.control(QM, "app2")) == 0  # its request is gone, its answer not posted
    assert _answer(admin, "app1", "r3")["ok"] is True


def test_without_security_the_workers_answer_no_request(real_redis: redis.Redis, settings: Settings) -> None:
    (worker,) = make_workers(real_redis, settings, 1)
    assert worker.housekeeping.control is None
    assert worker.housekeeping.serve_requests(0) == 0


def test_cli_grant_list_revoke_and_subscribe_as_a_subscriber_user(
    real_redis: redis.Redis, users: Users, secure: Settings, real_server: Server
) -> None:
    admin = real_redis
    users.add("g-admin", RoleSpec("admin"))
    users.add("g-sub", RoleSpec("subscriber", client_id="app1"))
    worker = _worker(users, secure)
    env = {"BROKER_SECURITY": "true"}
    as_admin = users.url("g-admin")
    granted = broker_as(
        as_admin, "acl", "grant", "g-sub", "--subscribe", "t/#", "--subscribe", "u/+", env=env
    )
    assert granted.exit_code == 0, granted.output
    assert "user g-sub: subscribe t/#, u/+" in granted.stdout
    bad = broker_as(as_admin, "acl", "grant", "g-sub", "--publish", "t/#/x", env=env)
    assert bad.exit_code == 2 and "'#' must be the last level" in bad.stderr
    listed = broker_as(real_server.url, "acl", "list", "--json", env=env)  # ACL GETUSER: the operator
    assert json.loads(listed.stdout)["grants"] == {"g-sub": {"subscribe": ["t/#", "u/+"]}}
    # A subscriber user's `broker subscribe` asks the broker for the subscription
    as_sub = users.url("g-sub")
    with _serving(worker):
        made = broker_as(
            as_sub, "subscribe", "t/a", "--client-id", "app1", "--durable", "d", "--timeout-ms", "1", env=env
        )
        refused = broker_as(
            as_sub, "subscribe", "v/#", "--client-id", "app1", "--durable", "v", "--timeout-ms", "1", env=env
        )
    assert made.exit_code == 0, made.output
    assert "asking the broker for the subscription" in made.stderr
    assert admin.hexists(keys.subscriptions(QM), "app1$d")
    assert refused.exit_code == 3 and "not authorized" in refused.stderr
    revoked = broker_as(as_admin, "acl", "revoke", "g-sub", "--all", env=env)
    assert revoked.exit_code == 0 and "no grants (unrestricted)" in revoked.stdout
