"""A malformed element of a subscriber queue never stops a consumer (issue 24, bug 4).

Something other than a worker may write into a subscriber queue. Whatever it wrote, a
consumer (``Subscriber.receive``, ``receive_many``, ``broker subscribe``) dead-letters it at
once (reason "malformed envelope: ...", ``dlq.subscription``), removed from its in-flight list
with its dead letter in one step (``reject.lua``), and goes on to the good messages behind it.
"""

from __future__ import annotations

import pytest

from broker import subscribe
from broker.clients.consumer import Subscriber
from broker.core import keys
from broker.core.config import Settings
from broker.core.models import encode_envelope

QM = "TEST"


def _good(n: int) -> bytes:
    header = {"v": keys.PROTOCOL_VERSION, "msgid": f"m{n}", "publisher": "p", "seq": n, "topic": "/bad"}
    return encode_envelope({**header, "ts": 1, "entry_id": f"1-{n}"}, f"body{n}".encode())


#: Malformed at the header line: found as the envelope is taken (receive and receive_many).
LINE_MALFORMED = {
    "no header line": b"a string with no header line",
    "empty": b"",
    "header not JSON": b'{"msgid": "m", bad json}\nbody',
    "header not UTF-8": b'{"msgid": "\xff\xfe", "publisher": "p", "topic": "/bad", "ts": 1}\nbody',
    "truncated": _good(9)[:25],
    "header not an object": b"[1, 2]\nbody",
    "deeply nested": b"[" * 2_000 + b"\nbody",
}
#: A JSON object header whose fields are wrong: found when the message is read.
FIELD_MALFORMED = {
    "msgid not text": b'{"msgid": 5, "publisher": "p", "topic": "/bad", "ts": 1}\nbody',
    "no topic": b'{"msgid": "m", "publisher": "p", "ts": 1, "entry_id": "1-77"}\nbody',
    "priority out of range": b'{"msgid": "m", "publisher": "p", "topic": "/bad", "ts": 1, "priority": 12}\n',
}
ALL_MALFORMED = {**LINE_MALFORMED, **FIELD_MALFORMED}


def _queue_bad_then_good(client, sub_id: str, bad: bytes, good: int = 2) -> None:
    """The malformed element first (oldest: rightmost), then ``good`` good ones."""
    client.lpush(keys.sub_queue(QM, sub_id), bad, *[_good(n) for n in range(1, good + 1)])


def _dead_letters(client) -> list[dict[bytes, bytes]]:
    """Every poison message of every subscription (each its own stream ``keys.sub_poison``)."""
    streams = sorted(client.scan_iter(match=keys.sub_poison(QM, "*")))
    return [fields for stream in streams for _, fields in client.xrange(stream)]


def _assert_dead_lettered(client, sub_id: str, bad: bytes) -> None:
    (letter,) = _dead_letters(client)
    assert letter[b"envelope"] == bad
    assert letter[b"dlq.reason"].startswith(b"malformed envelope: ")
    assert letter[b"dlq.subscription"] == sub_id.encode()


def _consumer(client, settings: Settings, name: str) -> tuple[str, Subscriber]:
    record = subscribe(client, QM, "/bad", "app", name)
    return record.sub_id, Subscriber(client, QM, record, settings, consumer_id="c", heartbeat=False)


@pytest.mark.parametrize("kind", ALL_MALFORMED)
def test_receive_dead_letters_a_malformed_envelope_and_returns_the_good_one_behind_it(
    real_redis, settings, kind
):
    # Given a malformed element, then two good messages, in a subscriber queue
    sub_id, consumer = _consumer(real_redis, settings, "one")
    bad = ALL_MALFORMED[kind]
    _queue_bad_then_good(real_redis, sub_id, bad)
    # When the consumer receives one message
    delivery = consumer.receive()
    # Then it is the first good one (it reads), the bad one is in the dead-letter queue with the
    # reason, and only the good one is in flight
    assert delivery is not None and delivery.message.msgid == "m1"
    _assert_dead_lettered(real_redis, sub_id, bad)
    assert real_redis.lrange(consumer.inflight, 0, -1) == [delivery.raw]
    assert consumer.ack(delivery) and consumer.in_flight() == 0
    assert consumer.receive().message.msgid == "m2"  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", LINE_MALFORMED)
