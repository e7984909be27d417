"""Fuzz the broker: thousands of bad inputs of every kind, among good publications, on real workers.

    python -m scripts.fuzz --inputs 10000 --seed 7

Starts its own server (``broker.core.server.Server``; ``--redis-url`` to use another), and three queue
managers, ``FZM`` (``mqtt`` scheme), ``FZS`` (``swiftmq``) and ``FZI`` (``swiftmq`` with indirect
subscriber selection), each with in-process workers (``broker.testing.make_workers``)
driven round by round after every chunk of inputs. Three well-behaved publishers per queue
manager publish on ``good/...`` (``good....``) to subscriptions with exact, wildcard, predicate,
selector and shared filters. Between their publications come the bad inputs
(``scripts.rig.fuzzing`` generates them, seeded):

- ``entry``: raw ``XADD`` fields of a publication, mutated (fields missing, given twice, of the
  wrong type, huge, not UTF-8, out of range; binary and oversized bodies; bad priorities,
  expirations, props JSON, origin and route; thousands of fields);
- ``envelope``: garbage pushed into a subscriber queue and received by a ``Subscriber``;
- ``topic``: topic strings and filters of both schemes, validated, and matched by the indexes
  (``TopicIndex``, ``HierarchyIndex``) against the reference ``matches``;
- ``selector``: selectors compiled and evaluated on random properties; LIKE against a reference;
- ``config``: settings, topic-object and network files (TOML, or not);
- ``admin``: subscribe, unsubscribe, link, unlink, topic define/alter/delete/apply, declare;
- ``record``: records written by hand into the hashes the workers read, sometimes a whole network
  around the queue manager (publications are then forwarded, past junk proxy records).

It checks that every bad input is answered by a clear error or a dead letter with a reason
(an entry: a journal record, and for a refused one a dead letter whose reason is not an
"internal error"; an envelope: a dead letter at once, reason "malformed envelope: ...", or
expired, or a valid message), that no worker raises (none dies), that an administrative
request that fails changes nothing, and that every good publication reaches each of its
subscriptions once, in its publisher's order (``broker.demo.oracle.score``). It prints a summary
and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from broker.clients.consumer import Subscriber
from broker.clients.publish import Publisher
from broker.core import hierarchy, keys, topic_rules
from broker.core.config import Settings, load_settings
from broker.core.connection import connect
from broker.core.errors import (
    ConfigError,
    InvalidMessage,
    InvalidSelector,
    InvalidTopic,
    InvalidTopicFilter,
    NoSuchSubscription,
)
from broker.core.hierarchy import HierarchyIndex
from broker.core.selectors import compile_selector, like
from broker.core.server import Server
from broker.core.topic_rules import TopicIndex, split_shared
from broker.demo.oracle import Expectation, score
from broker.testing import make_workers
from broker.topics.subscriptions import SubscriptionRecord, subscribe, unsubscribe
from broker.topics.topic_objects import load_file
from broker.topics.topology import load_network
from scripts.rig import fuzzing as fz
from worker.loop import Worker

#: The queue managers fuzzed: name, topic scheme, direct subscriber selection (swiftmq: False
#: makes a publication's topic a predicate over the declared topics).
LANES = (("FZM", "mqtt", True), ("FZS", "swiftmq", True), ("FZI", "swiftmq", False))

#: Kinds of bad input, and how often each comes.
KINDS = {"entry": 35, "envelope": 10, "topic": 15, "selector": 15, "config": 10, "admin": 10, "record": 5}

#: Good publishers per queue manager, with the priority each publishes at.
PRIORITIES = (4, 7, 2)

#: Longest a selector may take on one message, s (a longer one would stall a worker).
SELECTOR_BUDGET_S = 0.5

#: Most rounds of one drain of the workers.
MAX_ROUNDS = 2_000


@dataclass
class GoodSub:
    """A subscription of the good traffic and which good publications it is owed."""

    name: str
    topic_filter: str
    wants: Callable[[int, int, str], bool]  # (publisher index, seq, leaf) -> owed
    selector: str | None = None
    shared: bool = False
    record: SubscriptionRecord | None = None
    consumer: Subscriber | None = None
    received: list[tuple[str, bool]] = field(default_factory=list)


def good_subs(scheme: str) -> list[GoodSub]:
    if scheme == "mqtt":
        return [
            GoodSub("all", "good/#", lambda i, s, leaf: True),
            GoodSub("p0", "good/0/+", lambda i, s, leaf: i == 0),
            GoodSub("even", "good/#", lambda i, s, leaf: s % 2 == 0, selector="parity = 'even'"),
            GoodSub("x", "good/+/x", lambda i, s, leaf: leaf == "x"),
            GoodSub("sh", "$share/grp/good/#", lambda i, s, leaf: True, shared=True),
        ]
    return [
        GoodSub("all", "good", lambda i, s, leaf: True),
        GoodSub("p0", "good.0", lambda i, s, leaf: i == 0),
        GoodSub("even", "good", lambda i, s, leaf: s % 2 == 0, selector="parity = 'even'"),
        GoodSub("x", "good.%.x", lambda i, s, leaf: leaf == "x"),
        GoodSub("deep", "good.1.x.below", lambda i, s, leaf: i == 1 and leaf == "x"),
    ]


@dataclass
class Report:
    """What a fuzz run tried and found."""

    seed: int
    inputs: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "<kind>: <error type>"
    accepted: Counter[str] = field(default_factory=Counter)  # "<kind>: <what>"
    dead_lettered: Counter[str] = field(default_factory=Counter)  # reason class
    entry_outcomes: Counter[str] = field(default_factory=Counter)
    good_published: int = 0
    deliveries: int = 0
    scores: Counter[str] = field(default_factory=Counter)
    workers: int = 0
    worker_exceptions: int = 0
    violations: list[str] = field(default_factory=list)
    violation_kinds: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def violation(self, kind: str, text: str) -> None:
        self.violation_kinds[kind] += 1
        if self.violation_kinds[kind] <= 5:
            self.violations.append(f"{kind}: {text[:400]}")

    @property
    def ok(self) -> bool:
        return not self.violation_kinds

    def summary(self) -> str:
        lines = [
            f"fuzz: seed {self.seed}, {sum(self.inputs.values())} bad inputs in {self.seconds:.1f} s "
            f"(queue managers {', '.join(_lane_name(*lane) for lane in LANES)}, {self.workers} in-process workers)",
            "inputs by kind: " + _counts(self.inputs),
            "entries: " + _counts(self.entry_outcomes),
            "dead-lettered by reason class: " + _counts(self.dead_lettered),
            "errors by kind: " + _counts(self.errors),
            "accepted (valid after all): " + _counts(self.accepted),
            f"good publications: {self.good_published} -> {self.deliveries} deliveries: "
            + " ".join(f"{k}={self.scores[k]}" for k in ("lost", "duplicated", "out_of_order", "unexpected")),
            f"workers: {self.workers} running, exceptions escaped {self.worker_exceptions}",
            f"violations: {sum(self.violation_kinds.values())}"
            + (f" ({_counts(self.violation_kinds)})" if self.violation_kinds else ""),
        ]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)


def _lane_name(qm: str, scheme: str, direct: bool) -> str:
    return f"{qm} ({scheme}{'' if direct else ', indirect selection'})"


def _counts(counter: Counter[str]) -> str:
    if not counter:
        return "none"
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


class _LogWatch(logging.Handler):
    """Counts what the broker logs at ERROR or with a traceback (a bug on the worker's path)."""

    def __init__(self, report: Report) -> None:
        super().__init__(logging.ERROR)
        self.report = report

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("broker", "worker")):
            kind = "logged an exception" if record.exc_info else "logged an error"
            self.report.violation(kind, record.getMessage())


