"""Idle workers at low rates (issue 25, item 3): one waits on the stream, the sweeps run on their timers.

One idle worker (the waiter, ``{qm}:waiter``) blocks on the publish stream; the others block on
``{qm}:wake``, so a publication wakes one worker, which spends one dequeue and one commit on it.
A killed waiter keeps the role only for its lease, and meanwhile the others still dequeue after
each wait. The orphan sweep runs every ``sweep_interval_ms`` and a worker with nothing to do while
others hold waiting publishers sweeps at most every ``BUSY_POLL_MS``, not every round. Clocks are
injected; blocking calls end on an entry, a wake-up or CLIENT UNBLOCK, never on a sleep.
"""

from __future__ import annotations

import threading

import pytest

from broker import Publisher, subscribe
from broker.core import keys
from broker.operations.status import status
from broker.testing import make_workers
from worker.loop import BUSY_POLL_MS, QUIET_WAIT_MS, Worker
from worker.waiting import waiter_lease_ms

QM = "TEST"
NOW = 1_000_000


class Died(BaseException):
    """A worker's death at a crash point (simulated in-process)."""


def _worker(client, settings, name: str, clock: list[int], hook=None) -> Worker:
    worker = Worker(client, settings, name=name, clock_ms=lambda: clock[0], hook=hook)
    worker.setup()
    return worker


def _script_calls(client) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval", "fcall"))


def _blocked(client, command: str) -> list[int]:
    """Ids of the clients blocked in ``command``."""
    return [
        int(c["id"]) for c in client.client_list() if c.get("cmd") == command and "b" in c.get("flags", "")
    ]


def _until(condition, what: str) -> None:
    """Spin until ``condition()`` (a blocking call reaching the server), at most 10^6 looks."""
    for _ in range(1_000_000):
        if condition():
            return
    raise AssertionError(f"never: {what}")


def _round_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run_once, kwargs={"block": True}, daemon=True)
    thread.start()
    return thread


def _waiter_and_woken(real_redis, settings):
    """A subscription, and two idle workers with long waits: w0 blocked on the stream (the waiter), w1
    on the wake-up list. Returns ``(record, clock, (w0, its round's thread), (w1, its round's thread))``."""
    settings = settings.model_copy(update={"block_ms": 10_000, "sweep_interval_ms": 60_000})
    record = subscribe(real_redis, QM, "t/#", "app", "s")
    clock = [NOW]
    w0, w1 = _worker(real_redis, settings, "w0", clock), _worker(real_redis, settings, "w1", clock)
    first = _round_in_thread(w0)
    _until(lambda: _blocked(real_redis, "xread"), "w0 blocks on the stream")
    second = _round_in_thread(w1)
    _until(lambda: _blocked(real_redis, "blpop"), "w1 blocks on the wake-up list")
    return record, clock, (w0, first), (w1, second)


def test_two_idle_workers_spend_one_dequeue_and_one_commit_on_a_publication(real_redis, settings):
    # Given two idle workers, w0 waiting on the stream and w1 on the wake-up list (long waits)
    record, clock, (w0, first), (_w1, second) = _waiter_and_woken(real_redis, settings)
    assert real_redis.get(keys.waiter(QM)) == b"w0"
    before = _script_calls(real_redis)
    # When one publication comes after a quiet while (a low rate: worker.loop.QUIET_WAIT_MS)
    clock[0] += 10 * QUIET_WAIT_MS
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    first.join(timeout=10)
    # Then only the waiter woke: w1 still waits for a wake-up, and nobody ran a script yet
    assert not first.is_alive()
    assert second.is_alive() and _blocked(real_redis, "blpop")
    assert _script_calls(real_redis) == before
    # When the waiter handles it and goes back to the stream
    again = _round_in_thread(w0)
    _until(lambda: _blocked(real_redis, "xread"), "w0 waits on the stream again")
    # Then the publication cost one dequeue and one commit: no prefetched dequeue, no sweep
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 1
    assert _script_calls(real_redis) - before == 2
    assert real_redis.get(keys.waiter(QM)) == b"w0"
    for client_id in _blocked(real_redis, "xread") + _blocked(real_redis, "blpop"):
        real_redis.client_unblock(client_id)
    again.join(timeout=10)
    second.join(timeout=10)
    assert not again.is_alive() and not second.is_alive()


