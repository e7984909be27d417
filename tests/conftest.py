"""Fixtures: one real server for the session (started here, from the binary the
install brings, or ``$BROKER_REDIS_SERVER_BIN``), fakeredis for fast unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from click.testing import CliRunner, Result

from broker import cli
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.server import Server
from broker.testing import start_server
from scripts.rig.cluster import LocalCluster

QM = "TEST"


@pytest.fixture(scope="session")
def real_server() -> Iterator[Server]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """A 3-master Redis Cluster (``scripts.rig.cluster``) for the session (``test_cluster.py``,
    ``test_federation.py``: each test uses queue manager names of its own)."""
    cluster = LocalCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def real_redis(real_server: Server) -> Iterator[redis.Redis]:
    client = connect(real_server.url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def fake_redis() -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis()
    yield client
    client.flushall()


@pytest.fixture(
    params=[pytest.param("fake", marks=pytest.mark.fake), pytest.param("real", marks=pytest.mark.real)]
)
def any_redis(request: pytest.FixtureRequest) -> redis.Redis:
    """Both backends, for behaviour that fakeredis models faithfully (plain commands, no worker scripts)."""
    name = "fake_redis" if request.param == "fake" else "real_redis"
    return request.getfixturevalue(name)


@pytest.fixture
def settings(real_server: Server) -> Settings:
    return Settings(
        redis_url=real_server.url, qm=QM, batch_size=50, heads=50, lease_ms=30_000, sweep_interval_ms=1
    )


@pytest.fixture
def run(real_server, real_redis, tmp_path, monkeypatch):
    """Invoke ``broker --redis-url <server> --qm TEST ...`` (CliRunner) with no config file and no BROKER_* variables."""
    monkeypatch.chdir(tmp_path)
    env = {k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    runner = CliRunner(env=env)

    def invoke(*args: str) -> Result:
        return runner.invoke(cli.main, ["--redis-url", real_server.url, "--qm", QM, *args])

    return invoke


@pytest.fixture
def users(real_server: Server, real_redis: redis.Redis) -> Iterator[Any]:
    """ACL users of one test (``tests.integration.test_security.Users``: made through
    ``broker.operations.acl``), deleted after it."""
    from tests.integration.test_security import Users

    made = Users(real_server, real_redis)
    yield made
    made.close()
