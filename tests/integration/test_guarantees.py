"""The guarantees of DESIGN.md on a real server, driven deterministically (no sleeps)."""

from __future__ import annotations

import random

import pytest

from broker import Publisher, link, subscribe, unlink
from broker.core import keys
from broker.core.models import publication_fields
from broker.operations.status import status
from broker.testing import drain, make_workers, queue_messages, work_while
from worker.loop import Worker

QM = "TEST"


class Boom(Exception):
    pass


def _pending(client) -> int:
    return client.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"]


def test_per_publisher_order_holds_with_4_workers_and_20_publishers(real_redis, settings):
    # Given 4 workers, 20 publishers and subscriptions that overlap
    subs = [subscribe(real_redis, QM, f, "app", f"s{i}") for i, f in enumerate(["#", "/T/+", "/T/3", "/U/#"])]
    link(real_redis, QM, "/T/5", "/U/linked")
    workers = make_workers(real_redis, settings, 4)
    publishers = [Publisher(real_redis, QM, f"p{i}") for i in range(20)]
    rng = random.Random(7)
    # When publications of all publishers are interleaved with worker rounds in a random order
    for _round in range(40):
        for _ in range(rng.randint(10, 60)):
            rng.choice(publishers).publish(f"/T/{rng.randint(0, 9)}", b"x")
        rng.shuffle(workers)
        for worker in workers[: rng.randint(1, 4)]:
            worker.run_once()
    drain(workers)
    # Then every subscription sees each publisher's seqs strictly increasing, and all were handled
    assert _pending(real_redis) == 0
    total = 0
    for record in subs:
        last: dict[str, int] = {}
        for message in queue_messages(real_redis, QM, record.sub_id):
            assert message.seq > last.get(message.publisher, 0), (record.sub_id, message.publisher)
            last[message.publisher] = message.seq
            total += 1
    assert total > 0
    assert sum(w.processed for w in workers) == sum(p.next_seq - 1 for p in publishers)
    assert sum(1 for w in workers if w.processed) >= 2  # the work really was shared


def test_unit_of_work_interrupted_before_commit_leaves_nothing_delivered_and_entry_pending(
    real_redis, settings
):
    # Given two subscriptions and a worker that fails just before its unit of work is sent
    a = subscribe(real_redis, QM, "/A/#", "app", "a")
    b = subscribe(real_redis, QM, "/A/B", "app", "b")
    Publisher(real_redis, QM, "p").publish("/A/B", b"x")

    def fail(point: str) -> None:
        if point == "before_commit":
            raise Boom

    worker = Worker(real_redis, settings, name="crashy", hook=fail)
    worker.setup()
    # When the unit of work is interrupted
    with pytest.raises(Boom):
        worker.run_once()
    # Then no subscriber has the message and the entry is still pending
    assert queue_messages(real_redis, QM, a.sub_id) == []
    assert queue_messages(real_redis, QM, b.sub_id) == []
    assert _pending(real_redis) == 1
    # And once the dead worker's lease is over (simulated: its turn key is gone), another worker finishes it
    real_redis.delete(keys.turn_key(QM, "p"))
    drain(make_workers(real_redis, settings, 1))
    assert len(queue_messages(real_redis, QM, a.sub_id)) == 1
    assert len(queue_messages(real_redis, QM, b.sub_id)) == 1
    assert _pending(real_redis) == 0


def test_a_stalled_worker_resumed_after_losing_its_turn_cannot_write(real_redis, settings):
    # Given a worker that stalls right before committing, and loses its turn meanwhile
    sub = subscribe(real_redis, QM, "/A", "app", "a")
    Publisher(real_redis, QM, "p").publish("/A", b"once")
    other = make_workers(real_redis, settings, 1)[0]

    def stall(point: str) -> None:
        if point == "before_commit":
            real_redis.delete(keys.turn_key(QM, "p"))  # the lease ran out
            drain([other])  # another worker takes the turn and delivers

    zombie = Worker(real_redis, settings, name="zombie", hook=stall)
    zombie.setup()
    # When the zombie resumes and sends its unit of work
    zombie.run_once()
    # Then it was fenced: exactly one copy, delivered by the other worker
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"once"]
    assert zombie.counts.get("delivered", 0) == 0
    assert other.counts["delivered"] == 1


