"""Many queue managers, one topic space, against real servers (``broker.topics.topology``, ``broker.network.channel``).

The main topologies run on the session's 3-master Redis Cluster (``local_cluster``): each queue
manager lives in its own ``{qm}`` slot, so channels cross masters. Every test names its queue
managers with a fresh prefix and deletes their keys at the end (the cluster is shared with
``test_cluster.py``). Workers, agents and movers run in-process, round by round
(``Fed.settle``): nothing depends on timing.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from broker import cli
from broker.clients.publish import Publisher
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.models import Message
from broker.core.server import Server, free_port
from broker.network.channel import ChannelProcess
from broker.network.network_admin import apply_network, list_proxies, network_status, remove_proxies, withdraw
from broker.testing import drain, make_workers, queue_messages
from broker.topics.links import link
from broker.topics.subscriptions import subscribe, unsubscribe
from broker.topics.topic_objects import Attributes, define, delete
from broker.topics.topology import Topology, parse_network
from scripts.rig.cluster import LocalCluster

_tags = itertools.count()


class Fed:
    """A network of queue managers, driven in-process: in one Redis (a server or a cluster), or
    each in the Redis its node's ``url`` names.

    Queue managers are given by short names (``"A"``); their real names get a fresh prefix,
    applied to every name in the network (parents, static subscriptions, filters' ``at`` and
    ``router``). ``fed["A"]`` is the real name.
    """

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        qms: dict[str, dict[str, Any]],
        down: tuple[str, ...] = (),
        scheme: str = "mqtt",
        **network: Any,
    ) -> None:
        self.client, self.url, self.scheme = client, url, scheme
        self.prefix = f"F{next(_tags)}{uuid.uuid4().hex[:5]}-"
        self.short = list(qms)
        raw: dict[str, Any] = dict(network)
        raw["queue_managers"] = {
            self[q]: {**node, **({"parent": self[node["parent"]]} if node.get("parent") else {})}
            for q, node in qms.items()
        }
        raw["static_subscriptions"] = [
            {**s, "at": self[s["at"]], "to": self[s["to"]]} for s in network.get("static_subscriptions", ())
        ]
        raw["announce_filters"] = [
            {**f, "at": self[f["at"]], "router": self.prefix + f["router"]}
            for f in network.get("announce_filters", ())
        ]
        self.network = parse_network(raw)
        self.topology = Topology(self.network)
        applied = apply_network(self.network, url, client)
        assert not applied.failed, applied.results
        urls = {q: node.get("url") or url for q, node in qms.items()}
        self.clients = {q: client if urls[q] == url else connect(urls[q]) for q in qms}
        self.settings = {
            q: Settings(
                redis_url=urls[q],
                qm=self[q],
                batch_size=50,
                heads=50,
                lease_ms=30_000,
                sweep_interval_ms=1,
                topic_scheme=scheme,
            )
            for q in qms
        }
        self.workers = {q: make_workers(self.clients[q], self.settings[q], 1) for q in qms}
        self.channels = {
            q: ChannelProcess(self.clients[q], self.settings[q], name=f"ch-{self[q]}") for q in qms
        }
        #: stopped in an orderly way: their processes do not run, nor the movers towards them
        self.down: set[str] = set(down)
        #: crashed (their server is gone): their processes do not run, the movers towards them try
        self.crashed: set[str] = set()
        for q in qms:
            if q not in self.down:
                self.channels[q].rejoin()
        self.settle()

    def __getitem__(self, short: str) -> str:
        return self.prefix + short

    def up(self, q: str) -> None:
        """Start ``q``'s channel process and workers again (the channel process announces again)."""
        self.down.discard(q)
        self.crashed.discard(q)
        self.channels[q].rejoin()

    def stop(self, q: str, withdraw_first: bool = True) -> None:
        """An orderly shutdown of ``q``: withdraw its announcements, stop its workers and channel process."""
        if withdraw_first:
            withdraw(self.clients[q], self[q], self.settings[q].redis_url)
        self.down.add(q)

    def settle(self, max_rounds: int = 40) -> int:
        """Rounds of agents, workers, then movers, until a round changes and moves nothing.

        Movers towards a queue manager that is down do not run (its entries wait in the
        transmission stream; a channel's mover is made at its sender's first round, before
        anything is published). Returns the transmission entries moved.
        """
        total = 0
        for _ in range(max_rounds):
            up = [q for q in self.short if q not in self.down | self.crashed]
            # twice: an agent reconciling before another announced sees it in the second pass
            changed = [self.channels[q].agent.round() for _ in range(2) for q in up]
            committed = sum(drain(self.workers[q]) for q in up)
            down = {self[q] for q in self.down}
            moved = 0
            for q in up:
                channel = self.channels[q]
                for to, mover in channel.movers.items():  # a receiver that is down: its movers wait
                    mover.next_try_ms = 1 << 62 if to in down else 0
                moved += channel.run_once()
            total += moved
            if not any(changed) and not committed and not moved:
                return total
        raise AssertionError(f"the network did not settle in {max_rounds} rounds")

    def publish(self, q: str, publisher: str, topic: str, count: int, first: int = 0) -> list[str]:
        """``count`` publications at ``q`` by ``publisher`` (msgids ``<publisher>-<n>``); their msgids."""
        pub = Publisher(
            self.clients[q], self[q], publisher, flow_control=False, first_seq=first, scheme=self.scheme
        )
        ids = [f"{publisher}-{n}" for n in range(first, first + count)]
        for msgid in ids:
            pub.publish(topic, msgid.encode(), msgid=msgid)
        return ids

    def messages(self, q: str, sub_id: str) -> list[Message]:
        return queue_messages(self.clients[q], self[q], sub_id)

    def xmit(self, sender: str, to: str) -> list[Message]:
        """The publications in the transmission stream from ``sender`` to ``to``."""
        entries = self.clients[sender].xrange(keys.transmission(self[sender], self[to]))
        return [Message.from_envelope(fields[b"e"]) for _, fields in entries]

    def xmit_len(self, sender: str, to: str) -> int:
        return self.clients[sender].xlen(keys.transmission(self[sender], self[to]))

    def proxies(self, q: str) -> list[tuple[str, str, str]]:
        """``(remote short name, key, source)`` of the proxy subscriptions held at ``q``."""
        rows = list_proxies(self.clients[q], self[q])[0]
        return [(r.qm[len(self.prefix) :], r.topic, r.source) for r in rows]

    def route(self, message: Message) -> tuple[str, ...]:
        return tuple(q[len(self.prefix) :] for q in message.route)

    def cleanup(self) -> None:
        for key in list(self.client.scan_iter(match="{" + self.prefix + "*", count=1000)):
            self.client.delete(key)


