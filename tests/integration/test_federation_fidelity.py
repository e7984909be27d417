"""Seeds 002 and 003 in a network of queue managers, on a real server (issue 28 rows 2-5).

Every queue manager of a network lives in the one server the suite starts, each under its own
name (``Fed`` of ``test_federation.py``); agents, workers and movers run in-process, round by
round, with injected clocks where time matters.
"""

from __future__ import annotations

import json
import logging

from broker.core import keys
from broker.core.config import SlowSubscriberCondition
from broker.network.channel import ChannelProcess
from broker.network.network_admin import network_status, remove_proxies
from broker.operations.status import status, topic_status
from broker.testing import make_workers
from broker.topics.subscriptions import subscribe
from broker.topics.topic_objects import Attributes, define
from tests.integration.test_federation import Fed

# --- row 2 (seed 002): a local definition takes precedence ------------------------------


def test_a_local_topic_object_takes_precedence_over_the_networks_cluster_copy(real_server, real_redis):
    # Given H and C in cluster K; H defines SPORTS as a cluster topic, C defines its own SPORTS
    # with CLUSTER('') (seed 002: "A local definition of a topic object, whether the definition
    # is for a cluster topic or a local topic, takes precedence over the same topic object
    # defined elsewhere in the cluster")
    fed = Fed(real_redis, real_server.url, {"H": {"clusters": ["K"]}, "C": {"clusters": ["K"]}})
    define(real_redis, fed["H"], "SPORTS", "sports", Attributes(cluster="K"))
    define(real_redis, fed["C"], "SPORTS", "sports", Attributes(cluster=""))
    at_h = subscribe(real_redis, fed["H"], "sports/#", "app", "sport")
    at_c = subscribe(real_redis, fed["C"], "sports/#", "app", "sport")
    fed.settle()
    assert real_redis.hexists(keys.cluster_topics(fed["C"]), "sports")  # the network's copy is there

    # When C publishes on SPORTS
    mine = fed.publish("C", "pC", "sports/goal", 3)
    fed.settle()

    # Then topic status and the workers agree: local at C, so nothing crosses the cluster
    status = topic_status(real_redis, fed["C"], "sports/goal")
    assert ("cluster", "", "SPORTS") in status.attributes
    assert status.route_class == "local"
    assert [m.msgid for m in fed.messages("C", at_c.sub_id)] == mine
    assert fed.messages("H", at_h.sub_id) == []
    assert fed.xmit_len("C", "H") == 0
    # while at H, whose own SPORTS is the cluster topic, it is one
    assert topic_status(real_redis, fed["H"], "sports/goal").route_class == "cluster K"


# --- row 4 (seed 003): removing a dead node's remote subscriptions ----------------------


def test_removed_proxies_of_a_dead_queue_manager_stay_removed_until_it_announces_again(
    real_server, real_redis
):
    # Given D, announcing news to S, whose processes died without withdrawing: its server (here
    # the one they share) still holds its announcement
    fed = Fed(real_redis, real_server.url, {"S": {}, "D": {"parent": "S"}})
    now = [1_000_000]
    fed.channels["S"].agent.clock_ms = lambda: now[0]
    subscribe(real_redis, fed["D"], "news/#", "app", "durable")
    fed.settle()
    assert fed.proxies("S") == [("D", "news", "dynamic")]
    fed.crashed.add("D")

    # When the operator removes them (SwiftMQ: delete the remote router subscriptions)
    assert remove_proxies(real_redis, fed["S"], fed["D"]) == 1

    # Then S's agent, rounds and minutes later, reads D's old announcement and makes none again
    for _ in range(5):
        now[0] += 60_000
        fed.settle()
        assert fed.proxies("S") == []
    fed.publish("S", "p", "news/a", 2)
    fed.settle()
    assert fed.xmit_len("S", "D") == 0

    # When D comes back: its channel process announces again (a newer announcement)
    fed.up("D")
    fed.settle()
    # Then S makes its proxy subscriptions again, and forgets the removal
    assert fed.proxies("S") == [("D", "news", "dynamic")]
    assert real_redis.hlen(keys.proxies_removed(fed["S"])) == 0
    sent = fed.publish("S", "p", "news/b", 2, first=2)
    fed.settle()
    assert [m.msgid for m in fed.xmit("S", "D")] == sent


# --- row 5 (seed 003): a static remote subscription with no path ------------------------


