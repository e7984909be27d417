"""Tests of broker.core.topic_rules: MQTT 5 §4.7 topic rules, the index, and topic links."""

from __future__ import annotations

import itertools
import random

import pytest

from broker.core.errors import (
    InvalidLink,
    InvalidTopic,
    InvalidTopicFilter,
    LinkCycle,
    NoSuchLink,
)
from broker.core.topic_rules import (
    LEVEL_SEPARATOR,
    MAX_TOPIC_BYTES,
    LinkGraph,
    TopicIndex,
    is_wildcard,
    matches,
    split_shared,
    suggest_topic,
    validate_filter,
    validate_topic,
)
from broker.topics.copies import one_copy
from broker.topics.subscriptions import SubscriptionRecord

# --------------------------------------------------------------------------
# Constants


def test_constants_follow_mqtt() -> None:
    assert MAX_TOPIC_BYTES == 65535
    assert LEVEL_SEPARATOR == "/"


# --------------------------------------------------------------------------
# Topic names


@pytest.mark.parametrize(
    "topic",
    [
        "sport",
        "sport/tennis/player1",
        "/finance",
        "/",
        "//",
        "a//b",
        "sport/",
        "Sport/Tennis",
        "sport tennis/with spaces",
        "$SYS/monitor/Clients",
        "$",
        "é/ü/€/😀",
        "é" * (MAX_TOPIC_BYTES // 2) + "a",  # exactly 65,535 bytes
        "€" * (MAX_TOPIC_BYTES // 3),  # exactly 65,535 bytes of 3-byte characters
    ],
)
def test_valid_topic_is_returned_unchanged(topic: str) -> None:
    assert validate_topic(topic) == topic


@pytest.mark.parametrize(
    ("topic", "reason_part"),
    [
        ("", "at least one character"),
        ("sport\x00tennis", "U+0000"),
        ("\x00", "U+0000"),
        ("sport/+", "wildcard"),
        ("+", "wildcard"),
        ("#", "wildcard"),
        ("sport/#", "wildcard"),
        ("sport/tennis#", "wildcard"),
        ("sport+/tennis", "wildcard"),
        ("a/+/b", "wildcard"),
        ("é" * (MAX_TOPIC_BYTES // 2 + 1), "65536 bytes"),
        ("a" * (MAX_TOPIC_BYTES + 1), "65536 bytes"),
        ("\ud800", "surrogate"),
    ],
)
def test_invalid_topic_raises_invalid_topic_with_reason(topic: str, reason_part: str) -> None:
    with pytest.raises(InvalidTopic) as caught:
        validate_topic(topic)
    assert caught.value.topic == topic
    assert reason_part in caught.value.reason


def test_topic_of_65536_bytes_in_fewer_characters_is_too_long() -> None:
    topic = "é" * 32768  # 32,768 characters, 65,536 bytes
    assert len(topic) < MAX_TOPIC_BYTES
    with pytest.raises(InvalidTopic):
        validate_topic(topic)


def test_invalid_topic_carries_the_suggestion() -> None:
    with pytest.raises(InvalidTopic) as caught:
        validate_topic("sport/tennis#")
    assert caught.value.suggestion == "sport/tennis"
    assert "sport/tennis" in str(caught.value)


def test_invalid_topic_without_possible_correction_has_no_suggestion() -> None:
    with pytest.raises(InvalidTopic) as caught:
        validate_topic("#")
    assert caught.value.suggestion is None


def test_invalid_topic_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at least one character"):
        validate_topic("")


# --------------------------------------------------------------------------
# Suggestions


@pytest.mark.parametrize(
    ("topic", "suggestion"),
    [
        ("sport/tennis#", "sport/tennis"),
        ("sport+/tennis", "sport/tennis"),
        ("sport/#", "sport"),
        ("a/+/b", "a/b"),
        ("+/tennis/#", "tennis"),
        ("sport/+/player1/#", "sport/player1"),
        ("sport/++/x", "sport/x"),
        ("sp\x00ort", "sport"),
        ("/finance/#", "/finance"),
        ("a//+", "a/"),
        ("sport/tennis", "sport/tennis"),
    ],
)
def test_suggest_topic_amends_the_topic(topic: str, suggestion: str) -> None:
    assert suggest_topic(topic) == suggestion
    assert validate_topic(suggestion) == suggestion


@pytest.mark.parametrize("topic", ["", "#", "+", "+/#", "+/+", "/#", "\x00", "é" * 40000])
def test_suggest_topic_returns_none_when_nothing_valid_is_left(topic: str) -> None:
    assert suggest_topic(topic) is None


def test_suggest_topic_truncates_a_long_topic_at_a_level_boundary() -> None:
    level = "é" * 1000  # 2,000 bytes
    topic = LEVEL_SEPARATOR.join([level] * 40)  # 80,039 bytes
    suggestion = suggest_topic(topic)
    assert suggestion is not None
    assert len(suggestion.encode("utf-8")) <= MAX_TOPIC_BYTES
    assert suggestion == LEVEL_SEPARATOR.join([level] * 32)  # 64,031 bytes; 33 levels is 66,032
    assert topic.startswith(suggestion + LEVEL_SEPARATOR)


def test_suggest_topic_truncates_after_removing_wildcards() -> None:
    topic = "a" * 40000 + "/#/" + "b" * 40000
    assert suggest_topic(topic) == "a" * 40000


# --------------------------------------------------------------------------
# Topic filters


@pytest.mark.parametrize(
    "topic_filter",
    [
        "sport",
        "+",
        "#",
        "sport/+/player1",
        "+/tennis/#",
        "sport/tennis/#",
        "sport/#",
        "+/+",
        "/+",
        "+/",
        "//#",
        "$SYS/#",
        "$SYS/monitor/+",
        "a//b",
        "é/+/ü",
        "with space/+",
        "a" * MAX_TOPIC_BYTES,
    ],
)
def test_valid_filter_is_returned_unchanged(topic_filter: str) -> None:
    assert validate_filter(topic_filter) == topic_filter


@pytest.mark.parametrize(
    ("topic_filter", "reason_part"),
    [
        ("", "at least one character"),
        ("sport/\x00", "U+0000"),
        ("a" * (MAX_TOPIC_BYTES + 1), "65536 bytes"),
        ("é" * (MAX_TOPIC_BYTES // 2) + "/#", "bytes"),
        ("sport+", "'+' must occupy a whole level"),
        ("+sport", "'+' must occupy a whole level"),
        ("sport/++", "'+' must occupy a whole level"),
        ("sport/+tennis/x", "'+' must occupy a whole level"),
        ("sport/tennis#", "'#' must occupy a whole level"),
        ("##", "'#' must occupy a whole level"),
        ("#/", "'#' must be the last level"),
        ("sport/tennis/#/ranking", "'#' must be the last level"),
        ("#/#", "'#' must be the last level"),
        ("+#", "must occupy a whole level"),
    ],
)
def test_invalid_filter_raises_invalid_topic_filter(topic_filter: str, reason_part: str) -> None:
    with pytest.raises(InvalidTopicFilter) as caught:
        validate_filter(topic_filter)
    assert caught.value.topic_filter == topic_filter
    assert reason_part in caught.value.reason


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("sport", False),
        ("/finance", False),
        ("a//b", False),
        ("+", True),
        ("#", True),
        ("sport/+/player1", True),
        ("sport/#", True),
    ],
)
def test_is_wildcard_tells_whether_a_filter_has_a_wildcard_level(topic_filter: str, expected: bool) -> None:
    assert is_wildcard(topic_filter) is expected


# --------------------------------------------------------------------------
# Matching: the examples of MQTT 5 §4.7


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        # '#' (§4.7.1.2)
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("sport/#", "sport/x/y", True),
        ("sport/#", "sport/", True),
        ("sport/#", "sports", False),
        ("#", "sport/tennis/player1", True),
        ("#", "/finance", True),
        ("#", "/", True),
        # '+' (§4.7.1.3)
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player2", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+", "sport", True),
        ("+/tennis/#", "sport/tennis", True),
        ("+/tennis/#", "sport/tennis/player1/ranking", True),
        ("sport/+/player1", "sport/tennis/player1", True),
        ("sport/+/player1", "sport/tennis/player2", False),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        # empty levels are significant
        ("/finance", "finance", False),
        ("finance", "/finance", False),
        ("a//b", "a//b", True),
        ("a//b", "a/b", False),
        ("a/+/b", "a//b", True),
        # case-sensitive, spaces allowed
        ("Sport/#", "sport", False),
        ("sport/ tennis", "sport/ tennis", True),
        ("sport/ tennis", "sport/tennis", False),
        # '$' topics (§4.7.2)
        ("#", "$SYS/monitor/Clients", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("$SYS/#", "$SYS", True),
        ("+", "$SYS", False),
        ("#", "$", False),
        ("a/#", "a/$x", True),
        ("+/+", "a/$x", True),
        ("+/#", "/$SYS", True),
    ],
)
def test_matches_follows_mqtt_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected


def test_matches_rejects_an_invalid_filter() -> None:
    with pytest.raises(InvalidTopicFilter):
        matches("sport/tennis#", "sport/tennis")


def test_matches_rejects_an_invalid_topic() -> None:
    with pytest.raises(InvalidTopic):
        matches("sport/#", "sport/+")


# --------------------------------------------------------------------------
# TopicIndex agrees with matches()

GRID_FILTERS = [
    "#",
    "+",
    "+/+",
    "+/+/+",
    "+/+/+/+",
    "/+",
    "+/",
    "/#",
    "+/#",
    "+/+/#",
    "/",
    "//",
    "sport",
    "sport/#",
    "sport/+",
    "sport/tennis",
    "sport/tennis/+",
    "sport/tennis/#",
    "sport/tennis/player1",
    "sport/tennis/player1/#",
    "sport/+/player1",
    "+/tennis/#",
    "+/+/player1",
    "Sport/#",
    "sport/ tennis",
    "/finance",
    "+/finance",
    "finance",
    "a/",
    "a/+",
    "a/#",
    "a//b",
    "a/+/b",
    "a//+",
    "+//+",
    "$SYS",
    "$SYS/+",
    "$SYS/#",
    "$SYS/monitor/+",
    "$SYS/monitor/Clients",
    "+/monitor/Clients",
    "$x/#",
    "é/+",
]

GRID_TOPICS = [
    "sport",
    "sport/",
    "sports",
    "sport/tennis",
    "sport/tennis/player1",
    "sport/tennis/player2",
    "sport/tennis/player1/ranking",
    "sport/tennis/player1/",
    "sport/badminton/player1",
    "sport/x/y",
    "sport/ tennis",
    "Sport",
    "Sport/tennis",
    "x/tennis",
    "x/tennis/y",
    "/finance",
    "finance",
    "finance/",
    "/",
    "//",
    "///",
    "a",
    "a/",
    "a/b",
    "a//b",
    "a/x/b",
    "a//",
    "a///b",
    "/a",
    "a/$x",
    "/$SYS",
    "$",
    "$x",
    "$x/y",
    "$SYS",
    "$SYS/",
    "$SYS/monitor",
    "$SYS/monitor/Clients",
    "$SYS/monitor/Clients/x",
    "é/ü",
]


@pytest.fixture(scope="module")
def grid_index() -> TopicIndex:
    index = TopicIndex()
    for topic_filter in GRID_FILTERS:
        index.add(topic_filter, f"sub:{topic_filter}")
    return index


@pytest.mark.parametrize("topic", GRID_TOPICS)
def test_index_match_agrees_with_matches_for_every_grid_filter(grid_index: TopicIndex, topic: str) -> None:
    expected = {f"sub:{f}" for f in GRID_FILTERS if matches(f, topic)}
    assert grid_index.match(topic) == expected


@pytest.mark.parametrize("topic_filter", GRID_FILTERS)
def test_index_with_one_filter_agrees_with_matches_for_every_grid_topic(
    topic_filter: str,
) -> None:
    index = TopicIndex()
    index.add(topic_filter, "only")
    for topic in GRID_TOPICS:
        assert (index.match(topic) == {"only"}) is matches(topic_filter, topic), topic


def test_index_match_agrees_with_matches_on_random_topics_and_filters() -> None:
    rng = random.Random(20240601)
    alphabet = ["", "a", "b", "ab", "$x"]

    def random_levels(choices: list[str]) -> list[str]:
        levels = [rng.choice(choices) for _ in range(rng.randint(1, 5))]
        return levels if levels != [""] else ["", ""]  # never the empty string

    def random_filter() -> str:
        levels = random_levels([*alphabet, "+", "+"])
        if rng.random() < 0.3:
            levels[-1] = "#"
        return validate_filter(LEVEL_SEPARATOR.join(levels))

    filters: list[str] = []
    while len(filters) < 50:
        topic_filter = random_filter()
        if topic_filter not in filters:
            filters.append(topic_filter)
    topics = [validate_topic(LEVEL_SEPARATOR.join(random_levels(alphabet))) for _ in range(40)]
    assert any(topic.startswith("$") for topic in topics)
    assert any(topic_filter[0] in "+#" for topic_filter in filters)

    index = TopicIndex()
    for number, topic_filter in enumerate(filters):
        index.add(topic_filter, f"s{number}")
    positives = 0
    for topic in topics:
        expected = {f"s{n}" for n, f in enumerate(filters) if matches(f, topic)}
        assert index.match(topic) == expected, topic
        positives += len(expected)
    assert 100 < positives < len(filters) * len(topics) - 100  # both outcomes well exercised

    # Remove every other filter and check again.
    for number in range(0, len(filters), 2):
        assert index.remove(filters[number], f"s{number}") is True
    for topic in topics:
        expected = {f"s{n}" for n, f in enumerate(filters) if n % 2 == 1 and matches(f, topic)}
        assert index.match(topic) == expected, topic

    for number in range(1, len(filters), 2):
        assert index.remove(filters[number], f"s{number}") is True
    assert len(index) == 0
    assert index._root.is_empty()


# --------------------------------------------------------------------------
# TopicIndex bookkeeping


def test_index_collects_exact_and_wildcard_subscribers_together() -> None:
    index = TopicIndex()
    index.add("sport/tennis/player1", "exact")
    index.add("sport/tennis/+", "plus")
    index.add("sport/#", "hash")
    index.add("#", "all")
    index.add("sport/football", "other")
    assert index.match("sport/tennis/player1") == {"exact", "plus", "hash", "all"}
    assert index.match("sport") == {"hash", "all"}
    assert index.match("news") == {"all"}


def test_index_dollar_topics_skip_root_wildcards_only() -> None:
    index = TopicIndex()
    index.add("#", "all")
    index.add("+/monitor/Clients", "plus")
    index.add("$SYS/#", "sys")
    index.add("$SYS/monitor/+", "monitor")
    assert index.match("$SYS/monitor/Clients") == {"sys", "monitor"}
    assert index.match("x/monitor/Clients") == {"all", "plus"}


def test_index_len_counts_filter_and_subscriber_entries() -> None:
    index = TopicIndex()
    assert len(index) == 0
    index.add("a/b", "s1")
    index.add("a/b", "s2")
    index.add("a/+", "s1")
    index.add("a/#", "s1")
    assert len(index) == 4


def test_index_adding_the_same_entry_twice_counts_once() -> None:
    index = TopicIndex()
    index.add("a/+", "s1")
    index.add("a/+", "s1")
    index.add("a", "s1")
    index.add("a", "s1")
    assert len(index) == 2
    assert index.remove("a/+", "s1") is True
    assert index.match("a/x") == set()


def test_index_match_returns_a_new_set() -> None:
    index = TopicIndex()
    index.add("a", "s1")
    found = index.match("a")
    found.add("intruder")
    assert index.match("a") == {"s1"}


def test_index_remove_returns_whether_the_entry_was_there() -> None:
    index = TopicIndex()
    index.add("a/b", "s1")
    index.add("a/+", "s1")
    index.add("a/#", "s1")
    assert index.remove("a/b", "s2") is False
    assert index.remove("a/c", "s1") is False
    assert index.remove("a/+/c", "s1") is False
    assert index.remove("x/#", "s1") is False
    assert index.remove("a/+", "s2") is False
    assert index.remove("a/b", "s1") is True
    assert index.remove("a/b", "s1") is False
    assert index.remove("a/+", "s1") is True
    assert index.remove("a/#", "s1") is True
    assert len(index) == 0
    assert index.match("a/b") == set()


def test_index_remove_keeps_other_subscribers_of_the_same_filter() -> None:
    index = TopicIndex()
    index.add("a/+", "s1")
    index.add("a/+", "s2")
    index.add("a/b", "s1")
    index.add("a/b", "s2")
    assert index.remove("a/+", "s1") is True
    assert index.remove("a/b", "s1") is True
    assert index.match("a/b") == {"s2"}
    assert len(index) == 2


def test_index_remove_prunes_emptied_trie_nodes() -> None:
    index = TopicIndex()
    index.add("a/+/c/#", "s1")
    index.add("a/+/d", "s2")
    index.add("x/y", "s3")
    assert index.remove("a/+/c/#", "s1") is True
    root_children = index._root.children
    assert root_children is not None
    plus = root_children["a"].plus
    assert plus is not None
    assert plus.children is not None
    assert set(plus.children) == {"d"}
    assert index.remove("a/+/d", "s2") is True
    assert index.remove("x/y", "s3") is True
    assert index._root.is_empty()
    assert index._exact == {}


def test_index_remove_keeps_nodes_still_holding_subscribers() -> None:
    index = TopicIndex()
    index.add("a/#", "parent")
    index.add("a/+/b", "child")
    assert index.remove("a/+/b", "child") is True
    assert index.match("a") == {"parent"}
    assert index.match("a/x/b") == {"parent"}
    assert index.remove("a/#", "parent") is True
    assert index._root.is_empty()


def test_index_exact_filters_do_not_enter_the_trie() -> None:
    index = TopicIndex()
    for number in range(1000):
        index.add(f"device/{number}/status", f"s{number}")
    assert index._root.is_empty()
    assert index.match("device/7/status") == {"s7"}


def test_index_handles_many_subscriptions() -> None:
    index = TopicIndex()
    for number in range(20000):
        index.add(f"tenant{number}/+/status", f"w{number}")
        index.add(f"tenant{number}/device/status", f"e{number}")
    index.add("+/device/#", "fleet")
    assert len(index) == 40001
    assert index.match("tenant123/device/status") == {"w123", "e123", "fleet"}


# --------------------------------------------------------------------------
# LinkGraph


def test_link_closure_is_transitive_and_follows_direction() -> None:
    graph = LinkGraph()
    graph.add("Sport/Football/Chelsea", "News/London")
    graph.add("News/London", "News/England")
    assert graph.closure("Sport/Football/Chelsea") == [
        "Sport/Football/Chelsea",
        "News/London",
        "News/England",
    ]
    assert graph.closure("News/London") == ["News/London", "News/England"]
    assert "Sport/Football/Chelsea" not in graph.closure("News/London")
    assert graph.closure("News/England") == ["News/England"]


def test_link_closure_of_an_unlinked_topic_is_the_topic_alone() -> None:
    assert LinkGraph().closure("a/b") == ["a/b"]


def test_link_closure_is_breadth_first_with_each_topic_once() -> None:
    graph = LinkGraph()
    graph.add("/A", "/C")
    graph.add("/A", "/B")
    graph.add("/B", "/D")
    graph.add("/C", "/D")
    graph.add("/D", "/E")
    assert graph.closure("/A") == ["/A", "/B", "/C", "/D", "/E"]


def test_link_that_closes_a_cycle_raises_link_cycle_with_the_path() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/B", "/C")
    with pytest.raises(LinkCycle) as caught:
        graph.add("/C", "/A")
    assert caught.value.source == "/C"
    assert caught.value.target == "/A"
    assert caught.value.path == ["/A", "/B", "/C"]
    assert ("/C", "/A", False) not in graph.links()


def test_link_cycle_of_two_topics_reports_the_reverse_link() -> None:
    graph = LinkGraph()
    graph.add("/C", "/A")
    with pytest.raises(LinkCycle) as caught:
        graph.add("/A", "/C")
    assert caught.value.path == ["/C", "/A"]


def test_backward_link_is_allowed_and_closure_terminates() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/B", "/C")
    graph.add("/C", "/A", backward=True)
    assert graph.closure("/A") == ["/A", "/B", "/C"]
    assert graph.closure("/B") == ["/B", "/C", "/A"]
    assert graph.closure("/C") == ["/C", "/A", "/B"]
    assert graph.targets("/C") == {"/A": True}


def test_a_link_to_itself_is_accepted_listed_removable_and_delivers_once() -> None:
    # Given seed 000: linked topics "can be recursive ... simply by referring to themselves"
    graph = LinkGraph()
    graph.add("/A", "/B")
    # When /A and /B are linked to themselves (forward: no cycle check refuses it)
    graph.add("/A", "/A")
    graph.add("/B", "/B", backward=True)
    # Then each is listed, a publication reaches each topic once, and the self-link is removable
    assert graph.links() == [("/A", "/A", False), ("/A", "/B", False), ("/B", "/B", True)]
    assert graph.closure("/A") == ["/A", "/B"]
    assert graph.closure("/B") == ["/B"]
    graph.add("/B", "/A", backward=True)  # a cycle through a self-linked topic still ends
    assert graph.closure("/B") == ["/B", "/A"]
    graph.remove("/A", "/A")
    assert graph.targets("/A") == {"/B": False}
    with pytest.raises(LinkCycle):  # other cycles are still refused
        graph.add("/B", "/A")


@pytest.mark.parametrize(("source", "target"), [("a/#", "b"), ("a", "b/+"), ("", "b")])
def test_link_between_invalid_topics_raises_invalid_link(source: str, target: str) -> None:
    with pytest.raises(InvalidLink):
        LinkGraph().add(source, target)


def test_adding_an_existing_link_again_only_updates_the_backward_flag() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/A", "/B")
    assert graph.links() == [("/A", "/B", False)]
    graph.add("/A", "/B", backward=True)
    assert graph.links() == [("/A", "/B", True)]
    graph.add("/A", "/B")
    assert graph.links() == [("/A", "/B", False)]


def test_readding_a_forward_link_inside_a_backward_loop_is_a_no_op() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/B", "/A", backward=True)
    graph.add("/A", "/B")
    assert graph.links() == [("/A", "/B", False), ("/B", "/A", True)]


def test_turning_a_backward_link_that_closes_a_cycle_forward_raises_link_cycle() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/B", "/A", backward=True)
    with pytest.raises(LinkCycle):
        graph.add("/B", "/A")
    assert graph.targets("/B") == {"/A": True}


def test_remove_link_and_missing_link_raises_no_such_link() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.remove("/A", "/B")
    assert graph.links() == []
    assert graph.targets("/A") == {}
    with pytest.raises(NoSuchLink):
        graph.remove("/A", "/B")
    with pytest.raises(NoSuchLink):
        graph.remove("/X", "/Y")


def test_removing_a_link_allows_the_reverse_link() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.remove("/A", "/B")
    graph.add("/B", "/A")
    assert graph.links() == [("/B", "/A", False)]


def test_targets_returns_direct_targets_only_as_a_copy() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/A", "/C", backward=True)
    graph.add("/B", "/D")
    targets = graph.targets("/A")
    assert targets == {"/B": False, "/C": True}
    targets["/Z"] = False
    assert graph.targets("/A") == {"/B": False, "/C": True}


def test_links_are_sorted() -> None:
    graph = LinkGraph()
    graph.add("b", "c")
    graph.add("a", "z")
    graph.add("a", "b")
    assert graph.links() == [("a", "b", False), ("a", "z", False), ("b", "c", False)]


def test_find_path_returns_a_chain_of_links_or_none() -> None:
    graph = LinkGraph()
    graph.add("/A", "/B")
    graph.add("/B", "/C")
    graph.add("/A", "/D")
    assert graph.find_path("/A", "/C") == ["/A", "/B", "/C"]
    assert graph.find_path("/A", "/D") == ["/A", "/D"]
    assert graph.find_path("/C", "/A") is None
    assert graph.find_path("/A", "/A") == ["/A"]
    assert graph.find_path("/X", "/Y") is None


def test_find_path_returns_a_shortest_chain() -> None:
    graph = LinkGraph()
    for source, target in itertools.pairwise(["/A", "/B", "/C", "/D"]):
        graph.add(source, target)
    graph.add("/A", "/D")
    assert graph.find_path("/A", "/D") == ["/A", "/D"]


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x1b", "\x7f", "\x9f"])
def test_control_characters_are_refused_with_a_suggestion_without_them(char):
    # MQTT 5 §1.5.4: control characters SHOULD NOT appear; a receiver MAY treat them as malformed
    with pytest.raises(InvalidTopic, match=f"U\\+{ord(char):04X}") as caught:
        validate_topic(f"/a{char}b")
    assert caught.value.suggestion == "/ab"
    with pytest.raises(InvalidTopicFilter, match="control character"):
        validate_filter(f"/a{char}/#")


def test_an_over_long_topic_is_echoed_short_in_the_error_but_kept_whole_on_it():
    topic = "/" + "x" * 145_000
    with pytest.raises(InvalidTopic) as caught:
        validate_topic(topic)
    assert len(str(caught.value)) < 400 and "145001 bytes" in str(caught.value)
    assert caught.value.topic == topic


# --- MQTT 5 shared subscriptions (§4.8.2) ---------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("$share/grp/a/+", "a/b", True),
        ("$share/grp/a/+", "a/b/c", False),
        ("$share/g/#", "x/y", True),
        ("$share/g/#", "$SYS/x", False),  # the filter part follows the $-topic rule
        ("$share/g/$SYS/#", "$SYS/x", True),
    ],
)
def test_shared_filter_matches_on_its_filter_part(topic_filter, topic, expected):
    assert matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    ("topic_filter", "reason"),
    [
        ("$share//a", "ShareName of at least one character"),
        ("$share/g", "'/' and a topic filter"),
        ("$share/g/", "'/' and a topic filter"),
        ("$share/g+/a", "must not contain '+' or '#'"),
        ("$share/#/a", "must not contain '+' or '#'"),
        ("$share/g/a#", "'#' must occupy a whole level"),
        ("$share/g1/$share/t", "must not be a $share filter"),  # EMQX refuses it
        ("$share/g1/$share/g2/t", "must not be a $share filter"),
    ],
)
def test_invalid_shared_subscription_syntax_is_refused(topic_filter, reason):
    with pytest.raises(InvalidTopicFilter) as caught:
        matches(topic_filter, "a")
    assert reason in str(caught.value)
    with pytest.raises(InvalidTopicFilter):
        validate_filter(topic_filter)


def test_split_shared_returns_share_name_and_filter():
    assert split_shared("$share/grp/a/+") == ("grp", "a/+")
    assert split_shared("a/+") == ("", "a/+")
    assert split_shared("$sharex/a") == ("", "$sharex/a")


def test_one_copy_keeps_the_earliest_made_and_groups_up_to_the_first_without_a_selector() -> None:
    made = {"c$z": 1, "c$sel": 2, "c$plain": 3, "c$late": 4, "d$x": 5, "d$y": 6, "e$only": 7}
    records = {s: SubscriptionRecord(s, "/t", True, ms) for s, ms in made.items()}
    # c and d are set; c's earliest-made two have selectors, d's none; e has one subscription
    kept, groups = one_copy(set(made), frozenset({"c", "d", "e"}), records, {"c$z", "c$sel"})
    assert kept == {"c$z", "c$sel", "c$plain", "d$x", "e$only"}
    assert groups == (("c$z", "c$sel", "c$plain"),)
    # clients not set keep every subscription
    assert one_copy(set(made), frozenset(), records, set()) == (set(made), ())
