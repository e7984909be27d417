"""The network model without a server: validation, routes, announce keys and filters (seeds 002, 003)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from broker.core.entries import parse_entry
from broker.core.errors import ConfigError
from broker.core.models import Message, encode_envelope, publication_fields
from broker.core.topic_rules import matches as mqtt_matches
from broker.network.mover import forwarded_fields
from broker.topics.topology import (
    EVERYTHING,
    LOCAL,
    ProxySubscription,
    Topology,
    announce_key,
    key_matches,
    load_network,
    parse_network,
    proxy_field,
)


def _net(qms: dict[str, dict], **rest) -> Topology:
    return Topology(parse_network({"queue_managers": qms, **rest}))


# --- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"queue_managers": {"A": {"parent": "Z"}}}, "parent 'Z' is not in the network"),
        ({"queue_managers": {"A": {"parent": "A"}}}, "cannot be its own parent"),
        (
            {"queue_managers": {"A": {"parent": "C"}, "B": {"parent": "A"}, "C": {"parent": "B"}}},
            "the hierarchy has a cycle",
        ),
        (
            {
                "queue_managers": {"A": {}, "B": {}},
                "static_subscriptions": [{"at": "A", "to": "A", "topic": "t"}],
            },
            "at and to are the same queue manager",
        ),
        (
            {
                "queue_managers": {"A": {}, "B": {}},
                "static_subscriptions": [{"at": "A", "to": "Q", "topic": "t"}],
            },
            "to 'Q' is not in the network",
        ),
        (
            {
                "queue_managers": {"A": {}},
                "announce_filters": [
                    {"at": "A", "name": "01", "router": "B%", "type": "include", "topics": ["glob\\"]}
                ],
            },
            "announce filter '01': 'glob\\\\'",
        ),
        (
            {
                "queue_managers": {"A": {}},
                "announce_filters": [{"at": "A", "name": "01", "router": "x\\y", "type": "exclude"}],
            },
            "announce filter '01'",
        ),
        (
            {
                "queue_managers": {"A": {}},
                "announce_filters": [{"at": "Z", "name": "01", "router": "%", "type": "exclude"}],
            },
            "at 'Z' is not in the network",
        ),
        ({"queue_managers": {"bad name": {}}}, "queue manager name 'bad name'"),
        ({"queue_managers": {"A" * 65: {}}}, "must be 1-64"),
        ({"queue_managers": {"A": {"clusters": ["no/slash"]}}}, "cluster name 'no/slash' is invalid"),
        ({"queue_managers": {}}, "at least one queue manager"),
        ({"queue_managers": {"A": {"colour": "red"}}}, "colour"),
        ({"queue_managers": {"A": {}}, "announce": "everything"}, "announce"),
    ],
)
def test_invalid_networks_are_config_errors_naming_the_problem(raw, named):
    with pytest.raises(ConfigError) as caught:
        parse_network(raw, "net.toml")
    message = str(caught.value)
    assert message.startswith("net.toml: ")
    assert named in message, message


def test_load_network_names_the_file_and_the_problem(tmp_path):
    missing = tmp_path / "none.toml"
    with pytest.raises(ConfigError, match="does not exist"):
        load_network(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[queue_managers\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_network(broken)
    cyclic = tmp_path / "cyclic.toml"
    cyclic.write_text('[queue_managers.A]\nparent = "B"\n[queue_managers.B]\nparent = "A"\n')
    with pytest.raises(ConfigError) as caught:
        load_network(cyclic)
    assert str(cyclic) in str(caught.value) and "cycle" in str(caught.value)
    good = tmp_path / "good.toml"
    good.write_text(
        'announce = "topic"\n[queue_managers.A]\n[queue_managers.B]\nparent = "A"\nclusters = ["C1"]\n'
        '[[static_subscriptions]]\nat = "A"\nto = "B"\ntopic = "news"\nkeep_on_unsubscribe = true\n'
    )
    network = load_network(good)
    assert network.announce == "topic" and network.queue_managers["B"].parent == "A"
    assert network.static_subscriptions[0].keep_on_unsubscribe
    # the stored form parses back to the same network, with the same digest
    again = parse_network(network.to_json())
    assert again == network and again.digest == network.digest
    assert parse_network(network.to_json().encode()).digest == network.digest


# --- routes ---------------------------------------------------------------------------


def test_hierarchy_paths_go_up_then_down():
    topology = _net({"A": {}, "B": {"parent": "A"}, "C": {"parent": "A"}, "D": {"parent": "C"}})
    assert topology.path(LOCAL, "B", "D") == ("B", "A", "C", "D")
    assert topology.path(LOCAL, "D", "B") == ("D", "C", "A", "B")
    assert topology.path(LOCAL, "A", "D") == ("A", "C", "D")
    assert topology.path(LOCAL, "D", "D") == ("D",)
    assert topology.neighbours == {"A": ("B", "C"), "B": ("A",), "C": ("A", "D"), "D": ("C",)}


def test_cluster_edges_are_only_in_the_cluster_route_class():
    topology = _net({"H": {"clusters": ["C1"]}, "X": {"clusters": ["C1"]}, "Y": {"clusters": ["C1"]}})
    # a local topic never crosses the cluster: no hierarchy edge, no path
    assert topology.path(LOCAL, "X", "Y") is None
    # DIRECT: full mesh, every member straight to every member
    direct = ("C1", ())
    assert topology.graph(direct) == {"H": ("X", "Y"), "X": ("H", "Y"), "Y": ("H", "X")}
    assert topology.path(direct, "X", "Y") == ("X", "Y")
    # TOPICHOST: a member reaches another member through a host
    hosted = ("C1", ("H",))
    assert topology.graph(hosted) == {"H": ("X", "Y"), "X": ("H",), "Y": ("H",)}
    assert topology.path(hosted, "X", "Y") == ("X", "H", "Y")
    assert topology.path(hosted, "H", "Y") == ("H", "Y")
    # a host outside the cluster gives no edges; another cluster's edges are not used
    assert topology.path(("C1", ("Q",)), "X", "Y") is None
    assert topology.path(("C2", ()), "X", "Y") is None
    assert topology.neighbours["X"] == ("H", "Y")


def test_unreachable_destinations_have_no_path():
    topology = _net({"A": {}, "B": {"parent": "A"}, "Z": {}, "M": {"clusters": ["C1"]}, "N": {}})
    assert topology.path(LOCAL, "B", "Z") is None
    assert topology.path(("C1", ()), "M", "N") is None
    assert not topology.delivers(LOCAL, "B", "Z", "t")
    assert topology.delivers(LOCAL, "B", "A", "t")


def test_hierarchy_plus_cluster_prefers_the_shortest_path_and_ties_go_by_name():
    # A parent of B and C; A, B, C, D in cluster K (DIRECT)
    topology = _net(
        {
            "A": {"clusters": ["K"]},
            "B": {"parent": "A", "clusters": ["K"]},
            "C": {"parent": "A", "clusters": ["K"]},
            "D": {"clusters": ["K"]},
        }
    )
    assert topology.path(("K", ()), "B", "C") == ("B", "C")  # cluster edge, not through A
    assert topology.path(LOCAL, "B", "C") == ("B", "A", "C")
    assert topology.path(LOCAL, "D", "B") is None
    # TOPICHOST with two hosts: a non-host goes through the first host by name
    two = _net({m: {"clusters": ["K"]} for m in ("H1", "H2", "X", "Y")})
    assert two.path(("K", ("H1", "H2")), "X", "Y") == ("X", "H1", "Y")
    assert two.path(("K", ("H1", "H2")), "H2", "H1") == ("H2", "H1")


def _random_network(rng: random.Random, size: int) -> dict[str, dict]:
    names = [f"Q{n}" for n in range(size)]
    qms: dict[str, dict] = {}
    for n, name in enumerate(names):
        node: dict = {}
        if n and rng.random() < 0.7:
            node["parent"] = names[rng.randrange(n)]
        clusters = [c for c in ("K1", "K2") if rng.random() < 0.4]
        if clusters:
            node["clusters"] = clusters
        qms[name] = node
    return qms


@pytest.mark.parametrize("seed", range(12))
def test_routes_towards_one_destination_form_a_tree(seed):
    """Paths never loop, and every queue manager has one next hop towards a destination: two
    paths that meet go on together (so a publication is never sent twice down one channel)."""
    rng = random.Random(seed)
    topology = _net(_random_network(rng, 9))
    names = list(topology.network.queue_managers)
    members = topology.members
    classes = [LOCAL]
    for cluster, cluster_members in members.items():
        classes.append((cluster, ()))
        classes.append((cluster, cluster_members[:1]))
    for route, dest in itertools.product(classes, names):
        next_hop: dict[str, str] = {}
        for origin in names:
            path = topology.path(route, origin, dest)
            if path is None:
                continue
            assert path[0] == origin and path[-1] == dest
            assert len(set(path)) == len(path), f"loop in {path}"
            graph = topology.graph(route)
            for here, there in itertools.pairwise(path):
                assert there in graph[here], f"{here}->{there} is not an edge of {route}"
                assert next_hop.setdefault(here, there) == there, f"two next hops from {here} to {dest}"
                assert topology.path(route, here, dest) == path[path.index(here) :]
        # the graph is undirected: reachability is symmetric
        for origin in names:
            assert (topology.path(route, origin, dest) is None) == (
                topology.path(route, dest, origin) is None
            )


# --- announce keys ----------------------------------------------------------------------


def test_announce_key_of_a_filter():
    assert announce_key("flights/+/jfk", "root", "/") == "flights"
    assert announce_key("flights/+/jfk", "topic", "/") == "flights/+/jfk"
    assert announce_key("$share/grp/flights/#", "root", "/") == "flights"
    assert announce_key("$share/grp/flights/#", "topic", "/") == "flights/#"
    assert announce_key("#", "root", "/") == EVERYTHING
    assert announce_key("+/x", "root", "/") == EVERYTHING
    assert announce_key("/ORDERS/#", "root", "/") == ""  # MQTT: an empty first level
    assert announce_key("iit.sales.eu", "root", ".") == "iit"
    assert announce_key("iit.sales.eu", "topic", ".") == "iit.sales.eu"
    assert announce_key("globalnews", "root", ".") == "globalnews"


def test_key_matches_a_publication_topic():
    assert key_matches("flights", "flights/jfk", "root", "/")
    assert not key_matches("flights", "flightsx/jfk", "root", "/")
    assert not key_matches("flights", "cargo/flights", "root", "/")
    assert key_matches(EVERYTHING, "anything/at/all", "root", "/")
    assert not key_matches(EVERYTHING, "$SYS/x", "root", "/")
    assert key_matches("iit", "iit.sales.eu", "root", ".")
    assert not key_matches("iit", "iitx.sales", "root", ".")
    assert key_matches("flights/+/jfk", "flights/ba/jfk", "topic", "/", mqtt_matches)
    assert not key_matches("flights/+/jfk", "flights/ba/lhr", "topic", "/", mqtt_matches)
    assert key_matches("flights/jfk", "flights/jfk", "topic", "/")  # without a matcher: equal
    assert not key_matches("flights/#", "flights/jfk", "topic", "/")


# --- announce filters (seed 003, "Topic Announce Filters") ------------------------------

SEED_FILTERS = [
    # listed out of name order on purpose: they apply in name order
    {"at": "app11", "name": "04", "router": "%", "type": "exclude", "topics": ["request%", "local%"]},
    {"at": "app11", "name": "02", "router": "util1", "type": "include", "topics": ["global%", "request%"]},
    {"at": "app11", "name": "01", "router": "primary", "type": "include", "topics": ["global%"]},
    {"at": "app11", "name": "03", "router": "app1%", "type": "include", "topics": ["global%", "request%"]},
]

SEED_TREE = {
    "primary": {},
    "util1": {"parent": "primary"},
    "util2": {"parent": "primary"},
    "app11": {"parent": "util1"},
    "app12": {"parent": "util1"},
    "app21": {"parent": "util2"},
}


def test_announce_filters_of_the_seed_example():
    topology = _net(SEED_TREE, announce_filters=SEED_FILTERS)
    assert [r.name for r in topology.filters["app11"]] == ["01", "02", "03", "04"]
    topics = ("global1", "request1", "local1", "misc")
    announced = {
        receiver: [t for t in topics if topology.announced_to("app11", receiver, t)]
        for receiver in ("primary", "util1", "app12", "util2", "app21")
    }
    assert announced == {
        "primary": ["global1"],  # 01: include global%
        "util1": ["global1", "request1"],  # 02
        "app12": ["global1", "request1"],  # 03 app1% comes before 04 "%"
        "util2": ["global1", "misc"],  # 04: everything but request% and local%
        "app21": ["global1", "misc"],
    }
    # filters belong to their announcer: the others announce everything
    assert all(topology.announced_to("app12", r, t) for r in SEED_TREE for t in topics)
    # a receiver no filter names: announced
    only = _net(
        {"A": {}, "B": {}},
        announce_filters=[{"at": "A", "name": "1", "router": "C%", "type": "include", "topics": ["x"]}],
    )
    assert only.announced_to("A", "B", "y")
    # the backslash escape: "app\_1" matches the literal underscore only
    escaped = _net(
        {"app_1": {}, "appx1": {}, "S": {}},
        announce_filters=[{"at": "S", "name": "1", "router": "app\\_1", "type": "include", "topics": ["g%"]}],
    )
    assert not escaped.announced_to("S", "app_1", "local") and escaped.announced_to("S", "app_1", "global")
    assert escaped.announced_to("S", "appx1", "local")


def test_delivery_needs_the_announcement_at_every_hop_before_the_destination():
    topology = _net(SEED_TREE, announce_filters=SEED_FILTERS)

    def origins(key: str) -> list[str]:
        return [o for o in SEED_TREE if o != "app11" and topology.delivers(LOCAL, o, "app11", key)]

    assert origins("globalnews") == ["primary", "util1", "util2", "app12", "app21"]
    assert origins("requestA") == ["util1", "app12"]  # primary does not hold it
    assert origins("localB") == []
    assert origins("misc") == []  # util1 is on every path and does not hold it
    # a static subscription needs no announcement
    assert topology.delivers(LOCAL, "app21", "app11", "localB", static=True)


# --- proxy subscription records ---------------------------------------------------------


def test_proxy_subscription_record_round_trips():
    proxy = ProxySubscription("D", "flights", "static", "S", True, 123)
    assert ProxySubscription.from_json(proxy.to_json()) == proxy
    assert proxy.field == proxy_field("D", "flights", "static") == "D static flights"
    assert ProxySubscription.from_json('{"qm":"D","topic":"a b"}') == ProxySubscription("D", "a b")
    for bad in ("[]", '{"qm":1,"topic":"x"}', '{"qm":"D","topic":"x","source":"other"}'):
        with pytest.raises(ValueError):
            ProxySubscription.from_json(bad)


# --- forwarded publications -------------------------------------------------------------


def _as_fields(flat: list) -> dict[bytes, bytes]:
    def b(value) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    return {b(k): b(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


def test_forwarded_fields_carry_the_delivery_time_marked_as_released():
    # Given the envelope of a delayed publication, delivered at its delivery time by the sender
    fields = publication_fields("p", "t/x", b"b", msgid="m", delivery_time_ms=1_700_000_005_000)
    raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
    entry = parse_entry("1700000005001-0", raw, 1 << 20)

    # When it is forwarded
    forwarded = _as_fields(forwarded_fields(encode_envelope(entry.header, entry.body), "B"))

    # Then the receiver's subscribers see its delivery time, and its queue mutex does not delay it again
    assert parse_entry("1700000005002-0", forwarded, 1 << 20).header["delivery_time"] == 1_700_000_005_000
    assert forwarded[b"delayed_from"] == b"1700000005001-0"


def test_forwarded_fields_keep_every_header_and_append_the_route():
    fields = publication_fields(
        "pub-1",
        "flights/jfk",
        b"\x00binary\nbody\xff",
        msgid="m-7",
        seq=7,
        timestamp_ms=1_700_000_000_000,
        persistent=False,
        priority=8,
        expiration_ms=1_900_000_000_000,
        correlation_id="corr-1",
        reply_to="replies",
        properties={"colour": "red", "n": 3, "ok": True, "x": 1.5},
        message_type="FlightEvent",
    )
    raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
    entry = parse_entry("1700000000000-0", raw, 1 << 20)
    envelope = encode_envelope(entry.header, entry.body)

    # first hop: the origin is the sender, the route is the sender
    first = _as_fields(forwarded_fields(envelope, "B"))
    at_a = parse_entry("1700000000001-0", first, 1 << 20)
    assert at_a.body == b"\x00binary\nbody\xff"
    for name in ("msgid", "publisher", "seq", "topic", "persistent", "priority", "expiration"):
        assert at_a.header.get(name) == entry.header.get(name), name
    # the publish time travels (explicit "ts" at A: it is not the new entry id's milliseconds)
    assert (
        at_a.timestamp_ms == entry.timestamp_ms == 1_700_000_000_000
        and at_a.header["ts"] == 1_700_000_000_000
    )
    for name in ("correlation_id", "reply_to", "type", "props"):
        assert at_a.header[name] == entry.header[name], name
    assert at_a.header["origin"] == "B" and at_a.header["route"] == ["B"]

    # second hop: the origin stays, the route grows
    second = _as_fields(forwarded_fields(encode_envelope(at_a.header, at_a.body), "A"))
    at_c = parse_entry("1700000000002-0", second, 1 << 20)
    assert at_c.header["origin"] == "B" and at_c.header["route"] == ["B", "A"]
    message = Message.from_envelope(encode_envelope(at_c.header, at_c.body))
    assert (message.msgid, message.publisher, message.seq, message.priority, message.persistent) == (
        "m-7",
        "pub-1",
        7,
        8,
        False,
    )
    assert message.expiration_ms == 1_900_000_000_000 and message.correlation_id == "corr-1"
    assert message.properties == {"colour": "red", "n": 3, "ok": True, "x": 1.5}
    assert message.origin == "B" and message.route == ("B", "A")
    assert json.loads(second[b"props"]) == {"colour": "red", "n": 3, "ok": True, "x": 1.5}


def test_forwarded_fields_of_a_plain_publication_use_the_defaults():
    raw = {
        k.encode(): v if isinstance(v, bytes) else v.encode()
        for k, v in publication_fields("p", "t", b"", msgid="m").items()
    }
    entry = parse_entry("5-0", raw, 100)
    flat = _as_fields(forwarded_fields(encode_envelope(entry.header, entry.body), "X"))
    assert flat[b"persistent"] == b"1" and flat[b"priority"] == b"4" and flat[b"ts"] == b"5"
    assert b"expiration" not in flat and b"props" not in flat and b"correlation_id" not in flat
    assert flat[b"origin"] == b"X" and flat[b"route"] == b"X"
