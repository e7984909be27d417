"""The benchmark's workload: 1,000 topics, the subscriptions and links that fan each publication out to 10 queues, the bodies, selectors and topic objects; the code state a run records."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import redis

from broker.core import keys
from broker.topics.topic_objects import Attributes, TopicObject
from broker.topics.topic_objects import define as define_topic

#: Fan-out of every publication: subscriber queues it reaches.
FANOUT = 10
#: Publishers of the throughput runs (ids ``p00``..``p49``).
PUBLISHERS = 50
#: Body size of every publication, bytes (as in perf-anchors).
BODY_BYTES = 200
#: How often the drain is sampled, s.
POLL_S = 0.02
#: A run with no progress for this long is abandoned, s.
STALL_S = 60.0


class BenchError(RuntimeError):
    """A measurement could not be completed (stalled, lost deliveries, a dead process)."""


def code_state(repo: os.PathLike[str] | str) -> dict[str, Any]:
    """The commit measured and whether broker/ or worker/ had uncommitted changes (others edit concurrently)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
            ).stdout.rstrip("\n")
        except (OSError, subprocess.TimeoutExpired):
            return ""

    head = git("rev-parse", "--short", "HEAD").strip()
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "broker", "worker").splitlines()]
    diff = git("diff", "HEAD", "--", "broker", "worker")
    digest = hashlib.sha1(diff.encode()).hexdigest()[:8] if diff else ""
    describe = head + (f"+dirty({len(dirty)} files, diff {digest})" if dirty else "")
    return {"head": head, "dirty": dirty, "diff_sha1": digest, "describe": describe or "?"}


def bodies(count: int = 16, size: int = BODY_BYTES, seed: int = 7) -> list[bytes]:
    """``count`` different printable bodies of ``size`` bytes."""
    rng = random.Random(seed)
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 "
    return [bytes(rng.choice(alphabet) for _ in range(size)) for _ in range(count)]


# --------------------------------------------------------------------------------------------
# Topology: 1,000 topics, 1,450 subscriptions, 1,100 links; every topic reaches exactly 10 queues
# --------------------------------------------------------------------------------------------

TOPICS: list[str] = [f"bench/{r}/{c}/{j}" for r in range(10) for c in range(10) for j in range(10)]


def subscription_plan() -> list[tuple[str, str, str]]:
    """The subscriptions, as ``(filter, client id, durable name)``.

    A topic ``bench/r/c/j`` is matched by exactly one subscription of each
    kind below, so every publication goes to exactly ``FANOUT`` = 10 queues:

    ========================  ====  =====================================================
    filter                    subs  how it reaches ``bench/r/c/j``
    ========================  ====  =====================================================
    ``bench/r/c/j``           1000  exact
    ``bench/r/#``               10  ``#``
    ``bench/r/+/+``             10  ``+`` ``+``
    ``bench/+/+/j``             10  ``+`` ``+``
    ``bench/+/c/j``            100  ``+``
    ``bench/r/+/j``            100  ``+``
    ``bench/r/c/+``            100  ``+``
    ``+/r/#``                   10  ``+`` and ``#``; matches the topic *and* both linked
                                    topics below: three paths, delivered once (dedup)
    ``audit/r/c``              100  exact, only through the link ``bench/r/c/j -> audit/r/c``
    ``audit/r``                 10  exact, only through two links (``audit/r/c -> audit/r``)
    ========================  ====  =====================================================
    """
    rng10 = range(10)
    plan: list[tuple[str, str, str]] = []
    plan += [(f"bench/{r}/#", "hash", f"r{r}") for r in rng10]
    plan += [(f"bench/{r}/+/+", "plus2r", f"r{r}") for r in rng10]
    plan += [(f"bench/+/+/{j}", "plus2j", f"j{j}") for j in rng10]
    plan += [(f"bench/+/{c}/{j}", "plusr", f"c{c}j{j}") for c in rng10 for j in rng10]
    plan += [(f"bench/{r}/+/{j}", "plusc", f"r{r}j{j}") for r in rng10 for j in rng10]
    plan += [(f"bench/{r}/{c}/+", "plusj", f"r{r}c{c}") for r in rng10 for c in rng10]
    plan += [(f"+/{r}/#", "dedup", f"r{r}") for r in rng10]
    plan += [(f"audit/{r}/{c}", "link1", f"r{r}c{c}") for r in rng10 for c in rng10]
    plan += [(f"audit/{r}", "link2", f"r{r}") for r in rng10]
    plan += [(t, "exact", t.replace("/", "_")) for t in TOPICS]
    return plan


