"""Faults other than a worker's death at a crash point: lost replies, zombies, Redis restarts, poison.

Each fault is injected at a named point (a worker hook, or the reply-dropping
proxy of ``scripts.rig.proxy`` armed for one command), never after a sleep.
Workers run either round by round (``drain``) or through their real loop
(``Worker.run``, stopped by a hook once the stream is drained or after a bound
on rounds), so that the loop's own error handling is what is tested.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import worker.decide as worker_decide
from broker import ConnectionLost, Publisher, link, subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.models import publication_fields
from broker.core.server import Server, free_port
from broker.core.unit_of_work import CommitBatch
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from scripts.rig.history import History, Publication, check_queues
from scripts.rig.proxy import Proxy, call_of
from worker.loop import Worker

QM = "TEST"

FILTERS = {"exact": "/a/x", "plus": "/a/+", "hash": "/a/#", "linked": "/news/#"}
LINKS = [("/a/y", "/news/y")]
TOPICS = ["/a/x", "/a/y", "/b", "/a/x/deep"]

#: Server directives of the restart tests: AOF, fsync before every reply.
AOF_ARGS = (
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--aof-load-truncated",
    "no",
    "--maxmemory-policy",
    "noeviction",
    "--save",
    "",
)


class Died(BaseException):
    """A worker's death (simulated in-process)."""


# -- helpers ---------------------------------------------------------------------------


class Scenario:
    """Subscriptions (exact, +, #, through a link) and the publications made, for the final check."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.filters = {
            subscribe(client, QM, flt, "faults", name).sub_id: flt for name, flt in FILTERS.items()
        }
        for source, target in LINKS:
            link(client, QM, source, target)
        self.published: dict[str, list[tuple[str, str]]] = {}

    def publish(self, publisher: str, count: int, client: redis.Redis | None = None) -> None:
        items = self.published.setdefault(publisher, [])
        pub = Publisher(client or self.client, QM, publisher, first_seq=len(items) + 1)
        for _ in range(count):
            n = len(items) + 1
            msgid, topic = f"{publisher}.{n}", TOPICS[n % len(TOPICS)]
            pub.publish(topic, msgid.encode(), msgid=msgid)
            items.append((msgid, topic))

    def problems(self) -> list[str]:
        return check_queues(self.client, QM, self.filters, LINKS, self.published)

    def assert_exactly_once_in_order(self) -> None:
        assert self.problems() == []
        assert _pending(self.client) == 0


def _pending(client: redis.Redis) -> int:
    return int(client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"])


def _drained(client: redis.Redis) -> bool:
    stream = keys.publish_stream(QM)
    try:
        group = next(g for g in client.xinfo_groups(stream) if g["name"] == keys.WORKER_GROUP.encode())
        last = client.xinfo_stream(stream)["last-generated-id"]
    except redis.ConnectionError:
        return False
    return group["pending"] == 0 and group["last-delivered-id"] == last


def _expire_turns_of(client: redis.Redis, token: str, publishers: list[str] | None = None) -> int:
    """Simulate the lease running out: delete the turns ``token`` holds (on ``publishers`` only, if given)."""
    gone = 0
    for key in client.scan_iter(match=keys.turn_key(QM, "*")):
        publisher = key.decode()[len(keys.pub_prefix(QM)) : -len(":turn")]
        if client.get(key) == token.encode() and (publishers is None or publisher in publishers):
            gone += client.delete(key)
    return gone


class Loop:
    """Hook for ``Worker.run``: injects ``fault`` at ``point`` (``times`` times), stops once drained.

    The stop check runs at ``after_dequeue`` on ``observer`` (a direct client),
    so a worker whose own connection is broken is still stopped; after
    ``max_rounds`` rounds it is stopped anyway (the test then fails on what is
    left, instead of hanging).
    """

    def __init__(
        self,
        observer: redis.Redis,
        point: str | None = None,
        fault: Callable[[], None] | None = None,
        times: int = 1,
        skip: int = 0,
        max_rounds: int = 300,
    ) -> None:
        self.observer = observer
        self.point, self.fault, self.times, self.skip = point, fault, times, skip
        self.max_rounds = max_rounds
        self.rounds = 0
        self.injected = 0
        self.worker: Worker | None = None

    def __call__(self, at: str) -> None:
        if at == self.point and self.fault is not None and self.injected < self.times:
            if self.skip:
                self.skip -= 1
            else:
                self.injected += 1
                self.fault()
        if at == "after_dequeue":
            self.rounds += 1
            assert self.worker is not None
            if (
                (self.injected >= self.times or self.fault is None) and _drained(self.observer)
            ) or self.rounds >= self.max_rounds:
                self.worker.stopping = True


def run_loop(client: redis.Redis, settings: Settings, loop: Loop, name: str = "looping") -> Worker:
    """Run ``Worker.run`` (the real loop, with its error handling) until ``loop`` stops it."""
    worker = Worker(client, settings, name=name, hook=loop)
    loop.worker = worker
    worker.run()
    return worker


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Settings for looping workers: no idle wait, small heads so a publisher takes several rounds."""
    return settings.model_copy(update={"block_ms": 10, "heads": 3, "batch_size": 50})


