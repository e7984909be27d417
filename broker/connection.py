"""Opening a Redis connection the way every part of the broker needs it."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis

from broker.errors import ConnectionLost, ForeignKey, ServerError

#: Oldest server the broker supports (XAUTOCLAIM, LMOVE, SET ... GET, Lua 5.1 + cjson).
MIN_SERVER_VERSION = (7, 0)

#: How long to wait for a TCP connection to the server, ms.
CONNECT_TIMEOUT_MS = 5_000

#: Longest single blocking call (BLPOP, BLMOVE, XREAD BLOCK), ms: well under redis-py's
#: default socket timeout (5 s since redis-py 6), which would otherwise end a longer wait
#: with "Timeout reading from socket". Longer waits are made of several calls.
BLOCK_SLICE_MS = 2_000


def block_slice_ms(client: Any) -> int:
    """The longest single blocking call on ``client``, ms: ``BLOCK_SLICE_MS``, or less when the
    client's own socket timeout is shorter (half of it, at least 10 ms)."""
    timeout = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}).get("socket_timeout")
    if not timeout:
        return BLOCK_SLICE_MS
    return max(10, min(BLOCK_SLICE_MS, int(float(timeout) * 500)))


_P = ParamSpec("_P")
_R = TypeVar("_R")


def translate_errors(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a public entry point so that callers never see redis-py's exceptions.

    ``redis.ConnectionError`` and ``redis.TimeoutError`` become ``ConnectionLost``;
    any other ``redis.RedisError`` (an error reply: out of memory, a wrong type)
    becomes ``ServerError``. The broker's own errors pass through.
    """

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ConnectionLost(f"cannot reach Redis: {exc}") from exc
        except redis.RedisError as exc:
            raise ServerError(f"Redis answered with an error: {exc}") from exc

    return wrapper


def as_bytes(reply: bytes | str) -> bytes:
    """A reply of a client made by ``connect`` (``decode_responses=False``) as bytes.

    redis-py types replies as ``bytes | str`` because a client may decode them;
    the broker's never do, so this only narrows the type (and encodes a str).
    """
    return reply if isinstance(reply, bytes) else reply.encode("utf-8", "surrogateescape")


def read_hash(client: redis.Redis, key: str) -> dict[Any, Any]:
    """``HGETALL key``, naming a key of another Redis type instead of a bare WRONGTYPE.

    Raises:
        ForeignKey: ``key`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    try:
        return dict(client.hgetall(key))
    except redis.ResponseError as exc:
        if "WRONGTYPE" in str(exc):
            found = client.type(key)
            raise ForeignKey(key, found.decode() if isinstance(found, bytes) else str(found), "hash") from exc
        raise


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs, banners and error messages.

    ``redis://user:secret@host:6380/0`` -> ``redis://user:***@host:6380/0``; a URL
    without a password (or one that cannot be parsed) is returned as it is.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def connect(url: str, check: bool = False) -> redis.Redis:
    """A redis-py client for ``url``: bytes replies, publisher ids round-trip as bytes.

    Args:
        url: ``redis://host:port/db``.
        check: PING the server and check its version now.

    Returns:
        The client (``decode_responses=False``, ``encoding_errors="surrogateescape"``).

    Raises:
        ConnectionLost: ``check`` and the server cannot be reached.
        ServerError: ``check`` and the server is older than Redis 7.0.
    """
    client = redis.Redis.from_url(
        url,
        encoding_errors="surrogateescape",
        health_check_interval=30,
        socket_connect_timeout=CONNECT_TIMEOUT_MS / 1000,
    )
    if check:
        try:
            info = client.info("server")
        except redis.ConnectionError as exc:
            raise ConnectionLost(f"cannot reach Redis at {redact_url(url)}: {exc}") from exc
        version = tuple(int(x) for x in str(info["redis_version"]).split(".")[:2])
        if version < MIN_SERVER_VERSION:
            raise ServerError(
                f"Redis {info['redis_version']} at {redact_url(url)} is too old; the broker needs >= 7.0"
            )
    return client


#: What a ``change_field`` decision returns to leave the record as it is (nothing written).
KEEP: Any = object()


def change_field(
    client: redis.Redis,
    key: str,
    field: str,
    decide: Callable[[Any], Any],
    version_key: str | None,
    watch: tuple[str, ...] = (),
) -> Any:
    """Change one record of a hash and bump the index version, in one transaction.

    The one mechanism behind subscriptions, links, topic objects and schedules:
    WATCH ``key`` (and ``watch``), call ``decide(pipe)`` (it reads through
    ``pipe``, which executes at once until MULTI), then ``HSET key field
    <value>`` (a ``str``) or ``HDEL`` (``None``) together with ``INCR
    version_key`` (none when it is None: records the workers do not route by).
    A concurrent change to a watched key makes it start again. ``decide`` may
    raise to refuse, or return ``KEEP`` to write nothing.

    Returns:
        What ``decide`` returned.
    """
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key, *watch)
                value = decide(pipe)
                if value is KEEP:
                    pipe.unwatch()
                    return value
                pipe.multi()
                if value is None:
                    pipe.hdel(key, field)
                else:
                    pipe.hset(key, field, value)
                if version_key is not None:
                    pipe.incr(version_key)
                pipe.execute()
                return value
            except redis.WatchError:
                continue


def wait_for_server(url: str, timeout_ms: int, poll_ms: int = 200) -> redis.Redis:
    """Connect to ``url``, waiting up to ``timeout_ms`` for the server to come up.

    Processes started together (a Procfile: the server, the workers, the
    scheduler) must not fail because the server is a moment late.

    Args:
        url: ``redis://host:port/db``.
        timeout_ms: how long to keep trying, ms.
        poll_ms: pause between tries, ms.

    Returns:
        A checked client (see ``connect``).

    Raises:
        ConnectionLost: the server did not answer within ``timeout_ms``.
        ServerError: the server is older than Redis 7.0.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            return connect(url, check=True)
        except ConnectionLost:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_ms / 1000)
