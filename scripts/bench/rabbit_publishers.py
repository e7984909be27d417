"""Row 17's publishers: processes of one pika ``SelectConnection`` each, one channel per publisher,
persistent with publisher confirms or transient; started together, timed on one clock."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

from scripts.bench.rabbit import EXCHANGE, MODES, amqp_key
from scripts.bench.rabbit_node import RabbitNode
from scripts.bench.workload import (
    BenchError,
)


def _publisher_process(
    port: int,
    exchange: str,
    work: dict[str, list[str]],
    delivery_mode: int,
    confirms: bool,
    window: int,
    body: bytes,
    conn: Any,
    go: Any,
) -> None:
    """One process: one pika ``SelectConnection``, one channel per publisher of ``work`` (publisher id ->
    topics). Sends ``("ready",)`` when every channel is open, starts when ``go`` is set, then sends
    ``("done", t_start, t_end, published, nacked)`` (``time.perf_counter``, the same clock in every
    process on Linux) or ``("error", text)``."""
    import pika
    from pika.adapters.select_connection import SelectConnection

    state: dict[str, Any] = {"open": 0, "done": 0, "nacked": 0}
    channels: list[_Channel] = []
    buffer_limit = 256 * 1024  # transient: publish more only when pika's write buffer is below this

    class _Channel:
        def __init__(self, publisher: str, topics: list[str]) -> None:
            self.publisher = publisher
            self.keys = [amqp_key(t) for t in topics]
            self.sent = 0
            self.unconfirmed: set[int] = set()
            self.finished = False
            self.channel: Any = None

        def on_open(self, channel: Any) -> None:
            self.channel = channel
            channel.add_on_close_callback(on_channel_closed)
            if confirms:
                channel.confirm_delivery(self.on_confirm, callback=lambda _frame: opened())
            else:
                opened()

        def pump(self, limit: int) -> None:
            """Publish up to ``limit`` more (and at most the window's room)."""
            end = len(self.keys)
            if confirms:
                limit = min(limit, window - len(self.unconfirmed))
            publish = self.channel.basic_publish
            while limit > 0 and self.sent < end:
                self.sent += 1
                props = pika.BasicProperties(
                    delivery_mode=delivery_mode,
                    message_id=f"{self.publisher}-{self.sent}",
                    app_id=self.publisher,
                )
                publish(exchange, self.keys[self.sent - 1], body, props)
                if confirms:
                    self.unconfirmed.add(self.sent)  # delivery tags count from 1 per channel
                limit -= 1
            if self.sent == end and not self.finished:
                if confirms and not self.unconfirmed:
                    self.finish()
                elif not confirms:
                    self.finished = True  # a synchronous round trip: everything before it was routed
                    self.channel.basic_qos(prefetch_count=0, callback=lambda _frame: self.finish())

        def on_confirm(self, frame: Any) -> None:
            method = frame.method
            tags = (
                {t for t in self.unconfirmed if t <= method.delivery_tag}
                if method.multiple
                else {method.delivery_tag}
            )
            if isinstance(method, pika.spec.Basic.Nack):
                state["nacked"] += len(tags & self.unconfirmed)
            self.unconfirmed -= tags
            self.pump(window)
            if self.sent == len(self.keys) and not self.unconfirmed and not self.finished:
                self.finish()

        def finish(self) -> None:
            self.finished = True
            state["done"] += 1
            if state["done"] == len(channels):
                t_end = time.perf_counter()
                published = sum(c.sent for c in channels)
                conn.send(("done", state["t_start"], t_end, published, state["nacked"]))
                connection.close()

    def opened() -> None:
        state["open"] += 1
        if state["open"] == len(channels):
            conn.send(("ready",))
            connection.ioloop.call_later(0.001, wait_go)

    def wait_go() -> None:
        if not go.is_set():
            connection.ioloop.call_later(0.001, wait_go)
            return
        state["t_start"] = time.perf_counter()
        if confirms:
            for c in channels:
                c.pump(window)
        else:
            tick()

    def tick() -> None:
        """Transient: a round of 20 per channel whenever pika's write buffer is short."""
        if connection._get_write_buffer_size() < buffer_limit:
            for c in channels:
                if not c.finished:
                    c.pump(20)
        if any(not c.finished for c in channels):
            connection.ioloop.call_later(0, tick)

    def on_channel_closed(channel: Any, reason: Exception) -> None:
        if state["done"] < len(channels):
            fail(f"channel {channel.channel_number} closed: {reason}")

    def fail(text: str) -> None:
        with contextlib.suppress(Exception):
            conn.send(("error", text))
        state["done"] = len(channels) + 1
        with contextlib.suppress(Exception):
            connection.ioloop.stop()

    def on_open(connection: Any) -> None:
        for c in channels:
            connection.channel(on_open_callback=c.on_open)

    def on_open_error(_connection: Any, error: Exception) -> None:
        fail(f"connection failed: {error!r}")

    def on_closed(_connection: Any, _reason: Exception) -> None:
        if state["done"] < len(channels):
            fail(f"connection closed: {_reason!r}")
        connection.ioloop.stop()

    channels.extend(_Channel(p, topics) for p, topics in work.items())
    params = pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=0)
    connection = SelectConnection(
        params, on_open_callback=on_open, on_open_error_callback=on_open_error, on_close_callback=on_closed
    )
    try:
        connection.ioloop.start()
    except Exception as exc:  # reported to the parent, which raises BenchError
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


@contextlib.contextmanager
def _publishers(
    node: RabbitNode,
    work: dict[str, list[str]],
    procs: int,
    mode: str,
    window: int,
    body: bytes,
    timeout_s: float,
) -> Iterator[tuple[list[Any], list[Any], Any]]:
    """Start ``procs`` publisher processes (the publishers dealt round robin) and wait until every
    channel is open; yields (processes, their pipe ends, the start event). Processes are ended at exit."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    ids = list(work)
    delivery_mode, confirms = MODES[mode]
    processes, pipes = [], []
    try:
        for k in range(procs):
            mine = {p: work[p] for p in ids[k::procs]}
            parent, child = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_publisher_process,
                args=(node.port, EXCHANGE, mine, delivery_mode, confirms, window, body, child, go),
                daemon=True,
            )
            process.start()
            child.close()
            processes.append(process)
            pipes.append(parent)
        for got in _gather(pipes, processes, "ready", timeout_s):
            if got[0] != "ready":
                raise BenchError(f"RabbitMQ publisher: {got[1] if len(got) > 1 else got}")
        yield processes, pipes, go
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)


def _gather(pipes: list[Any], processes: list[Any], what: str, timeout_s: float) -> list[tuple[Any, ...]]:
    """One message from every pipe, within ``timeout_s``."""
    from multiprocessing.connection import wait

    out: list[tuple[Any, ...] | None] = [None] * len(pipes)
    deadline = time.monotonic() + timeout_s
    while any(x is None for x in out):
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError(f"RabbitMQ publishers: not all {what} after {timeout_s:.0f} s")
        for ready in wait([p for p, x in zip(pipes, out, strict=True) if x is None], timeout=min(left, 1.0)):
            i = pipes.index(ready)
            try:
                out[i] = pipes[i].recv()
            except EOFError:
                raise BenchError(
                    f"RabbitMQ publisher process {processes[i].pid} exited (code {processes[i].exitcode})"
                ) from None
    return [x for x in out if x is not None]
