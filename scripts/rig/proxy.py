"""A loopback TCP proxy in front of Redis that loses replies on demand.

Clients (workers, publishers) connect to the proxy instead of Redis. When told
(``drop_reply``), the proxy forwards the next client write that contains a
given byte string (a script's SHA1, ``FCALL broker_commit``, ``XADD``, ...) to the server, waits until
the server has started to answer (so the command was applied), throws the
answer away and cuts the client's connection: the client cannot know whether
its command took effect, and redis-py re-sends it on a new connection. That is
the "lost reply" of ``research/reliability-anchors.md`` (exp7), made
deterministic. ``cut_all`` closes every connection at once (like
``CLIENT KILL``).

The proxy runs an asyncio loop in a thread (``Proxy``), so a test can drive
it in-process; ``ProxyProcess`` runs one or more proxies in a child process
(the chaos harness, so that the proxy does not compete for its GIL) and is
controlled over a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from broker.core.library import COMMIT, DEQUEUE
from broker.core.scripts import script_source

#: How long to keep reading (and discarding) the server's answer once it has
#: started, before cutting the connection, ms: lets the rest of a pipeline apply.
SETTLE_MS = 50

#: How long to wait for the server to start answering a command whose reply is
#: to be dropped, ms; the connection is cut after this even without an answer.
ANSWER_TIMEOUT_MS = 2_000

#: Bytes of the previous client write kept to find a match split over two writes.
_TAIL = 128


def script_sha(name: str) -> bytes:
    """The SHA1 redis-py sends in ``EVALSHA`` for ``broker/lua/<name>.lua`` (with its prelude), as bytes."""
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest().encode()


def evalsha(name: str) -> bytes:
    """The bytes of an ``EVALSHA`` of ``broker/lua/<name>.lua`` on the wire (RESP), to match a call.

    Matching the bare SHA1 would also match the ``SCRIPT EXISTS`` that redis-py
    sends before every pipeline that calls scripts.
    """
    return b"$7\r\nEVALSHA\r\n$40\r\n" + script_sha(name)


def fcall(function: str) -> bytes:
    """The bytes of an ``FCALL`` of the library function ``function`` on the wire (RESP), to match a call."""
    name = function.encode()
    return b"$5\r\nFCALL\r\n$%d\r\n%s\r\n" % (len(name), name)


def call_of(what: str) -> bytes:
    """The bytes of the worker's call ``what`` on the wire, to match it: ``FCALL broker_commit`` for
    "commit" and ``FCALL broker_dequeue`` for "dequeue" (the unit of work and the queue mutex are
    functions of the library ``broker``), else the ``EVALSHA`` of ``broker/lua/<what>.lua``."""
    functions = {"commit": COMMIT, "dequeue": DEQUEUE}
    return fcall(functions[what]) if what in functions else evalsha(what)


@dataclass
class _Armed:
    match: bytes
    count: int
    label: str
    forward: bool = True


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tail: bytes = b""
    dropping: str | None = None
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False


@dataclass
class ProxyStats:
    """Counters of one proxy.

    Attributes:
        connections: client connections accepted.
        drops: replies dropped after the server had started to answer.
        unanswered: connections cut while waiting for an answer that never came.
        cuts: connections closed by ``cut_all``.
        requests_cut: connections cut by ``cut_request`` (the command never reached the server).
        drops_by_label: ``drops`` and ``requests_cut`` by the label given when armed.
    """

    connections: int = 0
    drops: int = 0
    unanswered: int = 0
    cuts: int = 0
    requests_cut: int = 0
    drops_by_label: dict[str, int] = field(default_factory=dict)


def _quiet_cancellation(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Report what the loop reports, except a connection handler cancelled at stop.

    Python 3.11's ``StreamReaderProtocol`` calls ``exception()`` on a handler
    task in a done callback, which raises for a cancelled one: without this,
    every connection still open at stop printed a traceback after the harness's
    last line.
    """
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


class Proxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to a Redis server on ``127.0.0.1:<upstream_port>``.

    Args:
        upstream_port: the server's port (the server may restart on it).
        port: the port to listen on; None picks a free one.
    """

    def __init__(self, upstream_port: int, port: int | None = None) -> None:
        self.upstream_port = upstream_port
        self.port = port or 0
        self.stats = ProxyStats()
        self._armed: list[_Armed] = []
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._dropped = threading.Condition()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    # -- control (any thread) -------------------------------------------------

    def start(self) -> Proxy:
        """Start listening (in a daemon thread) and return once the port is open."""
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.upstream_port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def stop(self) -> None:
        """Close every connection and the listening socket, and end the thread."""
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(10)

    def drop_reply(self, match: bytes = b"", count: int = 1, label: str = "") -> None:
        """Lose the reply to the next ``count`` client writes that contain ``match``.

        Args:
            match: bytes to look for in what a client sends (b"" matches any write).
            count: how many replies to drop.
            label: the name under which drops are counted in ``stats.drops_by_label``.
        """
        with self._lock:
            self._armed.append(_Armed(match, count, label or match.decode(errors="replace")))

    def cut_request(self, match: bytes = b"", count: int = 1, label: str = "") -> None:
        """Cut the connection of the next ``count`` client writes that contain ``match``, unsent.

        The client sees a connection error for a command the server never received.

        Args:
            match: bytes to look for in what a client sends (b"" matches any write).
            count: how many requests to cut.
            label: the name under which cuts are counted in ``stats.drops_by_label``.
        """
        with self._lock:
            self._armed.append(_Armed(match, count, label or match.decode(errors="replace"), forward=False))

    def disarm(self) -> None:
        """Forget every pending ``drop_reply``."""
        with self._lock:
            self._armed.clear()

    def armed(self) -> int:
        """How many reply drops are still pending."""
        with self._lock:
            return sum(a.count for a in self._armed)

    def wait_for_drops(self, drops: int, timeout_s: float = 10.0) -> bool:
        """Block until ``drops + unanswered + requests_cut`` reaches ``drops``; False on timeout."""

        def done() -> bool:
            return self.stats.drops + self.stats.unanswered + self.stats.requests_cut >= drops

        with self._dropped:
            return self._dropped.wait_for(done, timeout_s)

    def cut_all(self) -> int:
        """Close every client connection now (and its server side); returns how many."""
        loop = self._loop
        if loop is None:
            return 0
        future = asyncio.run_coroutine_threadsafe(self._cut_all(), loop)
        return future.result(10)

    # -- the event loop -------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_cancellation)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            await self._cut_all(count=False)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _cut_all(self, count: bool = True) -> int:
        links = list(self._links)
        for link in links:
            self._close(link)
        if count:
            self.stats.cuts += len(links)
        return len(links)

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        for writer in (link.client, link.server):
            with contextlib.suppress(Exception):
                writer.transport.abort()

    def _take_arm(self, data: bytes) -> _Armed | None:
        with self._lock:
            for arm in self._armed:
                if arm.match in data:
                    arm.count -= 1
                    if arm.count <= 0:
                        self._armed.remove(arm)
                    return arm
        return None

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.transport.abort()
            return
        link = _Link(cwriter, swriter)
        self._links.add(link)
        await asyncio.gather(
            self._upstream(link, creader), self._downstream(link, sreader), return_exceptions=True
        )
        self._close(link)

    async def _upstream(self, link: _Link, creader: asyncio.StreamReader) -> None:
        """Client -> server; arms the link's drop when a write matches."""
        while not link.closed:
            data = await creader.read(65536)
            if not data:
                break
            if link.dropping is None and self._armed:
                arm = self._take_arm(link.tail + data)
                if arm is not None and not arm.forward:
                    self._close(link)
                    with self._dropped:
                        self.stats.requests_cut += 1
                        self._count(arm.label)
                        self._dropped.notify_all()
                    break
                if arm is not None:
                    link.dropping = arm.label
                    asyncio.get_running_loop().create_task(self._cut_after_answer(link))
            link.tail = data[-_TAIL:]
            link.server.write(data)
            await link.server.drain()
        self._close(link)

    async def _downstream(self, link: _Link, sreader: asyncio.StreamReader) -> None:
        """Server -> client; swallows everything once the link is dropping."""
        while not link.closed:
            data = await sreader.read(65536)
            if not data:
                break
            if link.dropping is not None:
                link.answered.set()
                continue
            link.client.write(data)
            await link.client.drain()
        self._close(link)

    def _count(self, label: str) -> None:
        self.stats.drops_by_label[label] = self.stats.drops_by_label.get(label, 0) + 1

    async def _cut_after_answer(self, link: _Link) -> None:
        try:
            await asyncio.wait_for(link.answered.wait(), ANSWER_TIMEOUT_MS / 1000)
            answered = True
        except TimeoutError:
            answered = False
        if answered:
            await asyncio.sleep(SETTLE_MS / 1000)
        self._close(link)
        with self._dropped:
            if answered:
                self.stats.drops += 1
                self._count(link.dropping or "")
            else:
                self.stats.unanswered += 1
            self._dropped.notify_all()