def test_subscription_made_before_a_publish_always_receives_it(real_redis, settings):
    # Given a worker that has already loaded its routing table
    workers = make_workers(real_redis, settings, 2)
    Publisher(real_redis, QM, "p").publish("/X", b"before")
    drain(workers)
    # When a subscription returns and then a publication is made
    sub = subscribe(real_redis, QM, "/X", "late", "s")
    Publisher(real_redis, QM, "p", first_seq=2).publish("/X", b"after")
    drain(workers)
    # Then it receives that publication (and not the earlier one)
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"after"]


def test_links_change_at_run_time_without_subscribers_doing_anything(real_redis, settings):
    sub = subscribe(real_redis, QM, "/NEWS/ENGLAND", "reader", "s")
    workers = make_workers(real_redis, settings, 1)
    pub = Publisher(real_redis, QM, "p")
    pub.publish("/SPORT/FOOTBALL/CHELSEA", b"1")
    drain(workers)
    link(real_redis, QM, "/SPORT/FOOTBALL/CHELSEA", "/NEWS/LONDON")
    link(real_redis, QM, "/NEWS/LONDON", "/NEWS/ENGLAND")
    pub.publish("/SPORT/FOOTBALL/CHELSEA", b"2")
    drain(workers)
    unlink(real_redis, QM, "/NEWS/LONDON", "/NEWS/ENGLAND")
    pub.publish("/SPORT/FOOTBALL/CHELSEA", b"3")
    drain(workers)
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"2"]


def test_backward_link_loop_is_cut_and_each_subscriber_gets_one_copy(real_redis, settings):
    a = subscribe(real_redis, QM, "/A", "s", "a")
    b = subscribe(real_redis, QM, "/B", "s", "b")
    both = subscribe(real_redis, QM, "+", "s", "both")
    link(real_redis, QM, "/A", "/B")
    link(real_redis, QM, "/B", "/A", backward=True)
    Publisher(real_redis, QM, "p").publish("/B", b"x")
    drain(make_workers(real_redis, settings, 1))
    for record in (a, b):
        assert len(queue_messages(real_redis, QM, record.sub_id)) == 1
    assert queue_messages(real_redis, QM, both.sub_id) == []  # "+" does not match "/B" (two levels)


def test_publisher_retry_with_same_msgid_is_delivered_once(real_redis, settings):
    sub = subscribe(real_redis, QM, "/A", "s", "a")
    pub = Publisher(real_redis, QM, "p")
    pub.publish("/A", b"x", msgid="order-1")
    pub.publish("/A", b"x", msgid="order-1")  # a retry after a lost reply
    workers = make_workers(real_redis, settings, 1)
    drain(workers)
    assert len(queue_messages(real_redis, QM, sub.sub_id)) == 1
    assert workers[0].counts == {"delivered": 1, "duplicate": 1}


def test_publisher_waiting_learns_delivered_count_and_refusal_with_suggestion(real_redis, settings):
    subscribe(real_redis, QM, "/A/#", "s", "a")
    subscribe(real_redis, QM, "/A/B", "s", "b")
    worker = make_workers(real_redis, settings, 1)[0]
    results = {}

    def publish() -> None:
        results["ok"] = Publisher(real_redis, QM, "p").publish("/A/B", b"x", wait=True)
        results["bad"] = Publisher(real_redis, QM, "q", validate=False).publish("/A/+", b"x", wait=True)

    work_while(worker, publish)
    assert results["ok"].status == "delivered" and results["ok"].subscriptions == 2
    assert results["bad"].status == "refused"
    assert results["bad"].suggestion == "/A"


