"""Seed 000 (linked topics, IBM US 8,874,667) on the real server: one copy per subscriber
(Figure 2's duplicate-subscriber check, a per-client-id setting), self-links, and
``broker topics`` explain resolving as the workers do (issue 28 rows 1, 7, 8)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from broker import Publisher, subscribe
from broker.core import clock, keys
from broker.core.errors import ConfigError, ForeignKey
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.copies import PER_SUBSCRIBER, PER_SUBSCRIPTION, read_copies, set_copies
from broker.topics.explain import explain
from broker.topics.links import link, list_links, unlink
from broker.topics.routing import RoutingTable
from broker.topics.topic_objects import Attributes, define

QM = "TEST"

#: Figure 2: subscribers A, B, C on the source topic; A, D, E on Topic 1; B, F, G on Topic 2.
FIGURE_2 = {"/source": "ABC", "/topic1": "ADE", "/topic2": "BFG"}


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each subscription made 1 ms after the one before: "earliest-made" is the order made."""
    now = iter(range(1_000_000, 2_000_000))
    monkeypatch.setattr(clock, "now_ms", lambda: next(now))
    yield


def _figure_2(client) -> None:
    link(client, QM, "/source", "/topic1")
    link(client, QM, "/source", "/topic2")
    for topic, subscribers in FIGURE_2.items():
        for subscriber in subscribers:
            subscribe(client, QM, topic, subscriber, topic.strip("/"), consumer_modes=())


def _publish(client, settings, topic: str, **options) -> None:
    Publisher(client, QM, "p").publish(topic, b"x", **options)
    drain(make_workers(client, settings, 1))


def _copies(client) -> dict[str, int]:
    """Subscription id -> messages in its queue, for every subscription with some."""
    found = {}
    for raw in client.hkeys(keys.subscriptions(QM)):
        sub_id = raw.decode()
        n = len(queue_messages(client, QM, sub_id))
        if n:
            found[sub_id] = n
    return found


def test_figure_2_one_copy_per_subscriber_for_the_clients_set_so(real_redis, settings, ticking):
    # Given Figure 2: A and B each hold two of the linked topics' subscriptions
    _figure_2(real_redis)
    # When a publication is made on the source topic, one copy per subscription (the default)
    _publish(real_redis, settings, "/source")
    before = _copies(real_redis)
    assert sum(before.values()) == 9
    assert before["A$source"] == before["A$topic1"] == before["B$source"] == before["B$topic2"] == 1
    # And A and B are set to one copy per subscriber, and the queues emptied
    set_copies(real_redis, QM, "A", PER_SUBSCRIBER)
    set_copies(real_redis, QM, "B", PER_SUBSCRIBER)
    for sub_id in before:
        real_redis.delete(*keys.sub_bands(QM, sub_id))
    _publish(real_redis, settings, "/source")
    # Then 7 copies: each of A..G gets one, A and B on their earliest-made subscription
    after = _copies(real_redis)
    every = {f"{s}${t.strip('/')}" for t, subs in FIGURE_2.items() for s in subs}
    assert after == dict.fromkeys(sorted(every - {"A$topic1", "B$topic2"}), 1)
    assert sum(after.values()) == 7
    assert sorted({s.partition("$")[0] for s in after}) == list("ABCDEFG")
    # And explain says so, with the rule
    route = explain(real_redis, QM, "/source")
    assert len(route.subscriptions) == 7
    assert route.left_out == {"A": ["A$topic1"], "B": ["B$topic2"]}
    assert "one copy per subscriber for A, B" in route.rule


def test_a_running_worker_applies_a_copies_change_before_its_next_publication(real_redis, settings, ticking):
    # Given a worker that loaded its routing table with one copy per subscription
    _figure_2(real_redis)
    workers = make_workers(real_redis, settings, 1)
    publisher = Publisher(real_redis, QM, "p")
    publisher.publish("/source", b"1")
    drain(workers)
    assert len(queue_messages(real_redis, QM, "A$topic1")) == 1
    # When A is set to one copy per subscriber and the same worker handles the next publication
    set_copies(real_redis, QM, "A", PER_SUBSCRIBER)
    publisher.publish("/source", b"2")
    drain(workers)
    # Then A's later subscription got no copy of it
    assert [m.body for m in queue_messages(real_redis, QM, "A$topic1")] == [b"1"]
    assert [m.body for m in queue_messages(real_redis, QM, "A$source")] == [b"1", b"2"]


