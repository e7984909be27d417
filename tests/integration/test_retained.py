"""Retained publications on a real server (issue 28 row 10; IBM MQ MQPMO_RETAIN, MQTT 5 §3.3.1.3).

The last retained publication of a topic string is kept in the unit of work that delivers it; an
empty retained body clears it; a new subscription receives the retained publications its filter,
selector and no-local admit, flagged ``retained``, in the transaction that creates it.
"""

from __future__ import annotations

import json

import pytest

from broker.clients.consumer import Subscriber
from broker.core import keys
from broker.core.errors import ForeignKey, InvalidMessage
from broker.core.models import Message, publication_fields
from broker.operations.control import ControlServer
from broker.operations.status import status
from broker.testing import drain, make_workers
from broker.topics import retained as retained_publications
from broker.topics.retained import clear_retained, list_retained
from broker.topics.subscriptions import subscribe
from tests.conftest import QM
from worker.loop import Worker


def _publish(client, topic: str, body: bytes, msgid: str, retain: bool = True, **options) -> None:
    fields = publication_fields("p", topic, body, msgid=msgid, reply=True, retain=retain, **options)
    client.xadd(keys.publish_stream(QM), fields)


def _result(client, msgid: str) -> dict:
    raw = client.lpop(keys.reply(QM, "p", msgid))
    assert raw is not None, f"no result for {msgid}"
    return json.loads(raw)


def _messages(client, sub_id: str) -> list[Message]:
    """Every message waiting in a subscription's bands, oldest first per band, highest band first."""
    out = []
    for band in keys.sub_bands(QM, sub_id):
        out += [Message.from_envelope(e) for e in reversed(client.lrange(band, 0, -1))]
    return out


def _kept(client) -> dict[str, bytes]:
    return {p.topic: p.message.body for p in list_retained(client, QM) if p.message is not None}


def test_the_last_retained_publication_per_topic_is_kept_replaced_and_cleared(real_redis, settings):
    # Given workers and no subscription at all
    workers = make_workers(real_redis, settings, 1)
    # When two retained publications and a plain one go to a/b, and one to a/c
    _publish(real_redis, "a/b", b"first", "m1")
    _publish(real_redis, "a/b", b"second", "m2")
    _publish(real_redis, "a/b", b"plain", "m3", retain=False)
    _publish(real_redis, "a/c", b"other", "m4")
    _publish(real_redis, "x|y", b"bar", "m6")  # a topic with "|" (commit.lua's options separator)
    drain(workers)
    # Then each topic keeps its last retained publication (a plain one changes nothing), though
    # no subscription got any
    assert _result(real_redis, "m2")["status"] == "delivered"
    assert _kept(real_redis) == {"a/b": b"second", "a/c": b"other", "x|y": b"bar"}
    clear_retained(real_redis, QM, "x|y")
    # When a retained publication with an empty body goes to a/b
    sub = subscribe(real_redis, QM, "a/b", "live", "s", retained=False)
    _publish(real_redis, "a/b", b"", "m5")
    drain(workers)
    # Then a/b's is cleared, and the empty publication is delivered as MQTT says (not flagged)
    assert _kept(real_redis) == {"a/c": b"other"}
    [cleared] = _messages(real_redis, sub.sub_id)
    assert cleared.body == b"" and not cleared.retained
    # And a duplicate of a retained publication (same msgid) does not write it again
    _publish(real_redis, "a/c", b"changed", "m4")
    drain(workers)
    assert _result(real_redis, "m4")["status"] == "duplicate"
    assert _kept(real_redis) == {"a/c": b"other"}


def test_a_new_subscription_gets_each_matching_topics_retained_publication_flagged(real_redis, settings):
    # Given retained publications on three topics, one of priority 7
    workers = make_workers(real_redis, settings, 1)
    _publish(real_redis, "news/uk", b"uk", "m1")
    _publish(real_redis, "news/us", b"us", "m2", priority=7)
    _publish(real_redis, "sport/uk", b"sport", "m3")
    drain(workers)
    # When a subscription to news/+ is made
    record = subscribe(real_redis, QM, "news/+", "app", "n")
    # Then its queue holds both news topics' retained publications, flagged, each in its band,
    # written by subscribe itself (no worker ran)
    got = {m.topic: m for m in _messages(real_redis, record.sub_id)}
    assert sorted(got) == ["news/uk", "news/us"]
    assert all(m.retained for m in got.values())
    assert real_redis.llen(keys.sub_band(QM, record.sub_id, 7)) == 1
    # And a consumer receives them with Message.retained (MQIsRetained)
    subscriber = Subscriber(real_redis, QM, record, settings, heartbeat=False)
    received = [d.message for d in subscriber.receive_many(10)]
    assert [m.topic for m in received] == ["news/us", "news/uk"]  # priority 7 first
    assert all(m.retained for m in received)
    # And a publication after it arrives as usual, not flagged
    _publish(real_redis, "news/uk", b"uk2", "m4", retain=False)
    drain(workers)
    [later] = [d.message for d in subscriber.receive_many(10)]
    assert later.body == b"uk2" and not later.retained
    # And attaching again to the same durable subscription sends nothing more
    subscribe(real_redis, QM, "news/+", "app", "n")
    assert _messages(real_redis, record.sub_id) == []


