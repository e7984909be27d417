"""A full server (``maxmemory`` reached, ``noeviction``) on a throwaway server of its own (issue 14 item 4).

What must hold: a publisher is refused at once with ``ServerFull`` (exit code 5), nothing written;
no unit of work is half-applied (a script's first write is refused, never a later one, and no
script goes on writing after catching that refusal); the workers log it, pause and retry without
counting a retry as a new delivery; consumers go on (receiving and acknowledging is how memory is
freed); and once memory is freed, publications flow again with nothing lost or duplicated.

The focused tests make the server full on purpose (``CONFIG SET maxmemory 1``: always over it);
the last one fills a 4 MB server with publications, as in production.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from click.testing import CliRunner

from broker import cli
from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import ServerFull
from broker.core.models import publication_fields
from broker.core.server import EPHEMERAL, Server
from broker.operations.maintenance import trim_acknowledged
from broker.testing import drain, make_workers, queue_messages, wait_for
from broker.topics.subscriptions import subscribe, unsubscribe
from broker.topics.topic_objects import Attributes, define
from worker import housekeeping
from worker.loop import RETRY_PAUSE_MS, Worker

QM = "MEM"
MAXMEMORY = "4mb"


@pytest.fixture(scope="module")
def small_server() -> Iterator[Server]:
    server = Server(args=(*EPHEMERAL, "--maxmemory", MAXMEMORY)).start()
    yield server
    server.stop()


@pytest.fixture
def client(small_server: Server) -> Iterator[redis.Redis]:
    client = connect(small_server.url)
    client.config_set("maxmemory", MAXMEMORY)
    client.flushall()
    yield client
    client.config_set("maxmemory", MAXMEMORY)
    client.flushall()
    client.close()


def _recovers_under_oom(client: redis.Redis) -> bool:
    """Valkey, and Redis from 7.2, run a read-only transaction while over maxmemory; Redis 7.0
    refuses the whole MULTI (the worker's and consumers' reads go in transactions there)."""
    info = client.info("server")
    if "valkey_version" in info:
        return True
    major, minor = (int(x) for x in str(info["redis_version"]).split(".")[:2])
    return (major, minor) >= (7, 2)


@pytest.fixture
def recovering(client: redis.Redis) -> None:
    if not _recovers_under_oom(client):
        pytest.skip("Redis 7.0 refuses read-only MULTI/EXEC over maxmemory; run on Valkey or Redis >= 7.2")


@pytest.fixture
def settings(small_server: Server) -> Settings:
    return Settings(redis_url=small_server.url, qm=QM, batch_size=50, heads=50, sweep_interval_ms=1)


@contextmanager
def full(client: redis.Redis) -> Iterator[None]:
    """The server is full meanwhile: its maxmemory is 1 byte, below any use."""
    client.config_set("maxmemory", 1)
    try:
        yield
    finally:
        client.config_set("maxmemory", MAXMEMORY)


def _pending(client: redis.Redis) -> dict[str, int]:
    """Entry id -> times delivered, for the entries no unit of work has acknowledged."""
    rows = client.xpending_range(keys.publish_stream(QM), keys.WORKER_GROUP, "-", "+", 10_000)
    return {row["message_id"].decode(): int(row["times_delivered"]) for row in rows}


def _keys(client: redis.Redis, pattern: str) -> list[bytes]:
    return list(client.scan_iter(match=pattern, count=1000))


def _bodies(client: redis.Redis, sub_id: str) -> list[bytes]:
    return [m.body for m in queue_messages(client, QM, sub_id)]


# -- the publish stream ---------------------------------------------------------------------------


def test_acknowledged_entries_leave_the_publish_stream_as_the_workers_commit_one_worker_at_a_time(
    client, settings, monkeypatch
):
    # the lock's PX is the server's clock: long enough that it is still there when looked at
    monkeypatch.setattr(housekeeping, "TRIM_LOCK_MS", 60_000)
    # Given workers that trim after 10 committed entries once idle, and another worker holding the lock
    settings = settings.model_copy(update={"trim_every_entries": 10, "block_ms": 10})
    record = subscribe(client, QM, "t/#", "app", "a")
    Publisher(client, QM, "p", flow_control=False).publish_many(("t/x", b"x" * 100) for _ in range(25))
    client.set(keys.trim_lock(QM), "other", px=60_000)
    now = [1_000_000]
    worker = Worker(client, settings, name="w0", clock_ms=lambda: now[0])
    worker.setup()
    # When the worker commits them all (busy: it trims only after 16 x 10), then has nothing to do:
    # the other worker trims, so this one leaves the stream alone
    assert drain([worker]) == 25
    assert client.xlen(keys.publish_stream(QM)) == 25
    worker.run_once(block=True)
    assert client.xlen(keys.publish_stream(QM)) == 25
    # and tries again only once TRIM_LOCK_MS has passed
    client.delete(keys.trim_lock(QM))
    worker.run_once(block=True)
    assert client.xlen(keys.publish_stream(QM)) == 25
    now[0] += housekeeping.TRIM_LOCK_MS
    worker.run_once(block=True)
    # Then every acknowledged entry has left the stream, with no scheduler, and the lock is its own
    assert client.xlen(keys.publish_stream(QM)) == 0
    assert client.get(keys.trim_lock(QM)) == b"w0"
    assert len(_bodies(client, record.sub_id)) == 25  # delivered before trimmed


def test_a_busy_worker_trims_only_every_16_x_trim_every_entries_and_at_once_when_it_has_nothing_to_do(
    client, settings
):
    # Given a worker that trims after 10 committed entries, and 25 publications
    settings = settings.model_copy(update={"trim_every_entries": 10, "block_ms": 10})
    subscribe(client, QM, "t/#", "app", "b")
    Publisher(client, QM, "p", flow_control=False).publish_many(("t/x", b"x") for _ in range(25))
    worker = Worker(client, settings, name="w0", clock_ms=lambda: 1_000_000)
    worker.setup()
    # When it commits them all in busy rounds: no trim (its round trips wait for 16 x 10 entries)
    assert drain([worker]) == 25
    assert client.xlen(keys.publish_stream(QM)) == 25
    # Then the first round with nothing to do trims every acknowledged entry
    worker.run_once(block=True)
    assert client.xlen(keys.publish_stream(QM)) == 0


# -- publishers --------------------------------------------------------------------------------


def test_a_publisher_is_refused_at_once_with_server_full_and_nothing_is_written(client, small_server):
    subscribe(client, QM, "t/#", "app", "a")
    publisher = Publisher(client, QM, "p")
    with full(client):
        with pytest.raises(ServerFull) as refused:
            publisher.publish("t/x", b"1", msgid="m-1")
        started = time.monotonic()
        with pytest.raises(ServerFull):
            publisher.publish("t/x", b"1", msgid="m-1", wait=True, timeout_ms=30_000)
        assert time.monotonic() - started < 1  # refused, not waited for
        with pytest.raises(ServerFull) as bulk:
            publisher.publish_many([("t/x", b"2"), ("t/x", b"3")])
        cli_result = CliRunner().invoke(
            cli.main, ["--redis-url", small_server.url, "--qm", QM, "publish", "t/x", "hi"]
        )
    assert refused.value.exit_code == 5
    assert str(refused.value).startswith(
        "publication of message m-1 refused: the Redis server is full (used memory is above its maxmemory) "
        "and refuses new writes; nothing was written. Retry once memory is freed"
    )
    assert bulk.value.accepted == []
    assert cli_result.exit_code == 5
    assert cli_result.stderr.startswith("error: publication of message ") and "the Redis server is full" in (
        cli_result.stderr
    )
    assert client.xlen(keys.publish_stream(QM)) == 0  # nothing written
    # once memory is freed, the same publication goes through with the same seq
    assert publisher.next_seq == 1
    assert publisher.publish("t/x", b"1", msgid="m-1").seq == 1


def test_subscribe_is_refused_on_a_full_server_and_unsubscribe_frees_memory(client):
    record = subscribe(client, QM, "t/#", "app", "a")
    with full(client):
        with pytest.raises(ServerFull, match=r"^subscribe refused: the Redis server is full"):
            subscribe(client, QM, "u/#", "app", "b")
        assert subscribe(client, QM, "t/#", "app", "a") == record  # attaching writes nothing
        unsubscribe(client, QM, record.sub_id)  # deleting is always allowed
    assert client.hlen(keys.subscriptions(QM)) == 0


# -- units of work -----------------------------------------------------------------------------


def test_no_unit_of_work_is_half_applied_and_all_are_delivered_once_memory_is_freed(
    client, settings, recovering
):
    # Given two subscriptions and publications of every kind: with and without msgid (dedup),
    # asking for a result, refused (priority 10), on a topic that does not dead-letter (USEDLQ(NO))
    define(client, QM, "QUIET", "quiet", Attributes(usedlq="NO"))
    subscribe(client, QM, "#", "app", "a")
    subscribe(client, QM, "#", "app", "b")
    stream = keys.publish_stream(QM)
    client.xadd(stream, publication_fields("p1", "t/1", b"m1", msgid="m1"))
    client.xadd(stream, publication_fields("p1", "quiet/1", b"m2", msgid="m2"))
    client.xadd(stream, publication_fields("p2", "t/2", b"m3", msgid="m3", reply=True))
    client.xadd(stream, {**publication_fields("p3", "t/3", b"m4", msgid="m4"), "priority": "10"})
    client.xadd(stream, publication_fields("p4", "t/4", b"m5"))
    (worker,) = make_workers(client, settings, 1)
    # When the server is full while a worker handles them, round after round
    with full(client):
        for _ in range(3):
            with pytest.raises(ServerFull):  # the unit of work wrapper raises it (issue 25)
                worker.run_once(block=False)
    # Then nothing of any unit was written: no copy, dead letter, result, dedup record or acknowledgement
    assert _bodies(client, "app$a") == [] and _bodies(client, "app$b") == []
    assert client.xlen(keys.dead_letter(QM)) == 0
    assert _keys(client, "{MEM}:dedup:*") == [] and _keys(client, "{MEM}:reply:*") == []
    assert len(_pending(client)) == 5 and set(_pending(client).values()) == {1}  # retries are not counted
    # And once memory is freed each is handled once, in order
    drain([worker])
    assert _bodies(client, "app$a") == _bodies(client, "app$b") == [b"m1", b"m2", b"m3", b"m5"]
    (dead,) = [fields for _, fields in client.xrange(keys.dead_letter(QM))]
    assert dead[b"msgid"] == b"m4" and b"priority" in dead[b"dlq.reason"]
    assert b'"status":"delivered","subscriptions":2' in client.lpop(keys.reply(QM, "p2", "m3"))
    assert _pending(client) == {}


def test_a_full_server_never_refuses_a_publication_for_its_dedup_record(client, settings):
    # A publication whose only writes would be its dedup record and its acknowledgement (USEDLQ(NO),
    # no result asked, no subscriber yet): the dedup record's refusal must stop the script, or the
    # publication would be refused for it, acknowledged and lost without a trace.
    define(client, QM, "QUIET", "quiet", Attributes(usedlq="NO"))
    client.xadd(keys.publish_stream(QM), publication_fields("p", "quiet/1", b"x", msgid="m1"))
    (worker,) = make_workers(client, settings, 1)
    with full(client), pytest.raises(ServerFull):
        worker.run_once(block=False)
    assert len(_pending(client)) == 1  # not acknowledged: it is still to be handled
    drain([worker])
    assert worker.counts == {"delivered": 1}  # handled as any publication, never refused for memory
    assert _keys(client, "{MEM}:dedup:*") and _pending(client) == {}


def test_a_full_server_never_makes_a_subscription_unavailable(client, settings):
    # A publication without a message id (no dedup record) asking for no result: its first write is
    # a push, made with redis.pcall (a push refused for a key of another type makes its subscription
    # unavailable, issue 27); refused for memory, it must stop the script instead. USEDLQ(NO): no
    # dead letter of its copy would stop the script later
    define(client, QM, "QUIET", "quiet", Attributes(usedlq="NO"))
    sub = subscribe(client, QM, "quiet/#", "app", "a")
    client.xadd(keys.publish_stream(QM), publication_fields("p", "quiet/1", b"x"))
    (worker,) = make_workers(client, settings, 1)
    with full(client), pytest.raises(ServerFull):
        worker.run_once(block=False)
    assert client.xlen(keys.dead_letter(QM)) == 0 and client.hlen(keys.skipped(QM)) == 0
    assert len(_pending(client)) == 1
    drain([worker])
    assert _bodies(client, sub.sub_id) == [b"x"] and _pending(client) == {}


# -- workers -----------------------------------------------------------------------------------


def test_a_worker_keeps_going_on_a_full_server_logs_once_and_resumes_without_counting_retries(
    client, settings, caplog, recovering
):
    settings = settings.model_copy(update={"max_deliveries": 2})
    subscribe(client, QM, "t/#", "app", "a")
    make_workers(client, settings, 1)  # the queue manager was set up by an earlier worker
    for publisher in ("p1", "p2"):
        Publisher(client, QM, publisher).publish_many(("t/x", f"{publisher}-{i}".encode()) for i in range(3))
    worker = Worker(connect(settings.redis_url), settings, name="w0")
    thread = threading.Thread(target=worker.run, daemon=True)
    caplog.set_level(logging.INFO, logger="broker.worker")
    with full(client):
        thread.start()
        time.sleep(5 * RETRY_PAUSE_MS / 1000)  # several rounds refused, each paused
        assert thread.is_alive() and worker.server_full
        assert _bodies(client, "app$a") == []
        # each entry was read once: the retries are the same units, not new deliveries
        assert set(_pending(client).values()) == {1}
    deadline = time.monotonic() + 10
    while len(_bodies(client, "app$a")) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stopping = True
    thread.join(10)
    assert sorted(_bodies(client, "app$a")) == sorted(
        f"{p}-{i}".encode() for p in ("p1", "p2") for i in range(3)
    )
    assert client.xlen(keys.dead_letter(QM)) == 0  # none taken for a poison entry (max_deliveries 2)
    warnings = [r.getMessage() for r in caplog.records if "the Redis server is full" in r.getMessage()]
    assert len(warnings) == 1, warnings  # logged once, then at debug level
    assert "nothing was written; pausing 500 ms between retries until memory is freed" in warnings[0]
    assert any("the server accepts writes again" in r.getMessage() for r in caplog.records)


# -- consumers ---------------------------------------------------------------------------------


def test_consumers_receive_acknowledge_and_wait_on_a_full_server(client, settings):
    record = subscribe(client, QM, "t/#", "app", "a")
    Publisher(client, QM, "p").publish_many(("t/x", b"%d" % i) for i in range(3))
    drain(make_workers(client, settings, 1))
    with full(client):
        consumer = Subscriber(client, QM, record, settings, consumer_id="c1", heartbeat=False)
        got = consumer.receive_many(10)
        assert [d.message.body for d in got] == [b"0", b"1", b"2"]
        assert consumer.ack_many(got) == 3
        started = time.monotonic()
        assert consumer.receive(timeout_ms=300) is None  # waits (polling), does not fail
        assert time.monotonic() - started >= 0.25
        consumer.heartbeat()
        consumer.close()
    assert client.llen(keys.consumer_inflight(QM, record.sub_id, "c1")) == 0


# -- the whole way, on a server filled by publications -------------------------------------------


def _snapshot(
    client: redis.Redis, sub_ids: list[str]
) -> tuple[dict[str, list[bytes]], set[bytes], dict[str, bytes]]:
    """In one MULTI: each queue's msgids, the pending entry ids, and entry id -> msgid of the stream."""
    pipe = client.pipeline(transaction=True)
    for sub_id in sub_ids:
        pipe.lrange(keys.sub_queue(QM, sub_id), 0, -1)
    pipe.xpending_range(keys.publish_stream(QM), keys.WORKER_GROUP, "-", "+", 100_000)
    pipe.xrange(keys.publish_stream(QM))
    *queues, pending, entries = pipe.execute()
    by_sub = {}
    for sub_id, envelopes in zip(sub_ids, queues, strict=True):
        by_sub[sub_id] = [e.split(b'"msgid":"', 1)[1].split(b'"', 1)[0] for e in envelopes]
    return by_sub, {row["message_id"] for row in pending}, {eid.decode(): f[b"msgid"] for eid, f in entries}