def by_publisher(messages: list[Message]) -> dict[str, list[str]]:
    """publisher -> the msgids it received, in the order a consumer takes them."""
    found: dict[str, list[str]] = {}
    for message in messages:
        found.setdefault(message.publisher, []).append(message.msgid)
    return found


@pytest.fixture
def cluster_client(local_cluster: LocalCluster) -> Iterator[redis.Redis]:
    client = connect(local_cluster.url, check=True)
    yield client
    client.close()


@pytest.fixture
def make_fed(local_cluster: LocalCluster, cluster_client: redis.Redis) -> Iterator[Any]:
    """Build networks on the cluster; their keys are deleted after the test."""
    made: list[Fed] = []

    def build(qms: dict[str, dict[str, Any]], **rest: Any) -> Fed:
        fed = Fed(cluster_client, local_cluster.url, qms, **rest)
        made.append(fed)
        return fed

    yield build
    for fed in made:
        fed.cleanup()


def test_the_queue_managers_of_a_network_are_on_different_masters(local_cluster, make_fed):
    fed = make_fed({q: {} for q in "ABCDEFGH"})
    owners = {local_cluster.owner(keys.publish_stream(fed[q])) for q in "ABCDEFGH"}
    assert len(owners) > 1  # the channels below cross masters


# --- hierarchy ------------------------------------------------------------------------


def test_hierarchy_delivers_every_publication_once_in_order_and_proxies_follow_subscriptions(make_fed):
    # R is the root; A and B its children; C is A's child (a leaf)
    fed = make_fed({"R": {}, "A": {"parent": "R"}, "B": {"parent": "R"}, "C": {"parent": "A"}})
    assert all(fed.proxies(q) == [] for q in "RABC")  # no subscription: no proxy subscription

    # the first subscription at C makes proxy subscriptions everywhere else (SwiftMQ: "some")
    first = subscribe(fed.client, fed["C"], "news/#", "app", "all-news")
    second = subscribe(fed.client, fed["C"], "news/sport", "app", "sport")
    fed.settle()
    for q in "RAB":
        assert fed.proxies(q) == [("C", "news", "dynamic")], q
    assert fed.proxies("C") == []
    assert list(list_proxies(fed.client, fed["C"])[1]["keys"]) == ["news"]
    # a round with nothing new changes nothing: no version bump (the workers keep their tables)
    versions = [fed.client.get(keys.version(fed[q])) for q in "RABC"]
    assert not any(fed.channels[q].agent.round() for q in "RABC")
    assert [fed.client.get(keys.version(fed[q])) for q in "RABC"] == versions

    # publications from every queue manager, interleaved, two publishers at R
    expected: dict[str, list[str]] = {}
    for n in range(3):
        for q, publisher in (("R", "pR"), ("A", "pA"), ("B", "pB"), ("C", "pC"), ("R", "pR2")):
            expected.setdefault(publisher, []).extend(fed.publish(q, publisher, "news/world", 2, first=2 * n))
    fed.publish("B", "pB-other", "weather/x", 3)  # nobody subscribes: never forwarded
    fed.settle()
    received = fed.messages("C", first.sub_id)
    assert by_publisher(received) == expected  # each once, in per-publisher order
    routes = {m.publisher: (m.origin and m.origin[len(fed.prefix) :], fed.route(m)) for m in received}
    assert routes == {
        "pR": ("R", ("R", "A")),
        "pR2": ("R", ("R", "A")),
        "pA": ("A", ("A",)),
        "pB": ("B", ("B", "R", "A")),
        "pC": (None, ()),  # published here
    }
    assert fed.messages("C", second.sub_id) == []
    # each publication crossed each channel once, and only towards C
    assert [m.msgid for m in fed.xmit("B", "R")] == expected["pB"]
    assert sorted(m.msgid for m in fed.xmit("R", "A")) == sorted(
        expected["pR"] + expected["pR2"] + expected["pB"]
    )
    assert fed.xmit_len("R", "B") == fed.xmit_len("A", "R") == fed.xmit_len("C", "A") == 0
    status = network_status(fed.client, fed["R"], fed.url).as_dict()
    moved = {(c["from"][len(fed.prefix) :], c["to"][len(fed.prefix) :]): c for c in status["channels"]}
    assert {edge: (c["moved"], c["lag"]) for edge, c in moved.items()} == {
        ("R", "A"): (18, 0),
        ("R", "B"): (0, 0),
        ("A", "R"): (0, 0),
        ("A", "C"): (24, 0),
        ("B", "R"): (6, 0),
        ("C", "A"): (0, 0),
    }
    assert all(row["reachable"] and row["same_network"] for row in status["queue_managers"])

    # unsubscribing one of two keeps the proxy subscriptions ("some"), the last removes them ("none")
    unsubscribe(fed.client, fed["C"], first.sub_id)
    fed.settle()
    for q in "RAB":
        assert fed.proxies(q) == [("C", "news", "dynamic")], q
    unsubscribe(fed.client, fed["C"], second.sub_id)
    fed.settle()
    assert all(fed.proxies(q) == [] for q in "RABC")
    assert list_proxies(fed.client, fed["C"])[1]["keys"] == {}
    before = {(s, t): fed.xmit_len(s, t) for s in "RABC" for t in "RABC" if s != t}
    fed.publish("B", "pB", "news/world", 3, first=100)
    fed.settle()
    assert {(s, t): fed.xmit_len(s, t) for s in "RABC" for t in "RABC" if s != t} == before