@pytest.fixture
def proxy(real_server: Server) -> Iterator[Proxy]:
    proxy = Proxy(real_server.port).start()
    yield proxy
    proxy.stop()


def _retrying(port: int) -> redis.Redis:
    """A client that re-sends a command after a connection error (redis-py's default ``Redis()``)."""
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 3))


# -- lost replies ----------------------------------------------------------------------


def test_commit_applied_twice_is_fenced_the_second_time(real_redis, settings):
    # Given the units of work of three publications, built from a dequeue
    scenario = Scenario(real_redis)
    scenario.publish("p", 3)
    worker = make_workers(real_redis, settings, 1)[0]
    dequeued = worker.scripts.dequeue(worker.name, 10, settings.lease_ms, 10, [])
    batch = CommitBatch()
    for entry_id, fields in dequeued.entries:
        batch.add(worker.decide.unit_of_work("p", entry_id, fields, now_ms=0))
    # When the same commit is sent twice (a re-send after a lost reply)
    statuses = []
    for _ in range(2):
        pipe = real_redis.pipeline(transaction=False)
        worker.scripts.commit(pipe, worker.name, settings.lease_ms, batch)
        statuses.append(pipe.execute()[0][0::3])
    # Then the first was delivered, the second fenced: it delivered nothing
    assert statuses == [[1, 1, 1], [0, 0, 0]]
    scenario.assert_exactly_once_in_order()


def test_commit_whose_reply_is_lost_is_delivered_once(real_redis, fast, proxy):
    # Given a worker (real loop) connected through a proxy that loses the reply to its second commit
    scenario = Scenario(real_redis)
    scenario.publish("p", 8)
    scenario.publish("q", 4)
    loop = Loop(
        real_redis,
        "before_commit",
        lambda: proxy.drop_reply(call_of("commit"), 1, "commit"),
        skip=1,
        max_rounds=30,
    )
    # When it runs (the commit is applied, the reply lost, the connection cut: the round fails),
    # and then its turns run out (simulated) and a fresh worker drains
    run_loop(connect(proxy.url), fast, loop)
    assert proxy.stats.drops == 1
    _expire_turns_of(real_redis, "looping")
    drain(make_workers(real_redis, fast, 1))
    # Then every publication was delivered once, in order
    scenario.assert_exactly_once_in_order()


def test_worker_carries_on_with_its_publishers_after_a_connection_error_without_waiting_for_its_lease(
    real_redis, fast, proxy
):
    # Given a worker (real loop) whose connection is lost as it sends its second commit (never applied)
    scenario = Scenario(real_redis)
    scenario.publish("p", 9)
    loop = Loop(
        real_redis,
        "before_commit",
        lambda: proxy.cut_request(call_of("commit"), 1, "commit"),
        skip=1,
        max_rounds=50,
    )
    # When it runs on (the round fails with a connection error; the loop starts a new round),
    # for much less than its lease (30 s)
    run_loop(connect(proxy.url), fast, loop)
    # Then it has carried on with p: p's turn is still its own
    assert proxy.stats.requests_cut == 1
    scenario.assert_exactly_once_in_order()


def test_client_kill_of_the_worker_connections_is_ridden_through(real_redis, real_server, fast):
    # Given a worker (real loop) whose connections have a client name
    scenario = Scenario(real_redis)
    scenario.publish("p", 3)
    killed = []

    def kill_its_connections() -> None:
        for client in real_redis.client_list():
            if client.get("name") == "victim-conn":
                real_redis.client_kill_filter(_id=client["id"])
                killed.append(client["id"])
        scenario.publish("q", 2)

    loop = Loop(real_redis, "after_commit", kill_its_connections, max_rounds=100)
    # When all its connections are killed (CLIENT KILL) after its first commit, and more is published
    run_loop(connect(f"{real_server.url}?client_name=victim-conn"), fast, loop)
    # Then it reconnected and delivered everything, once, in order
    assert killed
    scenario.assert_exactly_once_in_order()


