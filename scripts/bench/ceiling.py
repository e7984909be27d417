"""Row 1, the ceiling: the same fan-out as hand-packed MULTI transactions read by a bare hiredis reader, no Python decisions."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import hiredis
import redis

from scripts.bench.base import Ctx, Figures, Measurement, Row, cpu3, fmt
from scripts.bench.cpu import CpuMeter, redis_pid
from scripts.bench.workload import PUBLISHERS, TOPICS, BenchError, bodies


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _preload_raw(client: redis.Redis, stream: str, n: int, body_list: list[bytes]) -> None:
    """XADD ``n`` publication-shaped entries (publisher, seq, topic, ts, msgid, body) with redis-py."""
    rng = random.Random(11)
    pipe = client.pipeline(transaction=False)
    seqs = [0] * PUBLISHERS
    now_ms = int(time.time() * 1000)
    for i in range(n):
        p = i % PUBLISHERS
        seqs[p] += 1
        pipe.xadd(
            stream,
            {
                "publisher": f"p{p:02d}",
                "seq": seqs[p],
                "topic": rng.choice(TOPICS),
                "ts": now_ms,
                "msgid": f"m{i}",
                "body": body_list[i % len(body_list)],
            },
        )
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()


def run_ceiling(
    client: redis.Redis,
    host: str,
    port: int,
    routes: dict[str, tuple[str, ...]],
    n: int,
    tx_per_rt: int = 50,
    around: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """Time ``n`` MULTI / F x LPUSH / XACK / EXEC transactions, ``tx_per_rt`` per round trip.

    Entries are preloaded and read into the group's PEL first (untimed). The timed loop
    builds each payload (a one-line JSON header + the body, like an envelope), packs
    RESP by hand into one buffer per round trip, writes it to a raw socket and reads
    the replies with a bare ``hiredis.Reader``. ``around``: called just before the timed
    loop and just after it (``instructions`` counts the server's instructions in between).

    Returns:
        ``{"n", "tx_per_s", "deliveries_per_s", "elapsed_s", "cpu", "redis_usec_per_tx"}``.

    Raises:
        BenchError: a transaction failed.
    """
    stream, group = "ceiling:stream", "ceiling"
    client.flushdb()
    _preload_raw(client, stream, n, bodies())
    client.xgroup_create(stream, group, id="0")
    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
    while len(entries) < n:
        got = client.xreadgroup(group, "c1", {stream: ">"}, count=10_000)
        if not got:
            break
        entries.extend(got[0][1])
    prefixes = {t: [b"*3\r\n$5\r\nLPUSH\r\n" + _bulk(q.encode()) for q in qs] for t, qs in routes.items()}
    multi = b"*1\r\n$5\r\nMULTI\r\n"
    exec_ = b"*1\r\n$4\r\nEXEC\r\n"
    xack = b"*4\r\n$4\r\nXACK\r\n" + _bulk(stream.encode()) + _bulk(group.encode())
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    fanout = len(next(iter(prefixes.values())))
    client.config_resetstat()
    if around is not None:
        around[0]()
    meter = CpuMeter({"redis": [redis_pid(client)], "bench": [os.getpid()]})
    start = time.perf_counter()
    try:
        for first in range(0, len(entries), tx_per_rt):
            out = bytearray()
            chunk = entries[first : first + tx_per_rt]
            for entry_id, fields in chunk:
                header = b'{"entry_id":"%s","publisher":"%s","seq":%s,"topic":"%s","ts":%s}\n' % (
                    entry_id,
                    fields[b"publisher"],
                    fields[b"seq"],
                    fields[b"topic"],
                    fields[b"ts"],
                )
                payload = _bulk(header + fields[b"body"])
                out += multi
                for prefix in prefixes[fields[b"topic"].decode()]:
                    out += prefix
                    out += payload
                out += xack
                out += _bulk(entry_id)
                out += exec_
            sock.sendall(out)
            expected = len(chunk) * (fanout + 3)
            got_replies = 0
            while got_replies < expected:
                reply = reader.gets()
                if reply is False:
                    size = sock.recv_into(buf)
                    if not size:
                        raise BenchError("server closed the connection")
                    reader.feed(view, 0, size)
                    continue
                got_replies += 1
                if isinstance(reply, hiredis.ReplyError) or (
                    isinstance(reply, list) and any(isinstance(r, hiredis.ReplyError) for r in reply)
                ):
                    raise BenchError(f"ceiling transaction failed: {reply!r}")
        elapsed = time.perf_counter() - start
    finally:
        sock.close()
        if around is not None:
            around[1]()
    cpu = meter.stop()
    done = len(entries)
    pending = client.xpending(stream, group)["pending"]
    if pending:
        raise BenchError(f"ceiling: {pending} entries left unacknowledged")
    return {
        "n": done,
        "fanout": fanout,
        "tx_per_rt": tx_per_rt,
        "elapsed_s": round(elapsed, 3),
        "tx_per_s": round(done / elapsed),
        "deliveries_per_s": round(done * fanout / elapsed),
        "cpu": cpu,
        "redis_cpu_us_per_pub": round(cpu["redis"] / 100 * elapsed * 1e6 / max(done, 1), 2),
    }


# --------------------------------------------------------------------------------------------
# 2-3. The broker end to end: preload with Publisher.publish_many, then drain with the pool
# --------------------------------------------------------------------------------------------


def _repeat(ctx: Ctx, rep: int, tag: str) -> None:
    assert ctx.server is not None
    ctx.idle("ceiling")
    ctx.log(f"1. ceiling: hand-packed MULTI fan-out, N={ctx.args.n:,}{tag}")
    got = ctx.attempt(
        "ceiling", run_ceiling, ctx.client, "127.0.0.1", ctx.server.port, ctx.state["routes"], ctx.args.n
    )
    ctx.keep("ceiling", got, got and f"   {got['tx_per_s']:,} tx/s")


def _rows(f: Figures) -> list[Row]:
    if "ceiling" not in f:
        return []
    c = f["ceiling"]
    return [
        Row(
            "1. ceiling",
            fmt(c["tx_per_s"]),
            fmt(c["deliveries_per_s"]),
            f"MULTI + 10 LPUSH + XACK + EXEC, {c['tx_per_rt']} tx per round trip, hand-packed RESP, "
            f"hiredis.Reader; N={c['n']:,}; redis {c['redis_cpu_us_per_pub']} CPU-us/tx",
            cpu3(c["cpu"], ("bench",)),
        )
    ]


MEASUREMENT = Measurement(
    "ceiling", runs=("ceiling",), median_key="tx_per_s", topology=True, repeat=_repeat, rows=_rows
)
