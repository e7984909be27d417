"""The channel's guarantees (``broker.network.channel``), on real servers: every publication forwarded
from queue manager A reaches the subscriber queue at B exactly once and in order, whatever
dies, loses a reply, restarts or holds a foreign key on the way.

The network is two queue managers, ``B`` a child of ``A``; a durable subscription at B on
``flights/#`` makes A hold a proxy subscription for B, so A's workers write each publication
on ``flights/...`` into the transmission stream ``{A}:xmit:B`` and A's mover files it into
``{B}:publish``. Nothing here waits on time: the channel processes take an injected clock
and are driven one ``run_once``/``move_once`` at a time; workers run in-process
(``drain``). A mover's lease lives in Redis with a server-side TTL (``MOVER_LEASE_MS``),
which the injected clock does not move: a dead holder's lease running out is simulated by
deleting the lease key (as the workers' crash-point tests delete a dead worker's turns),
or by a PEXPIRE of 1 ms. One test runs ``broker channel`` (its supervisor restarts the
channel process SIGKILLed mid-stream, whose lease really runs out), others stop, kill and
restart real servers; they wait on conditions with a deadline, never on a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from broker import cli, subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import ConfigError
from broker.core.models import publication_fields
from broker.core.server import Server
from broker.core.stream import ensure_group
from broker.network.channel import ChannelProcess
from broker.network.mover import FIRST_BACKOFF_MS, MOVER_LEASE_MS, Mover
from broker.network.network_admin import apply_network, list_proxies, network_status
from broker.testing import drain, make_workers, queue_messages, wait_for
from broker.topics.routing import RoutingTable
from broker.topics.topology import parse_network
from scripts.rig.proxy import Proxy, evalsha
from worker.loop import Worker

A, B = "A", "B"
FILTER = "flights/#"
REPO = Path(__file__).resolve().parents[2]
PACKAGED_CONF = REPO / "broker" / "conf" / "redis.conf"
MAX_BACKOFF_MS = 800


class Clock:
    """The channel processes' clock, ms: moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = int(time.time() * 1000)  # heartbeats are read against the wall clock

    def __call__(self) -> int:
        return self.now


class Died(BaseException):
    """A channel process's death at a crash point (a SIGKILL, simulated in-process)."""


class DieAt:
    """A hook that raises ``Died`` the ``after``-th time ``point`` is passed, once armed."""

    def __init__(self, point: str, after: int = 1) -> None:
        self.point, self.after, self.armed = point, after, False
        self.passed: list[str] = []

    def __call__(self, at: str) -> None:
        self.passed.append(at)
        if self.armed and at == self.point:
            self.after -= 1
            if self.after <= 0:
                self.armed = False
                raise Died(at)


