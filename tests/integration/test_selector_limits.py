"""A selector's size and work are bounded (issue 24 bug 5), on the real server.

A 768 KB selector (60,000 ORed comparisons) was accepted, and each such subscription added
about 23 ms to every matching publication. Now ``broker subscribe --selector`` and
``subscribe()`` refuse it with an error naming the limit and what the selector has, writing
nothing; and a record already stored with such a selector (written before the limit, or by
hand) is skipped by the workers' routing table and named by ``broker status``.
"""

from __future__ import annotations

import json

import pytest

from broker.core import keys
from broker.core.errors import SelectorTooComplex
from broker.core.models import publication_fields
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.subscriptions import subscribe
from tests.conftest import QM

#: The issue's selector: 60,000 ORed comparisons, 768 KB.
HUGE = " OR ".join(f"a = {i}" for i in range(60_000))
#: Few terms, but longer than max_selector_bytes (10,240 by default).
LONG = "a = '" + "x" * 11_000 + "'"


def test_the_cli_refuses_an_oversized_selector_with_exit_2_naming_the_limit(run, real_redis):
    # When a user subscribes with the selector, then with a long one
    huge = run(
        "subscribe", "t/#", "--client-id", "app", "--durable", "d", "--selector", HUGE, "--timeout-ms", "1"
    )
    long = run(
        "subscribe", "t/#", "--client-id", "app", "--durable", "d", "--selector", LONG, "--timeout-ms", "1"
    )
    # Then both are refused with exit code 2, the message saying the limit and what the selector has
    assert huge.exit_code == 2, huge.output[-300:]
    assert "it is 768886 bytes long, more than the broker allows (max_selector_bytes 10240)" in huge.output
    assert long.exit_code == 2, long.output[-300:]
    assert "it is 11006 bytes long, more than the broker allows (max_selector_bytes 10240)" in long.output
    assert real_redis.hlen(keys.subscriptions(QM)) == 0  # nothing written


def test_subscribe_refuses_an_oversized_or_too_complex_selector_and_writes_nothing(real_redis):
    with pytest.raises(SelectorTooComplex) as info:
        subscribe(real_redis, QM, "t/#", "app", "d", selector=HUGE)
    assert (info.value.limit, info.value.maximum, info.value.found) == ("max_selector_bytes", 10_240, 768_886)
    # a small selector of too many terms: within the bytes, refused by its work
    small = " OR ".join(f"a = {i}" for i in range(400))
    with pytest.raises(SelectorTooComplex, match=r"more than the broker allows \(MAX_TERMS 1000\)"):
        subscribe(real_redis, QM, "t/#", "app", "d", selector=small)
    assert real_redis.hlen(keys.subscriptions(QM)) == 0


def test_a_stored_record_over_the_limits_is_skipped_by_the_workers_and_named_by_status(
    run, real_redis, settings
):
    # Given a good subscription, and two records written by hand (or before the limit)
    good = subscribe(real_redis, QM, "t/#", "app", "ok", selector="a >= 0")
    for name, selector in (("huge", HUGE), ("long", LONG)):
        real_redis.hset(
            keys.subscriptions(QM), f"app${name}", json.dumps({"filter": "t/#", "selector": selector})
        )
    real_redis.incr(keys.version(QM))
    # When a publication the three would match is handled
    real_redis.xadd(keys.publish_stream(QM), publication_fields("p", "t/1", b"x", properties={"a": 1}))
    workers = make_workers(real_redis, settings, 1)
    drain(workers)
    # Then the good subscription got it, and the routing table skipped both records, naming them
    assert [m.body for m in queue_messages(real_redis, QM, good.sub_id)] == [b"x"]
    table = workers[0].table
    assert set(table.subscriptions) == {good.sub_id} and set(table.selectors) == {good.sub_id}
    skipped = {p.field: p.reason for p in table.problems}
    assert set(skipped) == {"app$huge", "app$long"}
    assert all("more than the broker allows (max_selector_bytes 10240)" in r for r in skipped.values())
    assert not real_redis.exists(keys.sub_queue(QM, "app$huge"), keys.sub_queue(QM, "app$long"))
    # And status names both (as the workers count them) ...
    problems = status(real_redis, QM, settings.max_selector_bytes).problems
    assert any("app$huge" in p and "max_selector_bytes" in p for p in problems)
    assert any("app$long" in p and "max_selector_bytes" in p for p in problems)
    # ... the huge one whatever the byte limit (its tokens), and so does the CLI
    problems = status(real_redis, QM).problems
    assert any("app$huge" in p and "MAX_TOKENS" in p for p in problems)
    shown = run("status")
    assert shown.exit_code == 0, shown.output[-300:]
    assert "app$huge" in shown.output and "app$long" in shown.output