# --- publish/subscribe clusters -------------------------------------------------------


@pytest.mark.parametrize("clroute", ["DIRECT", "TOPICHOST"])
def test_only_cluster_topics_cross_a_cluster_and_topichost_routes_through_the_host(make_fed, clroute):
    fed = make_fed({q: {"clusters": ["K"]} for q in ("H", "X", "Y")})
    # H defines the cluster topic object: with TOPICHOST it is the topic host
    define(fed.client, fed["H"], "SPORTS", "sports", Attributes(cluster="K", clroute=clroute))
    sport = subscribe(fed.client, fed["Y"], "sports/#", "app", "sport")
    local = subscribe(fed.client, fed["Y"], "news/#", "app", "news")
    fed.settle()
    # every member got the copy of the cluster topic object
    for q in "XY":
        copy = json.loads(fed.client.hget(keys.cluster_topics(fed[q]), "sports"))
        assert copy == {"cluster": "K", "clroute": clroute, "hosts": [fed["H"]]}

    sent = fed.publish("X", "pX", "sports/goal", 4) + fed.publish("H", "pH", "sports/goal", 2)
    fed.publish("X", "pX-news", "news/x", 3)  # a local topic: stays at X
    fed.publish("H", "pH-news", "news/x", 3)
    fed.settle()
    got = fed.messages("Y", sport.sub_id)
    assert sorted(m.msgid for m in got) == sorted(sent)
    assert by_publisher(got) == {"pX": sent[:4], "pH": sent[4:]}
    assert fed.messages("Y", local.sub_id) == []
    from_x = {fed.route(m) for m in got if m.publisher == "pX"}
    from_h = {fed.route(m) for m in got if m.publisher == "pH"}
    assert from_h == {("H",)}
    if clroute == "DIRECT":
        assert from_x == {("X",)}  # straight to Y
        assert fed.xmit_len("X", "H") == 0
    else:
        assert from_x == {("X", "H")}  # through the topic host
        assert fed.xmit_len("X", "Y") == 0 and fed.xmit_len("X", "H") == 4
    # no local topic was ever sent over a channel
    for sender, to in itertools.permutations("HXY", 2):
        assert all(m.topic.startswith("sports/") for m in fed.xmit(sender, to))

    # the object deleted, its copies go and the topic is local again
    delete(fed.client, fed["H"], "SPORTS")
    fed.settle()
    assert all(fed.client.hlen(keys.cluster_topics(fed[q])) == 0 for q in "HXY")
    fed.publish("X", "pX", "sports/goal", 2, first=4)
    fed.settle()
    assert sorted(m.msgid for m in fed.messages("Y", sport.sub_id)) == sorted(sent)


def test_a_local_topic_object_keeps_its_topics_out_of_the_cluster(make_fed):
    fed = make_fed({q: {"clusters": ["K"]} for q in ("H", "X", "Y")})
    define(fed.client, fed["H"], "SPORTS", "sports", Attributes(cluster="K"))
    define(fed.client, fed["X"], "PRIVATE", "sports/private", Attributes(cluster=""))
    sub = subscribe(fed.client, fed["Y"], "sports/#", "app", "sport")
    fed.settle()
    fed.publish("X", "pX", "sports/private/a", 2)
    sent = fed.publish("X", "pX2", "sports/public", 2)
    fed.settle()
    assert [m.msgid for m in fed.messages("Y", sub.sub_id)] == sent


def test_a_queue_manager_in_a_hierarchy_and_a_cluster_gets_no_duplicate(make_fed):
    # A parent of B; A, B and X in cluster K: A-B is both a hierarchy and a cluster edge
    fed = make_fed(
        {"A": {"clusters": ["K"]}, "B": {"parent": "A", "clusters": ["K"]}, "X": {"clusters": ["K"]}}
    )
    define(fed.client, fed["A"], "SPORTS", "sports", Attributes(cluster="K"))
    at_b = subscribe(fed.client, fed["B"], "#", "app", "everything")
    at_a = subscribe(fed.client, fed["A"], "sports/#", "app", "sport")
    fed.settle()
    sports = {q: fed.publish(q, f"p{q}", "sports/goal", 5) for q in "AXB"}
    news = {q: fed.publish(q, f"n{q}", "news/x", 3) for q in "AX"}
    fed.settle()
    assert by_publisher(fed.messages("B", at_b.sub_id)) == {
        "pA": sports["A"],
        "pX": sports["X"],
        "pB": sports["B"],
        "nA": news["A"],  # the hierarchy carries every topic
        # X is in no hierarchy: its local topic does not reach B
    }
    assert by_publisher(fed.messages("A", at_a.sub_id)) == {
        "pA": sports["A"],
        "pX": sports["X"],
        "pB": sports["B"],
    }
    assert [m.msgid for m in fed.xmit("A", "B")] == sports["A"] + news["A"]


