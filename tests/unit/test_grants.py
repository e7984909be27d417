"""Per-topic authorization without a server: the grant rules (``broker.topics.grants``) and the
workers' decision on a publication outside its principal's publish grants (``worker.decide``).
The routing table is loaded once from fakeredis, then the store is emptied: every decision is
made from what the worker holds, as on the hot path."""

from __future__ import annotations

import json

import fakeredis
import pytest

from broker.core import keys
from broker.core.config import Settings
from broker.core.unit_of_work import Action
from broker.topics.grants import GrantRecord, covers, parse_grants
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import subscribe
from broker.topics.topic_objects import TopicTree, define
from worker.decide import Decider

QM = "TEST"
NOW_MS = 1_700_000_000_000


@pytest.mark.parametrize(
    ("grant", "requested", "covered"),
    [
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/#", "a/+/c", True),
        ("a/#", "a/#", True),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/+", "a/b/c", False),
        ("a/b", "a/+", False),
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("#", "x/y", True),
        ("#", "$SYS/x", False),
        ("+/b", "a/b", True),
        ("a/b/#", "a/#", False),
    ],
)
def test_an_mqtt_subscribe_grant_covers_exactly_the_filters_within_it(grant, requested, covered):
    assert covers(grant, requested, "mqtt") is covered


@pytest.mark.parametrize(
    ("grant", "requested", "covered"),
    [
        ("iit.sales", "iit.sales", True),
        ("iit.sales", "iit.sales.US", True),
        ("iit.sales", "iit", False),
        ("iit.%", "iit.sales.US", True),
        ("iit.s%", "iit.sales", True),
        ("iit.s%", "iit.hr", False),
        ("iit.s%", "iit.%", False),
        ("iit.%", "iit.%", True),
        ("iit.sales", "iit.s%", False),
    ],
)
def test_a_swiftmq_subscribe_grant_covers_its_subtree_node_by_node(grant, requested, covered):
    assert covers(grant, requested, "swiftmq") is covered


def test_no_grant_at_all_compiles_to_nothing_to_check_and_a_bad_record_is_a_problem():
    tree = TopicTree.parse(QM, {})
    assert parse_grants(QM, {}, tree, "mqtt") == (None, [])
    grants, problems = parse_grants(
        QM, {b"u1": b"not json", b"u2": b'{"publish":["a/#/b"]}', b"u3": b'{"publish":["x"]}'}, tree, "mqtt"
    )
    assert grants is not None and sorted(grants.publish) == ["u3"]
    assert [p.field for p in problems] == ["u1", "u2"]
    assert "'#' must be the last level" in problems[1].reason


def _decider(grants: dict[str, GrantRecord], scheme: str = "mqtt") -> Decider:
    client = fakeredis.FakeRedis()
    if scheme == "swiftmq":
        client.hset(keys.manager(QM), "topic_scheme", "swiftmq")
    define(client, QM, "ORDERS", "orders/eu" if scheme == "mqtt" else "orders.eu")
    subscribe(client, QM, "#" if scheme == "mqtt" else "orders", "c1", "all")
    for user, record in grants.items():
        client.hset(keys.grants(QM), user, record.to_json())
    table = RoutingTable(QM)
    table.load(client)
    client.flushall()  # from here on nothing is read from the store
    return Decider(Settings(qm=QM, reply_ttl_ms=9_000), table)


def _fields(topic: str, principal: str | None = "svc") -> dict[bytes, bytes]:
    fields = {b"publisher": b"svc-7", b"topic": topic.encode(), b"body": b"x", b"reply": b"1"}
    if principal is not None:
        fields[b"principal"] = principal.encode()
    return fields


def _action(decider: Decider, topic: str, principal: str | None = "svc") -> Action:
    return decider.unit_of_work("svc-7", "1-0", _fields(topic, principal), NOW_MS).action


def test_a_principal_with_publish_grants_publishes_only_on_the_topics_they_match():
    # Given principal svc granted a wildcard filter and a topic object (orders/eu and below)
    decider = _decider({"svc": GrantRecord(publish=["news/+/today"], publish_objects=["ORDERS"])})
    # Then inside its grants it is delivered, outside refused with the reason, dead-lettered and answered
    assert _action(decider, "news/sport/today") is Action.DELIVER
    assert _action(decider, "orders/eu") is Action.DELIVER
    assert _action(decider, "orders/eu/fr/1") is Action.DELIVER
    refused = decider.unit_of_work("svc-7", "1-0", _fields("orders/us"), NOW_MS)
    assert refused.action is Action.REFUSE
    assert refused.reason == "not authorized: principal svc may not publish on 'orders/us'"
    assert refused.dead_letter and refused.reply_ttl_ms == 9_000
    assert _action(decider, "news/sport/tomorrow") is Action.REFUSE


def test_without_publish_grants_a_principal_or_a_trusted_writer_publishes_anywhere():
    # Given grants for other users only (a subscribe grant for svc, a publish grant for another)
    decider = _decider({"svc": GrantRecord(subscribe=["x/#"]), "other": GrantRecord(publish=["x/#"])})
    # Then svc (no publish grant), and an entry with no principal (a trusted writer), are not restricted
    assert _action(decider, "orders/us") is Action.DELIVER
    assert _action(decider, "orders/us", principal=None) is Action.DELIVER
    assert _action(decider, "orders/us", principal="other") is Action.REFUSE
    # ... and with no grant at all the table holds nothing to check
    assert _decider({}).table.grants is None


def test_a_publication_forwarded_from_another_queue_manager_is_not_checked_against_local_grants():
    decider = _decider({"svc": GrantRecord(publish=["x/#"])})
    fields = {**_fields("orders/us"), b"origin": b"QM9", b"route": b"QM9"}
    assert decider.unit_of_work("svc-7", "1-0", fields, NOW_MS).action is Action.DELIVER


def test_swiftmq_publish_grants_cover_the_subtree_not_the_parents():
    decider = _decider({"svc": GrantRecord(publish=["news.s%"], publish_objects=["ORDERS"])}, "swiftmq")
    assert decider.table.scheme == "swiftmq"
    assert _action(decider, "orders.eu.fr") is Action.DELIVER
    assert _action(decider, "news.sport.x") is Action.DELIVER
    assert _action(decider, "orders") is Action.REFUSE  # a parent of the granted node
    assert _action(decider, "news.hr") is Action.REFUSE


def test_a_grant_record_round_trips_and_a_foreign_shape_is_refused():
    record = GrantRecord(publish=["a/#"], subscribe_objects=["ORDERS"])
    assert GrantRecord.from_json("u", record.to_json(), QM) == record
    assert json.loads(record.to_json()) == {"publish": ["a/#"], "subscribe_objects": ["ORDERS"]}
    with pytest.raises(ValueError, match="not an object"):
        GrantRecord.from_json("u", '{"everything": true}', QM)
