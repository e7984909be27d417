"""Fuzzing on a real server: a short ``python -m scripts.fuzz`` run, bad publication entries
through real workers (hypothesis), and the bugs the fuzzing found on the workers' path."""

from __future__ import annotations

import itertools
import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.clients.consumer import Subscriber
from broker.core import keys
from broker.core.config import Settings
from broker.testing import drain, make_workers, queue_messages
from broker.topics.subscriptions import subscribe
from scripts.fuzz import Fuzz
from scripts.rig import fuzzing as fz

QM = "TEST"


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz run loads configuration files, which ``BROKER_*`` variables would override."""
    for name in [n for n in os.environ if n.startswith("BROKER_") and n != "BROKER_REDIS_SERVER_BIN"]:
        monkeypatch.delenv(name)


def test_a_short_fuzz_run_finds_nothing(real_server, real_redis, clean_environment):
    report = Fuzz(real_server.url, seed=7).run(inputs=500, chunk=50)
    assert report.ok, report.summary()
    assert sum(report.inputs.values()) == 500 and report.good_published > 0
    assert report.scores["lost"] == report.scores["duplicated"] == report.scores["out_of_order"] == 0


_qms = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False), st.sampled_from(["mqtt", "swiftmq"]))
def test_every_bad_entry_is_answered_and_the_good_ones_around_it_delivered_in_order(
    real_server, real_redis, r: random.Random, scheme: str
):
    qm = f"HY{next(_qms)}"
    sep = "/" if scheme == "mqtt" else "."
    config = Settings(
        redis_url=real_server.url, qm=qm, topic_scheme=scheme, journal=True, max_body_bytes=65_536
    )
    workers = make_workers(real_redis, config, 2)
    record = subscribe(real_redis, qm, f"good{sep}p", "gd", "all")
    stream = keys.publish_stream(qm)
    bad, good = [], []
    for n in range(6):
        good.append(
            real_redis.xadd(stream, {"publisher": "good-0", "topic": f"good{sep}p", "seq": n}).decode()
        )
        pairs, _ = fz.bad_entry(r, f"bad-{n % 2}", f"junk{sep}a", 65_536, scheme)
        bad.append(real_redis.execute_command("XADD", stream, "*", *fz.flat(pairs)).decode())
    drain(workers)
    journal = {f[b"entry_id"].decode(): f[b"status"].decode() for _, f in real_redis.xrange(keys.journal(qm))}
    letters = {
        f[b"dlq.entry_id"].decode(): f[b"dlq.reason"].decode("utf-8", "replace")
        for _, f in real_redis.xrange(keys.dead_letter(qm))
    }
    assert not real_redis.xpending(stream, keys.WORKER_GROUP)["pending"]
    for entry_id in bad:
        assert journal[entry_id] in ("delivered", "duplicate", "expired", "refused")
        if journal[entry_id] == "refused":
            assert letters[entry_id] and not letters[entry_id].startswith("internal error")
    assert [journal[e] for e in good] == ["delivered"] * 6
    received = queue_messages(real_redis, qm, record.sub_id)
    assert [m.seq for m in received] == list(range(6))


def test_an_entry_with_thousands_of_fields_is_dead_lettered_and_blocks_nobody(real_redis, settings):
    # The dead letter copied every field with one unpack(): above about 8,000 values Lua
    # failed, the commit failed for the whole batch, again and again.
    record = subscribe(real_redis, QM, "a/#", "gd", "all")
    workers = make_workers(real_redis, settings, 2)
    fields = {"publisher": "bad", "topic": "a/+", **{f"f{i}": "v" for i in range(5_000)}}
    entry_id = real_redis.xadd(keys.publish_stream(QM), fields).decode()
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "good", "topic": "a/b"})
    drain(workers)
    assert [m.publisher for m in queue_messages(real_redis, QM, record.sub_id)] == ["good"]
    (_, letter), *_ = real_redis.xrange(keys.dead_letter(QM))
    assert letter[b"dlq.entry_id"].decode() == entry_id and letter[b"dlq.fields"] == b"5002"
    assert b"wildcard" in letter[b"dlq.reason"] and len(letter) < 2_010
    assert not real_redis.xpending(keys.publish_stream(QM), keys.WORKER_GROUP)["pending"]


def test_a_field_given_twice_counts_once_its_first_value_as_the_fifo_it_was_ordered_in(real_redis, settings):
    record = subscribe(real_redis, QM, "a/#", "gd", "all")
    workers = make_workers(real_redis, settings, 1)
    real_redis.execute_command(
        "XADD", keys.publish_stream(QM), "*", "publisher", "first", "topic", "a/b", "publisher", "second"
    )
    drain(workers)
    (message,) = queue_messages(real_redis, QM, record.sub_id)
    assert message.publisher == "first"


def test_a_garbage_envelope_is_invalid_message_and_dead_lettered_at_once(real_redis, settings):
    record = subscribe(real_redis, QM, "poison/x", "gd", "poison")
    consumer = Subscriber(real_redis, QM, record, settings, consumer_id="c1", heartbeat=False)
    garbage = json.dumps({"msgid": "m", "publisher": "p", "topic": "t", "ts": 1, "route": 5}).encode() + b"\n"
    real_redis.lpush(keys.sub_queue(QM, record.sub_id), garbage)
    assert consumer.receive_many(1) == []  # dead-lettered as it was taken, never handed over
    assert consumer.in_flight() == 0 and real_redis.llen(keys.sub_queue(QM, record.sub_id)) == 0
    (_, letter), *_ = real_redis.xrange(keys.sub_poison(QM, record.sub_id))
    assert letter[b"envelope"] == garbage and letter[b"dlq.reason"].startswith(b"malformed envelope: ")