@pytest.mark.parametrize("clroute", ["DIRECT", "TOPICHOST"])
def test_a_cycle_of_hierarchy_and_cluster_edges_with_links_loops_nowhere(make_fed, clroute):
    # hierarchy A <- B <- C, and A, B, C, D in cluster K (D defines the object: the topic host)
    fed = make_fed(
        {
            "A": {"clusters": ["K"]},
            "B": {"parent": "A", "clusters": ["K"]},
            "C": {"parent": "B", "clusters": ["K"]},
            "D": {"clusters": ["K"]},
        }
    )
    qms = "ABCD"
    define(fed.client, fed["D"], "SPORTS", "sports", Attributes(cluster="K", clroute=clroute))
    subs: dict[str, Any] = {}
    for q in qms:
        # a link on every queue manager: goals also reach the scores subscribers
        link(fed.client, fed[q], "sports/goal", "scores/goal")
        subs[q] = (
            subscribe(fed.client, fed[q], "sports/#", "app", "sport"),
            subscribe(fed.client, fed[q], "scores/#", "app", "scores"),
        )
    fed.settle()
    for q in qms:
        keys_at = {k for r, k, _ in fed.proxies(q)}
        assert keys_at == {"sports", "scores"}, q  # link sources are announced too

    goals: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    for n in range(3):  # interleaved publishers
        for q in qms:
            goals.setdefault(q, []).extend(fed.publish(q, f"g{q}", "sports/goal", 2, first=2 * n))
            others.setdefault(q, []).extend(fed.publish(q, f"o{q}", "sports/other", 1, first=n))
    scores = fed.publish("A", "sA", "scores/direct", 3)  # a local topic: the hierarchy only
    fed.settle()

    for q in qms:
        sport = by_publisher(fed.messages(q, subs[q][0].sub_id))
        assert sport == {f"g{o}": goals[o] for o in qms} | {f"o{o}": others[o] for o in qms}, q
        expected_scores = {f"g{o}": goals[o] for o in qms}
        if q in "ABC":
            expected_scores["sA"] = scores
        assert by_publisher(fed.messages(q, subs[q][1].sub_id)) == expected_scores, q

    # every publication crossed each channel at most once, along the route tree from its origin
    route_class = ("K", (fed["D"],) if clroute == "TOPICHOST" else ())
    real = {fed[q]: q for q in qms}
    expected_edges: dict[tuple[str, str], list[str]] = {}
    for origin in qms:
        edges: set[tuple[str, str]] = set()
        for dest in qms:
            path = fed.topology.path(route_class, fed[origin], fed[dest])
            assert path is not None
            edges |= {(real[a], real[b]) for a, b in itertools.pairwise(path)}
        for edge in edges:
            expected_edges.setdefault(edge, []).extend(goals[origin] + others[origin])
    for edge in itertools.permutations(qms, 2):
        carried = [m.msgid for m in fed.xmit(*edge) if m.topic.startswith("sports/")]
        assert sorted(carried) == sorted(expected_edges.get(edge, [])), edge
        assert len(set(carried)) == len(carried)
        for message in fed.xmit(*edge):
            assert edge[0] not in fed.route(message), "a publication came back to a queue manager"
    if clroute == "TOPICHOST":  # non-hosts talk through D or along the hierarchy
        assert fed.xmit("A", "C") == [] and fed.xmit("C", "A") == []


# --- PUBSCOPE and SUBSCOPE ------------------------------------------------------------


def test_pubscope_and_subscope_qmgr_keep_publications_and_subscriptions_local(make_fed):
    fed = make_fed({"A": {}, "B": {"parent": "A"}, "C": {"parent": "A"}})
    define(fed.client, fed["A"], "INTERNAL", "internal", Attributes(pubscope="QMGR"))
    define(fed.client, fed["B"], "PRIVATE", "private", Attributes(subscope="QMGR"))
    internal = subscribe(fed.client, fed["B"], "internal/#", "app", "internal")
    private = subscribe(fed.client, fed["B"], "private/#", "app", "private")
    news = subscribe(fed.client, fed["B"], "news/#", "app", "news")
    fed.settle()
    # SUBSCOPE(QMGR): B does not announce its private subscription
    assert fed.proxies("A") == [("B", "internal", "dynamic"), ("B", "news", "dynamic")]
    assert list(list_proxies(fed.client, fed["B"])[1]["keys"]) == ["internal", "news"]

    fed.publish("A", "pA", "internal/x", 3)  # PUBSCOPE(QMGR) at A: not forwarded
    from_c = fed.publish("C", "pC", "internal/x", 2)  # made at C: C forwards it, A passes it on
    fed.publish("A", "pA-private", "private/x", 2)
    fed.publish("C", "pC-private", "private/x", 2)
    sent_news = fed.publish("A", "pA-news", "news/x", 2)
    fed.settle()
    assert [m.msgid for m in fed.messages("B", internal.sub_id)] == from_c
    assert fed.messages("B", private.sub_id) == []
    assert [m.msgid for m in fed.messages("B", news.sub_id)] == sent_news
    assert sorted(m.msgid for m in fed.xmit("A", "B")) == sorted(from_c + sent_news)
    # a local subscriber at B still gets its own private publications
    mine = fed.publish("B", "pB", "private/y", 1)
    fed.settle()
    assert [m.msgid for m in fed.messages("B", private.sub_id)] == mine


def test_proxysub_force_announces_before_any_subscription(real_server, real_redis):
    fed = Fed(real_redis, real_server.url, {"A": {}, "B": {"parent": "A"}})
    define(real_redis, fed["B"], "ALERTS", "alerts", Attributes(proxysub="FORCE"))
    fed.settle()
    assert fed.proxies("A") == [("B", "alerts", "dynamic")]  # no subscription at B yet
    early = fed.publish("A", "p", "alerts/fire", 2)
    fed.settle()
    assert [m.msgid for m in fed.xmit("A", "B")] == early  # forwarded, delivered to nobody at B
    sub = subscribe(real_redis, fed["B"], "alerts/#", "app", "alerts")
    fed.settle()
    later = fed.publish("A", "p", "alerts/flood", 2, first=2)
    fed.settle()
    assert [m.msgid for m in fed.messages("B", sub.sub_id)] == later


# --- announce filters (seed 003) -------------------------------------------------------

SEED_TREE = {
    "primary": {},
    "util1": {"parent": "primary"},
    "util2": {"parent": "primary"},
    "app11": {"parent": "util1"},
    "app12": {"parent": "util1"},
    "app21": {"parent": "util2"},
}