@pytest.mark.parametrize("batch", [1, 10])
def test_receive_many_dead_letters_a_malformed_envelope_at_once_and_hands_over_the_good_ones(
    real_redis, settings, kind, batch
):
    # Given a malformed element, then two good messages
    sub_id, consumer = _consumer(real_redis, settings, "many")
    bad = LINE_MALFORMED[kind]
    _queue_bad_then_good(real_redis, sub_id, bad)
    # When the consumer takes a batch (of one: it takes again past the malformed one)
    got = consumer.receive_many(batch)
    # Then only good messages are handed over, the bad one is dead-lettered with the reason
    assert [d.message.msgid for d in got] == ["m1", "m2"][:batch]
    _assert_dead_lettered(real_redis, sub_id, bad)
    assert consumer.ack_many(got) == len(got) and consumer.in_flight() == 0


@pytest.mark.parametrize("kind", FIELD_MALFORMED)
def test_a_malformed_header_field_is_dead_lettered_when_taken_and_the_others_read(real_redis, settings, kind):
    # Given a header that is a JSON object with wrong fields, then two good messages
    sub_id, consumer = _consumer(real_redis, settings, "fields")
    bad = FIELD_MALFORMED[kind]
    _queue_bad_then_good(real_redis, sub_id, bad)
    # When the consumer takes them all
    got = consumer.receive_many(10)
    # Then the malformed one was dead-lettered as it was taken (out of flight), never handed over,
    # and every delivery handed over reads without error
    _assert_dead_lettered(real_redis, sub_id, bad)
    assert [d.message.msgid for d in got] == ["m1", "m2"]
    assert consumer.in_flight() == 2
    assert consumer.ack_many(got) == 2 and consumer.in_flight() == 0
    assert len(_dead_letters(real_redis)) == 1


def test_a_malformed_envelope_given_back_by_a_dead_consumer_is_dead_lettered_once(real_redis, settings):
    # Given a malformed envelope in flight at a consumer that died (its in-flight list given back)
    sub_id, consumer = _consumer(real_redis, settings, "given-back")
    bad = LINE_MALFORMED["no header line"]
    real_redis.lpush(consumer.inflight, bad)
    real_redis.lpush(keys.sub_queue(QM, sub_id), _good(1))
    consumer.recover_dead(closing="c")
    # When another consumer receives
    other = Subscriber(real_redis, QM, consumer.record, settings, consumer_id="d", heartbeat=False)
    delivery = other.receive()
    # Then it gets the good message, and the malformed one is dead-lettered once
    assert delivery is not None and delivery.message.msgid == "m1"
    _assert_dead_lettered(real_redis, sub_id, bad)


def test_broker_reject_works_after_function_flush_and_in_a_pipeline(real_redis, settings):
    _, consumer = _consumer(real_redis, settings, "flush")
    real_redis.lpush(consumer.inflight, b"x", b"y")
    real_redis.function_flush()
    assert consumer.dead_letter_malformed([(b"x", "malformed envelope: test")]) == 1
    pipe = real_redis.pipeline()
    pipe.fcall(
        "broker_reject",
        1,
        consumer.queue,
        consumer.consumer_id,
        100,
        b"y",
        "malformed envelope: test",
        b"z",
        "r",
    )
    assert pipe.execute() == [1]  # "z" was not in flight: not dead-lettered
    assert consumer.in_flight() == 0 and len(_dead_letters(real_redis)) == 2


@pytest.mark.parametrize("kind", ["no header line", "header not UTF-8", "msgid not text"])
def test_broker_subscribe_count_2_prints_the_good_messages_past_a_malformed_one(run, real_redis, kind):
    # Given a durable subscription with a malformed element, then two good messages
    made = run("subscribe", "/bad", "--client-id", "app", "--durable", "q", "--timeout-ms", "1")
    assert made.exit_code == 0, made.output
    bad = ALL_MALFORMED[kind]
    _queue_bad_then_good(real_redis, "app$q", bad)
    # When broker subscribe --count 2 runs
    result = run(
        "subscribe", "/bad", "--client-id", "app", "--durable", "q", "--count", "2", "--timeout-ms", "5000"
    )
    # Then it exits 0 after printing both good messages, and the bad one is dead-lettered
    assert result.exit_code == 0, result.output
    assert [line.split()[-1] for line in result.stdout.splitlines()] == ["body1", "body2"]
    _assert_dead_lettered(real_redis, "app$q", bad)
    assert real_redis.llen(keys.sub_queue(QM, "app$q")) == 0
