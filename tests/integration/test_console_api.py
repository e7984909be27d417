"""The management HTTP API (``broker.operations.console.api``) through Starlette's TestClient, on a real server.

Every endpoint is called by each kind of caller: no credentials, a publisher and a subscriber
(both refused at login), a monitor (reads; its writes refused and nothing changes), and an
admin. Logins are real Redis ACL users, so Redis itself checks passwords and rights.
"""

from __future__ import annotations

import json
import secrets
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.server import Server
from broker.operations import grants
from broker.operations.acl import RoleSpec, add_user
from broker.operations.console import create_app
from broker.operations.console.app import COOKIE
from broker.operations.console.openapi import OPERATIONS, document
from broker.testing import drain, make_workers
from broker.topics import declared, links, topic_objects
from broker.topics.subscriptions import subscribe

with warnings.catch_warnings():  # Starlette >= 1.x suggests httpx2; httpx is what the test extra installs
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

QM = "TEST"
ROLES = ("none", "publisher", "subscriber", "monitor", "admin")
USERS = {"publisher": "pub", "subscriber": "sub", "monitor": "watch", "admin": "ops"}


@pytest.fixture
def passwords(real_server: Server, real_redis: redis.Redis) -> Iterator[dict[str, str]]:
    """One ACL user per role the matrix tries, with random passwords."""
    made = {user: secrets.token_urlsafe(12) for user in USERS.values()}
    add_user(real_redis, QM, "ops", RoleSpec("admin"), made["ops"])
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), made["watch"])
    add_user(real_redis, QM, "pub", RoleSpec("publisher", publisher_ids=["p1"]), made["pub"])
    add_user(real_redis, QM, "sub", RoleSpec("subscriber", client_id="app"), made["sub"])
    yield made
    for name in made:
        real_redis.execute_command("ACL", "DELUSER", name)


@pytest.fixture
def api(real_server: Server, passwords: dict[str, str]) -> Iterator[TestClient]:
    settings = Settings(redis_url=real_server.url, qm=QM, console_session_idle_ms=60_000)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        yield client


@dataclass
class World:
    """What every endpoint's test starts from: a durable subscription ``app$scores`` holding two
    messages, a topic object, a link, a declared topic, a dead letter and the subscriber user's
    grant of ``news/#``."""

    dead_letter: str


@pytest.fixture
def world(real_redis: redis.Redis, settings: Settings, passwords: dict[str, str]) -> World:
    subscribe(real_redis, QM, "sports/#", "app", "scores", settings=settings)
    grants.grant(real_redis, QM, "sub", subscribe=["news/#"])
    topic_objects.define(real_redis, QM, "SPORTS", "sports")
    links.link(real_redis, QM, "news", "sports")
    declared.declare(real_redis, QM, "x.y")
    publisher = Publisher(real_redis, QM, "p1")
    publisher.publish("sports/a", b"first")
    publisher.publish("sports/b", b"\xff binary")
    drain(make_workers(real_redis, settings, 1))
    fields = {
        "publisher": "p1",
        "topic": "/a",
        "msgid": "m1",
        "body": b"x",
        "dlq.reason": "test",
        "dlq.entry_id": "1-0",
    }
    dlq_id = real_redis.xadd(keys.dead_letter(QM), fields).decode()  # type: ignore[arg-type]
    return World(dlq_id)


def _state(client: redis.Redis) -> dict[bytes, bytes]:
    """Every key of the queue manager and its value (``DUMP``): equal when nothing changed."""
    return {k: client.dump(k) for k in client.scan_iter(match=keys.all_keys_pattern(QM))}  # type: ignore[misc]


def call(
    api: TestClient, role: str, passwords: dict[str, str], method: str, path: str, body: Any = None
) -> Any:
    auth = None if role == "none" else (USERS[role], passwords[USERS[role]])
    content = None if body is None else json.dumps(body)
    return api.request(method, path, auth=auth, content=content)


