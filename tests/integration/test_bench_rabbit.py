"""The benchmark's peers on real servers: the AOF switch of the AOF row, and the RabbitMQ peer on a node of
its own. ``.ci/run`` installs Debian's ``rabbitmq-server`` (pika is in the ``test`` extra): under CI a
missing node fails the test; elsewhere it is skipped with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from scripts.bench import rabbit as br
from scripts.bench.aof import set_aof
from scripts.bench.rabbit_node import _session_alive
from scripts.bench.workload import FANOUT

pytestmark = pytest.mark.real


def test_the_aof_row_turns_appendfsync_everysec_on_and_off_again(real_redis: redis.Redis) -> None:
    real_redis.set("k", "v")
    try:
        got = set_aof(real_redis, True)
        assert got == {"appendonly": "yes", "appendfsync": "everysec", "aof_enabled": 1}
        real_redis.set("k2", "v2")
    finally:
        off = set_aof(real_redis, False)
    assert off["aof_enabled"] == 0 and off["appendonly"] == "no"
    assert real_redis.get("k2") == b"v2"


def test_rabbitmq_delivers_what_the_broker_would_and_its_node_is_stopped() -> None:
    missing = br.unavailable()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} (.ci/run installs rabbitmq-server)")
        pytest.skip(missing)
    peer = br.RabbitPeer(procs=2).start()
    try:
        assert peer.node is not None
        node = peer.node
        directory, session = node.directory, node.process.pid if node.process else 0
        assert node.beam_pids()
        runs = {mode: peer.run(mode, 300) for mode in br.MODES}
    finally:
        peer.stop()
    for mode, run in runs.items():
        assert run["n"] == 300 and run["deliveries"] == 300 * FANOUT, mode
        assert run["queues_checked"] == 1450 and run["fanout_measured"] == 10.0
        assert run["pubs_per_s"] > 0 and run["cpu"]["rabbitmq"] > 0
    assert runs["persistent"]["window"] == br.WINDOW and runs["transient"]["window"] is None
    assert peer.info["version"].startswith("3.") and peer.info["topology"]["queues"] == 1450
    assert not Path(directory).exists()
    assert not _session_alive(session)  # the node's processes are gone
    peer.stop()  # twice is harmless