@dataclass
class Fed:
    """Queue managers A and B, B a child of A, with a subscription at B and one at A."""

    clients: dict[str, redis.Redis]
    settings: dict[str, Settings]
    clock: Clock
    sub_id: str
    local_sub_id: str
    workers: dict[str, list[Worker]] = field(default_factory=dict)
    processes: dict[str, ChannelProcess] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    hook: Callable[[str], None] | None = None

    # -- publications ------------------------------------------------------------------------

    def publish(self, count: int, topic: str = "flights/{n}", publisher: str = "p1") -> list[str]:
        """``count`` publications at A, msgids ``m0000``...; returns their msgids."""
        out = []
        for _ in range(count):
            n = len(self.published)
            msgid = f"m{n:04d}"
            fields = publication_fields(
                publisher, topic.format(n=n), f"body {n}".encode(), msgid=msgid, seq=n + 1
            )
            self.clients[A].xadd(keys.publish_stream(A), fields)  # type: ignore[arg-type]
            self.published.append(msgid)
            out.append(msgid)
        return out

    def forward(self) -> int:
        """A's workers: each publication into the local queue and the transmission stream."""
        return drain(self.workers[A])

    def file(self) -> int:
        """B's workers: what the channel filed into B's publish stream, into the subscriber queue."""
        return drain(self.workers[B])

    # -- the channel -------------------------------------------------------------------------

    @property
    def process(self) -> ChannelProcess:
        return self.processes[A]

    def mover(self) -> Mover:
        process = self.process
        if B not in process.movers:
            process._movers(process.agent.topology or process.agent.load())
        return process.movers[B]

    def restart_process(self, name: str, hook: Callable[[str], None] | None = None) -> ChannelProcess:
        """A's channel process started again (a new name, as a new pid gives); the dead one's
        lease is over (its key deleted: the server-side TTL ran out)."""
        self.clients[A].delete(keys.channel_mover(A, B))
        self.processes[A] = ChannelProcess(
            self.clients[A], self.settings[A], name=name, clock_ms=self.clock, hook=hook
        )
        return self.processes[A]

    def move_all(self, rounds: int = 100) -> int:
        """Run A's channel process until a round moves nothing; returns how many were moved."""
        total = 0
        for _ in range(rounds):
            moved = self.process.run_once()
            total += moved
            if moved == 0:
                return total
        raise AssertionError(f"the channel still moves after {rounds} rounds")

    def xmit(self) -> list[str]:
        """The entry ids (channel sequences) in ``{A}:xmit:B``."""
        return [_text(i) for i, _ in self.clients[A].xrange(keys.transmission(A, B))]

    def received(self) -> tuple[str, int]:
        """``{B}:received``: the last sequence filed from A and how many were filed."""
        record = self.clients[B].hgetall(keys.received(B))
        return _text(record.get(b"A", b"")), int(record.get(b"A:count", 0))

    def delivered(self) -> list[str]:
        """The msgids in B's subscriber queue, in the order a consumer takes them."""
        messages = queue_messages(self.clients[B], B, self.sub_id)
        for message in messages:
            assert (message.origin, message.route) == (A, (A,)), message
        return [m.msgid for m in messages]

    def local(self) -> list[str]:
        return [m.msgid for m in queue_messages(self.clients[A], A, self.local_sub_id)]

    def state(self) -> dict[str, str]:
        raw = self.clients[A].hgetall(keys.channel_state(A, B))
        return {_text(k): _text(v) for k, v in raw.items()}

    def channel_row(self) -> dict[str, Any]:
        found = network_status(self.clients[A], A, self.settings[A].redis_url).as_dict()
        return next(r for r in found["channels"] if (r["from"], r["to"]) == (A, B))

    def check_exactly_once(self) -> None:
        """Everything published reached B's subscriber once, in order, and A's local one too; the
        channel filed each once (B's dedup records, which would hide a second copy from the
        subscriber, had nothing to drop)."""
        self.forward()
        self.file()
        assert self.delivered() == self.published
        assert self.local() == self.published
        assert self.received() == (self.xmit()[-1], len(self.published))
        assert self.clients[B].xlen(keys.publish_stream(B)) == len(self.published)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)


def federate(
    clients: dict[str, redis.Redis],
    urls: dict[str, str],
    *,
    network_urls: dict[str, str] | None = None,
    retention_ms: int = 60_000,
    batch: int = 500,
    hook: Callable[[str], None] | None = None,
) -> Fed:
    """Apply the network A <- B, subscribe at B (and at A), start workers and channel processes
    and run the agents until A holds its proxy subscription for B."""
    nodes = network_urls or urls
    network = parse_network(
        {
            "retention_ms": retention_ms,
            "queue_managers": {"A": {"url": nodes[A]}, "B": {"url": nodes[B], "parent": A}},
        }
    )
    applied = apply_network(network, urls[A], clients[A])
    assert not applied.failed, applied.results
    settings = {
        qm: Settings(
            redis_url=urls[qm],
            qm=qm,
            batch_size=50,
            lease_ms=30_000,
            sweep_interval_ms=1,
            channel_batch=batch,
            channel_max_backoff_ms=MAX_BACKOFF_MS,
            network_poll_ms=1_000,
            trim_every_entries=0,  # the publish streams keep what was filed: check_exactly_once counts it
        )
        for qm in (A, B)
    }
    fed = Fed(
        clients,
        settings,
        Clock(),
        subscribe(clients[B], B, FILTER, "app", "fed").sub_id,
        subscribe(clients[A], A, FILTER, "here", "local").sub_id,
        hook=hook,
    )
    for qm in (A, B):
        fed.processes[qm] = ChannelProcess(
            clients[qm], settings[qm], name=f"ch-{qm}-1", clock_ms=fed.clock, hook=hook if qm == A else None
        )
        fed.processes[qm].rejoin()
    fed.processes[B].agent.round()
    fed.processes[A].agent.round()
    assert [p.qm for p in list_proxies(clients[A], A)[0]] == [B]
    for qm in (A, B):
        fed.workers[qm] = make_workers(clients[qm], settings[qm], 1)
    return fed


@pytest.fixture
def one_server(real_server: Server, real_redis: redis.Redis) -> dict[str, Any]:
    """A and B in the session's server."""
    return {"clients": {A: real_redis, B: real_redis}, "urls": {A: real_server.url, B: real_server.url}}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, Server]]:
    """A on a server of its own, B on another with the packaged conf (AOF, everysec), in tmp_path."""
    made = {
        A: Server(data_dir=tmp_path / "a"),
        B: Server(data_dir=tmp_path / "b", config_file=PACKAGED_CONF, args=("--save", "")),
    }
    for server in made.values():
        server.start()
    yield made
    for server in made.values():
        server.stop()