#: (method, path, body, the admin's status). ``{dlq}`` is the world's dead letter.
ENDPOINTS: list[tuple[str, str, Any, int]] = [
    ("GET", "/api/whoami", None, 200),
    ("GET", "/api/overview", None, 200),
    ("GET", "/api/samples", None, 200),
    ("POST", "/api/publish", {"topic": "sports/c", "body": "hello", "properties": {"n": 1}}, 202),
    ("GET", "/api/subscriptions", None, 200),
    ("GET", "/api/subscriptions/app$scores", None, 200),
    ("PUT", "/api/subscriptions/app$new", {"filter": "news/#", "selector": "a > 1"}, 201),
    ("DELETE", "/api/subscriptions/app$scores", None, 204),
    ("DELETE", "/api/subscriptions/app$scores/contents", None, 200),
    ("GET", "/api/subscriptions/app$scores/messages?count=5", None, 200),
    ("GET", "/api/consumers", None, 200),
    ("GET", "/api/links", None, 200),
    ("POST", "/api/links", {"source": "a", "target": "b"}, 201),
    ("DELETE", "/api/links?source=news&target=sports", None, 204),
    ("GET", "/api/topic-objects", None, 200),
    ("GET", "/api/topic-objects/SPORTS", None, 200),
    ("PUT", "/api/topic-objects/NEWS", {"topic_string": "news", "attributes": {"maxdepth": 3}}, 201),
    ("DELETE", "/api/topic-objects/SPORTS", None, 204),
    ("GET", "/api/declared-topics", None, 200),
    ("PUT", "/api/declared-topics/a.b", None, 201),
    ("DELETE", "/api/declared-topics/x.y", None, 204),
    ("GET", "/api/dead-letters", None, 200),
    ("GET", "/api/dead-letters/{dlq}", None, 200),
    ("POST", "/api/dead-letters/replay", {"ids": ["{dlq}"]}, 200),
    ("POST", "/api/dead-letters/purge", {"ids": ["{dlq}"]}, 200),
    ("GET", "/api/workers", None, 200),
    ("GET", "/api/channels", None, 200),
    ("GET", "/api/users", None, 200),
    ("GET", "/api/grants", None, 200),
    ("POST", "/api/grants/sub", {"subscribe": ["sports/#"]}, 200),
    ("POST", "/api/grants/sub/revoke", {"subscribe": ["news/#"]}, 200),
    ("GET", "/api/definitions", None, 200),
    ("POST", "/api/definitions", {"links": [{"source": "c", "target": "d"}]}, 200),
]


def _template(path: str) -> str:
    """``/api/subscriptions/app$scores/messages?count=5`` -> ``/subscriptions/{sub_id}/messages``."""
    path = path.split("?")[0].removeprefix("/api")
    for concrete, name in (
        ("/subscriptions/app$scores", "/subscriptions/{sub_id}"),
        ("/subscriptions/app$new", "/subscriptions/{sub_id}"),
        ("/topic-objects/SPORTS", "/topic-objects/{name}"),
        ("/topic-objects/NEWS", "/topic-objects/{name}"),
        ("/declared-topics/a.b", "/declared-topics/{topic}"),
        ("/declared-topics/x.y", "/declared-topics/{topic}"),
        ("/dead-letters/{dlq}", "/dead-letters/{dlq_id}"),
        ("/grants/sub", "/grants/{user}"),
    ):
        path = path.replace(concrete, name)
    return path


def test_every_documented_endpoint_is_in_the_role_matrix_and_every_one_there_is_documented() -> None:
    documented = {(op.method.upper(), op.path) for op in OPERATIONS}
    tested = {(method, _template(path)) for method, path, _, _ in ENDPOINTS}
    assert tested == documented


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("method", "path", "body", "admin_status"), ENDPOINTS, ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS]
)
def test_each_role_gets_what_it_may_and_a_refused_call_changes_nothing(
    api: TestClient,
    passwords: dict[str, str],
    world: World,
    real_redis: redis.Redis,
    role: str,
    method: str,
    path: str,
    body: Any,
    admin_status: int,
) -> None:
    # Given the world, and a caller of one role
    path = path.replace("{dlq}", world.dead_letter)
    body = json.loads(json.dumps(body).replace("{dlq}", world.dead_letter)) if body is not None else None
    before = _state(real_redis)
    writes = method != "GET"

    # When it calls the endpoint
    answer = call(api, role, passwords, method, path, body)

    # Then: no login (none, publisher, subscriber) 401; a monitor reads, its writes 403; admin all
    if role in ("none", "publisher", "subscriber"):
        expected = 401
    elif role == "monitor" and writes:
        expected = 403
    else:
        expected = admin_status
    assert answer.status_code == expected, answer.text
    if expected >= 400:
        error = answer.json()
        assert set(error) == {"error", "kind"} and error["error"]
        assert _state(real_redis) == before
    if expected == 401:
        assert answer.headers["www-authenticate"].startswith("Basic")


