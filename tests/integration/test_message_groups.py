"""Message groups (issue 28 row 12; JMSXGroupID / JMSXGroupSeq, as ActiveMQ Classic and Artemis
define them) on a real server: on a shared subscription every message of a group goes to one
consumer, in order, until it closes or dies; then the group moves, its in-flight messages first.
The library's functions take the clock (``now``): no sleeps.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import keys, library
from broker.core.errors import InvalidMessage
from broker.core.models import GROUPED_FIELD
from broker.testing import drain, make_workers
from broker.topics.subscriptions import remove_subscription, subscribe
from tests.integration.test_library import queue

QM = "TEST"  # as test_library's, whose queue() it uses
NOW = 1_800_000_000_000
LEASE_MS = 30_000


def envelope(n: int, group: str | None = None, seq: int | None = None, priority: int = 4) -> bytes:
    header: dict[str, Any] = {"v": 6, "msgid": f"m{n}", "publisher": "p", "seq": n, "topic": "t"}
    header["entry_id"] = f"1-{n}"
    if priority != 4:
        header["priority"] = priority
    props: dict[str, Any] = {}
    if group is not None:
        props["JMSXGroupID"] = group
    if seq is not None:
        props["JMSXGroupSeq"] = seq
    if props:
        header["props"] = props
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + f"body {n}".encode()


def receive(
    client: redis.Redis, sub_id: str, consumer: str, n: int, now: int = NOW, mode: str = "shared"
) -> list[int]:
    """The message numbers ``consumer`` takes (broker_receive), in the order handed over."""
    got = client.fcall("broker_receive", 1, keys.sub_queue(QM, sub_id), consumer, n, LEASE_MS, now, mode)
    assert got[0] == b"ok"
    return [json.loads(env.split(b"\n", 1)[0])["seq"] for env in got[2::2]]


def recover(client: redis.Redis, sub_id: str, now: int = NOW, closing: str = "") -> list[int]:
    return client.fcall("broker_recover", 1, keys.sub_queue(QM, sub_id), now, 10, 1000, 120_000, closing)


def owners(client: redis.Redis, sub_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.sub_groups(QM, sub_id)).items()}


@pytest.fixture
def sub(real_redis) -> str:
    library.load_library(real_redis)
    return subscribe(real_redis, QM, "t", "app", "orders", shared=True).sub_id


def test_each_group_goes_to_one_consumer_in_order(real_redis, sub):
    # Given groups A and B interleaved on a shared subscription
    queue(real_redis, sub, *(envelope(n, "A" if n % 2 else "B", seq=n) for n in range(1, 9)))
    # When c1 takes one message (A's first) and then c2 and c1 take two at a time
    first = receive(real_redis, sub, "c1", 1)
    c2 = receive(real_redis, sub, "c2", 2)
    c1 = receive(real_redis, sub, "c1", 2)
    c2 += receive(real_redis, sub, "c2", 10)
    c1 += receive(real_redis, sub, "c1", 10)
    # Then A (odd numbers) went to c1 only and B (even) to c2 only, each in order
    assert first + c1 == [1, 3, 5, 7]
    assert c2 == [2, 4, 6, 8]
    assert owners(real_redis, sub) == {"A": "c1", "B": "c2"}


def test_ungrouped_messages_are_still_shared_past_another_consumers_group(real_redis, sub):
    # Given group A's messages ahead of ungrouped ones, A owned by c1
    queue(real_redis, sub, envelope(1, "A"), envelope(2, "A"), envelope(3), envelope(4), envelope(5, "A"))
    assert receive(real_redis, sub, "c1", 1) == [1]
    # When c2 takes up to 10
    # Then it takes the ungrouped ones behind A's, and A's stay where they are, in order, for c1
    assert receive(real_redis, sub, "c2", 10) == [3, 4]
    assert receive(real_redis, sub, "c1", 10) == [2, 5]


def test_owner_dies_group_moves_and_its_in_flight_messages_come_first(real_redis, sub):
    # Given c1 owns group A and holds A's messages 1 and 2 in flight; 3 and 4 wait
    queue(real_redis, sub, *(envelope(n, "A", seq=n) for n in range(1, 5)))
    assert receive(real_redis, sub, "c1", 2) == [1, 2]
    assert receive(real_redis, sub, "c2", 10, now=NOW + 1) == []  # A is c1's
    # When c1's lease lapses and c2's recovery runs
    later = NOW + LEASE_MS + 1
    recover(real_redis, sub, now=later)
    # Then A is nobody's, and c2 receives it: the redelivered 1 and 2 first, then 3 and 4
    assert owners(real_redis, sub) == {}
    assert receive(real_redis, sub, "c2", 10, now=later) == [1, 2, 3, 4]
    assert owners(real_redis, sub) == {"A": "c2"}


def test_owner_closes_group_moves(real_redis, sub):
    # Given c1 owns A with message 1 in flight, 2 waiting
    queue(real_redis, sub, envelope(1, "A"), envelope(2, "A"))
    assert receive(real_redis, sub, "c1", 1) == [1]
    # When c1 closes (its own recover call)
    recover(real_redis, sub, closing="c1")
    # Then c2 owns A next and receives 1 again, then 2
    assert receive(real_redis, sub, "c2", 10) == [1, 2]
    assert owners(real_redis, sub) == {"A": "c2"}


def test_a_live_owner_keeps_its_group_when_another_consumer_dies(real_redis, sub):
    queue(real_redis, sub, envelope(1, "A"), envelope(2, "B"), envelope(3, "A"), envelope(4, "B"))
    assert receive(real_redis, sub, "c1", 1) == [1]
    assert receive(real_redis, sub, "c2", 1, now=NOW + 20_000) == [2]
    # c1's lease lapses, c2's does not
    recover(real_redis, sub, now=NOW + LEASE_MS + 1)
    assert owners(real_redis, sub) == {"B": "c2"}
    assert receive(real_redis, sub, "c3", 10, now=NOW + LEASE_MS + 1) == [1, 3]


def test_negative_group_seq_closes_the_group(real_redis, sub):
    # ActiveMQ Classic: a message with JMSXGroupSeq -1 is the group's last; the group is then nobody's
    queue(real_redis, sub, envelope(1, "A", seq=1), envelope(2, "A", seq=-1), envelope(3, "A", seq=1))
    assert receive(real_redis, sub, "c1", 2) == [1, 2]
    assert owners(real_redis, sub) == {}
    assert receive(real_redis, sub, "c2", 10) == [3]
    assert owners(real_redis, sub) == {"A": "c2"}


def test_groups_hold_in_each_priority_band(real_redis, sub):
    queue(real_redis, sub, envelope(1, "A"), envelope(2, "A", priority=8), envelope(3, "B", priority=8))
    assert receive(real_redis, sub, "c1", 1) == [2]
    assert receive(real_redis, sub, "c2", 10) == [3]
    assert receive(real_redis, sub, "c1", 10) == [1]


def test_a_non_shared_subscription_keeps_no_groups(real_redis):
    # Given an exclusive subscription with grouped messages
    library.load_library(real_redis)
    record = subscribe(real_redis, QM, "t", "app", "solo")
    assert record.mode == "exclusive"
    sub_id = record.sub_id
    queue(real_redis, sub_id, envelope(1, "A"), envelope(2, "B"))
    # When its consumer receives
    # Then it takes both, and no group is recorded
    assert receive(real_redis, sub_id, "c1", 10, mode="exclusive") == [1, 2]
    assert real_redis.exists(keys.sub_groups(QM, sub_id)) == 0


def test_a_group_text_in_the_body_or_a_non_string_group_is_no_group(real_redis, sub):
    body_only = (
        b'{"v":6,"msgid":"m1","publisher":"p","seq":1,"topic":"t","entry_id":"1-1"}\n"JMSXGroupID":"A"'
    )
    queue(real_redis, sub, body_only, envelope(2, None), envelope(3, None))
    real_redis.lpush(
        keys.sub_queue(QM, sub), envelope(4).replace(b'"topic":"t"', b'"topic":"t","props":{"JMSXGroupID":7}')
    )
    assert receive(real_redis, sub, "c1", 10) == [1, 2, 3, 4]
    assert owners(real_redis, sub) == {}


def test_an_escaped_group_id_is_read_whole_and_a_property_value_holding_the_text_is_no_group(real_redis, sub):
    # Given a group id JSON escapes (non-ASCII, a quote), and a property whose value holds the group text
    sly = envelope(3).replace(b'"topic":"t"', b'"topic":"t","props":{"note":"\\"JMSXGroupID\\":\\"B\\""}')
    queue(real_redis, sub, envelope(1, 'gr\u00fcn "x"', seq=1), sly, envelope(2, 'gr\u00fcn "x"', seq=2))
    # When c1 takes the first and c2 takes the rest
    assert receive(real_redis, sub, "c1", 1) == [1]
    # Then the escaped group is c1's (whole id), and the sly one is no group: c2 takes it alone
    assert owners(real_redis, sub) == {'gr\u00fcn "x"': "c1"}
    assert receive(real_redis, sub, "c2", 10) == [3]
    assert receive(real_redis, sub, "c1", 10) == [2]


def test_a_foreign_groups_key_is_refused_before_any_write(real_redis, sub):
    queue(real_redis, sub, envelope(1, "A"))
    real_redis.set(keys.sub_groups(QM, sub), "x")
    with pytest.raises(redis.ResponseError, match="BROKER foreign key"):
        receive(real_redis, sub, "c1", 1)
    assert real_redis.llen(keys.sub_queue(QM, sub)) == 1
    assert real_redis.exists(keys.sub_consumers(QM, sub)) == 0


# --- end to end: Publisher(group=...) -> workers -> Subscriber ----------------------------------


class Clock:
    """A hand-driven clock, ms since the epoch."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def _consumer(client, record, settings, name: str, clock: Clock) -> Subscriber:
    cs = settings.model_copy(update={"consumer_lease_ms": 1_000})
    return Subscriber(client, QM, record, cs, consumer_id=name, heartbeat=False, clock_ms=clock)