def test_commit_reply_lost_and_resent_by_redis_py_is_fenced_and_delivers_once(real_redis, settings, proxy):
    # Given a worker whose client re-sends a command after a lost reply, and a proxy losing its commit's reply
    scenario = Scenario(real_redis)
    scenario.publish("p", 3)
    worker = Worker(_retrying(proxy.port), settings, name="resender")
    worker.setup()
    proxy.drop_reply(call_of("commit"), 1, "commit")
    # When it runs one round: redis-py re-sends the applied commit, which is fenced
    worker.run_once()
    # Then nothing was delivered twice
    assert proxy.stats.drops == 1
    assert worker.counts.get("delivered", 0) == 0  # the re-sent commit reported "fenced"
    scenario.assert_exactly_once_in_order()


def test_worker_whose_resent_commit_was_fenced_carries_on_with_its_publisher_without_waiting_for_its_lease(
    real_redis, fast, proxy
):
    # Given a publisher with more entries than one round handles (heads=3), and a worker whose
    # client re-sends its first commit after the reply was lost (the re-send is fenced)
    scenario = Scenario(real_redis)
    scenario.publish("p", 9)
    proxy.drop_reply(call_of("commit"), 1, "commit")
    loop = Loop(real_redis, max_rounds=50)
    # When it keeps running (its lease, 30 s, does not run out during the test)
    run_loop(_retrying(proxy.port), fast, loop)
    # Then it goes on with p: the turn is still its own (it was renewed by the applied commit)
    assert proxy.stats.drops == 1
    scenario.assert_exactly_once_in_order()


def test_entries_whose_dequeue_reply_was_lost_are_delivered_once_in_order(real_redis, settings, proxy):
    # Given a worker whose dequeue is applied (entries read, filed, the turn taken) but its reply lost
    scenario = Scenario(real_redis)
    scenario.publish("p", 5)
    scenario.publish("q", 5)
    worker = Worker(connect(proxy.url), settings, name="blind")
    worker.setup()
    proxy.drop_reply(call_of("dequeue"), 1, "dequeue")
    with pytest.raises(redis.ConnectionError):
        worker.run_once()
    assert proxy.stats.drops == 1
    assert _pending(real_redis) == 10  # delivered to the blind worker, which never saw them
    # When its turns run out (simulated) and the workers drain
    _expire_turns_of(real_redis, "blind")
    drain([worker, *make_workers(real_redis, settings, 1)])
    # Then every entry was delivered once, in order
    scenario.assert_exactly_once_in_order()


def test_worker_whose_dequeue_reply_was_lost_finds_the_turns_it_took_without_waiting_for_its_lease(
    real_redis, fast, proxy
):
    # Given a worker (real loop) whose first dequeue's reply is lost: it holds turns it does not know of
    scenario = Scenario(real_redis)
    scenario.publish("p", 5)
    proxy.drop_reply(call_of("dequeue"), 1, "dequeue")
    loop = Loop(real_redis, max_rounds=50)
    # When it keeps running, alone, for less than its lease (30 s)
    run_loop(connect(proxy.url), fast, loop)
    # Then it has found its own turn again (orphan sweep) and delivered everything
    assert proxy.stats.drops == 1
    scenario.assert_exactly_once_in_order()


def test_claim_whose_reply_is_lost_is_redone_and_delivers_once(real_redis, settings, proxy):
    # Given entries another worker dequeued and died with, and a proxy losing the reply to the
    # takeover's claim (a worker holding no entry takes over the heads in its dequeue: that call)
    scenario = Scenario(real_redis)
    scenario.publish("p", 4)
    dead = make_workers(real_redis, settings, 1)[0]
    dead.scripts.dequeue(dead.name, 10, settings.lease_ms, 10, [])
    _expire_turns_of(real_redis, dead.name)
    heir = Worker(connect(proxy.url), settings, name="heir")
    heir.setup()
    proxy.drop_reply(call_of("dequeue"), 1, "claim")
    with pytest.raises(redis.ConnectionError):
        heir.run_once()
    # When the heir's turn runs out too (simulated) and the workers drain
    _expire_turns_of(real_redis, "heir")
    drain([heir, *make_workers(real_redis, settings, 1)])
    # Then
    assert proxy.stats.drops == 1
    scenario.assert_exactly_once_in_order()


# -- zombies ---------------------------------------------------------------------------


