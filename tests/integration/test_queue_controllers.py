"""Queue controllers (seed 003, issue 28 row 6) on a real server.

The seed's ``<queue-controllers>``: ``tmp$%`` non_persistent makes the messages of the matching
subscriptions NON_PERSISTENT (the JMSDeliveryMode consumers see, NPMSGDLV); ``failsave$%``
activestandby and ``%$%`` shared give consumer modes, applied by ``subscribe`` from the settings
as ``broker subscribe`` applies them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import Subscriber, subscribe
from broker.core import keys
from broker.core.config import ConsumerMode, QueueController, Settings
from broker.core.models import publication_fields
from broker.testing import drain, make_workers, queue_messages
from broker.topics.topic_objects import Attributes, define
from tests.conftest import QM
from tests.unit.test_queue_controllers import SEED as SEED_CONFIG

#: The seed's queue controllers, in the lexical order of their names (SwiftMQ's matching order).
SEED = [
    QueueController(name="01", predicate="tmp$%", persistence_mode="non_persistent"),
    QueueController(name="02", predicate="sys$%"),
    QueueController(name="03", predicate="swiftmq%"),
    QueueController(name="04", predicate="rt$%"),
    QueueController(name="05", predicate="unroutable"),
    QueueController(name="06", predicate="failsave$%", consumer_mode="activestandby"),
    QueueController(name="07", predicate="%$%", consumer_mode="shared"),
    QueueController(name="08", predicate="routerdlq"),
    QueueController(name="09", predicate="%"),
]

SEED_TOML = SEED_CONFIG.replace('qm = "QM1"\n', "")  # the seed's controllers, without a queue manager


@pytest.fixture
def seed(settings: Settings) -> Settings:
    return settings.model_copy(update={"queue_controllers": SEED})


def _publish(client, topic: str, body: bytes, persistent: bool | None = True, msgid: str = "") -> None:
    client.xadd(
        keys.publish_stream(QM),
        publication_fields("p", topic, body, persistent=persistent, msgid=msgid or body.decode()),
    )


def test_the_seeds_tmp_controller_makes_a_persistent_publication_non_persistent(real_redis, seed):
    # Given the seed's controllers, tmp$1 and an ordinary subscription on their own topics
    tmp = subscribe(real_redis, QM, "reply/1", "tmp", "1", settings=seed)
    app = subscribe(real_redis, QM, "orders/1", "app", "orders", settings=seed)
    workers = make_workers(real_redis, seed, 1)
    # When a persistent publication goes to each (one with the delivery mode left to its topic)
    _publish(real_redis, "reply/1", b"answer")
    _publish(real_redis, "reply/1", b"default", persistent=None)
    _publish(real_redis, "orders/1", b"order")
    drain(workers)
    # Then the consumer of tmp$1 receives NON_PERSISTENT messages, the other PERSISTENT ones
    subscriber = Subscriber(real_redis, QM, tmp, seed, heartbeat=False)
    got = subscriber.receive_many(10)
    assert [(d.message.body, d.message.persistent) for d in got] == [(b"answer", False), (b"default", False)]
    subscriber.ack_many(got)
    subscriber.close()
    assert [(m.body, m.persistent) for m in queue_messages(real_redis, QM, app.sub_id)] == [(b"order", True)]


def test_a_selector_sees_the_controllers_delivery_mode_only_after_delivery(real_redis, seed):
    # Given tmp$1 selecting NON_PERSISTENT messages: a selector sees the publication as published
    tmp = subscribe(
        real_redis, QM, "reply/#", "tmp", "1", settings=seed, selector="JMSDeliveryMode = 'NON_PERSISTENT'"
    )
    _publish(real_redis, "reply/1", b"persistent")
    _publish(real_redis, "reply/1", b"non-persistent", persistent=False)
    drain(make_workers(real_redis, seed, 1))
    # Then only the one published NON_PERSISTENT was selected (the controller applies to the copies)
    assert [m.body for m in queue_messages(real_redis, QM, tmp.sub_id)] == [b"non-persistent"]


def test_a_publication_to_tmp_and_ordinary_subscriptions_keeps_its_own_mode(real_redis, seed):
    # Given tmp$1 and app$all on the same topic: one envelope goes to both queues
    subscribe(real_redis, QM, "t/#", "tmp", "1", settings=seed)
    subscribe(real_redis, QM, "t/#", "app", "all", settings=seed)
    _publish(real_redis, "t/x", b"both")
    drain(make_workers(real_redis, seed, 1))
    # Then the queues do not agree, and the publication keeps its delivery mode in both
    for sub_id in ("tmp$1", "app$all"):
        assert [m.persistent for m in queue_messages(real_redis, QM, sub_id)] == [True]


def test_npmsgdlv_applies_to_a_full_tmp_queue(real_redis, settings, seed):
    # Given a topic whose full durable queues refuse persistent publications (PMSGDLV(ALL)) and
    # skip non-persistent ones (NPMSGDLV(ALLAVAIL)), and a durable tmp$1 with room for one
    define(real_redis, QM, "R", "reply", Attributes(maxdepth=1, pmsgdlv="ALL", npmsgdlv="ALLAVAIL"))
    subscribe(real_redis, QM, "reply/#", "tmp", "1", settings=seed)
    # When two persistent publications come, the second finding tmp$1 full
    _publish(real_redis, "reply/1", b"first")
    _publish(real_redis, "reply/1", b"second")
    drain(make_workers(real_redis, seed, 1))
    # Then tmp$1's controller made them non-persistent: the second skipped the full queue (counted),
    # not refused and dead-lettered as a persistent one would be
    assert [m.body for m in queue_messages(real_redis, QM, "tmp$1")] == [b"first"]
    assert int(real_redis.hget(keys.skipped(QM), "tmp$1")) == 1
    assert real_redis.xlen(keys.dead_letter(QM)) == 0
    # (without the controller, the same publication is refused as a whole)
    _publish(real_redis, "reply/1", b"third")
    drain(make_workers(real_redis, settings, 1))
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_subscribe_applies_the_settings_controllers_as_the_cli_does(real_redis, seed, settings):
    # Given settings with queue controllers, and older settings with consumer_modes only
    older = settings.model_copy(
        update={"consumer_modes": [ConsumerMode(predicate="failsave$%", mode="activestandby")]}
    )
    # When the library subscribes with the settings, as `broker subscribe` does
    failsave = subscribe(real_redis, QM, "iit/sales", "failsave", "orders", settings=seed)
    other = subscribe(real_redis, QM, "iit/sales", "sales", "orders", settings=seed)
    tmp = subscribe(real_redis, QM, "iit/sales", "tmp", "1", settings=seed)
    legacy = subscribe(real_redis, QM, "iit/sales", "failsave", "legacy", settings=older)
    # Then each subscription has its controller's consumer mode
    assert [r.mode for r in (failsave, other, tmp, legacy)] == [
        "activestandby",
        "shared",
        "exclusive",
        "activestandby",
    ]
    # and an explicit keyword argument still wins over the settings
    explicit = subscribe(real_redis, QM, "iit/sales", "failsave", "x", settings=seed, consumer_modes=[])
    assert explicit.mode == "exclusive"


def test_the_cli_gives_tmp_1_non_persistent_messages_and_the_failsave_mode(run, real_redis, settings):
    # Given the seed's controllers in configs/broker.toml
    Path("configs").mkdir()
    Path("configs/broker.toml").write_text(SEED_TOML)
    # When tmp$1 subscribes, a persistent publication comes, and the workers handle it
    made = run("subscribe", "reply/#", "--client-id", "tmp", "--durable", "1", "--timeout-ms", "1")
    assert made.exit_code == 0, made.output
    sent = run("publish", "--no-wait", "--publisher", "station", "reply/1", "answer")
    assert sent.exit_code == 0, sent.output
    workers_settings = settings.model_copy(update={"queue_controllers": SEED})
    assert drain(make_workers(real_redis, workers_settings, 1)) == 1
    # Then the subscriber prints it as non-persistent
    got = run(
        "subscribe", "reply/#", "--client-id", "tmp", "--durable", "1", "--count", "1", "--timeout-ms", "1000"
    )
    assert got.exit_code == 0, got.output
    assert got.stdout.strip() == "reply/1  publisher=station  seq=1  priority=4  non-persistent  answer"
    # and a failsave subscription made by the CLI is active/standby
    failsave = run("subscribe", "x/#", "--client-id", "failsave", "--durable", "d", "--timeout-ms", "1")
    assert "activestandby" in failsave.stderr
