"""The topology loaded through the admin API (subscriptions, links, the routes the ceiling replays) and the principals of the security rows."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from broker.core import keys
from broker.topics.explain import explain
from broker.topics.links import link
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import subscribe
from scripts.bench.workload import (
    FANOUT,
    SWIFT_TOPICS,
    TOPICS,
    BenchError,
    link_plan,
    plan_selectors,
    subscription_plan,
    swiftmq_subscription_plan,
)


@dataclass
class Topology:
    """The subscriptions and links, made once with the broker's admin API, and a DUMP to restore them.

    Attributes:
        qm: the queue manager.
        sub_ids: every subscription id.
        queues: every subscriber queue key.
        snapshot: key -> DUMP payload of the subscription, link and version keys.
        setup_s: how long subscribe + link took, s.
        checked: topic -> number of subscriptions ``admin.explain`` resolved it to.
        selective: the subscriptions made with a selector (``build(selector=...)``).
    """

    qm: str
    sub_ids: list[str] = field(default_factory=list)
    selective: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    snapshot: dict[str, bytes] = field(default_factory=dict)
    setup_s: float = 0.0
    checked: dict[str, int] = field(default_factory=dict)
    via: dict[str, list[str]] = field(default_factory=dict)
    scheme: str = "mqtt"
    topics: list[str] = field(default_factory=lambda: TOPICS)

    @classmethod
    def build(
        cls, client: redis.Redis, qm: str, sample: int = 8, selector: str | None = None, scheme: str = "mqtt"
    ) -> Topology:
        """Subscribe, link, check F with ``explain`` on ``sample`` topics, and DUMP the result.

        With ``selector``, every ``SELECTOR_EVERY``-th subscription of ``subscription_plan``
        carries it (``plan_selectors``); F is then the fan-out before selectors.

        Raises:
            BenchError: a sampled topic does not resolve to exactly ``FANOUT`` subscriptions.
        """
        swift = scheme == "swiftmq"
        topo = cls(qm, scheme=scheme, topics=SWIFT_TOPICS if swift else TOPICS)
        client.flushdb()
        start = time.perf_counter()
        plan = swiftmq_subscription_plan() if swift else subscription_plan()
        for (topic_filter, client_id, name), chosen in zip(
            plan, plan_selectors(len(plan), selector), strict=True
        ):
            record = subscribe(
                client,
                qm,
                topic_filter,
                client_id=client_id,
                durable_name=name,
                selector=chosen,
                scheme=scheme,
            )
            topo.sub_ids.append(record.sub_id)
            if chosen:
                topo.selective.append(record.sub_id)
        for source, target in link_plan():
            if swift:
                if source.startswith("audit/"):
                    continue  # audit.r receives audit.r.c's publications as its sub-node's already
                source, target = source.replace("/", "."), target.replace("/", ".")
            link(client, qm, source, target)
        topo.setup_s = time.perf_counter() - start
        topo.queues = [keys.sub_queue(qm, s) for s in topo.sub_ids]
        rng = random.Random(3)
        for topic in rng.sample(topo.topics, sample):
            route = explain(client, qm, topic)
            topo.checked[topic] = len(route.subscriptions)
            topo.via.setdefault("example", [f"{t}: {len(s)}" for t, s in route.via.items()])
            if len(route.subscriptions) != FANOUT:
                raise BenchError(
                    f"{topic} resolves to {len(route.subscriptions)} subscriptions, not {FANOUT}"
                )
        for key in (keys.subscriptions(qm), keys.links(qm), keys.version(qm), keys.manager(qm)):
            payload = client.dump(key)
            if payload is not None:
                topo.snapshot[key] = payload
        return topo

    def for_qm(self, qm: str) -> Topology:
        """The same topology for queue manager ``qm`` (its records do not name their queue manager)."""
        snapshot = {
            name(qm): self.snapshot[name(self.qm)]
            for name in (keys.subscriptions, keys.links, keys.version, keys.manager)
            if name(self.qm) in self.snapshot
        }
        queues = [keys.sub_queue(qm, s) for s in self.sub_ids]
        return dataclasses.replace(self, qm=qm, snapshot=snapshot, queues=queues)

    def restore(self, client: redis.Redis) -> None:
        """FLUSHDB, then RESTORE the subscriptions, links and version."""
        client.flushdb()
        pipe = client.pipeline(transaction=False)
        for key, payload in self.snapshot.items():
            pipe.restore(key, 0, payload)
        pipe.execute()

    def routes(self, client: redis.Redis) -> dict[str, tuple[str, ...]]:
        """topic -> queue keys, resolved by the broker's own ``RoutingTable``."""
        table = RoutingTable(self.qm)
        table.load(client)
        return {t: table.resolve(t).queues() for t in self.topics}


# --------------------------------------------------------------------------------------------
# CPU accounting from /proc (Linux)
# --------------------------------------------------------------------------------------------


@dataclass
class Principals:
    """The ACL users of a run with security on (14.): one publisher user per publisher id
    (``<id>-user``, bound to that id: it XADDs to its ingress stream ``{qm}:in:<id>-user``)
    and one worker user, made after the topology's restore (which flushes the bindings).

    Attributes:
        qm: the queue manager.
        clients: publisher id -> a client authenticated as its principal.
        worker_url: the Redis URL the workers connect with (the worker user's).
        password: every user's password (a throwaway server's users).
    """

    qm: str
    clients: dict[str, redis.Redis]
    worker_url: str
    password: str

    @classmethod
    def make(cls, client: redis.Redis, qm: str, url: str, ids: Sequence[str]) -> Principals:
        """Make the users on ``client``'s server (``url``: its URL, without credentials)."""
        from broker.operations.acl import RoleSpec, add_user

        password = uuid.uuid4().hex

        def as_user(user: str) -> str:
            return url.replace("redis://", f"redis://{user}:{password}@", 1)

        made: dict[str, redis.Redis] = {}
        for pid in ids:
            add_user(client, qm, f"{pid}-user", RoleSpec("publisher", [pid]), password)
            made[pid] = redis.Redis.from_url(as_user(f"{pid}-user"))
        add_user(client, qm, "bench-worker", RoleSpec("worker"), password)
        return cls(qm, made, as_user("bench-worker"), password)

    def principal(self, publisher_id: str) -> str:
        return f"{publisher_id}-user"

    def ingress(self) -> list[str]:
        """Every principal's ingress stream."""
        return [keys.ingress(self.qm, self.principal(pid)) for pid in self.clients]

    def close(self, client: redis.Redis) -> None:
        """Close the publishers' clients and delete every user."""
        for made in self.clients.values():
            made.close()
        client.execute_command("ACL", "DELUSER", "bench-worker", *map(self.principal, self.clients))