def test_zombie_holding_several_publishers_is_fenced_on_every_one(real_redis, settings):
    # Given a worker that stalls with the units of work of three publishers built
    scenario = Scenario(real_redis)
    for publisher in ("p", "q", "r"):
        scenario.publish(publisher, 4)
    other = make_workers(real_redis, settings, 1)[0]

    def stall() -> None:
        _expire_turns_of(real_redis, "zombie")  # its leases run out meanwhile
        drain([other])  # another worker takes every turn over and delivers
        scenario.publish("p", 2)  # more arrive, and the other worker already holds p's new head
        other.turns |= set(other.scripts.dequeue(other.name, 10, settings.lease_ms, 10, []).turns)

    zombie = Worker(
        real_redis, settings, name="zombie", hook=lambda at: stall() if at == "before_commit" else None
    )
    zombie.setup()
    # When the zombie resumes and sends its units of work
    zombie.run_once()
    # Then every one was fenced, and after a drain everything is there once, in order
    assert zombie.counts == {}
    zombie.hook = lambda at: None
    drain([zombie, other])
    scenario.assert_exactly_once_in_order()


def test_zombie_commits_the_publishers_it_still_holds_and_is_fenced_on_the_others(real_redis, settings):
    # Given a worker that stalls holding p, q and r, and loses only p's and q's turns meanwhile
    scenario = Scenario(real_redis)
    for publisher in ("p", "q", "r"):
        scenario.publish(publisher, 4)
    others = []

    def stall() -> None:
        _expire_turns_of(real_redis, "zombie", ["p", "q"])
        others.extend(make_workers(real_redis, settings, 1))  # started while the zombie stalls
        drain(others)

    zombie = Worker(
        real_redis, settings, name="zombie", hook=lambda at: stall() if at == "before_commit" else None
    )
    zombie.setup()  # the only live worker: its fair share is every publisher
    # When it resumes
    zombie.run_once()
    # Then it delivered r's publications only; p's and q's came from the other worker, once
    assert zombie.counts == {"delivered": 4}
    assert others[0].counts == {"delivered": 8}
    scenario.assert_exactly_once_in_order()


# -- Redis restarts --------------------------------------------------------------------


@pytest.fixture
def aof_server(tmp_path) -> Iterator[Server]:
    server = Server(port=free_port(), data_dir=tmp_path / "data", args=AOF_ARGS).start()
    yield server
    server.stop()


@pytest.mark.parametrize("point", ["holding_turn", "before_commit", "after_commit"])
def test_redis_killed_and_restarted_mid_stream_loses_nothing_acknowledged(aof_server, settings, point):
    # Given a server with AOF (fsync always), publications, and a worker running its real loop
    client = connect(aof_server.url)
    assert client.config_get("appendfsync") == {"appendfsync": "always"}
    scenario = Scenario(client)
    scenario.publish("p", 10)
    scenario.publish("q", 10)
    applied_before: list[int] = []

    def crash_and_restart() -> None:
        applied_before.append(sum(client.llen(keys.sub_queue(QM, s)) for s in scenario.filters))
        aof_server.kill()  # SIGKILL
        aof_server.start()

    fast = settings.model_copy(update={"redis_url": aof_server.url, "block_ms": 10, "heads": 3})
    loop = Loop(client, point, crash_and_restart, skip=1, max_rounds=100)
    # When the server is SIGKILLed and restarted at `point` of the worker's second round
    run_loop(connect(aof_server.url), fast, loop)
    assert loop.injected == 1 and applied_before[0] > 0  # the first round's deliveries were made before
    # And more publications follow after the restart, and the worker's turns run out (simulated)
    scenario.publish("p", 5)
    _expire_turns_of(client, "looping")
    run_loop(connect(aof_server.url), fast, Loop(client), name="after")
    # Then everything acknowledged before and after is there, once, in order
    scenario.assert_exactly_once_in_order()


def test_publisher_rides_through_a_redis_restart_by_retrying_with_the_same_msgid(aof_server, settings):
    # Given a publisher whose server is SIGKILLed before its second publication
    client = connect(aof_server.url)
    scenario = Scenario(client)
    scenario.publish("p", 1)
    aof_server.kill()
    publisher = Publisher(connect(aof_server.url), QM, "p", first_seq=2)
    with pytest.raises(ConnectionLost):
        publisher.publish(TOPICS[2], b"p.2", msgid="p.2")
    # When the server is back and the publisher retries with the same message id, then goes on
    aof_server.start()
    publisher.publish(TOPICS[2], b"p.2", msgid="p.2")
    scenario.published["p"].append(("p.2", TOPICS[2]))
    scenario.publish("p", 2, client=connect(aof_server.url))
    drain(make_workers(connect(aof_server.url), settings.model_copy(update={"redis_url": aof_server.url}), 2))
    # Then
    scenario.assert_exactly_once_in_order()


