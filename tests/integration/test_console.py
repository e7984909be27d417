"""The web console in a real browser: Playwright driving Debian's headless chromium against a
real server, a real worker pool (``worker.pool.Pool``) and the console served by uvicorn.

Checks the pages load with real figures, a dead-lettered publication is replayed from the
page (through its confirmation) and reaches its subscriber exactly once, and a ``monitor``
login cannot purge. Screenshots of each page go to ``build/test-output/console/<page>.png``.
The auth rules in detail are ``test_console_app.py`` (Starlette's TestClient).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn

from broker import testing
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.server import Server, free_port
from broker.operations.acl import RoleSpec, add_user
from broker.operations.console import create_app
from broker.operations.status import status
from broker.testing import queue_messages
from broker.topics.subscriptions import subscribe
from broker.topics.topic_objects import Attributes, alter, define
from worker.pool import Pool

QM = "TEST"
CHROMIUM = "/usr/bin/chromium"
#: Without these, chromium on a machine with no network stalls (update checks, QUIC, sync).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = Path(__file__).resolve().parents[2] / "build" / "test-output" / "console"
#: How long a condition may take to hold (workers starting, live refresh), seconds.
DEADLINE_S = 20


def _need_chromium() -> None:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing (.ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (CI installs it)")


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it is true, for at most ``DEADLINE_S``; returns its value."""
    return testing.wait_for(condition, DEADLINE_S, what)


class ConsoleServer:
    """The console app served by uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ConsoleServer:
        self.thread.start()
        wait_for(lambda: self.server.started, "the console to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def passwords(real_redis: redis.Redis) -> Iterator[dict[str, str]]:
    made = {"ops": secrets.token_urlsafe(12), "watch": secrets.token_urlsafe(12)}
    add_user(real_redis, QM, "ops", RoleSpec("admin"), made["ops"])
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), made["watch"])
    yield made
    for name in made:
        real_redis.execute_command("ACL", "DELUSER", name)


@pytest.fixture
def browser() -> Iterator[Any]:
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def log_in(browser: Any, base: str, user: str, password: str) -> Any:
    """A new browser context logged in as ``user``; returns its page (on the overview)."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(DEADLINE_S * 1000)
    page.goto(f"{base}/")
    assert "/login" in page.url  # no session: the login page
    page.fill("input[name=user]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    return page


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(OUTPUT / f"{name}.png"), full_page=True)


