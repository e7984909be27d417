"""The benchmark's selector workload (``scripts.bench.workload``): which subscriptions carry the
selector, and that the publications' properties make it select about half of them."""

from __future__ import annotations

from broker.core.selectors import compile_selector
from scripts.bench.selectors import selector_sample
from scripts.bench.workload import (
    HUGE_DEPTH,
    SELECTOR,
    TOPIC_OBJECTS,
    TOPICS,
    plan_selectors,
    subscription_plan,
    topic_object_coverage,
    topic_object_plan,
)


def test_every_fifth_subscription_of_the_plan_carries_the_selector() -> None:
    plan = subscription_plan()
    chosen = plan_selectors(len(plan), SELECTOR)
    assert len(plan) == 1450
    assert sum(s is not None for s in chosen) == 290
    assert [i for i, s in enumerate(chosen) if s][:3] == [4, 9, 14]
    assert set(chosen) == {None, SELECTOR}
    assert plan_selectors(len(plan), None) == [None] * len(plan)


def test_the_selector_selects_about_half_of_the_publications() -> None:
    sample = selector_sample(2000)
    selector = compile_selector(SELECTOR)
    share = sum(selector.matches(p) for p in sample) / len(sample)
    assert 0.4 < share < 0.6
    assert {"region", "amount", "JMSPriority", "JMSMessageID"} <= set(sample[0])


def test_the_topic_objects_cover_most_topics_and_change_nothing() -> None:
    from broker.core.topic_rules import validate_topic
    from broker.topics.topic_objects import BASE_DEFAULTS, TopicTree, check_name

    objects = topic_object_plan()
    assert len(objects) == TOPIC_OBJECTS == 200
    assert len({o.name for o in objects}) == len({o.topic_string for o in objects}) == 200
    for obj in objects:
        check_name(obj.name)
        validate_topic(obj.topic_string)
    assert topic_object_coverage(objects) == 0.9
    assert any(o.attributes.maxdepth == HUGE_DEPTH for o in objects)
    tree = TopicTree.parse("BENCH", {o.name: o.to_json() for o in objects})
    assert not tree.problems and not tree.trivial
    for topic in TOPICS + [f"audit/{r}/{c}" for r in range(10) for c in range(10)]:
        eff = tree.effective(topic)
        for name in ("pub", "defprty", "defpsist", "usedlq", "capexpry", "pmsgdlv", "npmsgdlv", "wildcard"):
            assert eff[name] == getattr(BASE_DEFAULTS, name), (topic, name)
        assert eff["maxdepth"] in ("NOLIMIT", HUGE_DEPTH)
        assert eff.blocks == 0


def test_the_baseline_pool_gets_the_changed_settings_as_broker_variables():
    from broker.core.config import Settings
    from scripts.bench.baseline import settings_env

    # Given settings with a URL, a queue manager, a flag and a list changed from their defaults
    settings = Settings(redis_url="redis://127.0.0.1:1/0", qm="B1", flowcontrol_enabled=False, concurrency=7)
    # When they are turned into the earlier commit's environment
    env = settings_env(settings, 2)
    # Then only the changed ones travel, as pydantic-settings reads them, with the pool's concurrency
    assert env == {
        "BROKER_CONCURRENCY": "2",
        "BROKER_REDIS_URL": "redis://127.0.0.1:1/0",
        "BROKER_QM": "B1",
        "BROKER_FLOWCONTROL_ENABLED": "false",
    }
    assert (
        Settings(**{k.removeprefix("BROKER_").lower(): v for k, v in env.items()}).flowcontrol_enabled
        is False
    )


def test_a_ratio_of_two_rows_is_the_median_of_the_ratios_within_each_repeat():
    from scripts.bench.base import paired as _paired

    # Given three repeats in which the box ran at half speed once (both rows of that repeat slowed)
    runs = {
        "broker_2w": [{"pubs_per_s": 20_000}, {"pubs_per_s": 10_000}, {"pubs_per_s": 21_000}],
        "ceiling": [{"tx_per_s": 25_000}, {"tx_per_s": 11_000}, {"tx_per_s": 30_000}],
    }
    # When the ratio is taken
    ratio = _paired({"runs": runs}, "broker_2w", "ceiling", "tx_per_s", fallback=-1.0)
    # Then it pairs the rows of each repeat (0.8, 0.909, 0.7): not 20,000 / 25,000 of the medians
    assert ratio == 0.8
    # And with a repeat missing on one side it falls back to the ratio of the medians
    runs["ceiling"].pop()
    assert _paired({"runs": runs}, "broker_2w", "ceiling", "tx_per_s", fallback=-1.0) == -1.0


def test_the_instruction_count_is_the_dumps_totals_not_its_summary(tmp_path):
    from scripts.bench.instructions import total_instructions

    # Given a callgrind dump made with the instrumentation switched on at run time (its summary says 0)
    dump = tmp_path / "callgrind.out.1"
    dump.write_text("version: 1\nevents: Ir\nsummary: 0\n\nfn=(1) main\n12 34\n\ntotals: 666772147\n")
    # When its instructions are read
    # Then they are the totals
    assert total_instructions(dump) == 666_772_147
