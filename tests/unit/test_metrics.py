"""Metrics without a server: the dashboard's names, reason codes, batched histograms, the recorder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.core.entries import parse_entry
from broker.core.errors import InvalidMessage
from broker.core.topic_rules import limit_problem, validate_topic
from broker.core.unit_of_work import Action, Outcome, UnitOfWork
from broker.operations.metrics import (
    DEAD_LETTER_REASONS,
    LATENCY_BUCKETS_MS,
    LATENCY_BUCKETS_SECONDS,
    METRICS,
    OUTCOMES,
    RENAMED,
    Recorder,
    _Batched,
    dead_letter_reason,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def _known_sample_names() -> set[str]:
    names = set(METRICS)
    for name, (kind, _) in METRICS.items():
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return names


def test_every_metric_the_dashboard_queries_is_defined_in_broker_metrics():
    # Given the Grafana dashboard shipped in docs/
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    used = {name for e in exprs for name in re.findall(r"\bbroker_[a-z_]+", e)}
    # Then each name it uses exists, and it shows every metric but none unknown
    assert used <= _known_sample_names(), used - _known_sample_names()
    families = {n for n in used if n in METRICS} | {
        n.rsplit("_", 1)[0] for n in used if n not in METRICS and n.rsplit("_", 1)[0] in METRICS
    }
    assert families == set(METRICS), set(METRICS) - families
    # and it imports as a Grafana dashboard with a Prometheus datasource input
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dashboard["panels"])
    assert any("histogram_quantile(0.99" in e for e in exprs)


def test_metric_names_carry_their_unit_and_kind():
    for name, (kind, help_text) in METRICS.items():
        assert name.startswith("broker_") and help_text
        assert name.endswith("_total") == (kind == "counter"), name
        if "latency" in name:  # Prometheus's base unit: seconds
            assert kind == "histogram" and name.endswith("_seconds"), name
        assert not re.search(r"_(ms|milliseconds|kb|mb|kilobytes|megabytes)(_|$)", name), name
    # the old names are gone, each with its new name
    for old, new in RENAMED.items():
        assert old not in METRICS and new in METRICS


def _invalid_message_reason(fields: dict[bytes, bytes]) -> str:
    with pytest.raises(InvalidMessage) as caught:
        parse_entry("1-0", fields, 10, 10)
    return str(caught.value)


def test_dead_letter_reasons_the_broker_writes_map_to_their_codes():
    # Given the reasons as the worker, the Lua scripts and the channel movers write them
    topic_problem = None
    try:
        validate_topic("a/#")
    except ValueError as exc:
        topic_problem = exc.reason  # type: ignore[attr-defined]
    cases = {
        "publishing on 'x' is disabled: topic object 'X' has PUB(DISABLED)": "pub_disabled",
        "subscriber queue {Q}:sub:a$b is full (MAXDEPTH 3, delivery ALL); delivered to no subscription": "queue_full",
        "foreign key: {Q}:sub:a$b holds a string, not a list; delivered to no subscription": "foreign_key",
        "subscription unavailable: {Q}:sub:a$b holds a string": "subscription_unavailable",
        "subscription unavailable: {Q}:sub:a$b:p7 holds a hash (delivery ALL); delivered to no subscription": (
            "subscription_unavailable"
        ),
        "taken over 6 times without being handled: its workers died (max_deliveries 5)": "max_deliveries",
        "delivered 11 times to consumers that died without acknowledging it (max_redeliveries 10)": "max_redeliveries",
        "expired while waiting in subscription a$b": "expired",
        "malformed envelope: envelope has no header line": "invalid_message",
        'publisher id "p" is not bound to principal alice': "not_authorized",
        "not in its publisher's FIFO {Q}:pub:p:fifo (deleted by hand?)": "orphaned_entry",
        "channel A -> B: unreadable transmission entry: envelope has no header line": "channel",
        "internal error: KeyError('x')": "internal_error",
        limit_problem("a/b/c", 100, 2, "/", "the topic"): "over_limit",
        _invalid_message_reason({b"publisher": b"p", b"topic": b"t", b"body": b"x" * 11}): "over_limit",
        _invalid_message_reason({b"publisher": b"p", b"topic": b"t", b"priority": b"12"}): "invalid_message",
        _invalid_message_reason({b"publisher": b"p"}): "invalid_message",
        "something new": "other",
    }
    for reason, code in cases.items():
        assert reason is not None
        assert dead_letter_reason(reason) == code, reason
    # A reason no rule knows, on a topic the scheme refuses, is an invalid topic
    assert topic_problem is not None
    assert dead_letter_reason(topic_problem, "a/#", lambda t: "#" not in t) == "invalid_topic"
    assert dead_letter_reason(topic_problem, "a/b", lambda t: "#" not in t) == "other"
    assert set(code for code in cases.values()) <= set(DEAD_LETTER_REASONS)


def test_a_batched_histogram_gives_what_observing_one_by_one_gives():
    values = [0, 0.5, 1, 1.5, 7, 99, 100, 101, 5_000, 70_000, 3, 3, 3]
    one, batched = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_ms", "x", buckets=LATENCY_BUCKETS_MS, registry=one)
    h2 = Histogram("x_ms", "x", buckets=LATENCY_BUCKETS_MS, registry=batched)
    for v in values:
        h1.observe(v)
    b = _Batched(h2, LATENCY_BUCKETS_MS)
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    for v in values[:-3]:
        counts[b.slot(v)] += 1
    b.add(counts, sum(values[:-3]))
    b.observe(3, 3)

    def samples(registry):
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if not s.name.endswith("_created")
        }

    assert samples(one) == samples(batched)


def test_a_batched_histogram_given_ms_gives_what_observing_seconds_one_by_one_gives():
    values_ms = [0, 1, 3, 7, 99, 250, 5_000, 70_000]
    one, batched = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_seconds", "x", buckets=LATENCY_BUCKETS_SECONDS, registry=one)
    h2 = Histogram("x_seconds", "x", buckets=LATENCY_BUCKETS_SECONDS, registry=batched)
    for v in values_ms:
        h1.observe(v / 1000)
    b = _Batched(h2, LATENCY_BUCKETS_MS, scale=0.001)
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    for v in values_ms:
        counts[b.slot(v)] += 1
    b.add(counts, sum(values_ms))

    def samples(registry):
        text = generate_latest(registry).decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if not s.name.endswith("_created")
        }

    got, want = samples(batched), samples(one)
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k]) for k in want)


def test_the_recorder_counts_a_batch_by_outcome_with_policy_skips_apart():
    recorder = Recorder()
    units = [
        (UnitOfWork("p", "1000-0", Action.DELIVER, "a"), Outcome.DELIVERED, 3, False),
        (UnitOfWork("p", "1000-1", Action.DELIVER, "b"), Outcome.DUPLICATE, 0, False),
        (UnitOfWork("p", "1000-2", Action.REFUSE, "c", policy=True), Outcome.REFUSED, 0, False),
        (UnitOfWork("p", "1000-3", Action.REFUSE, "d"), Outcome.REFUSED, 0, True),
        (UnitOfWork("q", "1000-4", Action.DELIVER, "e"), Outcome.FENCED, 0, False),
        (UnitOfWork("r", "1000-5", Action.EXPIRE, "f"), Outcome.EXPIRED, 0, True),
    ]
    recorder.committed(units, ("r",), 1_040, 1_050)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(recorder.registry).decode())
        for s in f.samples
    }
    by_outcome = {o: got[("broker_publications_total", (("outcome", o),))] for o in OUTCOMES}
    assert by_outcome == {
        "delivered": 1,
        "duplicate": 1,
        "expired": 1,
        "refused": 1,
        "skipped": 0,
        "skipped_by_policy": 1,
    }
    assert got[("broker_deliveries_total", ())] == 3
    assert got[("broker_end_to_end_latency_seconds_count", ())] == 5
    assert got[("broker_end_to_end_latency_seconds_sum", ())] == pytest.approx(0.25)  # 50 ms each
    assert got[("broker_unit_of_work_latency_seconds_sum", ())] == pytest.approx(0.05)  # 10 ms each
    assert got[("broker_end_to_end_latency_seconds_bucket", (("le", "0.05"),))] == 5
    assert got[("broker_turns_given_up_total", (("why", "drained"),))] == 1
    assert got[("broker_turns_given_up_total", (("why", "fair_share"),))] == 1


def test_a_scrape_while_a_worker_process_creates_its_file_leaves_that_file_out(tmp_path, monkeypatch):
    # Given the pool's multiprocess directory with one worker's counted file and one just created (empty)
    import fakeredis

    from broker.core.config import Settings
    from broker.operations.metrics import pool_registry

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    from prometheus_client import Counter as MultiCounter
    from prometheus_client import values

    single_process = values.ValueClass
    values.ValueClass = values.MultiProcessValue(lambda: 1)
    try:
        counter = MultiCounter("probe_total", "a probe", registry=None)
        counter.inc(3)
    finally:
        values.ValueClass = single_process
    (tmp_path / "counter_2.db").write_bytes(b"")
    registry = pool_registry(str(tmp_path), fakeredis.FakeRedis(), Settings(qm="T"))
    # When it is scraped
    text = generate_latest(registry).decode()
    # Then the scrape answers, with the counted file's figures
    assert "probe_total 3.0" in text