def _serve_in_child(upstream_ports: list[int], ports: list[int], control: Connection) -> None:
    proxies = [Proxy(upstream, port).start() for upstream, port in zip(upstream_ports, ports, strict=True)]
    control.send([p.port for p in proxies])
    try:
        while True:
            try:
                request = control.recv()
            except EOFError:
                return
            if request is None:
                return
            index, method, args = request
            proxy = proxies[index]
            result: Any
            result = proxy.stats if method == "stats" else getattr(proxy, method)(*args)
            control.send(result)
    finally:
        for proxy in proxies:
            proxy.stop()


class ProxyProcess:
    """``count`` proxies to one server, or one proxy per server, run in a child process,
    controlled over a pipe.

    Args:
        upstream_port: the server's port, or a list of ports: one proxy in front of each
            (the federation chaos run: one per queue manager's master).
        count: how many proxies to the one server (e.g. one for workers, one for publishers).
    """

    def __init__(self, upstream_port: int | list[int], count: int = 1) -> None:
        self.upstream_ports = (
            list(upstream_port) if isinstance(upstream_port, list) else [upstream_port] * count
        )
        self.count = len(self.upstream_ports)
        self.ports: list[int] = []
        self._process: multiprocessing.process.BaseProcess | None = None
        self._control: Connection | None = None
        self._lock = threading.Lock()

    def start(self) -> ProxyProcess:
        """Start the child and wait until every proxy listens."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve_in_child,
            args=(self.upstream_ports, [0] * self.count, child),
            name="chaos-proxy",
            daemon=True,
        )
        self._process.start()
        child.close()
        if not parent.poll(30):
            raise RuntimeError("proxy process did not start")
        self.ports = parent.recv()
        self._control = parent
        return self

    def url(self, index: int = 0, **query: str) -> str:
        """The redis URL of proxy ``index``, with optional query parameters (e.g. client_name)."""
        extra = "&".join(f"{k}={v}" for k, v in query.items())
        return f"redis://127.0.0.1:{self.ports[index]}/0" + (f"?{extra}" if extra else "")

    def call(self, index: int, method: str, *args: Any) -> Any:
        """Call ``Proxy.<method>(*args)`` on proxy ``index`` in the child; ``"stats"`` returns its stats."""
        assert self._control is not None
        with self._lock:
            self._control.send((index, method, args))
            return self._control.recv()

    def stop(self) -> None:
        """Stop the proxies and the child (killing it if it does not exit)."""
        if self._control is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._control.send(None)
            self._control.close()
            self._control = None
        if self._process is not None:
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._process = None
