"""Prometheus metrics: a known workload through a real pool, scraped over HTTP, gives the exact counts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.server import free_port
from broker.operations.metrics import (
    METRICS,
    NULL_RECORDER,
    MetricsServer,
    Recorder,
    RedisCollector,
    sampled_registry,
)
from broker.operations.topic_metrics import TOPIC_METRICS
from broker.testing import drain, make_workers, wait_for
from broker.topics.topic_objects import Attributes, define
from worker.pool import Pool

QM = "TEST"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return _samples(_text(port))


#: Units Prometheus's naming rules replace by the base unit (seconds, bytes): https://prometheus.io/docs/practices/naming/
_NOT_BASE_UNITS = re.compile(
    r"_(ms|msec|millis|milliseconds|us|microseconds|ns|nanoseconds|minutes|hours|days"
    r"|kb|mb|gb|kilobytes|megabytes|gigabytes|bits|percent)(_|$)"
)


def naming_problems(text: str) -> list[str]:
    """What in an exposition breaks Prometheus's naming rules, parsed by prometheus_client's parser:
    snake_case names with a known prefix, a HELP and a TYPE, base units, ``_total`` on counters and
    only on them."""
    problems = []
    for family in text_string_to_metric_families(text):
        name = family.name
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            problems.append(f"{name}: not snake_case")
        if not name.startswith(("broker_", "process_", "python_")):
            problems.append(f"{name}: no known prefix")
        if not family.documentation:
            problems.append(f"{name}: no HELP")
        if family.type not in ("counter", "gauge", "histogram", "info"):
            problems.append(f"{name}: type {family.type}")
        if _NOT_BASE_UNITS.search(name):
            problems.append(f"{name}: not in a base unit")
        if family.type == "counter":
            odd = {s.name for s in family.samples} - {f"{name}_total", f"{name}_created"}
            if odd:
                problems.append(f"{name}: counter samples {sorted(odd)} without _total")
        elif name.endswith("_total"):
            problems.append(f"{name}: a {family.type} named as a counter (_total)")
    return problems


def check_exposition(text: str) -> None:
    """The naming rules hold, the process and platform collectors are there, and ``promtool check
    metrics`` (Debian's ``prometheus`` package) passes when it is installed."""
    assert naming_problems(text) == []
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= names, names
    assert any(n.startswith("python_gc_") for n in names), names
    promtool = shutil.which("promtool")
    if promtool is not None:
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def _value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


_wait_for = wait_for


def _workload(client) -> None:
    """30 publications to 2 subscriptions, 2 duplicates, 1 expired, 1 invalid topic, 1 PUB(DISABLED)."""
    subscribe(client, QM, "m/#", "app", "a")
    subscribe(client, QM, "m/#", "app", "b")
    define(client, QM, "BLOCKED", "blocked", Attributes(pub="DISABLED"))
    publisher = Publisher(client, QM, "p1")
    for n in range(30):
        publisher.publish(f"m/{n % 3}", str(n).encode(), msgid=f"id-{n}")
    publisher.publish("m/0", b"again", msgid="id-0")
    publisher.publish("m/1", b"again", msgid="id-1")
    publisher.publish("m/2", b"late", expiration_ms=1)
    stream = keys.publish_stream(QM)
    client.xadd(stream, {"publisher": "p1", "topic": "m/#", "body": b"wild"})
    client.xadd(stream, {"publisher": "p1", "topic": "blocked/x", "body": b"no"})


def test_a_known_workload_gives_the_exact_counts_on_the_pools_metrics_endpoint(real_redis, settings):
    # Given a pool of 2 worker processes with metrics on a free port
    port = free_port()
    pool = Pool(settings.model_copy(update={"concurrency": 2, "metrics_port": port}))
    pool.start()
    try:
        assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ  # set for the children only
        # When a known workload is published and handled
        _workload(real_redis)
        got = _wait_for(
            lambda: (
                (s := _scrape(port))
                and sum(_value(s, "broker_publications_total", outcome=o) for o in ("delivered", "duplicate"))
                + sum(_value(s, "broker_publications_total", outcome=o) for o in ("expired", "refused"))
                + _value(s, "broker_publications_total", outcome="skipped_by_policy")
                == 35
                and s
            ),
            90,
            "35 publications counted",
        )
        text = _text(port)
    finally:
        pool.stop()
    # Then the exposition follows Prometheus's naming rules, with the process's own metrics
    check_exposition(text)
    # and every count is exact
    assert _value(got, "broker_publications_total", outcome="delivered") == 30
    assert _value(got, "broker_publications_total", outcome="duplicate") == 2
    assert _value(got, "broker_publications_total", outcome="expired") == 1
    assert _value(got, "broker_publications_total", outcome="refused") == 1
    assert _value(got, "broker_publications_total", outcome="skipped_by_policy") == 1
    assert _value(got, "broker_publications_total", outcome="skipped") == 0
    assert _value(got, "broker_deliveries_total") == 60
    assert _value(got, "broker_dead_letters_total", reason="invalid_topic") == 1
    assert _value(got, "broker_dead_letters_total", reason="pub_disabled") == 1
    assert sum(v for (name, _), v in got.items() if name == "broker_dead_letters_total") == 2
    assert _value(got, "broker_dead_letter_stream_length") == 2
    assert _value(got, "broker_end_to_end_latency_seconds_count") == 35
    assert _value(got, "broker_unit_of_work_latency_seconds_count") == 35
    assert _value(got, "broker_end_to_end_latency_seconds_bucket", le="+Inf") == 35
    assert _value(got, "broker_dequeue_batch_entries_sum") == 35  # every entry read once
    # and the sampled gauges are the known depths
    assert _value(got, "broker_subscription_depth", subscription="app$a") == 30
    assert _value(got, "broker_subscription_depth", subscription="app$b") == 30
    assert _value(got, "broker_subscriptions_depth") == 60
    assert _value(got, "broker_subscriptions") == 2
    assert _value(got, "broker_stream_length") <= 35  # the workers trim every trim_every_entries
    assert _value(got, "broker_stream_pending") == 0
    assert _value(got, "broker_stream_lag") == 0
    assert _value(got, "broker_sample_errors_total") == 0
    # and every name served is documented in broker.operations.metrics
    served = {name for name, _ in got}
    known = (
        set(METRICS) | set(TOPIC_METRICS) | {f"{n}_{s}" for n in METRICS for s in ("bucket", "count", "sum")}
    )
    known |= {f"{n[: -len('_total')]}_created" for n in {*METRICS, *TOPIC_METRICS} if n.endswith("_total")}
    known |= {f"{n}_created" for n in METRICS}
    served = {n for n in served if n.startswith("broker_")}  # process_*, python_*: prometheus-client's own
    assert served <= known, served - known


def test_the_pool_serves_nothing_and_workers_record_nothing_when_metrics_are_off(real_redis, settings):
    # Given the default settings (metrics_port 0)
    assert settings.metrics_port == 0
    worker = make_workers(real_redis, settings, 1)[0]
    # Then the worker's recorder is the no-op one
    assert worker.metrics is NULL_RECORDER
    # and with metrics_port set, a real recorder
    on = make_workers(real_redis, settings.model_copy(update={"metrics_port": free_port()}), 1)[0]
    assert isinstance(on.metrics, Recorder)


def test_broker_metrics_once_prints_what_redis_holds_in_the_text_format(real_redis, settings, run):
    # Given the known workload handled by in-process workers
    _workload(real_redis)
    drain(make_workers(real_redis, settings, 2))
    # When `broker metrics --once` runs
    result = run("metrics", "--once")
    # Then its output parses, follows the naming rules, and holds the depths and dead letters kept
    assert result.exit_code == 0, result.output
    check_exposition(result.output)
    got = _samples(result.output)
    assert _value(got, "broker_subscription_depth", subscription="app$a") == 30
    assert _value(got, "broker_dead_letter_stream_length") == 2
    # (the counter counts what the process saw: nothing, it has just started)
    assert sum(v for (name, _), v in got.items() if name == "broker_dead_letters_total") == 0
    assert _value(got, "broker_stream_pending") == 0


def test_broker_metrics_serves_the_naming_rules_and_counters_from_what_it_saw(real_redis, settings):
    # Given dead letters and withheld deliveries already in Redis (an earlier process's)
    _workload(real_redis)
    drain(make_workers(real_redis, settings, 2))
    real_redis.hset(keys.skipped(QM), "app$a", 7)
    real_redis.hset(keys.slow(QM), "app$a", 3)
    # When `broker metrics` starts (its registry, served over HTTP as the command does)
    port = free_port()
    server = MetricsServer(sampled_registry(real_redis, settings), port)
    try:
        before = _text(port)
        # and one more dead letter and two more withheld deliveries are written
        real_redis.xadd(keys.publish_stream(QM), {"publisher": "p1", "topic": "blocked/y", "body": b"no"})
        drain(make_workers(real_redis, settings, 1))
        real_redis.hincrby(keys.skipped(QM), "app$a", 2)
        real_redis.hincrby(keys.skipped(QM), "app$b", 1)  # a field first seen now: counted whole
        real_redis.hincrby(keys.slow(QM), "app$a", 1)
        after = _text(port)
    finally:
        server.close()
    # Then the counters start from what the process saw: the dead letters there at its start are not counted
    first, then = _samples(before), _samples(after)
    assert sum(v for (name, _), v in first.items() if name == "broker_dead_letters_total") == 0
    assert _value(first, "broker_deliveries_withheld_total", reason="maxdepth") == 0
    assert _value(first, "broker_deliveries_withheld_total", reason="slow_subscriber") == 0
    assert _value(then, "broker_dead_letters_total", reason="pub_disabled") == 1
    assert sum(v for (name, _), v in then.items() if name == "broker_dead_letters_total") == 1
    assert _value(then, "broker_dead_letter_stream_length") == 3
    assert _value(then, "broker_deliveries_withheld_total", reason="slow_subscriber") == 1
    assert (
        _value(then, "broker_deliveries_withheld_total", reason="maxdepth") == 2
    )  # 3 withheld, 1 of them slow
    # and both expositions follow the naming rules, with the process's own metrics
    check_exposition(before)
    check_exposition(after)


def test_a_collector_made_while_redis_is_away_starts_counting_at_its_first_scrape(real_redis, settings):
    # Given dead letters already there, and a collector whose first reads failed (Redis away)
    _workload(real_redis)
    drain(make_workers(real_redis, settings, 2))
    away = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    from broker.core.connection import connect

    collector = RedisCollector(connect(away.redis_url), away)
    # When Redis is back (its client now the real one) and it is scraped
    collector.client = real_redis
    families = {f.name: f for f in collector.collect()}
    # Then the dead letters there before its first scrape are not counted
    assert sum(s.value for s in families["broker_dead_letters"].samples if s.name.endswith("_total")) == 0