# -- publisher retries -----------------------------------------------------------------


def test_publisher_retry_after_a_lost_xadd_reply_is_delivered_once_in_order(real_redis, settings, proxy):
    # Given a publisher whose first XADD is applied but the reply is lost
    scenario = Scenario(real_redis)
    publisher = Publisher(connect(proxy.url), QM, "p")
    proxy.drop_reply(b"XADD", 1, "xadd")
    with pytest.raises(ConnectionLost):
        publisher.publish(TOPICS[1], b"p.1", msgid="p.1")
    # When it retries with the same message id, then publishes more
    publisher.publish(TOPICS[1], b"p.1", msgid="p.1")
    scenario.published["p"] = [("p.1", TOPICS[1])]
    scenario.publish("p", 3, client=connect(proxy.url))
    workers = make_workers(real_redis, settings, 2)
    drain(workers)
    # Then the stream had p.1 twice, and subscribers have it once, before the others
    assert real_redis.xlen(keys.publish_stream(QM)) == 5
    assert sum(w.counts.get("duplicate", 0) for w in workers) == 1
    scenario.assert_exactly_once_in_order()


def test_xadd_resent_by_redis_py_after_a_lost_reply_is_delivered_once(real_redis, settings, proxy):
    # Given a plain redis-py client that silently re-sends a command after a lost reply (Publisher
    # itself never re-sends an XADD: it raises ConnectionLost, as in the test above)
    scenario = Scenario(real_redis)
    proxy.drop_reply(b"XADD", 1, "xadd")
    client = _retrying(proxy.port)
    items = scenario.published.setdefault("p", [])
    # When it publishes with plain XADDs (the first lands twice, the client sees one success)
    for n in (1, 2, 3):
        msgid, topic = f"p.{n}", TOPICS[n % len(TOPICS)]
        client.xadd(
            keys.publish_stream(QM), publication_fields("p", topic, msgid.encode(), msgid=msgid, seq=n)
        )
        items.append((msgid, topic))
    drain(make_workers(real_redis, settings, 2))
    # Then
    assert proxy.stats.drops == 1
    assert real_redis.xlen(keys.publish_stream(QM)) == 4
    scenario.assert_exactly_once_in_order()


# -- poison ----------------------------------------------------------------------------

POISON = {
    "missing_topic": ({"publisher": "p", "body": b"x"}, "missing field 'topic'"),
    "invalid_utf8_topic": ({"publisher": "p", "topic": b"/a/\xff"}, "not valid UTF-8"),
    "invalid_utf8_field": (
        {"publisher": "p", "topic": "/a/x", "correlation_id": b"\xfe\xff"},
        "not valid UTF-8",
    ),
    "invalid_utf8_publisher": ({"publisher": b"p\xff", "topic": "/a/x"}, "not valid UTF-8"),
    "oversized_body": ({"publisher": "p", "topic": "/a/x", "body": b"x" * 1025}, "larger than the limit"),
    "invalid_topic": ({"publisher": "p", "topic": "a/#"}, "wildcard"),
    "missing_publisher": ({"topic": "/a/x"}, "missing field 'publisher'"),
    "empty_publisher": ({"publisher": "", "topic": "/a/x"}, "publisher"),
    "bad_priority": ({"publisher": "p", "topic": "/a/x", "priority": "eleven"}, "priority"),
    "bad_props": ({"publisher": "p", "topic": "/a/x", "props": "[1, 2]"}, "props"),
}


@pytest.mark.parametrize("kind", sorted(POISON))
def test_poison_entry_is_dead_lettered_once_with_its_reason_and_the_rest_flows(real_redis, settings, kind):
    # Given a poison entry between two good publications of the same publisher
    scenario = Scenario(real_redis)
    scenario.publish("p", 1)
    fields, reason = POISON[kind]
    poison_id = real_redis.xadd(keys.publish_stream(QM), {**fields, "chaos.poison": kind}).decode()
    scenario.publish("p", 2)
    # When two workers drain
    drain(make_workers(real_redis, settings.model_copy(update={"max_body_bytes": 1024}), 2))
    # Then the good ones are delivered in order, the poison is dead-lettered once, original fields kept
    scenario.assert_exactly_once_in_order()
    dead = [f for _, f in real_redis.xrange(keys.dead_letter(QM)) if f[b"dlq.entry_id"] == poison_id.encode()]
    assert len(dead) == 1
    assert reason in dead[0][b"dlq.reason"].decode("utf-8", "replace")
    assert dead[0][b"chaos.poison"] == kind.encode()
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    assert status(real_redis, QM).active_publishers == 0