def _clients(servers: dict[str, Server]) -> dict[str, redis.Redis]:
    return {qm: connect(server.url) for qm, server in servers.items()}


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    wait_for(condition, timeout_s, what, interval_s=0.002)


# --- 1. crash points --------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["before_channel_in", "after_channel_in"])
def test_a_mover_killed_at_a_crash_point_loses_and_duplicates_nothing(one_server, point):
    # Given a channel moving 4 entries per batch, and 10 publications already moved
    hook = DieAt(point, after=2)
    fed = federate(one_server["clients"], one_server["urls"], batch=4, hook=hook)
    fed.publish(10)
    fed.forward()
    assert fed.move_all() == 10
    assert fed.received() == (fed.xmit()[-1], 10)
    # When the process dies at the point in its second batch of the next 10
    fed.publish(10)
    fed.forward()
    hook.armed = True
    fed.process.run_once()
    with pytest.raises(Died):
        fed.process.run_once()
    assert hook.passed.count(point) >= 2
    # Then the receiver has what the script filed: the first batch, and the second only after it
    filed = 14 if point == "before_channel_in" else 18
    assert fed.received() == (fed.xmit()[filed - 1], filed)
    # When a new process starts (the dead one's lease over) and more publications come
    fed.restart_process("ch-A-2")
    fed.publish(5)
    fed.forward()
    fed.move_all()
    # Then B's subscriber has every publication once, in order
    fed.check_exactly_once()
    assert fed.state()["state"] == "running"
    assert fed.channel_row()["lag"] == 0


def _channel_process(url: str, cwd: Path, batch: int) -> subprocess.Popen[bytes]:
    """``broker channel`` for A (a supervisor and its channel process), from this worktree's
    package, with small batches."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("BROKER_") or k == "BROKER_REDIS_SERVER_BIN"
    }
    env.update(PYTHONPATH=str(REPO), BROKER_CHANNEL_BATCH=str(batch), BROKER_NETWORK_POLL_MS="100")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from broker.cli import main; main()",
            "--redis-url",
            url,
            "--qm",
            A,
            "channel",
            "--wait-ms",
            "5000",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _channel_pids(client: redis.Redis) -> set[int]:
    """The pids in A's channel process heartbeats."""
    return {int(json.loads(raw)["pid"]) for raw in client.hvals(keys.network_agents(A))}


def test_a_channel_process_sigkilled_mid_stream_loses_duplicates_and_reorders_nothing(one_server, tmp_path):
    # Given `broker channel` for A, its channel process moving 2 entries per batch
    fed = federate(one_server["clients"], one_server["urls"])
    client = fed.clients[A]
    supervisor = _channel_process(one_server["urls"][A], tmp_path, batch=2)
    try:
        _wait_for(lambda: len(_channel_pids(client)) == 1, 20, "the channel process")
        (victim,) = _channel_pids(client)
        while fed.received()[1] < 20:
            fed.publish(5)
            fed.forward()
            _wait_for(lambda: fed.received()[1] == len(fed.published), 10, "the channel to move")
        # When publications stream in and the channel process is SIGKILLed while it moves them
        fed.publish(300)
        fed.forward()
        moving = fed.received()[1]
        _wait_for(lambda: fed.received()[1] >= moving + 20, 20, "the channel to move")
        os.kill(victim, signal.SIGKILL)
        killed_at = fed.received()[1]
        assert moving < killed_at < len(fed.published)  # in the middle of the stream
        fed.publish(50)
        fed.forward()
        # Then the supervisor starts it again; it moves the rest once the dead one's lease ran out
        _wait_for(lambda: fed.received()[1] == len(fed.published), 30, "the channel to catch up")
        assert _channel_pids(client) - {victim}  # a new process (the dead one's heartbeat stays)
        fed.publish(20)
        fed.forward()
        _wait_for(lambda: fed.received()[1] == len(fed.published), 10, "the channel to catch up")
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(20)
    # And B's subscriber has every publication once, in order
    fed.check_exactly_once()
    assert not client.exists(keys.channel_mover(A, B))  # given up at the orderly stop


# --- 2. a lost reply ---------------------------------------------------------------------------