def test_a_monitor_browses_a_subscription_and_the_messages_stay(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis
) -> None:
    answer = call(api, "monitor", passwords, "GET", "/api/subscriptions/app$scores/messages?count=10")
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert [m["body"] for m in found] == ["first", "/yBiaW5hcnk="]
    assert [m["body_encoding"] for m in found] == ["utf-8", "base64"]
    detail = call(api, "monitor", passwords, "GET", "/api/subscriptions/app$scores").json()
    assert detail["depth"] == 2


def test_purging_a_subscription_deletes_its_waiting_messages_and_keeps_it(
    api: TestClient, passwords: dict[str, str], world: World
) -> None:
    answer = call(api, "admin", passwords, "DELETE", "/api/subscriptions/app$scores/contents")
    assert answer.json() == {"purged": 2}
    detail = call(api, "admin", passwords, "GET", "/api/subscriptions/app$scores").json()
    assert detail["depth"] == 0 and detail["filter"] == "sports/#"


def test_a_purge_refuses_a_band_of_another_type_and_deletes_nothing(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis
) -> None:
    real_redis.set(keys.sub_band(QM, "app$scores", 0), "planted")
    answer = call(api, "admin", passwords, "DELETE", "/api/subscriptions/app$scores/contents")
    assert answer.status_code == 409 and answer.json()["kind"] == "ForeignKey"
    planted = keys.sub_band(QM, "app$scores", 0)
    assert sum(real_redis.llen(b) for b in keys.sub_bands(QM, "app$scores") if b != planted) == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind"),
    [
        ("PUT", "/api/subscriptions/app$x", {"filter": "a/#/b"}, 400, "InvalidTopicFilter"),
        ("PUT", "/api/subscriptions/app$x", {"selector": "a > 1"}, 400, "BadRequest"),
        ("PUT", "/api/subscriptions/noid", {"filter": "a"}, 400, "BadRequest"),
        ("PUT", "/api/subscriptions/app$x", {"filter": "$share/grp/a/#"}, 400, "BadRequest"),
        ("PUT", "/api/subscriptions/app$scores", {"filter": "other/#"}, 409, "SubscriptionConflict"),
        ("GET", "/api/subscriptions/app$none", None, 404, "NoSuchSubscription"),
        ("DELETE", "/api/subscriptions/app$none", None, 404, "NoSuchSubscription"),
        ("POST", "/api/links", {"source": "sports", "target": "news"}, 409, "LinkCycle"),
        ("DELETE", "/api/links?source=a&target=b", None, 404, "NoSuchLink"),
        ("PUT", "/api/topic-objects/SPORTS", {"topic_string": "elsewhere"}, 409, "TopicObjectConflict"),
        (
            "PUT",
            "/api/topic-objects/X",
            {"topic_string": "x", "attributes": {"defprty": 12}},
            400,
            "ValidationError",
        ),
        ("GET", "/api/topic-objects/NONE", None, 404, "NoSuchTopicObject"),
        ("PUT", "/api/topic-objects/X", {"topic_string": "x", "attributes": [1]}, 400, "BadRequest"),
        ("GET", "/api/dead-letters/1-1", None, 404, "DeadLetterNotFound"),
        ("POST", "/api/dead-letters/purge", {}, 400, "EmptySelection"),
        ("POST", "/api/definitions", {"links": "no"}, 400, "InvalidDefinitions"),
        (
            "POST",
            "/api/definitions",
            {"subscriptions": [{"id": "app$scores", "filter": "x/#"}]},
            409,
            "InvalidDefinitions",
        ),
        ("GET", "/api/no-such-thing", None, 404, "NotFound"),
    ],
)
def test_bad_calls_get_a_json_error_with_its_status_and_change_nothing(
    api: TestClient,
    passwords: dict[str, str],
    world: World,
    real_redis: redis.Redis,
    method: str,
    path: str,
    body: Any,
    status: int,
    kind: str,
) -> None:
    before = _state(real_redis)
    answer = call(api, "admin", passwords, method, path, body)
    assert (answer.status_code, answer.json()["kind"]) == (status, kind), answer.text
    assert _state(real_redis) == before