# -- max_deliveries --------------------------------------------------------------------


@pytest.fixture
def killer_entry(monkeypatch):
    """Workers die (``Died``) while handling any entry whose msgid is ``kills`` (as on an OOM or a crash
    in a C extension); dead-lettering it does not handle it, so that does not kill them."""
    real_parse = worker_decide.parse_entry

    def parse(entry_id, fields, *limits):
        if fields.get(b"msgid") == b"kills":
            raise Died(entry_id)
        return real_parse(entry_id, fields, *limits)

    monkeypatch.setattr(worker_decide, "parse_entry", parse)


def _xadd_killer(client: redis.Redis) -> str:
    return client.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/a/x", "msgid": "kills"}
    ).decode()


def _die_until_dead_lettered(client: redis.Redis, settings: Settings) -> int:
    """Run fresh workers, one after the other, each dying or draining, until one survives; returns deaths."""
    for deaths in range(20):
        worker = Worker(client, settings, name=f"w{deaths}")
        worker.setup()
        try:
            drain([worker])
            return deaths
        except Died:
            _expire_turns_of(client, worker.name)  # its lease runs out; the next one takes over (XCLAIM)
    raise AssertionError("the entry was never dead-lettered")


def _dead_letters(client: redis.Redis) -> list[tuple[str, bytes | None]]:
    return [(f[b"dlq.entry_id"].decode(), f.get(b"msgid")) for _, f in client.xrange(keys.dead_letter(QM))]


def test_entry_whose_workers_keep_dying_is_dead_lettered_after_max_deliveries(
    real_redis, settings, killer_entry
):
    # Given an entry every worker dies on
    settings = settings.model_copy(update={"max_deliveries": 3})
    scenario = Scenario(real_redis)
    killer = _xadd_killer(real_redis)
    # When fresh workers take it over, one after the other
    deaths = _die_until_dead_lettered(real_redis, settings)
    # Then it was dead-lettered after max_deliveries deliveries, with the reason
    assert deaths == settings.max_deliveries
    assert _dead_letters(real_redis) == [(killer, b"kills")]
    assert b"max_deliveries" in real_redis.xrange(keys.dead_letter(QM))[0][1][b"dlq.reason"]
    # And p's later publications flow
    scenario.publish("p", 2)
    drain(make_workers(real_redis, settings, 1))
    scenario.assert_exactly_once_in_order()


def test_entry_dead_lettered_after_max_deliveries_posts_refused_to_its_waiting_publisher(
    real_redis, settings, killer_entry
):
    # Given an entry every worker dies on, whose publisher waits for the result
    settings = settings.model_copy(update={"max_deliveries": 3})
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/a/x", "msgid": "kills", "reply": "1"}
    )
    # When fresh workers take it over until it is dead-lettered
    _die_until_dead_lettered(real_redis, settings)
    # Then the publisher learns "refused", with the reason, once
    replies = real_redis.lrange(keys.reply(QM, "p", "kills"), 0, -1)
    assert len(replies) == 1
    result = json.loads(replies[0])
    assert result["status"] == "refused" and "max_deliveries" in result["reason"]


def test_max_deliveries_dead_letters_only_the_entry_workers_die_on_not_those_queued_behind_it(
    real_redis, settings, killer_entry
):
    # Given an entry every worker dies on, with good publications of the same publisher right behind it
    settings = settings.model_copy(update={"max_deliveries": 3})
    scenario = Scenario(real_redis)
    killer = _xadd_killer(real_redis)
    scenario.publish("p", 3)
    # When fresh workers take p over, one after the other, until one survives
    _die_until_dead_lettered(real_redis, settings)
    # Then only the killer is dead-lettered; the good ones behind it are delivered once, in order
    assert _dead_letters(real_redis) == [(killer, b"kills")]
    scenario.assert_exactly_once_in_order()


def test_max_deliveries_does_not_blame_the_good_entry_ahead_of_the_one_workers_die_on(
    real_redis, settings, killer_entry
):
    # Given a good publication, then an entry every worker dies on, then another good one, read in one batch
    settings = settings.model_copy(update={"max_deliveries": 3})
    scenario = Scenario(real_redis)
    scenario.publish("p", 1)
    killer = _xadd_killer(real_redis)
    scenario.publish("p", 1)
    # When fresh workers take p over, one after the other, until one survives
    _die_until_dead_lettered(real_redis, settings)
    # Then only the killer is dead-lettered; the good ones are delivered once, in order
    assert _dead_letters(real_redis) == [(killer, b"kills")]
    scenario.assert_exactly_once_in_order()


