"""The web console's rules, through Starlette's TestClient against the real server (``broker.operations.console``).

Logins are real Redis ACL users made with ``broker.operations.acl.add_user``: Redis checks the
password, and the role comes from ``{qm}:acl``. The browser test (pages, replay from the
page, screenshots) is ``test_console.py``.
"""

from __future__ import annotations

import re
import secrets
import warnings
from collections.abc import Iterator

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.server import EPHEMERAL, Server
from broker.operations.acl import RoleSpec, add_user, admin_acl_file, rotate
from broker.operations.console import create_app
from broker.operations.console.app import COOKIE
from broker.operations.console.auth import REFUSED, url_as
from broker.operations.console.figures import Counters, RateMeter
from broker.topics.subscriptions import subscribe

with warnings.catch_warnings():  # Starlette >= 1.x suggests httpx2; httpx is what the test extra installs
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

QM = "TEST"


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


@pytest.fixture
def users(real_server: Server, real_redis: redis.Redis) -> Iterator[dict[str, str]]:
    """ACL users ``ops`` (admin), ``watch`` (monitor) and ``pub`` (publisher), random passwords."""
    made = {name: secrets.token_urlsafe(12) for name in ("ops", "watch", "pub")}
    add_user(real_redis, QM, "ops", RoleSpec("admin"), made["ops"])
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), made["watch"])
    add_user(real_redis, QM, "pub", RoleSpec("publisher", publisher_ids=["p1"]), made["pub"])
    yield made
    for name in made:
        real_redis.execute_command("ACL", "DELUSER", name)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def console(real_server: Server, users: dict[str, str], clock: Clock) -> Iterator[TestClient]:
    settings = Settings(redis_url=real_server.url, qm=QM, console_session_idle_ms=60_000)
    with TestClient(create_app(settings, clock_ms=clock), base_url="http://127.0.0.1") as client:
        yield client


