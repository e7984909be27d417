"""Definitions export and import (``broker.operations.definitions``, ``broker definitions``) on a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import InvalidDefinitions
from broker.operations.acl import RoleSpec, add_user, rotate
from broker.operations.definitions import export_definitions, import_definitions
from broker.operations.grants import grant, list_grants
from broker.topics import links, topic_objects
from broker.topics.subscriptions import read_subscriptions, subscribe

QM = "TEST"


@pytest.fixture(autouse=True)
def _no_users_left(real_redis: redis.Redis) -> Iterator[None]:
    """ACL users are server-wide (FLUSHALL keeps them): each test starts and ends without these."""
    names = ("feeder", "reader")
    for name in names:
        real_redis.execute_command("ACL", "DELUSER", name)
    yield
    for name in names:
        real_redis.execute_command("ACL", "DELUSER", name)


def _define_everything(client: redis.Redis, settings: Settings) -> None:
    topic_objects.define(
        client, QM, "SPORTS", "sports", topic_objects.Attributes(maxdepth=5), description="the sports tree"
    )
    links.link(client, QM, "news", "sports")
    subscribe(client, QM, "sports/#", "app", "scores", selector="points > 2", settings=settings)
    subscribe(client, QM, "$share/grp/news/+", "grp", "headlines", settings=settings)
    subscribe(client, QM, "news/#", "tmp", settings=settings)  # non-durable: not exported
    add_user(client, QM, "feeder", RoleSpec("publisher", publisher_ids=["feed1"]), "secret-1")
    add_user(client, QM, "reader", RoleSpec("subscriber", client_id="app"), "secret-2")
    grant(client, QM, "reader", subscribe=["sports/#"], subscribe_objects=["SPORTS"])


def test_an_export_imported_into_an_empty_queue_manager_recreates_every_definition(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Given a queue manager with a topic object, a link, subscriptions, users and grants
    _define_everything(real_redis, settings)
    exported = export_definitions(real_redis, settings)
    text = json.dumps(exported)
    assert "secret-1" not in text and "secret-2" not in text
    assert [s["id"] for s in exported["subscriptions"]] == ["app$scores", "grp$headlines"]

    # When the queue manager is emptied and the document imported
    real_redis.flushall()
    for user in ("feeder", "reader"):
        real_redis.execute_command("ACL", "DELUSER", user)
    report = import_definitions(real_redis, settings, text)

    # Then the same definitions are there again
    again = export_definitions(real_redis, settings)
    for section in ("subscriptions", "links", "topic_objects", "users", "grants", "declared_topics"):
        assert again[section] == exported[section], section
    assert sorted(report.created["subscriptions"]) == ["app$scores", "grp$headlines"]
    subs = {s.sub_id: s for s in read_subscriptions(real_redis, QM)[0]}
    assert subs["app$scores"].selector == "points > 2" and subs["app$scores"].durable
    assert subs["grp$headlines"].share == "grp"
    assert list_grants(real_redis, QM)[0]["reader"].subscribe_objects == ["SPORTS"]


def test_an_imported_user_has_no_password_until_an_operator_rotates_one_in(
    real_redis: redis.Redis, settings: Settings, real_server
) -> None:
    doc = {"users": [{"name": "feeder", "role": "publisher", "publisher_ids": ["feed1"]}]}
    import_definitions(real_redis, settings, doc)
    try:
        with pytest.raises(redis.AuthenticationError):
            real_redis.execute_command("AUTH", "feeder", "")
        rotate(real_redis, "feeder", "now-set")
        other = redis.Redis.from_url(real_server.url)
        assert other.execute_command("AUTH", "feeder", "now-set")
        other.close()
    finally:
        real_redis.execute_command("ACL", "DELUSER", "feeder")


def test_importing_twice_keeps_what_exists_and_creates_nothing(
    real_redis: redis.Redis, settings: Settings
) -> None:
    _define_everything(real_redis, settings)
    exported = export_definitions(real_redis, settings)
    report = import_definitions(real_redis, settings, exported)
    assert report.created == {}
    assert sorted(report.kept["subscriptions"]) == ["app$scores", "grp$headlines"]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ("not json", "document"),
        ({"subscriptions": [{"id": "a$b", "filter": "a/#", "colour": "red"}]}, "subscriptions.0.colour"),
        ({"links": [{"source": "a/b", "target": "c"}], "subscriptions": [{"id": "a$b", "filter": "a/#/x"}]},
         "subscriptions[0]"),
        ({"links": [{"source": "a", "target": "b"}, {"source": "b", "target": "a"}]}, "links[1]"),
        ({"topic_objects": [{"name": "X", "topic_string": "x", "attributes": {"defprty": 12}}]},
         "topic_objects.0.attributes"),
        ({"users": [{"name": "u", "role": "subscriber"}]}, "users[0]"),
        ({"grants": {"nobody": {"publish": ["a"]}}}, "grants.nobody"),
        (
            {
                "topic_objects": [{"name": "S", "topic_string": "s", "attributes": {"dursub": "NO"}}],
                "subscriptions": [{"id": "a$b", "filter": "s/#"}],
            },
            "subscriptions[0]",
        ),
        ({"subscriptions": [{"id": "a$b", "filter": "a/#", "selector": "x >"}]}, "subscriptions[0]"),
    ],
)  # fmt: skip
def test_a_bad_document_is_refused_naming_the_entry_and_nothing_is_written(
    real_redis: redis.Redis, settings: Settings, doc: object, where: str
) -> None:
    # Given a document whose first entries are good and one later entry bad
    with pytest.raises(InvalidDefinitions) as refused:
        import_definitions(real_redis, settings, doc)  # type: ignore[arg-type]
    assert refused.value.where.startswith(where), refused.value.where
    assert "nothing was written" in str(refused.value)
    # Then the queue manager holds nothing at all
    assert real_redis.keys(f"{keys.all_keys_pattern(QM)}") == []


def test_a_subscription_that_exists_with_another_filter_refuses_the_whole_document(
    real_redis: redis.Redis, settings: Settings
) -> None:
    subscribe(real_redis, QM, "a/#", "app", "x", settings=settings)
    before = real_redis.hgetall(keys.subscriptions(QM))
    doc = {
        "links": [{"source": "p", "target": "q"}],
        "subscriptions": [{"id": "app$x", "filter": "b/#"}],
    }
    with pytest.raises(InvalidDefinitions, match="other settings"):
        import_definitions(real_redis, settings, doc)
    assert real_redis.hgetall(keys.subscriptions(QM)) == before
    assert links.list_links(real_redis, QM) == []


def test_the_cli_exports_to_a_file_and_imports_it_into_an_empty_queue_manager(
    run, real_redis: redis.Redis, settings: Settings, tmp_path
) -> None:
    _define_everything(real_redis, settings)
    target = tmp_path / "defs.json"
    exported = run("definitions", "export", str(target))
    assert exported.exit_code == 0, exported.output
    real_redis.flushall()
    for user in ("feeder", "reader"):
        real_redis.execute_command("ACL", "DELUSER", user)
    imported = run("definitions", "import", str(target))
    assert imported.exit_code == 0, imported.output
    assert "created 2 subscriptions" in imported.output
    assert "broker acl rotate" in imported.output
    assert sorted(s.sub_id for s in read_subscriptions(real_redis, QM)[0]) == ["app$scores", "grp$headlines"]
    for user in ("feeder", "reader"):
        real_redis.execute_command("ACL", "DELUSER", user)


def test_the_cli_refuses_a_bad_file_with_exit_2_and_writes_nothing(
    run, real_redis: redis.Redis, tmp_path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"links": [{"source": "a", "target": "b"}], "users": [{"name": "x", "role": "king"}]})
    )
    answer = run("definitions", "import", str(bad))
    assert answer.exit_code == 2
    assert "users.0.role" in answer.output and "nothing was written" in answer.output
    assert real_redis.keys(keys.all_keys_pattern(QM)) == []


def test_a_user_of_another_queue_manager_on_the_same_server_is_left_as_it_is_with_its_password(
    real_redis: redis.Redis, settings: Settings, real_server
) -> None:
    # Given user "feeder" of queue manager OTHER on the same server (ACL users are server-wide)
    add_user(real_redis, "OTHER", "feeder", RoleSpec("publisher", publisher_ids=["feed1"]), "secret-1")
    doc = {
        "users": [{"name": "feeder", "role": "monitor"}],
        "grants": {"feeder": {"publish": ["a/#"]}},
        "links": [{"source": "a", "target": "b"}],
    }
    # When a document naming it is imported into TEST
    report = import_definitions(real_redis, settings, doc)
    # Then its password still works, it is named in the notes, and the rest is imported
    other = redis.Redis.from_url(real_server.url)
    assert other.execute_command("AUTH", "feeder", "secret-1")
    other.close()
    assert any("'feeder' exists on the server" in note for note in report.notes)
    assert not real_redis.hexists(keys.acl_users(QM), "feeder")
    assert list_grants(real_redis, QM)[0] == {}
    assert links.list_links(real_redis, QM) == [("a", "b", False)]