def test_console_pages_replay_from_the_page_and_a_monitor_cannot_purge(
    real_server: Server, real_redis: redis.Redis, passwords: dict[str, str], browser: Any
) -> None:
    from playwright.sync_api import expect

    OUTPUT.mkdir(parents=True, exist_ok=True)
    settings = Settings(redis_url=real_server.url, qm=QM, concurrency=2, block_ms=100, sweep_interval_ms=100)

    # Given a subscription nobody consumes, one whose topic's object disables publishing,
    # and a worker pool handling 25 publications and one refused (dead-lettered) one
    subscribe(real_redis, QM, "/orders/#", "shop", "orders")
    subscribe(real_redis, QM, "/pay/#", "bank", "pay")
    define(real_redis, QM, "PAYMENTS", "/pay", Attributes(pub="DISABLED"))
    pool = Pool(settings, daemon=True)
    pool.start()
    try:
        publisher = Publisher(real_redis, QM, "shop-1")
        for n in range(25):
            publisher.publish(f"/orders/{n % 3}", f"order {n}".encode())
        Publisher(real_redis, QM, "bank-1").publish("/pay/eu", b"payment 1", msgid="pay-1")
        wait_for(lambda: real_redis.xlen(keys.dead_letter(QM)) == 1, "the refused publication's dead letter")
        wait_for(lambda: status(real_redis, QM).subscriptions[1].depth == 25, "25 deliveries")

        with ConsoleServer(settings) as console:
            base = console.url
            # When an admin looks at every page
            admin = log_in(browser, base, "ops", passwords["ops"])
            expect(admin.locator("[data-figure=stream-length]")).to_have_text("26")
            expect(admin.locator("[data-figure=lag]")).to_have_text("0")
            expect(admin.locator("[data-figure=workers]")).to_have_text("2 / 2")  # heartbeats of both
            expect(admin.locator("[data-figure=dead-lettered]")).to_have_text("1")
            expect(admin.locator("[data-figure=published-rate]")).to_have_text(
                re.compile(r"/s$")
            )  # 2nd reading
            expect(admin.locator("[data-figure=memory]")).to_contain_text("iB")
            shot(admin, "overview")

            admin.goto(f"{base}/subscriptions")
            orders = admin.locator("tr[data-sub='shop$orders']")
            expect(orders.locator("[data-figure=depth]")).to_have_text("25")
            expect(orders).to_contain_text("/orders/#")
            expect(orders).to_contain_text("exclusive")
            shot(admin, "subscriptions")

            admin.goto(f"{base}/topics?topic=/pay/eu")
            pay = admin.locator("tr[data-topic='/pay']")
            expect(pay).to_contain_text("PAYMENTS")
            expect(pay).to_contain_text("PUB(DISABLED)")
            expect(admin.locator("tr[data-topic='/orders/#'] td.num")).to_have_text("1")  # its subscription
            expect(admin.locator("#topic-status")).to_contain_text("bank$pay")
            shot(admin, "topics")

            admin.goto(f"{base}/workers")
            expect(admin.locator("#workers tbody tr")).to_have_count(2)
            shot(admin, "workers")

            # And a monitor: it sees the dead letter, has no purge button, and a forged purge is refused
            monitor = log_in(browser, base, "watch", passwords["watch"])
            monitor.goto(f"{base}/dlq")
            expect(monitor.locator("#dead-letters")).to_contain_text("PUB(DISABLED)")
            expect(monitor.locator("#purge")).to_have_count(0)
            expect(monitor.locator("#replay")).to_have_count(0)
            shot(monitor, "dlq-monitor")
            csrf = monitor.locator("header input[name=csrf]").get_attribute("value")
            dlq_id = monitor.locator("#dead-letters tbody tr").first.get_attribute("data-dlq")
            for path in ("/dlq/confirm", "/dlq/purge"):
                forged = monitor.request.post(
                    f"{base}{path}",
                    form={"csrf": csrf, "action": "purge", "scope": "matching", "id": dlq_id},
                )
                assert forged.status == 403, path
            assert real_redis.xlen(keys.dead_letter(QM)) == 1

            # When the topic is enabled again and the admin replays the dead letter from the page
            alter(real_redis, QM, "PAYMENTS", pub="ENABLED")
            admin.goto(f"{base}/dlq")
            expect(admin.locator("[data-figure=dlq-total]")).to_have_text("1")
            shot(admin, "dlq")
            admin.click(f"tr[data-dlq='{dlq_id}'] a")
            expect(admin.locator("h1")).to_contain_text(dlq_id)
            shot(admin, "dlq-entry")
            admin.go_back()
            admin.check(f"tr[data-dlq='{dlq_id}'] input[type=checkbox]")
            admin.click("#replay")
            expect(admin.locator("[data-figure=confirm-count]")).to_have_text("1")
            assert real_redis.xlen(keys.dead_letter(QM)) == 1  # nothing done before the answer
            shot(admin, "confirm-replay")
            admin.click("#confirm")
            expect(admin.locator(".flash")).to_contain_text("Replayed 1 dead letter(s)")

            # Then it reaches its subscriber, once, and leaves the dead-letter queue
            wait_for(lambda: status(real_redis, QM).subscriptions[0].depth == 1, "the replayed delivery")
            wait_for(lambda: status(real_redis, QM).lag == 0 and status(real_redis, QM).pending == 0, "idle")
            assert real_redis.xlen(keys.dead_letter(QM)) == 0
            got = queue_messages(real_redis, QM, "bank$pay")
            assert [(m.msgid, m.body) for m in got] == [("pay-1", b"payment 1")]
            expect(admin.locator("[data-figure=dlq-total]")).to_have_text("0")  # the live refresh
            admin.goto(f"{base}/")
            expect(admin.locator("[data-figure=stream-length]")).to_have_text("27")
    finally:
        pool.stop()
