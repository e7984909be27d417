"""The broker's protocol from Python with plain redis-py, no ``broker`` import (docs/protocol.md).

Makes a subscription, publishes with a result, receives (a body that is not UTF-8 too),
acknowledges, and recovers the message of a consumer that was killed. Run it with the server
and a worker running (``broker server``; ``broker worker``), as a user that may make
subscriptions::

    python examples/python/consume.py --port 6380 --qm QM1

Each step prints one line the test suite checks (tests/integration/test_examples.py).
"""

from __future__ import annotations

import argparse
import json

import redis


def publish(client: redis.Redis, qm: str, msgid: str, body: bytes) -> str:
    """One XADD asking for the result, then one BLPOP on the reply key; returns the status."""
    publisher = "svc-7"
    client.xadd(
        f"{{{qm}}}:publish",
        {"publisher": publisher, "topic": "/ORDERS/EU", "msgid": msgid, "reply": "1", "body": body},
    )
    # the reply key carries the publisher id's length in bytes
    reply_key = f"{{{qm}}}:reply:{len(publisher.encode())}:{publisher}:{msgid}"
    got = client.blpop([reply_key], timeout=10)
    if got is None:
        raise SystemExit(f"no result for {msgid} within 10 s: is a worker running?")
    return str(json.loads(got[1])["status"])


def receive(client: redis.Redis, key: str, consumer: str, most: int) -> list[tuple[bytes, int]]:
    """Take up to ``most`` messages into ``consumer``'s in-flight list (a 30 s lease):
    ``[(envelope, delivery count)]``."""
    reply = client.fcall("broker_receive", 1, key, consumer, most, 30_000)
    status = reply[0].decode()
    if status != "ok":
        raise SystemExit(f"receive: {status}")
    return list(zip(reply[2::2], reply[3::2], strict=True))


def body_of(envelope: bytes) -> bytes:
    """An envelope is ``<header JSON>\\n<body bytes>``."""
    return envelope.split(b"\n", 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6380)
    parser.add_argument("--qm", default="QM1")
    args = parser.parse_args()
    client = redis.Redis(host=args.host, port=args.port)  # bytes in, bytes out: bodies are bytes
    qm, sub_id = args.qm, "app$orders"
    key = f"{{{qm}}}:sub:{sub_id}"  # the subscription's key: every FCALL takes it, and only it

    # Subscribe (an administrator's step): one hash field and a version bump, in one transaction
    record = {"filter": "/ORDERS/+", "durable": True, "created_ms": 0, "mode": "shared"}
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(f"{{{qm}}}:subs", sub_id, json.dumps(record))
        pipe.incr(f"{{{qm}}}:version")
        pipe.execute()

    for msgid, body in (("p-1", b"hello"), ("p-2", b"caf\xe9 \xff\xfe")):  # the second is not UTF-8
        print(f"published {msgid}: {publish(client, qm, msgid, body)}")

    got = receive(client, key, "c1", 10)
    print(f"c1 received {len(got)} messages")
    for envelope, count in got:
        print(f"c1 received body {body_of(envelope).hex()}, delivery count {count}")
    # acknowledge with the exact bytes received, the whole batch in one call
    print(f"c1 acknowledged {client.fcall('broker_ack', 1, key, 'c1', *[e for e, _ in got])}")

    # A consumer killed while it held a message: c2 takes one and never acknowledges it
    print(f"published p-3: {publish(client, qm, 'p-3', b'again')}")
    receive(client, key, "c2", 1)
    print("c2 holds 1 message and is killed")
    # Once its lease has passed, recover gives its messages back (the workers' sweep does it
    # too); here the call is told the time just after c2's deadline instead of waiting 30 s
    deadline = int(client.zscore(f"{key}:consumers", "c2") or 0)
    recovered = client.fcall("broker_recover", 1, key, deadline + 1)
    print(f"recovered (consumers, given back, poison): {' '.join(map(str, recovered))}")
    [(envelope, count)] = receive(client, key, "c3", 1)
    acked = client.fcall("broker_ack", 1, key, "c3", envelope)
    print(f"c3 received body {body_of(envelope).hex()}, delivery count {count}, acknowledged {acked}")


if __name__ == "__main__":
    main()
