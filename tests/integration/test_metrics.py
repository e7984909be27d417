"""Prometheus metrics: a known workload through a real pool, scraped over HTTP, gives the exact counts."""

from __future__ import annotations

import os
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from broker import Publisher, subscribe
from broker.core import keys
from broker.core.server import free_port
from broker.operations.metrics import METRICS, NULL_RECORDER, Recorder
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


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return _samples(reply.read().decode())


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
    finally:
        pool.stop()
    # Then every count is exact
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
    assert _value(got, "broker_end_to_end_latency_ms_count") == 35
    assert _value(got, "broker_unit_of_work_latency_ms_count") == 35
    assert _value(got, "broker_end_to_end_latency_ms_bucket", le="+Inf") == 35
    assert _value(got, "broker_dequeue_batch_entries_sum") == 35  # every entry read once
    # and the sampled gauges are the known depths
    assert _value(got, "broker_subscription_depth", subscription="app$a") == 30
    assert _value(got, "broker_subscription_depth", subscription="app$b") == 30
    assert _value(got, "broker_subscriptions_depth") == 60
    assert _value(got, "broker_subscriptions") == 2
    assert _value(got, "broker_stream_length") == 35
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
    # Then its output parses, and holds the depths and dead letters
    assert result.exit_code == 0, result.output
    got = _samples(result.output)
    assert _value(got, "broker_subscription_depth", subscription="app$a") == 30
    assert _value(got, "broker_dead_letters_total", reason="pub_disabled") == 1
    assert _value(got, "broker_dead_letters_total", reason="invalid_topic") == 1
    assert _value(got, "broker_stream_pending") == 0
