"""Delivery counting (``max_deliveries``): only the entry workers die on is charged for their deaths.

Issue 24. A worker that dies while it holds the turns of several publishers cannot say
which head killed it, so every head it held is charged a delivery when it is taken
over. Once one of them is a suspect, a round handles exactly one suspect alone
(``worker.loop``): a death in that round is charged to that entry alone, so a poison
entry is dead-lettered after ``max_deliveries`` and the healthy ones held beside it
never are. A worker that waits (a foreign queue-manager-wide key) without dying is
charged nothing.

Deaths are simulated in-process: a worker raises ``Died`` (not an ``Exception``, so
nothing in the worker catches it) while it builds the unit of work of the poison
entry, its turns' leases are made to run out, and a fresh worker (a new name, as a
restarted process has) takes over.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

import worker.decide as worker_decide
import worker.loop as worker_loop
from broker import Publisher, subscribe
from broker.core import keys
from broker.core.config import Settings
from broker.core.errors import ForeignKey
from broker.testing import drain
from scripts.rig.history import History, Poison, Publication, check_queues
from worker.loop import Worker

QM = "TEST"

FILTERS = {"all": "#", "exact": "/a/x"}
HEALTHY = [f"hx{i}" for i in range(1, 9)]
POISON_MSGID = "kills"


class Died(BaseException):
    """A worker's death (simulated in-process: SIGKILL, OOM, a crash in a C extension)."""


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers die (``Died``) as they handle the entry whose msgid is ``kills``; dead-lettering it
    does not handle it, so that does not kill them."""
    real_parse = worker_decide.parse_entry

    def parse(entry_id, fields, *limits):  # type: ignore[no-untyped-def]
        if fields.get(b"msgid") == POISON_MSGID.encode():
            raise Died(entry_id)
        return real_parse(entry_id, fields, *limits)

    monkeypatch.setattr(worker_decide, "parse_entry", parse)


class Healthy:
    """Subscriptions and the healthy publications made, for the final check."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.filters = {
            subscribe(client, QM, flt, "poison", name).sub_id: flt for name, flt in FILTERS.items()
        }
        self.published: dict[str, list[tuple[str, str]]] = {}

    def publish(self, publisher: str, count: int = 1) -> None:
        items = self.published.setdefault(publisher, [])
        pub = Publisher(self.client, QM, publisher, first_seq=len(items) + 1)
        for _ in range(count):
            msgid = f"{publisher}.{len(items) + 1}"
            pub.publish("/a/x", msgid.encode(), msgid=msgid)
            items.append((msgid, "/a/x"))

    def assert_delivered_once_in_order(self) -> None:
        assert check_queues(self.client, QM, self.filters, [], self.published) == []
        assert int(self.client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"]) == 0


def _xadd_poison(client: redis.Redis, publisher: str = "poison4") -> str:
    fields = {"publisher": publisher, "topic": "/a/x", "msgid": POISON_MSGID, "body": b"x"}
    return client.xadd(keys.publish_stream(QM), fields).decode()


def _expire_turns_of(client: redis.Redis, token: str) -> None:
    """The dead worker's leases run out (as ``lease_ms`` after its death): its turns are free."""
    for key in client.scan_iter(match=keys.turn_key(QM, "*")):
        if client.get(key) == token.encode():
            client.delete(key)


def _run_with_deaths(client: redis.Redis, settings: Settings, count: int, max_rounds: int = 2_000) -> int:
    """Run ``count`` workers round-robin until nothing is left; a worker that dies is replaced by a
    fresh one (a new name) once its leases ran out. Returns the number of deaths."""
    made = 0

    def fresh() -> Worker:
        nonlocal made
        worker = Worker(client, settings, name=f"w{made}")
        made += 1
        worker.setup()
        return worker

    pool = [fresh() for _ in range(count)]
    deaths = 0
    for _ in range(max_rounds):
        busy = False
        for i, worker in enumerate(pool):
            try:
                busy = worker.run_once(block=False) > 0 or busy
            except Died:
                deaths += 1
                busy = True
                _expire_turns_of(client, worker.name)
                pool[i] = fresh()
        if not busy and not any(w.turns for w in pool):
            return deaths
    raise AssertionError(f"still busy after {max_rounds} rounds ({deaths} deaths)")


def _dead_letters(client: redis.Redis) -> list[tuple[str, str]]:
    return [
        (f[b"dlq.entry_id"].decode(), f[b"dlq.reason"].decode())
        for _, f in client.xrange(keys.dead_letter(QM))
    ]


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("order", ["poison_first", "poison_last"])
def test_a_poison_entry_is_dead_lettered_alone_and_the_healthy_publications_beside_it_are_delivered(
    real_redis, settings, poison, workers, order
):
    # Given an entry every worker dies on, and one publication of each of 8 healthy publishers,
    # all read in one batch
    healthy = Healthy(real_redis)
    if order == "poison_first":
        poison_id = _xadd_poison(real_redis)
    for publisher in HEALTHY:
        healthy.publish(publisher)
    if order == "poison_last":
        poison_id = _xadd_poison(real_redis)
    # When workers die on it, and fresh ones take over, until it is handled
    deaths = _run_with_deaths(real_redis, settings, workers)
    # Then the poison entry alone is dead-lettered, after max_deliveries deliveries, with the reason
    dead = _dead_letters(real_redis)
    assert [entry_id for entry_id, _ in dead] == [poison_id]
    assert "taken over 6 times without being handled" in dead[0][1]
    assert "max_deliveries 5" in dead[0][1]
    assert deaths >= settings.max_deliveries - 1  # a hand-over between live workers counts one too
    # And every healthy publication is delivered once, in order; no record of an entry handled alone is left
    healthy.assert_delivered_once_in_order()
    assert real_redis.hlen(keys.alone(QM)) == 0


def test_healthy_publications_behind_a_poison_entry_of_the_same_publisher_and_others_are_delivered(
    real_redis, settings, poison
):
    # Given healthy publishers, and a poison entry between two publications of one of them
    healthy = Healthy(real_redis)
    healthy.publish("hx1")
    poison_id = _xadd_poison(real_redis, publisher="hx1")
    for publisher in HEALTHY:
        healthy.publish(publisher, 2)
    # When two workers die on it until it is dead-lettered
    _run_with_deaths(real_redis, settings, 2)
    # Then only the poison entry is dead-lettered; the others are delivered once, in order
    assert [entry_id for entry_id, _ in _dead_letters(real_redis)] == [poison_id]
    healthy.assert_delivered_once_in_order()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_poison_entry_behind_many_healthy_ones_of_its_publisher_costs_a_few_deaths_not_one_per_entry(
    real_redis, settings, poison, workers
):
    # Given a publisher with 12 healthy publications, then an entry every worker dies on, then 3
    # more, and 3 other publishers, all in one batch (heads 50: a worker holds them all)
    healthy = Healthy(real_redis)
    healthy.publish("p", 12)
    poison_id = _xadd_poison(real_redis, publisher="p")
    healthy.publish("p", 3)
    for publisher in HEALTHY[:3]:
        healthy.publish(publisher, 2)
    # When workers die on it until it is dead-lettered
    deaths = _run_with_deaths(real_redis, settings, workers)
    # Then it is found without a death per entry ahead of it; only it is dead-lettered
    assert deaths <= settings.max_deliveries + 3
    assert [entry_id for entry_id, _ in _dead_letters(real_redis)] == [poison_id]
    healthy.assert_delivered_once_in_order()


def test_a_death_in_a_round_that_handles_a_suspect_alone_is_charged_to_that_entry_only(
    real_redis, settings, poison
):
    # Given a poison entry and a healthy one of another publisher, both held by a worker that died
    # twice with them (both suspects now: 3 deliveries)
    healthy = Healthy(real_redis)
    poison_id = _xadd_poison(real_redis)
    healthy.publish("hx1")
    stream = keys.publish_stream(QM)
    for name in ("w0", "w1"):
        worker = Worker(real_redis, settings, name=name)
        worker.setup()
        with pytest.raises(Died):
            worker.run_once()
        _expire_turns_of(real_redis, name)
    # When the next worker handles the poison entry alone (it is first) and dies
    worker = Worker(real_redis, settings, name="w2")
    worker.setup()
    with pytest.raises(Died):
        worker.run_once()
    _expire_turns_of(real_redis, "w2")
    # Then the take-over charges that death to the poison entry, not to the healthy one it held
    worker = Worker(real_redis, settings, name="w3")
    worker.setup()
    times = worker._take_over({"poison4": [poison_id], "hx1": [healthy_id(real_redis)]})
    assert times[poison_id] == 4
    assert times[healthy_id(real_redis)] == 3
    assert real_redis.xpending_range(stream, keys.WORKER_GROUP, "-", "+", 10)[0]["consumer"] == b"w3"


def test_a_foreign_alone_key_is_waited_on_and_nothing_is_lost(real_redis, settings):
    # Given heads delivered 3 times (suspects: their worker died twice), and {qm}:alone made a string
    healthy = Healthy(real_redis)
    for publisher in HEALTHY[:3]:
        healthy.publish(publisher, 2)
    for name in ("w0", "w1"):
        worker = Worker(real_redis, settings, name=name)
        worker.setup()
        worker.hook = _die_at("before_commit")
        with pytest.raises(Died):
            worker.run_once()
        _expire_turns_of(real_redis, name)
    real_redis.set(keys.alone(QM), "oops")
    # When the next worker's round would handle a suspect alone
    worker = Worker(real_redis, settings, name="w2")
    worker.setup()
    # Then it stops with a clear error before writing anything of its units of work
    with pytest.raises(ForeignKey, match="alone"):
        worker.run_once()
    assert real_redis.get(keys.alone(QM)) == b"oops"
    # And once the key is removed, everything is delivered once, in order, none dead-lettered
    real_redis.delete(keys.alone(QM))
    drain([worker])
    assert _dead_letters(real_redis) == []
    healthy.assert_delivered_once_in_order()


def _die_at(point: str) -> Callable[[str], None]:
    def hook(at: str) -> None:
        if at == point:
            raise Died(at)

    return hook


def healthy_id(client: redis.Redis) -> str:
    return next(
        entry_id.decode()
        for entry_id, fields in client.xrange(keys.publish_stream(QM))
        if fields.get(b"publisher") == b"hx1"
    )


# -- a foreign queue-manager-wide key is waited on, not counted --------------------------------


class Rounds:
    """Hook of ``Worker.run``: counts rounds; at the first one it calls ``plant``, ``foreign_rounds``
    rounds later ``restore``; it stops the worker once the stream is drained (or after ``max_rounds``)."""

    def __init__(
        self,
        observer: redis.Redis,
        plant: Callable[[], None],
        restore: Callable[[], None],
        foreign_rounds: int,
        max_rounds: int = 200,
    ) -> None:
        self.observer, self.plant, self.restore = observer, plant, restore
        self.foreign_rounds, self.max_rounds = foreign_rounds, max_rounds
        self.rounds = 0
        self.worker: Worker | None = None

    def __call__(self, point: str) -> None:
        if point != "after_dequeue":
            return
        assert self.worker is not None
        self.rounds += 1
        if self.rounds == 1:
            self.plant()
        elif self.rounds == 1 + self.foreign_rounds:
            self.restore()
        stream = keys.publish_stream(QM)
        group = next(g for g in self.observer.xinfo_groups(stream) if g["name"] == keys.WORKER_GROUP.encode())
        last = self.observer.xinfo_stream(stream)["last-generated-id"]
        drained = group["pending"] == 0 and group["last-delivered-id"] == last
        if (drained and self.rounds > self.foreign_rounds) or self.rounds >= self.max_rounds:
            self.worker.stopping = True


@pytest.mark.parametrize("reload", [False, True], ids=["same_version", "version_changed"])
def test_rounds_waiting_on_a_foreign_subscription_hash_count_no_delivery(
    real_redis, settings, monkeypatch, reload
):
    # Given 3 publishers with publications waiting, and a worker running its loop
    monkeypatch.setattr(worker_loop, "RETRY_PAUSE_MS", 0)
    healthy = Healthy(real_redis)
    for publisher in ("p1", "p2", "p3"):
        healthy.publish(publisher, 5)
    subs = keys.subscriptions(QM)
    aside = subs + ":aside"

    def plant() -> None:  # {qm}:subs made foreign (a string), the version changed meanwhile or not
        real_redis.rename(subs, aside)
        real_redis.set(subs, "oops")
        if reload:
            real_redis.incr(keys.version(QM))

    def restore() -> None:
        real_redis.delete(subs)
        real_redis.rename(aside, subs)

    clock = iter(range(10**12, 10**13, 1_000))
    rounds = Rounds(real_redis, plant, restore, foreign_rounds=20)
    worker = Worker(real_redis, settings, name="w0", clock_ms=lambda: next(clock), hook=rounds)
    rounds.worker = worker
    # When the key is foreign for 20 rounds of its loop, then removed
    worker.run()
    # Then nothing was dead-lettered, and everything is delivered once, in order
    assert rounds.rounds > 20
    assert _dead_letters(real_redis) == []
    healthy.assert_delivered_once_in_order()


# -- the chaos harness's checker ---------------------------------------------------------------


def test_chaos_checker_fails_a_run_that_dead_letters_a_healthy_publication_beside_a_killer_entry():
    # Given a killer entry dead-lettered after max_deliveries, and a healthy publication delivered
    history = History()
    killer = Poison("killer_entry", "p0.poison.1", "max_deliveries", acked=True, entry_id="1-0")
    history.add_poison(killer)
    good = Publication("p1", 1, "p1.1", "/chaos/x", frozenset({"a"}), acked=True, entry_id="2-0")
    history.add_publication(good)
    history.receive("a", "p1.1", "2-0")
    reason = b"taken over 6 times without being handled: its workers died (max_deliveries 5)"
    dead = [("9-0", {b"chaos.poison": b"p0.poison.1", b"dlq.reason": reason, b"dlq.entry_id": b"1-0"})]
    # Then the run passes
    verdict = history.check(["a"], dead)
    assert verdict.ok and verdict.good_dead_lettered == 0 and verdict.poison_acked == 1
    # When the healthy one is dead-lettered for the killer's deaths instead of delivered
    history = History()
    history.add_poison(killer)
    history.add_publication(good)
    fields = {b"publisher": b"p1", b"msgid": b"p1.1", b"dlq.reason": reason, b"dlq.entry_id": b"2-0"}
    verdict = history.check(["a"], [*dead, ("9-1", fields)])
    # Then it fails, and says so
    assert not verdict.ok
    assert (verdict.good_dead_lettered, verdict.lost) == (1, 1)
