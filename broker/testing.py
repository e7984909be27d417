"""Fixtures for a user's own test suite: a real server, in-process workers, a subscriber that collects.

Nothing here is a fake: ``start_server`` runs the embedded Valkey (or
``$BROKER_REDIS_SERVER_BIN``) on a free port, the workers are the broker's own
``worker.loop.Worker`` run in the test's process, round by round (``drain``), so
nothing in a test depends on timing. The broker's own suite and the chaos harness
use the same helpers.

Without pytest: ``start_server``, ``make_workers``, ``drain``, ``Collector`` and the
rest are plain functions and classes. With pytest, enable the fixtures in a
``conftest.py`` with ``pytest_plugins = ["broker.testing"]``:

- ``broker_server``: one server for the session;
- ``broker_client``: a client on it, the database emptied before and after each test;
- ``broker_settings``: the settings of queue manager ``TEST`` on that server;
- ``broker_workers``: two in-process workers (``drain(broker_workers)`` runs them);
- ``broker_collector``: a factory ``(topic_filter) -> Collector``, closed after the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import redis

from broker.clients.consumer import Delivery, Subscriber
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.models import Message
from broker.core.server import Server
from broker.topics.subscriptions import subscribe

if TYPE_CHECKING:  # the workers are imported when made: ``broker`` does not import ``worker`` at import
    from worker.loop import Worker

#: the queue manager of the fixtures' settings
QM = "TEST"


def start_server() -> Server:
    """Start a throwaway in-memory server: ``$BROKER_REDIS_SERVER_BIN`` or the embedded Valkey."""
    return Server().start()


def make_workers(client: redis.Redis, settings: Settings, count: int) -> list[Worker]:
    """``count`` in-process workers named ``w0``.. with the group created and the table loaded.

    Nothing runs until the test calls ``drain`` (or ``run_once`` on one): a test decides when
    publications are handled.
    """
    from worker.loop import Worker

    workers = [Worker(client, settings, name=f"w{i}") for i in range(count)]
    for worker in workers:
        worker.setup()
    return workers


def drain(workers: Iterable[Worker], max_rounds: int = 100_000) -> int:
    """Run the workers round-robin, one ``run_once`` each, until a full round does nothing (commits
    nothing, holds no turn, waits for none (``Worker.following``), moves no publication in or out of
    the delayed set ``{qm}:delayed``).

    Args:
        workers: in-process workers.
        max_rounds: give up after this many rounds.

    Returns:
        How many publications were committed.

    Raises:
        AssertionError: still busy after ``max_rounds`` rounds.
    """
    pool = list(workers)
    total = 0
    for _ in range(max_rounds):
        done = sum(w.run_once(block=False) for w in pool)
        total += done
        if done == 0 and not any(w.turns or w.following or w.delays.moved for w in pool):
            return total
    raise AssertionError(f"workers still busy after {max_rounds} rounds")


def library_functions(client: redis.Redis) -> dict[str, list[bytes]]:
    """Function name -> flags of the function library ``broker`` on the server (FUNCTION LIST)."""
    (library,) = client.function_list(library="broker")
    fields = dict(zip(library[::2], library[1::2], strict=True))
    out = {}
    for function in fields[b"functions"]:
        entry = dict(zip(function[::2], function[1::2], strict=True))
        out[entry[b"name"].decode()] = entry[b"flags"]
    return out


def work_while(worker: Worker, publish: Callable[[], None]) -> None:
    """Run ``publish`` (which waits for results) in a thread while ``worker`` handles rounds, until it returns.

    The worker blocks on the stream until the publisher's entry arrives, so nothing waits on timing.
    """
    thread = threading.Thread(target=publish)
    thread.start()
    while thread.is_alive():
        worker.run_once(block=True)
        thread.join(timeout=0)
    thread.join()


class FakeTime:
    """A clock in ms that moves only when someone sleeps (or a test moves ``now``); records every sleep.

    For the injectable ``clock_ms``/``sleep_ms`` of publishers (flow control): no test really sleeps.
    """

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, ms: float) -> None:
        self.slept.append(ms)
        self.now += ms


def queue_messages(client: redis.Redis, qm: str, sub_id: str) -> list[Message]:
    """Every message in a subscriber queue in the order a consumer takes them, without consuming them.

    Args:
        client: a client with ``decode_responses=False`` (envelopes are bytes).
        qm: the queue manager.
        sub_id: the subscription id (``SubscriptionRecord.sub_id``).
    """
    out = []
    for band in keys.sub_bands(qm, sub_id):  # highest priority first, as a consumer takes them
        envelopes = cast("list[bytes]", client.lrange(band, 0, -1))
        out += [Message.from_envelope(item) for item in reversed(envelopes)]
    return out


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` (not a fixed sleep) until it returns something true, and return that.

    Raises:
        AssertionError: ``what`` was not met within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval_s)


class Collector:
    """A subscriber that collects: subscribes to a filter, then takes and acknowledges what arrived.

    Args:
        client: a redis-py client (``decode_responses=False``, as ``connect`` makes).
        settings: the queue manager's settings (``qm`` and the consumer's).
        topic_filter: an MQTT-style filter (``+`` one level, ``#`` the rest).
        client_id: the subscriber's client id.
        selector: a message selector (Jakarta Messaging §3.8), or None.

    Attributes:
        messages: every message collected so far, in the order taken (highest priority first,
            per-publisher order within a priority).

    Raises:
        InvalidTopicFilter: a bad filter; InvalidSelector: a bad selector (from ``subscribe``).
    """

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        topic_filter: str,
        client_id: str = "collector",
        selector: str | None = None,
    ) -> None:
        self.record = subscribe(
            client, settings.qm, topic_filter, client_id, selector=selector, settings=settings
        )
        self.subscriber = Subscriber(client, settings.qm, self.record, settings, heartbeat=False)
        self.messages: list[Message] = []

    def collect(self, timeout_ms: int = 0, batch: int = 500) -> list[Message]:
        """Take and acknowledge every message waiting now; returns them (and keeps them in ``messages``).

        Args:
            timeout_ms: wait up to this long (ms) for the first message when none waits; 0: do not wait.
            batch: messages per take.
        """
        got: list[Delivery] = self.subscriber.receive_many(batch, timeout_ms=timeout_ms)
        out: list[Message] = []
        while got:
            out += [d.message for d in got]
            self.subscriber.ack_many(got)
            got = self.subscriber.receive_many(batch)
        self.messages += out
        return out

    @property
    def bodies(self) -> list[bytes]:
        """The bodies of ``messages``, in order."""
        return [m.body for m in self.messages]

    def close(self) -> None:
        """Detach the consumer (the subscription stays, as a JMS consumer's close leaves it)."""
        self.subscriber.close()


try:
    import pytest
except ImportError:  # pragma: no cover - the helpers above work without pytest
    pass
else:

    @pytest.fixture(scope="session")
    def broker_server() -> Iterator[Server]:
        """One real server (the embedded Valkey) for the test session, stopped at the end."""
        server = start_server()
        yield server
        server.stop()

    @pytest.fixture
    def broker_client(broker_server: Server) -> Iterator[redis.Redis]:
        """A client on ``broker_server``; the database is emptied before and after each test."""
        client = connect(broker_server.url)
        client.flushall()
        yield client
        client.flushall()
        client.close()

    @pytest.fixture
    def broker_settings(broker_server: Server) -> Settings:
        """The settings of queue manager ``TEST`` on ``broker_server`` (leases long enough for a debugger)."""
        return Settings(redis_url=broker_server.url, qm=QM, lease_ms=30_000)

    @pytest.fixture
    def broker_workers(broker_client: redis.Redis, broker_settings: Settings) -> list[Worker]:
        """Two in-process workers on ``broker_settings``; ``drain(broker_workers)`` handles what was published."""
        return make_workers(broker_client, broker_settings, 2)

    @pytest.fixture
    def broker_collector(
        broker_client: redis.Redis, broker_settings: Settings
    ) -> Iterator[Callable[..., Collector]]:
        """A factory ``(topic_filter, client_id="collector", selector=None) -> Collector``; each is closed after the test."""
        made: list[Collector] = []

        def make(topic_filter: str, client_id: str = "collector", selector: str | None = None) -> Collector:
            collector = Collector(broker_client, broker_settings, topic_filter, client_id, selector)
            made.append(collector)
            return collector

        yield make
        for collector in made:
            collector.close()