def test_a_foreign_key_is_a_409_naming_it(
    api: TestClient, passwords: dict[str, str], real_redis: redis.Redis
) -> None:
    real_redis.set(keys.grants(QM), "planted")
    answer = call(api, "admin", passwords, "GET", "/api/grants")
    assert (answer.status_code, answer.json()["kind"]) == (409, "ForeignKey"), answer.text
    assert keys.grants(QM) in answer.json()["error"]


def test_a_body_that_is_not_a_json_object_is_refused_with_400(
    api: TestClient, passwords: dict[str, str]
) -> None:
    for content in ("not json", "[1, 2]"):
        answer = api.post("/api/links", content=content, auth=("ops", passwords["ops"]))
        assert answer.status_code == 400 and answer.json()["kind"] == "BadRequest"


def test_a_browser_session_reads_with_its_cookie_and_writes_only_with_its_csrf_token(
    api: TestClient, passwords: dict[str, str], real_redis: redis.Redis
) -> None:
    # Given an admin logged in to the console (the session cookie)
    answer = api.post("/login", data={"user": "ops", "password": passwords["ops"]}, follow_redirects=False)
    assert answer.status_code == 303 and COOKIE in answer.headers["set-cookie"]
    me = api.get("/api/whoami").json()
    assert me["user"] == "ops" and me["role"] == "admin"

    # When it writes without the token, then with it
    refused = api.post("/api/links", content=json.dumps({"source": "a", "target": "b"}))
    done = api.post(
        "/api/links", content=json.dumps({"source": "a", "target": "b"}), headers={"X-CSRF-Token": me["csrf"]}
    )

    # Then only the second is done
    assert refused.status_code == 403 and refused.json()["kind"] == "CsrfRefused"
    assert done.status_code == 201
    assert links.list_links(real_redis, QM) == [("a", "b", False)]


def test_a_wrong_password_is_refused_like_an_unknown_user(api: TestClient) -> None:
    wrong = api.get("/api/overview", auth=("ops", "not-it"))
    unknown = api.get("/api/overview", auth=("nobody", "not-it"))
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json()


def test_definitions_exported_by_a_monitor_import_into_an_empty_queue_manager(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis
) -> None:
    exported = call(api, "monitor", passwords, "GET", "/api/definitions").json()
    assert {u["name"] for u in exported["users"]} == set(USERS.values())
    assert not any(p in json.dumps(exported) for p in passwords.values())
    for key in list(real_redis.scan_iter(match=keys.all_keys_pattern(QM))):
        if key != keys.acl_users(QM).encode():  # the logins stay: the users are kept, not made again
            real_redis.delete(key)
    answer = call(api, "admin", passwords, "POST", "/api/definitions", exported)
    assert answer.status_code == 200, answer.text
    assert answer.json()["created"]["subscriptions"] == ["app$scores"]
    again = call(api, "monitor", passwords, "GET", "/api/definitions").json()
    for section in ("subscriptions", "links", "topic_objects", "declared_topics", "users", "grants"):
        assert again[section] == exported[section], section


def test_an_admin_importing_users_the_queue_manager_lacks_gets_403_and_with_skip_users_the_rest(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis
) -> None:
    # Given an export, and a queue manager emptied of everything but its admin and monitor users
    exported = call(api, "monitor", passwords, "GET", "/api/definitions").json()
    for key in list(real_redis.scan_iter(match=keys.all_keys_pattern(QM))):
        if key != keys.acl_users(QM).encode():
            real_redis.delete(key)
    real_redis.hdel(keys.acl_users(QM), "pub", "sub")
    before = _state(real_redis)

    # When the admin imports it: refused, as the admin role may not make ACL users; nothing written
    refused = call(api, "admin", passwords, "POST", "/api/definitions", exported)
    assert refused.status_code == 403, refused.text
    assert refused.json()["kind"] == "UsersNeedOperator"
    assert "acl add sub --role subscriber --client-id app" in refused.json()["error"]
    assert _state(real_redis) == before
    bad = call(api, "admin", passwords, "POST", "/api/definitions?skip_users=yes", exported)
    assert bad.status_code == 400 and _state(real_redis) == before

    # When it imports it with skip_users: the rest is there, each user left out is named
    answer = call(api, "admin", passwords, "POST", "/api/definitions?skip_users=true", exported)
    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert report["created"]["subscriptions"] == ["app$scores"]
    assert report["skipped"] == {"users": ["pub", "sub"], "grants": ["sub"]}
    assert any("acl add pub --role publisher --publisher-id p1" in n for n in report["notes"])
    assert not real_redis.hexists(keys.acl_users(QM), "sub")