SEED_FILTERS = [
    {"at": "app11", "name": "01", "router": "primary", "type": "include", "topics": ["global%"]},
    {"at": "app11", "name": "02", "router": "util1", "type": "include", "topics": ["global%", "request%"]},
    {"at": "app11", "name": "03", "router": "app1%", "type": "include", "topics": ["global%", "request%"]},
    {"at": "app11", "name": "04", "router": "%", "type": "exclude", "topics": ["request%", "local%"]},
]


def test_announce_filters_of_the_seed_decide_which_publications_reach_app11(make_fed):
    fed = make_fed(SEED_TREE, announce_filters=SEED_FILTERS)
    topics = ("globalnews", "requestA", "localB", "miscC")
    subs = {t: subscribe(fed.client, fed["app11"], t, "app", t) for t in topics}
    fed.settle()
    assert fed.proxies("primary") == [("app11", "globalnews", "dynamic")]
    assert fed.proxies("util1") == [("app11", "globalnews", "dynamic"), ("app11", "requestA", "dynamic")]
    assert fed.proxies("app12") == [("app11", "globalnews", "dynamic"), ("app11", "requestA", "dynamic")]
    # 04 announces all but request% and local% to the others: miscC too, though primary and
    # util1, on every path from them to app11, do not hold it
    assert (
        fed.proxies("util2")
        == fed.proxies("app21")
        == [("app11", "globalnews", "dynamic"), ("app11", "miscC", "dynamic")]
    )

    others = [q for q in SEED_TREE if q != "app11"]
    sent = {(q, t): fed.publish(q, f"{q}-{t}", t, 2) for q in [*others, "app11"] for t in subs}
    fed.settle()

    def origins(topic: str) -> list[str]:
        found = by_publisher(fed.messages("app11", subs[topic].sub_id))
        for publisher, ids in found.items():
            assert ids == sent[(publisher.split("-")[0], topic)]
        return sorted(p.split("-")[0] for p in found)

    assert origins("globalnews") == sorted(SEED_TREE)  # served by any node
    assert origins("requestA") == ["app11", "app12", "util1"]  # within util1's network
    assert origins("localB") == ["app11"]  # only the local app node
    assert origins("miscC") == ["app11"]  # util1 never holds it: nothing reaches app11
    # nothing that app11 cannot receive was forwarded towards it, not even part of the way
    for sender in SEED_TREE:
        for to in fed.topology.neighbours[fed[sender]]:
            carried = {m.topic for m in fed.xmit(sender, to[len(fed.prefix) :])}
            assert not carried & {"localB", "miscC"}, (sender, to)
            if sender in ("primary", "util2", "app21"):
                assert "requestA" not in carried, (sender, to)


# --- announce modes and the swiftmq scheme ---------------------------------------------


def test_announcing_whole_filters_forwards_only_matching_publications(real_server, real_redis):
    fed = Fed(
        real_redis, real_server.url, {"A": {}, "B": {"parent": "A"}, "C": {"parent": "A"}}, announce="topic"
    )
    eu = subscribe(real_redis, fed["C"], "news/+/eu", "app", "eu")
    shared = subscribe(real_redis, fed["C"], "$share/grp/sport/#", "app")
    fed.settle()
    assert (
        fed.proxies("A") == fed.proxies("B") == [("C", "news/+/eu", "dynamic"), ("C", "sport/#", "dynamic")]
    )
    wanted = fed.publish("B", "p1", "news/uk/eu", 2) + fed.publish("B", "p2", "news/fr/eu", 2)
    fed.publish("B", "p3", "news/uk/us", 2)
    goals = fed.publish("B", "p4", "sport/goal", 1)
    fed.settle()
    assert sorted(m.msgid for m in fed.messages("C", eu.sub_id)) == sorted(wanted)
    assert [m.msgid for m in fed.messages("C", shared.sub_id)] == goals
    assert {m.topic for m in fed.xmit("B", "A")} == {"news/uk/eu", "news/fr/eu", "sport/goal"}


@pytest.mark.parametrize("announce", ["root", "topic"])
def test_a_network_of_swiftmq_queue_managers(real_server, real_redis, announce):
    fed = Fed(
        real_redis,
        real_server.url,
        {"S": {}, "M": {"parent": "S"}, "D": {"parent": "M"}},
        scheme="swiftmq",
        announce=announce,
    )
    us = subscribe(real_redis, fed["D"], "iit.sales.US", "app", "us", scheme="swiftmq")
    fed.settle()
    key = "iit" if announce == "root" else "iit.sales.US"
    assert fed.proxies("S") == fed.proxies("M") == [("D", key, "dynamic")]
    # a subscription to a node receives its parents' and sub-nodes' publications (seed 003)
    wanted = (
        fed.publish("S", "p1", "iit", 1)
        + fed.publish("S", "p2", "iit.sales", 1)
        + fed.publish("S", "p3", "iit.sales.US", 1)
        + fed.publish("S", "p4", "iit.sales.US.east", 1)
    )
    fed.publish("S", "p5", "iit.sales.EU", 1)
    fed.publish("S", "p6", "iit.projects", 1)
    fed.publish("S", "p7", "other.sales.US", 1)
    fed.settle()
    assert sorted(m.msgid for m in fed.messages("D", us.sub_id)) == sorted(wanted)
    carried = {m.topic for m in fed.xmit("S", "M")}
    if announce == "root":  # the whole root topic is forwarded; D's own routing selects
        assert carried == {
            "iit",
            "iit.sales",
            "iit.sales.US",
            "iit.sales.US.east",
            "iit.sales.EU",
            "iit.projects",
        }
    else:
        assert carried == {"iit", "iit.sales", "iit.sales.US", "iit.sales.US.east"}


# --- static remote subscriptions ------------------------------------------------------


def _static_net(keep: bool) -> dict[str, Any]:
    return {
        "qms": {"S": {}, "M": {"parent": "S"}, "D": {"parent": "M"}},
        "static_subscriptions": [{"at": "S", "to": "D", "topic": "news", "keep_on_unsubscribe": keep}],
    }


