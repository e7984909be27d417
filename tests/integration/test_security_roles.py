"""Issue 27's smaller items, against the real server: what an untrusted role may not forge or hide.

A publisher's ingress entry loses every field only the broker sets (``origin``, ``route``,
``dlq.*``); an impersonation attempt is logged; one publisher id is bound to one principal
(``--move`` moves it); a role's refusals name the role; ``broker status`` says the workers wait on
a foreign key. Every ACL user made here is deleted after its test.
"""

from __future__ import annotations

import json
import logging
import secrets
import time

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import ForeignKey
from broker.core.principals import bindings
from broker.core.server import Server
from broker.operations.acl import RoleSpec, role_of
from broker.operations.status import _EFFECTS, WORKERS_WAIT, status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.subscriptions import subscribe
from tests.integration.test_security import Users, broker_as

QM = "TEST"


# --- 1. fields only the broker sets -----------------------------------------------------------


def test_a_publisher_cannot_forge_origin_route_or_dead_letter_fields_through_its_ingress(
    real_redis: redis.Redis, users: Users, settings: Settings
) -> None:
    # Given a publisher user, a subscription and a worker (security on: the ingress stream)
    sub = subscribe(real_redis, QM, "t/#", "c1", "d")
    client = users.add("sec-pubu", RoleSpec("publisher", ["svc-u"]))
    workers = make_workers(real_redis, settings, 1)
    ingress = keys.ingress(QM, "sec-pubu")
    # When it claims, in its own ingress stream, another queue manager's route and a dead letter's principal
    client.xadd(
        ingress,
        {
            "publisher": "svc-u",
            "topic": "t/a",
            "body": "x",
            "origin": "QM9",
            "route": "QM9,QM8",
            "principal": "someone",
            "dlq.principal": "someone",
        },
    )
    drain(workers)
    # Then the subscriber gets it as published here, by the stream's principal, with no route
    (got,) = queue_messages(real_redis, QM, sub.sub_id)
    assert (got.topic, got.principal, got.origin, got.route) == ("t/a", "sec-pubu", None, ())
    # ... and an entry under an unbound id is dead-lettered without the forged dlq.principal
    client.xadd(ingress, {"publisher": "svc-x", "topic": "t/a", "body": "y", "dlq.principal": "someone"})
    drain(workers)
    _, dead = real_redis.xrange(keys.dead_letter(QM))[-1]
    assert dead[b"dlq.principal"] == b"sec-pubu"
    assert [k for k in dead if k == b"dlq.principal"] == [b"dlq.principal"]
    assert b"origin" not in dead and b"route" not in dead


# --- 3. impersonation attempts are logged -----------------------------------------------------


