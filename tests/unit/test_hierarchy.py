"""SwiftMQ dot hierarchies and SQL-LIKE predicate topics (seed 003): rules, index, declared topics."""

from __future__ import annotations

import random

import pytest

from broker.core.errors import InvalidTopic, InvalidTopicFilter
from broker.core.hierarchy import (
    DeclaredTopics,
    HierarchyIndex,
    is_predicate,
    matches,
    suggest_topic,
    validate_filter,
    validate_predicate_topic,
    validate_topic,
)

SEED_TOPICS = [
    "iit.sales.EU",
    "iit.sales.US",
    "iit.projects.swiftmq.users",
    "news.weather.forecasts",
    "sports.formula1.MichaelSchumacher",
]


def _index(*filters: str) -> HierarchyIndex:
    index = HierarchyIndex()
    for f in filters:
        index.add(f, f)
    return index


def test_publishing_to_a_node_reaches_the_node_and_all_its_sub_nodes():
    index = _index("iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects")
    assert index.match("iit.sales") == {"iit.sales", "iit.sales.US", "iit.sales.EU"}


def test_subscribing_to_a_node_receives_its_parents_its_node_and_its_sub_nodes():
    us = _index("iit.sales.US")
    assert [t for t in ("iit", "iit.sales", "iit.sales.US", "iit.sales.EU") if us.match(t)] == [
        "iit",
        "iit.sales",
        "iit.sales.US",
    ]
    sales = _index("iit.sales")
    published = ("iit", "iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects", "iit.projects.x")
    assert [t for t in published if sales.match(t)] == ["iit", "iit.sales", "iit.sales.US", "iit.sales.EU"]


def test_the_seeds_example_topics_are_valid_and_reach_only_their_own_hierarchy():
    index = _index(*SEED_TOPICS)
    for topic in SEED_TOPICS:
        assert validate_topic(topic) == topic
        assert index.match(topic) == {topic}
    assert index.match("news") == {"news.weather.forecasts"}


def test_a_predicate_node_matches_one_node_with_percent_and_underscore():
    index = _index("iit.%.US", "iit.sales._X", "iit.s%s.EU")
    assert index.match("iit.sales.US") == {"iit.%.US"}
    assert index.match("iit.projects.US") == {"iit.%.US"}
    assert index.match("iit.sales.EU") == {"iit.s%s.EU"}
    assert index.match("iit.sales.QX") == {"iit.sales._X"}
    assert index.match("iit.a.b.US") == set()  # '%' never spans a '.'
    assert index.match("iit.sales") == {"iit.%.US", "iit.sales._X", "iit.s%s.EU"}  # parents reach sub-nodes


def test_a_predicate_at_the_root_is_refused_with_the_reason():
    with pytest.raises(InvalidTopicFilter, match="root node 'i%' cannot be a predicate"):
        validate_filter("i%.%.swiftmq")
    with pytest.raises(InvalidTopicFilter, match="root node"):
        HierarchyIndex().add("_x.y", "s")
    with pytest.raises(InvalidTopic, match="root node"):
        validate_predicate_topic("%.sales")
    assert validate_filter("i\\%.x") == "i\\%.x"  # an escaped '%' is a literal root


def test_the_backslash_escapes_percent_underscore_and_itself_only():
    assert not is_predicate("a\\_b") and is_predicate("a_b") and is_predicate("a\\\\%")
    index = _index("iit.a\\_b")
    assert index.match("iit.a_b") == {"iit.a\\_b"} and index.match("iit.axb") == set()
    for bad in ("iit.a\\b", "iit.ab\\"):
        with pytest.raises(InvalidTopicFilter, match="escape"):
            validate_filter(bad)


def test_empty_nodes_are_refused_and_a_correction_is_suggested_for_topics():
    for bad in ("iit..US", ".iit", "iit.", ""):
        with pytest.raises(InvalidTopicFilter):
            validate_filter(bad)
    with pytest.raises(InvalidTopic) as caught:
        validate_topic("iit..sales.")
    assert caught.value.suggestion == "iit.sales"
    assert suggest_topic("..") is None


def test_under_direct_selection_a_published_percent_is_an_ordinary_character():
    index = _index("iit.sales.US", "iit.\\%.US", "iit.%.US")
    assert index.match("iit.%.US") == {"iit.\\%.US", "iit.%.US"}


def test_removing_prunes_and_unknown_entries_are_reported():
    index = _index("iit.%.US", "iit.sales")
    assert index.remove("iit.%.US", "iit.%.US") and not index.remove("iit.%.US", "iit.%.US")
    assert index.match("iit.x.US") == set() and len(index) == 1 and index.predicate_count == 0


def test_indirect_selection_picks_declared_nodes_and_their_sub_nodes():
    declared = DeclaredTopics(["iit", "iit.sales", "iit.sales.US", "iit.sales.EU", "iit.projects.US", "feed"])
    assert declared.select("iit.%.US") == ["iit.projects.US", "iit.sales.US"]
    assert declared.select("iit.sales") == ["iit.sales", "iit.sales.EU", "iit.sales.US"]
    assert declared.select("iit.nothing") == []
    with pytest.raises(InvalidTopic, match="root node"):
        declared.select("f%")


def _random_node(rng: random.Random, predicate: bool) -> str:
    alphabet = "ab%_" if predicate else "ab"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))


def test_the_index_agrees_with_the_reference_definition_on_random_subscriptions_and_topics():
    rng = random.Random(3)
    filters = set()
    while len(filters) < 300:
        depth = rng.randint(1, 4)
        nodes = [_random_node(rng, False)] + [_random_node(rng, rng.random() < 0.4) for _ in range(depth - 1)]
        filters.add(".".join(nodes))
    index = _index(*filters)
    for _ in range(400):
        topic = ".".join(_random_node(rng, False) for _ in range(rng.randint(1, 5)))
        assert index.match(topic) == {f for f in filters if matches(f, topic)}, topic


def test_predicates_grouped_by_literal_prefix_still_match_escaped_and_empty_prefixes():
    index = _index("iit.a\\%%", "iit.%x", "iit.ab_", "iit.a_")
    assert index.match("iit.a%z") == {"iit.a\\%%"}
    assert index.match("iit.abx") == {"iit.%x", "iit.ab_"}
    assert index.match("iit.ab") == {"iit.a_"}
    assert index.remove("iit.a\\%%", "iit.a\\%%") and index.match("iit.a%z") == set()
