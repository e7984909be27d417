"""The queue mutex as the function ``broker_dequeue`` of the library ``broker`` (issue 25): its helpers
are made once, when the library loads, and each call starts afresh from its own KEYS and ARGV."""

from __future__ import annotations

from broker import subscribe
from broker.core import keys
from broker.core.library import DEQUEUE
from broker.core.models import publication_fields
from broker.core.scripts import Scripts
from broker.testing import drain, library_functions, make_workers, queue_messages

QM = "TEST"


def _calls(client) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def test_the_dequeue_is_one_fcall_of_broker_dequeue_allowed_on_a_full_server(real_redis, settings):
    # Given a worker set up and one publication waiting
    (worker,) = make_workers(real_redis, settings, 1)
    real_redis.xadd(keys.publish_stream(QM), publication_fields("p", "t/x", b"0"))
    real_redis.config_resetstat()
    # When it dequeues (by itself, not riding with a commit)
    dequeued = worker.scripts.dequeue(worker.name, 10, settings.lease_ms, settings.heads, [])
    # Then it read and filed the publication in one FCALL, and ran no script
    assert dequeued is not None and len(dequeued.entries) == 1 and list(dequeued.turns) == ["p"]
    calls = _calls(real_redis)
    assert calls.get("fcall") == 1, calls
    assert "evalsha" not in calls and "eval" not in calls, calls
    # ... of broker_dequeue, a function of the library with the flag allow-oom: it reads on a full
    # server, as the script did (its first write, XREADGROUP's, was not refused: test_memory_full.py)
    assert library_functions(real_redis)[DEQUEUE] == [b"allow-oom"]


def test_a_dequeue_whose_server_lost_the_library_loads_it_and_reads_once(real_redis, settings):
    # Given a worker set up, a publication waiting, and the library gone (FUNCTION FLUSH)
    (worker,) = make_workers(real_redis, settings, 1)
    real_redis.xadd(keys.publish_stream(QM), publication_fields("p", "t/x", b"0"))
    real_redis.function_flush()
    # When it dequeues by itself
    dequeued = worker.scripts.dequeue(worker.name, 10, settings.lease_ms, settings.heads, [])
    # Then the call loaded the library and read the publication once
    assert DEQUEUE in library_functions(real_redis)
    assert dequeued is not None and [fields[b"body"] for _, fields in dequeued.entries] == [b"0"]
    assert real_redis.llen(keys.fifo_key(QM, "p")) == 1


def test_a_worker_whose_server_lost_the_library_between_rounds_delivers_each_once(real_redis, settings):
    # Given a worker that delivered a first publication, and the library gone before its next round
    sub = subscribe(real_redis, QM, "t/#", "app", "a")
    (worker,) = make_workers(real_redis, settings, 1)
    stream = keys.publish_stream(QM)
    real_redis.xadd(stream, publication_fields("p", "t/x", b"0"))
    drain([worker])
    real_redis.function_flush()
    # When more come and it runs (its dequeues, by themselves or riding with a commit, and its
    # commits find no function until it loads the library)
    for i in range(1, 4):
        real_redis.xadd(stream, publication_fields("p", "t/x", b"%d" % i))
    drain([worker])
    # Then each was delivered once, in order
    assert [m.body for m in queue_messages(real_redis, QM, sub.sub_id)] == [b"0", b"1", b"2", b"3"]
    assert worker.counts == {"delivered": 4}


def test_a_call_refuses_into_its_own_queue_managers_dead_letter_stream(real_redis, settings):
    # Given two queue managers on one server, each with an entry whose publisher's FIFO is foreign
    # (its entry is refused: dead-lettered through the call's refusal context, made on first use)
    calls = {}
    for qm in ("QA", "QB"):
        scripts = Scripts(real_redis, qm)
        stream = keys.publish_stream(qm)
        real_redis.xgroup_create(stream, keys.WORKER_GROUP, id="0", mkstream=True)
        real_redis.set(keys.fifo_key(qm, "p"), "planted")
        real_redis.xadd(stream, publication_fields("p", "t/x", b"from " + qm.encode()))
        calls[qm] = scripts
    # When each queue manager's worker dequeues, one after the other
    for scripts in calls.values():
        scripts.dequeue("w", 10, settings.lease_ms, settings.heads, [])
    # Then each refusal went to its own queue manager's dead-letter stream (nothing kept from the
    # call before)
    for qm in ("QA", "QB"):
        letters = real_redis.xrange(keys.dead_letter(qm))
        assert [fields[b"body"] for _, fields in letters] == [b"from " + qm.encode()], qm