def test_an_impersonation_attempt_is_logged_at_warning_with_principal_claimed_id_and_entry_id(
    real_redis: redis.Redis, users: Users, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two publisher users, and a worker
    subscribe(real_redis, QM, "t/#", "c1", "d")
    users.add("sec-pub1", RoleSpec("publisher", ["svc-7"]))
    client = users.add("sec-pub2", RoleSpec("publisher", ["svc-8"]))
    workers = make_workers(real_redis, settings, 1)
    # When sec-pub2 publishes under sec-pub1's id, and then under its own
    forged = client.xadd(keys.ingress(QM, "sec-pub2"), {"publisher": "svc-7", "topic": "t/a", "body": "x"})
    with caplog.at_level(logging.WARNING, logger="broker.security"):
        drain(workers)
        Publisher(client, QM, "svc-8", principal="sec-pub2").publish("t/a", b"fine")
        drain(workers)
    # Then one warning names the principal, the id it claimed and the entry, as text and as fields
    (record,) = [r for r in caplog.records if r.name == "broker.security"]
    assert record.levelno == logging.WARNING
    assert "sec-pub2" in record.getMessage() and "'svc-7'" in record.getMessage()
    assert (record.principal, record.publisher, record.entry_id) == ("sec-pub2", "svc-7", forged.decode())


# --- 2. one principal per publisher id ----------------------------------------------------------


def test_acl_add_refuses_a_publisher_id_bound_to_another_user_unless_moved(
    real_server: Server, real_redis: redis.Redis, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given pub1 bound to svc-7 and svc-1
    users.add("sec-p1", RoleSpec("publisher", ["svc-7", "svc-1"]))
    users.passwords["sec-p4"] = "pw4-" + secrets.token_urlsafe(8)
    monkeypatch.setenv("SEC_PW4", users.passwords["sec-p4"])
    url = real_server.url
    add = (
        "acl",
        "add",
        "sec-p4",
        "--role",
        "publisher",
        "--publisher-id",
        "svc-7",
        "--password-env",
        "SEC_PW4",
    )
    # When another user is added with svc-7
    refused = broker_as(url, *add)
    # Then it is refused as a usage error naming the holder, and nothing changed
    assert refused.exit_code == 2, refused.output
    assert "svc-7 to sec-p1" in refused.stderr and "--move" in refused.stderr
    assert bindings(real_redis, QM) == {"sec-p1": ["svc-7", "svc-1"]}
    assert real_redis.execute_command("ACL", "GETUSER", "sec-p4") is None
    # When it is added with --move
    moved = broker_as(url, *add, "--move")
    # Then svc-7 is sec-p4's only: sec-p1 keeps svc-1, and may no longer wait for svc-7's results
    assert moved.exit_code == 0, moved.output
    assert "moved publisher id svc-7 from user sec-p1 to sec-p4" in moved.stdout
    assert bindings(real_redis, QM) == {"sec-p1": ["svc-1"], "sec-p4": ["svc-7"]}
    p1 = users.client("sec-p1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        p1.blpop([keys.reply(QM, "svc-7", "m1")], timeout=0.01)
    assert p1.blpop([keys.reply(QM, "svc-1", "m1")], timeout=0.01) is None
    # ... and moving a user's last id leaves it no binding (its entries are then dead-lettered)
    assert (
        broker_as(url, *add[:-2], "--publisher-id", "svc-1", "--password-env", "SEC_PW4", "--move").exit_code
        == 0
    )
    assert bindings(real_redis, QM) == {"sec-p4": ["svc-7", "svc-1"]}
    listed = broker_as(url, "acl", "list", "--json")
    assert {u["user"]: u["bindings"] for u in json.loads(listed.stdout)["users"]}["sec-p1"] == ""


# --- 6. status says what the workers do about a foreign key -------------------------------------


@pytest.mark.parametrize(
    ("key", "expected", "effect"),
    [
        (keys.dead_letter, "stream", WORKERS_WAIT),
        (keys.principals, "hash", _EFFECTS["principals"]),
        (keys.alive, "zset", WORKERS_WAIT),
        (keys.saturated, "hash", _EFFECTS["saturated"]),
        (keys.active_publishers, "set", WORKERS_WAIT),
    ],
)
def test_status_says_every_worker_waits_on_a_foreign_queue_manager_wide_key(
    real_redis: redis.Redis, settings: Settings, key, expected: str, effect: str
) -> None:
    # Given a subscription, a worker, and a string planted where a queue-manager-wide key belongs
    sub = subscribe(real_redis, QM, "t/#", "c1", "d")
    workers = make_workers(real_redis, settings, 1)
    real_redis.delete(key(QM))
    real_redis.set(key(QM), "planted")
    if key is keys.principals:  # read when the routing table is loaded (any change), not per dequeue
        real_redis.incr(keys.version(QM))
    if key is keys.saturated:  # read while another worker is live
        real_redis.zadd(keys.alive(QM), {"w-other": int(time.time() * 1000)})
    Publisher(real_redis, QM, "p1").publish("t/a", b"x")
    # When the worker runs
    with pytest.raises(ForeignKey):
        workers[0].run_once(block=False)
    # Then nothing was delivered: the worker waits, and status says so (not that it goes on)
    assert queue_messages(real_redis, QM, sub.sub_id) == []
    (line,) = [p for p in status(real_redis, QM).problems if key(QM) in p]
    assert line == f"foreign key: {key(QM)} holds a string, not a {expected}: {effect}"
    assert "go on" not in line and "skip" not in line
    # ... and once the key is removed, the publication is delivered
    real_redis.delete(key(QM))
    drain(workers)
    assert len(queue_messages(real_redis, QM, sub.sub_id)) == 1


def test_status_says_what_happens_for_each_other_foreign_key_kind(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given foreign keys of one subscription (its bell, its in-flight list), one publisher and the waiters
    sub = subscribe(real_redis, QM, "t/#", "c1", "d")
    planted = {
        keys.sub_bell(QM, sub.sub_id): "delivery to every subscription, this one's queue included, goes on",
        keys.sub_inflight(QM, sub.sub_id): "consumers cannot receive or acknowledge",
        keys.fifo_key(QM, "p9"): "this publisher's publications are refused",
        keys.wake(QM): "idle workers wait on the publish stream instead",
    }
    for key in planted:
        real_redis.set(key, "planted")
    # When status looks
    problems = status(real_redis, QM).problems
    # Then each line says what happens to that kind, and none claims every worker goes on
    for key, effect in planted.items():
        (line,) = [p for p in problems if f"{key} holds" in p]
        assert effect in line, line
    assert not any("skip these records" in p for p in problems)


# --- 5. each role's refusals name the role ------------------------------------------------------


def test_role_of_tells_every_role_even_those_that_may_not_read_the_registry(
    real_redis: redis.Redis, users: Users
) -> None:
    # Given one user per role
    specs = {
        "sec-r-pub": RoleSpec("publisher", ["svc-r"]),
        "sec-r-sub": RoleSpec("subscriber", client_id="c1"),
        "sec-r-wk": RoleSpec("worker"),
        "sec-r-ch": RoleSpec("channel"),
        "sec-r-adm": RoleSpec("admin"),
        "sec-r-mon": RoleSpec("monitor"),
    }
    clients = {user: users.add(user, spec) for user, spec in specs.items()}
    # When each asks for its own role; Then it is told, and no role is made up for the default user
    assert {user: role_of(clients[user], QM, user) for user in specs} == {u: s.role for u, s in specs.items()}
    assert role_of(real_redis, QM, None) is None and role_of(real_redis, QM, "nobody") is None


@pytest.mark.parametrize(
    ("spec", "told"),
    [
        (RoleSpec("monitor"), "has role monitor, which may not publish at all"),
        (RoleSpec("subscriber", client_id="c1"), "has role subscriber, which may not publish at all"),
        (RoleSpec("publisher", ["svc-q"]), "may publish only under the publisher ids bound to it"),
    ],
)
def test_broker_publish_refused_by_the_acl_is_worded_for_the_users_role(
    users: Users, spec: RoleSpec, told: str
) -> None:
    # Given a user of the role; When it runs broker publish (security on, the default publisher id "cli")
    users.add("sec-q", spec)
    refused = broker_as(users.url("sec-q"), "publish", "t/a", "x", env={"BROKER_SECURITY": "true"})
    # Then the refusal names what its role may do, and no password
    assert refused.exit_code == 4, refused.output
    assert f"user sec-q {told}" in refused.stderr, refused.stderr
    assert users.passwords["sec-q"] not in refused.output


def test_any_command_refused_by_the_acl_names_the_users_role(users: Users) -> None:
    # Given a monitor user; When it links two topics
    users.add("sec-m", RoleSpec("monitor"))
    refused = broker_as(users.url("sec-m"), "link", "t/x", "t/y")
    # Then it is told its role only reads
    assert refused.exit_code == 4, refused.output
    assert "user sec-m, role monitor, may not do this: a monitor may only read" in refused.stderr


def test_a_subscribers_planted_bell_stops_nobody_elses_delivery(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given two subscriptions on one topic, and a string planted where the first one's bell belongs
    # (the subscriber role may write its own subscription's keys)
    evil = subscribe(real_redis, QM, "t/#", "evil", "d")
    good = subscribe(real_redis, QM, "t/#", "good", "d")
    real_redis.set(keys.sub_bell(QM, evil.sub_id), "planted")
    (worker,) = make_workers(real_redis, settings, 1)
    # When a publication is made on the topic
    Publisher(real_redis, QM, "p1").publish("t/a", b"x", msgid="m1")
    drain([worker])
    # Then both subscriptions have it (the planted bell is not rung), and nothing was dead-lettered
    assert [m.body for m in queue_messages(real_redis, QM, good.sub_id)] == [b"x"]
    assert [m.body for m in queue_messages(real_redis, QM, evil.sub_id)] == [b"x"]
    assert real_redis.xlen(keys.dead_letter(QM)) == 0
    assert real_redis.get(keys.sub_bell(QM, evil.sub_id)) == b"planted"
    assert real_redis.llen(keys.sub_bell(QM, good.sub_id)) == 1