class Lane:
    """One queue manager under fuzz: its workers, good traffic and bad inputs."""

    def __init__(self, fuzz: Fuzz, qm: str, scheme: str, direct: bool, workers: int) -> None:
        self.fuzz = fuzz
        self.report = fuzz.report
        self.client = fuzz.client
        self.qm, self.scheme = qm, scheme
        self.sep = "/" if scheme == "mqtt" else "."
        self.settings = Settings(
            redis_url=fuzz.url,
            qm=qm,
            topic_scheme=scheme,
            direct_subscriber_selection=direct,
            # indirect selection reaches declared topics only: the good ones, and the victim's
            topics=[] if direct else [f"good.{i}.{leaf}" for i in range(3) for leaf in "xy"] + ["victim.m"],
            batch_size=100,
            heads=100,
            sweep_interval_ms=50,
            journal=True,
            journal_max_len=10_000_000,
            dead_letter_max_len=10_000_000,
            max_body_bytes=65_536,
            reply_ttl_ms=3_600_000,
            dedup_window_ms=3_600_000,
            flowcontrol_enabled=False,
            max_redeliveries=1,
            consumer_lease_ms=600_000,
        )
        self.stream = keys.publish_stream(qm)
        self.subs = good_subs(scheme)
        self.publishers: list[Publisher] = []
        self.expect: dict[str, Expectation] = {}
        self.good_entries: set[str] = set()
        self.bad_entries: dict[str, str] = {}  # entry id -> label
        self.sent: list[tuple[list[tuple[bytes, bytes]], str]] = []  # the last bad entries
        self.made: list[str] = []  # subscriptions the admin fuzz made
        self.planted: list[tuple[str, bytes | None]] = []  # records written by hand
        self.workers: list[Worker] = []
        self.worker_count = workers

    def setup(self) -> None:
        client, qm = self.client, self.qm
        self.workers = make_workers(client, self.settings, self.worker_count)
        for sub in self.subs:
            sub.record = subscribe(
                client,
                qm,
                sub.topic_filter,
                "gd",
                sub.name,
                selector=sub.selector,
                shared=sub.shared,
                scheme=self.scheme,
            )
        self.catchall = subscribe(client, qm, "#" if self.scheme == "mqtt" else "junk", "fz", "all")
        self.poison = subscribe(client, qm, self._topic("poison", "none"), "fz", "poison")
        self.victim = subscribe(
            client, qm, self._topic("victim") + ("/#" if self.scheme == "mqtt" else ""), "fz", "v"
        )
        self.protected = {s.record.sub_id for s in self.subs if s.record} | {
            self.catchall.sub_id,
            self.poison.sub_id,
            self.victim.sub_id,
        }
        self.publishers = [
            Publisher(client, qm, f"good-{i}", scheme=self.scheme, flow_control=False) for i in range(3)
        ]
        # The victim: messages in three bands and one in flight, which ids like "<victim>:p3" name.
        victim_pub = Publisher(client, qm, "victim", scheme=self.scheme, flow_control=False)
        for priority in (3, 4, 7):
            victim_pub.publish(self._topic("victim", "m"), b"v", priority=priority)
        self.drain()
        holder = Subscriber(client, qm, self.victim, self.settings, consumer_id="c1", heartbeat=False)
        assert len(holder.receive_many(1)) == 1
        self.watched = [
            *keys.sub_bands(qm, self.victim.sub_id),
            keys.consumer_inflight(qm, self.victim.sub_id, "c1"),
            keys.sub_consumers(qm, self.victim.sub_id),
            keys.sub_holder(qm, self.victim.sub_id),
            keys.sub_bell(qm, self.victim.sub_id),
        ]
        for sub in self.subs:
            assert sub.record is not None
            sub.consumer = Subscriber(
                client, qm, sub.record, self.settings, consumer_id="checker", heartbeat=False
            )
        self.catchall_consumer = Subscriber(
            client, qm, self.catchall, self.settings, consumer_id="checker", heartbeat=False
        )
        self.poison_consumer = Subscriber(
            client, qm, self.poison, self.settings, consumer_id="c-env", heartbeat=False
        )

    def _topic(self, *levels: str) -> str:
        return self.sep.join(levels)

    # -- inputs ----------------------------------------------------------------------------

    def publish_good(self, r: random.Random) -> None:
        i = r.randrange(len(self.publishers))
        publisher = self.publishers[i]
        seq = publisher.next_seq
        leaf = r.choice(("x", "y"))
        result = publisher.publish(
            self._topic(fz.GOOD, str(i), leaf),
            f"{i}:{seq}".encode(),
            properties={"parity": "even" if seq % 2 == 0 else "odd", "n": seq},
            priority=PRIORITIES[i],
        )
        assert result.seq == seq
        owed = frozenset(s.name for s in self.subs if s.wants(i, seq, leaf))
        self.expect[result.msgid] = Expectation(publisher.publisher_id, seq, owed)
        self.good_entries.add(result.entry_id)
        self.report.good_published += 1

    def entry(self, r: random.Random) -> None:
        if self.sent and r.random() < 0.05:  # a retry: the same fields again (a msgid: a duplicate)
            pairs, label = r.choice(self.sent)
            label = "again: " + label
        else:
            publisher = f"bad-{r.randrange(5)}"
            topic = self._topic("junk", publisher, r.choice(("x", "y", "z")))
            pairs, label = fz.bad_entry(r, publisher, topic, self.settings.max_body_bytes, self.scheme)
            self.sent = [*self.sent[-19:], (pairs, label)]
        entry_id = self.client.execute_command("XADD", self.stream, "*", *fz.flat(pairs))
        self.bad_entries[entry_id.decode()] = label

    def envelope(self, r: random.Random) -> None:
        report, client, qm = self.report, self.client, self.qm
        envelope, label = fz.garbage_envelope(r)
        band = r.choice(keys.sub_bands(qm, self.poison.sub_id))
        client.lpush(band, envelope)
        consumer = self.poison_consumer
        outcome = ""
        poison = keys.sub_poison(qm, self.poison.sub_id)
        dead_letters = client.xlen(poison)
        expired = int(client.get(keys.sub_expired(qm, self.poison.sub_id)) or 0)
        try:
            got = consumer.receive_many(1)
            for delivery in got:
                delivery.message  # noqa: B018 - decoded when read: InvalidMessage here
        except InvalidMessage:  # malformed header fields: dead-lettered as it was read
            report.errors["envelope: InvalidMessage"] += 1
            got = []
        except Exception as exc:
            report.violation("envelope", f"{label}: receive raised {type(exc).__name__}: {exc}")
            return
        if got:
            consumer.ack_many(got)
            outcome = "accepted"
            report.accepted["envelope: a valid message"] += 1
        elif int(client.get(keys.sub_expired(qm, self.poison.sub_id)) or 0) > expired:
            outcome = "expired"
            report.accepted["envelope: expired while waiting"] += 1
        elif client.xlen(poison) > dead_letters:
            (_, letter), *_ = client.xrevrange(poison, count=1)
            if letter[b"dlq.reason"].startswith(b"malformed envelope: "):
                outcome = "dead-lettered"
                report.dead_lettered["envelope: malformed, at once"] += 1
        left = sum(client.llen(k) for k in keys.sub_bands(qm, self.poison.sub_id))
        left += client.llen(consumer.inflight)
        if not outcome or left:
            report.violation("envelope", f"{label}: not answered ({outcome or 'no outcome'}, {left} left)")
            for k in (*keys.sub_bands(qm, self.poison.sub_id), consumer.inflight):
                client.delete(k)

    def admin(self, r: random.Random) -> None:
        report = self.report
        request = fz.admin_request(r, self.scheme, self.victim.sub_id, self.made)
        if request.op == "unsubscribe" and request.args["sub_id"] in self.protected:
            report.accepted["admin: skipped"] += 1
            return
        before = fz.snapshot(self.client, self.qm, self.watched)
        try:
            done = fz.run_admin(self.client, self.qm, self.scheme, request)
        except fz.ADMIN_ERRORS as exc:
            report.errors[f"admin {request.op}: {type(exc).__name__}"] += 1
            if fz.snapshot(self.client, self.qm, self.watched) != before:
                report.violation(
                    "half-written", f"{request} raised {type(exc).__name__} after writing: {exc}"
                )
            return
        except Exception as exc:
            report.violation("admin", f"{request} raised {type(exc).__name__}: {exc}")
            return
        if done.startswith("made:"):
            sub_id = done[5:]
            if sub_id not in self.protected and sub_id not in self.made:
                self.made.append(sub_id)
        elif done == "removed" and request.args["sub_id"] in self.made:
            self.made.remove(request.args["sub_id"])
        report.accepted[f"admin {request.op}: {done.split(':')[0]}"] += 1

    def record(self, r: random.Random) -> None:
        if r.random() < 0.2:  # a network around this queue manager: publications are forwarded
            records = fz.network_set(r, self.scheme, self.qm)
        else:
            records = [fz.corrupt_record(r, self.scheme, self.qm)]
        for what, field_, value in records:
            key = fz.record_key(self.qm, what)
            if field_ is None:
                self.client.set(key, value)
            else:
                self.client.hset(key, field_, value)
            self.planted.append((key, field_))
            self.report.accepted[f"record {what}: written"] += 1
        self.client.incr(keys.version(self.qm))

    # -- rounds ------------------------------------------------------------------------------

    def drain(self) -> None:
        raised: Counter[str] = Counter()
        for _ in range(MAX_ROUNDS):
            done = 0
            for worker in self.workers:
                try:
                    done += worker.run_once(block=False)
                except Exception as exc:
                    raised[worker.name] += 1
                    self.report.worker_exceptions += 1
                    self.report.violation(
                        "worker raised", f"{self.qm} {worker.name}: {type(exc).__name__}: {exc}"
                    )
            if max(raised.values(), default=0) >= 3:
                return
            if done == 0 and not any(w.turns for w in self.workers):
                return
        self.report.violation("stalled", f"{self.qm}: workers still busy after {MAX_ROUNDS} rounds")

    def end_of_chunk(self, r: random.Random) -> None:
        self.drain()
        problems = sum(len(w.table.problems) for w in self.workers[:1])
        if self.planted:
            self.report.accepted["record: problems named by the workers"] += problems
            pipe = self.client.pipeline(transaction=False)
            for key, field_ in self.planted:
                if field_ is None:
                    pipe.delete(key)
                else:
                    pipe.hdel(key, field_)
            pipe.incr(keys.version(self.qm))
            pipe.execute()
            self.planted.clear()
        if len(self.made) > 20 or r.random() < 0.2:
            for sub_id in self.made:
                with contextlib.suppress(NoSuchSubscription):  # a non-durable one the sweep removed
                    unsubscribe(self.client, self.qm, sub_id)
            self.made.clear()
        self.drain()
        self.consume()

    def consume(self) -> None:
        report = self.report
        for sub in self.subs:
            consumer = sub.consumer
            assert consumer is not None
            while True:
                got = consumer.receive_many(500)
                if not got:
                    break
                for delivery in got:
                    sub.received.append((delivery.message.msgid, delivery.redelivered))
                consumer.ack_many(got)
        consumer = self.catchall_consumer
        while True:
            try:
                got = consumer.receive_many(500)
                for delivery in got:
                    delivery.message  # noqa: B018 - decoded when read: InvalidMessage here
            except InvalidMessage as exc:
                report.violation("undecodable delivery", f"{self.qm}: {exc}")
                self.client.delete(consumer.inflight)
                continue
            if not got:
                break
            consumer.ack_many(got)
            report.accepted["entry: envelopes decoded by a consumer"] += len(got)

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        report, client = self.report, self.client
        self.end_of_chunk(random.Random(0))
        pending = client.xpending(self.stream, keys.WORKER_GROUP)["pending"]
        if pending:
            report.violation("unanswered", f"{self.qm}: {pending} entries still pending")
        journal: dict[str, list[str]] = {}
        for _, fields in _read_stream(client, keys.journal(self.qm)):
            journal.setdefault(fields[b"entry_id"].decode(), []).append(fields[b"status"].decode())
        reasons: dict[str, str] = {}
        for _, fields in _read_stream(client, keys.dead_letter(self.qm)):
            if b"dlq.subscription" not in fields:
                reasons[fields[b"dlq.entry_id"].decode()] = fields[b"dlq.reason"].decode("utf-8", "replace")
        for entry_id, label in self.bad_entries.items():
            statuses = journal.get(entry_id, [])
            if len(statuses) != 1:
                report.violation(
                    "unanswered" if not statuses else "answered twice", f"{entry_id} ({label}): {statuses}"
                )
                continue
            status = statuses[0]
            report.entry_outcomes[status] += 1
            if status == "refused":
                reason = reasons.get(entry_id, "")
                kind = fz.reason_class(reason)
                report.dead_lettered[kind] += 1
                if not reason:
                    report.violation("no dead letter", f"{entry_id} ({label}) was refused without one")
                elif kind == "internal error":
                    report.violation("internal error", f"{entry_id} ({label}): {reason}")
            else:
                report.accepted[f"entry: {status}"] += 1
        for entry_id in self.good_entries:
            if journal.get(entry_id) != ["delivered"]:
                report.violation("good publication", f"{self.qm} {entry_id}: {journal.get(entry_id)}")
        for sub in self.subs:
            owed = [m for m, e in self.expect.items() if sub.name in e.recipients]
            found = score(sub.name, sub.received, self.expect, owed)
            report.deliveries += found.received
            for name, count in found.counts().items():
                report.scores[name] += count
            if not found.ok:
                report.violation(
                    "good traffic", f"{self.qm} {sub.name}: {found.counts()} {found.examples[:3]}"
                )


