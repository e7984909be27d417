"""Administrative topic objects (IBM MQ, seed 002) on the real server: inheritance, enforcement, apply."""

from __future__ import annotations

import time

import pytest

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.errors import SubscriptionRefused, TopicObjectConflict
from broker.testing import drain, make_workers, queue_messages
from broker.topics.topic_objects import (
    BASE,
    Attributes,
    alter,
    apply,
    define,
    delete,
    display,
    load_file,
    read_tree,
)

QM = "TEST"


def _deliver(client, settings, topic, body=b"x", **options):
    result = Publisher(client, QM, options.pop("publisher", "p")).publish(topic, body, **options)
    drain(make_workers(client, settings, 1))
    return result


def test_effective_attributes_inherit_through_asparent_chains_to_the_base(real_redis):
    define(real_redis, QM, "A", "/a", Attributes(defprty=7))
    define(real_redis, QM, "ABC", "/a/b/c", Attributes(maxdepth=10))  # defprty ASPARENT
    define(real_redis, QM, "ABCDE", "/a/b/c/d/e")  # everything ASPARENT
    alter(real_redis, QM, BASE, pub="DISABLED")
    tree = read_tree(real_redis, QM)
    deep = tree.effective("/a/b/c/d/e/f")
    assert deep["defprty"] == 7 and deep.source["defprty"] == "A"
    assert deep["maxdepth"] == 10 and deep.source["maxdepth"] == "ABC"
    assert deep["pub"] == "DISABLED" and deep.source["pub"] == BASE
    assert deep["usedlq"] == "YES" and deep.source["usedlq"] == BASE
    assert tree.effective("/z")["defprty"] == 4  # outside every object: the base's default
    assert [o.name for o in display(real_redis, QM, "A*")] == ["A", "ABC", "ABCDE"]


def test_pub_disabled_refuses_with_the_reason_in_the_reply_and_usedlq_no_keeps_it_out_of_the_dlq(
    real_redis, settings
):
    subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    define(real_redis, QM, "PAY", "/PAY", Attributes(pub="DISABLED"))
    publisher = Publisher(real_redis, QM, "p")
    publisher.publish("/PAY/EU", b"1")
    drain(make_workers(real_redis, settings, 1))
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    reason = real_redis.xrange(keys.dead_letter(QM))[0][1][b"dlq.reason"].decode()
    assert "topic object 'PAY' has PUB(DISABLED)" in reason
    # The reply names it too, and with USEDLQ(NO) nothing more is dead-lettered
    alter(real_redis, QM, "PAY", usedlq="NO")
    real_redis.xadd(
        keys.publish_stream(QM),
        {"publisher": "q", "topic": "/PAY/EU", "msgid": "m1", "reply": "1", "body": "2"},
    )
    drain(make_workers(real_redis, settings, 1))
    got = real_redis.lpop(keys.reply(QM, "q", "m1"))
    assert b'"status":"refused"' in got and b"PUB(DISABLED)" in got
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    assert real_redis.llen(keys.sub_queue(QM, "c$pay")) == 0


def test_a_change_applies_to_the_next_publication_and_not_to_one_handled_before(real_redis, settings):
    subscribe(real_redis, QM, "/N/#", "c", "n")
    define(real_redis, QM, "N", "/N", Attributes(defprty=2))
    _deliver(real_redis, settings, "/N/x", b"before")
    alter(real_redis, QM, "N", defprty=8)
    _deliver(real_redis, settings, "/N/x", b"after")
    got = {m.body: m.priority for m in queue_messages(real_redis, QM, "c$n")}
    assert got == {b"before": 2, b"after": 8}


def test_sub_disabled_and_dursub_no_refuse_new_subscriptions(real_redis):
    define(real_redis, QM, "CLOSED", "/closed", Attributes(sub="DISABLED"))
    define(real_redis, QM, "NODUR", "/nodur", Attributes(dursub="NO"))
    with pytest.raises(SubscriptionRefused) as caught:
        subscribe(real_redis, QM, "/closed/+/x", "c", "d")
    assert caught.value.topic_object == "CLOSED" and "SUB(DISABLED)" in str(caught.value)
    with pytest.raises(SubscriptionRefused) as caught:
        subscribe(real_redis, QM, "/nodur/a", "c", "d")
    assert "DURSUB(NO)" in str(caught.value)
    assert subscribe(real_redis, QM, "/nodur/a", "c").durable is False  # non-durable is fine
    assert real_redis.hlen(keys.subscriptions(QM)) == 1


def test_defpsist_defprty_and_capexpry_are_visible_in_the_envelope(real_redis, settings):
    subscribe(real_redis, QM, "/D/#", "c", "d")
    define(real_redis, QM, "D", "/D", Attributes(defpsist="NO", defprty=6, capexpry=60_000))
    now = int(time.time() * 1000)
    _deliver(real_redis, settings, "/D/1", b"defaults", timestamp_ms=now)
    _deliver(real_redis, settings, "/D/2", b"own", timestamp_ms=now, persistent=True, priority=1)
    _deliver(real_redis, settings, "/D/3", b"long", timestamp_ms=now, expiration_ms=now + 3_600_000)
    got = {m.body: m for m in queue_messages(real_redis, QM, "c$d")}
    assert (got[b"defaults"].persistent, got[b"defaults"].priority) == (False, 6)
    assert (got[b"own"].persistent, got[b"own"].priority) == (True, 1)
    assert got[b"defaults"].expiration_ms == now + 60_000
    assert got[b"long"].expiration_ms == now + 60_000  # capped