def link_plan() -> list[tuple[str, str]]:
    """The links: ``audit/r/c -> audit/r`` (100), then ``bench/r/c/j -> audit/r/c`` (1,000)."""
    plan = [(f"audit/{r}/{c}", f"audit/{r}") for r in range(10) for c in range(10)]
    plan += [(t, "audit/" + "/".join(t.split("/")[1:3])) for t in TOPICS]
    return plan


#: The same 1,000 topics as dot topics, for the swiftmq scheme.
SWIFT_TOPICS: list[str] = [t.replace("/", ".") for t in TOPICS]


def swiftmq_subscription_plan() -> list[tuple[str, str, str]]:
    """``subscription_plan`` in the swiftmq scheme: every ``bench.r.c.j`` reaches exactly 10 subscriptions.

    ``+`` levels become ``%`` predicates (320 of the 1,540 subscriptions, 21%); ``bench/r/#``
    becomes ``bench.r`` (a node receives its sub-nodes); ``+/r/#`` has no swiftmq form (the
    root cannot be a predicate) and becomes ``bench.r.c`` (100, plain). The links are
    ``bench.r.c.j -> audit.r.c`` only: ``audit.r`` receives what is delivered on its sub-node
    ``audit.r.c``, and a link ``audit.r.c -> audit.r`` would deliver on ``audit.r`` and so reach
    all ten ``audit.r.*`` (publishing on a node reaches its sub-nodes).
    """
    plan: list[tuple[str, str, str]] = []
    for topic_filter, client_id, name in subscription_plan():
        if topic_filter.startswith("+/"):
            continue  # replaced by the bench.r.c nodes below
        if topic_filter.endswith("/#"):
            topic_filter = topic_filter[:-2]
        plan.append((topic_filter.replace("/", ".").replace("+", "%"), client_id, name))
    plan += [(f"bench.{r}.{c}", "node", f"r{r}c{c}") for r in range(10) for c in range(10)]
    return plan


#: The selector of the selector variant of the topology (measurement 7): ~49% of the publications
#: (``selector_props``) have region 'eu' (70%) and an amount of 30 or more (70%).
SELECTOR = "region = 'eu' AND amount >= 30"
#: Every how many subscriptions of ``subscription_plan`` one carries ``SELECTOR`` (20%).
SELECTOR_EVERY = 5


def plan_selectors(count: int, selector: str | None, every: int = SELECTOR_EVERY) -> list[str | None]:
    """The selector of each of ``count`` planned subscriptions: ``selector`` for every ``every``-th
    (indexes ``every - 1``, ``2 * every - 1``, ...), None for the others (and for all when ``selector`` is None)."""
    return [selector if selector and i % every == every - 1 else None for i in range(count)]


def selector_props(rng: random.Random) -> dict[str, str | int]:
    """The user properties of one publication of the selector runs: ``region`` and ``amount``."""
    return {
        "region": "eu" if rng.random() < 0.7 else ("us" if rng.random() < 0.5 else "apac"),
        "amount": rng.randrange(100),
    }


#: How many administrative topic objects the topic-object variant defines (measurement 9).
TOPIC_OBJECTS = 200
#: maxdepth of some of them: far above anything a run puts in one queue (never reached).
HUGE_DEPTH = 10**9