def test_a_static_subscription_with_no_path_for_its_route_class_is_named_in_status_and_logged_once(
    real_server, real_redis, caplog
):
    # Given S and D, members of cluster K only (no hierarchy edge), and a static remote
    # subscription at S for D on news, a local topic: no path leads from S to D for it
    fed = Fed(
        real_redis,
        real_server.url,
        {"S": {"clusters": ["K"]}, "D": {"clusters": ["K"]}},
        static_subscriptions=[{"at": "S", "to": "D", "topic": "news", "keep_on_unsubscribe": True}],
    )
    sub = subscribe(real_redis, fed["D"], "news/#", "app", "news")
    caplog.set_level(logging.INFO, logger="broker.channel")
    for _ in range(3):
        fed.settle()
    fed.publish("S", "p", "news/a", 2)
    fed.settle()
    assert fed.xmit_len("S", "D") == 0  # nothing forwarded ...

    # Then broker status (and its JSON) and the log say so: once, not per round or publication
    problems = [p for p in status(real_redis, fed["S"]).problems if "static remote subscription" in p]
    assert len(problems) == 1
    assert f"no path from {fed['S']} to {fed['D']}" in problems[0] and "(local)" in problems[0]
    warned = [r for r in caplog.records if "static remote subscription" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert problems[0] in warned[0].getMessage()
    assert status(real_redis, fed["D"]).problems == []  # configured at S only

    # When news becomes a cluster topic of K: the path exists, the warning goes
    define(real_redis, fed["S"], "NEWS", "news", Attributes(cluster="K"))
    fed.settle()
    assert not [p for p in status(real_redis, fed["S"]).problems if "static remote subscription" in p]
    sent = fed.publish("S", "p", "news/b", 2, first=2)
    fed.settle()
    assert [m.msgid for m in fed.messages("D", sub.sub_id)] == sent


# --- row 3 (seed 003): slow-subscriber conditions on remote subscriptions ---------------


def test_the_seeds_remote_events_condition_withholds_from_a_channel_300_behind(
    real_server, real_redis, caplog
):
    # Given the seed's condition at S:
    #   <topic name="events" max-messages="300" persistence-mode="all" subscription-type="remote"/>
    # and D, behind S's channel, subscribed to events and news; a local subscriber at S too
    fed = Fed(real_redis, real_server.url, {"S": {}, "D": {"parent": "S"}})
    condition = SlowSubscriberCondition(
        name="events", max_messages=300, persistence_mode="all", subscription_type="remote"
    )
    fed.settings["S"] = fed.settings["S"].model_copy(update={"slow_subscriber_conditions": [condition]})
    fed.channels["S"] = ChannelProcess(fed.clients["S"], fed.settings["S"], name=f"ch-{fed['S']}")
    fed.workers["S"] = make_workers(fed.clients["S"], fed.settings["S"], 1)
    remote = subscribe(real_redis, fed["D"], "events/#", "app", "events")
    news = subscribe(real_redis, fed["D"], "news/#", "app", "news")
    local = subscribe(real_redis, fed["S"], "events/#", "app", "events")
    fed.settle()
    channel = fed.channels["S"]

    def agent_round() -> None:  # the channel process's round, due now
        channel._next_round_ms = 0
        channel.run_once()

    # When D stops filing (its processes died without withdrawing) and 300 events wait for it
    fed.stop("D", withdraw_first=False)
    first = fed.publish("S", "p", "events/a", 300)
    fed.settle()
    assert fed.xmit_len("S", "D") == 300
    caplog.set_level(logging.INFO, logger="broker.channel")
    # (counted by a channel process that has just started too, before its movers' first move:
    # here one whose movers wait for the running one's lease)
    assert ChannelProcess(fed.clients["S"], fed.settings["S"], name="restarted").run_once() == 0
    assert real_redis.hlen(keys.withheld(fed["S"])) == 1
    agent_round()

    # Then further events are withheld from that channel, news is not, and S's own subscriber
    # gets every event (a remote condition never holds back a local subscriber)
    later = fed.publish("S", "p", "events/b", 5, first=300)
    sent_news = fed.publish("S", "n", "news/a", 3)
    fed.settle()
    assert [m.msgid for m in fed.xmit("S", "D")] == first + sent_news
    assert len(fed.messages("S", local.sub_id)) == 305
    row = [
        c for c in network_status(real_redis, fed["S"], fed.url).as_dict()["channels"] if c["to"] == fed["D"]
    ]
    assert row[0].get("withheld") == ["events"]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "withhold" in r.getMessage()]
    assert len(warned) == 1 and "at least 300 undelivered" in warned[0].getMessage()

    # When D comes back and files the backlog: the 300 filed entries stay in the transmission
    # stream for retention_ms, but they are delivered, so they no longer count
    fed.up("D")
    fed.settle()
    assert fed.xmit_len("S", "D") == 303
    agent_round()
    again = fed.publish("S", "p", "events/c", 2, first=305)
    fed.settle()
    assert [m.msgid for m in fed.messages("D", remote.sub_id)] == first + again
    assert [m.msgid for m in fed.messages("D", news.sub_id)] == sent_news
    assert real_redis.hlen(keys.withheld(fed["S"])) == 0
    assert later[0] not in {m.msgid for m in fed.xmit("S", "D")}


