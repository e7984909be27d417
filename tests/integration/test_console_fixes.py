"""The console's "Wrong" list of issue 29, through Starlette's TestClient against the real server:
dead letters grouped by reason code (kind), not by text, and a heartbeat of 0 shown as "never".
(No page wider than the window: ``test_console_width.py``, in a browser.)"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import redis

from broker.core import keys
from broker.operations.status import status
from tests.integration import test_console_app as app_tests

# the console and its users, as test_console_app makes them (fixtures)
clock, console, users = app_tests.clock, app_tests.console, app_tests.users
dead_letter, login = app_tests.dead_letter, app_tests.login

if TYPE_CHECKING:
    from starlette.testclient import TestClient


def test_by_reason_groups_dead_letters_by_kind_and_a_kind_filters_the_list(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    # Given two refusals of one kind with different sizes in their text, and one of another kind
    big = dead_letter(real_redis, "body of 2000 bytes is over the limit of 1000 bytes (max_body_bytes)")
    bigger = dead_letter(real_redis, "body of 5000 bytes is over the limit of 1000 bytes (max_body_bytes)")
    full = dead_letter(real_redis, "subscriber queue app$a is full (MAXDEPTH 5)")
    login(console, "watch", users["watch"])
    # When the dead-letter page is shown
    page = console.get("/dlq").text
    # Then "By reason" has one row per kind, counted
    kinds = re.findall(r'data-kind="([^"]+)">[^<]*</a> <b>(\d+)</b>', page)
    assert sorted(kinds) == [("over_limit", "2"), ("queue_full", "1")]
    # and a kind's link lists its dead letters only
    listed = console.get("/dlq?kind=over_limit").text
    assert f'data-dlq="{big}"' in listed and f'data-dlq="{bigger}"' in listed
    assert f'data-dlq="{full}"' not in listed


def test_a_heartbeat_of_0_shows_as_never(
    console: TestClient, users: dict[str, str], real_redis: redis.Redis
) -> None:
    # Given a worker record whose heartbeat time is 0 (never written), and one just written
    real_redis.hset(keys.workers("TEST"), "w-zero", json.dumps({"pid": 1, "processed": 0, "heartbeat_ms": 0}))
    login(console, "watch", users["watch"])
    # When the workers page is shown
    page = console.get("/workers").text
    # Then it says "never", not an age since the epoch, and the worker is silent
    row = re.search(r"<tr><td>.*?w-zero.*?</tr>", page, re.S)
    assert row is not None
    assert 'data-figure="heartbeat">never<' in row.group(0)
    assert "s ago" not in row.group(0) and "silent" in row.group(0)
    # and so does the snapshot `broker status` prints (its age: none)
    (zero,) = [w for w in status(real_redis, "TEST").workers if w.name == "w-zero"]
    assert (zero.heartbeat_age_ms, zero.state) == (None, "silent")
