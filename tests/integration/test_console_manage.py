"""The console's managing pages in a real browser (issue 29's "Done when"): Playwright driving
Debian's headless chromium against a real server and the console served by uvicorn.

A monitor and an admin log in; the admin creates a subscription from the form, publishes to it
from the publish form, gets the message from the subscription page, purges it, grants and
revokes a filter, exports the
definitions and imports them into an empty queue manager (its own console); the monitor sees
no button that writes and its forged purge is refused. No page visited is wider than the
1,280 px window, a subscription's page with long values included. Screenshots go to ``build/test-output/console/manage-<page>.png`` (git-ignored;
``.ci/run`` prints the directory).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.server import Server
from broker.operations.acl import RoleSpec, add_user
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages
from broker.topics.subscriptions import read_subscriptions, subscribe
from tests.integration.test_console import (
    CHROMIUM,
    CHROMIUM_ARGS,
    OUTPUT,
    ConsoleServer,
    _need_chromium,
    log_in,
)

QM = "TEST"
EMPTY = "EMPTY"
#: The window's width; no page may be wider.
WIDTH = 1280


@pytest.fixture
def users(real_redis: redis.Redis) -> Iterator[dict[str, str]]:
    """An admin and a monitor of ``QM``, and an admin of the empty queue manager ``EMPTY``."""
    made = {name: secrets.token_urlsafe(12) for name in ("ops", "watch", "ops2")}
    add_user(real_redis, QM, "ops", RoleSpec("admin"), made["ops"])
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), made["watch"])
    add_user(real_redis, EMPTY, "ops2", RoleSpec("admin"), made["ops2"])
    yield made
    for name in made:
        real_redis.execute_command("ACL", "DELUSER", name)


@pytest.fixture
def chromium() -> Iterator[Any]:
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def visit(page: Any, url: str, name: str) -> None:
    """Go to ``url``, check the page is no wider than the window, keep a screenshot."""
    page.goto(url)
    fits(page, name)


def fits(page: Any, name: str) -> None:
    page.wait_for_load_state("load")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= WIDTH, f"{name}: {width} px wide"
    page.screenshot(path=str(OUTPUT / f"manage-{name}.png"), full_page=True)


def test_an_admin_subscribes_publishes_gets_purges_and_moves_the_definitions_and_a_monitor_only_looks(
    real_server: Server, real_redis: redis.Redis, users: dict[str, str], chromium: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    OUTPUT.mkdir(parents=True, exist_ok=True)
    settings = Settings(redis_url=real_server.url, qm=QM)
    with (
        ConsoleServer(settings) as console,
        ConsoleServer(settings.model_copy(update={"qm": EMPTY})) as empty,
    ):
        base = console.url
        # Given an admin on the overview: its charts are drawn from the console's own samples
        admin = log_in(chromium, base, "ops", users["ops"])
        admin.on("dialog", lambda dialog: dialog.accept())  # the confirmations of purge and delete
        expect(admin.locator("#charts canvas")).to_have_count(4)
        fits(admin, "overview")
        assert admin.request.get(f"{base}/favicon.ico").ok

        # When it creates a subscription from the form
        visit(admin, f"{base}/manage", "manage")
        admin.fill("#subscribe input[name=sub_id]", "shop$orders")
        admin.fill("#subscribe input[name=filter]", "/orders/#")
        admin.click("#subscribe button[type=submit]")
        admin.wait_for_load_state("load")
        expect(admin.locator("#subscribe output")).to_have_text("")  # the page was reloaded
        assert [r.sub_id for r in read_subscriptions(real_redis, QM)[0]] == ["shop$orders"]

        # And publishes to it from the publish form
        visit(admin, f"{base}/publish", "publish")
        admin.fill("#publish input[name=topic]", "/orders/eu")
        admin.fill("#publish textarea[name=body]", "order 1")
        admin.fill("#publish textarea[name=properties]", '{"region": "eu"}')
        admin.click("#publish button[type=submit]")
        expect(admin.locator("#publish output")).to_contain_text("202")
        drain(make_workers(real_redis, settings, 1))

        # Then it gets the message from the subscription's page, and it stays in the queue
        visit(admin, f"{base}/subscriptions", "subscriptions")
        admin.click("tr[data-sub='shop$orders'] a")
        expect(admin.locator("#sub-id")).to_have_text("shop$orders")
        expect(admin.locator("[data-figure=depth]")).to_have_text("1")
        admin.click("#browse button[type=submit]")
        expect(admin.locator("#messages .message-body")).to_have_text("order 1")
        expect(admin.locator("#messages")).to_contain_text('"region":"eu"')
        fits(admin, "subscription")
        assert status(real_redis, QM).subscriptions[0].depth == 1

        # And a monitor sees the page and gets the message, with no button that writes; its forged
        # purge is refused and nothing is purged
        monitor = log_in(chromium, base, "watch", users["watch"])
        visit(monitor, f"{base}/subscriptions/shop%24orders", "subscription-monitor")
        monitor.click("#browse button[type=submit]")
        expect(monitor.locator("#messages .message-body")).to_have_text("order 1")
        expect(monitor.locator("#purge")).to_have_count(0)
        expect(monitor.locator("#delete")).to_have_count(0)
        csrf = monitor.locator("meta[name=csrf-token]").get_attribute("content")
        forged = monitor.request.delete(
            f"{base}/api/subscriptions/shop$orders/contents", headers={"X-CSRF-Token": csrf}
        )
        assert forged.status == 403
        visit(monitor, f"{base}/publish", "publish-monitor")
        expect(monitor.locator("#publish")).to_have_count(0)
        visit(monitor, f"{base}/manage", "manage-monitor")
        expect(monitor.locator("form.api")).to_have_count(0)
        expect(monitor.locator("tr[data-user=watch]")).to_contain_text("monitor")
        assert len(queue_messages(real_redis, QM, "shop$orders")) == 1

        # When the admin purges it from the subscription's page, the queue is empty
        admin.click("#purge button[type=submit]")
        expect(admin.locator("[data-figure=depth]")).to_have_text("0")
        assert queue_messages(real_redis, QM, "shop$orders") == []

        # And it grants the monitor a filter from the form, and revokes it
        visit(admin, f"{base}/manage", "manage-after")
        admin.fill("#grant input[name=user]", "watch")
        admin.fill("#grant input[name=subscribe]", "/orders/#, /pay/#")
        admin.click("#grant button[type=submit]")
        expect(admin.locator("tr[data-user=watch]")).to_contain_text("subscribe: /orders/#, /pay/#")
        admin.fill("#revoke input[name=user]", "watch")
        admin.check("#revoke input[name=all]")
        admin.click("#revoke button[type=submit]")
        expect(admin.locator("tr[data-user=watch]")).not_to_contain_text("subscribe:")

        # And it exports the definitions, and imports them into an empty queue manager
        with admin.expect_download() as download:
            admin.click("#export")
        exported = tmp_path / "definitions.json"
        download.value.save_as(str(exported))
        document = json.loads(exported.read_text())
        assert [s["id"] for s in document["subscriptions"]] == ["shop$orders"]
        assert not any(p in exported.read_text() for p in users.values())
        assert not list(real_redis.scan_iter(match=keys.all_keys_pattern(EMPTY) + "sub*"))
        other = log_in(chromium, empty.url, "ops2", users["ops2"])
        visit(other, f"{empty.url}/manage", "manage-empty")
        other.set_input_files("#import input[type=file]", str(exported))
        expect(other.locator("#definitions-text")).to_have_value(exported.read_text())
        # the document names users EMPTY lacks: an admin may not make ACL users, so it is refused whole
        other.click("#import button[type=submit]")
        expect(other.locator("#import output")).to_contain_text(
            "403: definitions refused, nothing was written"
        )
        assert not list(real_redis.scan_iter(match=keys.all_keys_pattern(EMPTY) + "sub*"))
        # and with "skip the users" the rest is imported, each user left out named with its command
        other.check("#import input[name=skip_users]")
        other.click("#import button[type=submit]")
        expect(other.locator("#import output")).to_contain_text(
            "broker --qm EMPTY acl add watch --role monitor"
        )
        imported = read_subscriptions(real_redis, EMPTY)[0]
        assert [(r.sub_id, r.shown_filter) for r in imported] == [("shop$orders", "/orders/#")]
        visit(other, f"{empty.url}/subscriptions", "subscriptions-empty")
        expect(other.locator("tr[data-sub='shop$orders']")).to_have_count(1)

        # And every other page fits the window too
        for path in ("/", "/topics", "/dlq", "/workers"):
            visit(admin, f"{base}{path}", f"admin{path.replace('/', '-') or '-'}")

        # And a subscription's page with long values (id, filter, selector, a message) fits too
        long_topic = "/".join(f"segment{n:02}" for n in range(30))
        long_id = "app$" + "x" * 120
        subscribe(real_redis, QM, long_topic, "app", "x" * 120, selector=f"region = '{'e' * 300}'")
        Publisher(real_redis, QM, "p1").publish(long_topic, "B" * 3000, properties={"region": "e" * 300})
        drain(make_workers(real_redis, settings, 1))
        visit(admin, f"{base}/subscriptions/{quote(long_id)}", "subscription-long")
        admin.click("#browse button[type=submit]")
        expect(admin.locator("#messages .message-body")).to_have_text("B" * 3000)
        fits(admin, "subscription-long-messages")
