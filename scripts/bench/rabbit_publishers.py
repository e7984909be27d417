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


class _Channel:
    """One publisher's pika channel in a publisher process: publishes its topics, counts confirms."""

    def __init__(self, session: _Session, publisher: str, topics: list[str]) -> None:
        self.session = session
        self.publisher = publisher
        self.keys = [amqp_key(t) for t in topics]
        self.sent = 0
        self.unconfirmed: set[int] = set()
        self.finished = False
        self.channel: Any = None

    def on_open(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self.session.on_channel_closed)
        if self.session.confirms:
            channel.confirm_delivery(self.on_confirm, callback=lambda _frame: self.session.opened())
        else:
            self.session.opened()

    def pump(self, limit: int) -> None:
        """Publish up to ``limit`` more (and at most the window's room)."""
        session = self.session
        end = len(self.keys)
        if session.confirms:
            limit = min(limit, session.window - len(self.unconfirmed))
        publish = self.channel.basic_publish
        while limit > 0 and self.sent < end:
            self.sent += 1
            props = session.pika.BasicProperties(
                delivery_mode=session.delivery_mode,
                message_id=f"{self.publisher}-{self.sent}",
                app_id=self.publisher,
            )
            publish(session.exchange, self.keys[self.sent - 1], session.body, props)
            if session.confirms:
                self.unconfirmed.add(self.sent)  # delivery tags count from 1 per channel
            limit -= 1
        if self.sent == end and not self.finished:
            if session.confirms and not self.unconfirmed:
                self.finish()
            elif not session.confirms:
                self.finished = True  # a synchronous round trip: everything before it was routed
                self.channel.basic_qos(prefetch_count=0, callback=lambda _frame: self.finish())

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        tags = (
            {t for t in self.unconfirmed if t <= method.delivery_tag}
            if method.multiple
            else {method.delivery_tag}
        )
        if isinstance(method, self.session.pika.spec.Basic.Nack):
            self.session.state["nacked"] += len(tags & self.unconfirmed)
        self.unconfirmed -= tags
        self.pump(self.session.window)
        if self.sent == len(self.keys) and not self.unconfirmed and not self.finished:
            self.finish()

    def finish(self) -> None:
        self.finished = True
        self.session.channel_done()


class _Session:
    """One publisher process's ``SelectConnection``: its channels, the counters, the pipe to the parent."""

    #: transient: publish more only when pika's write buffer is below this many bytes
    BUFFER_LIMIT = 256 * 1024

    def __init__(
        self,
        pika: Any,
        exchange: str,
        delivery_mode: int,
        confirms: bool,
        window: int,
        body: bytes,
        conn: Any,
        go: Any,
    ) -> None:
        self.pika = pika
        self.exchange, self.delivery_mode, self.confirms = exchange, delivery_mode, confirms
        self.window, self.body, self.conn, self.go = window, body, conn, go
        self.state: dict[str, Any] = {"open": 0, "done": 0, "nacked": 0}
        self.channels: list[_Channel] = []
        self.connection: Any = None

    def channel_done(self) -> None:
        state = self.state
        state["done"] += 1
        if state["done"] == len(self.channels):
            t_end = time.perf_counter()
            published = sum(c.sent for c in self.channels)
            self.conn.send(("done", state["t_start"], t_end, published, state["nacked"]))
            self.connection.close()

    def opened(self) -> None:
        self.state["open"] += 1
        if self.state["open"] == len(self.channels):
            self.conn.send(("ready",))
            self.connection.ioloop.call_later(0.001, self.wait_go)

    def wait_go(self) -> None:
        if not self.go.is_set():
            self.connection.ioloop.call_later(0.001, self.wait_go)
            return
        self.state["t_start"] = time.perf_counter()
        if self.confirms:
            for c in self.channels:
                c.pump(self.window)
        else:
            self.tick()

    def tick(self) -> None:
        """Transient: a round of 20 per channel whenever pika's write buffer is short."""
        if self.connection._get_write_buffer_size() < self.BUFFER_LIMIT:
            for c in self.channels:
                if not c.finished:
                    c.pump(20)
        if any(not c.finished for c in self.channels):
            self.connection.ioloop.call_later(0, self.tick)

    def on_channel_closed(self, channel: Any, reason: Exception) -> None:
        if self.state["done"] < len(self.channels):
            self.fail(f"channel {channel.channel_number} closed: {reason}")

    def fail(self, text: str) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("error", text))
        self.state["done"] = len(self.channels) + 1
        with contextlib.suppress(Exception):
            self.connection.ioloop.stop()

    def on_open(self, connection: Any) -> None:
        for c in self.channels:
            connection.channel(on_open_callback=c.on_open)

    def on_open_error(self, _connection: Any, error: Exception) -> None:
        self.fail(f"connection failed: {error!r}")

    def on_closed(self, _connection: Any, reason: Exception) -> None:
        if self.state["done"] < len(self.channels):
            self.fail(f"connection closed: {reason!r}")
        self.connection.ioloop.stop()


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

    session = _Session(pika, exchange, delivery_mode, confirms, window, body, conn, go)
    session.channels.extend(_Channel(session, p, topics) for p, topics in work.items())
    params = pika.ConnectionParameters(host="127.0.0.1", port=port, heartbeat=0)
    session.connection = SelectConnection(
        params,
        on_open_callback=session.on_open,
        on_open_error_callback=session.on_open_error,
        on_close_callback=session.on_closed,
    )
    try:
        session.connection.ioloop.start()
    except Exception as exc:  # reported to the parent, which raises BenchError
        session.fail(f"{type(exc).__name__}: {exc}")
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
