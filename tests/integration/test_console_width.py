"""No console page is wider than the window (issue 29: the dead-letter page was 38,692 px wide with
one long topic): Playwright and Debian's headless chromium at 1,280 px, against a real server
holding long values on every page (a topic, a reason, a publisher id, a subscription, a worker)."""

from __future__ import annotations

import json
from typing import Any

import redis

from broker.core import keys
from broker.core.config import Settings
from broker.core.server import Server
from broker.topics.subscriptions import subscribe
from tests.integration import test_console as browser_tests

# a browser and the console's users, as test_console makes them (fixtures)
browser, passwords = browser_tests.browser, browser_tests.passwords
OUTPUT, QM, ConsoleServer = browser_tests.OUTPUT, browser_tests.QM, browser_tests.ConsoleServer
log_in, shot = browser_tests.log_in, browser_tests.shot

WINDOW_PX = 1_280
LONG = "segment" * 700  # one word of 4,900 characters: nowhere to break it


def test_no_console_page_is_wider_than_a_1280_px_window_with_long_values(
    real_server: Server, real_redis: redis.Redis, passwords: dict[str, str], browser: Any
) -> None:
    # Given long values everywhere the console shows one
    OUTPUT.mkdir(parents=True, exist_ok=True)
    subscribe(real_redis, QM, f"/{LONG[:3_000]}/#", "shop", "orders")
    dlq_id = real_redis.xadd(
        keys.dead_letter(QM),
        {
            "publisher": f"p-{LONG[:200]}",
            "topic": f"/{LONG}",
            "msgid": LONG[:300],
            "body": LONG.encode(),
            "dlq.reason": f"topic '/{LONG}' is over the limit (max_topic_bytes 1024)",
            "dlq.entry_id": "1-0",
        },
    ).decode()
    real_redis.hset(
        keys.workers(QM), f"w-{LONG[:400]}", json.dumps({"pid": 1, "processed": 0, "heartbeat_ms": 0})
    )
    settings = Settings(redis_url=real_server.url, qm=QM)
    with ConsoleServer(settings) as console:
        page = log_in(browser, console.url, "ops", passwords["ops"])
        # When every page is shown in a 1,280 px window
        widths = {}
        for path in (
            "/",
            "/subscriptions",
            f"/topics?topic=/{LONG}",
            "/dlq",
            f"/dlq/entry/{dlq_id}",
            "/workers",
        ):
            page.goto(f"{console.url}{path}")
            page.wait_for_load_state("networkidle")
            widths[path.split("?")[0]] = page.evaluate("document.documentElement.scrollWidth")
        shot(page, "workers-long-values")
        page.goto(f"{console.url}/dlq")
        shot(page, "dlq-long-values")
    # Then none is wider than the window: long values wrap (or are cut with a tooltip)
    assert all(width <= WINDOW_PX for width in widths.values()), widths
