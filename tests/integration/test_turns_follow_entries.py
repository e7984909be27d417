"""While a backlog is drained, a publisher's turn follows its entries (issue 25): the holder commits
the heads it read itself and gives the turn to the live worker that read the next ones, which
handles them from memory; a reader that is not live has its heads taken over as before."""

from __future__ import annotations

from broker import Publisher, subscribe
from broker.core import keys
from broker.testing import drain, make_workers, queue_messages

QM = "TEST"


def _record_take_overs(*workers) -> list[str]:
    """Record every take-over the workers make (``take_over`` and ``take_over_in``), as ``worker:script``."""
    taken: list[str] = []
    for worker in workers:
        for name in ("take_over", "take_over_in"):
            original = getattr(worker.scripts, name)

            def record(*args, _original=original, _name=name, _worker=worker.name, **kwargs):
                taken.append(f"{_worker}:{_name}")
                return _original(*args, **kwargs)

            setattr(worker.scripts, name, record)
    return taken


def _b_holds_p1(real_redis, settings):
    """Workers b and a; b's first dequeue (batches of 2) read p1's a1 and a2 and holds p1, a backlog behind."""
    b, a = make_workers(real_redis, settings, 2)
    held = b.scripts.dequeue(b.name, 2, settings.lease_ms, settings.heads, [])
    assert held is not None and list(held.turns) == ["p1"] and held.plenty
    b._file(held)
    return b, a


def _split_p1(real_redis, settings):
    """Workers b and a (batches of 2): b read p1's a1, a2 and holds p1; a read p1's a3 (and q's b1,
    so that it holds a turn and keeps what it read); a backlog of q's entries waits behind."""
    settings = settings.model_copy(update={"batch_size": 2})
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    p1, q = Publisher(real_redis, QM, "p1"), Publisher(real_redis, QM, "q")
    for body in (b"a1", b"a2", b"a3"):
        p1.publish("/t", body, msgid=body.decode())
    q.publish("/t", b"b1", msgid="b1")
    p1.publish("/t", b"a4", msgid="a4")
    for i in range(2, 12):
        q.publish("/t", f"b{i}".encode(), msgid=f"b{i}")
    b, a = _b_holds_p1(real_redis, settings)
    a.run_once()  # reads a3 and b1: handles b1 (q), keeps a3 (p1 is b's) in memory
    assert "p1" not in a.turns and any(publisher == "p1" for publisher, _ in a._entries.values())
    return sub, a, b, _record_take_overs(a, b)


def test_the_turn_goes_to_the_live_worker_that_read_the_next_heads(real_redis, settings):
    # Given b holding p1 with a1, a2 in memory, and a (live) holding p1's next head a3 in memory
    sub, a, b, taken = _split_p1(real_redis, settings)
    # When b runs a round
    b.run_once()
    # Then it committed a1 and a2, took nothing over, and gave p1's turn up for a
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)][-2:] == [b"a1", b"a2"]
    assert "p1" not in b.turns and real_redis.get(keys.turn_key(QM, "p1")) is None
    # ... and a takes it and handles a3 from memory: nobody took a head over
    drain([a, b])
    bodies = [m.body for m in queue_messages(real_redis, QM, sub.sub_id)]
    p1_bodies = [x for x in bodies if x.startswith(b"a")]
    assert p1_bodies == [b"a1", b"a2", b"a3", b"a4"]
    assert len(bodies) == 15
    assert taken == []
    assert real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"] == 0


def test_the_heads_of_a_reader_that_is_not_live_are_taken_over(real_redis, settings):
    # Given the same, but a's heartbeat is older than the liveness window (it died holding a3)
    sub, a, b, taken = _split_p1(real_redis, settings)
    real_redis.zadd(keys.alive(QM), {a.name: 1})
    # When b runs its rounds alone
    drain([b])
    # Then b kept p1's turn and took a3 over: p1 in order (q's turn stays a's until its lease ends)
    bodies = [m.body for m in queue_messages(real_redis, QM, sub.sub_id)]
    assert [x for x in bodies if x.startswith(b"a")] == [b"a1", b"a2", b"a3", b"a4"]
    assert any(name.startswith(f"{b.name}:take_over") for name in taken)


def test_a_worker_without_turns_keeps_what_it_read_and_reads_nothing_more_until_their_turn_comes(
    real_redis, settings
):
    # Given b holding p1 with a1, a2 in memory, and a backlog of q's entries behind p1's a3, a4
    settings = settings.model_copy(update={"batch_size": 2})
    sub = subscribe(real_redis, QM, "/t", "s", "all")
    p1, q = Publisher(real_redis, QM, "p1"), Publisher(real_redis, QM, "q")
    for body in (b"a1", b"a2", b"a3", b"a4"):
        p1.publish("/t", body, msgid=body.decode())
    for i in range(1, 11):
        q.publish("/t", f"b{i}".encode(), msgid=f"b{i}")
    b, a = _b_holds_p1(real_redis, settings)
    taken = _record_take_overs(a, b)
    stream = keys.publish_stream(QM)

    def read() -> int:
        return real_redis.xpending(stream, keys.WORKER_GROUP)["pending"]

    # When a runs two rounds while b holds p1
    a.run_once()
    a.run_once()
    # Then a read a3 and a4 only, keeps them, and read nothing more (q's entries wait in the stream)
    assert not a.turns and sorted(f[b"msgid"] for _, f in a._entries.values()) == [b"a3", b"a4"]
    assert read() == 4
    # When b commits a1 and a2 (it leaves p1's turn to a), then both drain
    b.run_once()
    drain([a, b])
    # Then p1 is in order, every q entry delivered, and nobody read a head a second time
    bodies = [m.body for m in queue_messages(real_redis, QM, sub.sub_id)]
    assert [x for x in bodies if x.startswith(b"a")] == [b"a1", b"a2", b"a3", b"a4"]
    assert len(bodies) == 14
    assert taken == []
    assert read() == 0
