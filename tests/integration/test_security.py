"""The broker's roles as Redis ACL users, against the real server (``broker.operations.acl``, docs/security.md).

One test per role, each run as real ACL users made with ``broker.operations.acl.add_user``: a table of
what the role must not do (every command refused with NOPERM, and nothing on the server
changed: every key's DUMP, the ACL users and the configuration are compared before and after
each one) and the work the role exists for (which must work). Then the raw protocol through
the shipped ``valkey-cli`` as a publisher and a subscriber, the ``broker acl`` commands (no
password is ever printed), and ``security = true`` on a server of its own.

The session's server keeps its ACL users across tests: every user made here is deleted after
its test (``users``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker import cli
from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import ServerError
from broker.core.library import COMMIT, DEQUEUE
from broker.core.models import Message
from broker.core.principals import bind, bindings
from broker.core.scripts import script_source
from broker.core.server import Server, cli_binary, free_port
from broker.network.channel import ChannelProcess
from broker.network.network_admin import apply_network
from broker.operations.acl import RoleSpec, add_user
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages, work_while
from broker.topics.links import link, unlink
from broker.topics.subscriptions import SubscriptionRecord, subscribe, unsubscribe
from broker.topics.topic_objects import Attributes, define
from broker.topics.topic_objects import delete as delete_object
from broker.topics.topology import parse_network
from worker.loop import Worker

QM = "TEST"
#: Another queue manager in the same Redis, whose name starts with ours (a pattern must not match it).
OTHER = "TESTX"


# --- users and snapshots ----------------------------------------------------------------------


class Users:
    """ACL users of one test, made with ``broker.operations.acl.add_user`` (random passwords) and deleted after it."""

    def __init__(self, server: Server, admin: redis.Redis) -> None:
        self.server, self.admin = server, admin
        self.passwords: dict[str, str] = {}
        self._clients: list[redis.Redis] = []

    def add(self, user: str, spec: RoleSpec, qm: str = QM, **options: bool) -> redis.Redis:
        """Make ``user`` with ``spec`` on ``qm`` (``options``: as ``add_user``'s, e.g. ``move``);
        returns a client authenticated as it."""
        self.passwords[user] = secrets.token_urlsafe(18)
        add_user(self.admin, qm, user, spec, self.passwords[user], **options)
        return self.client(user)

    def url(self, user: str) -> str:
        return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}/0"

    def client(self, user: str) -> redis.Redis:
        made = connect(self.url(user))
        self._clients.append(made)
        return made

    def close(self) -> None:
        for client in self._clients:
            client.close()
        for user in self.passwords:
            self.admin.execute_command("ACL", "DELUSER", user)


def snapshot(admin: redis.Redis) -> dict[str, Any]:
    """What a command could change: every key's DUMP, the ACL users, the configuration. Keys with a
    time to live (a worker's waiter lease, a reply) are left out: they may expire between two looks."""
    keys_ = sorted(admin.scan_iter(count=1000))
    return {
        "keys": {key: admin.dump(key) for key in keys_ if admin.pttl(key) == -1},
        "acl": sorted(admin.acl_list()),
        "config": admin.config_get("*"),
    }


def refused_by_acl(exc: redis.RedisError) -> bool:
    """NOPERM, or the same refusal of a command run inside a script ("ACL failure in script"; Redis
    7.0 says "The user executing the script can't access ...")."""
    text = str(exc)
    return isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith(
        ("ACL failure in script", "The user executing the script can't")
    )


def not_refused(admin: redis.Redis, client: redis.Redis, table: Sequence[tuple[Any, ...]]) -> list[str]:
    """Run each command of ``table`` as ``client``; returns those that were not refused by the ACL,
    or that changed something on the server (empty: the role may do none of them)."""
    wrong = []
    for command in table:
        before = snapshot(admin)
        try:
            client.execute_command(*command)
            wrong.append(f"{command!r}: allowed")
        except redis.RedisError as exc:
            if not refused_by_acl(exc):
                wrong.append(f"{command!r}: {type(exc).__name__}: {exc}")
        if snapshot(admin) != before:
            wrong.append(f"{command!r}: changed the server")
    return wrong


def sha(admin: redis.Redis, script: str) -> str:
    """The SHA of one of the broker's scripts, loaded by the administrator."""
    return admin.script_load(script_source(script))


#: Commands no broker role may run (the operator's own user keeps them).
OPERATOR_ONLY: list[tuple[Any, ...]] = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("CONFIG", "GET", "maxmemory"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"),
    ("KEYS", "*"),
    ("SCRIPT", "FLUSH"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "intruder", "on", ">x", "~*", "+@all"),
    ("SHUTDOWN", "ABORT"),  # (ABORT: were it allowed, it would only cancel a shutdown)
    ("SWAPDB", "0", "1"),
    ("CLIENT", "LIST"),
]


def other_queue_manager() -> list[tuple[Any, ...]]:
    """Writes to another queue manager's keys (``{TESTX}``, whose name starts with ``TEST``)."""
    return [
        ("XADD", keys.publish_stream(OTHER), "*", "publisher", "x", "topic", "t/a", "body", "b"),
        ("HSET", keys.subscriptions(OTHER), "c1$evil", '{"filter":"#","durable":true,"created_ms":0}'),
        ("LPUSH", keys.sub_queue(OTHER, "c1$d"), "x"),
        ("LRANGE", keys.sub_queue(OTHER, "c1$d"), "0", "-1"),
        ("DEL", keys.version(OTHER)),
    ]


# --- the scene every role test starts from ----------------------------------------------------


@dataclass
class Scene:
    """Queue manager TEST with three durable subscriptions to ``t/#`` (client ids ``c1``, ``c2`` and
    ``c1x``), three publications delivered to each by principal ``sec-pub`` (publisher id ``svc-7``)
    through a worker connected as the worker user ``sec-wk``, one of ``c2``'s messages in flight at
    its consumer ``cons2``, a link, and a subscription and a publication on queue manager TESTX."""

    admin: redis.Redis
    users: Users
    settings: Settings
    subs: dict[str, SubscriptionRecord]
    workers: list[Worker]

    def queue(self, client_id: str) -> str:
        return keys.sub_queue(QM, self.subs[client_id].sub_id)

    def depths(self) -> dict[str, int]:
        return {c: self.admin.llen(self.queue(c)) for c in self.subs}

    def publisher(self, publisher_id: str = "svc-7", **options: Any) -> Publisher:
        return Publisher(self.users.client("sec-pub"), QM, publisher_id, principal="sec-pub", **options)


@pytest.fixture
def scene(real_redis: redis.Redis, users: Users, settings: Settings) -> Scene:
    admin = real_redis
    subs = {cid: subscribe(admin, QM, "t/#", cid, "d") for cid in ("c1", "c2", "c1x")}
    link(admin, QM, "l/a", "t/linked")
    subscribe(admin, OTHER, "t/#", "c1", "d")  # the same client id on another queue manager
    admin.xadd(keys.publish_stream(OTHER), {"publisher": "x", "topic": "t/a", "body": "b"})
    users.add("sec-pub", RoleSpec("publisher", ["svc-7", "svc-7b"]))
    users.add("sec-pub2", RoleSpec("publisher", ["svc-8"]))
    workers = make_workers(users.add("sec-wk", RoleSpec("worker")), settings, 1)
    made = Scene(admin, users, settings, subs, workers)
    pub = made.publisher()
    work_while(workers[0], lambda: [pub.publish("t/a", f"m{i}".encode(), wait=True) for i in range(3)])
    drain(workers)  # (takes up the dequeue its last round prefetched, before anything new is published)
    holder = Subscriber(admin, QM, subs["c2"], settings, consumer_id="cons2", heartbeat=False)
    assert len(holder.receive_many(1)) == 1
    assert made.depths() == {"c1": 3, "c2": 2, "c1x": 3}
    return made


def _xadd(stream: str, publisher: str, topic: str = "t/a") -> tuple[Any, ...]:
    return ("XADD", stream, "*", "publisher", publisher, "topic", topic, "body", "forged")


# --- publisher ----------------------------------------------------------------------------------


def test_publisher_publishes_only_through_its_ingress_under_its_bound_ids(scene: Scene) -> None:
    admin, users = scene.admin, scene.users
    client = users.client("sec-pub")
    own = keys.ingress(QM, "sec-pub")
    forbidden = [
        _xadd(keys.ingress(QM, "sec-pub2"), "svc-8"),  # another principal's ingress
        _xadd(keys.publish_stream(QM), "svc-7"),  # the publish stream itself
        _xadd(keys.ingress(OTHER, "sec-pub"), "svc-7"),  # its own name on another queue manager
        _xadd(keys.sub_queue(QM, "c1$d"), "svc-7"),
        ("LRANGE", scene.queue("c1"), "0", "-1"),
        ("LMOVE", scene.queue("c1"), own, "RIGHT", "LEFT"),
        ("BLPOP", scene.queue("c1"), "0.01"),  # a command it has, on a key it may not
        ("BLPOP", keys.reply(QM, "svc-8", "m1"), "0.01"),  # another publisher id's result
        ("GET", keys.version(QM)),
        ("XRANGE", own, "-", "+"),
        ("XTRIM", keys.publish_stream(QM), "MAXLEN", "0"),
        ("XTRIM", own, "MAXLEN", "0"),
        ("XDEL", keys.publish_stream(QM), "0-1"),
        ("DEL", keys.publish_stream(QM)),
        ("DEL", own),
        ("HSET", keys.subscriptions(QM), "c9$d", '{"filter":"#","durable":true,"created_ms":0}'),
        ("HDEL", keys.subscriptions(QM), scene.subs["c1"].sub_id),
        ("HSET", keys.links(QM), "t/x", '{"t/y":false}'),
        ("HSET", keys.principals(QM), "sec-pub", "svc-8"),  # binding itself to another id
        ("INCR", keys.version(QM)),
        ("SCRIPT", "LOAD", "return 1"),
        ("EVAL", "return 1", "0"),
        ("FCALL", DEQUEUE, "0"),  # the workers' queue mutex
        ("XGROUP", "CREATE", own, "g", "$", "MKSTREAM"),
        ("XGROUP", "DESTROY", keys.publish_stream(QM), "workers"),
        ("XGROUP", "SETID", keys.publish_stream(QM), "workers", "$"),
        ("PUBLISH", "rq:pubsub:x", "kill"),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []

    # Allowed: publishing under a bound id, waiting for the result while a worker user runs
    result: list[Any] = []
    pub = scene.publisher()
    work_while(scene.workers[0], lambda: result.append(pub.publish("t/ok", b"fine", wait=True)))
    drain(scene.workers)
    assert (result[0].status, result[0].subscriptions) == ("delivered", 3)
    assert queue_messages(admin, QM, scene.subs["c1"].sub_id)[-1].principal == "sec-pub"
    # ... and under its second id, many at once without waiting (each XADD with a GET of its flow key)
    sent = scene.publisher("svc-7b").publish_many([("t/many", b"1"), ("t/many", b"2")])
    assert [r.status for r in sent] == ["sent", "sent"]
    assert drain(scene.workers) == 2

    # Its own ingress with another principal's publisher id: dead-lettered with the reason, not delivered
    depths = scene.depths()
    entry = client.execute_command(*_xadd(own, "svc-8"))
    drain(scene.workers)
    assert scene.depths() == depths
    assert admin.xlen(own) == 0
    _, dead = admin.xrange(keys.dead_letter(QM))[-1]
    assert dead[b"publisher"] == b"svc-8" and dead[b"dlq.entry_id"] == entry
    assert dead[b"dlq.reason"].startswith(b'publisher id "svc-8" is not bound to principal sec-pub')
    # ... and waiting for that result is refused (the reply key belongs to svc-8)
    with pytest.raises(ServerError) as refused:
        Publisher(client, QM, "svc-8", principal="sec-pub").publish("t/a", b"x", wait=True, timeout_ms=50)
    assert isinstance(refused.value.__cause__, redis.exceptions.NoPermissionError)
    drain(scene.workers)
    assert scene.depths() == depths

    # A "principal" field of its own making is replaced by the stream's principal
    client.xadd(own, {"publisher": "svc-7", "topic": "t/spoof", "body": "x", "principal": "sec-pub2"})
    drain(scene.workers)
    last = queue_messages(admin, QM, scene.subs["c1"].sub_id)[-1]
    assert (last.topic, last.principal) == ("t/spoof", "sec-pub")


# --- subscriber ---------------------------------------------------------------------------------


def test_subscriber_consumes_and_acknowledges_its_own_subscriptions_only(scene: Scene) -> None:
    admin, users = scene.admin, scene.users
    client = users.add("sec-sub", RoleSpec("subscriber", client_id="c1"))
    c2 = scene.subs["c2"].sub_id
    c2_inflight = keys.consumer_inflight(QM, c2, "cons2")
    held = admin.lindex(c2_inflight, 0)
    own_inflight = keys.consumer_inflight(QM, scene.subs["c1"].sub_id, "s1")
    forbidden = [
        ("LRANGE", scene.queue("c2"), "0", "-1"),
        ("LMOVE", scene.queue("c2"), own_inflight, "RIGHT", "LEFT"),  # another's message into its own hands
        ("RPOP", scene.queue("c2")),
        ("LRANGE", scene.queue("c1x"), "0", "-1"),  # a client id that starts with its own
        ("BLMOVE", keys.sub_bell(QM, c2), keys.sub_bell(QM, c2), "RIGHT", "RIGHT", "0.01"),
        ("LREM", c2_inflight, "-1", held),  # acknowledging for another client
        ("ZADD", keys.sub_consumers(QM, c2), "1", "s1"),
        ("DEL", scene.queue("c2")),
        ("HSET", keys.sub_redelivered(QM, c2), "1-0", "9"),
        # the function library on another client's subscription: bound by its key patterns
        ("FCALL", "broker_receive", "1", scene.queue("c2"), "s1", "1"),
        ("FCALL", "broker_ack", "1", scene.queue("c2"), "cons2", held),
        ("FCALL", "broker_recover", "1", scene.queue("c2"), "", "0", "", "0", "cons2"),
        ("FCALL", "broker_reject", "1", scene.queue("c2"), "cons2", "", held, "x"),
        ("FCALL_RO", "broker_browse", "1", scene.queue("c2")),
        # the workers' queue mutex, on the queue manager's keys: bound by its key patterns too
        ("FCALL", DEQUEUE, "2", keys.publish_stream(QM), keys.version(QM), "workers", "s1", "1"),
        # no scripts of its own (a loop would freeze the server), and no loading of functions
        ("EVAL", "return 1", "0"),
        ("EVAL", "return redis.call('LRANGE', ARGV[1], 0, -1)", "0", scene.queue("c2")),  # a key not declared
        ("EVALSHA", sha(admin, "give_up"), "0"),
        ("SCRIPT", "LOAD", "return 1"),
        ("FUNCTION", "LOAD", "REPLACE", "#!lua name=evil\nredis.register_function('evil', function() end)"),
        ("FUNCTION", "DELETE", "broker"),
        ("FUNCTION", "FLUSH"),
        # the broker's shared keys (issue 27's probes): no write on them at all
        ("XTRIM", keys.dead_letter(QM), "MAXLEN", "0"),
        ("DEL", keys.dead_letter(QM)),
        ("SET", keys.dead_letter(QM), "planted"),
        ("RENAME", keys.dead_letter(QM), keys.sub_queue(QM, "c1$stolen")),
        ("XADD", keys.dead_letter(QM), "*", "publisher", "svc-7", "topic", "t/x", "dlq.reason", "forged"),
        ("SET", keys.last_active(QM), "planted"),
        ("DEL", keys.last_active(QM)),
        ("HSET", keys.last_active(QM), c2, "0"),
        ("SET", keys.expired(QM), "planted"),
        ("HSET", keys.expired(QM), c2, "9"),
        ("LRANGE", keys.sub_queue(OTHER, "c1$d"), "0", "-1"),  # its client id on another queue manager
        ("HSET", keys.subscriptions(QM), "c1$new", '{"filter":"#","durable":true,"created_ms":0}'),
        ("HDEL", keys.subscriptions(QM), c2),
        ("HSET", keys.links(QM), "t/x", '{"t/y":false}'),
        ("HSET", keys.topic_objects(QM), "OBJ", "{}"),
        ("HSET", keys.manager(QM), "topic_scheme", "swiftmq"),
        ("INCR", keys.version(QM)),
        _xadd(keys.publish_stream(QM), "svc-7"),
        _xadd(keys.ingress(QM, "sec-pub"), "svc-7"),
        _xadd(keys.ingress(QM, "sec-sub"), "svc-7"),  # a subscriber has no ingress stream
        ("XREAD", "STREAMS", keys.publish_stream(QM), "0"),
        ("HGETALL", keys.principals(QM)),
        ("HGETALL", keys.acl_users(QM)),
        ("PUBLISH", "rq:pubsub:x", "kill"),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []

    # Allowed: receive and acknowledge its own, heartbeats, recover on close
    settings = scene.settings
    sub = Subscriber(client, QM, scene.subs["c1"], settings, consumer_id="s1", heartbeat=False)
    got = sub.receive_many(10)
    assert [d.message.body for d in got] == [b"m0", b"m1", b"m2"]
    assert {d.message.principal for d in got} == {"sec-pub"}
    assert sub.ack_many(got[:2]) == 2
    consumers = keys.sub_consumers(QM, scene.subs["c1"].sub_id)
    lease = admin.zscore(consumers, "s1")
    time.sleep(0.002)
    sub.heartbeat()
    assert admin.zscore(consumers, "s1") > lease
    sub.close()  # the unacknowledged one goes back to the queue
    assert [m.body for m in queue_messages(admin, QM, scene.subs["c1"].sub_id)] == [b"m2"]
    assert admin.zcard(consumers) == 0
    assert int(admin.get(keys.sub_last_active(QM, scene.subs["c1"].sub_id))) > 0

    # A dead consumer's message is recovered by the next one, and dead-lettered past max_redeliveries
    clock = [int(time.time() * 1000)]
    strict = settings.model_copy(update={"max_redeliveries": 0})
    dying = Subscriber(
        client, QM, scene.subs["c1"], strict, consumer_id="s2", heartbeat=False, clock_ms=lambda: clock[0]
    )
    assert [d.message.body for d in dying.receive_many(1)] == [b"m2"]
    dying.abandon()
    clock[0] += strict.consumer_lease_ms + 1
    later = Subscriber(
        client, QM, scene.subs["c1"], strict, consumer_id="s3", heartbeat=False, clock_ms=lambda: clock[0]
    )
    _, dead = admin.xrange(keys.sub_poison(QM, scene.subs["c1"].sub_id))[-1]
    assert Message.from_envelope(dead[b"envelope"]).body == b"m2"
    assert dead[b"dlq.subscription"] == scene.subs["c1"].sub_id.encode()
    later.close()

    # A malformed element in its queue is made a poison message by the subscriber user itself
    admin.lpush(scene.queue("c1"), b"no header line")
    reader = Subscriber(client, QM, scene.subs["c1"], settings, consumer_id="s5", heartbeat=False)
    assert reader.receive_many(10) == [] and reader.in_flight() == 0
    reader.close()
    _, dead = admin.xrange(keys.sub_poison(QM, scene.subs["c1"].sub_id))[-1]
    assert dead[b"envelope"] == b"no header line" and dead[b"dlq.reason"].startswith(b"malformed envelope")

    # A non-durable subscription an administrator made for it: closing leaves its removal to the workers
    nd = subscribe(admin, QM, "t/#", "c1")
    Subscriber(client, QM, nd, settings, consumer_id="s4", heartbeat=False).close()
    assert admin.hexists(keys.subscriptions(QM), nd.sub_id)
    worker = make_workers(
        users.client("sec-wk"), settings.model_copy(update={"subscription_expiry_ms": 0}), 1
    )[0]
    time.sleep(0.002)
    worker.housekeeping.sweep_subscriptions()
    assert not admin.hexists(keys.subscriptions(QM), nd.sub_id)


def test_broker_subscribe_attaches_a_subscriber_user_to_its_durable_subscription(scene: Scene) -> None:
    # Given a subscriber user of client id c1, whose durable subscription an administrator made
    users = scene.users
    users.add("sec-sub", RoleSpec("subscriber", client_id="c1"))
    # When it runs `broker subscribe` on it, and on a subscription it may not make
    attached = broker_as(
        users.url("sec-sub"), "subscribe", "t/#", "--client-id", "c1", "--durable", "d", "--count", "3"
    )
    made = broker_as(
        users.url("sec-sub"), "subscribe", "t/#", "--client-id", "c1", "--durable", "new", "--timeout-ms", "1"
    )
    # Then it receives its messages; making one is refused with a hint
    assert attached.exit_code == 0, attached.output
    assert [line.split()[-1] for line in attached.stdout.splitlines()] == ["m0", "m1", "m2"]
    assert made.exit_code == 4
    assert "may not do this" in made.stderr and "broker acl list" in made.stderr
    assert not scene.admin.hexists(keys.subscriptions(QM), "c1$new")


# --- worker -------------------------------------------------------------------------------------


def test_worker_runs_the_whole_pipeline_of_its_queue_manager_only(scene: Scene) -> None:
    admin, users = scene.admin, scene.users
    client = users.client("sec-wk")
    forbidden = [
        *other_queue_manager(),
        ("XGROUP", "CREATE", keys.publish_stream(OTHER), "workers", "$", "MKSTREAM"),
        ("EVAL", "return redis.call('SET', KEYS[1], 1)", "1", keys.version(OTHER)),
        ("EVAL", "return redis.call('DEL', '" + keys.subscriptions(OTHER) + "')", "0"),
        ("EVAL", "return redis.call('FLUSHALL')", "0"),  # a script cannot do more than its user
        ("LPUSH", "rq:queue:broker-admin", "x"),
        ("SET", "unrelated", "x"),
        ("ACL", "DELUSER", "sec-pub"),
        ("SCRIPT", "KILL"),
        ("FUNCTION", "FLUSH"),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []

    # Allowed: the whole pipeline, with the journal and flow control on, by two workers
    settings = scene.settings.model_copy(
        update={"journal": True, "flowcontrol_enabled": True, "subscription_expiry_ms": 0}
    )
    workers = make_workers(client, settings, 2)
    pub = scene.publisher("svc-7b", validate=False)
    results: list[Any] = []

    def publish() -> None:
        results.append(pub.publish("t/w", b"1", msgid="w1", wait=True))
        results.append(pub.publish("t/w", b"1", msgid="w1", wait=True))
        results.append(pub.publish("t/#", b"bad", wait=True))

    work_while(workers[0], publish)
    assert [r.status for r in results] == ["delivered", "duplicate", "refused"]
    assert results[0].subscriptions == 3
    assert admin.xlen(keys.journal(QM)) >= 3
    assert admin.exists(keys.dedup(QM, "svc-7b", "w1"))
    # the sweeps: a consumer that died gives its message back, an abandoned subscription goes
    past = int(time.time() * 1000) - settings.consumer_lease_ms - 10  # its lease ran out already
    dying = Subscriber(
        client, QM, scene.subs["c1"], settings, consumer_id="gone", heartbeat=False, clock_ms=lambda: past
    )
    assert len(dying.receive_many(1)) == 1
    dying.abandon()
    nd = subscribe(admin, QM, "t/#", "c7")
    time.sleep(0.002)
    drain(workers)
    workers[1].housekeeping.sweep_subscriptions()
    assert not admin.hexists(keys.subscriptions(QM), nd.sub_id)
    assert admin.llen(keys.consumer_inflight(QM, scene.subs["c1"].sub_id, "gone")) == 0
    assert scene.depths()["c1"] == 4
    assert status(admin, QM).problems == []
    assert {w.name for w in status(admin, QM).workers} >= {"w0", "w1"}


# --- admin --------------------------------------------------------------------------------------


def test_admin_defines_subscriptions_links_and_topic_objects_but_runs_no_server_command(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    from rq import Queue, SimpleWorker

    from broker import jobs

    admin, users = scene.admin, scene.users
    client = users.add("sec-ops", RoleSpec("admin"))
    forbidden = [
        *other_queue_manager(),
        ("ACL", "DELUSER", "sec-pub"),
        ("ACL", "SAVE"),
        ("ACL", "GETUSER", "sec-pub"),
        ("SUBSCRIBE", "__keyspace@0__:*"),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []

    # Allowed: subscriptions (durable, shared), links, topic objects, principals' bindings
    durable = subscribe(client, QM, "a/#", "c5", "d5")
    shared = subscribe(client, QM, "$share/grp/a/#", "c6", "s6")
    link(client, QM, "a/x", "t/y")
    define(client, QM, "ORDERS", "a", Attributes(maxdepth=10))
    bind(client, QM, "sec-pub", ["svc-7", "svc-7b", "svc-9"])
    assert bindings(admin, QM)["sec-pub"] == ["svc-7", "svc-7b", "svc-9"]
    assert {durable.sub_id, shared.sub_id} <= {s.id for s in status(client, QM).subscriptions}
    unlink(client, QM, "a/x", "t/y")
    delete_object(client, QM, "ORDERS")
    unsubscribe(client, QM, durable.sub_id)
    unsubscribe(client, QM, shared.sub_id)
    assert not admin.hexists(keys.subscriptions(QM), durable.sub_id)
    # ... and the admin jobs: rq's queue, its worker (with its command channel), the jobs themselves
    url = users.url("sec-ops")
    assert len(jobs.schedule(url, QM)) == 2
    queue = Queue(jobs.ADMIN_QUEUE, connection=client)
    with caplog.at_level(logging.WARNING, logger="rq.worker"), warnings.catch_warnings():
        # rq's worker reads CLIENT LIST (the operator's) for its address: it warns and goes on
        warnings.filterwarnings("ignore", "CLIENT LIST command not supported")
        assert SimpleWorker([queue], connection=client).work(burst=True)
    assert admin.xlen(keys.usage(QM)) == 1
    # its command channel's SUBSCRIBE was allowed too (a refused one ends its pubsub thread, logged)
    assert [r.getMessage() for r in caplog.records if "permission" in r.getMessage()] == []


# --- monitor ------------------------------------------------------------------------------------


def test_monitor_reads_the_status_and_writes_nothing(scene: Scene) -> None:
    admin, users = scene.admin, scene.users
    client = users.add("sec-mon", RoleSpec("monitor"))
    sub = scene.subs["c1"].sub_id
    forbidden = [
        ("HSET", keys.subscriptions(QM), "c9$d", '{"filter":"#","durable":true,"created_ms":0}'),
        ("HSET", keys.workers(QM), "w9", "{}"),
        _xadd(keys.publish_stream(QM), "svc-7"),
        _xadd(keys.ingress(QM, "sec-pub"), "svc-7"),
        ("XADD", keys.dead_letter(QM), "*", "a", "b"),
        ("DEL", scene.queue("c1")),
        ("LPUSH", scene.queue("c1"), "x"),
        ("LMOVE", scene.queue("c1"), keys.consumer_inflight(QM, sub, "m"), "RIGHT", "LEFT"),
        ("INCR", keys.version(QM)),
        ("SET", keys.version(QM), "0"),
        ("EXPIRE", scene.queue("c1"), "1"),
        ("XGROUP", "CREATE", keys.publish_stream(QM), "spy", "0"),
        ("XREADGROUP", "GROUP", "workers", "spy", "COUNT", "1", "STREAMS", keys.publish_stream(QM), ">"),
        ("XACK", keys.publish_stream(QM), "workers", "0-1"),
        ("FCALL", "broker_recover", "1", scene.queue("c1")),
        ("FCALL", COMMIT, "0"),
        ("FCALL", DEQUEUE, "0"),
        ("EVAL", "return 1", "0"),
        ("SCRIPT", "LOAD", "return 1"),
        ("GET", keys.version(OTHER)),  # another queue manager's keys, even to read
        ("PUBLISH", "rq:pubsub:x", "kill"),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []

    # Allowed: browsing a queue (FCALL_RO of the read-only broker_browse: docs/security.md), which
    # takes nothing
    depth = admin.llen(scene.queue("c1"))
    assert isinstance(client.fcall_ro("broker_browse", 1, scene.queue("c1"), 10), list)
    assert admin.llen(scene.queue("c1")) == depth

    # Allowed: the status, as the administrator sees it, with nothing it could not read
    seen = status(client, QM)
    assert seen.problems == []
    assert seen.subscriptions == status(admin, QM).subscriptions
    assert {s.id: s.depth for s in seen.subscriptions} == {
        r.sub_id: scene.depths()[c] for c, r in scene.subs.items()
    }
    shown = broker_as(users.url("sec-mon"), "status", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["problems"] == []
    assert users.passwords["sec-mon"] not in shown.output


# --- channel ------------------------------------------------------------------------------------


def test_channel_users_move_publications_across_a_hierarchy_and_write_nothing_else_of_a_peer(
    real_server: Server, real_redis: redis.Redis, users: Users, settings: Settings
) -> None:
    # Given a hierarchy of three queue managers in one server (A the root; B and C its children),
    # each with a worker user and a channel user made by `broker acl add --role channel` (its peers:
    # every other queue manager of the network, as each channel process reads every announcement)
    admin = real_redis
    qms = {"A": "SECA", "B": "SECB", "C": "SECC"}
    network = parse_network(
        {"queue_managers": {qms["A"]: {}, qms["B"]: {"parent": qms["A"]}, qms["C"]: {"parent": qms["A"]}}}
    )
    assert not apply_network(network, real_server.url, admin).failed
    workers, channels = {}, {}
    for short, qm in qms.items():
        user = f"sec-ch-{short}"
        users.passwords[user] = secrets.token_urlsafe(18)
        made = broker_as(
            real_server.url,
            *("acl", "add", user, "--role", "channel", "--password-env", "SEC_CHANNEL_PW"),
            qm=qm,
            env={"SEC_CHANNEL_PW": users.passwords[user]},
        )
        assert made.exit_code == 0, made.output
        here = settings.model_copy(update={"qm": qm})
        workers[short] = make_workers(users.add(f"sec-wk-{short}", RoleSpec("worker"), qm), here, 1)
        channels[short] = ChannelProcess(users.client(user), here, name=f"ch-{short}")
        channels[short].rejoin()

    def settle() -> None:
        for _ in range(40):
            changed = [channels[q].agent.round() for _ in range(2) for q in qms]
            committed = sum(drain(workers[q]) for q in qms)
            moved = sum(channels[q].run_once() for q in qms)
            if not any(changed) and not committed and not moved:
                return
        raise AssertionError("the network did not settle")

    at_a = subscribe(admin, qms["A"], "t/#", "app", "d")
    at_c = subscribe(admin, qms["C"], "t/#", "app", "d")
    settle()
    # When B publishes
    Publisher(admin, qms["B"], "p1").publish("t/x", b"from B")
    settle()
    # Then the channels moved it to A and through A to C; no channel process met a refusal
    assert [(m.body, m.route) for m in queue_messages(admin, qms["C"], at_c.sub_id)] == [
        (b"from B", (qms["B"], qms["A"]))
    ]
    assert [m.body for m in queue_messages(admin, qms["A"], at_a.sub_id)] == [b"from B"]
    assert all(channels[q].agent.problems == [] for q in qms)
    assert all(not admin.hget(keys.channel_state(qms[q], qms[t]), "last_error") for q, t in ("BA", "AC"))

    # And A's channel user writes nothing of its peer B but what a move writes
    b = qms["B"]
    client = users.client("sec-ch-A")
    forbidden = [
        ("HSET", keys.subscriptions(b), "x$y", '{"filter":"#","durable":true,"created_ms":0}'),
        ("LRANGE", keys.sub_queue(b, "app$d"), "0", "-1"),
        ("LPUSH", keys.sub_queue(qms["C"], at_c.sub_id), "x"),
        ("XADD", keys.dead_letter(b), "*", "a", "b"),
        ("SET", keys.announced(b), "{}"),
        ("HSET", keys.topic_objects(b), "OBJ", "{}"),
        ("SET", keys.network(b), "{}"),
        ("HSET", keys.proxies(b), "x", "{}"),
        ("INCR", keys.version(b)),
        ("XADD", keys.transmission(b, qms["C"]), "*", "e", "x"),
        ("HSET", keys.principals(b), "p", "svc"),
        ("SET", keys.channel_mover(b, qms["A"]), "mine"),
        ("HSET", keys.network_agents(b), "x", "{}"),
        *other_queue_manager(),
        *OPERATOR_ONLY,
    ]
    assert not_refused(admin, client, forbidden) == []


# --- the raw protocol through the shipped valkey-cli ---------------------------------------------


def valkey_cli(port: int, user: str, password: str, *args: Any, url: bool = False) -> bytes:
    """One command through the shipped ``valkey-cli`` as ``user`` (``--user``/``--pass``, or with
    ``url`` ``-u redis://user:pass@...``); its raw output."""
    auth = (
        ["-u", f"redis://{user}:{password}@127.0.0.1:{port}/0"]
        if url
        else ["-p", str(port), "--user", user, "--pass", password]
    )
    done = subprocess.run(
        [cli_binary(), *auth, "--no-auth-warning", *args], capture_output=True, timeout=30, check=True
    )
    return done.stdout


def test_raw_protocol_with_valkey_cli_as_a_publisher_and_a_subscriber(
    real_server: Server, real_redis: redis.Redis, users: Users, settings: Settings, tmp_path: Path
) -> None:
    # Given a publisher, a subscriber of client id c1 and a worker user; c1 and c2 subscribe t/#
    admin, port = real_redis, real_server.port
    mine = subscribe(admin, QM, "t/#", "c1", "d")
    theirs = subscribe(admin, QM, "t/#", "c2", "d")
    users.add("sec-pub", RoleSpec("publisher", ["svc-7"]))
    users.add("sec-sub", RoleSpec("subscriber", client_id="c1"))
    workers = make_workers(users.add("sec-wk", RoleSpec("worker")), settings, 1)
    pub_pw, sub_pw = users.passwords["sec-pub"], users.passwords["sec-sub"]
    xadd = ("XADD", keys.ingress(QM, "sec-pub"), "*", "publisher", "svc-7", "topic", "t/raw", "body")

    # When the publisher XADDs to its ingress stream, with one command: through valkey-cli
    # --user/--pass, through valkey-cli -u <url>, and through `broker cli` (the URL in the environment)
    first = valkey_cli(port, "sec-pub", pub_pw, *xadd, "one")
    second = valkey_cli(port, "sec-pub", pub_pw, *xadd, "two", url=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BROKER_")},
        "BROKER_REDIS_URL": users.url("sec-pub"),
        "BROKER_QM": QM,
    }
    broker_bin = str(Path(sys.executable).parent / "broker")
    wrapped = subprocess.run(
        [broker_bin, "cli", *xadd, "three"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
    )
    to_publish = valkey_cli(port, "sec-pub", pub_pw, *_xadd(keys.publish_stream(QM), "svc-7"))
    assert re.fullmatch(rb"\d+-\d+\n", first) and re.fullmatch(rb"\d+-\d+\n", second)
    assert wrapped.returncode == 0, wrapped.stderr
    assert pub_pw not in wrapped.stdout + wrapped.stderr
    assert to_publish.startswith(b"NOPERM")
    drain(workers)
    assert [m.body for m in queue_messages(admin, QM, theirs.sub_id)] == [b"one", b"two", b"three"]

    # Then the subscriber takes them from its own queue with the consumer protocol's plain commands
    queue = keys.sub_queue(QM, mine.sub_id)
    inflight = keys.consumer_inflight(QM, mine.sub_id, "cli1")
    lease = str(int(time.time() * 1000) + 30_000)
    assert (
        valkey_cli(port, "sec-sub", sub_pw, "ZADD", keys.sub_consumers(QM, mine.sub_id), lease, "cli1")
        == b"1\n"
    )
    taken = []
    for _ in range(3):
        envelope = valkey_cli(port, "sec-sub", sub_pw, "LMOVE", queue, inflight, "RIGHT", "LEFT")[:-1]
        taken.append(Message.from_envelope(envelope))
        assert valkey_cli(port, "sec-sub", sub_pw, "LREM", inflight, "-1", envelope) == b"1\n"
    assert [(m.body, m.principal) for m in taken] == [
        (b"one", "sec-pub"),
        (b"two", "sec-pub"),
        (b"three", "sec-pub"),
    ]
    assert admin.llen(inflight) == 0
    waited = valkey_cli(
        port,
        "sec-sub",
        sub_pw,
        "BLMOVE",
        keys.sub_bell(QM, mine.sub_id),
        keys.sub_bell(QM, mine.sub_id),
        "RIGHT",
        "RIGHT",
        "0.01",
    )
    assert not waited.startswith(b"NOPERM")
    # ... and cannot read another's
    other = keys.sub_queue(QM, theirs.sub_id)
    assert valkey_cli(port, "sec-sub", sub_pw, "LMOVE", other, inflight, "RIGHT", "LEFT").startswith(
        b"NOPERM"
    )
    assert valkey_cli(port, "sec-sub", sub_pw, "LRANGE", other, "0", "-1").startswith(b"NOPERM")
    assert admin.llen(other) == 3


# --- broker acl and security = true ---------------------------------------------------------------


def logs_in(port: int, user: str | None, password: str | None) -> bool:
    """Whether ``user`` authenticates with ``password`` (no retries: redis-py retries a refused login)."""
    client = redis.Redis(port=port, username=user, password=password, retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        return False
    finally:
        client.close()


def broker_as(url: str, *args: str, qm: str = QM, env: dict[str, str] | None = None) -> Result:
    """``broker --redis-url <url> --qm <qm> ...`` (CliRunner), with no BROKER_* variables but ``env``."""
    clean: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"
    }
    runner = CliRunner(env={**clean, **(env or {})})
    return runner.invoke(cli.main, ["--redis-url", url, "--qm", qm, *args])


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.output, result.exc_info)
    return result


def test_acl_commands_add_list_rotate_delete_and_file_and_never_print_a_password(
    run, real_server: Server, real_redis: redis.Redis, monkeypatch, tmp_path: Path
) -> None:
    pw1, pw2, pw3 = (secrets.token_urlsafe(18) for _ in range(3))
    monkeypatch.setenv("SEC_PW1", pw1)
    monkeypatch.setenv("SEC_PW2", pw2)
    secret_file = tmp_path / "secret"
    secret_file.write_text(pw3 + "\n")
    port = real_server.port

    def login(user: str, password: str) -> bool:
        return logs_in(port, user, password)

    results = []
    try:
        results.append(
            ok(
                run(
                    "acl",
                    "add",
                    "sec-cli",
                    "--role",
                    "publisher",
                    "--publisher-id",
                    "svc-9",
                    "--password-env",
                    "SEC_PW1",
                )
            )
        )
        assert "user sec-cli: role publisher on TEST" in results[-1].stdout
        assert "not saved (the server has no ACL file" in results[-1].stdout
        results.append(
            ok(run("acl", "add", "sec-ops", "--role", "admin", "--password-file", str(secret_file)))
        )
        assert login("sec-cli", pw1) and login("sec-ops", pw3)
        assert bindings(real_redis, QM) == {"sec-cli": ["svc-9"]}

        results.append(ok(run("acl", "list")))
        assert "sec-cli" in results[-1].stdout and "svc-9" in results[-1].stdout
        results.append(ok(run("acl", "list", "--json")))
        listed = {u["user"]: u for u in json.loads(results[-1].stdout)["users"]}
        assert (listed["sec-cli"]["role"], listed["sec-cli"]["bindings"], listed["sec-cli"]["enabled"]) == (
            "publisher",
            "svc-9",
            True,
        )
        assert listed["sec-ops"]["role"] == "admin"

        # rotate: the old password works until --drop-old
        results.append(ok(run("acl", "rotate", "sec-cli", "--password-env", "SEC_PW2")))
        assert "old ones still valid" in results[-1].stdout
        assert login("sec-cli", pw1) and login("sec-cli", pw2)
        results.append(ok(run("acl", "rotate", "sec-cli", "--drop-old", "--password-env", "SEC_PW2")))
        assert not login("sec-cli", pw1) and login("sec-cli", pw2)

        # file: the rules, with each password as its SHA-256
        results.append(ok(run("acl", "file")))
        lines = {line.split()[1]: line for line in results[-1].stdout.splitlines()}
        assert f"#{hashlib.sha256(pw2.encode()).hexdigest()}" in lines["sec-cli"]
        assert hashlib.sha256(pw1.encode()).hexdigest() not in results[-1].stdout
        assert "%W~{TEST}:in:sec-cli" in lines["sec-cli"] and lines["sec-ops"].startswith("user sec-ops on #")

        # status as the admin user (its password in the URL)
        results.append(ok(broker_as(f"redis://sec-ops:{pw3}@127.0.0.1:{port}/0", "status", "--json")))
        assert json.loads(results[-1].stdout)["problems"] == []

        # delete: the user, its registry record and its binding
        results.append(ok(run("acl", "delete", "sec-cli")))
        assert "user sec-cli: deleted" in results[-1].stdout
        assert not login("sec-cli", pw2)
        assert bindings(real_redis, QM) == {} and not real_redis.hexists(keys.acl_users(QM), "sec-cli")
        results.append(ok(run("acl", "delete", "sec-cli")))
        assert "did not exist" in results[-1].stdout
        results.append(ok(run("acl", "delete", "sec-ops")))
    finally:
        for user in ("sec-cli", "sec-ops"):
            real_redis.execute_command("ACL", "DELUSER", user)
    for result in results:
        for password in (pw1, pw2, pw3):
            assert password not in result.stdout and password not in result.stderr


def test_acl_add_without_its_password_or_bindings_exits_2_and_makes_no_user(run, real_redis) -> None:
    cases = [
        (
            ("--role", "monitor", "--password-env", "SEC_NOT_SET"),
            "environment variable SEC_NOT_SET is not set",
        ),
        (("--role", "monitor"), "give the password with --password-env VAR or --password-file FILE"),
        (("--role", "monitor", "--password-file", "/nonexistent/secret"), "secret file /nonexistent/secret"),
        (("--role", "subscriber", "--password-env", "PATH"), "a subscriber needs --client-id"),
        (("--role", "publisher", "--password-env", "PATH"), "bind at least one publisher id"),
    ]
    for options, message in cases:
        result = run("acl", "add", "sec-none", *options)
        assert result.exit_code == 2, (options, result.output)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert "Traceback" not in result.output
        assert real_redis.execute_command("ACL", "GETUSER", "sec-none") is None


def test_broker_publish_as_a_principal_under_an_unbound_id_says_which_ids_it_may_use(users: Users) -> None:
    users.add("sec-pub", RoleSpec("publisher", ["svc-7"]))
    # the default publisher id, "cli", is not one of its ids
    refused = broker_as(users.url("sec-pub"), "publish", "t/a", "x", env={"BROKER_SECURITY": "true"})
    assert refused.exit_code == 4
    assert "user sec-pub may publish only under the publisher ids bound to it" in refused.stderr
    # the XADD itself went through (the ingress stream is the principal's): the message says so
    assert "was written under publisher id cli" in refused.stderr, refused.stderr
    assert "not delivered" in refused.stderr
    # without --wait the refusal comes from the flow key's GET that rides with the XADD: said the same way
    sent = broker_as(
        users.url("sec-pub"), "publish", "t/a", "x", "--no-wait", env={"BROKER_SECURITY": "true"}
    )
    assert sent.exit_code == 4
    assert "was written under publisher id cli" in sent.stderr and "its flow key" in sent.stderr, sent.stderr
    assert users.passwords["sec-pub"] not in refused.output


def _start_server(port: int, data: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    broker_bin = str(Path(sys.executable).parent / "broker")
    return subprocess.Popen(
        [broker_bin, "server", "--port", str(port), "--dir", str(data)],
        cwd=data.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_up(proc: subprocess.Popen[bytes], client: redis.Redis) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes], *clients: redis.Redis) -> None:
    for client in clients:  # the server waits for connected clients to leave (stop_grace_ms)
        client.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_security_true_server_refuses_the_default_user_and_keeps_broker_users_across_a_restart(
    tmp_path: Path,
) -> None:
    # Given `broker server` with security = true and the administrator's credentials in the URL
    port, admin_pw, svc_pw = free_port(), secrets.token_urlsafe(18), secrets.token_urlsafe(18)
    url = f"redis://admin:{admin_pw}@127.0.0.1:{port}/0"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BROKER_")},
        "BROKER_REDIS_URL": url,
        "BROKER_SECURITY": "true",
        "BROKER_QM": "SECQ",
    }
    data = tmp_path / "data"
    admin = redis.Redis(port=port, username="admin", password=admin_pw)
    svc = redis.Redis(port=port, username="svc", password=svc_pw)
    proc = _start_server(port, data, env)
    try:
        _wait_up(proc, admin)
        # Then the default user is refused, the administrator is not
        assert not logs_in(port, None, None)
        assert subprocess.run(
            [cli_binary(), "-p", str(port), "PING"], capture_output=True, timeout=30
        ).stdout.startswith(b"NOAUTH")
        shown = ok(broker_as(url, "status", "--json", qm="SECQ"))
        assert json.loads(shown.stdout)["problems"] == []
        # When the administrator adds a user, and the server restarts
        added = ok(
            broker_as(
                url,
                "acl",
                "add",
                "svc",
                "--role",
                "publisher",
                "--publisher-id",
                "svc-1",
                "--password-env",
                "SEC_SVC_PW",
                qm="SECQ",
                env={"SEC_SVC_PW": svc_pw},
            )
        )
        assert "saved to the server's ACL file" in added.stdout
        acl_file = data / "users.acl"
        assert acl_file.stat().st_mode & 0o777 == 0o600
        assert admin_pw not in acl_file.read_text() and svc_pw not in acl_file.read_text()
        _stop(proc, admin)
        proc = _start_server(port, data, env)
        _wait_up(proc, admin)
        # Then the user is still there, with its rules: it publishes through its ingress stream only
        assert svc.xadd(keys.ingress("SECQ", "svc"), {"publisher": "svc-1", "topic": "t", "body": "b"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            svc.xadd(keys.publish_stream("SECQ"), {"publisher": "svc-1", "topic": "t", "body": "b"})
        listed = ok(broker_as(url, "acl", "list", "--json", qm="SECQ"))
        assert [u["user"] for u in json.loads(listed.stdout)["users"]] == ["svc"]
        for result in (shown, added, listed):
            assert admin_pw not in result.output and svc_pw not in result.output
    finally:
        _stop(proc, admin, svc)
