"""Issue 8, item 4: one corrupt record never stops the workers; status survives any foreign key.

Records written by hand (``HSET '{QM1}:links' /BADL 'not json'`` + ``INCR
'{QM1}:version'``) used to crash-loop every worker; a wrong-type key where a
subscriber queue belongs made ``broker status`` fail with WRONGTYPE.
"""

from __future__ import annotations

import pytest

from broker import Publisher, link, subscribe
from broker.core import keys
from broker.core.errors import CorruptRecord, ForeignKey
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.explain import explain
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import read_subscriptions, unsubscribe

QM = "TEST"


def _plant(client, key: str, field: str, value: str) -> None:
    client.hset(key, field, value)
    client.incr(keys.version(QM))


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("links", "/BADL", "not json"),
        ("links", "/BADL", '["a list"]'),
        ("links", "/BADL", '{"/x": "yes"}'),
        ("links", "/BAD/#", '{"/x": false}'),
        ("subs", "app$broken", "not json"),
        ("subs", "app$broken", '{"filter": 5}'),
        ("subs", "app$broken", '{"filter": "/a/#/b"}'),
        ("subs", "bad:id$x", '{"filter": "/T/#", "durable": true}'),
    ],
    ids=[
        "link-not-json",
        "link-not-object",
        "link-bad-flag",
        "link-bad-source",
        "sub-not-json",
        "sub-filter-not-string",
        "sub-invalid-filter",
        "sub-id-with-colon",
    ],
)
def test_a_corrupt_record_is_skipped_and_the_workers_go_on(real_redis, settings, where, field, value):
    # Given a good subscription, workers, and a record planted by hand with a version bump
    subscribe(real_redis, QM, "/T/#", "app", "good")
    workers = make_workers(real_redis, settings, 2)
    key = keys.links(QM) if where == "links" else keys.subscriptions(QM)
    _plant(real_redis, key, field, value)
    # When publications follow
    publisher = Publisher(real_redis, QM, "p")
    for i in range(5):
        publisher.publish("/T/1", str(i).encode())
    drain(workers)
    # Then they are delivered, in order, and the workers name the record they skipped
    assert [m.body for m in queue_messages(real_redis, QM, "app$good")] == [b"0", b"1", b"2", b"3", b"4"]
    problems = workers[0].table.problems
    assert [(p.key, p.field) for p in problems] == [(key, field)]


def test_a_forward_cycle_written_by_hand_is_cut_and_reported(real_redis, settings):
    # Given /a -> /b made properly, and /b -> /a (forward) written by hand
    subscribe(real_redis, QM, "/a", "app", "a")
    link(real_redis, QM, "/a", "/b")
    _plant(real_redis, keys.links(QM), "/b", '{"/a": false}')
    # When a worker loads its table and a publication on /a is resolved
    table = RoutingTable(QM)
    table.load(real_redis)
    # Then the cycle-closing link is skipped and named, the good one kept
    assert table.links.links() == [("/a", "/b", False)]
    assert [p.field for p in table.problems] == ["/b"] and "cycle" in table.problems[0].reason


def test_a_foreign_subscription_hash_stops_the_round_with_its_name_and_loses_nothing(real_redis, settings):
    # Given a pending publication and a string where the subscription hash belongs
    subscribe(real_redis, QM, "/T/#", "app", "good")
    (worker,) = make_workers(real_redis, settings, 1)
    Publisher(real_redis, QM, "p").publish("/T/1", b"x")
    real_redis.delete(keys.subscriptions(QM))
    real_redis.set(keys.subscriptions(QM), "oops")
    real_redis.incr(keys.version(QM))
    # When the worker runs a round, it stops with the key named
    with pytest.raises(ForeignKey, match=f"{keys.subscriptions(QM)} holds a string, not a hash"):
        worker.run_once()
    # And once the operator restores the subscription, the publication is delivered
    real_redis.delete(keys.subscriptions(QM))
    subscribe(real_redis, QM, "/T/#", "app", "good")
    drain([worker])
    assert len(queue_messages(real_redis, QM, "app$good")) == 1


def test_status_survives_foreign_keys_and_corrupt_records_and_names_them(real_redis, settings):
    # Given a string where a queue belongs, corrupt records, a corrupt heartbeat and a foreign dead-letter stream
    subscribe(real_redis, QM, "/T/#", "good", "g")
    subscribe(real_redis, QM, "/T/#", "bad", "b")
    real_redis.set(keys.sub_queue(QM, "bad$b"), "x")
    _plant(real_redis, keys.links(QM), "/BADL", "not json")
    _plant(real_redis, keys.subscriptions(QM), "app$broken", "{")
    real_redis.hset(keys.workers(QM), "w9", "not json")
    real_redis.hset(keys.dead_letter(QM), "a", "b")
    # When an operator asks for the status
    snapshot = status(real_redis, QM)
    # Then it is given, with each problem named
    subs = {s.id: s for s in snapshot.subscriptions}
    assert subs["good$g"].depth == 0 and subs["bad$b"].depth is None
    text = "\n".join(snapshot.problems)
    for name in (keys.sub_queue(QM, "bad$b"), "/BADL", "app$broken", "w9", keys.dead_letter(QM)):
        assert name in text, name


def test_cli_names_bad_records_in_links_topics_subscriptions_and_status(run, real_redis):
    # Given a good link and subscription, and one corrupt record of each
    link(real_redis, QM, "/a", "/b")
    subscribe(real_redis, QM, "/T/#", "app", "good")
    _plant(real_redis, keys.links(QM), "/BADL", "not json")
    _plant(real_redis, keys.subscriptions(QM), "app$broken", "not json")
    real_redis.set(keys.sub_queue(QM, "app$good"), "x")
    # Then every listing still works and names them
    links_out = run("links")
    assert links_out.exit_code == 0 and "/a" in links_out.stdout and "/BADL" in links_out.stdout
    topics_out = run("topics")
    assert topics_out.exit_code == 0 and "app$broken" in topics_out.stdout and "/BADL" in topics_out.stdout
    route_out = run("topics", "/a")
    assert route_out.exit_code == 0 and "/BADL" in route_out.stdout
    subs_out = run("subscriptions")
    assert subs_out.exit_code == 0 and "app$good" in subs_out.stdout and "app$broken" in subs_out.stdout
    status_out = run("status")
    assert status_out.exit_code == 0, status_out.output
    assert "app$broken" in status_out.stdout and keys.sub_queue(QM, "app$good") in status_out.stdout
    # And the operator can remove them from the CLI
    assert run("unlink", "/BADL", "--all").exit_code == 0
    assert run("unsubscribe", "app$broken").exit_code == 0
    assert "problem" not in run("links").stdout and "problem" not in run("subscriptions").stdout


def test_subscribe_over_a_corrupt_durable_record_names_it_and_unsubscribe_removes_it(real_redis):
    _plant(real_redis, keys.subscriptions(QM), "app$d", "not json")
    with pytest.raises(CorruptRecord, match="unsubscribe it first"):
        subscribe(real_redis, QM, "/T/#", "app", "d")
    unsubscribe(real_redis, QM, "app$d")
    assert subscribe(real_redis, QM, "/T/#", "app", "d").topic_filter == "/T/#"
    assert read_subscriptions(real_redis, QM)[1] == []


def test_explain_names_the_records_it_skipped(real_redis):
    link(real_redis, QM, "/a", "/b")
    _plant(real_redis, keys.links(QM), "/a/bad", "not json")
    route = explain(real_redis, QM, "/a")
    assert route.via == {"/a": [], "/b": []}
    assert [p.field for p in route.problems] == ["/a/bad"]
