"""Queue managers on a Redis Cluster: each lives in its ``{qm}`` slot, the hot path touches only it.

A local 3-master cluster (``scripts.rig.cluster``) for the session; every
test uses queue manager names of its own, so nothing is flushed between tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from broker import Publisher, PublishResult, Subscriber, link, subscribe
from broker.core import keys, library
from broker.core.config import Settings
from broker.core.connection import connect, is_cluster
from broker.core.errors import ClusterUnsupported, ConfigError
from broker.core.server import cli_command
from broker.jobs import schedule
from broker.testing import drain, make_workers, queue_messages, work_while
from scripts.rig.cluster import LocalCluster
from worker.loop import Worker

_names = itertools.count()


@pytest.fixture
def cluster_client(local_cluster: LocalCluster) -> Iterator[redis.Redis]:
    client = connect(local_cluster.url, check=True)
    yield client
    client.close()


def _qms_on_different_masters(cluster: LocalCluster, count: int) -> list[str]:
    """``count`` fresh queue manager names whose ``{qm}`` slots are served by ``count`` different masters."""
    found: dict[int, str] = {}
    for n in range(10_000):
        qm = f"CL{next(_names)}x{n}"
        found.setdefault(cluster.owner(keys.publish_stream(qm)), qm)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("no names found on enough different masters")


def _settings(cluster: LocalCluster, qm: str) -> Settings:
    return Settings(
        redis_url=cluster.url, qm=qm, batch_size=50, heads=50, lease_ms=30_000, sweep_interval_ms=1
    )


def _publish_waiting(worker: Worker, publisher: Publisher, topic: str, body: bytes) -> list[PublishResult]:
    """Publish with ``wait=True`` while ``worker`` runs; the results."""
    results: list[PublishResult] = []
    work_while(worker, lambda: results.append(publisher.publish(topic, body, wait=True)))
    return results


def test_a_cluster_url_gives_a_cluster_client(local_cluster, cluster_client):
    assert isinstance(cluster_client, RedisCluster)
    assert is_cluster(cluster_client)
    assert not is_cluster(connect("redis://127.0.0.1:1/0"))
    assert cluster_client.ping()
    # the URL is a valid setting; a database other than 0 is refused
    assert _settings(local_cluster, "X").redis_url.startswith("redis+cluster://")
    with pytest.raises(ConfigError, match="only database 0"):
        connect(local_cluster.url + "/3")
    # `broker cli` runs valkey-cli in cluster mode (-c) for a cluster URL
    argv, _ = cli_command(local_cluster.url, ["PING"])
    assert "-c" in argv and argv[-1] == "PING"


def test_queue_managers_on_different_masters_each_deliver_in_order_once(local_cluster, cluster_client):
    qms = _qms_on_different_masters(local_cluster, 2)
    owners = {local_cluster.owner(keys.publish_stream(qm)) for qm in qms}
    assert len(owners) == 2, "the two queue managers must live on different masters"
    for qm in qms:
        # Given a subscription (through a link), and two in-process workers
        record = subscribe(cluster_client, qm, "/ORDERS/#", "app", "orders")
        link(cluster_client, qm, "/SHOP", "/ORDERS/SHOP")
        workers = make_workers(cluster_client, _settings(local_cluster, qm), 2)
        first, second = Publisher(cluster_client, qm, "p1"), Publisher(cluster_client, qm, "p2")
        # When each publisher publishes in order, one message three times with the same msgid
        for i in range(5):
            first.publish("/ORDERS/EU", f"p1-{i}".encode(), msgid=f"p1-{i}")
            second.publish("/SHOP", f"p2-{i}".encode(), msgid=f"p2-{i}")
        for _ in range(2):
            first.publish("/ORDERS/EU", b"p1-retry", msgid="p1-0")  # a retry after a lost reply
        drain(workers)
        results = _publish_waiting(workers[0], first, "/ORDERS/EU", b"last")
        # Then the waiting publisher learns its result
        assert [(r.status, r.subscriptions) for r in results] == [("delivered", 1)]
        # and the subscriber has each publisher's messages once, in its order
        bodies = [m.body.decode() for m in queue_messages(cluster_client, qm, record.sub_id)]
        assert [b for b in bodies if b.startswith("p1")] == [f"p1-{i}" for i in range(5)]
        assert [b for b in bodies if b.startswith("p2")] == [f"p2-{i}" for i in range(5)]
        assert bodies[-1] == "last" and len(bodies) == 11
        assert sum(w.counts.get("duplicate", 0) for w in workers) == 2
        assert cluster_client.xpending(keys.publish_stream(qm), keys.WORKER_GROUP)["pending"] == 0
        # and a consumer takes and acknowledges them
        with Subscriber(cluster_client, qm, record, heartbeat=False) as consumer:
            got = consumer.receive_many(20, timeout_ms=100)
            assert [d.message.body.decode() for d in got] == bodies
            assert consumer.ack_many(got) == len(got)
            assert consumer.receive(timeout_ms=50) is None  # a blocking wait on the bell, in the slot
        for worker in workers:
            worker.shutdown()
        # every key of the queue manager is on its own master
        master = redis.Redis(port=local_cluster.owner(keys.publish_stream(qm)))
        try:
            assert master.exists(keys.publish_stream(qm), keys.subscriptions(qm), keys.version(qm)) == 3
        finally:
            master.close()


def test_a_stopping_worker_gives_up_its_turns_on_a_cluster(local_cluster, cluster_client):
    # give_up.lua once sent no KEYS: the cluster client sent it to any node, which could not see the turn
    for qm in _qms_on_different_masters(local_cluster, 3):
        subscribe(cluster_client, qm, "/A", "app", "a")
        worker = make_workers(cluster_client, _settings(local_cluster, qm), 1)[0]
        Publisher(cluster_client, qm, "p").publish("/A", b"x")
        taken = worker.scripts.dequeue(worker.name, 10, 30_000, 1, [])
        assert taken is not None and list(taken.turns) == ["p"]
        assert worker.scripts.give_up(worker.name, ["p"]) == 1
        assert cluster_client.exists(keys.turn_key(qm, "p")) == 0


def test_the_rq_scheduler_refuses_a_cluster_with_a_broker_error(local_cluster):
    with pytest.raises(ClusterUnsupported, match="Redis Cluster"):
        schedule(local_cluster.url, "SCHED")


def test_the_function_library_is_loaded_on_every_master_and_called_by_the_subscriptions_slot(
    local_cluster, cluster_client
):
    # Given a cluster whose masters have no library
    for port in local_cluster.ports:
        with redis.Redis(port=port) as node:
            node.function_flush()
    # When a worker's start loads it, Then every master has it, and a consumer's FCALL goes to the
    # master of its subscription's slot
    assert library.load_library(cluster_client) == len(local_cluster.ports)
    assert library.load_library(cluster_client) == 0
    for port in local_cluster.ports:
        with redis.Redis(port=port) as node:
            assert node.fcall_ro("broker_version", 0) == keys.PROTOCOL_VERSION
    for qm in _qms_on_different_masters(local_cluster, 3):
        key = keys.sub_queue(qm, "app$x")
        assert library.fcall(cluster_client, "broker_receive", key, "c1", 1, 1_000, "", "shared") == [
            b"ok",
            0,
        ]


def test_a_commit_and_a_dequeue_on_a_cluster_go_to_their_master_without_asking_the_server_for_keys(
    local_cluster, cluster_client, monkeypatch
):
    # Given a queue manager on the cluster, a subscription and a worker set up
    (qm,) = _qms_on_different_masters(local_cluster, 1)
    sub = subscribe(cluster_client, qm, "t/#", "app", "a")
    (worker,) = make_workers(cluster_client, _settings(local_cluster, qm), 1)
    asked: list[str] = []
    parser = cluster_client.commands_parser
    get_keys = parser.get_keys
    monkeypatch.setattr(
        parser, "get_keys", lambda conn, *args: asked.append(str(args[0])) or get_keys(conn, *args)
    )
    # When publications are dequeued (FCALL broker_dequeue, by itself or pipelined with a commit)
    # and committed (FCALL broker_commit)
    Publisher(cluster_client, qm, "p").publish_many(("t/x", b"%d" % i) for i in range(3))
    drain([worker])
    # Then they were delivered, and redis-py never asked the server for an FCALL's keys (COMMAND
    # GETKEYS, every argument sent again): the call went to the slot's master from the slot map
    assert [m.body for m in queue_messages(cluster_client, qm, sub.sub_id)] == [b"0", b"1", b"2"]
    assert worker.counts == {"delivered": 3}
    assert "FCALL" not in asked