def topic_object_plan(count: int = TOPIC_OBJECTS, seed: int = 13) -> list[TopicObject]:
    """``count`` topic objects over the benchmark's topic space, none of which changes a delivery.

    Topic strings are prefixes of ``TOPICS`` (and the link targets ``audit/r``), all in
    regions 0-8, so that 90% of the topics (and of the uniformly drawn publications) fall
    under an object and region 9 resolves up to ``SYSTEM.BASE.TOPIC``: ``bench/r`` (9),
    ``audit/r`` (9), ``bench/r/c`` (90) and then leaf topics ``bench/r/c/j`` drawn with
    ``seed`` (the rest). Attributes repeat the base's behaviour (``pubscope=ALL``,
    ``defprty=ASPARENT``, ``usedlq=YES``, ``pub=ENABLED``, ``capexpry=NOLIMIT``) and every
    fifth object has ``maxdepth=HUGE_DEPTH``: nothing is refused, re-prioritised or
    bounded, so the deliveries are those of the run without objects.
    """
    regions = range(9)
    strings = [f"bench/{r}" for r in regions] + [f"audit/{r}" for r in regions]
    strings += [f"bench/{r}/{c}" for r in regions for c in range(10)]
    leaves = [t for t in TOPICS if int(t.split("/")[1]) in regions]
    strings += sorted(random.Random(seed).sample(leaves, count - len(strings)))
    variants = (
        Attributes(pubscope="ALL", defprty="ASPARENT"),
        Attributes(pubscope="ALL", defprty="ASPARENT", usedlq="YES"),
        Attributes(pub="ENABLED", capexpry="NOLIMIT"),
        Attributes(pubscope="ALL", usedlq="YES"),
        Attributes(defprty="ASPARENT", maxdepth=HUGE_DEPTH),
    )
    return [
        TopicObject(
            name="BENCH." + s.replace("/", "."),
            topic_string=s,
            attributes=variants[i % len(variants)],
            description="bench: no effect on deliveries",
        )
        for i, s in enumerate(strings)
    ]


def topic_object_coverage(objects: Sequence[TopicObject]) -> float:
    """Share of ``TOPICS`` at or below the topic string of some object (the rest inherit from the base)."""
    bound = {o.topic_string for o in objects}
    covered = sum(1 for t in TOPICS if any("/".join(t.split("/")[:k]) in bound for k in range(1, 5)))
    return covered / len(TOPICS)


def define_topic_objects(client: redis.Redis, qm: str, objects: Sequence[TopicObject]) -> float:
    """Define ``objects`` (``broker.topics.topic_objects.define``, one version bump each) on a queue manager
    that must have none; returns the seconds taken.

    Raises:
        BenchError: ``{qm}:topics`` was not empty, or does not hold exactly ``objects`` afterwards.
    """
    key = keys.topic_objects(qm)
    if client.exists(key):
        raise BenchError(f"{key} holds {client.hlen(key)} topic objects before defining the bench's")
    start = time.perf_counter()
    for obj in objects:
        define_topic(client, qm, obj.name, obj.topic_string, obj.attributes, obj.description)
    taken = time.perf_counter() - start
    if client.hlen(key) != len(objects):
        raise BenchError(f"{key} holds {client.hlen(key)} topic objects, not {len(objects)}")
    return taken


def clear_topic_objects(client: redis.Redis, qm: str) -> None:
    """Remove every topic object (DEL ``{qm}:topics``) and bump ``{qm}:version`` so workers reload."""
    pipe = client.pipeline(transaction=True)
    pipe.delete(keys.topic_objects(qm))
    pipe.incr(keys.version(qm))
    pipe.execute()


#: The queue the latency consumer pops: ``bench/0/#`` receives every topic of region 0.
LATENCY_SUB = "hash$r0"
LATENCY_TOPICS = [t for t in TOPICS if t.startswith("bench/0/")]
