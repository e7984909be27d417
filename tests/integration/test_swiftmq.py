"""SwiftMQ's Topic Manager (seed 003) on a real server: the swiftmq scheme end to end.

Each test is one of the seed's examples: hierarchy publish/subscribe rules, ``iit.%.US``,
the root-predicate refusal, direct vs indirect subscriber selection, the queue controllers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.config import ConsumerMode, Settings
from broker.core.errors import ConfigError, InvalidTopicFilter, NoSuchTopic, SubscriptionRefused
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.declared import declare, list_declared, undeclare
from broker.topics.links import link
from broker.topics.topic_objects import Attributes, define, topic_of

QM = "TEST"


@pytest.fixture
def swift(settings: Settings) -> Settings:
    return settings.model_copy(update={"topic_scheme": "swiftmq"})


def _swiftmq_config() -> None:
    """configs/broker.toml in the working directory (the ``run`` fixture's tmp_path) choosing swiftmq."""
    Path("configs").mkdir(exist_ok=True)
    Path("configs/broker.toml").write_text('topic_scheme = "swiftmq"\n')


def _subscribe(client, *filters: str) -> dict[str, str]:
    """One durable subscription per filter; filter -> sub id."""
    return {f: subscribe(client, QM, f, "c", f"s{i}", scheme="swiftmq").sub_id for i, f in enumerate(filters)}


def _publish(client, settings, *topics: str) -> None:
    publisher = Publisher(client, QM, "p", scheme="swiftmq")
    for topic in topics:
        publisher.publish(topic, topic.encode())
    drain(make_workers(client, settings, 1))


def _received(client, sub_id: str) -> list[str]:
    return [m.body.decode() for m in queue_messages(client, QM, sub_id)]


def test_publishing_to_a_node_reaches_the_node_and_all_its_sub_nodes(real_redis, swift):
    subs = _subscribe(real_redis, "iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects")
    _publish(real_redis, swift, "iit.sales")
    assert {f: _received(real_redis, s) for f, s in subs.items()} == {
        "iit.sales": ["iit.sales"],
        "iit.sales.US": ["iit.sales"],
        "iit.sales.EU": ["iit.sales"],
        "iit.projects": [],
    }


def test_subscribing_to_a_node_receives_its_parents_and_its_sub_nodes_but_no_other_hierarchy(
    real_redis, swift
):
    subs = _subscribe(real_redis, "iit.sales.US", "iit.sales")
    _publish(real_redis, swift, "iit", "iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects")
    assert _received(real_redis, subs["iit.sales.US"]) == ["iit", "iit.sales", "iit.sales.US"]
    assert _received(real_redis, subs["iit.sales"]) == ["iit", "iit.sales", "iit.sales.US", "iit.sales.EU"]


def test_a_subscriber_receives_a_message_once_however_many_of_its_topics_match(real_redis, swift):
    # Given a link from iit.sales to iit.sales.US: the subscription to iit.sales.US matches
    # the publication on iit.sales twice (as a sub-node, and through the link)
    subs = _subscribe(real_redis, "iit.sales.US", "iit.%.US")
    link(real_redis, QM, "iit.sales", "iit.sales.US")
    _publish(real_redis, swift, "iit.sales")
    assert _received(real_redis, subs["iit.sales.US"]) == ["iit.sales"]
    assert _received(real_redis, subs["iit.%.US"]) == ["iit.sales"]


def test_predicate_iit_percent_us_receives_us_of_every_iit_hierarchy(real_redis, swift):
    subs = _subscribe(real_redis, "iit.%.US")
    _publish(
        real_redis, swift, "iit.sales.US", "iit.projects.US", "iit.sales.EU", "news.x.US", "iit.sales.US.east"
    )
    assert _received(real_redis, subs["iit.%.US"]) == ["iit.sales.US", "iit.projects.US", "iit.sales.US.east"]


def test_a_predicate_at_the_root_is_refused_and_nothing_is_stored(real_redis, run):
    with pytest.raises(InvalidTopicFilter, match="root node 'i%' cannot be a predicate"):
        subscribe(real_redis, QM, "i%.%.swiftmq", "c", "d", scheme="swiftmq")
    assert real_redis.hlen(keys.subscriptions(QM)) == 0
    _swiftmq_config()
    result = run("subscribe", "i%.%.swiftmq", "--client-id", "c", "--count", "1")
    assert result.exit_code == 2 and "root node" in result.output


def test_direct_selection_matches_the_published_topic_as_a_plain_string(real_redis, swift):
    subs = _subscribe(real_redis, "iit.sales.US", "iit.%.US", "iit.\\%.US")
    _publish(real_redis, swift, "iit.%.US")  # '%' here is an ordinary character
    assert _received(real_redis, subs["iit.sales.US"]) == []
    assert _received(real_redis, subs["iit.%.US"]) == ["iit.%.US"]
    assert _received(real_redis, subs["iit.\\%.US"]) == ["iit.%.US"]


def test_indirect_selection_uses_the_published_predicate_to_select_declared_topics(real_redis, swift):
    indirect = swift.model_copy(update={"direct_subscriber_selection": False, "topics": ["iit.sales.US"]})
    subs = _subscribe(
        real_redis, "iit.sales.US", "iit.projects.US", "iit.sales.EU", "iit.other.US", "iit.%.US"
    )
    make_workers(real_redis, indirect, 1)  # a worker declares the configured topics when it starts
    declare(real_redis, QM, "iit.projects.US")
    declare(real_redis, QM, "iit.sales.EU")
    _publish(real_redis, indirect, "iit.%.US", "iit.other.US")
    got = {f: _received(real_redis, s) for f, s in subs.items()}
    assert got == {
        "iit.sales.US": ["iit.%.US"],
        "iit.projects.US": ["iit.%.US"],
        "iit.sales.EU": [],
        "iit.other.US": [],  # not declared: indirect selection cannot reach it
        "iit.%.US": ["iit.%.US"],
    }
    assert [(d.topic, d.source) for d in list_declared(real_redis, QM)[0]] == [
        ("iit.projects.US", "cli"),
        ("iit.sales.EU", "cli"),
        ("iit.sales.US", "config"),
    ]
    undeclare(real_redis, QM, "iit.projects.US")
    with pytest.raises(NoSuchTopic):
        undeclare(real_redis, QM, "iit.projects.US")
    _publish(real_redis, indirect, "iit.%.US")
    assert _received(real_redis, subs["iit.projects.US"]) == ["iit.%.US"]  # nothing more


def test_indirect_selection_refuses_a_root_predicate_with_the_reason_in_the_result(real_redis, swift):
    indirect = swift.model_copy(update={"direct_subscriber_selection": False})
    make_workers(real_redis, indirect, 1)
    publisher = Publisher(real_redis, QM, "p", scheme="swiftmq")
    publisher.publish("i%.sales", b"x")
    drain(make_workers(real_redis, indirect, 1))
    reason = real_redis.xrange(keys.dead_letter(QM))[0][1][b"dlq.reason"].decode()
    assert "root node 'i%' cannot be a predicate" in reason


def test_a_process_with_another_scheme_than_the_queue_managers_is_refused(real_redis, swift, settings):
    make_workers(real_redis, swift, 1)
    with pytest.raises(ConfigError, match="uses the topic scheme 'swiftmq'"):
        make_workers(real_redis, settings, 1)
    with pytest.raises(ConfigError, match="uses the topic scheme 'swiftmq'"):
        subscribe(real_redis, QM, "/a", "c", scheme="mqtt")
    with pytest.raises(ConfigError, match="direct_subscriber_selection"):
        make_workers(real_redis, swift.model_copy(update={"direct_subscriber_selection": False}), 1)


def test_the_queue_controllers_example_gives_failsave_active_standby_and_the_others_shared(real_redis):
    # The seed's <queue-controllers>, in lexical order of their names; those without a
    # consumer-mode use the default, shared.
    controllers = [
        ("tmp$%", "shared"),
        ("sys$%", "shared"),
        ("swiftmq%", "shared"),
        ("rt$%", "shared"),
        ("unroutable", "shared"),
        ("failsave$%", "activestandby"),
        ("%$%", "shared"),
        ("routerdlq", "shared"),
        ("%", "shared"),
    ]
    rules = [ConsumerMode(predicate=p, mode=m) for p, m in controllers]  # type: ignore[arg-type]
    failsave = subscribe(
        real_redis, QM, "iit.sales", "failsave", "orders", consumer_modes=rules, scheme="swiftmq"
    )
    other = subscribe(real_redis, QM, "iit.sales", "sales", "orders", consumer_modes=rules, scheme="swiftmq")
    assert (failsave.sub_id, failsave.mode) == ("failsave$orders", "activestandby")
    assert (other.sub_id, other.mode) == ("sales$orders", "shared")


def test_cli_declares_lists_and_undeclares_topics(run):
    _swiftmq_config()
    assert run("topic", "declare", "feed", "feed.bloomberg").exit_code == 0
    listed = run("topic", "list")
    assert listed.exit_code == 0 and "feed.bloomberg" in listed.output and "cli" in listed.output
    bad = run("topic", "declare", "feed..x")
    assert bad.exit_code == 2 and "did you mean 'feed.x'" in bad.output
    assert run("topic", "undeclare", "feed").exit_code == 0
    missing = run("topic", "undeclare", "feed")
    assert missing.exit_code == 2 and "not declared" in missing.output


def test_status_names_a_subscription_the_swiftmq_scheme_refuses(real_redis, swift):
    make_workers(real_redis, swift, 1)
    real_redis.hset(keys.subscriptions(QM), "svc$bad", '{"filter":"f%.x","durable":true,"created_ms":0}')
    problems = status(real_redis, QM).problems
    assert any(
        "'svc$bad' matches nothing under the swiftmq scheme" in p and "root node" in p for p in problems
    )


def test_topic_objects_are_inherited_along_dot_nodes_under_the_swiftmq_scheme(real_redis, swift):
    make_workers(real_redis, swift, 1)  # records the swiftmq scheme
    define(real_redis, QM, "SALES", "iit.sales", Attributes(pub="DISABLED"))
    define(real_redis, QM, "PROJ", "iit.projects", Attributes(sub="DISABLED"))
    subs = _subscribe(real_redis, "iit.sales.US", "iit")
    _publish(real_redis, swift, "iit.sales.US", "iit.other")
    assert _received(real_redis, subs["iit"]) == ["iit.other"]  # iit.sales.US inherits PUB(DISABLED)
    reason = real_redis.xrange(keys.dead_letter(QM))[0][1][b"dlq.reason"].decode()
    assert "topic object 'SALES' has PUB(DISABLED)" in reason
    with pytest.raises(SubscriptionRefused, match="PROJ"):
        subscribe(real_redis, QM, "iit.projects.%", "c", "p", scheme="swiftmq")  # made under iit.projects
    assert topic_of(real_redis, QM, "SALES", "EU") == "iit.sales.EU"