def test_a_killed_waiter_keeps_the_role_only_for_its_lease_and_publications_go_on(real_redis, settings):
    # Given w0, the waiter, killed after its wait (it never runs again)
    block_ms = 20
    settings = settings.model_copy(update={"block_ms": block_ms, "sweep_interval_ms": 60_000})
    record = subscribe(real_redis, QM, "t/#", "app", "s")
    clock = [NOW]
    w0, w1 = _worker(real_redis, settings, "w0", clock), _worker(real_redis, settings, "w1", clock)
    w0.run_once(block=True)
    assert real_redis.get(keys.waiter(QM)) == b"w0"
    assert 0 < real_redis.pttl(keys.waiter(QM)) <= waiter_lease_ms(block_ms)
    # When a publication comes while its lease runs
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # Then the other worker handles it in its next round (a dequeue follows every wait), and waits
    # for a wake-up, not on the stream
    assert w1.run_once(block=True) == 1
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 1
    assert real_redis.get(keys.waiter(QM)) == b"w0"
    # When the lease runs out, w1 takes the role in its next wait
    real_redis.pexpire(keys.waiter(QM), 1)
    _until(lambda: real_redis.get(keys.waiter(QM)) is None, "the lease runs out")
    w1.run_once(block=True)
    assert real_redis.get(keys.waiter(QM)) == b"w1"


def test_sweeps_run_on_their_timers_not_every_round(real_redis, settings):
    # Given w0 holding publisher p1's turn (it died before committing) and w1 with nothing to do
    settings = settings.model_copy(update={"block_ms": 1, "sweep_interval_ms": 1_000, "lease_ms": 30_000})
    subscribe(real_redis, QM, "t/#", "app", "s")
    clock = [NOW]

    def die(point: str) -> None:
        if point == "holding_turn":
            raise Died(point)

    w0 = _worker(real_redis, settings, "w0", clock, hook=die)
    w1 = _worker(real_redis, settings, "w1", clock)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    with pytest.raises(Died):
        w0.run_once(block=True)
    sweeps: list[int] = []
    sweep_turns = w1.scripts.sweep_turns

    def counted(*args, **kwargs):
        sweeps.append(clock[0])
        return sweep_turns(*args, **kwargs)

    w1.scripts.sweep_turns = counted  # type: ignore[method-assign]
    # When w1 runs five rounds at one instant
    for _ in range(5):
        assert w1.run_once(block=True) == 0
    # Then it swept twice (the orphan sweep's timer, and once for turns given up), not every round
    assert sweeps == [NOW, NOW]
    # When BUSY_POLL_MS pass, once more; when sweep_interval_ms pass, the timer's sweep too
    clock[0] = NOW + BUSY_POLL_MS
    w1.run_once(block=True)
    w1.run_once(block=True)
    assert sweeps == [NOW, NOW, NOW + BUSY_POLL_MS]
    # And when w0's lease has run out (its turn expires), the next timed sweep takes its publisher
    real_redis.pexpire(keys.turn_key(QM, "p1"), 1)
    _until(lambda: not real_redis.exists(keys.turn_key(QM, "p1")), "w0's turn expires")
    clock[0] = NOW + settings.sweep_interval_ms
    done = w1.run_once(block=True) + w1.run_once(block=True)
    assert done == 1
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


@pytest.mark.parametrize("which", ["wake", "waiter"])
def test_a_foreign_waiting_key_is_logged_once_and_idle_workers_wait_on_the_stream(
    real_redis, settings, caplog, which
):
    # Given {qm}:wake planted as a string, or {qm}:waiter as a list
    settings = settings.model_copy(update={"block_ms": 5, "sweep_interval_ms": 60_000})
    record = subscribe(real_redis, QM, "t/#", "app", "s")
    key = keys.wake(QM) if which == "wake" else keys.waiter(QM)
    if which == "wake":
        real_redis.set(key, "oops")
    else:
        real_redis.rpush(key, "oops")
    clock = [NOW]
    w0, w1 = _worker(real_redis, settings, "w0", clock), _worker(real_redis, settings, "w1", clock)
    w0.run_once(block=True)
    # When w1 waits twice, and a publication comes
    w1.run_once(block=True)
    w1.run_once(block=True)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # Then it was said once per worker (nothing raised), w1 waits on the stream, the publication is delivered
    assert w1.run_once(block=True) == 1
    foreign = [r.getMessage() for r in caplog.records if "foreign key" in r.getMessage()]
    assert 1 <= len(foreign) <= 2 and all(key in m for m in foreign)
    assert w1.waiting._foreign_key == key
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 1
    assert real_redis.type(key) == (b"string" if which == "wake" else b"list")
    # When the key is removed, w1 waits as before
    real_redis.delete(key)
    w1.run_once(block=True)
    assert w1.waiting._foreign_key == ""