def login(client: TestClient, user: str, password: str) -> str:
    """Log in; returns the session's CSRF token (from the overview page)."""
    answer = client.post("/login", data={"user": user, "password": password}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    page = client.get("/")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def dead_letter(client: redis.Redis, reason: str = "test reason") -> str:
    """Add one dead letter as the workers write them; returns its id."""
    return client.xadd(
        keys.dead_letter(QM),
        {
            "publisher": "p1",
            "topic": "/a",
            "msgid": "m1",
            "body": b"x",
            "dlq.reason": reason,
            "dlq.entry_id": "1-0",
        },
    ).decode()


def test_a_page_without_a_session_redirects_to_the_login_page(console: TestClient) -> None:
    for path in ("/", "/subscriptions", "/topics", "/dlq", "/workers"):
        answer = console.get(path, follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/login?next=")


def test_an_htmx_refresh_without_a_session_sends_the_browser_to_the_login_page(console: TestClient) -> None:
    answer = console.get("/", headers={"HX-Request": "true"}, follow_redirects=False)
    assert answer.headers["HX-Redirect"] == "/login"


def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(
    console: TestClient, users: dict[str, str]
) -> None:
    wrong = console.post("/login", data={"user": "ops", "password": "not-it"}, follow_redirects=False)
    unknown = console.post("/login", data={"user": "nobody", "password": "not-it"}, follow_redirects=False)
    for answer in (wrong, unknown):
        assert answer.status_code == 401
        assert REFUSED in answer.text
        assert COOKIE not in answer.headers.get("set-cookie", "")
    assert wrong.text.replace('value="ops"', "") == unknown.text.replace('value="nobody"', "")


def test_a_user_of_another_role_cannot_log_in(console: TestClient, users: dict[str, str]) -> None:
    answer = console.post("/login", data={"user": "pub", "password": users["pub"]}, follow_redirects=False)
    assert answer.status_code == 401
    assert REFUSED in answer.text


def test_the_session_cookie_is_httponly_and_samesite_strict(
    console: TestClient, users: dict[str, str]
) -> None:
    answer = console.post(
        "/login", data={"user": "watch", "password": users["watch"]}, follow_redirects=False
    )
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert users["watch"] not in cookie


def test_a_monitor_sees_the_pages_but_no_action_buttons(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    dead_letter(real_redis)
    login(console, "watch", users["watch"])
    page = console.get("/dlq")
    assert page.status_code == 200
    assert "test reason" in page.text
    assert 'id="purge"' not in page.text and 'id="replay"' not in page.text
    for path in ("/", "/subscriptions", "/topics", "/workers"):
        assert console.get(path).status_code == 200, path


def test_a_monitor_post_is_refused_with_403_and_nothing_changes(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    dlq_id = dead_letter(real_redis)
    csrf = login(console, "watch", users["watch"])
    for path in ("/dlq/confirm", "/dlq/purge", "/dlq/replay"):
        answer = console.post(path, data={"csrf": csrf, "action": "purge", "id": dlq_id, "scope": "selected"})
        assert answer.status_code == 403, path
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_a_post_with_a_bad_csrf_token_is_refused_with_403(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    dlq_id = dead_letter(real_redis)
    login(console, "ops", users["ops"])
    for token in ("", "forged"):
        answer = console.post("/dlq/confirm", data={"csrf": token, "action": "purge", "id": dlq_id})
        assert answer.status_code == 403
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_a_post_without_a_session_is_refused_with_403(console: TestClient, real_redis: redis.Redis) -> None:
    dead_letter(real_redis)
    answer = console.post("/dlq/purge", data={"token": "x", "csrf": "x"}, follow_redirects=False)
    assert answer.status_code == 403
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_an_admin_purges_only_after_the_confirmation_and_only_once(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    first, second = dead_letter(real_redis, "first"), dead_letter(real_redis, "second")
    csrf = login(console, "ops", users["ops"])
    shown = console.post(
        "/dlq/confirm", data={"csrf": csrf, "action": "purge", "scope": "selected", "id": first}
    )
    assert shown.status_code == 200
    assert 'data-figure="confirm-count">1<' in shown.text
    assert real_redis.xlen(keys.dead_letter(QM)) == 2  # the confirmation page changes nothing
    token = re.search(r'name="token" value="([^"]+)"', shown.text)
    assert token is not None
    done = console.post("/dlq/purge", data={"csrf": csrf, "token": token.group(1)})
    assert done.status_code == 200 and "Purged 1 dead letter(s)." in done.text
    assert [i.decode() for i, _ in real_redis.xrange(keys.dead_letter(QM))] == [second]
    again = console.post("/dlq/purge", data={"csrf": csrf, "token": token.group(1)})
    assert again.status_code == 400
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_a_confirmation_of_a_purge_does_not_run_a_replay(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    dlq_id = dead_letter(real_redis)
    csrf = login(console, "ops", users["ops"])
    shown = console.post("/dlq/confirm", data={"csrf": csrf, "action": "purge", "id": dlq_id})
    token = re.search(r'name="token" value="([^"]+)"', shown.text)
    assert token is not None
    assert console.post("/dlq/replay", data={"csrf": csrf, "token": token.group(1)}).status_code == 400
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    assert real_redis.exists(keys.publish_stream(QM)) == 0


def test_logout_ends_the_session(console: TestClient, users: dict[str, str]) -> None:
    csrf = login(console, "watch", users["watch"])
    assert console.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert console.get("/", follow_redirects=False).status_code == 303


def test_a_session_idle_too_long_is_logged_out(
    console: TestClient, users: dict[str, str], clock: Clock
) -> None:
    login(console, "watch", users["watch"])
    clock.ms += 61_000
    assert console.get("/", follow_redirects=False).status_code == 303


def test_a_deleted_user_is_sent_back_to_the_login_page(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    login(console, "watch", users["watch"])
    real_redis.execute_command("ACL", "DELUSER", "watch")
    assert console.get("/", follow_redirects=False).status_code == 303


def test_the_subscriptions_page_shows_depth_and_filters_rows(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    subscribe(real_redis, QM, "/orders/#", "app", "orders")
    subscribe(real_redis, QM, "/prices/+", "app", "prices", selector="region = 'EU'")
    real_redis.lpush(keys.sub_queue(QM, "app$orders"), b"a", b"b", b"c")
    login(console, "watch", users["watch"])
    page = console.get("/subscriptions").text
    assert re.search(r'data-sub="app\$orders">.*?data-figure="depth">3<', page, re.S)
    assert "region = &#39;EU&#39;" in page
    only = console.get("/subscriptions", params={"q": "prices"}, headers={"HX-Request": "true"}).text
    assert "app$prices" in only and "app$orders" not in only and "<html" not in only


def test_rates_come_from_two_readings() -> None:
    clock = Clock()
    meter = RateMeter(clock)
    assert meter.add(Counters(clock.ms, 100, 90)) == {"published_per_s": None, "handled_per_s": None}
    assert meter.add(Counters(clock.ms + 2_000, 300, 290)) == {
        "published_per_s": 100.0,
        "handled_per_s": 100.0,
    }
    assert meter.add(Counters(clock.ms + 2_100, 0, 0))["published_per_s"] == 100.0  # reset: start again


def test_the_overview_shows_the_publish_rate(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis, real_server: Server, clock: Clock
) -> None:
    login(console, "watch", users["watch"])
    publisher = Publisher(real_redis, QM, publisher_id="p0")
    for n in range(10):
        publisher.publish("/a", f"{n}".encode())
    clock.ms += 1_000
    console.get("/")
    for n in range(20):
        publisher.publish("/a", f"{n}".encode())
    clock.ms += 2_000
    page = console.get("/").text
    assert 'data-figure="published-rate">10.0/s<' in page
    assert 'data-figure="stream-length">30<' in page


def test_url_as_puts_the_credentials_in_the_url() -> None:
    assert url_as("redis://old:pw@h:6379/0", "u", "p@ss") == "redis://u:p%40ss@h:6379/0"
    assert url_as("rediss+cluster://h:7000", "u", "p") == "rediss+cluster://u:p@h:7000"


def test_a_security_true_server_with_the_default_user_off(tmp_path) -> None:
    # Given a server whose default user is off (security = true's ACL file) and a monitor user
    acl = tmp_path / "users.acl"
    acl.write_text(admin_acl_file("boss", "boss-secret"))
    server = Server(args=(*EPHEMERAL, "--aclfile", str(acl)))
    server.username, server.password = "boss", "boss-secret"
    server.start()
    try:
        boss = connect(url_as(server.url, "boss", "boss-secret"))
        add_user(boss, QM, "watch", RoleSpec("monitor"), "watch-secret")
        subscribe(boss, QM, "/a/#", "app", "a")
        settings = Settings(redis_url=url_as(server.url, "boss", "boss-secret"), qm=QM, security=True)
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            # When the monitor logs in, Then it sees the figures; the default user cannot log in
            refused = client.post("/login", data={"user": "default", "password": "x"}, follow_redirects=False)
            assert refused.status_code == 401
            login(client, "watch", "watch-secret")
            assert 'data-sub="app$a"' in client.get("/subscriptions").text
        boss.close()
    finally:
        server.stop()


def test_a_session_ends_when_its_users_password_is_rotated_with_drop_old(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    # Given an admin logged in, and a dead letter
    dlq_id = dead_letter(real_redis)
    csrf = login(console, "ops", users["ops"])
    # When its password is rotated keeping the old one, the session goes on
    rotate(real_redis, "ops", "second-" + users["ops"], keep_old=True)
    assert console.get("/", follow_redirects=False).status_code == 200
    # When it is rotated again with --drop-old (the session's password no longer valid)
    rotate(real_redis, "ops", "third-" + users["ops"], keep_old=False)
    # Then the next page sends it to the login page, and a purge with the old session is refused
    assert console.get("/", follow_redirects=False).status_code == 303
    answer = console.post(
        "/dlq/confirm", data={"csrf": csrf, "action": "purge", "scope": "selected", "id": dlq_id}
    )
    assert answer.status_code == 403
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_a_session_ends_when_its_users_role_changes_and_a_downgraded_user_sees_no_admin_buttons(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    # Given an admin logged in, who sees the purge button
    dead_letter(real_redis)
    login(console, "ops", users["ops"])
    assert 'id="purge"' in console.get("/dlq").text
    # When it is made a monitor (same password)
    add_user(real_redis, QM, "ops", RoleSpec("monitor"), users["ops"])
    # Then its session ends: the next page (and an htmx refresh) go to the login page
    assert (
        console.get("/dlq", headers={"HX-Request": "true"}, follow_redirects=False).headers["HX-Redirect"]
        == "/login"
    )
    assert console.get("/dlq", follow_redirects=False).status_code == 303
    # ... and logged in again, it is a monitor: no admin buttons
    login(console, "ops", users["ops"])
    page = console.get("/dlq")
    assert page.status_code == 200 and 'id="purge"' not in page.text and 'id="replay"' not in page.text
