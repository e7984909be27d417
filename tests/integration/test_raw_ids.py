"""Keys derived from a client's bytes use the bytes as sent (issue 24 bug 6), on the real server.

A raw XADD (another language's client) may send a msgid or a publisher id that is not UTF-8.
The publisher then waits on ``{qm}:reply:<n>:<publisher bytes>:<msgid bytes>``: the result must
be posted there, not on a key where a decoder put U+FFFD, and the dedup record must be keyed the
same way so that a retry is a duplicate. The subscriber reads such a msgid with U+FFFD for each
byte that is not UTF-8 (JSON text cannot carry it; ``Message.msgid``).
"""

from __future__ import annotations

import json

from broker.core import keys
from broker.core.entries import parse_entry
from broker.core.models import encode_envelope
from broker.network.mover import forwarded_fields
from broker.testing import drain, make_workers, queue_messages
from broker.topics.routing import RoutingTable
from broker.topics.subscriptions import subscribe
from tests.conftest import QM

RAW_MSGID = b"u\xff"


def _reply_key(publisher: bytes, msgid: bytes) -> bytes:
    """The reply key as a publisher in any language builds it from its own bytes (broker.core.protocol, Reply)."""
    return keys.reply_prefix(QM).encode() + str(len(publisher)).encode() + b":" + publisher + b":" + msgid


def _dedup_key(publisher: bytes, msgid: bytes) -> bytes:
    return keys.dedup_prefix(QM).encode() + str(len(publisher)).encode() + b":" + publisher + b":" + msgid


def _results(client, key: bytes) -> list[dict]:
    return [json.loads(r.decode("utf-8", "replace")) for r in client.lrange(key, 0, -1)]


def test_a_refused_publication_with_a_msgid_that_is_not_utf8_gets_its_reply_on_the_key_of_its_bytes(
    real_redis, settings
):
    # Given a raw publication on an invalid topic, msgid b"u\xff", asking for its result
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": "p", "topic": "a/#", "msgid": RAW_MSGID, "reply": "1"}
    )
    # When a worker handles it
    drain(make_workers(real_redis, settings, 1))
    # Then "refused" is on the key the publisher waits on, and nothing on a U+FFFD one
    (result,) = _results(real_redis, _reply_key(b"p", RAW_MSGID))
    assert result["status"] == "refused" and "wildcard" in result["reason"]
    assert not real_redis.exists(_reply_key(b"p", "u\ufffd".encode()))
    assert real_redis.xlen(keys.dead_letter(QM)) == 1  # nothing lost


def test_a_publisher_id_that_is_not_utf8_is_refused_on_the_key_of_its_bytes(real_redis, settings):
    real_redis.xadd(
        keys.publish_stream(QM), {"publisher": b"p\xff", "topic": "t/1", "msgid": b"m\xfe", "reply": "1"}
    )
    drain(make_workers(real_redis, settings, 1))
    (result,) = _results(real_redis, _reply_key(b"p\xff", b"m\xfe"))
    assert result["status"] == "refused" and "not valid UTF-8" in result["reason"]


def test_a_msgid_that_is_not_utf8_is_delivered_deduplicated_and_answered_on_the_keys_of_its_bytes(
    real_redis, settings
):
    # Given a subscription, and a raw publication with msgid b"u\xff" sent twice (a retry)
    sub = subscribe(real_redis, QM, "t/#", "app", "a")
    fields = {"publisher": "p", "topic": "t/1", "body": b"x", "msgid": RAW_MSGID, "reply": "1"}
    real_redis.xadd(keys.publish_stream(QM), fields)
    real_redis.xadd(keys.publish_stream(QM), {**fields, "body": b"retry"})
    # When the workers handle both
    drain(make_workers(real_redis, settings, 2))
    # Then both results are on the key of the bytes as sent: one delivered, one duplicate
    results = _results(real_redis, _reply_key(b"p", RAW_MSGID))
    assert sorted((r["status"], r["subscriptions"]) for r in results) == [("delivered", 1), ("duplicate", 0)]
    assert not real_redis.exists(_reply_key(b"p", "u\ufffd".encode()))
    # the dedup record is keyed by the bytes too
    assert real_redis.exists(_dedup_key(b"p", RAW_MSGID))
    # And the subscriber got it once: msgid shows the byte as U+FFFD, msgid_bytes is as sent
    (message,) = queue_messages(real_redis, QM, sub.sub_id)
    assert (message.body, message.msgid, message.msgid_bytes) == (b"x", "u\ufffd", RAW_MSGID)


def test_a_principal_name_that_is_not_utf8_names_its_ingress_stream_by_its_bytes(real_redis):
    # Given a principal written by hand whose name is not UTF-8
    real_redis.hset(keys.principals(QM), b"ops\xff", b"p")
    # When the routing table loads (a worker's, which waits on every ingress stream)
    table = RoutingTable(QM)
    table.load(real_redis)
    # Then its ingress stream is the key of those bytes, as Redis would name it
    (ingress,) = table.ingress
    real_redis.xadd(ingress, {"publisher": "p"})
    assert real_redis.exists(keys.ingress(QM, "ops").encode()[: -len("ops")] + b"ops\xff")


def test_a_channel_forwards_a_msgid_that_is_not_utf8_as_its_bytes():
    # Given the envelope a worker writes for a raw msgid b"u\xff", and one for b"u\xfe"
    envelopes = [
        encode_envelope(entry.header, entry.body)
        for entry in (
            parse_entry("1-0", {b"publisher": b"p", b"topic": b"t/1", b"msgid": raw}, 1_000)
            for raw in (b"u\xff", b"u\xfe")
        )
    ]
    # When a channel rebuilds the publication for the next queue manager
    forwarded = [forwarded_fields(envelope, "QM2") for envelope in envelopes]
    # Then each msgid is its bytes as sent, so the receiver does not take the second for a duplicate
    msgids = [fields[fields.index(b"msgid") + 1] for fields in forwarded]
    assert msgids == [b"u\xff", b"u\xfe"]
