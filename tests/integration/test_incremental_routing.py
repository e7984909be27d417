"""Subscription changes applied to a worker's routing table alone (``RoutingTable.refresh``).

Each subscribe/unsubscribe logs its id with the version it bumped to in ``{qm}:sub_changes``;
a worker applies those changes alone instead of reloading every subscription. After any
sequence of changes the table must be the one a full load gives, and a publication
dequeued after ``subscribe`` returned reaches the new subscription. Anything the log
cannot vouch for (a trimmed, absent, foreign or corrupt log, a change that is not a
subscription's) reloads the whole table, and never stops the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.config import ConsumerMode, Settings
from broker.operations.maintenance import reset
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.links import link
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import unsubscribe
from broker.topics.topic_objects import Attributes, define
from worker.loop import Worker

QM = "TEST"

MQTT_TOPICS = ["/a", "/a/b", "/a/b/c", "/a/x/c", "/w/1", "/w/1/2", "/s/1", "/q", "/z/z/z"]
MQTT_FILTERS = ["/a", "/a/b", "/a/+", "/a/+/c", "/a/#", "#", "/w/#", "/w/+/2", "/s/1", "/q", "+/+"]
SWIFT_TOPICS = ["iit", "iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects", "x.y"]
SWIFT_FILTERS = ["iit", "iit.sales", "iit.%.US", "iit.sales.US", "iit.s%", "x", "x.y.z"]
MODES = [ConsumerMode(predicate="m%$%", mode="activestandby")]


def _same_as_full_load(client: redis.Redis, table: RoutingTable, topics: list[str]) -> None:
    """The table equals a fresh full load: every derived structure, and ``resolve`` of ``topics``."""
    fresh = RoutingTable(table.qm, table.default_maxdepth)
    fresh.load(client)
    assert table.version == fresh.version
    assert table.subscriptions == fresh.subscriptions
    assert table.selectors.keys() == fresh.selectors.keys()
    assert table._conditional == fresh._conditional
    assert table.limits == fresh.limits
    assert table.queue_limits == fresh.queue_limits
    assert table._first_wildcard == fresh._first_wildcard
    assert len(table.index) == len(fresh.index)
    for topic in topics:
        mine, theirs = table.resolve(topic), fresh.resolve(topic)
        assert (mine.sub_ids, mine.conditional) == (theirs.sub_ids, theirs.conditional), topic


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RoutingTable]]:
    """Every full load of a routing table, recorded (the tables loaded)."""
    done: list[RoutingTable] = []
    original = RoutingTable.load

    def counted(self: RoutingTable, client: redis.Redis) -> None:
        done.append(self)
        original(self, client)

    monkeypatch.setattr(RoutingTable, "load", counted)
    yield done


def _bodies(client: redis.Redis, sub_id: str) -> list[str]:
    return [m.body.decode() for m in queue_messages(client, QM, sub_id)]


def _mqtt_variety(client: redis.Redis, prefix: str) -> list[str]:
    """Subscriptions of every kind: durable, non-durable, selector, no-local, shared, consumer mode."""
    return [
        subscribe(client, QM, "/a/+", "c", f"{prefix}d").sub_id,
        subscribe(client, QM, "/a/#", "c").sub_id,
        subscribe(client, QM, "/a/b", "c", f"{prefix}sel", selector="x > 1").sub_id,
        subscribe(client, QM, "/a/+/c", "c", f"{prefix}nl", no_local=True).sub_id,
        subscribe(client, QM, "/w/#", "g", f"{prefix}sh", shared=True).sub_id,
        subscribe(client, QM, f"$share/{prefix}grp//s/1", "c").sub_id,
        subscribe(client, QM, "/w/+/2", "m1", f"{prefix}mode", consumer_modes=MODES).sub_id,
        subscribe(client, QM, "#", "c", f"{prefix}all").sub_id,
    ]


def test_subscription_changes_are_applied_alone_and_equal_a_full_load(real_redis, settings, loads):
    # Given topic objects bounding /a/b and blocking wildcards above /w, and a worker's table
    define(real_redis, QM, "AB", "/a/b", Attributes(maxdepth=5))
    define(real_redis, QM, "W", "/w/1", Attributes(wildcard="BLOCK"))
    first = _mqtt_variety(real_redis, "p")
    [worker] = make_workers(real_redis, settings, 1)
    table = worker.table
    for topic in MQTT_TOPICS:  # recipient sets cached per topic
        table.resolve(topic)
    loads.clear()
    # When subscriptions of every kind come and go
    second = _mqtt_variety(real_redis, "q")
    for sub_id in first[::2]:
        unsubscribe(real_redis, QM, sub_id)
    applied = table.refresh(real_redis)
    # Then they are applied without a full load, and the table is a full load's
    assert applied and loads == []
    _same_as_full_load(real_redis, table, MQTT_TOPICS)
    assert set(second) <= set(table.subscriptions) and not set(first[::2]) & set(table.subscriptions)
    assert any(s in table.limits for s in second) and table.selectors and table._conditional


def test_swiftmq_subscription_changes_are_applied_alone(real_redis, settings, loads):
    swift = settings.model_copy(update={"topic_scheme": "swiftmq"})
    subscribe(real_redis, QM, "iit.sales", "c", "s0", scheme="swiftmq")
    [worker] = make_workers(real_redis, swift, 1)
    for topic in SWIFT_TOPICS:
        worker.table.resolve(topic)
    loads.clear()
    ids = [
        subscribe(real_redis, QM, f, "c", f"s{i + 1}", scheme="swiftmq").sub_id
        for i, f in enumerate(SWIFT_FILTERS)
    ]
    unsubscribe(real_redis, QM, ids[0])
    assert worker.table.refresh(real_redis) and loads == []
    _same_as_full_load(real_redis, worker.table, SWIFT_TOPICS)


def test_a_publication_after_subscribe_reaches_the_new_subscription_and_not_after_unsubscribe(
    real_redis, settings, loads
):
    # Given a worker that has handled a publication
    old = subscribe(real_redis, QM, "/t/#", "c", "old").sub_id
    [worker] = make_workers(real_redis, settings, 1)
    publisher = Publisher(real_redis, QM, "p")
    publisher.publish("/t/1", b"before")
    drain([worker])
    loads.clear()
    # When a subscription is made, then a publication follows
    new = subscribe(real_redis, QM, "/t/+", "c", "new").sub_id
    publisher.publish("/t/1", b"after")
    drain([worker])
    # Then the new subscription gets it, with no full reload
    assert _bodies(real_redis, new) == ["after"] and loads == []
    # And after unsubscribe, it gets nothing (its queue is never made again)
    unsubscribe(real_redis, QM, new)
    publisher.publish("/t/1", b"gone")
    drain([worker])
    assert not real_redis.exists(*keys.sub_bands(QM, new))
    assert _bodies(real_redis, old) == ["before", "after", "gone"] and loads == []


def _behind(client: redis.Redis, settings: Settings) -> Worker:
    """A worker whose table is two logged subscription changes behind."""
    subscribe(client, QM, "/a/#", "c", "base")
    [worker] = make_workers(client, settings, 1)
    subscribe(client, QM, "/a/+", "c", "one")
    subscribe(client, QM, "/a/b", "c", "two", selector="x > 1")
    return worker


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda c: c.zremrangebyrank(keys.sub_changes(QM), 0, 1), id="trimmed past the version"),
        pytest.param(lambda c: c.delete(keys.sub_changes(QM)), id="missing"),
        pytest.param(lambda c: link(c, QM, "/b", "/a/b"), id="a link change between"),
    ],
)
def test_a_log_that_cannot_vouch_for_every_version_reloads_the_whole_table(
    real_redis, settings, loads, damage
):
    table = _behind(real_redis, settings).table
    damage(real_redis)
    loads.clear()
    assert not table.refresh(real_redis)
    assert loads == [table]
    _same_as_full_load(real_redis, table, ["/a/b", "/b", "/a/c"])


@pytest.mark.parametrize(
    "member",
    [b"garbage", b"3 c$x", b"\xff\xfe", b"4"],
    ids=["no version", "another version", "not UTF-8", "no id"],
)
def test_a_corrupt_log_entry_reloads_the_whole_table_and_the_worker_carries_on(
    real_redis, settings, loads, caplog, member
):
    # Given a worker behind, and a log entry for a version that is not one
    worker = _behind(real_redis, settings)
    table = worker.table
    version = real_redis.incr(keys.version(QM))
    real_redis.zadd(keys.sub_changes(QM), {member: version})
    subscribe(real_redis, QM, "/a/b", "c", "three")
    loads.clear()
    # When the worker handles a publication
    Publisher(real_redis, QM, "p").publish("/a/b", b"m")
    with caplog.at_level(logging.WARNING, logger="broker.routing"):
        drain([worker])
    # Then it reloaded the whole table (and said why) and delivered to every subscription
    assert loads == [table]
    assert "change log entry" in caplog.text
    assert all(_bodies(real_redis, s) == ["m"] for s in ("c$base", "c$one", "c$three"))
    _same_as_full_load(real_redis, table, ["/a/b"])


def test_a_foreign_change_log_never_refuses_a_subscription_and_workers_reload(real_redis, settings, loads):
    # Given the change log key holds a string (written by something else)
    [worker] = make_workers(real_redis, settings, 1)
    real_redis.set(keys.sub_changes(QM), "not a log")
    # When a subscription is made and a publication follows
    sub_id = subscribe(real_redis, QM, "/f", "c", "f").sub_id
    loads.clear()
    Publisher(real_redis, QM, "p").publish("/f", b"m")
    drain([worker])
    # Then the subscription was made (not logged), the worker reloaded whole and delivered
    assert real_redis.get(keys.sub_changes(QM)) == b"not a log"
    assert loads == [worker.table] and _bodies(real_redis, sub_id) == ["m"]
    # And a removal (remove_subscription.lua) leaves the foreign key alone too
    unsubscribe(real_redis, QM, sub_id)
    assert real_redis.get(keys.sub_changes(QM)) == b"not a log"
    # And broker status names it
    assert any(keys.sub_changes(QM) in p for p in status(real_redis, QM).problems)


def test_a_changed_record_that_cannot_be_read_reloads_and_is_a_problem(real_redis, settings, loads):
    table = _behind(real_redis, settings).table
    version = real_redis.incr(keys.version(QM))
    real_redis.hset(keys.subscriptions(QM), "c$bad", "not json")
    real_redis.zadd(keys.sub_changes(QM), {f"{version} c$bad": version})
    loads.clear()
    assert not table.refresh(real_redis) and loads == [table]
    assert [p.field for p in table.problems] == ["c$bad"]
    # And once the bad record is removed, the table that listed it reloads whole once more
    unsubscribe(real_redis, QM, "c$bad")
    assert not table.refresh(real_redis)
    assert table.problems == []
    _same_as_full_load(real_redis, table, ["/a/b"])


def test_the_log_keeps_only_the_newest_entries(real_redis):
    for i in range(keys.SUB_CHANGES_MAX_LEN + 5):
        subscribe(real_redis, QM, "/a", f"c{i % 7}", f"n{i}")
    epoch, *entries = real_redis.zrange(keys.sub_changes(QM), 0, -1, withscores=True)
    version = int(real_redis.get(keys.version(QM)))
    assert epoch[0].startswith(b"epoch ") and epoch[1] == 0  # the log's epoch is kept
    assert len(entries) == keys.SUB_CHANGES_MAX_LEN
    last = keys.SUB_CHANGES_MAX_LEN + 4
    assert entries[-1] == (f"{version} c{last % 7}$n{last}".encode(), version)


_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 11), st.integers(0, 10), st.integers(0, 3)),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("scheme", ["mqtt", "swiftmq"])
@hsettings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(_OPS, min_size=1, max_size=4))
def test_any_sequence_of_changes_applied_alone_equals_a_full_load(real_redis, settings, scheme, batches):
    real_redis.flushall()
    filters, topics = (MQTT_FILTERS, MQTT_TOPICS) if scheme == "mqtt" else (SWIFT_FILTERS, SWIFT_TOPICS)
    chosen = settings.model_copy(update={"topic_scheme": scheme})
    if scheme == "mqtt":
        define(real_redis, QM, "AB", "/a/b", Attributes(maxdepth=5))
    subscribe(real_redis, QM, filters[0], "seed", "s", scheme=scheme)  # the log exists when the table loads
    [worker] = make_workers(real_redis, chosen, 1)
    table = worker.table
    for ops in batches:
        for op, name, which, kind in ops:
            sub_id = f"c{name % 3}$n{name}"
            if op == "remove":
                if real_redis.hexists(keys.subscriptions(QM), sub_id):
                    unsubscribe(real_redis, QM, sub_id)
                continue
            if real_redis.hexists(keys.subscriptions(QM), sub_id):
                unsubscribe(real_redis, QM, sub_id)
            subscribe(
                real_redis,
                QM,
                filters[which % len(filters)],
                f"c{name % 3}",
                f"n{name}" if kind != 3 or scheme != "mqtt" else None,
                selector="x > 1" if kind == 1 else None,
                no_local=kind == 2,
                scheme=scheme,
            )
        for topic in topics[::2]:
            table.resolve(topic)
        assert table.refresh(real_redis)
        _same_as_full_load(real_redis, table, topics)


def test_a_full_reload_reuses_only_records_whose_json_is_unchanged(real_redis, settings):
    # Given a loaded table, then records rewritten by hand with an unlogged version bump
    subscribe(real_redis, QM, "/a", "c", "same")
    subscribe(real_redis, QM, "/a", "c", "moved")
    subscribe(real_redis, QM, "/a", "c", "broken")
    [worker] = make_workers(real_redis, settings, 1)
    table = worker.table
    same = table.subscriptions["c$same"]
    subs = keys.subscriptions(QM)
    real_redis.hset(subs, "c$moved", '{"filter":"/b","durable":true,"created_ms":1}')
    real_redis.hset(subs, "c$broken", "not json")
    real_redis.incr(keys.version(QM))
    # When it reloads
    assert not table.refresh(real_redis)
    # Then the unchanged record is the same object, the changed ones are read again
    assert table.subscriptions["c$same"] is same
    assert table.subscriptions["c$moved"].topic_filter == "/b" and table.resolve("/b").sub_ids == ("c$moved",)
    assert "c$broken" not in table.subscriptions and [p.field for p in table.problems] == ["c$broken"]
    _same_as_full_load(real_redis, table, ["/a", "/b"])


def test_a_log_made_anew_after_a_reset_is_never_applied_to_the_old_table(real_redis, settings, loads):
    # Given a worker's table at version 3, then a reset of the queue manager (every key deleted)
    worker = _behind(real_redis, settings)
    table = worker.table
    reset(real_redis, QM)
    # When more subscription changes than the old version are logged anew
    for i in range(6):
        subscribe(real_redis, QM, "/n", "c", f"new{i}")
    loads.clear()
    # Then the table is reloaded whole (the new log's entries after 3 are not the whole story)
    assert not table.refresh(real_redis) and loads == [table]
    assert sorted(table.subscriptions) == [f"c$new{i}" for i in range(6)]
    _same_as_full_load(real_redis, table, ["/a/b", "/n"])
    # And the next change is applied alone again
    subscribe(real_redis, QM, "/n", "c", "next")
    assert table.refresh(real_redis)


def test_a_removal_makes_the_log_with_its_epoch_when_there_is_none(real_redis, settings, loads):
    worker = _behind(real_redis, settings)
    real_redis.delete(keys.sub_changes(QM))
    assert not worker.table.refresh(real_redis)  # no log: reloaded whole
    unsubscribe(real_redis, QM, "c$one")  # remove_subscription.lua
    (epoch, zero), (entry, version) = real_redis.zrange(keys.sub_changes(QM), 0, -1, withscores=True)
    assert epoch.startswith(b"epoch ") and zero == 0 and entry == f"{int(version)} c$one".encode()
    assert not worker.table.refresh(real_redis)  # a log the table did not know: reloaded whole, once
    unsubscribe(real_redis, QM, "c$two")
    loads.clear()
    assert worker.table.refresh(real_redis) and loads == []
    _same_as_full_load(real_redis, worker.table, ["/a/b"])


def test_a_version_deleted_by_hand_starts_a_new_log(real_redis, settings, loads):
    # Given a worker's table at version 3, then the version key deleted (the log kept)
    worker = _behind(real_redis, settings)
    table = worker.table
    assert table.refresh(real_redis) and table.version == b"3"
    real_redis.delete(keys.version(QM))
    # When as many subscription changes are made again, the versions restarting at 1
    for i in range(6):
        subscribe(real_redis, QM, "/n", "c", f"again{i}")
    loads.clear()
    # Then the log is a new one, and the table is reloaded whole
    assert not table.refresh(real_redis) and loads == [table]
    _same_as_full_load(real_redis, table, ["/a/b", "/n"])


def test_a_failure_while_applying_changes_reloads_the_whole_table(real_redis, settings, loads, monkeypatch):
    # Given a table behind, and indexing that fails halfway through the changes
    table = _behind(real_redis, settings).table
    calls = []
    original_add = RoutingTable._add

    def failing(self: RoutingTable, record: object) -> None:
        calls.append(record)
        raise RuntimeError("boom")

    monkeypatch.setattr(RoutingTable, "_add", failing)
    loads.clear()
    # When it is refreshed, it falls back to a reload (which fails too here: the same indexing)
    with pytest.raises(RuntimeError):
        table.refresh(real_redis)
    assert calls and loads == [table]
    # Then the half-built table has no version: the next refresh reloads it whole
    assert table.version is None
    monkeypatch.setattr(RoutingTable, "_add", original_add)
    loads.clear()
    assert not table.refresh(real_redis) and loads == [table]
    _same_as_full_load(real_redis, table, ["/a/b"])