def test_a_server_filled_by_publications_refuses_then_recovers_by_itself_losing_nothing(
    client, settings, caplog, recovering
):
    # Given two subscriptions of the same publications, and an older backlog (400 x 2 KB) on a third
    a = subscribe(client, QM, "t/#", "app", "a")
    b = subscribe(client, QM, "t/#", "app", "b")
    old = subscribe(client, QM, "old/#", "app", "old")
    for _ in range(4):
        Publisher(client, QM, "old", flow_control=False).publish_many(
            ("old/x", b"o" * 2_000) for _ in range(100)
        )
        drain(make_workers(client, settings, 1))
        trim_acknowledged(client, QM)
    # When three publishers publish 2 KB messages until the server is full (no worker running yet),
    # going on until 20 in a row are refused (the used memory wavers around maxmemory at first)
    publishers = [Publisher(client, QM, f"p{i}", flow_control=False) for i in range(3)]
    accepted: list[tuple[str, int, bytes]] = []
    refusals: list[ServerFull] = []
    n = 0
    while len(refusals) < 20:
        publisher = publishers[n % 3]
        started = time.monotonic()
        try:
            result = publisher.publish("t/x", b"x" * 2_000)
        except ServerFull as exc:
            assert time.monotonic() - started < 1  # at once, not after a wait
            refusals.append(exc)
            continue
        refusals.clear()
        accepted.append((publisher.publisher_id, result.seq, result.msgid.encode()))
        n += 1
    assert refusals[0].exit_code == 5 and len(accepted) > 100
    # Then the workers, started on the full server, keep going without delivering anything half
    caplog.set_level(logging.INFO, logger="broker.worker")
    trimming = settings.model_copy(update={"trim_every_entries": 10})
    workers = [Worker(connect(settings.redis_url), trimming, name=f"w{i}") for i in range(2)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    time.sleep(4 * RETRY_PAUSE_MS / 1000)
    assert all(t.is_alive() for t in threads)
    assert any("the Redis server is full" in r.getMessage() for r in caplog.records)
    queues, pending, msgid_of = _snapshot(client, [a.sub_id, b.sub_id])
    assert pending  # publications are waiting: the server is full
    assert sorted(queues[a.sub_id]) == sorted(queues[b.sub_id])  # every unit all or nothing
    assert len(set(queues[a.sub_id])) == len(queues[a.sub_id])
    delivered = set(queues[a.sub_id])
    for entry_id, msgid in msgid_of.items():
        assert (msgid in delivered) == (entry_id.encode() not in pending), entry_id
    # When memory is freed by consuming the backlog (consumers run on a full server), then by
    # consuming what the workers deliver (the workers trim what they acknowledged: no admin job)
    backlog = Subscriber(connect(settings.redis_url), QM, old, settings, heartbeat=False)
    while batch := backlog.receive_many(100):
        backlog.ack_many(batch)
    received: dict[str, list[tuple[str, int, bytes]]] = {a.sub_id: [], b.sub_id: []}
    consumers = [Subscriber(connect(settings.redis_url), QM, r, settings, heartbeat=False) for r in (a, b)]
    deadline = time.monotonic() + 60
    while any(len(got) < len(accepted) for got in received.values()) and time.monotonic() < deadline:
        for consumer in consumers:
            batch = consumer.receive_many(100, timeout_ms=50)
            received[consumer.record.sub_id] += [
                (d.message.publisher, d.message.seq or 0, d.message.msgid.encode()) for d in batch
            ]
            consumer.ack_many(batch)
    # Then every accepted publication reached both subscriptions once, in each publisher's order
    for got in received.values():
        assert sorted(got) == sorted(accepted)
        for name in ("p0", "p1", "p2"):
            seqs = [seq for publisher, seq, _ in got if publisher == name]
            assert seqs == sorted(seqs)
    assert client.xlen(keys.dead_letter(QM)) == 0
    # And the workers trimmed the publish stream as they went: at most trim_every_entries per worker
    # stay, so the stream no longer holds the accepted bodies (2 KB each)
    wait_for(
        lambda: client.xlen(keys.publish_stream(QM)) <= 2 * trimming.trim_every_entries,
        30,
        "the workers' trims",
    )
    assert len(accepted) > 4 * trimming.trim_every_entries
    assert (client.memory_usage(keys.publish_stream(QM)) or 0) < len(accepted) * 2_000 // 4
    assert int(client.info("memory")["used_memory"]) < int(client.config_get("maxmemory")["maxmemory"])
    # And publications flow again
    after = publishers[0].publish("t/x", b"after", wait=True, timeout_ms=10_000)
    assert (after.status, after.subscriptions) == ("delivered", 2)
    for worker in workers:
        worker.stopping = True
    for thread in threads:
        thread.join(10)
