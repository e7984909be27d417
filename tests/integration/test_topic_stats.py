"""Topic statistics (issue 28 row 13; IBM MQ DISPLAY TPSTATUS: NUMPUBS, LPUBDATE/LPUBTIME, SUBCOUNT):
counted in the worker's memory, flushed by its housekeeping on a timer, bounded, on a real server."""

from __future__ import annotations

import json
import logging
import multiprocessing
import signal

from prometheus_client.parser import text_string_to_metric_families

from broker import Publisher, subscribe, unsubscribe
from broker.core import keys
from broker.operations.metrics import exposition, sampled_registry
from broker.operations.topic_stats import OTHER, top_topics, topic_statistics
from broker.testing import drain, make_workers
from scripts.rig.hook import run_worker
from worker.loop import Worker

QM = "TEST"
T0 = 1_800_000_000_000


class Clock:
    """The workers' injected clock, ms."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _worker(client, settings, clock: Clock, name: str = "w0") -> Worker:
    worker = Worker(client, settings, name=name, clock_ms=clock)
    worker.setup()
    return worker


def _publish(client, topics: dict[str, int], publisher: str = "p1") -> None:
    pub = Publisher(client, QM, publisher)
    for topic, times in topics.items():
        for n in range(times):
            pub.publish(topic, f"{topic} {n}".encode())


def test_publications_copies_and_last_time_appear_after_the_flush_interval(real_redis, settings):
    # Given a worker on an injected clock and two subscriptions on m/#
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    subscribe(real_redis, QM, "m/#", "app", "a")
    subscribe(real_redis, QM, "m/#", "app", "b")
    # When it delivers 3 publications on m/a and 2 on m/b within one flush interval
    _publish(real_redis, {"m/a": 3, "m/b": 2})
    assert drain([worker]) == 5
    # Then nothing is in Redis yet: the counts wait in the worker's memory
    assert topic_statistics(real_redis, settings, "m/a").publications == 0
    assert worker.housekeeping.topic_stats.topics["m/a"] == [3, 6, T0]
    # When the interval has passed and the worker runs a round
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    # Then each topic string has its publications, copies, last time and subscriptions
    a = topic_statistics(real_redis, settings, "m/a")
    assert (a.publications, a.copies, a.last_publication_ms, a.subscriptions) == (3, 6, T0, 2)
    b = topic_statistics(real_redis, settings, "m/b")
    assert (b.publications, b.copies, b.last_publication_ms) == (2, 4, T0)
    # When one more is delivered later, and flushed
    clock.now += 500
    _publish(real_redis, {"m/a": 1})
    drain([worker])
    delivered_at = clock.now
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    # Then the counts add up and the last publication time moves
    a = topic_statistics(real_redis, settings, "m/a")
    assert (a.publications, a.copies, a.last_publication_ms) == (4, 8, delivered_at)
    assert [(s.topic, s.publications) for s in top_topics(real_redis, settings, 10)] == [
        ("m/a", 4),
        ("m/b", 2),
    ]


def test_the_subscription_count_follows_subscribe_and_unsubscribe(real_redis, settings):
    # Given a topic string nobody subscribes to
    assert topic_statistics(real_redis, settings, "s/x").subscriptions == 0
    # When two subscriptions match it, and one is removed
    first = subscribe(real_redis, QM, "s/#", "app", "a")
    subscribe(real_redis, QM, "s/x", "app", "b")
    subscribe(real_redis, QM, "other", "app", "c")
    assert topic_statistics(real_redis, settings, "s/x").subscriptions == 2
    unsubscribe(real_redis, QM, first.sub_id)
    # Then the count follows at once (read from the routing table, not stored)
    assert topic_statistics(real_redis, settings, "s/x").subscriptions == 1


def test_many_topic_strings_stay_within_the_bound_in_memory_and_in_redis(real_redis, settings):
    # Given at most 5 topic strings kept
    settings = settings.model_copy(update={"topic_stats_max_topics": 5})
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    # When a publisher cycles 20 topic strings
    _publish(real_redis, {f"r/{n}": 1 for n in range(20)})
    drain([worker])
    # Then the worker kept 5 of them and counted the rest together
    counter = worker.housekeeping.topic_stats
    assert len(counter.topics) == 5 and counter.other[0] == 15
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    assert real_redis.hlen(keys.topic_publications(QM)) == 6  # 5 and ""
    # When another worker, its memory empty, sees 10 new topic strings
    other_worker = _worker(real_redis, settings, clock, name="w1")
    _publish(real_redis, {f"new/{n}": 1 for n in range(10)}, publisher="p2")
    drain([other_worker])
    clock.now += settings.topic_stats_flush_ms
    other_worker.run_once()
    # Then Redis still holds 5 topic strings: the new ones went to "(other topics)"
    assert real_redis.hlen(keys.topic_publications(QM)) == 6
    assert real_redis.zcard(keys.topic_last_publication(QM)) == 6
    rows = top_topics(real_redis, settings, 100)
    assert rows[-1].topic == OTHER and rows[-1].publications == 25 and rows[-1].subscriptions is None
    assert sum(r.publications for r in rows) == 30


def test_a_worker_killed_before_its_flush_loses_at_most_one_interval_and_a_warm_stop_flushes(
    real_redis, settings
):
    # Given a worker that flushed 3 publications
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    _publish(real_redis, {"k/a": 3})
    drain([worker])
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    # When it delivers 2 more within its next interval, and is killed (its memory is gone)
    _publish(real_redis, {"k/a": 2})
    drain([worker])
    del worker
    # Then those 2 are lost: the counts are statistics, at most one interval behind
    assert topic_statistics(real_redis, settings, "k/a").publications == 3
    # When a new worker delivers 1 and stops warm (SIGTERM) before its interval ends
    replacement = _worker(real_redis, settings, clock, name="w1")
    _publish(real_redis, {"k/a": 1})
    drain([replacement])
    replacement.shutdown()
    # Then the warm stop flushed it
    assert topic_statistics(real_redis, settings, "k/a").publications == 4


def test_a_foreign_statistics_key_is_logged_and_the_worker_goes_on(real_redis, settings, caplog):
    # Given a string where the publications hash belongs
    real_redis.set(keys.topic_publications(QM), "oops")
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    subscribe(real_redis, QM, "f/#", "app", "a")
    # When publications are delivered and the flush comes due
    _publish(real_redis, {"f/a": 2})
    assert drain([worker]) == 2
    clock.now += settings.topic_stats_flush_ms
    with caplog.at_level(logging.WARNING, logger="broker.worker"):
        worker.run_once()
    # Then the flush says why, writes nothing, and keeps the counts for later
    assert "topic statistics not flushed: foreign key" in caplog.text
    assert real_redis.get(keys.topic_publications(QM)) == b"oops"
    assert worker.housekeeping.topic_stats.topics["f/a"][0] == 2
    # and the worker still delivers
    _publish(real_redis, {"f/a": 1})
    assert drain([worker]) == 1


def test_turned_off_the_workers_count_nothing_and_write_no_key(real_redis, settings):
    # Given topic_stats_max_topics = 0
    settings = settings.model_copy(update={"topic_stats_max_topics": 0})
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    # When publications are delivered and time passes
    _publish(real_redis, {"o/a": 3})
    drain([worker])
    clock.now += 10 * settings.topic_stats_flush_ms
    worker.run_once()
    worker.shutdown()
    # Then there is no counter and no statistics key
    assert worker.housekeeping.topic_stats is None
    assert not real_redis.exists(
        keys.topic_publications(QM), keys.topic_copies(QM), keys.topic_last_publication(QM)
    )


def _series(text: str, name: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[sample.labels.get("topic", "")] = sample.value
    return out


def test_the_metrics_label_only_the_busiest_topic_strings(real_redis, settings):
    # Given publications on 6 topic strings (6, 5, 4, 3, 2 and 1 each) flushed, and 2 subscriptions
    settings = settings.model_copy(update={"metrics_max_topics": 3})
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    subscribe(real_redis, QM, "g/#", "app", "a")
    subscribe(real_redis, QM, "g/0", "app", "b")
    _publish(real_redis, {f"g/{n}": 6 - n for n in range(6)})
    drain([worker])
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    # When Prometheus scrapes
    text = exposition(sampled_registry(real_redis, settings))
    # Then the 3 busiest have their own series, the other 3 are one series without the label
    assert _series(text, "broker_topic_publications_total") == {"g/0": 6, "g/1": 5, "g/2": 4, "": 6}
    assert _series(text, "broker_topic_deliveries_total") == {"g/0": 12, "g/1": 5, "g/2": 4, "": 6}
    assert _series(text, "broker_topic_subscriptions") == {"g/0": 2, "g/1": 1, "g/2": 1}
    assert set(_series(text, "broker_topic_last_publication_timestamp_seconds").values()) == {T0 / 1000}


def test_topic_status_and_topic_stats_show_them_on_the_command_line(run, real_redis, settings):
    # Given 2 publications on c/a and 1 on c/b, flushed, and one subscription
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    subscribe(real_redis, QM, "c/#", "app", "a")
    _publish(real_redis, {"c/a": 2, "c/b": 1})
    drain([worker])
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    # When an operator asks for the status of c/a, and for the busiest topics
    status = run("topic", "status", "c/a")
    as_json = run("topic", "status", "c/a", "--json")
    listed = run("topic", "stats", "--top", "1")
    listed_json = run("topic", "stats", "--json")
    # Then they show the counts, the copies, the last time and the subscriptions
    assert status.exit_code == 0, status.output
    assert "statistics: 2 publications, 2 copies delivered" in status.output
    assert "1 subscriptions" in status.output
    stats = json.loads(as_json.output)["statistics"]
    assert stats == {
        "topic": "c/a",
        "publications": 2,
        "copies": 2,
        "last_publication_ms": T0,
        "subscriptions": 1,
    }
    assert listed.exit_code == 0 and "c/a" in listed.output and "c/b" not in listed.output
    assert [(r["topic"], r["publications"]) for r in json.loads(listed_json.output)] == [
        ("c/a", 2),
        ("c/b", 1),
    ]


def test_the_consoles_topic_page_shows_them(real_server, real_redis, settings):
    import warnings

    from broker.operations.acl import RoleSpec, add_user
    from broker.operations.console import create_app

    with warnings.catch_warnings():  # Starlette >= 1.x suggests httpx2
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    # Given 3 publications on v/a flushed, one subscription, and a monitor user
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    subscribe(real_redis, QM, "v/#", "app", "a")
    _publish(real_redis, {"v/a": 3})
    drain([worker])
    clock.now += settings.topic_stats_flush_ms
    worker.run_once()
    add_user(real_redis, QM, "watch", RoleSpec("monitor"), "watch-password-1")
    # When the monitor opens the topic's status page
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as console:
        login = console.post(
            "/login", data={"user": "watch", "password": "watch-password-1"}, follow_redirects=False
        )
        assert login.status_code == 303, login.text
        page = console.get("/topics?topic=v/a")
    # Then it shows the statistics
    assert page.status_code == 200
    shown = page.text[page.text.index('id="topic-statistics"') :]
    assert shown.startswith('id="topic-statistics">Statistics: 3 publication(s) delivered, 3 copies')
    assert "1 subscription(s)" in shown


def test_a_field_that_is_not_a_count_is_logged_and_the_other_topics_are_still_counted(
    real_redis, settings, caplog
):
    # Given a count written by hand that is not an integer
    real_redis.hset(keys.topic_publications(QM), "h/bad", "many")
    clock = Clock()
    worker = _worker(real_redis, settings, clock)
    # When publications on it and on another topic are flushed
    _publish(real_redis, {"h/bad": 1, "h/good": 2})
    assert drain([worker]) == 3
    clock.now += settings.topic_stats_flush_ms
    with caplog.at_level(logging.WARNING, logger="broker.worker"):
        worker.run_once()
    # Then the refusal is logged, the worker goes on, the other topic is counted, and reading shows 0
    assert "topic statistics: 1 of the flush's writes refused" in caplog.text
    assert topic_statistics(real_redis, settings, "h/good").publications == 2
    assert [(r.topic, r.publications) for r in top_topics(real_redis, settings, 5)] == [
        ("h/good", 2),
        ("h/bad", 0),
    ]
    text = exposition(sampled_registry(real_redis, settings))
    assert _series(text, "broker_topic_publications_total") == {"h/good": 2, "h/bad": 0}
    _publish(real_redis, {"h/good": 1})
    assert drain([worker]) == 1


def test_a_worker_sigkilled_after_a_commit_loses_only_its_unflushed_counts_and_none_is_counted_twice(
    real_redis, settings, tmp_path
):
    # Given 10 publications on one topic, one subscription, and a worker process that flushes
    # rarely, reads 3 at a time and SIGKILLs itself right after its first commit
    subscribe(real_redis, QM, "x/#", "app", "a")
    _publish(real_redis, {"x/a": 10})
    victim_settings = settings.model_copy(
        update={"topic_stats_flush_ms": 600_000, "batch_size": 3, "heads": 3}
    )
    plan = {"point": "after_commit", "action": "kill", "after": 1}
    proc = multiprocessing.get_context("spawn").Process(
        target=run_worker,
        args=(victim_settings.model_dump_json(), str(tmp_path), str(tmp_path / "worker.log"), plan),
    )
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    # When, its lease over, the other workers deliver the rest and stop warm
    for key in real_redis.scan_iter(match=keys.turn_key(QM, "*")):
        real_redis.delete(key)
    survivors = make_workers(real_redis, settings, 2)
    drain(survivors)
    for worker in survivors:
        worker.shutdown()
    # Then every publication was delivered once, and the statistics hold exactly the survivors'
    # publications: the victim's commit is lost from them (never added), none counted twice
    assert real_redis.llen(keys.sub_queue(QM, "app$a")) == 10
    survived = sum(w.processed for w in survivors)
    assert 0 < survived < 10
    assert topic_statistics(real_redis, settings, "x/a").publications == survived


def test_a_flush_of_more_topics_than_a_call_takes_is_several_calls_and_keeps_the_bound(
    real_redis, settings, monkeypatch
):
    # Given a counter of 7 topic strings, at most 5 kept, and calls of 3 topics each
    from broker.operations import topic_stats

    monkeypatch.setattr(topic_stats, "FLUSH_CHUNK", 3)
    counter = topic_stats.TopicCounter(5)
    for k in range(7):
        counter.topics[f"t/{k}"] = [k + 1, 2 * (k + 1), T0 + k]
    from broker.core.scripts import script_source

    real_redis.script_load(script_source("topic_stats"))
    real_redis.config_resetstat()
    # When it flushes
    flushed = counter.flush(real_redis, QM)
    # Then it took three calls and counted every publication: 5 topics on their own, 2 under OTHER
    assert int(real_redis.info("commandstats")["cmdstat_evalsha"]["calls"]) == 3
    assert flushed == sum(range(1, 8))
    counts = real_redis.hgetall(keys.topic_publications(QM))
    assert {k: int(v) for k, v in counts.items()} == {
        b"t/0": 1,
        b"t/1": 2,
        b"t/2": 3,
        b"t/3": 4,
        b"t/4": 5,
        OTHER.encode(): 6 + 7,
    }
