"""The benchmark's registry (``scripts.bench.registry``): every ``--only`` name once, rows from figures."""

from __future__ import annotations

import pytest

from scripts.bench import cli
from scripts.bench.registry import NAMES, REGISTRY

#: The ``--only`` names the docs and scripts/bench_ab.py use.
ONLY = (
    "ceiling,broker,hot,latency,kombu,match,selectors,consume,topics,flow,slow,swiftmq,federation,"
    "security,metrics,regression,rabbit,aof,memory,e2e,instructions,publish,retained,delay,groups,topic_stats"
)


def test_every_only_name_is_registered_once():
    assert sorted(NAMES) == sorted(ONLY.split(","))
    assert len(set(NAMES)) == len(NAMES)
    assert cli._parse_args(["--only", ONLY]).only == set(NAMES)


def test_an_unknown_only_name_is_refused():
    with pytest.raises(SystemExit):
        cli._parse_args(["--only", "ceiling,nosuch"])


def test_no_figures_no_rows_and_runs_are_unique():
    assert [row for m in REGISTRY if m.rows for row in m.rows({})] == []
    runs = [name for m in REGISTRY for name in m.runs]
    assert len(set(runs)) == len(runs)


def test_a_skipped_peer_is_a_row_that_says_why():
    figures = {
        "rabbit": {"skipped": "rabbitmq-server is not installed"},
        "instructions": {"skipped": "no valgrind"},
    }
    rows = [row for m in REGISTRY if m.rows for row in m.rows(figures)]
    assert [(r.label, r.details) for r in rows] == [
        ("17. RabbitMQ", "skipped: rabbitmq-server is not installed"),
        ("21. instructions", "skipped: no valgrind"),
    ]
