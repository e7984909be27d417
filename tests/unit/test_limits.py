"""Limits against abuse (issue 14 item 4), each on its own: settings, the checks, the errors.

The same limits on the real server (and a full server) are in ``tests/integration/test_limits.py``
and ``tests/integration/test_memory_full.py``.
"""

from __future__ import annotations

import json

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings, load_settings
from broker.core.entries import parse_entry
from broker.core.errors import (
    ConfigError,
    InvalidMessage,
    InvalidTopicFilter,
    ServerError,
    ServerFull,
    TooManyConsumers,
    TooManySubscriptions,
    translate_errors,
)
from broker.core.models import publication_fields
from broker.core.topic_rules import limit_problem
from broker.core.unit_of_work import Action
from broker.topics.subscriptions import subscribe, unsubscribe
from broker.topics.topic_objects import BASE, Attributes, TopicObject, TopicTree
from worker.loop import Worker

QM = "UNIT"


def _fields(**extra: object) -> dict[bytes, bytes]:
    raw = publication_fields("p", "t/x", b"body", msgid="m1", **extra)  # type: ignore[arg-type]
    return {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in raw.items()}


# -- settings ------------------------------------------------------------------------------


def test_the_limits_have_sane_defaults_and_default_maxdepth_keeps_queues_unbounded():
    settings = Settings()
    assert settings.max_properties_bytes == 65_536
    assert (settings.max_topic_bytes, settings.max_topic_levels) == (4_096, 32)
    assert settings.max_subscriptions_per_client == 1_000
    assert settings.max_consumers_per_subscription == 1_000
    assert settings.default_maxdepth == 0


@pytest.mark.parametrize(
    "text",
    [
        "max_topic_bytes = 0",
        "max_topic_bytes = 65536",  # above MQTT's own limit
        "max_topic_levels = 0",
        "max_properties_bytes = -1",
        "max_subscriptions_per_client = -1",
        "max_consumers_per_subscription = -1",
        "default_maxdepth = -5",
    ],
)
def test_a_limit_out_of_range_is_a_config_error_naming_it(tmp_path, text):
    path = tmp_path / "b.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=text.split(" ")[0]):
        load_settings(path)


