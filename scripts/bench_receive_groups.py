"""The server's time per ``broker_receive`` with and without message groups (issue 28 row 12):
prints figures, not a timed test.

Loads one library at a time (``FUNCTION LOAD REPLACE``): this tree's, and, with ``--base REV``,
the one of an earlier commit (``git show REV:broker/lua/...``), in alternating rounds. Each round
fills one subscription's default band with ``--messages`` envelopes (a usual header, a 100-byte
body) and takes them all in batches of ``--batch`` with ``broker_receive``, and reads the
server's own microseconds per ``FCALL`` from ``INFO commandstats`` (so the client's round trips
do not count). Cases: an exclusive subscription, a shared one with no group (as the workers write
envelopes now, and as protocol 6 wrote them: the group property searched for), and (this tree's
library only) a shared one whose messages belong to ``--groups`` groups taken by two consumers in
turn, so that each call passes over the other consumer's groups.

    broker server --port 7113 --dir /tmp/7113-data &
    PYTHONPATH=$PWD python -m scripts.bench_receive_groups --redis-url redis://127.0.0.1:7113/0 --base main

The queue manager ``--qm`` (default ``BENCHGROUPS``) is deleted key by key before and after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from typing import Any

import redis

from broker.core import keys, library
from broker.core.models import GROUPED_FIELD
from scripts.bench.preload import LEGACY_PROTOCOL

QM = "BENCHGROUPS"
BODY = b"x" * 100


def _source_at(rev: str) -> str:
    """The library's source as ``broker.core.library`` assembles it, from commit ``rev``."""

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    names = ("receive", "ack", "recover", "browse")
    parts = [
        f"#!lua name={library.LIBRARY}",
        f"local PROTOCOL_VERSION = {keys.PROTOCOL_VERSION}",
        show("broker/lua/lib.lua"),
        show("broker/lua/library/subscription.lua"),
        *(show(f"broker/lua/library/{name}.lua") for name in names),
    ]
    return "\n".join(parts)


def _envelope(n: int, groups: int, legacy: bool = False) -> bytes:
    """Message ``n`` as a worker writes it (the header's ``grouped`` first when it has a group), or,
    with ``legacy``, as one written before protocol 7 (``v`` 6, no ``grouped``: searched)."""
    header: dict[str, Any] = {GROUPED_FIELD: True} if groups and not legacy else {}
    header |= {"v": LEGACY_PROTOCOL if legacy else keys.PROTOCOL_VERSION, "msgid": f"m{n}"}
    header |= {"publisher": "p", "seq": n, "topic": "orders/eu"}
    header["entry_id"] = f"1700000000000-{n}"
    header["props"] = {"region": "eu"}
    if groups:
        header["props"]["JMSXGroupID"] = f"g{n % groups}"
        header["props"]["JMSXGroupSeq"] = n // groups + 1
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + BODY


def _clean(client: redis.Redis) -> None:
    for key in client.scan_iter(match="{" + QM + "}*", count=1000):
        client.delete(key)


def _round(
    client: redis.Redis, mode: str, messages: int, batch: int, groups: int, legacy: bool = False
) -> float:
    """Microseconds of server time per ``batch`` messages taken (every call counted, also those that
    took nothing: with groups, a consumer whose groups' messages are all behind the other's)."""
    _clean(client)
    sub = keys.sub_queue(QM, "app$bench")
    pipe = client.pipeline(transaction=False)
    for i in range(0, messages, 1000):
        pipe.lpush(sub, *(_envelope(n, groups, legacy) for n in range(i, min(i + 1000, messages))))
    pipe.execute()
    consumers = ["c1", "c2"] if groups else ["c1"]
    taken, turn = 0, 0
    for g in range(groups):  # the groups shared out: g0 to c1, g1 to c2, ...
        client.fcall("broker_receive", 1, sub, consumers[g % 2], 1, 600_000, "", mode, 0, "", 0)
        taken += 1
    client.config_resetstat()
    start = taken
    while taken < messages:
        consumer = consumers[turn % len(consumers)]
        turn += 1
        reply = client.fcall("broker_receive", 1, sub, consumer, batch, 600_000, "", mode, 0, "", 0)
        got = (len(reply) - 2) // 2
        taken += got
        if turn > 100 * (messages // batch + 10):
            raise RuntimeError("the messages were not all taken")
    stats = client.info("commandstats")["cmdstat_fcall"]
    _clean(client)
    return float(stats["usec"]) / (taken - start) * batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6380/0")
    parser.add_argument("--base", default=None, help="a commit whose library to compare with")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    libraries = {"this tree": library.library_source()}
    if args.base:
        libraries = {f"{args.base}": _source_at(args.base), **libraries}
    cases = [
        ("exclusive", "exclusive", 0, False),
        ("shared, no groups", "shared", 0, False),
        ("shared, no groups, v6 envelopes", "shared", 0, True),
    ]
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, source in libraries.items():
            client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
            for label, mode, groups, legacy in cases:
                figures.setdefault((name, label), []).append(
                    _round(client, mode, args.messages, args.batch, groups, legacy)
                )
            if name == "this tree":
                label = f"shared, {args.groups} groups, 2 consumers"
                figures.setdefault((name, label), []).append(
                    _round(client, "shared", args.messages, args.batch, args.groups)
                )
    library.load_library(client)  # this tree's again
    print(f"server us of broker_receive per {args.batch} messages taken, over {args.rounds} rounds:")
    print(f"  {'library':>12}  {'case':<36} {'min':>8} {'median':>8}")
    for (name, label), values in figures.items():
        print(f"  {name:>12}  {label:<36} {min(values):8.1f} {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