def test_a_lost_reply_of_channel_in_duplicates_nothing(real_server, real_redis):
    # Given the mover reaching B through a proxy that can lose replies
    proxy = Proxy(real_server.port).start()
    try:
        urls = {A: real_server.url, B: real_server.url}
        fed = federate({A: real_redis, B: real_redis}, urls, network_urls={A: real_server.url, B: proxy.url})
        fed.publish(5)
        fed.forward()
        assert fed.move_all() == 5  # channel_in.lua is loaded on B now
        # When the reply to the next channel_in.lua is lost (the script applied)
        fed.publish(5)
        fed.forward()
        proxy.drop_reply(evalsha("channel_in"), label="channel_in")
        assert fed.mover().move_once() == 0
        assert proxy.wait_for_drops(1)
        assert proxy.stats.drops_by_label == {"channel_in": 1}
        assert fed.received() == (fed.xmit()[-1], 10)
        state = fed.state()
        assert (state["state"], state["in_flight"], state["backoff_ms"]) == ("retrying", "5", "100")
        assert "Connection" in state["last_error"]
        # Then the next try, after the pause, sends nothing twice
        fed.clock.now += FIRST_BACKOFF_MS
        fed.move_all()
        assert fed.clients[B].xlen(keys.publish_stream(B)) == 10
        fed.publish(3)
        fed.forward()
        fed.move_all()
        fed.check_exactly_once()
        assert fed.state()["state"] == "running"
    finally:
        proxy.stop()


# --- 3. the receiver down ----------------------------------------------------------------------


def test_a_receiver_down_is_retried_with_a_doubling_pause_then_caught_up(servers):
    # Given A and B on two servers, 5 publications moved
    clients = _clients(servers)
    fed = federate(clients, {qm: s.url for qm, s in servers.items()})
    fed.publish(5)
    fed.forward()
    assert fed.move_all() == 5
    # When B's server is stopped and publications keep coming at A
    servers[B].stop()
    pauses = []
    for _ in range(6):
        fed.publish(3)
        assert fed.forward() == 3  # A's workers keep forwarding into the transmission stream
        assert fed.process.run_once() == 0
        pauses.append(fed.mover().backoff_ms)
        state = fed.state()
        assert (state["state"], state["last_error_ms"]) == ("retrying", str(fed.clock.now))
        assert state["backoff_ms"] == str(fed.mover().backoff_ms)
        # nothing is tried again before the pause is over
        fed.clock.now += fed.mover().backoff_ms - 1
        assert fed.mover().move_once() == 0
        assert fed.state()["last_error_ms"] == state["last_error_ms"]
        fed.clock.now += 1
    # Then the pause doubles from 100 ms up to the maximum, and the channel says why
    assert pauses == [100, 200, 400, 800, 800, 800]
    assert len(fed.xmit()) == 5 + 18
    row = fed.channel_row()
    assert row["state"] == "retrying"
    assert row["backoff_ms"] == MAX_BACKOFF_MS
    assert "Error 111" in row["last_error"] or "Connection refused" in row["last_error"]
    assert row["lag"] is None  # B's count cannot be read
    status = network_status(fed.clients[A], A, servers[A].url).as_dict()
    assert [q["reachable"] for q in status["queue_managers"]] == [True, False]
    # When B's server is started again (same port and directory, its AOF)
    servers[B].start()
    assert fed.received() == (fed.xmit()[4], 5)
    fed.publish(2)
    fed.forward()
    fed.move_all()
    # Then the channel catches up: lag 0, nothing lost or duplicated
    row = fed.channel_row()
    assert (row["state"], row["lag"], row["backoff_ms"], row["in_flight"]) == ("running", 0, 0, 0)
    fed.check_exactly_once()


# --- 4. the receiver restarted from an older state ---------------------------------------------


@pytest.fixture
def rdb_receiver(tmp_path: Path) -> Iterator[dict[str, Server]]:
    """A in memory; B persisted only by an explicit SAVE (so a SIGKILL brings back that snapshot)."""
    made = {
        A: Server(data_dir=tmp_path / "a"),
        B: Server(data_dir=tmp_path / "b", args=("--save", "", "--appendonly", "no")),
    }
    for server in made.values():
        server.start()
    yield made
    for server in made.values():
        server.stop()


def test_a_receiver_restarted_from_an_older_snapshot_is_sent_the_retained_entries_again(rdb_receiver):
    # Given 5 publications moved and delivered at B, and B's state saved then
    servers = rdb_receiver
    fed = federate(_clients(servers), {qm: s.url for qm, s in servers.items()})
    fed.publish(5)
    fed.forward()
    fed.move_all()
    fed.file()
    fed.clients[B].save()
    # When 5 more are moved and delivered, and B is killed and restarted from its snapshot
    fed.publish(5)
    fed.forward()
    fed.move_all()
    fed.file()
    assert fed.delivered() == fed.published
    servers[B].kill()
    servers[B].start()
    assert fed.received() == (fed.xmit()[4], 5)
    assert fed.delivered() == fed.published[:5]
    # Then the mover sends again what B no longer has (kept by retention_ms), once
    fed.publish(5)
    fed.forward()
    fed.move_all()
    fed.check_exactly_once()


