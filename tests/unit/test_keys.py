"""Key names: one hash tag per queue manager; subscription store on both backends."""

from __future__ import annotations

import pytest

from broker import subscribe, unsubscribe
from broker.core import keys
from broker.core.errors import NoSuchSubscription, SubscriptionConflict
from broker.topics.subscriptions import list_subscriptions

QM = "TEST"


def test_every_key_shares_the_queue_manager_hash_tag():
    names = [
        keys.publish_stream(QM),
        keys.version(QM),
        keys.subscriptions(QM),
        keys.links(QM),
        keys.sub_queue(QM, "a$b"),
        keys.sub_inflight(QM, "a$b"),
        keys.fifo_key(QM, "p"),
        keys.turn_key(QM, "p"),
        keys.dedup(QM, "p", "m"),
        keys.reply(QM, "p", "m"),
        keys.dead_letter(QM),
        keys.workers(QM),
        keys.active_publishers(QM),
        keys.last_active(QM),
        keys.sub_poison(QM, "a$b"),
        keys.sub_expired(QM, "a$b"),
        keys.sub_last_active(QM, "a$b"),
        keys.sub_groups(QM, "a$b"),
        keys.schedules(QM),
    ]
    assert all(name.startswith("{TEST}:") for name in names)
    assert len(set(names)) == len(names)


def test_lua_key_pattern_is_prefix_plus_publisher_plus_suffix():
    assert keys.fifo_key(QM, "p") == keys.pub_prefix(QM) + "p" + ":fifo"
    assert keys.turn_key(QM, "p") == keys.pub_prefix(QM) + "p" + ":turn"


def test_subscribe_bumps_the_version_and_durable_resubscribe_reattaches(any_redis):
    first = subscribe(any_redis, QM, "/a/#", "c1", "d1")
    again = subscribe(any_redis, QM, "/a/#", "c1", "d1")
    assert again == first
    assert int(any_redis.get(keys.version(QM))) == 1
    with pytest.raises(SubscriptionConflict):
        subscribe(any_redis, QM, "/b", "c1", "d1")


def test_unsubscribe_removes_record_and_queue(any_redis):
    record = subscribe(any_redis, QM, "/a", "c1")
    any_redis.lpush(keys.sub_queue(QM, record.sub_id), b"x")
    unsubscribe(any_redis, QM, record.sub_id)
    assert list_subscriptions(any_redis, QM) == []
    assert any_redis.exists(keys.sub_queue(QM, record.sub_id)) == 0
    with pytest.raises(NoSuchSubscription):
        unsubscribe(any_redis, QM, record.sub_id)


def test_bad_client_id_is_refused(any_redis):
    with pytest.raises(ValueError, match="client id"):
        subscribe(any_redis, QM, "/a", "bad id:with colon")


@pytest.mark.parametrize("flow_control", [False, True])
def test_publisher_retry_after_an_unknown_outcome_reuses_seq_and_default_msgid(
    fake_redis, monkeypatch, flow_control
):
    import redis

    from broker import Publisher
    from broker.core.errors import ConnectionLost

    pub = Publisher(fake_redis, QM, "p", flow_control=flow_control)
    # with flow control the XADD goes in a pipeline with the GET of the flow key
    name = "pipeline" if flow_control else "xadd"
    real = getattr(fake_redis, name)

    def lost(*args, **kwargs):
        raise redis.ConnectionError("reply lost")

    def lost_pipeline(*args, **kwargs):
        pipe = real(*args, **kwargs)
        pipe.execute = lost
        return pipe

    monkeypatch.setattr(fake_redis, name, lost_pipeline if flow_control else lost)
    with pytest.raises(ConnectionLost, match="outcome unknown"):
        pub.publish("/a", b"x")
    monkeypatch.setattr(fake_redis, name, real)
    retried = pub.publish("/a", b"x")
    assert retried.seq == 1
    assert retried.msgid.endswith("-1")


def test_commit_lua_names_the_unit_fields_in_the_order_python_encodes_them():
    import re
    from importlib import resources

    from broker.core.unit_of_work import UNIT_FIELDS

    source = resources.files("broker").joinpath("lua", "library", "commit.lua").read_text()
    named = re.findall(r"^-- unit field (\d+) (\w+)", source, flags=re.MULTILINE)
    assert [(int(n), name) for n, name in named] == list(enumerate(UNIT_FIELDS))
    assert f"local UNIT_FIELDS = {len(UNIT_FIELDS)}" in source


def test_flow_key_is_prefix_plus_publisher_plus_flow_and_band_sub_id_inverts_sub_band():
    assert keys.flow_key(QM, "p") == keys.pub_prefix(QM) + "p" + ":flow"
    for sub_id in ("a$b", "a$p4", "c$x:p", "a$b:p12"):
        for priority in range(10):
            assert keys.band_sub_id(QM, keys.sub_band(QM, sub_id, priority)) == sub_id
    assert keys.slow(QM).startswith("{TEST}:") and keys.slow(QM) != keys.skipped(QM)


def test_commit_batch_watches_queues_without_loosening_a_bound():
    from broker.core.config import SlowSubscriberCondition
    from broker.core.unit_of_work import Action, CommitBatch, UnitOfWork

    batch = CommitBatch()
    queues = (keys.sub_queue(QM, "a$b"), keys.sub_queue(QM, "a$c"))
    condition = SlowSubscriberCondition(name="t", max_messages=7, disconnect_delete_durable_subscriber=True)
    batch.add(UnitOfWork("p", "1-0", Action.DELIVER, "m", queues=queues, slow=condition))
    batch.limit(queues[0], 10, False)
    batch.watch(queues[0], True)  # already bounded: keeps its bound
    batch.watch(queues[1], True)
    assert batch.encoded_limits() == "10:10:0 11:0:1"
    assert batch.args[-1].split("|")[5] == "7:0:1"  # the options field's slow condition (no journal)
    batch.add(UnitOfWork("p", "2-0", Action.DELIVER, "m2", queues=queues))
    assert batch.args[-1].split("|")[5] == ""


def test_key_patterns_match_exactly_the_keys_they_name_on_a_real_server(real_redis) -> None:
    # Given keys of two publishers whose ids differ only where one holds a glob character,
    # and of two clients whose ids share a prefix
    named = {
        keys.reply("QM1", "a*b", "m1"): "reply a*b",
        keys.reply("QM1", "aXb", "m1"): "reply aXb",
        keys.sub_queue("QM1", "c1$n"): "sub c1",
        keys.sub_consumers("QM1", "c1$n"): "sub c1",
        keys.sub_queue("QM1", "c10$n"): "sub c10",
        keys.publish_stream("QM2"): "other qm",
    }
    for key in named:
        real_redis.set(key, "x")

    def matched(pattern: str) -> set[str]:
        return {named[k.decode()] for k in real_redis.scan_iter(match=pattern)}

    # Then each pattern (the ACL key patterns of broker.acl) names only its own keys
    assert matched(keys.reply_pattern("QM1", "a*b")) == {"reply a*b"}
    assert matched(keys.client_subscriptions_pattern("QM1", "c1")) == {"sub c1"}
    assert matched(keys.all_keys_pattern("QM1")) == {"reply a*b", "reply aXb", "sub c1", "sub c10"}
    assert keys.glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