def test_static_subscription_with_keep_on_unsubscribe_forwards_while_the_receiver_is_away(make_fed):
    net = _static_net(keep=True)
    fed = make_fed(net["qms"], static_subscriptions=net["static_subscriptions"])
    durable = subscribe(fed.client, fed["D"], "news/#", "app", "durable")
    fed.settle()
    assert fed.proxies("S") == [("D", "news", "dynamic"), ("D", "news", "static")]
    first = fed.publish("S", "pS", "news/a", 3)
    fed.settle()
    assert [m.msgid for m in fed.messages("D", durable.sub_id)] == first

    # D withdraws and stops for maintenance: S and M keep only the static proxy subscription
    fed.stop("D")
    fed.settle()
    assert fed.proxies("S") == fed.proxies("M") == [("D", "news", "static")]
    published_at_d = fed.client.xlen(keys.publish_stream(fed["D"]))
    while_away = fed.publish("S", "pS", "news/b", 5, first=3)
    fed.settle()
    assert [m.msgid for m in fed.xmit("M", "D")][-5:] == while_away  # waiting in the transmission stream
    assert fed.client.xlen(keys.publish_stream(fed["D"])) == published_at_d

    # D comes back: its channel process announces again, the movers run, nothing is lost
    fed.up("D")
    fed.settle()
    assert [m.msgid for m in fed.messages("D", durable.sub_id)] == first + while_away
    assert fed.proxies("S") == [("D", "news", "dynamic"), ("D", "news", "static")]
    # a mover running again moves nothing twice
    assert fed.settle() == 0
    assert len(fed.messages("D", durable.sub_id)) == 8


def test_static_subscription_without_keep_ends_once_the_receiver_has_announced(make_fed):
    net = _static_net(keep=False)
    fed = make_fed(net["qms"], down=("D",), static_subscriptions=net["static_subscriptions"])
    durable = subscribe(fed.client, fed["D"], "news/#", "app", "durable")
    # D never announced: the static subscription forwards already
    assert fed.proxies("S") == fed.proxies("M") == [("D", "news", "static")]
    before = fed.publish("S", "pS", "news/a", 3)
    fed.settle()
    assert [m.msgid for m in fed.xmit("M", "D")] == before

    fed.up("D")
    fed.settle()
    assert [m.msgid for m in fed.messages("D", durable.sub_id)] == before
    # seen once: only its announcement counts now
    assert fed.proxies("S") == [("D", "news", "dynamic")]

    fed.stop("D")
    fed.settle()
    assert fed.proxies("S") == fed.proxies("M") == []
    lengths = (fed.xmit_len("S", "M"), fed.xmit_len("M", "D"))
    fed.publish("S", "pS", "news/b", 4, first=3)
    fed.settle()
    assert (fed.xmit_len("S", "M"), fed.xmit_len("M", "D")) == lengths  # nothing forwarded
    fed.up("D")
    fed.settle()
    assert [m.msgid for m in fed.messages("D", durable.sub_id)] == before


# --- one server: the same Redis for every queue manager --------------------------------


def test_a_network_in_one_server_delivers_through_the_parent(real_server, real_redis):
    fed = Fed(real_redis, real_server.url, {"A": {}, "B": {"parent": "A"}, "C": {"parent": "A"}})
    sub = subscribe(real_redis, fed["C"], "flights/#", "cli1", "d1")
    fed.settle()
    sent = fed.publish("B", "p1", "flights/x", 5)
    fed.settle()
    got = fed.messages("C", sub.sub_id)
    assert [m.msgid for m in got] == sent
    assert {(m.origin, fed.route(m)) for m in got} == {(fed["B"], ("B", "A"))}
    status = network_status(real_redis, fed["A"], real_server.url).as_dict()
    assert status["network"] == fed.network.digest
    channels = {(c["from"][len(fed.prefix) :], c["to"][len(fed.prefix) :]): c for c in status["channels"]}
    assert set(channels) == {("A", "B"), ("B", "A"), ("A", "C"), ("C", "A")}
    assert channels[("B", "A")]["moved"] == 5 and channels[("B", "A")]["lag"] == 0
    assert channels[("A", "C")]["moved"] == 5 and channels[("A", "C")]["lag"] == 0
    assert all(row["reachable"] and row["same_network"] for row in status["queue_managers"])


def test_a_mover_sends_nothing_twice_after_losing_its_position(real_server, real_redis):
    fed = Fed(real_redis, real_server.url, {"A": {}, "B": {"parent": "A"}})
    sub = subscribe(real_redis, fed["B"], "t/#", "app", "d")
    fed.settle()
    sent = fed.publish("A", "p", "t/x", 4)
    fed.settle()
    filed = keys.received(fed["B"])
    assert real_redis.hget(filed, f"{fed['A']}:count") == b"4"
    # a new channel process (a restarted one) reads the position from the receiver
    fresh = ChannelProcess(real_redis, fed.settings["A"], name="ch-again")
    real_redis.delete(keys.channel_mover(fed["A"], fed["B"]))
    fed.channels["A"] = fresh
    assert fed.settle() == 0
    # a mover with a stale position (its reply was lost) sends again: the channel sequence drops it all
    mover = fresh.movers[fed["B"]]
    mover.last = "0-0"
    assert fed.settle() == 4
    assert real_redis.hget(filed, f"{fed['A']}:count") == b"4"
    assert real_redis.hget(keys.channel_state(fed["A"], fed["B"]), "dropped_as_filed") == b"4"
    # a receiver that lost its record files them again, and its workers drop them by message id
    real_redis.hdel(filed, fed["A"])
    mover.last = None
    assert fed.settle() == 4
    assert real_redis.hget(filed, f"{fed['A']}:count") == b"8"
    assert [m.msgid for m in fed.messages("B", sub.sub_id)] == sent