def test_a_receiver_whose_record_went_back_is_sent_the_retained_entries_again(one_server):
    # Given 8 publications moved (not yet handled by B's workers)
    fed = federate(one_server["clients"], one_server["urls"])
    fed.publish(3)
    fed.forward()
    fed.move_all()
    fed.publish(5)
    fed.forward()
    fed.move_all()
    client = fed.clients[B]
    # When B loses its last 5 filed entries (as an AOF that lost its last second)
    filed = client.xrange(keys.publish_stream(B))
    client.xdel(keys.publish_stream(B), *[i for i, _ in filed[3:]])
    client.hset(keys.received(B), mapping={A: fed.xmit()[2], f"{A}:count": 3})
    # Then the same mover sends them again, once
    fed.publish(2)
    fed.forward()
    fed.move_all()
    fed.check_exactly_once()
    assert client.xlen(keys.publish_stream(B)) == 10


def test_filed_entries_are_trimmed_retention_ms_after_the_last_filed_and_not_before(one_server):
    # Given 300 transmission entries stamped two minutes ago (rewritten by hand with their ids)
    # and 2 stamped now, retention_ms one minute, 100 entries per move
    fed = federate(one_server["clients"], one_server["urls"], retention_ms=60_000, batch=100)
    client = fed.clients[A]
    fed.publish(302)
    fed.forward()
    entries = [fields for _, fields in client.xrange(keys.transmission(A, B))]
    client.delete(keys.transmission(A, B))
    old = fed.clock.now - 120_000
    for n, fields in enumerate(entries[:300]):
        client.xadd(keys.transmission(A, B), fields, id=f"{old}-{n}")
    for fields in entries[300:]:
        client.xadd(keys.transmission(A, B), fields)
    written = fed.xmit()
    # When the first old ones are filed, nothing is trimmed (all within retention_ms of the last filed)
    assert fed.mover().move_once() == 100
    assert fed.xmit() == written
    # When the rest is filed
    fed.move_all()
    # Then old entries are trimmed (XTRIM MINID ~: whole stream nodes of 100), never a recent one
    left = fed.xmit()
    assert left == written[-len(left) :]
    assert len(left) <= len(written) - 200
    assert left[-2:] == written[-2:]
    assert fed.received() == (written[-1], 302)
    fed.file()
    assert fed.delivered() == fed.published


# --- 5. the sender's server killed and restarted ----------------------------------------------


def test_the_transmission_stream_survives_a_kill_of_the_senders_server(tmp_path, real_server, real_redis):
    # Given A on a server with an AOF (the packaged conf), B in the session's server
    sender = Server(
        data_dir=tmp_path / "a", config_file=PACKAGED_CONF, args=("--save", "", "--appendfsync", "always")
    ).start()
    try:
        fed = federate({A: connect(sender.url), B: real_redis}, {A: sender.url, B: real_server.url}, batch=4)
        fed.publish(10)
        fed.forward()
        assert fed.mover().move_once() == 4
        written = fed.xmit()
        # When A's server is SIGKILLed before the rest is moved
        sender.kill()
        assert fed.mover().move_once() == 0  # A cannot be reached: a pause, no crash
        assert fed.mover().backoff_ms == FIRST_BACKOFF_MS
        # Then, started again from its AOF, A still has its transmission stream, and it is moved
        sender.start()
        assert fed.xmit() == written
        fed.clock.now += MAX_BACKOFF_MS
        fed.publish(5)
        fed.forward()
        fed.move_all()
        fed.check_exactly_once()
        assert fed.state()["state"] == "running"
    finally:
        sender.stop()


# --- 6. foreign state --------------------------------------------------------------------------


def _dead_letters(client: redis.Redis, qm: str) -> list[dict[str, str]]:
    return [
        {_text(k): _text(v) for k, v in fields.items()} for _, fields in client.xrange(keys.dead_letter(qm))
    ]


