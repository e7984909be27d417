"""Server instructions per publication of ONE checkout's worker, run by ``scripts.bench_ab``.

Run with that checkout's own interpreter and code (``cwd`` = the checkout, ``PYTHONPATH`` = it):

    <checkout>/.venv/bin/python scripts/ab_instructions.py URL SERVER_PID N

It uses only the API every commit since protocol 1 has (``subscribe(client, qm, filter,
client_id, durable_name)``, ``Publisher.publish_many``, ``Worker(client, settings, name=)``,
``setup``, ``run_once``), so an old commit and a new one run the very same workload:

- 100 topics ``t/<k>``, each reaching F=8 durable subscriptions (its exact one and 7 wildcards);
- 50 publishers ``p00``..``p49`` in chunks of 20, 200-byte bodies, a msgid each (dedup records);
- with ``AB_RETAIN=1`` (this commit on), every publication retained (``retain 1``);
- one in-process worker, default settings; a warm-up of 200 publications (not counted), then
  ``N`` preloaded publications drained with the server's callgrind instrumentation on
  (``callgrind_control -i on|off SERVER_PID``);
- with ``AB_PACED=1``, the low-rate shape instead: each of the ``N`` publications is published
  alone and handled before the next (one publication per dequeue and per commit: what every call
  costs whatever its batch, as at 2,000/s, where most calls carry one publication).

**The worker's clock stands still** while the ``N`` publications are counted (``Worker(clock_ms=)``,
which every commit has): what a worker does on a timer (once a second: sweeps, heartbeat, the topic
statistics' flush) costs per second, not per publication, and under callgrind the server runs some
15 to 50 times slower than at full speed, so with a real clock each timer would fire that many
times more often per publication than it does at full speed (at 011b3e9-0da8319 the drain row
counted 7,800 of its 151,000 instructions per publication in those timers, 15 times their share
at full speed). The timers' own cost is then counted apart: the clock moves on by one second and
the worker runs one round with nothing to handle (``callgrind_control -d`` between the two: the
caller reads the last dump as the timers' second, the one before as the publications).

Prints one line of JSON: ``{"n": N, "rounds": worker rounds, "committed": publications}``.
The caller dumps and reads the server's counts. Exit 1 if the worker did not handle all N.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

QM = "AB"
TOPICS = [f"t/{k}" for k in range(100)]
WILDCARDS = ["t/+", "t/#", "#", "+/+", "+/#", "t/+/#", "+/+/#"]
PUBLISHERS = [f"p{i:02d}" for i in range(50)]
CHUNK = 20
BODY = b"x" * 200
#: ``AB_RETAIN=1``: every publication retained (the cost of retained publications when configured;
#: a commit before them has no such option: compare this tree with and without it)
_OPTIONS = {"retain": True} if os.environ.get("AB_RETAIN") == "1" else {}


def _control(pid: str, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, pid], check=True, capture_output=True)


def _preload(client: object, count: int, salt: str) -> None:
    from broker import Publisher

    publishers = [Publisher(client, QM, p) for p in PUBLISHERS]  # type: ignore[arg-type]
    sent, k = 0, 0
    while sent < count:
        take = min(CHUNK, count - sent)
        publisher = publishers[k % len(publishers)]
        items = [(TOPICS[(sent + i) % len(TOPICS)], BODY) for i in range(take)]
        publisher.publish_many(items, **_OPTIONS)
        sent += take
        k += 1


def _drain(worker: object, count: int) -> tuple[int, int]:
    done = rounds = 0
    idle = 0
    while done < count and idle < 1_000:
        got = worker.run_once(block=False)  # type: ignore[attr-defined]
        rounds += 1
        done += got
        idle = idle + 1 if got == 0 else 0
    return done, rounds


def main() -> int:
    import redis

    from broker import Settings, subscribe
    from worker.loop import Worker

    url, pid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = redis.Redis.from_url(url)
    client.flushall()
    for i, topic_filter in enumerate([*TOPICS, *WILDCARDS]):
        subscribe(client, QM, topic_filter, "ab", f"d{i}")
    clock = [int(time.time() * 1000)]  # moved on only by this driver (see the module docstring)
    worker = Worker(client, Settings(redis_url=url, qm=QM), name="ab-worker", clock_ms=lambda: clock[0])
    worker.setup()
    _preload(client, 200, "warm")
    _drain(worker, 200)
    if os.environ.get("AB_PACED") == "1":
        _control(pid, "-i", "on")
        committed = rounds = 0
        for _ in range(n):
            _preload(client, 1, "counted")
            done, took = _drain(worker, 1)
            committed += done
            rounds += took
        _control(pid, "-i", "off")
    else:
        _preload(client, n, "counted")
        _control(pid, "-i", "on")
        committed, rounds = _drain(worker, n)
        _control(pid, "-i", "off")
    _control(pid, "-d")  # the publications' counts; then one second of the worker's timers
    clock[0] += 1_000
    _control(pid, "-i", "on")
    worker.run_once(block=False)  # type: ignore[attr-defined]
    _control(pid, "-i", "off")
    print(json.dumps({"n": n, "rounds": rounds, "committed": committed}))
    return 0 if committed == n else 1


if __name__ == "__main__":
    sys.exit(main())
