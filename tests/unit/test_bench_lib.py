"""The benchmark's selector workload (``tests.harness.bench_lib``): which subscriptions carry the
selector, and that the publications' properties make it select about half of them."""

from __future__ import annotations

from broker.selectors import compile_selector
from tests.harness import bench_lib as lib


def test_every_fifth_subscription_of_the_plan_carries_the_selector() -> None:
    plan = lib.subscription_plan()
    chosen = lib.plan_selectors(len(plan), lib.SELECTOR)
    assert len(plan) == 1450
    assert sum(s is not None for s in chosen) == 290
    assert [i for i, s in enumerate(chosen) if s][:3] == [4, 9, 14]
    assert set(chosen) == {None, lib.SELECTOR}
    assert lib.plan_selectors(len(plan), None) == [None] * len(plan)


def test_the_selector_selects_about_half_of_the_publications() -> None:
    sample = lib.selector_sample(2000)
    selector = compile_selector(lib.SELECTOR)
    share = sum(selector.matches(p) for p in sample) / len(sample)
    assert 0.4 < share < 0.6
    assert {"region", "amount", "JMSPriority", "JMSMessageID"} <= set(sample[0])
