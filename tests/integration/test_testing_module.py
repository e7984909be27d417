"""``broker.testing`` as a user's own suite uses it: the helpers without pytest, the fixtures as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from broker import Publisher
from broker.testing import Collector, drain, make_workers

REPO = Path(__file__).resolve().parents[2]


def test_helpers_publish_drain_collect(real_redis, settings):
    collector = Collector(real_redis, settings, "orders/#", "shop")
    workers = make_workers(real_redis, settings, 2)
    publisher = Publisher(real_redis, settings.qm, "p1")
    for i in range(5):
        publisher.publish(f"orders/eu/{i}", f"order {i}".encode())
    publisher.publish("invoices/eu/0", b"not for the collector")

    assert drain(workers) == 6
    got = collector.collect()

    assert [m.body for m in got] == [f"order {i}".encode() for i in range(5)]
    assert [m.topic for m in got] == [f"orders/eu/{i}" for i in range(5)]
    assert collector.collect() == []  # acknowledged: nothing is taken twice
    assert collector.bodies == [f"order {i}".encode() for i in range(5)]
    collector.close()


def test_fixtures_in_a_users_suite(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["broker.testing"]\n')
    (tmp_path / "test_shop.py").write_text(
        textwrap.dedent(
            """
            from broker import Publisher
            from broker.testing import drain


            def test_an_order_reaches_the_shop(broker_client, broker_settings, broker_workers, broker_collector):
                shop = broker_collector("orders/+/new", client_id="shop", selector="amount > 10")
                publisher = Publisher(broker_client, broker_settings.qm, "till")
                publisher.publish("orders/eu/new", b"big", properties={"amount": 50})
                publisher.publish("orders/eu/new", b"small", properties={"amount": 5})
                assert drain(broker_workers) == 2
                assert [m.body for m in shop.collect()] == [b"big"]


            def test_each_test_starts_empty(broker_client):
                assert broker_client.dbsize() == 0
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