@pytest.mark.parametrize(
    ("policy", "status", "delivered_to"),
    [("ALL", "refused", set()), ("ALLDUR", "delivered", {"c$other"}), ("ALLAVAIL", "delivered", {"c$other"})],
)
def test_delivery_policy_with_one_full_non_durable_queue(real_redis, settings, policy, status, delivered_to):
    # Given a bounded node, a full non-durable subscription and a durable one with room
    define(real_redis, QM, "B", "/B", Attributes(maxdepth=1, pmsgdlv=policy))
    full = subscribe(real_redis, QM, "/B/x", "c")  # non-durable
    other = subscribe(real_redis, QM, "/B/x", "c", "other")
    real_redis.lpush(keys.sub_queue(QM, full.sub_id), b"already there")
    # When a persistent publication comes
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/B/x", "msgid": "m", "reply": "1", "body": "b"}
    )
    drain(make_workers(real_redis, settings, 1))
    import json

    result = json.loads(real_redis.lpop(keys.reply(QM, "p", "m")))
    # Then the policy decides, all or nothing as chosen
    assert result["status"] == status
    got = {
        s for s in (full.sub_id, other.sub_id) if real_redis.llen(keys.sub_queue(QM, s)) > (s == full.sub_id)
    }
    assert got == delivered_to
    assert real_redis.llen(keys.sub_queue(QM, full.sub_id)) == 1
    if status == "refused":
        assert f"subscriber queue {keys.sub_queue(QM, full.sub_id)} is full" in result["reason"]
    else:
        assert result["subscriptions"] == 1
        assert int(real_redis.hget(keys.skipped(QM), full.sub_id)) == 1


def test_alldur_refuses_when_a_durable_queue_is_full(real_redis, settings):
    define(real_redis, QM, "B", "/B", Attributes(maxdepth=1, pmsgdlv="ALLDUR"))
    full = subscribe(real_redis, QM, "/B/x", "c", "durable")
    subscribe(real_redis, QM, "/B/x", "c", "roomy")
    real_redis.lpush(keys.sub_queue(QM, full.sub_id), b"already there")
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/B/x", "msgid": "m", "reply": "1", "body": "b"}
    )
    drain(make_workers(real_redis, settings, 1))
    got = real_redis.lpop(keys.reply(QM, "p", "m"))
    assert b'"status":"refused"' in got and b"is full" in got
    assert real_redis.llen(keys.sub_queue(QM, "c$roomy")) == 0


def test_wildcard_block_keeps_wildcard_subscriptions_above_the_node_out(real_redis, settings):
    define(real_redis, QM, "SECRET", "/secret", Attributes(wildcard="BLOCK"))
    subscribe(real_redis, QM, "#", "c", "all")
    subscribe(real_redis, QM, "/+/x", "c", "plus")
    subscribe(real_redis, QM, "/secret/#", "c", "below")
    subscribe(real_redis, QM, "/secret/x", "c", "exact")
    _deliver(real_redis, settings, "/secret/x")
    _deliver(real_redis, settings, "/open/x")
    depth = {s: real_redis.llen(keys.sub_queue(QM, f"c${s}")) for s in ("all", "plus", "below", "exact")}
    assert depth == {"all": 1, "plus": 1, "below": 1, "exact": 1}  # all and plus only got /open/x
    assert [m.topic for m in queue_messages(real_redis, QM, "c$all")] == ["/open/x"]


def test_a_topic_string_cannot_change_and_the_base_cannot_be_deleted(real_redis):
    define(real_redis, QM, "T", "/t")
    with pytest.raises(TopicObjectConflict, match="cannot be changed"):
        define(real_redis, QM, "T", "/other", replace=True)
    with pytest.raises(TopicObjectConflict, match="already bound"):
        define(real_redis, QM, "T2", "/t")
    with pytest.raises(TopicObjectConflict):
        delete(real_redis, QM, BASE)
    with pytest.raises(TopicObjectConflict):
        alter(real_redis, QM, "T", topic_string="/other")
    delete(real_redis, QM, "T")
    define(real_redis, QM, "T", "/other")  # delete and define again


def test_apply_is_idempotent(real_redis, tmp_path):
    path = tmp_path / "topics.toml"
    path.write_text(
        '[[topic]]\nname = "PAY"\ntopic_string = "/PAY"\npub = "DISABLED"\nmaxdepth = 100\n\n'
        '[[topic]]\nname = "SPORT"\ntopic_string = "/SPORT"\ndefprty = 7\n'
    )
    first = apply(real_redis, QM, load_file(path))
    assert sorted(first.defined) == ["PAY", "SPORT"]
    version = real_redis.get(keys.version(QM))
    second = apply(real_redis, QM, load_file(path))
    assert sorted(second.unchanged) == ["PAY", "SPORT"] and not second.defined and not second.altered
    assert real_redis.get(keys.version(QM)) == version  # nothing written the second time
    path.write_text('[[topic]]\nname = "PAY"\ntopic_string = "/PAY"\npub = "ENABLED"\n')
    third = apply(real_redis, QM, load_file(path), prune=True)
    assert third.altered == ["PAY"] and third.deleted == ["SPORT"]
    assert read_tree(real_redis, QM).effective("/PAY/x")["maxdepth"] == "NOLIMIT"