def test_queue_messages_checker_sees_a_duplicate_and_a_reordering(real_redis, settings):
    # Given a correct delivery
    scenario = Scenario(real_redis)
    scenario.publish("p", 3)
    drain(make_workers(real_redis, settings, 1))
    assert scenario.problems() == []
    # When a queue gets a copy of its oldest message again (at the newest end)
    sub = next(s for s, f in scenario.filters.items() if f == "/a/#")
    queue = keys.sub_queue(QM, sub)
    real_redis.lpush(queue, real_redis.lindex(queue, -1))
    # Then the checker reports it
    assert len(scenario.problems()) == 1
    assert [m.msgid for m in queue_messages(real_redis, QM, sub)][-1] == "p.1"


# -- a server that is down -------------------------------------------------------------


def test_worker_started_while_redis_is_down_waits_for_it_instead_of_exiting(tmp_path, settings, monkeypatch):
    # Given a server that is down when the worker starts, and comes back at the worker's first retry pause
    server = Server(port=free_port(), data_dir=tmp_path / "data", args=AOF_ARGS)
    pauses = []
    real_sleep = __import__("time").sleep

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if server.process is None:
            server.start()
        real_sleep(0)

    monkeypatch.setattr("worker.loop.time.sleep", pause)
    try:
        fast = settings.model_copy(update={"redis_url": server.url, "block_ms": 10})
        # When the worker runs
        client = connect(server.url)
        loop = Loop(client, max_rounds=20)
        run_loop(connect(server.url), fast, loop)
        # Then it waited for the server (one retry pause) and ran its rounds
        assert pauses and loop.rounds > 0
    finally:
        server.stop()


def test_chaos_history_check_counts_lost_duplicated_reordered_and_unknown_outcomes():
    # Given a publisher's four publications to one subscription (the third's outcome unknown)
    history = History()
    for n in range(1, 5):
        pub = Publication("p", n, f"p.{n}", "/a/x", frozenset({"s"}))
        pub.acked = n != 3
        history.add_publication(pub)
    # When the subscription receives p.2, p.1 (out of order), p.2 again, and never p.4
    for msgid in ("p.2", "p.1", "p.2", "x.1"):
        history.receive("s", msgid)
    verdict = history.check(["s"], [])
    # Then
    assert (verdict.lost, verdict.duplicated, verdict.reordered, verdict.unexpected) == (1, 1, 1, 1)
    assert (verdict.publications, verdict.unknown, verdict.unknown_delivered) == (3, 1, 0)
    assert not verdict.ok


def test_chaos_history_accepts_a_second_receipt_only_when_flagged_redelivered():
    history = History()
    for n in (1, 2):
        pub = Publication("p", n, f"p.{n}", "/a/x", frozenset({"s"}))
        pub.acked = True
        history.add_publication(pub)
    # A consumer died holding p.1 and p.2: both come again, flagged
    for msgid, flagged in (("p.1", False), ("p.2", False), ("p.1", True), ("p.2", True)):
        history.receive("s", msgid, redelivered=flagged)
    verdict = history.check(["s"], [])
    assert (verdict.duplicated, verdict.redelivered, verdict.reordered, verdict.lost) == (0, 2, 0, 0)
    assert verdict.ok
    # The same second receipt without the flag is a duplicate
    history.receive("s", "p.1")
    verdict = history.check(["s"], [])
    assert (verdict.duplicated, verdict.redelivered) == (1, 2) and not verdict.ok


def _dead_letter(pub: Publication, entry_id: str, reason: str) -> tuple[str, dict[bytes, bytes]]:
    return (
        "9-0",
        {
            b"publisher": pub.publisher.encode(),
            b"msgid": pub.msgid.encode(),
            b"dlq.reason": reason.encode(),
            b"dlq.entry_id": entry_id.encode(),
        },
    )


