"""Bounds on a selector's size and work (issue 24 bug 5), without a server.

A selector is evaluated for every publication its subscription's filter matches: a 768 KB one
(60,000 ORed comparisons) added 23 ms to each. ``max_selector_bytes`` bounds its size, and
``broker.core.selectors`` bounds its terms, tokens and nesting, so that a small but pathological one
is refused too; each refusal is a ``SelectorTooComplex`` naming the limit and what the
selector has, never a RecursionError.
"""

from __future__ import annotations

import json
import sys

import pytest

from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import ConfigError, CorruptRecord, InvalidSelector, SelectorTooComplex
from broker.core.selectors import MAX_PARENS, MAX_TERMS, MAX_TOKENS, check_size, compile_selector
from broker.topics.subscriptions import SubscriptionRecord, parse_subscriptions, subscribe

QM = "QMU"
#: The selector of the issue: 60,000 ORed comparisons, 768 KB.
HUGE = " OR ".join(f"a = {i}" for i in range(60_000))


def _refusal(selector: str) -> SelectorTooComplex:
    with pytest.raises(SelectorTooComplex) as info:
        compile_selector(selector)
    return info.value


def test_max_selector_bytes_defaults_to_ibm_mqs_selection_string_length_and_is_bounded():
    assert Settings().max_selector_bytes == 10_240
    with pytest.raises((ConfigError, ValueError)):
        Settings(max_selector_bytes=0)


def test_a_selector_over_max_selector_bytes_is_refused_naming_the_limit_and_its_size():
    check_size("a = 'é'", 8)  # 8 bytes of UTF-8: at the limit is fine
    with pytest.raises(SelectorTooComplex) as info:
        check_size("a = 'é'", 7)
    error = info.value
    assert (error.limit, error.maximum, error.found) == ("max_selector_bytes", 7, 8)
    assert "it is 8 bytes long, more than the broker allows (max_selector_bytes 7)" in str(error)
    assert isinstance(error, InvalidSelector) and error.exit_code == 2


def test_the_issues_768_kb_selector_is_refused_by_its_tokens_before_it_is_parsed():
    error = _refusal(HUGE)
    assert (error.limit, error.maximum) == ("MAX_TOKENS", MAX_TOKENS)
    assert f"more than the broker allows (MAX_TOKENS {MAX_TOKENS})" in str(error)
    assert "(768886 bytes)" in str(error)  # the selector is shown cut, with its size


def test_a_selector_of_more_than_max_terms_terms_is_refused_though_it_is_small():
    at_limit = " OR ".join(f"a = {i}" for i in range(333))  # 333 x (a, literal, =) and the OR
    assert compile_selector(at_limit).matches({"a": 332})
    error = _refusal(at_limit + " OR a = 333")
    assert (error.limit, error.maximum, error.found) == ("MAX_TERMS", MAX_TERMS, MAX_TERMS + 1)
    assert len(error.selector.encode()) < 5_000  # under max_selector_bytes: the terms refuse it
    assert f"it has more than {MAX_TERMS} terms" in str(error)


def test_a_huge_in_list_is_refused_by_its_strings():
    choices = ",".join(f"'{i}'" for i in range(MAX_TERMS - 2))
    assert compile_selector(f"region IN ({choices})").matches({"region": "7"})
    error = _refusal(f"region IN ({choices},'x')")
    assert error.limit == "MAX_TERMS"


def test_a_like_pattern_with_many_wildcards_is_refused_by_its_wildcards():
    assert compile_selector("name LIKE '" + "%a" * (MAX_TERMS - 3) + "%'").matches({"name": "a" * 997})
    error = _refusal("name LIKE '" + "%a" * MAX_TERMS + "'")
    assert error.limit == "MAX_TERMS"


@pytest.mark.parametrize(
    ("selector", "limit", "found"),
    [
        ("(" * 60 + "a = 1" + ")" * 60, "MAX_PARENS", MAX_PARENS + 1),
        ("(" * 100_000 + "a = 1" + ")" * 100_000, "MAX_TOKENS", MAX_TOKENS + 1),
        ("NOT " * 300 + "a = 1", "MAX_DEPTH", 201),
        ("- " * 300 + "a = 1", "MAX_DEPTH", 201),
        ("a" + " + a" * 300 + " = 1", "MAX_DEPTH", 201),
    ],
    ids=["parentheses", "100,000 parentheses", "not", "signs", "sums"],
)
def test_deep_nesting_is_refused_with_its_depth_never_a_recursion_error(selector, limit, found):
    error = _refusal(selector)
    assert (error.limit, error.found) == (limit, found)
    assert f"more than the broker allows ({limit} " in str(error)


def test_a_recursion_error_while_parsing_becomes_the_clear_refusal():
    # Given a caller already deep in its stack: 40 levels of parentheses are within MAX_PARENS
    selector = "(" * 40 + "b = 2" + ")" * 40
    compile_selector.cache_clear()
    limit = sys.getrecursionlimit()
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    sys.setrecursionlimit(depth + 120)
    try:
        with pytest.raises(SelectorTooComplex) as info:
            compile_selector(selector)
    finally:
        sys.setrecursionlimit(limit)
    assert info.value.limit == "MAX_PARENS"
    assert "more than this process's stack allows" in str(info.value)
    assert compile_selector(selector).matches({"b": 2})  # with the usual stack it parses


def _record(selector: str) -> bytes:
    return json.dumps({"filter": "t/#", "selector": selector}).encode()


def test_a_stored_record_over_the_limits_is_skipped_and_named_when_subscriptions_are_parsed():
    raw = {
        b"app$huge": _record(HUGE),
        b"app$long": _record("a = '" + "x" * 11_000 + "'"),  # 3 terms, over 10,240 bytes
        b"app$ok": _record("a = 1"),
    }
    records, problems = parse_subscriptions(QM, raw, max_selector_bytes=10_240)
    assert [r.sub_id for r in records] == ["app$ok"]
    named = {p.field: str(p) for p in problems}
    assert set(named) == {"app$huge", "app$long"}
    assert "(max_selector_bytes 10240)" in named["app$huge"] and keys.subscriptions(QM) in named["app$huge"]
    assert "(max_selector_bytes 10240)" in named["app$long"]
    # without the byte limit (a reader that lists records) only the fixed bounds apply
    records, problems = parse_subscriptions(QM, raw)
    assert [r.sub_id for r in records] == ["app$long", "app$ok"]
    with pytest.raises(CorruptRecord):
        SubscriptionRecord.from_json("app$huge", raw[b"app$huge"], QM)


def test_subscribe_refuses_an_oversized_selector_and_writes_nothing(fake_redis):
    with pytest.raises(SelectorTooComplex, match=r"max_selector_bytes 100\)"):
        subscribe(
            fake_redis, QM, "t/#", "app", "d", selector="a = '" + "x" * 100 + "'", max_selector_bytes=100
        )
    with pytest.raises(SelectorTooComplex, match="MAX_TOKENS"):
        subscribe(fake_redis, QM, "t/#", "app", "d", selector=HUGE, max_selector_bytes=10**6, scheme="mqtt")
    assert fake_redis.hlen(keys.subscriptions(QM)) == 0