def test_the_earliest_made_subscription_gets_the_copy_not_the_first_by_name(real_redis, settings, ticking):
    # Given client c's subscription on the linked target made before the one on the source
    link(real_redis, QM, "/news/london", "/news/england")
    subscribe(real_redis, QM, "/news/england", "c", "z-england")
    subscribe(real_redis, QM, "/news/#", "c", "a-all")
    set_copies(real_redis, QM, "c", PER_SUBSCRIBER)
    # When a publication reaches both
    _publish(real_redis, settings, "/news/london")
    # Then only the earliest-made one has it
    assert _copies(real_redis) == {"c$z-england": 1}
    # And setting it back gives one copy per subscription again
    set_copies(real_redis, QM, "c", PER_SUBSCRIPTION)
    _publish(real_redis, settings, "/news/london")
    assert _copies(real_redis) == {"c$z-england": 2, "c$a-all": 1}


def test_one_copy_per_subscriber_goes_to_the_first_subscription_whose_selector_selects_it(
    real_redis, settings, ticking
):
    # Given client c with an earlier subscription that selects big orders, and a later one for all
    subscribe(real_redis, QM, "/orders/+", "c", "big", selector="amount > 5")
    subscribe(real_redis, QM, "/orders/#", "c", "all")
    subscribe(real_redis, QM, "/orders/#", "other", "all")
    set_copies(real_redis, QM, "c", PER_SUBSCRIBER)
    # When a small and a big order are published
    _publish(real_redis, settings, "/orders/eu", properties={"amount": 1})
    _publish(real_redis, settings, "/orders/eu", properties={"amount": 9})
    # Then c gets each once: the small one on "all", the big one on "big"; other gets both
    assert [m.properties["amount"] for m in queue_messages(real_redis, QM, "c$big")] == [9]
    assert [m.properties["amount"] for m in queue_messages(real_redis, QM, "c$all")] == [1]
    assert len(queue_messages(real_redis, QM, "other$all")) == 2
    assert explain(real_redis, QM, "/orders/eu").one_of == [["c$big", "c$all"]]


def test_copies_setting_refuses_bad_input_and_a_hand_written_value_is_a_problem(real_redis, settings):
    with pytest.raises(ConfigError):
        set_copies(real_redis, QM, "c", "twice")
    real_redis.hset(keys.client_copies(QM), "c", "weird")
    subscribe(real_redis, QM, "/t", "c", "one")
    subscribe(real_redis, QM, "/#", "c", "two")
    table = RoutingTable(QM)
    table.load(real_redis)
    assert [p.field for p in table.problems] == ["c"]
    assert read_copies(real_redis, QM)[0] == frozenset()
    assert any("client_copies" in p and "'weird'" in p for p in status(real_redis, QM).problems)
    _publish(real_redis, settings, "/t")  # the unreadable value: one copy per subscription
    assert _copies(real_redis) == {"c$one": 1, "c$two": 1}
    real_redis.delete(keys.client_copies(QM))
    real_redis.set(keys.client_copies(QM), "x")
    with pytest.raises(ForeignKey):
        set_copies(real_redis, QM, "c", PER_SUBSCRIBER)


def test_copies_cli_sets_shows_and_lists(run, real_redis, settings, ticking):
    _figure_2(real_redis)
    assert run("copies").stdout.strip() == "every client id: one copy per subscription"
    result = run("copies", "A", "subscriber")
    assert result.exit_code == 0 and result.stdout.strip() == "A: one copy per subscriber"
    assert run("copies", "A").stdout.strip() == "A: one copy per subscriber"
    assert run("copies", "B").stdout.strip() == "B: one copy per subscription"
    assert run("copies").stdout.strip() == "A: one copy per subscriber"
    assert run("copies", "A", "twice").exit_code == 2
    shown = run("topics", "/source").stdout
    assert "delivered once to 8 subscriptions" in shown
    assert "no copy (one per subscriber for A): A$topic1" in shown
    assert "rule: one copy per subscriber for A" in shown


# --- Row 7: a self-link is the no-op the seed describes ------------------------------------------