def test_status_names_foreign_waiting_keys(real_redis, settings):
    # Given {qm}:waiter planted as a list and {qm}:wake as a string
    real_redis.rpush(keys.waiter(QM), "oops")
    real_redis.set(keys.wake(QM), "oops")
    # When an operator looks at the status
    problems = "\n".join(status(real_redis, QM).problems)
    # Then both are named, with the type found and the type wanted
    assert f"{keys.waiter(QM)} holds a list, not a string" in problems
    assert f"{keys.wake(QM)} holds a string, not a list" in problems


def test_a_wake_up_names_any_publisher_id_byte_for_byte(real_redis, settings):
    # Given turns given up by publishers whose ids are not UTF-8 or hold the old separator
    waker, woken = make_workers(real_redis, settings, 2)
    real_redis.set(keys.waiter(QM), "a third worker", px=60_000)  # so the woken one waits on {qm}:wake
    odd = [b"p\xff".decode("utf-8", "surrogateescape"), "a\nb"]
    # When one worker wakes another naming them
    pipe = real_redis.pipeline(transaction=False)
    waker.waiting.hand_on_in(pipe, 0, odd)
    waker.waiting.handed_on(pipe.execute(raise_on_error=False))
    # Then the woken worker reads them back as they were, and a foreign element names nothing
    assert woken.waiting.wait(0, "0-0", 100) is True
    assert woken.waiting.take_given_up() == tuple(odd)
    real_redis.lpush(keys.wake(QM), b"\xff not json")
    assert woken.waiting.wait(0, "0-0", 100) is True and woken.waiting.take_given_up() == ()


def test_after_a_short_wait_the_next_dequeue_rides_with_the_commit(real_redis, settings):
    # Given a worker whose last wait for work was short (entries keep coming: 2,000/s and more)
    subscribe(real_redis, QM, "t/#", "app", "s")
    clock = [NOW]
    worker = _worker(real_redis, settings, "w0", clock)
    worker._waited_ms = QUIET_WAIT_MS - 1
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # When it handles the publication (one entry read)
    assert worker.run_once(block=True) == 1
    # Then its next dequeue rode with the commit (one round trip), instead of a wait and a dequeue
    assert worker._prefetched is not None


def test_at_a_high_rate_idle_workers_wait_on_the_stream_directly_and_the_wake_up_rides_with_the_commit(
    real_redis, settings
):
    # Given w0 waiting on the stream (the waiter) and w1 on the wake-up list
    record, _clock, (w0, first), (w1, second) = _waiter_and_woken(real_redis, settings)
    round_trips: list[int] = []
    execute = w0.client.pipeline

    def counted(*args, **kwargs):
        round_trips.append(1)
        return execute(*args, **kwargs)

    w0.client.pipeline = counted  # type: ignore[method-assign]
    # When a publication comes at once (the clock does not move: entries keep coming)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    first.join(timeout=10)
    assert not first.is_alive()
    # Then the waiter, staying busy (its next dequeue rides with its commit), gives up the role and
    # wakes w1 in its commit's round trip: no round trip of its own
    w0.run_once(block=True)
    second.join(timeout=10)
    assert not second.is_alive() and round_trips == [1]
    assert real_redis.get(keys.waiter(QM)) is None
    # When both go back to waiting after short waits
    w0_again, w1_again = _round_in_thread(w0), _round_in_thread(w1)
    # Then both wait on the stream directly, neither taking the waiter's role
    _until(lambda: len(_blocked(real_redis, "xread")) == 2, "both block on the stream")
    assert real_redis.get(keys.waiter(QM)) is None and not _blocked(real_redis, "blpop")
    # ... and the next publication wakes both; it is delivered once
    Publisher(real_redis, QM, "p1").publish("t/a", b"two", msgid="m2")
    w0_again.join(timeout=10)
    w1_again.join(timeout=10)
    assert not w0_again.is_alive() and not w1_again.is_alive()
    while w0.run_once() + w1.run_once():
        pass
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 2