def test_chaos_history_check_catches_a_half_applied_refused_publication():
    # Given five refusable publications of one publisher to subscriptions a and b
    history = History()
    pubs = []
    for n in range(1, 6):
        pub = Publication(
            "v",
            n,
            f"v.{n}",
            "/victim/x",
            frozenset({"a", "b"}),
            acked=True,
            entry_id=f"{n}-0",
            refusable=True,
        )
        history.add_publication(pub)
        pubs.append(pub)
    pubs[3].planted = "foreign:dedup"
    foreign = "foreign key: {Q}:sub:b holds a string, not a list; delivered to no subscription"
    # When v.1 is delivered to both; v.2 refused and received by none; v.3 refused yet received by a;
    # v.4 (planted for) delivered to both; v.5 received by a only and never refused
    for sub_id, msgids in (("a", ["v.1", "v.3", "v.4", "v.5"]), ("b", ["v.1", "v.4"])):
        for msgid in msgids:
            history.receive(sub_id, msgid, msgid[2:] + "-0")
    dead = [_dead_letter(pubs[1], "2-0", foreign), _dead_letter(pubs[2], "3-0", foreign)]
    verdict = history.check(["a", "b"], dead)
    # Then v.3 and v.5 are half-applied, v.2 refused by a foreign key, v.4 should have been refused
    assert (verdict.half_applied, verdict.refused_by_foreign_key, verdict.foreign_not_refused) == (2, 1, 1)
    assert (verdict.lost, verdict.duplicated, verdict.reordered, verdict.good_dead_lettered) == (0, 0, 0, 0)
    assert not verdict.ok


def test_chaos_history_check_accepts_a_refused_entry_whose_retry_was_delivered():
    # Given a refusable publication sent twice (a lost XADD reply): entry 1-0 refused, entry 2-0 delivered
    history = History()
    pub = Publication(
        "v", 1, "v.1", "/victim/x", frozenset({"a", "b"}), acked=True, entry_id="2-0", refusable=True
    )
    history.add_publication(pub)
    for sub_id in ("a", "b"):
        history.receive(sub_id, "v.1", "2-0")
    dead = [_dead_letter(pub, "1-0", "foreign key: k holds a hash, not a list")]
    # Then that is no half-applied unit of work; a refusal for another reason of a good one is still lost
    # And one delivered from entry 4-0 whose retry, entry 5-0, was refused (reported, not a failure)
    retried = Publication(
        "v", 2, "v.2", "/victim/x", frozenset({"a"}), acked=True, entry_id="5-0", refusable=True
    )
    history.add_publication(retried)
    history.receive("a", "v.2", "4-0")
    dead.append(_dead_letter(retried, "5-0", "foreign key: k holds a string, not a list"))
    verdict = history.check(["a", "b"], dead)
    assert (verdict.half_applied, verdict.refused_by_foreign_key, verdict.lost) == (0, 0, 0)
    assert verdict.refused_after_delivered == 1
    assert verdict.ok
    good = Publication("p", 1, "p.1", "/chaos/x", frozenset({"a"}), acked=True, entry_id="3-0")
    history.add_publication(good)
    verdict = history.check(["a", "b"], [*dead, _dead_letter(good, "3-0", "foreign key: k holds a hash")])
    assert (verdict.lost, verdict.good_dead_lettered) == (1, 1)


def _unavailable_copy(entry_id: str, sub_id: str) -> tuple[str, dict[bytes, bytes]]:
    """A copy commit.lua dead-lettered for an unavailable subscription (its queue of another type)."""
    reason = f"subscription unavailable: {{Q}}:sub:{sub_id} holds a string"
    return (
        "9-0",
        {
            b"envelope": b"{}\nx",
            b"dlq.reason": reason.encode(),
            b"dlq.entry_id": entry_id.encode(),
            b"dlq.subscription": sub_id.encode(),
        },
    )


def test_chaos_history_counts_a_copy_dead_lettered_for_an_unavailable_subscription_as_no_loss():
    # Given two refusable publications to a and b: v.1 received by a, its copy for b dead-lettered
    # (b unavailable); v.2 received by a only, nothing dead-lettered for b
    history = History()
    for n in (1, 2):
        pub = Publication(
            "v",
            n,
            f"v.{n}",
            "/victim/x",
            frozenset({"a", "b"}),
            acked=True,
            entry_id=f"{n}-0",
            refusable=True,
        )
        history.add_publication(pub)
        history.receive("a", f"v.{n}", f"{n}-0")
    verdict = history.check(["a", "b"], [_unavailable_copy("1-0", "b")])
    # Then v.1 is whole (its copy for b accounted for) and v.2 is half-applied
    assert (verdict.unavailable_copies, verdict.half_applied, verdict.lost) == (1, 1, 0)
    # And a good (not refusable) publication's copy dead-lettered is a failure
    good = Publication("p", 1, "p.1", "/chaos/x", frozenset({"a"}), acked=True, entry_id="3-0")
    history.add_publication(good)
    history.receive("a", "p.1", "3-0")
    verdict = history.check(["a", "b"], [_unavailable_copy("1-0", "b"), _unavailable_copy("3-0", "a")])
    assert verdict.good_dead_lettered == 1 and not verdict.ok