def test_selector_no_local_and_no_retained_apply_to_retained_publications(real_redis, settings):
    # Given retained publications from client "me" and "other", with a property
    workers = make_workers(real_redis, settings, 1)
    _publish(real_redis, "t/1", b"mine", "m1", client_id="me", properties={"n": 1})
    _publish(real_redis, "t/2", b"theirs", "m2", client_id="other", properties={"n": 2})
    drain(workers)
    # When subscriptions with a selector, with no-local, and with no retained are made
    selected = subscribe(real_redis, QM, "t/#", "x", "sel", selector="n > 1")
    no_local = subscribe(real_redis, QM, "t/#", "me", "nl", no_local=True)
    none = subscribe(real_redis, QM, "t/#", "y", "none", retained=False)
    shared = subscribe(real_redis, QM, "$share/g/t/#", "z", "sh")
    # Then each gets what its options admit
    assert [m.body for m in _messages(real_redis, selected.sub_id)] == [b"theirs"]
    assert [m.body for m in _messages(real_redis, no_local.sub_id)] == [b"theirs"]
    assert _messages(real_redis, none.sub_id) == []
    assert _messages(real_redis, shared.sub_id) == []  # MQTT 5 §4.8.2: none to a shared subscription


def test_subscribe_delivers_the_retained_publication_current_at_its_commit(real_redis, settings, monkeypatch):
    # Given a retained publication on t
    workers = make_workers(real_redis, settings, 1)
    _publish(real_redis, "t", b"old", "m1")
    drain(workers)
    # When the retained publication changes while subscribe is deciding (after its read)
    real = retained_publications.for_subscription
    calls = []

    def changing(stored, *args, **kwargs):
        calls.append(dict(stored))
        if len(calls) == 1:
            other = real_redis.hget(keys.retained(QM), "t").replace(b"old", b"new")
            real_redis.hset(keys.retained(QM), "t", other)
        return real(stored, *args, **kwargs)

    monkeypatch.setattr(retained_publications, "for_subscription", changing)
    record = subscribe(real_redis, QM, "t", "c", "s")
    # Then its transaction started again ({qm}:retained is watched): one copy, the new one
    assert len(calls) == 2
    assert [m.body for m in _messages(real_redis, record.sub_id)] == [b"new"]


def test_a_bad_retain_field_is_refused(real_redis, settings):
    # Given a raw publication with retain 2
    workers = make_workers(real_redis, settings, 1)
    real_redis.xadd(
        keys.publish_stream(QM),
        {"publisher": "p", "topic": "t", "body": "x", "msgid": "bad", "reply": "1", "retain": "2"},
    )
    drain(workers)
    # Then it is refused with the reason, dead-lettered, and nothing is retained
    result = _result(real_redis, "bad")
    assert result["status"] == "refused"
    assert "field 'retain' must be 0 or 1" in result["reason"]
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    assert real_redis.exists(keys.retained(QM)) == 0


def test_a_foreign_retained_key_refuses_only_retained_publications(real_redis, settings):
    # Given {qm}:retained holding a string
    real_redis.set(keys.retained(QM), "planted")
    workers = make_workers(real_redis, settings, 1)
    # When a retained and a plain publication go to t
    _publish(real_redis, "t", b"kept", "m1")
    _publish(real_redis, "t", b"plain", "m2", retain=False)
    drain(workers)
    # Then the retained one is refused with the key named (nothing written for it), the plain one delivered
    refused = _result(real_redis, "m1")
    assert refused["status"] == "refused" and keys.retained(QM) in refused["reason"]
    assert _result(real_redis, "m2")["status"] == "delivered"
    with pytest.raises(ForeignKey):
        subscribe(real_redis, QM, "t", "c", "s")


