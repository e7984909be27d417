"""The dead-letter queue tools (``broker.operations.dead_letters``, ``broker dlq``) on the real server, with
real in-process workers: fix the cause, replay, delivered exactly once, in order."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from broker import Publisher, cli, subscribe, unsubscribe
from broker.clients.consumer import Subscriber
from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import DeadLetterNotFound, EmptySelection, ForeignKey
from broker.core.principals import bind
from broker.operations.dead_letters import (
    DeadLetter,
    Selection,
    count_by_reason,
    list_dead_letters,
    purge,
    replay,
    show,
)
from broker.testing import drain, make_workers, queue_messages
from broker.topics.topic_objects import Attributes, alter, define

QM = "TEST"
DISABLED = Selection(reason="pub(disabled)")


def _closed_topic(client, name="PAY", topic="/PAY"):
    """A topic object refusing publications: the cause an operator can fix (PUB(ENABLED))."""
    define(client, QM, name, topic, Attributes(pub="DISABLED"))


def _handle(client, settings, workers=1):
    return drain(make_workers(client, settings, workers))


def test_a_refused_publication_is_delivered_once_after_the_cause_is_fixed_and_it_is_replayed(
    real_redis, settings
):
    # Given a publication without a msgid refused by PUB(DISABLED)
    record = subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    _closed_topic(real_redis)
    entry_id = real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "/PAY/EU", "body": b"\xff1"}
    )
    _handle(real_redis, settings)
    (letter,), problems = list_dead_letters(real_redis, QM)
    assert problems == [] and letter.entry_id == entry_id.decode() and letter.publisher == "p"
    assert "PUB(DISABLED)" in letter.reason and letter.body_size == 2 and letter.subscription is None
    assert show(real_redis, QM, letter.id) == letter
    assert letter.to_json()["fields"]["body"] == {"hex": "ff31", "bytes": 2}
    # When the cause is fixed and it is replayed (a dry run first writes nothing)
    alter(real_redis, QM, "PAY", pub="ENABLED")
    assert replay(real_redis, QM, DISABLED, dry_run=True).replayed == [letter.id]
    assert real_redis.xlen(keys.dead_letter(QM)) == 1
    report = replay(real_redis, QM, DISABLED)
    # Then it left the dead-letter queue in the same step, and a worker delivers it once, under
    # its original message id (the default one: its first stream entry id)
    assert report.replayed == [letter.id] and report.skipped == [] and not report.kept
    assert real_redis.xlen(keys.dead_letter(QM)) == 0
    _handle(real_redis, settings)
    (message,) = queue_messages(real_redis, QM, record.sub_id)
    assert message.body == b"\xff1" and message.msgid == entry_id.decode() and message.publisher == "p"
    # And replaying again finds nothing
    assert replay(real_redis, QM, DISABLED).replayed == []


def test_replaying_twice_with_keep_delivers_once_by_message_id(real_redis, settings):
    record = subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    _closed_topic(real_redis)
    Publisher(real_redis, QM, "p").publish("/PAY/EU", b"once", msgid="m-1")
    _handle(real_redis, settings)
    alter(real_redis, QM, "PAY", pub="ENABLED")
    for _ in range(2):
        report = replay(real_redis, QM, DISABLED, keep=True)
        assert len(report.replayed) == 1 and report.kept
        _handle(real_redis, settings)
    assert [m.body for m in queue_messages(real_redis, QM, record.sub_id)] == [b"once"]
    assert real_redis.xlen(keys.dead_letter(QM)) == 1  # kept, and the duplicate was not dead-lettered


def test_per_publisher_order_is_kept_across_a_replay_of_two_publishers(real_redis, settings):
    record = subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    _closed_topic(real_redis)
    a, b = Publisher(real_redis, QM, "a"), Publisher(real_redis, QM, "b")
    for i in range(4):
        a.publish("/PAY/EU", f"a{i}")
        b.publish("/PAY/EU", f"b{i}")
    _handle(real_redis, settings)
    assert real_redis.xlen(keys.dead_letter(QM)) == 8
    alter(real_redis, QM, "PAY", pub="ENABLED")
    assert len(replay(real_redis, QM, Selection(everything=True)).replayed) == 8
    _handle(real_redis, settings, workers=3)
    got = [m.body.decode() for m in queue_messages(real_redis, QM, record.sub_id)]
    assert [x for x in got if x[0] == "a"] == ["a0", "a1", "a2", "a3"]
    assert [x for x in got if x[0] == "b"] == ["b0", "b1", "b2", "b3"]


def test_a_dead_letter_that_cannot_be_replayed_is_skipped_and_holds_back_its_publishers_later_ones(
    real_redis, settings
):
    record = subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    _closed_topic(real_redis)
    small = settings.model_copy(update={"max_body_bytes": 10})
    a, b = Publisher(real_redis, QM, "a"), Publisher(real_redis, QM, "b")
    a.publish("/PAY/EU", b"x" * 20, msgid="a-0")  # over max_body_bytes: refused, the body not copied
    a.publish("/PAY/EU", b"a1", msgid="a-1")
    b.publish("/PAY/EU", b"b0", msgid="b-0")
    real_redis.xadd(keys.publish_stream(QM), {"topic": "/PAY/EU", "body": b"nobody"})  # no publisher
    _handle(real_redis, small)
    big, a1, b0, anonymous = list_dead_letters(real_redis, QM)[0]
    assert big.body_size == 20 and big.fields["dlq.body_bytes"] == b"20" and "body" not in big.fields
    alter(real_redis, QM, "PAY", pub="ENABLED")
    report = replay(real_redis, QM, Selection(everything=True))
    why = dict(report.skipped)
    assert report.replayed == [b0.id], report.skipped
    assert "not copied" in why[big.id] and "body (20 bytes)" in why[big.id]
    assert "held back" in why[a1.id] and big.id in why[a1.id]
    assert "refused again" in why[anonymous.id] and "publisher" in why[anonymous.id]
    # Nothing is lost: the skipped ones are still in the dead-letter queue
    assert [d.id for d in list_dead_letters(real_redis, QM)[0]] == [big.id, a1.id, anonymous.id]
    _handle(real_redis, small)
    assert [m.body for m in queue_messages(real_redis, QM, record.sub_id)] == [b"b0"]
    # Purging the one that can never be replayed lets the next one of its publisher through
    assert purge(real_redis, QM, Selection(ids=(big.id,))) == 1
    assert replay(real_redis, QM, Selection(publisher="a")).replayed == [a1.id]


def test_purge_by_reason_leaves_the_others(real_redis, settings):
    _closed_topic(real_redis)
    Publisher(real_redis, QM, "p").publish("/PAY/EU", b"1")
    Publisher(real_redis, QM, "p").publish("/PAY/EU", b"2")
    real_redis.xadd(keys.publish_stream(QM), {"publisher": "q", "topic": "/bad/#"})  # invalid topic
    _handle(real_redis, settings)
    counts = count_by_reason(real_redis, QM)
    assert sorted(counts.values()) == [1, 2]
    with pytest.raises(EmptySelection):
        purge(real_redis, QM, Selection())
    assert purge(real_redis, QM, Selection(reason="PUB(disabled)"), dry_run=True) == 2
    assert purge(real_redis, QM, Selection(reason="PUB(disabled)")) == 2
    (left,), _ = list_dead_letters(real_redis, QM)
    assert left.publisher == "q" and left.topic == "/bad/#"


def _poison(client, settings, record, body=b"poison", qm=QM):
    """Make a poison message of ``record`` as broker_recover does: one failed delivery over max_redeliveries 0."""
    strict = settings.model_copy(update={"max_redeliveries": 0})
    consumer = Subscriber(client, qm, record, strict, consumer_id="c1", heartbeat=False)
    (delivery,) = consumer.receive_many(1)
    assert delivery.message.body == body
    assert consumer.recover_dead(closing="c1")[2] == 1


def test_a_poison_message_is_requeued_to_its_own_subscription_only(real_redis, settings):
    one = subscribe(real_redis, QM, "/ORD/#", "c", "one")
    two = subscribe(real_redis, QM, "/ORD/#", "c", "two")
    Publisher(real_redis, QM, "p").publish("/ORD/EU", b"poison", priority=7)
    _handle(real_redis, settings)
    _poison(real_redis, settings, one)
    (letter,), _ = list_dead_letters(real_redis, QM, Selection(subscription=one.sub_id))
    assert letter.poison and letter.publisher == "p" and letter.topic == "/ORD/EU" and letter.body_size == 6
    # --keep would deliver it again at each replay: skipped with the reason
    report = replay(real_redis, QM, Selection(subscription=one.sub_id), keep=True)
    assert report.replayed == [] and "without --keep" in report.skipped[0][1]
    report = replay(real_redis, QM, Selection(subscription=one.sub_id))
    assert report.replayed == report.requeued == [letter.id]
    assert letter.id.startswith(f"{one.sub_id}/") and letter.source == one.sub_id
    assert real_redis.xlen(keys.sub_poison(QM, one.sub_id)) == 0
    # back in its own priority band, received next; the other subscription still has one copy
    assert real_redis.llen(keys.sub_band(QM, one.sub_id, 7)) == 1
    assert [m.body for m in queue_messages(real_redis, QM, two.sub_id)] == [b"poison"]
    consumer = Subscriber(real_redis, QM, one, settings, consumer_id="c2", heartbeat=False)
    assert [d.message.body for d in consumer.receive_many(5)] == [b"poison"]


def test_a_poison_message_of_a_removed_subscription_is_skipped_and_kept(real_redis, settings):
    gone = subscribe(real_redis, QM, "/ORD/#", "c", "gone")
    Publisher(real_redis, QM, "p").publish("/ORD/EU", b"poison")
    _handle(real_redis, settings)
    _poison(real_redis, settings, gone)
    unsubscribe(real_redis, QM, gone.sub_id)
    report = replay(real_redis, QM, Selection(everything=True))
    assert report.replayed == [] and "no longer exists" in report.skipped[0][1]
    assert real_redis.xlen(keys.sub_poison(QM, gone.sub_id)) == 1  # kept with the subscription removed
    assert not real_redis.exists(keys.sub_queue(QM, gone.sub_id))


def test_an_impersonation_is_replayed_through_its_ingress_stream_once_the_id_is_bound(real_redis, settings):
    record = subscribe(real_redis, QM, "/ORD/#", "c", "ord")
    bind(real_redis, QM, "svc", ["svc-7"])
    ingress = keys.ingress(QM, "svc")
    real_redis.xadd(ingress, {"publisher": "svc-8", "topic": "/ORD/EU", "msgid": "m8", "body": "forged?"})
    _closed_topic(real_redis, "ORD", "/ORD")
    real_redis.xadd(ingress, {"publisher": "svc-7", "topic": "/ORD/EU", "msgid": "m7", "body": "owned"})
    _handle(real_redis, settings)
    forged, owned = list_dead_letters(real_redis, QM)[0]
    assert forged.fields["dlq.principal"] == b"svc" and "not bound" in forged.reason
    assert owned.fields["principal"] == b"svc" and "PUB(DISABLED)" in owned.reason
    alter(real_redis, QM, "ORD", pub="ENABLED")
    # The owned publisher's publication goes back by its principal's ingress: not refused as impersonation
    report = replay(real_redis, QM, Selection(everything=True))
    assert report.replayed == [owned.id] and "not bound to principal 'svc'" in dict(report.skipped)[forged.id]
    _handle(real_redis, settings)
    (message,) = queue_messages(real_redis, QM, record.sub_id)
    assert (message.body, message.publisher, message.principal) == (b"owned", "svc-7", "svc")
    # Once an operator binds the id, the impersonation dead letter is delivered too
    bind(real_redis, QM, "svc", ["svc-7", "svc-8"])
    assert replay(real_redis, QM, Selection(publisher="svc-8")).replayed == [forged.id]
    _handle(real_redis, settings)
    got = [(m.body, m.principal) for m in queue_messages(real_redis, QM, record.sub_id)]
    assert got == [(b"owned", "svc"), (b"forged?", "svc")]


def test_a_dead_letter_of_an_owned_id_naming_no_principal_is_not_laundered(real_redis, settings):
    bind(real_redis, QM, "svc", ["svc-7"])
    real_redis.xadd(
        keys.dead_letter(QM), {"publisher": "svc-7", "topic": "/a", "dlq.reason": "x", "dlq.entry_id": "1-1"}
    )
    report = replay(real_redis, QM, Selection(everything=True))
    assert report.replayed == [] and "forged" in report.skipped[0][1]


def test_a_foreign_dead_letter_key_is_named_and_nothing_is_written(real_redis):
    real_redis.set(keys.dead_letter(QM), "not a stream")
    for call in (
        lambda: list_dead_letters(real_redis, QM),
        lambda: count_by_reason(real_redis, QM),
        lambda: show(real_redis, QM, "1-1"),
        lambda: replay(real_redis, QM, Selection(everything=True)),
        lambda: purge(real_redis, QM, Selection(everything=True)),
    ):
        with pytest.raises(ForeignKey) as caught:
            call()
        assert caught.value.key == keys.dead_letter(QM)
    assert real_redis.get(keys.dead_letter(QM)) == b"not a stream"
    assert not real_redis.exists(keys.publish_stream(QM))


def test_a_foreign_publish_stream_stops_replay_before_any_write(real_redis):
    real_redis.xadd(
        keys.dead_letter(QM), {"publisher": "p", "topic": "/a", "dlq.reason": "x", "dlq.entry_id": "1-1"}
    )
    real_redis.set(keys.publish_stream(QM), "x")
    with pytest.raises(ForeignKey):
        replay(real_redis, QM, Selection(everything=True))
    assert real_redis.xlen(keys.dead_letter(QM)) == 1


def test_show_of_an_unknown_or_malformed_id_is_dead_letter_not_found(real_redis):
    with pytest.raises(DeadLetterNotFound):
        show(real_redis, QM, "1-1")
    with pytest.raises(DeadLetterNotFound, match="not a dead-letter id"):
        show(real_redis, QM, "nope")


def test_the_replay_script_writes_nothing_for_a_dead_letter_already_gone(real_redis):
    from broker.core.scripts import script_source

    real_redis.script_flush()
    script = real_redis.register_script(script_source("replay"))
    pipe = real_redis.pipeline()
    script(
        keys=[keys.dead_letter(QM), keys.publish_stream(QM)], args=["1-1", "0", "publisher", "p"], client=pipe
    )
    assert pipe.execute() == [0]
    assert not real_redis.exists(keys.publish_stream(QM))


def test_the_cli_lists_shows_replays_and_purges(run, real_server, real_redis, settings):
    def answering(answer, *args):  # the run fixture, with an answer typed at the prompt
        return CliRunner().invoke(cli.main, ["--redis-url", real_server.url, "--qm", QM, *args], input=answer)

    record = subscribe(real_redis, QM, "/PAY/#", "c", "pay")
    _closed_topic(real_redis)
    Publisher(real_redis, QM, "p").publish("/PAY/EU", "hello\x1b[2J", msgid="m-1")
    Publisher(real_redis, QM, "q").publish("/PAY/US", b"\xff\xfe", msgid="m-2")
    _handle(real_redis, settings)
    listed = run("dlq", "list")
    assert listed.exit_code == 0, listed.output
    assert "m-1" in listed.output and "PUB(DISABLED)" in listed.output
    first, second = list_dead_letters(real_redis, QM)[0]
    shown = run("dlq", "show", first.id)
    assert shown.exit_code == 0 and "hello\\x1b[2J" in shown.output and "\x1b" not in shown.output
    assert "2 bytes, not UTF-8> fffe" in run("dlq", "show", second.id).output
    assert run("dlq", "show", "9-9").exit_code == 2
    as_json = run("dlq", "list", "--publisher", "q", "--json")
    (row,) = json.loads(as_json.output)["dead_letters"]
    assert row["fields"]["body"] == {"hex": "fffe", "bytes": 2}
    # an empty selection is refused
    refused = run("dlq", "replay")
    assert refused.exit_code == 2 and "select dead letters" in refused.output
    alter(real_redis, QM, "PAY", pub="ENABLED")
    dry = run("dlq", "replay", first.id, "--dry-run")
    assert dry.exit_code == 0 and "would replay 1, skipped 0" in dry.output
    real_redis.delete(keys.alive(QM))  # the in-process workers above count as running for a while
    done = run("dlq", "replay", first.id, "--keep")
    assert "replayed 1, skipped 0" in done.stdout and "no worker is running" in done.stderr
    _handle(real_redis, settings)
    assert [m.body for m in queue_messages(real_redis, QM, record.sub_id)] == [b"hello\x1b[2J"]
    # purge asks first; no selection at all means everything, only after the confirmation
    assert run("dlq", "purge", "--yes").exit_code == 2
    kept = answering("n\n", "dlq", "purge", "--publisher", "q")
    assert kept.exit_code != 0 and real_redis.xlen(keys.dead_letter(QM)) == 2
    assert "purged 1" in run("dlq", "purge", "--publisher", "q", "--yes").output
    everything = answering("y\n", "dlq", "purge")
    assert "every dead letter: 1?" in everything.output and "purged 1" in everything.output
    assert real_redis.xlen(keys.dead_letter(QM)) == 0


def test_dead_letter_json_is_safe_for_every_field():
    letter = DeadLetter("1-0", 1, "r", None, None, None, None, None, None, {"body": b"\x80", "topic": b"/t"})
    assert letter.to_json()["fields"] == {"body": {"hex": "80", "bytes": 1}, "topic": "/t"}


def test_replay_and_requeue_work_on_a_redis_cluster(local_cluster):
    client = connect(local_cluster.url, check=True)
    qm = "DLQCL"
    try:
        config = Settings(redis_url=local_cluster.url, qm=qm, batch_size=50, heads=50, sweep_interval_ms=1)
        record = subscribe(client, qm, "/PAY/#", "c", "pay")
        define(client, qm, "PAY", "/PAY", Attributes(pub="DISABLED"))
        Publisher(client, qm, "p").publish("/PAY/EU", b"1", msgid="cl-1")
        drain(make_workers(client, config, 1))
        alter(client, qm, "PAY", pub="ENABLED")
        assert len(replay(client, qm, Selection(everything=True)).replayed) == 1
        drain(make_workers(client, config, 1))
        assert [m.body for m in queue_messages(client, qm, record.sub_id)] == [b"1"]
        _poison(client, config, record, b"1", qm=qm)
        assert replay(client, qm, Selection(subscription=record.sub_id)).requeued != []
        assert purge(client, qm, Selection(everything=True)) == 0
    finally:
        for key in client.scan_iter(keys.all_keys_pattern(qm)):
            client.delete(key)
        client.close()
