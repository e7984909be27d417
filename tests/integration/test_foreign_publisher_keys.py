"""Issue 24, bug 7: ``broker status`` named a wrong-type subscriber queue but not a wrong-type
FIFO, turn, flow or bell key; ``sweep_turns.lua`` answered a foreign ``{qm}:publishers`` with a
raw WRONGTYPE instead of the broker's "foreign key" error, and the worker logged that."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from broker import subscribe
from broker.core import keys
from broker.core.errors import ForeignKey
from broker.operations.status import status
from broker.testing import make_workers
from worker import loop
from worker.loop import Worker

QM = "TEST"


@pytest.mark.parametrize(
    ("kind", "plant", "found", "expected"),
    [
        ("fifo", "set", "string", "list"),
        ("turn", "hset", "hash", "string"),
        ("flow", "sadd", "set", "string"),
        ("bell", "set", "string", "list"),
    ],
)
def test_status_names_a_foreign_fifo_turn_flow_or_bell_key(real_redis, run, kind, plant, found, expected):
    # Given a subscription, and a key of the wrong type where the broker keeps one
    subscribe(real_redis, QM, "/T/#", "app", "s")
    key = keys.sub_bell(QM, "app$s") if kind == "bell" else getattr(keys, f"{kind}_key")(QM, "p:1")
    if plant == "set":
        real_redis.set(key, "oops")
    elif plant == "hset":
        real_redis.hset(key, "a", "b")
    else:
        real_redis.sadd(key, "a")
    # When an operator asks for the status (the library, and the CLI)
    problems = status(real_redis, QM).problems
    out = run("status")
    # Then the key is named, with what it holds and what the broker keeps there (then what the workers do)
    line = str(ForeignKey(key, found, expected))
    assert any(p.startswith(f"{line}: ") for p in problems), problems
    assert out.exit_code == 0 and line in " ".join(out.stdout.split()), out.output


def test_status_names_no_per_publisher_key_of_the_right_type(real_redis):
    real_redis.rpush(keys.fifo_key(QM, "p"), "1-0")
    real_redis.set(keys.turn_key(QM, "p"), "w0")
    real_redis.set(keys.flow_key(QM, "p"), "10")
    assert not [p for p in status(real_redis, QM).problems if "foreign key" in p]


def test_the_orphan_sweep_names_a_foreign_publishers_set_as_a_foreign_key(real_redis, settings):
    # Given a worker and a string where the set of active publishers belongs
    (worker,) = make_workers(real_redis, settings, 1)
    real_redis.set(keys.active_publishers(QM), "oops")
    # When the orphan sweep runs, it stops before writing with the broker's error, not WRONGTYPE
    with pytest.raises(ForeignKey) as caught:
        worker.scripts.sweep_turns(worker.name, settings.lease_ms, "0", 100)
    assert str(caught.value) == f"foreign key: {keys.active_publishers(QM)} holds a string, not a set"


def test_the_worker_logs_a_foreign_publishers_set_in_one_clear_line(
    real_redis, settings, caplog, monkeypatch
):
    # Given a worker whose rounds meet a foreign {qm}:publishers: in the orphan sweep (first
    # round), then in the dequeue (second round: the clock stands still, so no sweep is due)
    worker = Worker(real_redis, settings, name="w0", clock_ms=lambda: 1_000)
    worker.setup()
    real_redis.set(keys.active_publishers(QM), "oops")
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # its pause between retries: the second one stops it
        pauses.append(seconds)
        worker.stopping = len(pauses) == 2

    monkeypatch.setattr(loop, "time", SimpleNamespace(time=time.time, sleep=pause))
    caplog.set_level(logging.DEBUG, logger="broker.worker")
    # When it runs
    worker.run()
    # Then it logs the key, what it holds and that nothing was written, once, without Redis' raw text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"worker w0: foreign key: {keys.active_publishers(QM)} holds a string, not a set; "
        "nothing was written, waiting for it to be removed"
    ], errors
    assert any("retrying" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
