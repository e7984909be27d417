"""Admin jobs: trimming keeps every unacknowledged entry; usage snapshots; scheduled jobs (cron)
and the periodic chains."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from rq import Queue, SimpleWorker
from rq.job import Job

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.errors import InvalidSchedule, InvalidSelector, NoSuchSchedule
from broker.jobs import (
    ADMIN_QUEUE,
    RUNNERS,
    add_schedule,
    cancel_schedule,
    list_schedules,
    run_schedule,
    schedule,
    trim_stream,
    usage_snapshot,
)
from broker.operations.schedules import next_run_ms
from broker.testing import drain, make_workers
from broker.topics.subscriptions import list_subscriptions

QM = "TEST"


def test_trim_removes_only_acknowledged_entries(real_server, real_redis, settings):
    subscribe(real_redis, QM, "#", "c", "all")
    pub = Publisher(real_redis, QM, "p")
    workers = make_workers(real_redis, settings, 1)
    for i in range(5):
        pub.publish("/a", str(i).encode())
    drain(workers)
    for i in range(5, 8):
        pub.publish("/a", str(i).encode())
    # an entry delivered to a worker but not acknowledged (a worker died after dequeue)
    workers[0].scripts.dequeue("dead", 1, 30_000, 1, [])
    removed = trim_stream(real_server.url, QM)
    assert removed == 5
    assert real_redis.xlen(keys.publish_stream(QM)) == 3
    real_redis.delete(keys.turn_key(QM, "p"))  # the dead worker's lease ran out
    drain(make_workers(real_redis, settings, 1) + workers)
    assert real_redis.llen(keys.sub_queue(QM, "c$all")) == 8


def test_usage_snapshot_job_runs_under_rq(real_server, real_redis, settings):
    subscribe(real_redis, QM, "#", "c", "all")
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    job = queue.enqueue(usage_snapshot, real_server.url, QM)
    SimpleWorker([queue], connection=real_redis).work(burst=True)
    assert job.get_status() == "finished"
    snaps = real_redis.xrange(keys.usage(QM))
    assert json.loads(snaps[0][1][b"snapshot"])["subscriptions"] == 1


# --- scheduled jobs: broker jobs schedule | list | cancel ----------------------------------------


def fire_scheduled(queue: Queue) -> list[str]:
    """Do what rq's scheduler does when the scheduled jobs' time comes, whatever the time; their ids."""
    registry = queue.scheduled_job_registry
    due = registry.get_job_ids()
    for job_id in due:
        queue.enqueue_job(Job.fetch(job_id, connection=queue.connection))
        registry.remove(job_id)
    return due


def utc_ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


SALES = {"client_id": "sales", "durable_name": "%"}


def test_scheduling_delete_durable_enqueues_its_first_run_at_the_next_cron_time(real_server, real_redis):
    made = add_schedule(
        real_redis, real_server.url, QM, "delete-durable", "0 3 * * *", SALES, now_ms=utc_ms(2025, 1, 1, 12)
    )
    assert made.next_run_ms == utc_ms(2025, 1, 2, 3)
    registry = Queue(ADMIN_QUEUE, connection=real_redis).scheduled_job_registry
    assert registry.get_job_ids() == [made.rq_job]
    assert registry.get_scheduled_time(made.rq_job) == datetime(2025, 1, 2, 3, tzinfo=UTC)
    stored = json.loads(real_redis.hget(keys.schedules(QM), made.schedule_id))
    assert stored["params"] == SALES and stored["cron"] == "0 3 * * *" and stored["rq_job"] == made.rq_job
    assert list_schedules(real_redis, QM) == ([made], [])


def test_a_due_run_deletes_the_selected_durables_and_enqueues_the_next_run(real_server, real_redis):
    # Given durables of sales and other, and Delete Durable scheduled for sales at 03:00 UTC
    for client_id in ("sales", "other"):
        subscribe(real_redis, QM, "/a", client_id, "d1")
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "0 3 * * *", SALES)
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    # When its time comes and the scheduler's worker runs it
    assert fire_scheduled(queue) == [made.rq_job]
    SimpleWorker([queue], connection=real_redis).work(burst=True)
    # Then sales's durable is gone, other's stays, and the run is recorded with the next one enqueued
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["other$d1"]
    [after], problems = list_schedules(real_redis, QM)
    assert problems == []
    assert after.last_result == "deleted 1 durable subscription (0 message(s)): sales$d1"
    assert after.rq_job != made.rq_job and after.last_run_ms is not None
    assert after.next_run_ms == next_run_ms("0 3 * * *", after.last_run_ms)
    assert queue.scheduled_job_registry.get_job_ids() == [after.rq_job]


def test_a_cancelled_schedule_never_runs_again(real_server, real_redis):
    subscribe(real_redis, QM, "/a", "sales", "d1")
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "* * * * *", SALES)
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    cancel_schedule(real_redis, QM, made.schedule_id)
    # its rq job is gone, and a run that was already queued (taken before the cancel) does nothing
    assert fire_scheduled(queue) == [] and not Job.exists(made.rq_job, connection=real_redis)
    assert run_schedule(real_server.url, QM, made.schedule_id, made.rq_job) == "cancelled"
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["sales$d1"]
    assert queue.scheduled_job_registry.count == 0 and queue.count == 0
    assert list_schedules(real_redis, QM) == ([], [])
    with pytest.raises(NoSuchSchedule):
        cancel_schedule(real_redis, QM, made.schedule_id)


def test_a_schedule_cancelled_while_it_runs_leaves_no_next_run(real_server, real_redis, monkeypatch):
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "* * * * *", SALES)
    queue = Queue(ADMIN_QUEUE, connection=real_redis)
    queue.scheduled_job_registry.remove(made.rq_job)

    def cancelled_meanwhile(client, qm, params):
        cancel_schedule(client, qm, made.schedule_id)
        return "ran"

    monkeypatch.setitem(RUNNERS, "delete-durable", cancelled_meanwhile)
    assert run_schedule(real_server.url, QM, made.schedule_id, made.rq_job) == "ran"
    assert queue.scheduled_job_registry.count == 0 and queue.count == 0
    assert real_redis.hlen(keys.schedules(QM)) == 0


def test_a_run_that_fails_is_recorded_and_its_next_run_still_enqueued(real_server, real_redis, monkeypatch):
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "0 3 * * *", SALES)

    def broken(client, qm, params):
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(RUNNERS, "delete-durable", broken)
    now = utc_ms(2025, 6, 1, 3)
    assert (
        run_schedule(real_server.url, QM, made.schedule_id, made.rq_job, now_ms=now) == "failed: disk on fire"
    )
    [after], _ = list_schedules(real_redis, QM)
    assert (after.last_run_ms, after.last_result, after.next_run_ms) == (
        now,
        "failed: disk on fire",
        utc_ms(2025, 6, 2, 3),
    )
    registry = Queue(ADMIN_QUEUE, connection=real_redis).scheduled_job_registry
    assert after.rq_job in registry.get_job_ids()


def test_a_stale_run_of_a_schedule_does_nothing(real_server, real_redis):
    subscribe(real_redis, QM, "/a", "sales", "d1")
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "* * * * *", SALES)
    assert run_schedule(real_server.url, QM, made.schedule_id, "some-other-run") == "stale"
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["sales$d1"]
    assert list_schedules(real_redis, QM)[0] == [made]


@pytest.mark.parametrize(
    "cron,params,error",
    [
        ("0 3 * *", SALES, InvalidSchedule),
        ("0 0 30 2 *", SALES, InvalidSchedule),
        ("0 3 * * *", {"client_id": "sales"}, InvalidSchedule),
        ("0 3 * * *", {"client_id": "sales\\", "durable_name": "%"}, InvalidSelector),
    ],
)
def test_a_bad_cron_expression_or_predicate_is_refused_before_anything_is_stored(
    real_server, real_redis, cron, params, error
):
    with pytest.raises(error):
        add_schedule(real_redis, real_server.url, QM, "delete-durable", cron, params)
    assert real_redis.exists(keys.schedules(QM)) == 0
    assert Queue(ADMIN_QUEUE, connection=real_redis).scheduled_job_registry.count == 0


def test_a_corrupt_schedule_is_listed_as_a_problem_never_run_and_can_be_cancelled(real_server, real_redis):
    subscribe(real_redis, QM, "/a", "sales", "d1")
    good = add_schedule(real_redis, real_server.url, QM, "delete-durable", "0 3 * * *", SALES)
    bad = {"job": "delete-durable", "cron": "every day", "params": SALES}
    real_redis.hset(keys.schedules(QM), "delete-durable-bad", json.dumps(bad))
    found, problems = list_schedules(real_redis, QM)
    assert found == [good]
    assert problems == [
        "corrupt record 'delete-durable-bad' in {TEST}:schedules: cron expression 'every day' must have "
        "5 fields (minute hour day-of-month month day-of-week), not 2"
    ]
    assert run_schedule(real_server.url, QM, "delete-durable-bad", "any") == "corrupt"
    assert [r.sub_id for r in list_subscriptions(real_redis, QM)] == ["sales$d1"]
    cancel_schedule(real_redis, QM, "delete-durable-bad")
    assert list_schedules(real_redis, QM) == ([good], [])


def test_a_schedule_whose_rq_job_is_gone_is_named_as_a_problem(real_server, real_redis):
    made = add_schedule(real_redis, real_server.url, QM, "delete-durable", "0 3 * * *", SALES)
    Job.fetch(made.rq_job, connection=real_redis).delete()  # rq's keys flushed, say
    _, problems = list_schedules(real_redis, QM)
    assert problems == [
        f"schedule {made.schedule_id}: its rq job {made.rq_job} is gone, so it will not run; "
        "cancel it and schedule it again"
    ]


# --- the periodic chains ---------------------------------------------------------------------------


def periodic_chains(client) -> list[tuple]:
    queue = Queue(ADMIN_QUEUE, connection=client)
    jobs = [Job.fetch(i, connection=client) for i in queue.get_job_ids()]
    jobs += [Job.fetch(i, connection=client) for i in queue.scheduled_job_registry.get_job_ids()]
    return sorted(tuple(job.args[1:]) for job in jobs if job.func_name == "broker.jobs.periodic")


def test_each_periodic_job_runs_in_one_chain_with_the_arguments_last_asked_for(real_server, real_redis):
    url = real_server.url
    # a scheduled job already waiting must not stop the periodic jobs from being made
    add_schedule(real_redis, url, QM, "delete-durable", "0 3 * * *", SALES)
    assert len(schedule(url, QM, 60_000)) == 2
    assert schedule(url, QM, 60_000) == []  # already there: nothing new
    assert periodic_chains(real_redis) == [
        (QM, "trim_stream", 60_000),
        (QM, "usage_snapshot", 60_000),
    ]
    # idle expiry on: one more chain; another interval: every chain replaced; expiry off: its chain goes
    assert len(schedule(url, QM, 60_000, idle_expiry_ms=86_400_000)) == 1
    assert len(schedule(url, QM, 30_000, idle_expiry_ms=86_400_000)) == 3
    assert periodic_chains(real_redis) == [
        (QM, "expire_idle", 30_000, 86_400_000),
        (QM, "trim_stream", 30_000),
        (QM, "usage_snapshot", 30_000),
    ]
    schedule(url, QM, 30_000)
    assert [c[1] for c in periodic_chains(real_redis)] == ["trim_stream", "usage_snapshot"]
    # another queue manager's chains are its own
    assert len(schedule(url, "OTHER", 30_000)) == 2
    assert len(periodic_chains(real_redis)) == 4