def test_a_transmission_stream_holding_a_list_refuses_the_publication_as_a_whole(one_server):
    # Given A's transmission stream to B replaced by a list (a foreign key)
    fed = federate(one_server["clients"], one_server["urls"])
    client = fed.clients[A]
    client.rpush(keys.transmission(A, B), "not a stream")
    local_only = subscribe(client, A, "trains/#", "here", "trains").sub_id
    # When a publication for B (and A's local subscription) and one for A only are made
    client.xadd(keys.publish_stream(A), publication_fields("p1", "flights/1", b"x", msgid="f1"))
    client.xadd(keys.publish_stream(A), publication_fields("p1", "trains/1", b"y", msgid="t1"))
    assert fed.forward() == 2
    # Then the first is refused as a whole, with the reason; the worker went on with the second
    dead = _dead_letters(client, A)
    assert len(dead) == 1
    assert dead[0]["msgid"] == "f1"
    assert f"foreign key: {keys.transmission(A, B)} holds a list, not a stream" in dead[0]["dlq.reason"]
    assert fed.local() == []
    assert [m.msgid for m in queue_messages(client, A, local_only)] == ["t1"]
    assert client.lrange(keys.transmission(A, B), 0, -1) == [b"not a stream"]
    # And the mover reports the foreign key and retries, without dying
    assert fed.process.run_once() == 0
    row = fed.channel_row()
    assert row["state"] == "retrying"
    assert "WRONGTYPE" in row["last_error"]
    # When the key is removed, the channel carries on
    client.delete(keys.transmission(A, B))
    fed.clock.now += MAX_BACKOFF_MS
    fed.publish(3)
    fed.forward()
    fed.move_all()
    fed.check_exactly_once()


@pytest.mark.parametrize(
    "fields",
    [
        {"e": "garbage"},
        {"e": b"\xff\xfe not json\nbody"},
        {"e": b'["a list"]\nbody'},
        {"e": b'{"publisher": "p", "msgid": "x", "topic": "flights/1"}\nno ts'},
        {"e": b'{"publisher": "p", "msgid": "x", "topic": "flights/1", "ts": 1, "route": 5}\nbad route'},
        {"e": b'{"publisher": "p", "msgid": "x", "topic": "flights/1", "ts": 1, "route": [1]}\nbad route'},
        {"envelope": "no e field"},
    ],
    ids=[
        "not-an-envelope",
        "not-utf8",
        "header-not-object",
        "no-ts",
        "route-not-list",
        "route-not-names",
        "no-e",
    ],
)
def test_an_unreadable_transmission_entry_is_dead_lettered_and_the_next_ones_move(one_server, fields):
    # Given a good publication, an entry written by hand, then more publications
    fed = federate(one_server["clients"], one_server["urls"])
    client = fed.clients[A]
    fed.publish(2)
    fed.forward()
    bad = _text(client.xadd(keys.transmission(A, B), fields))
    fed.publish(3)
    fed.forward()
    # When the channel moves
    fed.move_all()
    # Then the entry is dead-lettered on A with its fields and a reason, and out of the stream
    dead = _dead_letters(client, A)
    assert len(dead) == 1
    assert dead[0]["dlq.entry_id"] == bad
    assert dead[0]["dlq.reason"].startswith("channel A -> B: unreadable transmission entry")
    assert {k: dead[0][k] for k in fields} == {k: _text(v) for k, v in fields.items()}
    assert bad not in fed.xmit()
    # And every publication around it reached B once, in order; the channel is not behind
    fed.check_exactly_once()
    row = fed.channel_row()
    assert (row["state"], row["lag"], row["dead_lettered"]) == ("running", 0, 1)


@pytest.mark.parametrize("key", ["received", "publish", "received-sequence"])
def test_a_foreign_key_at_the_receiver_is_reported_and_retried_nothing_lost_once_removed(one_server, key):
    # Given 3 publications moved and delivered, then B's key replaced by a string (or B's record
    # of A's last sequence by garbage)
    fed = federate(one_server["clients"], one_server["urls"])
    fed.publish(3)
    fed.forward()
    fed.move_all()
    fed.file()
    client = fed.clients[B]
    name = keys.publish_stream(B) if key == "publish" else keys.received(B)
    if key == "received-sequence":
        client.hset(name, A, "garbage")
        fed.mover().last = None  # as a process started now
    else:
        client.delete(name)
        client.set(name, "foreign")
    # When more publications come
    fed.publish(4)
    fed.forward()
    for _ in range(3):
        fed.process.run_once()
        fed.clock.now += MAX_BACKOFF_MS
    # Then the channel reports the foreign key and keeps retrying
    row = fed.channel_row()
    assert row["state"] == "retrying"
    assert any(w in row["last_error"] for w in ("WRONGTYPE", "foreign key", "Invalid stream ID")), row
    assert fed.mover().backoff_ms == 400
    assert len(fed.xmit()) == 7
    # When the operator removes it (B's workers make their group again, as when they start)
    client.delete(name)
    if key == "publish":
        ensure_group(client, B)
    fed.publish(2)
    fed.forward()
    fed.move_all()
    fed.forward()
    fed.file()
    # Then nothing is lost; what is filed again (B lost its record) is dropped by B's dedup records
    assert fed.delivered() == fed.published
    assert fed.local() == fed.published
    assert fed.channel_row()["state"] == "running"