def test_a_self_link_is_accepted_delivers_once_is_listed_and_removable(real_redis, settings, run):
    # Given seed 000: linked topics "can be recursive, either simply by referring to themselves or cyclically"
    subscribe(real_redis, QM, "/a", "c", "a")
    subscribe(real_redis, QM, "/b", "c", "b")
    result = run("link", "/a", "/a")
    assert result.exit_code == 0, result.output
    link(real_redis, QM, "/a", "/b")
    # When a publication is made on /a
    _publish(real_redis, settings, "/a")
    # Then each subscription gets it once, and the self-link is listed and explained
    assert _copies(real_redis) == {"c$a": 1, "c$b": 1}
    assert list_links(real_redis, QM) == [("/a", "/a", False), ("/a", "/b", False)]
    assert "/a" in run("links").stdout
    assert explain(real_redis, QM, "/a").subscriptions == ["c$a", "c$b"]
    # And it is removed like any other
    unlink(real_redis, QM, "/a", "/a")
    assert list_links(real_redis, QM) == [("/a", "/b", False)]


# --- Row 8: explain resolves as the workers do -----------------------------------------------------


def _block(client) -> None:
    define(client, QM, "SECRET", "/secret", Attributes(wildcard="BLOCK"))
    subscribe(client, QM, "#", "c", "all")
    subscribe(client, QM, "/secret/#", "c", "below")


def _passthru(client) -> None:
    define(client, QM, "SECRET", "/secret", Attributes(wildcard="PASSTHRU"))
    subscribe(client, QM, "#", "c", "all")
    subscribe(client, QM, "/secret/#", "c", "below")


def _block_through_a_link(client) -> None:
    define(client, QM, "SECRET", "/secret", Attributes(wildcard="BLOCK"))
    link(client, QM, "/open/x", "/secret/x")
    subscribe(client, QM, "/secret/+", "c", "below")
    subscribe(client, QM, "/+/x", "c", "plus")
    subscribe(client, QM, "/open/#", "d", "open")


def _block_deeper(client) -> None:
    define(client, QM, "DEEP", "/a/b", Attributes(wildcard="BLOCK"))
    subscribe(client, QM, "/a/+/c", "c", "above")
    subscribe(client, QM, "/a/b/+", "c", "at")
    subscribe(client, QM, "/a/b/c", "c", "exact")


def _links_and_cycle(client) -> None:
    link(client, QM, "/x", "/y")
    link(client, QM, "/y", "/z")
    link(client, QM, "/z", "/x", backward=True)
    link(client, QM, "/y", "/y")
    for topic in ("/x", "/y", "/z", "/#"):
        subscribe(client, QM, topic, "c", topic.strip("/").replace("#", "all"))


def _one_copy(client) -> None:
    _figure_2(client)
    set_copies(client, QM, "A", PER_SUBSCRIBER)


CONFIGURATIONS: dict[str, tuple[Callable[..., None], tuple[str, ...]]] = {
    "wildcard block": (_block, ("/secret/x", "/open/x", "/secret")),
    "wildcard passthru": (_passthru, ("/secret/x", "/open/x")),
    "block through a link": (_block_through_a_link, ("/open/x", "/secret/x")),
    "block below the root": (_block_deeper, ("/a/b/c", "/a/z/c")),
    "links and a cycle": (_links_and_cycle, ("/x", "/y", "/z")),
    "one copy per subscriber": (_one_copy, ("/source", "/topic1")),
}


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_explain_names_exactly_the_subscriptions_the_workers_deliver_to(real_redis, settings, ticking, name):
    configure, topics = CONFIGURATIONS[name]
    configure(real_redis)
    for topic in topics:
        # Given what explain says a publication on the topic reaches
        said = explain(real_redis, QM, topic).subscriptions
        # When one is published and the workers deliver it
        for sub_id in real_redis.hkeys(keys.subscriptions(QM)):
            real_redis.delete(*keys.sub_bands(QM, sub_id.decode()))
        _publish(real_redis, settings, topic)
        # Then the queues that got a copy are exactly those, once each
        assert _copies(real_redis) == dict.fromkeys(said, 1), topic


def test_explain_shows_what_wildcard_block_keeps_out(real_redis):
    _block(real_redis)
    route = explain(real_redis, QM, "/secret/x")
    assert route.subscriptions == ["c$below"]
    assert route.via == {"/secret/x": ["c$below"]}
    assert route.blocked == {"/secret/x": ["c$all"]}
