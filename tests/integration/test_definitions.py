"""Definitions export and import (``broker.operations.definitions``, ``broker definitions``) on a real server."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from broker import cli
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import InvalidDefinitions, UsersNeedOperator
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


# --- an import by the broker's admin role, which may not make ACL users (ACL is @admin) --------

ADMIN_PASSWORD = "admin-secret-1"


@pytest.fixture
def admin(real_server, real_redis: redis.Redis) -> Iterator[tuple[redis.Redis, str]]:
    """A client logged in as ACL user ``ops`` with the broker's admin role, and its URL."""
    add_user(real_redis, QM, "ops", RoleSpec("admin"), ADMIN_PASSWORD)
    url = real_server.url.replace("redis://", f"redis://ops:{ADMIN_PASSWORD}@", 1)
    client = redis.Redis.from_url(url)
    yield client, url
    client.close()
    real_redis.execute_command("ACL", "DELUSER", "ops")


def _exported_then_emptied(client: redis.Redis, settings: Settings) -> dict:
    """Every definition exported, then the queue manager emptied but for the admin's record."""
    _define_everything(client, settings)
    document = export_definitions(client, settings)
    for user in ("feeder", "reader"):
        client.execute_command("ACL", "DELUSER", user)
    for key in client.scan_iter(match=keys.all_keys_pattern(QM)):
        if key != keys.acl_users(QM).encode():
            client.delete(key)
    client.hdel(keys.acl_users(QM), "feeder", "reader")
    return document


def _state(client: redis.Redis) -> dict[bytes, bytes]:
    return {k: client.dump(k) for k in client.scan_iter(match=keys.all_keys_pattern(QM))}  # type: ignore[misc]


def test_an_admin_importing_users_it_may_not_make_is_refused_naming_the_operator_commands_and_nothing_is_written(
    real_redis: redis.Redis, settings: Settings, admin: tuple[redis.Redis, str]
) -> None:
    # Given an export naming users, and an empty queue manager
    document = _exported_then_emptied(real_redis, settings)
    before = _state(real_redis)
    # When the broker's admin imports it
    with pytest.raises(UsersNeedOperator) as refused:
        import_definitions(admin[0], settings, document)
    # Then it is refused before anything is written, naming each user's `broker acl add`
    assert refused.value.commands == {
        "feeder": "broker --qm TEST acl add feeder --role publisher --publisher-id feed1 --password-env VAR",
        "reader": "broker --qm TEST acl add reader --role subscriber --client-id app --password-env VAR",
    }
    assert "--skip-users" in str(refused.value) and "nothing was written" in str(refused.value)
    assert _state(real_redis) == before
    assert real_redis.execute_command("ACL", "GETUSER", "feeder") is None


def test_an_admin_importing_with_skip_users_gets_everything_else_and_each_user_left_out_named(
    real_redis: redis.Redis, settings: Settings, admin: tuple[redis.Redis, str]
) -> None:
    document = _exported_then_emptied(real_redis, settings)
    # When the admin imports it with skip_users
    report = import_definitions(admin[0], settings, document, skip_users=True)
    # Then the subscriptions, links and topic objects are there, and the users and their grants are not
    assert sorted(s.sub_id for s in read_subscriptions(real_redis, QM)[0]) == ["app$scores", "grp$headlines"]
    assert links.list_links(real_redis, QM) == [("news", "sports", False)]
    assert report.skipped == {"users": ["feeder", "reader"], "grants": ["reader"]}
    assert any("acl add reader --role subscriber --client-id app" in n for n in report.notes)
    assert list_grants(real_redis, QM)[0] == {}
    assert real_redis.execute_command("ACL", "GETUSER", "reader") is None
    # And once an operator has made the users, the admin's import brings their grants
    add_user(real_redis, QM, "feeder", RoleSpec("publisher", publisher_ids=["feed1"]), "secret-1")
    add_user(real_redis, QM, "reader", RoleSpec("subscriber", client_id="app"), "secret-2")
    again = import_definitions(admin[0], settings, document)
    assert again.created == {"grants": ["reader"]} and again.skipped == {}
    assert list_grants(real_redis, QM)[0]["reader"].subscribe == ["sports/#"]


def test_the_cli_as_admin_refuses_users_with_exit_3_and_imports_the_rest_with_skip_users(
    real_redis: redis.Redis, settings: Settings, admin: tuple[redis.Redis, str], tmp_path, monkeypatch
) -> None:
    document = _exported_then_emptied(real_redis, settings)
    target = tmp_path / "defs.json"
    target.write_text(json.dumps(document))
    monkeypatch.chdir(tmp_path)
    env = {k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    runner = CliRunner(env=env)
    base = ["--redis-url", admin[1], "--qm", QM, "definitions", "import", str(target)]
    before = _state(real_redis)

    refused = runner.invoke(cli.main, base)
    assert refused.exit_code == 3, refused.output
    assert "acl add feeder --role publisher --publisher-id feed1" in refused.output
    assert _state(real_redis) == before

    imported = runner.invoke(cli.main, [*base, "--skip-users"])
    assert imported.exit_code == 0, imported.output
    assert "created 2 subscriptions" in imported.output
    assert "skipped 2 users (--skip-users): feeder, reader" in imported.output
    assert "acl add reader --role subscriber --client-id app" in imported.output