def _read_stream(client: redis.Redis, key: str) -> list[tuple[str, dict[bytes, bytes]]]:
    out: list[tuple[str, dict[bytes, bytes]]] = []
    start = "-"
    while True:
        page: Any = client.xrange(key, start, "+", count=1_000)
        if not page:
            return out
        out += [(i.decode(), f) for i, f in page]
        start = "(" + page[-1][0].decode()


class Fuzz:
    """A fuzz run on the server at ``url``."""

    def __init__(self, url: str, seed: int, workers: int = 3) -> None:
        self.url = url
        self.report = Report(seed)
        self.rng = random.Random(seed)
        self.client = connect(url)
        self.lanes = [Lane(self, qm, scheme, direct, workers) for qm, scheme, direct in LANES]
        self.report.workers = workers * len(self.lanes)
        self.indexes: dict[str, tuple[Any, dict[str, str]]] = {
            "mqtt": (TopicIndex(), {}),
            "swiftmq": (HierarchyIndex(), {}),
        }
        self.tmp = Path(tempfile.mkdtemp(prefix="fuzz-"))

    def run(self, inputs: int, chunk: int = 100, good_ratio: float = 0.5) -> Report:
        report, r = self.report, self.rng
        watch = _LogWatch(report)
        root = logging.getLogger()
        level = root.level
        root.addHandler(watch)
        root.setLevel(logging.ERROR)
        started = time.monotonic()
        try:
            for lane in self.lanes:
                lane.setup()
            kinds, weights = list(KINDS), list(KINDS.values())
            for n in range(inputs):
                if r.random() < good_ratio:
                    r.choice(self.lanes).publish_good(r)
                kind = r.choices(kinds, weights)[0]
                report.inputs[kind] += 1
                lane = r.choice(self.lanes)
                if kind in ("entry", "envelope", "admin", "record"):
                    getattr(lane, kind)(r)
                else:
                    getattr(self, kind)(r)
                if (n + 1) % chunk == 0:
                    for lane in self.lanes:
                        lane.end_of_chunk(r)
            for lane in self.lanes:
                lane.finish()
        finally:
            root.removeHandler(watch)
            root.setLevel(level)
            shutil.rmtree(self.tmp, ignore_errors=True)
            report.seconds = time.monotonic() - started
        return report

    # -- inputs that need no server ----------------------------------------------------------

    def topic(self, r: random.Random) -> None:
        report = self.report
        scheme = r.choice(("mqtt", "swiftmq"))
        rules: Any = topic_rules if scheme == "mqtt" else hierarchy
        topic, topic_filter = fz.random_topic(r, scheme), fz.random_filter(r, scheme)
        try:
            rules.validate_topic(topic)
            report.accepted[f"topic ({scheme}): valid"] += 1
        except InvalidTopic as exc:
            report.errors[f"topic ({scheme}): InvalidTopic"] += 1
            if exc.suggestion is not None:
                try:
                    rules.validate_topic(exc.suggestion)
                except InvalidTopic:
                    report.violation("topic", f"suggestion {exc.suggestion!r} for {topic!r} is invalid")
        except Exception as exc:
            report.violation("topic", f"validate_topic({topic!r:.80}) raised {type(exc).__name__}: {exc}")
        try:
            rules.validate_filter(topic_filter)
            report.accepted[f"filter ({scheme}): valid"] += 1
        except InvalidTopicFilter:
            report.errors[f"filter ({scheme}): InvalidTopicFilter"] += 1
        except Exception as exc:
            report.violation(
                "topic", f"validate_filter({topic_filter!r:.80}) raised {type(exc).__name__}: {exc}"
            )
        # The index against the reference: add or remove a filter, then match a topic.
        index, filters = self.indexes[scheme]
        if filters and r.random() < 0.3:
            sub_id = r.choice(list(filters))
            index.remove(filters.pop(sub_id), sub_id)
        else:
            sub_id = f"s{r.randrange(10**9)}"
            filters[sub_id] = fz.matching_filter(r, scheme)
            index.add(filters[sub_id] if scheme == "swiftmq" else split_shared(filters[sub_id])[1], sub_id)
        topic = fz.matching_topic(r, scheme)
        expected = {s for s, f in filters.items() if rules.matches(f, topic)}
        found = index.match(topic)
        if found != expected:
            report.violation(
                "index", f"{scheme} {topic!r}: index {sorted(filters[s] for s in found ^ expected)} differ"
            )
        else:
            report.accepted[f"index ({scheme}): agreed with matches"] += 1
        if len(filters) > 60:
            self.indexes[scheme] = (TopicIndex() if scheme == "mqtt" else HierarchyIndex(), {})

    def selector(self, r: random.Random) -> None:
        report = self.report
        text = fz.garbage_selector(r) if r.random() < 0.5 else fz.valid_selector(r)
        try:
            compiled = compile_selector(text)
        except InvalidSelector:
            report.errors["selector: InvalidSelector"] += 1
        except Exception as exc:
            report.violation("selector", f"compile_selector({text!r:.80}) raised {type(exc).__name__}: {exc}")
        else:
            report.accepted["selector: compiled"] += 1
            for _ in range(3):
                properties = fz.random_properties(r)
                started = time.monotonic()
                try:
                    found = compiled.matches(properties)
                except Exception as exc:
                    report.violation(
                        "selector", f"{text!r:.80} on {properties!r:.80} raised {type(exc).__name__}"
                    )
                    continue
                took = time.monotonic() - started
                if not isinstance(found, bool) or took > SELECTOR_BUDGET_S:
                    report.violation("selector", f"{text!r:.80}: {found!r} after {took:.2f} s")
        pattern = "".join(r.choice("ab%_\\") for _ in range(r.randint(0, 8)))
        value = "".join(r.choice("ab%_\\\n") for _ in range(r.randint(0, 8)))
        try:
            got = like(pattern, value, "\\")
        except InvalidSelector:
            report.errors["LIKE pattern: InvalidSelector"] += 1
            return
        if got != fz.like_reference(pattern, value, "\\"):
            report.violation("LIKE", f"like({pattern!r}, {value!r}) is {got}, not as the reference")

    def config(self, r: random.Random) -> None:
        report = self.report
        which = r.choice(("settings", "topics", "network"))
        if r.random() < 0.2:
            document = fz.junk_document(r)
        elif which == "settings":
            document = fz.toml_document(fz.settings_toml(r))
        elif which == "topics":
            document = fz.toml_document(fz.topics_toml(r))
        else:
            document = fz.toml_document(fz.network_toml(r))
        path = self.tmp / f"{which}.toml"
        path.write_bytes(document)
        loader: Callable[[Path], Any] = {
            "settings": load_settings,
            "topics": load_file,
            "network": load_network,
        }[which]
        try:
            loader(path)
            report.accepted[f"config {which}: loaded"] += 1
        except ConfigError:
            report.errors[f"config {which}: ConfigError"] += 1
        except Exception as exc:
            report.violation("config", f"{which} file {document[:80]!r} raised {type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=10_000, help="bad inputs to try (default 10000)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a random one, printed)")
    parser.add_argument("--workers", type=int, default=3, help="in-process workers per queue manager")
    parser.add_argument("--chunk", type=int, default=100, help="inputs between two drains of the workers")
    parser.add_argument("--good-ratio", type=float, default=0.5, help="good publications per bad input")
    parser.add_argument(
        "--redis-url", default=None, help="fuzz this server (flushed!) instead of starting one"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    for name in [n for n in os.environ if n.startswith("BROKER_") and n != "BROKER_REDIS_SERVER_BIN"]:
        del os.environ[name]  # the config fuzz loads files, not this process's environment
    server = None if args.redis_url else Server().start()
    try:
        url = args.redis_url or server.url  # type: ignore[union-attr]
        connect(url).flushall()
        report = Fuzz(url, seed, args.workers).run(args.inputs, args.chunk, args.good_ratio)
    finally:
        if server is not None:
            server.stop()
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