def test_the_openapi_document_is_served_without_a_login_and_documents_every_route(api: TestClient) -> None:
    answer = api.get("/api/openapi.json")
    assert answer.status_code == 200
    doc = answer.json()
    assert doc == json.loads(json.dumps(document()))
    ops = {(m, p) for p, item in doc["paths"].items() for m in item}
    assert len(ops) == len(OPERATIONS)


def test_the_openapi_document_validates() -> None:
    validator = pytest.importorskip(
        "openapi_spec_validator", reason="the test extra installs openapi-spec-validator"
    )
    validator.validate(document())


def test_an_admin_publishes_and_the_workers_deliver_it_with_its_properties(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis, settings: Settings
) -> None:
    # When an admin publishes on a topic the subscription app$scores matches
    body = {"topic": "sports/c", "body": "goal", "properties": {"team": "blue", "n": 3}, "msgid": "m-goal"}
    answer = call(api, "admin", passwords, "POST", "/api/publish", body)

    # Then it is handed to the broker (202), and the workers deliver it after the two already there
    assert answer.status_code == 202, answer.text
    assert answer.json()["msgid"] == "m-goal" and answer.json()["entry_id"]
    drain(make_workers(real_redis, settings, 1))
    found = call(api, "monitor", passwords, "GET", "/api/subscriptions/app$scores/messages?count=10").json()
    assert [(m["msgid"], m["body"], m["properties"]) for m in found[2:]] == [
        ("m-goal", "goal", {"team": "blue", "n": 3})
    ]


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"body": "no topic"}, "BadRequest"),
        ({"topic": "a/#", "body": "x"}, "InvalidTopic"),
        ({"topic": "a", "properties": ["x"]}, "BadRequest"),
        ({"topic": "a", "properties": {"p": {"nested": 1}}}, "InvalidMessage"),
        ({"topic": "a", "priority": 12}, "InvalidMessage"),
        ({"topic": "a", "priority": "high"}, "BadRequest"),
        ({"topic": "a", "persistent": "yes"}, "BadRequest"),
        ({"topic": "a", "publisher_id": ""}, "InvalidMessage"),
        # over the settings' limits (max_topic_levels 32, max_topic_bytes 4,096): the workers
        # would dead-letter it, so the API refuses it
        ({"topic": "/".join(["l"] * 33), "body": "x"}, "InvalidTopic"),
        ({"topic": "t" * 4_097, "body": "x"}, "InvalidTopic"),
    ],
)
def test_a_bad_publication_is_a_400_and_nothing_is_published(
    api: TestClient, passwords: dict[str, str], real_redis: redis.Redis, body: dict[str, Any], kind: str
) -> None:
    answer = call(api, "admin", passwords, "POST", "/api/publish", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["kind"] == kind
    assert real_redis.xlen(keys.publish_stream(QM)) == 0


def test_an_admin_grants_and_revokes_and_a_bad_grant_changes_nothing(
    api: TestClient, passwords: dict[str, str], world: World, real_redis: redis.Redis
) -> None:
    answer = call(api, "admin", passwords, "POST", "/api/grants/sub", {"subscribe": ["sports/#"]})
    assert answer.json()["subscribe"] == ["news/#", "sports/#"]
    before = _state(real_redis)
    for body, status in (({"subscribe": "sports/#"}, 400), ({"subscribe": ["a/#/b"]}, 400), ({}, 400)):
        assert call(api, "admin", passwords, "POST", "/api/grants/sub", body).status_code == status
    missing = call(api, "admin", passwords, "POST", "/api/grants/sub/revoke", {"publish": ["x"]})
    assert missing.status_code == 404 and missing.json()["kind"] == "NoSuchGrant"
    assert _state(real_redis) == before
    answer = call(api, "admin", passwords, "POST", "/api/grants/sub/revoke", {"all": True})
    assert answer.status_code == 200 and answer.json()["subscribe"] == []
    assert call(api, "monitor", passwords, "GET", "/api/grants").json() == {}