def test_status_counts_and_clear_removes_retained_publications(real_redis, settings):
    # Given two retained publications
    workers = make_workers(real_redis, settings, 1)
    _publish(real_redis, "a", b"1", "m1")
    _publish(real_redis, "b", b"2", "m2")
    drain(workers)
    # Then status counts them
    assert status(real_redis, QM).retained == 2
    # When one is cleared, then all
    assert clear_retained(real_redis, QM, "a") == 1
    assert status(real_redis, QM).retained == 1
    assert clear_retained(real_redis, QM) == 1
    assert status(real_redis, QM).retained == 0


def test_the_cli_publishes_retained_shows_and_clears_them(run, real_redis, settings):
    # Given a publication made with `broker publish --retain` and handled by a worker
    workers = make_workers(real_redis, settings, 1)
    published = run("publish", "sensors/kitchen", "21.5", "--retain", "--no-wait")
    assert published.exit_code == 0, published.output
    drain(workers)
    # Then `broker retained list`, `broker topic status` and `broker status` show it
    listed = run("retained", "list")
    assert listed.exit_code == 0, listed.output
    assert "sensors/kitchen" in listed.output and "21.5" in listed.output
    assert "1 retained publication(s)" in listed.output
    shown = run("topic", "status", "sensors/kitchen")
    assert "retained publication: " in shown.output and "21.5" in shown.output
    assert "retained publication: none" in run("topic", "status", "sensors/hall").output
    assert "retained publications" in run("status").output
    # And `broker subscribe` prints it flagged retained, unless --no-retained
    got = run("subscribe", "sensors/+", "--client-id", "c", "--count", "1", "--timeout-ms", "1000")
    assert "sensors/kitchen" in got.output and "retained  21.5" in got.output
    none = run("subscribe", "sensors/+", "--client-id", "d", "--no-retained", "--timeout-ms", "200")
    assert "received 0 message(s)" in none.output
    # When `broker retained clear` removes it
    cleared = run("retained", "clear", "sensors/kitchen")
    assert "cleared 1 retained publication(s)" in cleared.output
    assert "0 retained publication(s)" in run("retained", "list").output


def test_a_subscription_made_by_request_gets_the_retained_publications_unless_asked_not_to(
    real_redis, settings
):
    # Given a retained publication on t/1
    workers = make_workers(real_redis, settings, 1)
    _publish(real_redis, "t/1", b"kept", "m1")
    drain(workers)
    # When control requests (as a subscriber user's, no grants in force) make two subscriptions
    server = ControlServer(real_redis, settings, "w0")
    made = server.decide("c", {"op": "subscribe", "topic": "t/+", "name": "a"}, None)
    none = server.decide("c", {"op": "subscribe", "topic": "t/+", "name": "b", "retained": "0"}, None)
    # Then the first got it flagged, through the same subscribe, the second none
    [kept] = _messages(real_redis, made["subscription"])
    assert kept.body == b"kept" and kept.retained
    assert _messages(real_redis, none["subscription"]) == []
    # And a retained field other than 0/1 is refused
    with pytest.raises(InvalidMessage):
        server.decide("c", {"op": "subscribe", "topic": "t/+", "name": "d", "retained": "2"}, None)


def test_a_subscription_made_while_a_retained_publication_is_in_flight_gets_it_once(real_redis, settings):
    # Given a worker that resolved a retained publication (and a plain one behind it, same publisher)
    # and, before it commits, a subscription to its topic is made: the subscription read the store
    # (still the old one), the worker's routing table does not have it
    _publish(real_redis, "t", b"old", "m0")
    drain(make_workers(real_redis, settings, 1))
    made: list[str] = []

    def subscribe_before_commit(point: str) -> None:
        if point == "before_commit" and not made:
            made.append(subscribe(real_redis, QM, "t", "late", "s").sub_id)

    worker = Worker(real_redis, settings, name="w-late", hook=subscribe_before_commit)
    worker.setup()
    _publish(real_redis, "t", b"new", "m1")
    _publish(real_redis, "t", b"after", "m2", retain=False)
    drain([worker], max_rounds=20)
    # Then the subscription has the old one from the store, flagged, then the new one delivered
    # (decided again with the subscription in the table), then the one after it: none lost
    got = [(m.body, m.retained) for m in _messages(real_redis, made[0])]
    assert got == [(b"old", True), (b"new", False), (b"after", False)]
    assert _result(real_redis, "m1")["status"] == "delivered"
    assert _kept(real_redis) == {"t": b"new"}