def test_limits_come_from_the_environment_too(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BROKER_MAX_TOPIC_LEVELS", "5")
    monkeypatch.setenv("BROKER_DEFAULT_MAXDEPTH", "100")
    settings = load_settings()
    assert (settings.max_topic_levels, settings.default_maxdepth) == (5, 100)


def test_every_limit_is_documented_in_the_settings_docstring_with_its_unit():
    doc = Settings.__doc__ or ""
    for name in (
        "max_properties_bytes",
        "max_topic_bytes",
        "max_topic_levels",
        "max_subscriptions_per_client",
        "max_consumers_per_subscription",
        "default_maxdepth",
    ):
        assert f"        {name}: " in doc, name


# -- the publication's fields -----------------------------------------------------------------


def test_properties_over_the_limit_are_refused_naming_the_setting_and_at_the_limit_accepted():
    fields = _fields(properties={"k": "v" * 20})
    size = len(fields[b"props"])
    assert parse_entry("1-0", fields, 1024, size).header["props"] == {"k": "v" * 20}
    with pytest.raises(InvalidMessage) as refused:
        parse_entry("1-0", fields, 1024, size - 1)
    assert str(refused.value) == (
        f"properties of {size} bytes (the 'props' field) are larger than the limit "
        f"of {size - 1} bytes (max_properties_bytes)"
    )
    assert parse_entry("1-0", fields, 1024).header["props"]  # None: no limit (older callers)


def test_oversized_properties_are_refused_before_they_are_parsed():
    fields = _fields()
    fields[b"props"] = b"{" * 100  # not JSON: the size decides first
    with pytest.raises(InvalidMessage, match="max_properties_bytes"):
        parse_entry("1-0", fields, 1024, 10)


def test_the_body_limit_names_its_setting():
    with pytest.raises(InvalidMessage, match=r"larger than the limit of 3 bytes \(max_body_bytes\)"):
        parse_entry("1-0", _fields(), 3, 100)


# -- topics and filters -----------------------------------------------------------------------


def test_limit_problem_counts_utf8_bytes_and_levels_and_names_the_setting():
    assert limit_problem("a/b/c", 5, 3) is None
    assert (
        limit_problem("a/b/c/", 6, 3) == "it has 4 levels, more than the broker allows (max_topic_levels 3)"
    )
    assert (
        limit_problem("é" * 3, 5, 9) == "it is 6 bytes long, more than the broker allows (max_topic_bytes 5)"
    )
    assert limit_problem("a.b.c", 100, 2, ".", "the topic") == (
        "the topic has 3 nodes, more than the broker allows (max_topic_levels 2)"
    )
    assert limit_problem("a/b/c", 100, 1, ".") is None  # "/" is no separator under swiftmq


def test_a_subscription_filter_over_a_limit_is_refused_before_anything_is_written(fake_redis):
    with pytest.raises(InvalidTopicFilter) as refused:
        subscribe(fake_redis, QM, "a/b/c/#", "app", "d", max_topic_levels=3, scheme="mqtt")
    assert "it has 4 levels, more than the broker allows (max_topic_levels 3)" in str(refused.value)
    with pytest.raises(InvalidTopicFilter, match=r"max_topic_bytes 8\)"):
        subscribe(fake_redis, QM, "$share/g/abcdefghi", "app", "d", max_topic_bytes=8, scheme="mqtt")
    with pytest.raises(InvalidTopicFilter, match="3 nodes"):
        subscribe(fake_redis, QM, "iit.%.US", "app", "d", max_topic_levels=2, scheme="swiftmq")
    assert fake_redis.hlen(keys.subscriptions(QM)) == 0
    # the defaults apply to a library caller that passes none
    with pytest.raises(InvalidTopicFilter, match="33 levels"):
        subscribe(fake_redis, QM, "/".join(["l"] * 33), "app", "d", scheme="mqtt")


def test_a_worker_refuses_a_topic_over_a_limit_with_the_reason_and_no_match(fake_redis):
    worker = Worker(fake_redis, Settings(qm=QM, max_topic_bytes=10, max_topic_levels=3))
    worker.table.load(fake_redis)
    for topic, why in (
        ("a/b/c/d", "the topic has 4 levels, more than the broker allows (max_topic_levels 3)"),
        ("abcdefghijk", "the topic is 11 bytes long, more than the broker allows (max_topic_bytes 10)"),
    ):
        fields = {b"publisher": b"p", b"topic": topic.encode(), b"body": b"x"}
        unit = worker.decide.unit_of_work("p", "1-0", fields, 0)
        assert (unit.action, unit.reason) == (Action.REFUSE, why)
    # within the limits it is delivered (to nobody here)
    ok = worker.decide.unit_of_work("p", "1-0", {b"publisher": b"p", b"topic": b"a/b/c"}, 0)
    assert ok.action is Action.DELIVER


def test_a_worker_refuses_properties_over_the_limit(fake_redis):
    worker = Worker(fake_redis, Settings(qm=QM, max_properties_bytes=8))
    unit = worker.decide.unit_of_work("p", "1-0", _fields(properties={"k": "12345"}), 0)
    assert unit.action is Action.REFUSE and "max_properties_bytes" in unit.reason


# -- subscriptions per client ----------------------------------------------------------------


def test_a_new_subscription_beyond_the_client_limit_is_refused_and_attaching_is_not(fake_redis):
    for name in ("a", "b"):
        subscribe(fake_redis, QM, "t/#", "app", name, max_subscriptions_per_client=2, scheme="mqtt")
    subscribe(fake_redis, QM, "t/#", "other", "a", max_subscriptions_per_client=2, scheme="mqtt")
    with pytest.raises(TooManySubscriptions) as refused:
        subscribe(fake_redis, QM, "t/#", "app", "c", max_subscriptions_per_client=2, scheme="mqtt")
    assert refused.value.exit_code == 3
    assert str(refused.value) == (
        "client id 'app' has 2 subscriptions already, the most allowed "
        "(max_subscriptions_per_client); unsubscribe one first"
    )
    assert fake_redis.hexists(keys.subscriptions(QM), "app$c") is False
    # attaching to one it has is no new subscription
    assert subscribe(fake_redis, QM, "t/#", "app", "a", max_subscriptions_per_client=2).sub_id == "app$a"
    # a client id that is a prefix of another is counted apart ("app" is not "app2")
    subscribe(fake_redis, QM, "t/#", "app2", "a", max_subscriptions_per_client=2, scheme="mqtt")
    unsubscribe(fake_redis, QM, "app$b")
    subscribe(fake_redis, QM, "t/#", "app", "c", max_subscriptions_per_client=2, scheme="mqtt")
    # 0: no limit
    for i in range(5):
        subscribe(fake_redis, QM, "t/#", "many", f"s{i}", max_subscriptions_per_client=0, scheme="mqtt")


def test_a_shared_subscription_counts_under_its_share_name(fake_redis):
    subscribe(fake_redis, QM, "$share/grp/t/#", "c1", max_subscriptions_per_client=1, scheme="mqtt")
    with pytest.raises(TooManySubscriptions, match="client id 'grp' has 1 subscription already"):
        subscribe(fake_redis, QM, "$share/grp/u/#", "c2", max_subscriptions_per_client=1, scheme="mqtt")


# -- default MAXDEPTH --------------------------------------------------------------------------


def _tree(*objects: TopicObject, default_maxdepth: int = 0) -> TopicTree:
    raw = {o.name: o.to_json() for o in objects}
    return TopicTree.parse(QM, raw, default_maxdepth=default_maxdepth)


def test_default_maxdepth_is_the_base_maxdepth_when_the_base_says_nolimit():
    tree = _tree(default_maxdepth=50)
    effective = tree.effective("/a/b")
    assert (effective["maxdepth"], effective.source["maxdepth"]) == (50, BASE)
    assert not tree.trivial  # every queue is bounded now
    assert _tree().effective("/a/b")["maxdepth"] == "NOLIMIT" and _tree().trivial


def test_an_object_maxdepth_wins_over_the_default_even_nolimit_and_so_does_the_base_own():
    tree = _tree(
        TopicObject(name="FREE", topic_string="/free", attributes=Attributes(maxdepth="NOLIMIT")),
        TopicObject(name="TIGHT", topic_string="/tight", attributes=Attributes(maxdepth=3)),
        default_maxdepth=50,
    )
    assert tree.effective("/free/x")["maxdepth"] == "NOLIMIT"
    assert tree.effective("/tight/x")["maxdepth"] == 3
    assert tree.effective("/other")["maxdepth"] == 50
    base = TopicObject(name=BASE, topic_string="", attributes=Attributes(maxdepth=7))
    assert _tree(base, default_maxdepth=50).effective("/other")["maxdepth"] == 7


# -- errors ------------------------------------------------------------------------------------


def test_the_new_errors_say_what_to_do_and_carry_their_exit_codes():
    full = ServerFull("publication of message m-1", "Command # 1 (XADD ...) of pipeline caused error: OOM x")
    assert isinstance(full, ServerError) and full.exit_code == 5
    assert str(full).startswith("publication of message m-1 refused: the Redis server is full")
    assert "nothing was written" in str(full) and str(full).endswith("[OOM x]")
    consumers = TooManyConsumers("grp$s", 1)
    assert consumers.exit_code == 3 and "has 1 live consumer already" in str(consumers)
    assert "max_consumers_per_subscription" in str(consumers)


def test_translate_errors_turns_an_out_of_memory_reply_into_server_full():
    @translate_errors
    def link_topics() -> None:
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    with pytest.raises(ServerFull, match=r"^link topics refused: the Redis server is full"):
        link_topics()


def test_a_publication_refused_for_memory_raises_server_full_and_keeps_its_seq(fake_redis, monkeypatch):
    publisher = Publisher(fake_redis, QM, "p", flow_control=False)

    def full(*args: object, **kwargs: object) -> None:
        raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")

    monkeypatch.setattr(fake_redis, "xadd", full)
    with pytest.raises(ServerFull) as refused:
        publisher.publish("t/x", b"1", msgid="m-1")
    assert str(refused.value).startswith("publication of message m-1 refused: the Redis server is full")
    assert publisher.next_seq == 1  # not written: the same seq again on the retry
    monkeypatch.undo()
    assert publisher.publish("t/x", b"1", msgid="m-1").seq == 1
    entry = fake_redis.xrange(keys.publish_stream(QM))[0][1]
    assert json.loads(b"[" + entry[b"seq"] + b"]") == [1]
