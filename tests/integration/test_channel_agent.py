"""The channel agent (``broker.network.channel.Agent``): a round that finds nothing new changes nothing, so
the workers keep their routing tables (every change of ``{qm}:proxies`` bumps ``{qm}:version``)."""

from __future__ import annotations

from broker.core import keys
from broker.core.config import Settings
from broker.network.channel import ChannelProcess
from broker.network.network_admin import apply_network
from broker.topics.subscriptions import subscribe
from broker.topics.topology import parse_network


def test_an_agent_round_with_nothing_new_keeps_the_proxy_subscriptions_and_the_version(
    real_server, real_redis
):
    network = parse_network({"queue_managers": {"A": {}, "B": {"parent": "A"}}})
    apply_network(network, real_server.url, real_redis)
    subscribe(real_redis, "B", "t/#", "app", "all-t")
    channels = {
        qm: ChannelProcess(real_redis, Settings(redis_url=real_server.url, qm=qm), name=f"ch-{qm}")
        for qm in "AB"
    }
    for process in channels.values():
        process.rejoin()
    assert channels["A"].agent.round()  # A now holds B's interest in t
    held = real_redis.hgetall(keys.proxies("A"))
    assert list(held) == [b"B dynamic t"]
    versions = [real_redis.get(keys.version(qm)) for qm in "AB"]

    assert not any(channels[qm].agent.round() for qm in "AB")
    assert not any(channels[qm].agent.round() for qm in "AB")
    assert [real_redis.get(keys.version(qm)) for qm in "AB"] == versions
    assert real_redis.hgetall(keys.proxies("A")) == held