def test_a_wake_up_nobody_waited_for_is_taken_by_the_next_dequeue_with_the_turns_it_names(
    real_redis, settings
):
    # Given p1's entry in its FIFO with a free turn (its worker gave it up), and a wake-up naming p1
    # that nobody waited for (every idle worker was on the stream)
    record = subscribe(real_redis, QM, "t/#", "app", "s")
    clock = [NOW]
    w0, w1 = _worker(real_redis, settings, "w0", clock), _worker(real_redis, settings, "w1", clock)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    held = w0.scripts.dequeue(w0.name, 50, settings.lease_ms, settings.heads, [])
    assert held is not None and list(held.turns) == ["p1"]
    real_redis.delete(keys.turn_key(QM, "p1"))
    real_redis.lpush(keys.wake(QM), '["p1"]')
    # When another worker runs a round (reading nothing new from the stream)
    done = w1.run_once()
    # Then its dequeue took the wake-up and p1's turn, and handled p1's entry
    assert done == 1
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 1
    assert real_redis.llen(keys.wake(QM)) == 0


def test_a_foreign_wake_up_list_does_not_stop_the_dequeue(real_redis, settings):
    # Given a wake-up list of another type
    record = subscribe(real_redis, QM, "t/#", "app", "s")
    real_redis.set(keys.wake(QM), "planted")
    (w0,) = (_worker(real_redis, settings, "w0", [NOW]),)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # When a worker runs a round, Then the publication is delivered
    assert w0.run_once() == 1
    assert real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 1


def test_a_dequeue_with_nothing_to_do_reads_the_groups_state_only_and_writes_nothing(real_redis, settings):
    # Given a worker that handled everything (the group has nothing left to deliver)
    subscribe(real_redis, QM, "t/#", "app", "s")
    w0 = _worker(real_redis, settings, "w0", [NOW])
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    while w0.run_once():
        pass
    real_redis.config_resetstat()
    # When it dequeues again (as a worker woken with the herd for an entry another one took)
    dequeued = w0.scripts.dequeue(w0.name, 50, settings.lease_ms, settings.heads, [])
    # Then the reply says there is nothing, at the group's last-delivered id, and no key was type-checked
    # or written (only XINFO, LLEN, HLEN, HEXISTS, GET and SCARD ran inside the function)
    assert dequeued is not None and not dequeued.entries and not dequeued.turns
    assert (
        dequeued.last_delivered_id
        == real_redis.xinfo_groups(keys.publish_stream(QM))[0]["last-delivered-id"].decode()
    )
    stats = real_redis.info("commandstats")
    ran = {name.removeprefix("cmdstat_") for name in stats}
    assert ran <= {
        "fcall",
        "xinfo|groups",
        "llen",
        "hlen",
        "hexists",
        "get",
        "scard",
        "config|resetstat",
        "info",
    }, ran


def test_a_worker_waiting_for_turns_waits_on_the_wake_up_list_alone(real_redis, settings):
    # Given entries in the stream (a backlog, none of it for this worker yet)
    waker, woken = make_workers(real_redis, settings, 2)
    Publisher(real_redis, QM, "p1").publish("t/a", b"one", msgid="m1")
    # When it waits for turns with nobody ringing, then with a ring naming p1
    assert woken.waiting.wait_wake(20) is False  # the stream's entry does not wake it
    pipe = real_redis.pipeline(transaction=False)
    waker.waiting.hand_on_in(pipe, 0, ["p1"])
    waker.waiting.handed_on(pipe.execute(raise_on_error=False))
    # Then the ring wakes it with the publisher named, for its next dequeue
    assert woken.waiting.wait_wake(1_000) is True
    assert woken.waiting.take_given_up() == ("p1",)
    # And a foreign wake-up list is noted (logged once), not raised
    real_redis.set(keys.wake(QM), "oops")
    assert woken.waiting.wait_wake(20) is False
    assert woken.waiting._foreign_key == keys.wake(QM)
