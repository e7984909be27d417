"""The RabbitMQ peer's topology (``scripts.bench.rabbit``): filters as AMQP binding keys, links as
exchange-to-exchange bindings, and the depths a run must find: no RabbitMQ needed."""

from __future__ import annotations

from collections import Counter

import pytest

from scripts.bench import rabbit as br
from scripts.bench.preload import publisher_ids
from scripts.bench.workload import FANOUT, TOPICS


@pytest.mark.parametrize(
    ("mqtt", "amqp"),
    [
        ("bench/1/2/3", "bench.1.2.3"),
        ("bench/+/2/+", "bench.*.2.*"),
        ("bench/1/#", "bench.1.#"),
        ("+/1/#", "*.1.#"),
        ("#", "#"),
        ("a//b", "a..b"),
    ],
)
def test_a_filter_becomes_the_equivalent_amqp_pattern(mqtt: str, amqp: str) -> None:
    assert br.amqp_key(mqtt) == amqp


@pytest.mark.parametrize("bad", ["a.b/c", "a/*/c", "a/b#", "a/x+/c"])
def test_a_level_without_an_amqp_equivalent_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="no AMQP equivalent"):
        br.amqp_key(bad)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("bench.*.2.*", "bench.1.2.3", True),
        ("bench.*.2.*", "bench.1.3.3", False),
        ("bench.1.#", "bench.1", True),  # '#' is zero or more words, as MQTT's '#' matches the parent
        ("bench.1.#", "bench.1.2.3", True),
        ("*.1.#", "audit.1", True),
        ("*.1.#", "bench.2.1", False),
        ("bench.*", "bench", False),
        ("#", "anything.at.all", True),
    ],
)
def test_amqp_topic_matching(pattern: str, key: str, matches: bool) -> None:
    assert br.amqp_match(pattern, key) is matches


def test_the_benchmark_topology_maps_to_a_topic_exchange_and_link_exchanges() -> None:
    topo = br.map_topology()
    assert len(topo.queues) == len(set(topo.queues)) == 1450
    # one fanout exchange per link target: audit/r/c (100) and audit/r (10)
    assert len(topo.link_exchanges) == 110
    assert "link:audit.3.4" in topo.link_exchanges and "link:audit.3" in topo.link_exchanges
    # every queue on the topic exchange; link targets' subscribers (exact + '+/r/#') on their fanout exchange
    on_topic = [b for b in topo.queue_bindings if b[1] == topo.exchange]
    assert len(on_topic) == 1450
    assert ("dedup$r3", topo.exchange, "*.3.#") in on_topic
    assert sorted(q for q, x, _ in topo.queue_bindings if x == "link:audit.3.4") == ["dedup$r3", "link1$r3c4"]
    assert sorted(q for q, x, _ in topo.queue_bindings if x == "link:audit.3") == ["dedup$r3", "link2$r3"]
    assert len(topo.queue_bindings) == 1450 + 200 + 20
    # each link: from the topic exchange with the source's key; from the source's exchange when it is a target
    assert ("link:audit.3.4", topo.exchange, "bench.3.4.5") in topo.exchange_bindings
    assert ("link:audit.3", topo.exchange, "audit.3.4") in topo.exchange_bindings
    assert ("link:audit.3", "link:audit.3.4", "") in topo.exchange_bindings
    assert len(topo.exchange_bindings) == 1000 + 100 + 100


def test_amqp_routing_reaches_what_the_broker_would_on_every_topic() -> None:
    topo = br.map_topology()
    for topic in TOPICS:
        expected = {q for q, n in br.expected_depths(Counter({topic: 1})).items() if n}
        assert br.route(topo, br.amqp_key(topic)) == expected, topic
        assert len(expected) == FANOUT
    # '+/r/#' is reached three ways (the topic, audit/r/c, audit/r) and holds the publication once
    assert "dedup$r1" in br.route(topo, "bench.1.2.3")


def test_a_chain_of_links_and_a_cycle_route_like_the_broker() -> None:
    plan = [("a/x", "s", "ax"), ("b/#", "s", "b"), ("c", "s", "c"), ("+/x", "s", "plusx"), ("#", "s", "all")]
    links = [("a/x", "b/y"), ("b/y", "c"), ("c", "b/y")]  # c -> b/y closes a loop: exchanges visited once
    topo = br.map_topology(plan, links)
    assert br.route(topo, "a.x") == {"s$ax", "s$b", "s$c", "s$plusx", "s$all"}
    assert br.route(topo, "c") == {"s$c", "s$b", "s$all"}
    for topic in ("a/x", "b/y", "c", "d"):
        depths = br.expected_depths(Counter({topic: 2}), plan, links)
        assert br.route(topo, br.amqp_key(topic)) == {q for q, n in depths.items() if n}, topic
        assert set(depths.values()) <= {0, 2}


def test_the_schedule_and_the_expected_depths_add_up_to_n_times_f() -> None:
    work = br.schedule(1000)
    assert list(work) == publisher_ids() and sum(len(t) for t in work.values()) == 1000
    assert {len(t) for t in work.values()} == {20}
    assert br.schedule(1000) == work  # the same publications every time
    depths = br.expected_depths(Counter(t for topics in work.values() for t in topics))
    assert len(depths) == 1450
    assert sum(depths.values()) == 1000 * FANOUT
    assert sum(depths[f"link2$r{r}"] for r in range(10)) == 1000  # every publication reaches audit/r


def test_the_definitions_document_declares_the_mapped_topology() -> None:
    topo = br.map_topology()
    doc = br.definitions(topo)
    assert {q["name"] for q in doc["queues"]} == set(topo.queues)
    assert all(q["durable"] for q in doc["queues"])
    assert {(x["name"], x["type"]) for x in doc["exchanges"]} == {("bench", "topic")} | {
        (x, "fanout") for x in topo.link_exchanges
    }
    bindings = {
        (b["destination"], b["source"], b["routing_key"], b["destination_type"]) for b in doc["bindings"]
    }
    assert len(bindings) == len(doc["bindings"]) == 1670 + 1200
    assert ("link:audit.3", "link:audit.3.4", "", "exchange") in bindings
    assert [u["name"] for u in doc["users"]] == ["guest"]