def test_published_groups_reach_one_subscriber_each_with_id_and_seq_and_move_when_it_closes(
    real_redis, settings
):
    # Given a shared subscription, two consumers, and groups A and B published interleaved
    record = subscribe(real_redis, QM, "$share/g/orders", "app")
    clock = Clock()
    c1, c2 = (_consumer(real_redis, record, settings, name, clock) for name in ("c1", "c2"))
    pub = Publisher(real_redis, QM, "p")
    for n in range(6):
        pub.publish("orders", f"{n}", group="AB"[n % 2], group_seq=n // 2 + 1)
    pub.publish("orders", "free")
    drain(make_workers(real_redis, settings, 1))
    # When c1 takes one, c2 takes two, then each takes the rest
    got1 = c1.receive_many(1)
    got2 = c2.receive_many(2)
    got1 += c1.receive_many(10)
    got2 += c2.receive_many(10)
    # Then group A went to c1 and B to c2, each in order, with its id and seq; the ungrouped one to either
    seen1 = [(d.message.group_id, d.message.group_seq) for d in got1 if d.message.group_id]
    seen2 = [(d.message.group_id, d.message.group_seq) for d in got2 if d.message.group_id]
    assert seen1 == [("A", 1), ("A", 2), ("A", 3)]
    assert seen2 == [("B", 1), ("B", 2), ("B", 3)]
    assert sorted(d.message.body for d in got1 + got2 if d.message.group_id is None) == [b"free"]
    # When c1 closes with A's messages unacknowledged and A gets another message
    c2.ack_many(got2)
    c1.close()
    pub.publish("orders", "6", group="A", group_seq=4)
    drain(make_workers(real_redis, settings, 1))
    # Then c2 owns A: A's in-flight messages first (redelivered), in order, then the new one
    again = [d for d in c2.receive_many(10) if d.message.group_id == "A"]
    assert [(d.message.group_seq, d.redelivered) for d in again] == [
        (1, True),
        (2, True),
        (3, True),
        (4, False),
    ]
    assert owners(real_redis, record.sub_id) == {"A": "c2", "B": "c2"}


def test_publish_with_a_group_seq_and_no_group_is_refused(real_redis):
    with pytest.raises(InvalidMessage, match="needs a group"):
        Publisher(real_redis, QM, "p").publish("orders", "x", group_seq=1)
    with pytest.raises(InvalidMessage, match="non-empty string"):
        Publisher(real_redis, QM, "p").publish("orders", "x", group="")
    assert real_redis.exists(keys.publish_stream(QM)) == 0


def test_cli_publish_group_sets_the_properties(run, real_redis, settings):
    record = subscribe(real_redis, QM, "$share/g/orders", "app")
    result = run("publish", "orders", "hi", "--group", "G", "--group-seq", "7", "--no-wait")
    assert result.exit_code == 0, result.output
    refused = run("publish", "orders", "hi", "--group-seq", "7", "--no-wait")
    assert refused.exit_code == 2 and "--group-seq needs --group" in refused.output
    drain(make_workers(real_redis, settings, 1))
    got = _consumer(real_redis, record, settings, "c1", Clock()).receive_many(10)
    assert [(d.message.group_id, d.message.group_seq, d.message.properties) for d in got] == [
        ("G", 7, {"JMSXGroupID": "G", "JMSXGroupSeq": 7})
    ]


def test_a_group_owner_takes_its_messages_even_when_another_consumer_cleared_the_bell(real_redis, settings):
    # Given c1 owns group A and has drained the subscription (its last take found fewer than asked)
    record = subscribe(real_redis, QM, "$share/g/orders", "app")
    clock = Clock()
    c1, c2 = (_consumer(real_redis, record, settings, name, clock) for name in ("c1", "c2"))
    pub = Publisher(real_redis, QM, "p")
    pub.publish("orders", "1", group="A")
    drain(make_workers(real_redis, settings, 1))
    assert [d.message.body for d in c1.receive_many(10)] == [b"1"]
    # When A's next message comes and c2's take passes it over, clearing the bell
    pub.publish("orders", "2", group="A")
    drain(make_workers(real_redis, settings, 1))
    assert c2.receive_many(10) == []
    assert real_redis.exists(keys.sub_bell(QM, record.sub_id)) == 0
    # Then c1, with time to wait, takes before it waits for the bell, and gets it at once
    assert [d.message.body for d in c1.receive_many(10, timeout_ms=1)] == [b"2"]


def test_removing_a_subscription_removes_its_message_groups(real_redis, sub):
    queue(real_redis, sub, envelope(1, "A"))
    assert receive(real_redis, sub, "c1", 1) == [1]
    assert real_redis.exists(keys.sub_groups(QM, sub)) == 1
    assert remove_subscription(real_redis, QM, sub).removed
    assert real_redis.exists(keys.sub_groups(QM, sub)) == 0


# --- protocol 7: a message of no group told by its envelope's first bytes; the scan cap ---------


def envelope7(n: int, group: str | None = None, *, marked: bool | None = None) -> bytes:
    """Message ``n`` as a protocol-7 worker writes it: ``"grouped":true`` first when it has a group
    (``marked`` overrides, to write what no worker writes)."""
    header: dict[str, Any] = (
        {GROUPED_FIELD: True} if (group is not None if marked is None else marked) else {}
    )
    header |= {"v": keys.PROTOCOL_VERSION, "msgid": f"m{n}", "publisher": "p", "seq": n, "topic": "t"}
    header["entry_id"] = f"1-{n}"
    if group is not None:
        header["props"] = {"JMSXGroupID": group}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + f"body {n}".encode()


def test_a_protocol_7_envelope_without_the_grouped_field_is_no_group_and_writes_no_group_key(real_redis, sub):
    # Given protocol-7 envelopes whose props name group A but whose header does not start with
    # "grouped" (no worker writes them: broker_receive reads only their first bytes)
    queue(real_redis, sub, envelope7(1, "A", marked=False), envelope7(2, "A", marked=False))
    # When c1 takes one and c2 the rest
    # Then each takes a message as a plain one, and no group bookkeeping is written
    assert receive(real_redis, sub, "c1", 1) == [1]
    assert receive(real_redis, sub, "c2", 10) == [2]
    assert real_redis.exists(keys.sub_groups(QM, sub)) == 0


def test_the_grouped_field_makes_a_protocol_7_envelope_grouped_and_old_envelopes_still_are(real_redis, sub):
    # Given group A written by a protocol-6 worker (searched) and by a protocol-7 one (marked),
    # and a protocol-7 message of no group
    queue(
        real_redis,
        sub,
        envelope(1, "A"),
        envelope7(2, "A"),
        envelope7(3),
        envelope(4, "A"),
        envelope7(5, "A"),
    )
    # When c1 takes the first, then c2 and c1 take the rest
    assert receive(real_redis, sub, "c1", 1) == [1]
    assert owners(real_redis, sub) == {"A": "c1"}
    # Then A's messages, old and new, are c1's only, in order; the ungrouped one goes to c2
    assert receive(real_redis, sub, "c2", 10) == [3]
    assert receive(real_redis, sub, "c1", 10) == [2, 4, 5]


def test_published_envelopes_start_with_the_grouped_field_only_when_grouped(real_redis, settings):
    # Given a subscription, a grouped and an ungrouped publication, delivered by a worker
    record = subscribe(real_redis, QM, "$share/g/orders", "app")
    pub = Publisher(real_redis, QM, "p")
    pub.publish("orders", "g", group="A")
    pub.publish("orders", "plain", properties={"JMSXGroupID": 7})  # not a string: no group
    drain(make_workers(real_redis, settings, 1))
    # Then the grouped one's header starts with "grouped", the others with the version
    grouped, plain = real_redis.lrange(keys.sub_queue(QM, record.sub_id), 0, -1)[::-1]
    assert grouped.startswith(b'{"grouped":true,"v":%d,' % keys.PROTOCOL_VERSION)
    assert plain.startswith(b'{"v":%d,' % keys.PROTOCOL_VERSION)


def _commands(client: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}


def test_a_consumer_owning_no_group_looks_at_no_more_than_its_cap_and_writes_nothing(real_redis, sub):
    # Given c1 owns group A, 40 of A's messages wait, then a message of no group (41)
    queue(real_redis, sub, *(envelope7(n, "A") for n in range(40)), envelope7(40))
    assert receive(real_redis, sub, "c1", 1) == [0]
    band = real_redis.lrange(keys.sub_queue(QM, sub), 0, -1)
    # When c2 asks for one message (cap: max(2 x 1, 16) = 16 messages passed over)
    real_redis.config_resetstat()
    got = receive(real_redis, sub, "c2", 1)
    # Then it does not reach message 40 behind the 16 it looked at, writes nothing to the band
    # (no LTRIM, no RPUSH) and clears the bell, so that it waits for it
    assert got == []
    calls = _commands(real_redis)
    assert "ltrim" not in calls and "rpush" not in calls and calls.get("lrange", 0) <= 2
    assert real_redis.lrange(keys.sub_queue(QM, sub), 0, -1) == band
    assert real_redis.exists(keys.sub_bell(QM, sub)) == 0
    # When it asks for 19 (cap 38: still short of the 39 of A's), then for 20 (cap 40)
    assert receive(real_redis, sub, "c2", 19) == []
    # Then only the call whose cap passes all 39 takes message 40; A's stay in order for c1
    assert receive(real_redis, sub, "c2", 20) == [40]
    assert receive(real_redis, sub, "c1", 100) == list(range(1, 40))


def test_a_take_past_another_consumers_group_rings_the_bell(real_redis, sub):
    # Given c1 owns A and is waiting (its last take emptied the bands); A's next message and a
    # message of no group come
    queue(real_redis, sub, envelope7(1, "A"))
    assert receive(real_redis, sub, "c1", 10) == [1]
    assert real_redis.exists(keys.sub_bell(QM, sub)) == 0
    queue(real_redis, sub, envelope7(2, "A"), envelope7(3))
    real_redis.delete(keys.sub_bell(QM, sub))
    # When c2 takes the one of no group, passing A's over
    assert receive(real_redis, sub, "c2", 10) == [3]
    # Then the bell rings, for A's owner
    assert real_redis.lrange(keys.sub_bell(QM, sub), 0, -1) == [b"1"]


def test_releasing_a_group_with_messages_waiting_rings_the_bell(real_redis, sub):
    # Given c1 owns A, holds nothing in flight, and A's message 2 waits, passed over by c2
    queue(real_redis, sub, envelope7(1, "A"), envelope7(2, "A"))
    got = real_redis.fcall("broker_receive", 1, keys.sub_queue(QM, sub), "c1", 1, LEASE_MS, NOW, "shared")
    assert real_redis.fcall("broker_ack", 1, keys.sub_queue(QM, sub), "c1", got[2]) == 1
    assert receive(real_redis, sub, "c2", 10) == []
    assert real_redis.exists(keys.sub_bell(QM, sub)) == 0
    # When c1's lease lapses and a recovery releases A (giving nothing back)
    assert recover(real_redis, sub, now=NOW + LEASE_MS + 1)[1] == 0
    # Then the bell rings: A's message is anybody's now
    assert owners(real_redis, sub) == {}
    assert real_redis.exists(keys.sub_bell(QM, sub)) == 1
