"""The spine end to end on a real server: publish -> worker -> subscriber queue."""

from __future__ import annotations

from broker import Publisher, link, subscribe
from broker.core import keys
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"


def test_publication_reaches_exact_wildcard_and_linked_subscribers_once(real_redis, settings):
    # Given subscriptions through an exact filter, a wildcard and a chain of links
    exact = subscribe(real_redis, QM, "/WEATHER/JFK", "app", "exact")
    wild = subscribe(real_redis, QM, "/ALERTS/#", "ops", "alerts")
    link(real_redis, QM, "/WEATHER/JFK", "/AIRPORT/JFK")
    link(real_redis, QM, "/AIRPORT/JFK", "/ALERTS/NYC")
    link(real_redis, QM, "/WEATHER/JFK", "/ALERTS/JFK")
    workers = make_workers(real_redis, settings, 1)
    # When one publication is made on the source topic
    Publisher(real_redis, QM, "station-jfk").publish("/WEATHER/JFK", b"\x00rain\xff")
    drain(workers)
    # Then each subscription has exactly one copy, body intact
    for record in (exact, wild):
        got = queue_messages(real_redis, QM, record.sub_id)
        assert [m.body for m in got] == [b"\x00rain\xff"]
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0
