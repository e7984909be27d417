"""Microseconds per ``Publisher.publish()`` call of ONE checkout, for ``scripts.bench_ab`` and bench row 22.

Run with that checkout's own interpreter and code (``cwd`` = the checkout, ``PYTHONPATH`` = it):

    <checkout>/.venv/bin/python scripts/ab_publish.py URL N

It uses only ``Publisher(client, qm, publisher_id, flow_control=...)`` and ``publish(topic, body)``,
which every commit since protocol 1 has. One publisher, one topic, 200-byte bodies, no result
waited for: after 1,000 warm-up calls, ``N`` calls are timed with flow control on (the default: the
publisher's flow key is read with each XADD) and off, and, as the reference in the same run, ``N``
bare redis-py ``client.xadd`` calls of the same fields. Wall time and this process's CPU time
(``time.process_time``: steadier on a shared box) are reported per call.

Prints one line of JSON: ``{"n", "flow_on_us", "flow_on_cpu_us", "flow_off_us", "flow_off_cpu_us",
"xadd_us", "xadd_cpu_us"}`` (microseconds per call); a commit from before flow control (its
``Publisher`` takes no ``flow_control``) has no ``flow_on_*``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
from typing import Any

QM = "ABPUB"
BODY = b"x" * 200
WARM_UP = 1_000


def _module(*names: str) -> Any:
    """The first of ``names`` that imports: this script runs on commits before and after the
    broker's modules moved into sub-packages (``broker.keys`` became ``broker.core.keys``)."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return importlib.import_module(names[-1])


def _timed(call: Any, n: int) -> tuple[float, float]:
    for _ in range(WARM_UP):
        call()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        call()
    return (time.perf_counter() - wall) * 1e6 / n, (time.process_time() - cpu) * 1e6 / n


def measure(client: Any, n: int) -> dict[str, float]:
    """Time ``n`` publish() calls with flow control on and off, and ``n`` bare XADDs (see the module text)."""
    from broker import Publisher

    keys = _module("broker.core.keys", "broker.keys")

    out: dict[str, float] = {"n": n}
    # a commit before flow control (no flow_control argument) publishes as "flow_off" does
    has_flow = "flow_control" in inspect.signature(Publisher).parameters
    for label, flow in (("flow_on", True), ("flow_off", False)) if has_flow else (("flow_off", False),):
        options = {"flow_control": flow} if has_flow else {}
        publisher = Publisher(client, QM, f"p-{label}", **options)
        out[f"{label}_us"], out[f"{label}_cpu_us"] = _timed(lambda p=publisher: p.publish("a/b", BODY), n)
        client.delete(keys.publish_stream(QM))
    fields = {"publisher": "p-raw", "topic": "a/b", "body": BODY, "msgid": "m", "seq": "1"}
    stream = keys.publish_stream(QM)
    out["xadd_us"], out["xadd_cpu_us"] = _timed(lambda: client.xadd(stream, fields), n)
    client.delete(stream)
    return {k: round(v, 2) for k, v in out.items()}


def main() -> int:
    connect = _module("broker.core.connection", "broker.connection").connect
    url, n = sys.argv[1], int(sys.argv[2])
    print(json.dumps(measure(connect(url), n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