def test_malformed_entries_are_dead_lettered_in_place_and_the_rest_flows_in_order(real_redis, settings):
    sub = subscribe(real_redis, QM, "/A", "s", "a")
    stream = keys.publish_stream(QM)
    good = publication_fields("p", "/A", b"1", seq=1)
    real_redis.xadd(stream, good)
    real_redis.xadd(stream, {"publisher": "p", "topic": b"\xff\xfe"})  # invalid UTF-8 topic
    real_redis.xadd(stream, {"publisher": "p", "topic": "/A", "body": b"x" * (settings.max_body_bytes + 1)})
    real_redis.xadd(stream, {"topic": "/A"})  # no publisher
    real_redis.xadd(stream, {"publisher": "p", "topic": "/A", "priority": "eleven"})
    real_redis.xadd(stream, publication_fields("p", "/A", b"2", seq=2))
    drain(make_workers(real_redis, settings, 2))
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"1", b"2"]
    dead = real_redis.xrange(keys.dead_letter(QM))
    reasons = [fields[b"dlq.reason"].decode() for _, fields in dead if fields.get(b"publisher") == b"p"]
    assert len(reasons) == 3  # publisher p's poison, in p's order
    assert "not valid UTF-8" in reasons[0]
    assert "larger than the limit" in reasons[1]
    assert "priority" in reasons[2]
    orphan = [fields for _, fields in dead if b"publisher" not in fields]
    assert len(orphan) == 1 and b"missing field 'publisher'" in orphan[0][b"dlq.reason"]
    assert orphan[0][b"topic"] == b"/A"  # the original fields are kept
    assert status(real_redis, QM).pending == 0


def test_expired_publication_is_not_delivered(real_redis, settings):
    sub = subscribe(real_redis, QM, "/A", "s", "a")
    Publisher(real_redis, QM, "p").publish("/A", b"old", expiration_ms=1)
    worker = make_workers(real_redis, settings, 1)[0]
    drain([worker])
    assert queue_messages(real_redis, QM, sub.sub_id) == []
    assert worker.counts == {"expired": 1}


def test_lua_per_publisher_key_prefix_matches_python_twin(real_redis, settings):
    Publisher(real_redis, QM, "pub:1").publish("/A", b"x")
    worker = make_workers(real_redis, settings, 1)[0]
    dequeued = worker.scripts.dequeue(worker.name, 10, 1000, 10, [])
    entry_id = dequeued.entries[0][0]
    assert real_redis.lrange(keys.fifo_key(QM, "pub:1"), 0, -1) == [entry_id.encode()]
    assert real_redis.get(keys.turn_key(QM, "pub:1")) == worker.name.encode()
    assert real_redis.smembers(keys.active_publishers(QM)) == {b"pub:1"}


def test_scripts_work_after_script_flush(real_redis, settings):
    sub = subscribe(real_redis, QM, "/A", "s", "a")
    workers = make_workers(real_redis, settings, 1)
    real_redis.script_flush()
    Publisher(real_redis, QM, "p").publish("/A", b"x")
    drain(workers)
    assert len(queue_messages(real_redis, QM, sub.sub_id)) == 1


def test_orphaned_publisher_is_taken_over_by_the_sweep(real_redis, settings):
    # Given a worker that dequeued and then died holding the turn
    sub = subscribe(real_redis, QM, "/A", "s", "a")
    pub = Publisher(real_redis, QM, "p")
    for i in range(3):
        pub.publish("/A", str(i).encode())
    dead = Worker(real_redis, settings, name="dead")
    dead.setup()
    dead.scripts.dequeue(dead.name, 10, settings.lease_ms, 10, [])
    # When its lease runs out (simulated) and no new entry of that publisher arrives
    real_redis.delete(keys.turn_key(QM, "p"))
    drain(make_workers(real_redis, settings, 1))
    # Then the sweep takes the turn, claims the dead worker's entries and delivers them in order
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"0", b"1", b"2"]
    assert _pending(real_redis) == 0


def test_one_worker_cannot_hold_every_turn_while_another_is_idle(real_redis, settings):
    # Given two live workers and ten publishers with waiting publications
    subscribe(real_redis, QM, "#", "s", "all")
    for i in range(10):
        Publisher(real_redis, QM, f"p{i}").publish_many([("/a", b"x")] * 5)
    first, second = make_workers(real_redis, settings, 2)
    # When the first dequeues everything before the second starts
    first.run_once()
    # Then it handled only its fair share of the publishers (5 of 10) ...
    assert first.processed == 25
    # ... and the second worker, which read nothing, takes the rest
    drain([second])
    assert second.processed == 25
    assert len(queue_messages(real_redis, QM, "s$all")) == 50
