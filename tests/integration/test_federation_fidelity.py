"""Seeds 002 and 003 in a network of queue managers, on a real server (issue 28 rows 2-5).

Every queue manager of a network lives in the one server the suite starts, each under its own
name (``Fed`` of ``test_federation.py``); agents, workers and movers run in-process, round by
round, with injected clocks where time matters.
"""

from __future__ import annotations

from broker.core import keys
from broker.operations.status import topic_status
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