@pytest.mark.parametrize("point", ["before_channel_in", "after_channel_in"])
def test_a_move_that_fails_at_either_side_of_the_receiver_loses_and_repeats_nothing(
    real_server, real_redis, point
):
    fed = Fed(real_redis, real_server.url, {"A": {}, "B": {"parent": "A"}})
    sub = subscribe(real_redis, fed["B"], "t/#", "app", "d")
    fed.settle()
    failures: list[str] = []

    def fail_once(where: str) -> None:
        if where == point and not failures:
            failures.append(where)
            raise redis.ConnectionError(f"lost at {where}")

    for mover in fed.channels["A"].movers.values():
        mover.hook = fail_once
    sent = fed.publish("A", "p", "t/x", 3)
    fed.settle()
    assert failures == [point]
    state = real_redis.hgetall(keys.channel_state(fed["A"], fed["B"]))
    assert b"lost at " + point.encode() in state[b"last_error"]
    assert state[b"state"] == b"running"  # it moved again after the failure
    assert real_redis.hget(keys.received(fed["B"]), f"{fed['A']}:count") == b"3"
    assert [m.msgid for m in fed.messages("B", sub.sub_id)] == sent


def test_a_receiver_on_another_server_that_crashes_gets_everything_when_it_is_back(
    real_server, real_redis, tmp_path
):
    durable = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")
    other = Server(data_dir=tmp_path / "d", args=durable).start()
    try:
        here = real_server.url
        fed = Fed(
            real_redis,
            here,
            {"S": {"url": here}, "M": {"url": here, "parent": "S"}, "D": {"url": other.url, "parent": "M"}},
        )
        sub = subscribe(fed.clients["D"], fed["D"], "news/#", "app", "durable")
        fed.settle()
        assert fed.proxies("S") == fed.proxies("M") == [("D", "news", "dynamic")]
        first = fed.publish("S", "p", "news/a", 2)
        fed.settle()
        assert [m.msgid for m in fed.messages("D", sub.sub_id)] == first

        other.kill()  # D's server crashes: nothing withdrawn
        fed.crashed.add("D")
        while_gone = fed.publish("S", "p", "news/b", 3, first=2)
        fed.settle()
        # M cannot read D's announcement and keeps its proxy subscription; the mover retries
        assert fed.proxies("M") == [("D", "news", "dynamic")]
        assert [m.msgid for m in fed.xmit("M", "D")] == first + while_gone
        state = real_redis.hgetall(keys.channel_state(fed["M"], fed["D"]))
        assert state[b"state"] == b"retrying" and state[b"last_error"]
        assert int(state[b"backoff_ms"]) >= 100
        status = network_status(real_redis, fed["S"], here).as_dict()
        rows = {r["qm"]: r for r in status["queue_managers"]}
        assert rows[fed["D"]]["reachable"] is False and "error" in rows[fed["D"]]
        channel = next(c for c in status["channels"] if (c["from"], c["to"]) == (fed["M"], fed["D"]))
        assert channel["lag"] is None and channel["state"] == "retrying"

        restarted = Server(port=other.port, data_dir=tmp_path / "d", args=durable).start()
        try:
            fed.up("D")
            fed.settle()
            assert [m.msgid for m in fed.messages("D", sub.sub_id)] == first + while_gone
            state = real_redis.hgetall(keys.channel_state(fed["M"], fed["D"]))
            assert state[b"state"] == b"running" and state[b"backoff_ms"] == b"0"
        finally:
            fed.clients["D"].close()
            restarted.stop()
    finally:
        other.stop()


def test_an_operator_removes_the_proxies_of_a_queue_manager_that_left_without_withdrawing(
    real_server, real_redis
):
    # Given D on a server of its own, announcing news, then gone for good without withdrawing
    other = Server().start()
    try:
        here = real_server.url
        fed = Fed(real_redis, here, {"S": {}, "D": {"url": other.url, "parent": "S"}})
        subscribe(fed.clients["D"], fed["D"], "news/#", "app", "durable")
        fed.settle()
        assert fed.proxies("S") == [("D", "news", "dynamic")]
        other.kill()
        fed.crashed.add("D")
        fed.settle()
        assert fed.proxies("S") == [("D", "news", "dynamic")]  # kept: D cannot be read
        # When the operator removes them (SwiftMQ: delete the remote router subscriptions)
        version = int(real_redis.get(keys.version(fed["S"])))
        assert remove_proxies(real_redis, fed["S"], fed["D"]) == 1
        assert int(real_redis.get(keys.version(fed["S"]))) == version + 1
        # Then the channel process does not put them back while D is gone, and nothing is forwarded
        fed.settle()
        assert fed.proxies("S") == []
        fed.publish("S", "p", "news/a", 3)
        fed.settle()
        assert fed.xmit_len("S", "D") == 0
        assert remove_proxies(real_redis, fed["S"], fed["D"]) == 0
    finally:
        other.stop()


# --- the command line ------------------------------------------------------------------


@pytest.fixture
def run_at(real_server, real_redis, tmp_path, monkeypatch):
    """Invoke ``broker --redis-url <server> --qm <qm> ...`` (CliRunner) without config file or BROKER_* variables."""
    monkeypatch.chdir(tmp_path)
    env = {k: None for k in os.environ if k.startswith("BROKER_") and k != "BROKER_REDIS_SERVER_BIN"}
    runner = CliRunner(env=env)

    def invoke(qm: str, *args: str) -> Result:
        return runner.invoke(cli.main, ["--redis-url", real_server.url, "--qm", qm, *args])

    return invoke


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.output, result.exc_info)
    return result


NETWORK_TOML = """
announce = "root"
[queue_managers.HUB]
[queue_managers.LEAF]
parent = "HUB"
"""