def test_a_corrupt_proxy_record_is_skipped_and_nothing_dies(one_server):
    # Given a proxy subscription record at A that is JSON of the wrong shape, and one not JSON
    fed = federate(one_server["clients"], one_server["urls"])
    client = fed.clients[A]
    client.hset(keys.proxies(A), "B dynamic trains", '{"qm": "B", "topic": "trains", "since_ms": null}')
    client.hset(keys.proxies(A), "B dynamic boats", "not json")
    client.incr(keys.version(A))
    # When publications come and the channel process runs
    fed.publish(3)
    fed.forward()
    table = RoutingTable(A)
    table.load(client)
    assert {p.key for p in table.problems} == {keys.proxies(A)}
    problems = network_status(client, A, fed.settings[A].redis_url).problems
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        f"{keys.proxies(A)} field 'B dynamic {t}'" for t in ("boats", "trains")
    ]
    fed.move_all()
    # Then the worker skipped them and forwarded the rest, and the agent replaced them
    fed.check_exactly_once()
    assert sorted(_text(f) for f in client.hkeys(keys.proxies(A))) == ["B dynamic flights"]


def test_a_corrupt_announcement_of_the_receiver_stops_neither_the_agent_nor_the_mover(one_server):
    # Given B's announcement record replaced by one of the wrong shape
    fed = federate(one_server["clients"], one_server["urls"])
    fed.clients[B].set(keys.announced(B), '{"state": "up", "keys": {"flights": "yesterday"}}')
    fed.publish(3)
    fed.forward()
    # When A's channel process runs (its agent reads B's record)
    fed.move_all()
    fed.clock.now += 2_000
    fed.move_all()
    # Then it went on, said why in its heartbeat, and kept B's proxy subscription
    problems = network_status(fed.clients[A], A, fed.settings[A].redis_url).problems
    assert problems == [f"channel process ch-A-1: {keys.announced(B)} is not an announcement record"]
    assert [p.qm for p in list_proxies(fed.clients[A], A)[0]] == [B]
    fed.check_exactly_once()


def test_a_corrupt_network_record_stops_neither_the_worker_nor_the_mover(one_server):
    # Given publications in the transmission stream, then A's network record corrupted
    fed = federate(one_server["clients"], one_server["urls"])
    client = fed.clients[A]
    fed.publish(3)
    fed.forward()
    client.set(keys.network(A), "not json")
    client.incr(keys.version(A))
    # When A's worker and channel process run
    client.xadd(keys.publish_stream(A), publication_fields("p1", "flights/x", b"", msgid="during"))
    assert fed.forward() == 1
    fed.move_all()
    # Then the worker delivered locally (in no network now: nothing forwarded) and the mover
    # moved what was already in the transmission stream; the problem is reported
    assert fed.local() == [*fed.published, "during"]
    assert fed.received()[1] == 3
    table = RoutingTable(A)
    table.load(client)
    assert [p.key for p in table.problems] == [keys.network(A)]
    beat = json.loads(client.hget(keys.network_agents(A), "ch-A-1"))
    assert any(keys.network(A) in p for p in beat["problems"]), beat
    with pytest.raises(ConfigError, match=r"not valid|Invalid JSON|invalid"):
        network_status(client, A, fed.settings[A].redis_url).as_dict()


# --- 7. two movers on one channel --------------------------------------------------------------


def test_two_channel_processes_one_mover_at_a_time_and_nothing_twice_even_if_both_move(one_server):
    # Given two channel processes for A
    fed = federate(one_server["clients"], one_server["urls"])
    client, lease = fed.clients[A], keys.channel_mover(A, B)
    first = fed.process
    second = ChannelProcess(client, fed.settings[A], name="ch-A-2", clock_ms=fed.clock)
    fed.publish(5)
    fed.forward()
    # When both run, only the lease holder moves
    assert first.run_once() == 5
    fed.publish(5)
    fed.forward()
    assert second.run_once() == 0
    assert client.get(lease) == b"ch-A-1"
    assert fed.received()[1] == 5
    # When the holder dies: its lease runs out on the server (the clock alone does not end it)
    fed.clock.now += MOVER_LEASE_MS + 1
    assert second.run_once() == 0
    client.pexpire(lease, 1)
    _wait_for(lambda: not client.exists(lease), 5, "the lease to run out")
    # Then the other takes over, and the first (resumed) no longer moves
    assert second.run_once() == 5
    assert client.get(lease) == b"ch-A-2"
    fed.publish(2)
    fed.forward()
    assert first.run_once() == 0
    assert second.run_once() == 2
    # When both move anyway (a holder resumed after a pause, still believing its lease runs)
    first.movers[B]._lease_until = fed.clock.now + 10 * MOVER_LEASE_MS
    for n in range(6):
        fed.publish(3)
        fed.forward()
        movers = (first, second) if n % 2 else (second, first)
        for process in movers:
            process.run_once()
    first.run_once()
    # Then nothing is filed twice
    fed.check_exactly_once()