def test_a_remote_condition_with_disconnect_removes_the_routes_proxy_subscriptions_until_announced_again(
    real_server, real_redis
):
    # Given a remote condition on events that disconnects, and D behind S's channel
    fed = Fed(real_redis, real_server.url, {"S": {}, "D": {"parent": "S"}})
    condition = SlowSubscriberCondition(
        name="events",
        max_messages=3,
        persistence_mode="all",
        subscription_type="remote",
        disconnect_non_durable_subscriber=True,
    )
    fed.settings["S"] = fed.settings["S"].model_copy(update={"slow_subscriber_conditions": [condition]})
    fed.channels["S"] = ChannelProcess(fed.clients["S"], fed.settings["S"], name=f"ch-{fed['S']}")
    fed.workers["S"] = make_workers(fed.clients["S"], fed.settings["S"], 1)
    events = subscribe(real_redis, fed["D"], "events/#", "app", "events")
    subscribe(real_redis, fed["D"], "news/#", "app", "news")
    fed.settle()
    assert fed.proxies("S") == [("D", "events", "dynamic"), ("D", "news", "dynamic")]

    # When D stops filing and the channel holds 3 events
    fed.stop("D", withdraw_first=False)
    first = fed.publish("S", "p", "events/a", 3)
    fed.settle()
    fed.channels["S"]._next_round_ms = 0
    fed.channels["S"].run_once()

    # Then D's events proxy subscription is removed (news stays), and rounds later still is,
    # though D's announcement still names events
    assert fed.proxies("S") == [("D", "news", "dynamic")]
    for _ in range(3):
        fed.channels["S"]._next_round_ms = 0
        fed.settle()
    assert fed.proxies("S") == [("D", "news", "dynamic")]

    # When D comes back (it announces again) and files its backlog: events flow to it again
    fed.up("D")
    fed.settle()
    fed.channels["S"]._next_round_ms = 0
    fed.channels["S"].run_once()
    assert fed.proxies("S") == [("D", "events", "dynamic"), ("D", "news", "dynamic")]
    assert real_redis.hlen(keys.withheld(fed["S"])) == 0
    again = fed.publish("S", "p", "events/b", 2, first=3)
    fed.settle()
    assert [m.msgid for m in fed.messages("D", events.sub_id)] == first + again


def test_foreign_withheld_and_removal_keys_stop_neither_the_channel_process_nor_the_workers(
    real_server, real_redis
):
    # Given a remote condition at S, and both new keys of another Redis type
    fed = Fed(real_redis, real_server.url, {"S": {}, "D": {"parent": "S"}})
    condition = SlowSubscriberCondition(name="events", max_messages=3, subscription_type="remote")
    fed.settings["S"] = fed.settings["S"].model_copy(update={"slow_subscriber_conditions": [condition]})
    fed.channels["S"] = ChannelProcess(fed.clients["S"], fed.settings["S"], name=f"ch-{fed['S']}")
    sub = subscribe(real_redis, fed["D"], "events/#", "app", "events")
    real_redis.set(keys.withheld(fed["S"]), "junk")
    real_redis.set(keys.proxies_removed(fed["S"]), "junk")

    # When the network runs: Then publications still flow, and the heartbeat names both keys
    fed.settle()
    sent = fed.publish("S", "p", "events/a", 2)
    fed.channels["S"]._next_round_ms = 0
    fed.settle()
    assert [m.msgid for m in fed.messages("D", sub.sub_id)] == sent
    beat = json.loads(real_redis.hget(keys.network_agents(fed["S"]), f"ch-{fed['S']}"))
    problems = beat["problems"]
    assert any("slow remote routes" in p for p in problems)
    assert any(keys.proxies_removed(fed["S"]) in p for p in problems)
    named = status(real_redis, fed["S"]).problems
    assert any(keys.withheld(fed["S"]) in p and "forwarding goes on" in p for p in named)
    assert any(keys.proxies_removed(fed["S"]) in p for p in named)