def test_network_commands_from_apply_to_withdraw(run_at, real_server, real_redis, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[queue_managers.HUB]\nparent = "LEAF"\n[queue_managers.LEAF]\nparent = "HUB"\n')
    refused = run_at("HUB", "network", "apply", str(bad))
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: ") and "cycle" in refused.stderr and "bad.toml" in refused.stderr
    assert "Traceback" not in refused.output
    missing = run_at("HUB", "network", "apply", str(tmp_path / "none.toml"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[queue_managers.LEAF]\nparent = "NOWHERE"\n')
    refused = run_at("HUB", "network", "apply", str(unknown))
    assert refused.exit_code == 2 and "parent 'NOWHERE' is not in the network" in refused.stderr

    good = tmp_path / "network.toml"
    good.write_text(NETWORK_TOML)
    dry = json.loads(ok(run_at("HUB", "network", "apply", "--dry-run", str(good))).stdout)
    assert dry["channels"] == {"HUB": ["LEAF"], "LEAF": ["HUB"]}
    assert dry["queue_managers"]["LEAF"] == {"parent": "HUB", "clusters": []}
    assert real_redis.get(keys.network("HUB")) is None  # a dry run changes nothing
    assert "is in no network" in ok(run_at("HUB", "status", "--network")).stdout

    applied = ok(run_at("HUB", "network", "apply", str(good))).stdout
    assert applied.splitlines() == ["HUB: applied", "LEAF: applied"]
    assert ok(run_at("HUB", "network", "apply", str(good))).stdout.splitlines() == [
        "HUB: unchanged",
        "LEAF: unchanged",
    ]
    assert json.loads(ok(run_at("LEAF", "network", "show")).stdout)["digest"] == dry["digest"]

    sub = subscribe(real_redis, "LEAF", "news/#", "app", "durable")
    once = ok(run_at("LEAF", "channel", "--once")).stdout
    assert once.strip() == "LEAF: moved 0 transmission entries; channels: HUB"
    ok(run_at("HUB", "channel", "--once"))
    proxies = json.loads(ok(run_at("HUB", "proxies", "--json")).stdout)
    assert [(p["qm"], p["topic"], p["source"]) for p in proxies["proxies"]] == [("LEAF", "news", "dynamic")]
    table = ok(run_at("HUB", "proxies")).stdout
    assert "LEAF" in table and "news" in table and "dynamic" in table
    assert "LEAF announces (up): news" in ok(run_at("LEAF", "proxies")).stdout

    settings = Settings(redis_url=real_server.url, qm="HUB")
    hub_workers = make_workers(real_redis, settings, 1)
    Publisher(real_redis, "HUB", "p", flow_control=False).publish("news/x", b"one", msgid="m1")
    drain(hub_workers)
    status = json.loads(ok(run_at("HUB", "status", "--network", "--json")).stdout)
    channel = {(c["from"], c["to"]): c for c in status["channels"]}
    assert channel[("HUB", "LEAF")]["lag"] == 1
    assert [p["qm"] for p in status["proxies"]] == ["LEAF"]
    assert {q["qm"]: q["announced"] for q in status["queue_managers"]} == {"HUB": [], "LEAF": ["news"]}
    # the earlier `channel --once` at HUB left its mover lease (MOVER_LEASE_MS): another process
    # would move nothing until it expires, so end it as if it had run out
    real_redis.delete(keys.channel_mover("HUB", "LEAF"))
    assert "moved 1 transmission entries" in ok(run_at("HUB", "channel", "--once")).stdout
    drain(make_workers(real_redis, Settings(redis_url=real_server.url, qm="LEAF"), 1))
    assert [m.msgid for m in queue_messages(real_redis, "LEAF", sub.sub_id)] == ["m1"]
    status = json.loads(ok(run_at("HUB", "status", "--network", "--json")).stdout)
    channel = {(c["from"], c["to"]): c for c in status["channels"]}
    assert channel[("HUB", "LEAF")]["lag"] == 0 and channel[("HUB", "LEAF")]["moved"] == 1
    text = ok(run_at("HUB", "status", "--network")).stdout
    assert f"network {dry['digest']} as seen from HUB" in text and "HUB -> LEAF" in text

    assert ok(run_at("LEAF", "network", "withdraw")).stdout.strip() == "LEAF: withdrawn (0 keys announced)"
    ok(run_at("HUB", "channel", "--once"))
    assert json.loads(ok(run_at("HUB", "proxies", "--json")).stdout)["proxies"] == []
    assert "HUB holds no proxy subscriptions" in ok(run_at("HUB", "proxies")).stdout
    Publisher(real_redis, "HUB", "p", flow_control=False).publish("news/x", b"two", msgid="m2")
    drain(hub_workers)
    assert real_redis.xlen(keys.transmission("HUB", "LEAF")) == 1  # m2 is not forwarded


def test_apply_reports_a_queue_manager_it_cannot_reach_and_status_shows_it(run_at, real_server, tmp_path):
    gone = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    path = tmp_path / "network.toml"
    path.write_text(
        f'[queue_managers.HUB]\nurl = "{real_server.url}"\n'
        f'[queue_managers.GONE]\nurl = "{gone}"\nparent = "HUB"\n'
    )
    result = run_at("HUB", "network", "apply", str(path))
    assert result.exit_code == 4
    assert result.stdout.splitlines()[0] == "HUB: applied"
    assert result.stdout.splitlines()[1].startswith("GONE: not applied: ")
    assert "error: not applied on GONE: run it again when they can be reached" in result.stderr
    status = json.loads(ok(run_at("HUB", "status", "--network", "--json")).stdout)
    rows = {r["qm"]: r for r in status["queue_managers"]}
    assert rows["HUB"]["reachable"] and not rows["GONE"]["reachable"]
    assert {(c["from"], c["to"]): c["lag"] for c in status["channels"]} == {
        ("HUB", "GONE"): None,
        ("GONE", "HUB"): None,
    }
    text = ok(run_at("HUB", "status", "--network")).stdout
    assert "GONE" in text and "no" in text


def test_withdraw_outside_a_network_fails_clearly(run_at):
    result = run_at("ALONE", "network", "withdraw")
    assert result.exit_code == 2
    assert "ALONE is in no network" in result.stderr