# --- 8. from the command line -------------------------------------------------------------------


def test_a_new_user_runs_the_channel_from_the_command_line(servers, tmp_path, monkeypatch, capfd):
    url = {qm: s.url for qm, s in servers.items()}
    (tmp_path / "network.toml").write_text(
        f'[queue_managers.A]\nurl = "{url[A]}"\n\n[queue_managers.B]\nurl = "{url[B]}"\nparent = "A"\n'
    )
    runner = CliRunner(
        env={k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    )

    def broker(qm: str, *args: str) -> Any:
        return runner.invoke(cli.main, ["--redis-url", url[qm], "--qm", qm, *args])

    def valkey_cli(qm: str, *args: str) -> list[str]:
        """``broker cli ARGS``: valkey-cli writes to this process's stdout (fd 1), read with capfd."""
        capfd.readouterr()
        assert broker(qm, "cli", *args).exit_code == 0
        return capfd.readouterr().out.splitlines()

    monkeypatch.chdir(tmp_path)
    # Given the network applied, a subscription at B, and one channel round on each
    done = broker(A, "network", "apply", "network.toml")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == ["A: applied", "B: applied"]
    clients = _clients(servers)
    sub_id = subscribe(clients[B], B, FILTER, "app", "fed").sub_id
    assert "channels: A" in broker(B, "channel", "--once").output
    assert "channels: B" in broker(A, "channel", "--once").output
    proxies = json.loads(broker(A, "proxies", "--json").output)
    assert [(p["qm"], p["topic"]) for p in proxies["proxies"]] == [(B, "flights")]
    # When 3 publications are made at A, forwarded by its worker, and the channel runs once
    for n in range(3):
        published = broker(A, "publish", "flights/1", f"hello {n}", "--msgid", f"m{n}", "--no-wait")
        assert published.exit_code == 0, published.output
    settings = {qm: Settings(redis_url=url[qm], qm=qm) for qm in (A, B)}
    drain(make_workers(clients[A], settings[A], 1))
    moved = broker(A, "channel", "--once")  # again at once: the last one gave up its lease
    assert moved.exit_code == 0, moved.output
    assert moved.output.strip() == "A: moved 3 transmission entries; channels: B"
    drain(make_workers(clients[B], settings[B], 1))
    assert [m.msgid for m in queue_messages(clients[B], B, sub_id)] == ["m0", "m1", "m2"]
    # Then valkey-cli shows what the protocol says: one entry per envelope (field e) whose id is the
    # channel sequence, and B's record of the last sequence filed from A and how many
    lines = valkey_cli(A, "XRANGE", keys.transmission(A, B), "-", "+")
    ids = [lines[i] for i in range(len(lines)) if i % 4 == 0]
    assert len(ids) == 3 and all(lines[i + 1] == "e" for i in range(0, len(lines), 4)), lines
    assert all('"msgid":"m' in lines[i + 2] for i in range(0, len(lines), 4))
    received = valkey_cli(B, "HGETALL", keys.received(B))
    assert dict(zip(received[::2], received[1::2], strict=True)) == {A: ids[-1], f"{A}:count": "3"}
    # When B's server is down and A goes on
    servers[B].stop()
    broker(A, "publish", "flights/2", "while B is down", "--msgid", "m3", "--no-wait")
    drain(make_workers(clients[A], settings[A], 1))
    moved = broker(A, "channel", "--once")
    assert moved.exit_code == 0, moved.output
    assert "moved 0" in moved.output
    # Then `broker status --network` shows the channel retrying, with its error
    shown = broker(A, "status", "--network")
    assert shown.exit_code == 0, shown.output
    line = next(ln for ln in shown.output.splitlines() if "A -> B" in ln)
    assert "retrying" in line and "Error 111" in line, shown.output
    as_json = json.loads(broker(A, "status", "--network", "--json").output)
    row = next(r for r in as_json["channels"] if (r["from"], r["to"]) == (A, B))
    assert row["state"] == "retrying" and row["lag"] is None
    assert next(q for q in as_json["queue_managers"] if q["qm"] == B)["reachable"] is False
