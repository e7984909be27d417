"""Opening a Redis connection the way every part of the broker needs it."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, SlotNotCoveredError

from broker.errors import ClusterUnsupported, ConfigError, ConnectionLost, ForeignKey, ServerError

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
    becomes ``ServerError``. On a cluster client, a slot no master serves (a
    cluster partly down: redis-py's ``SlotNotCoveredError``) becomes
    ``ConnectionLost``, any other of redis-py's cluster errors (keys of several
    slots in one transaction) ``ServerError``. The broker's own errors pass through.
    """

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, SlotNotCoveredError) as exc:
            raise ConnectionLost(f"cannot reach Redis: {exc}") from exc
        except (redis.RedisError, RedisClusterException) as exc:
            raise ServerError(f"Redis answered with an error: {exc}") from exc

    return wrapper


def as_bytes(reply: bytes | str) -> bytes:
    """A reply of a client made by ``connect`` (``decode_responses=False``) as bytes.

    redis-py types replies as ``bytes | str`` because a client may decode them;
    the broker's never do, so this only narrows the type (and encodes a str).
    """
    return reply if isinstance(reply, bytes) else reply.encode("utf-8", "surrogateescape")


def can_name(text: str) -> bool:
    """Whether ``text`` can be sent to Redis by a client made by ``connect`` (it encodes with
    ``surrogateescape``): a string with another lone surrogate (``"\\ud800"``) names no key or field."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


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


#: URL schemes that name a Redis Cluster (any one node of it) rather than one server.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster: ``redis+cluster://`` or ``rediss+cluster://`` (TLS)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a redis-py ``RedisCluster`` (``connect`` of a cluster URL)."""
    return isinstance(client, RedisCluster)


def require_single_server(client: Any, operation: str, why: str) -> None:
    """Refuse ``operation`` on a cluster client: it needs one Redis server.

    Raises:
        ClusterUnsupported: ``client`` is a ``RedisCluster``; the message says ``why``.
    """
    if is_cluster(client):
        raise ClusterUnsupported(operation, why)


def _cluster_url(url: str) -> str:
    """The ``redis://`` (or ``rediss://``) URL that redis-py's ``RedisCluster.from_url`` takes for ``url``.

    Raises:
        ConfigError: ``url`` names a database other than 0 (a cluster has only database 0).
    """
    scheme, rest = url.split("://", 1)
    plain = f"{CLUSTER_SCHEMES[scheme.lower()]}://{rest}"
    parts = urlsplit(plain)
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError(f"{redact_url(url)}: a Redis Cluster has only database 0")
    return plain


def connect(url: str, check: bool = False) -> redis.Redis:
    """A redis-py client for ``url``: bytes replies, publisher ids round-trip as bytes.

    Args:
        url: one server, ``redis://host:port/db`` (``rediss://`` for TLS,
            ``unix:///path``), or a Redis Cluster, ``redis+cluster://host:port``
            (``rediss+cluster://`` for TLS): any one node of it; the client
            discovers the others (``CLUSTER SLOTS``) and follows MOVED/ASK.
            Every key of one queue manager shares the hash tag ``{qm}``, so all
            of its keys live in one slot on one master.

    Returns:
        The client (``decode_responses=False``, ``encoding_errors="surrogateescape"``):
        a ``redis.Redis``, or for a cluster URL a ``redis.cluster.RedisCluster``
        (typed as ``redis.Redis``: it answers the same commands; ``is_cluster``
        tells them apart).

    Raises:
        ConnectionLost: ``check`` and the server cannot be reached; for a cluster
            URL, also when no node of the cluster can be reached at all (the
            cluster client connects at once to learn the slot map).
        ServerError: ``check`` and the server (every master of a cluster) is
            older than Redis 7.0.
        ConfigError: a cluster URL names a database other than 0.
    """
    options: dict[str, Any] = {
        "encoding_errors": "surrogateescape",
        "health_check_interval": 30,
        "socket_connect_timeout": CONNECT_TIMEOUT_MS / 1000,
    }
    client: Any
    if is_cluster_url(url):
        try:
            client = RedisCluster.from_url(_cluster_url(url), **options)
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
            raise ConnectionLost(f"cannot reach the Redis Cluster at {redact_url(url)}: {exc}") from exc
    else:
        client = redis.Redis.from_url(url, **options)
    if check:
        try:
            if is_cluster(client):
                infos = client.info("server", target_nodes=RedisCluster.PRIMARIES)
            else:
                infos = client.info("server")
        except redis.ConnectionError as exc:
            raise ConnectionLost(f"cannot reach Redis at {redact_url(url)}: {exc}") from exc
        # A cluster client answers with one INFO per master ({node name: info}).
        for info in infos.values() if is_cluster(client) else [infos]:
            version = tuple(int(x) for x in str(info["redis_version"]).split(".")[:2])
            if version < MIN_SERVER_VERSION:
                raise ServerError(
                    f"Redis {info['redis_version']} at {redact_url(url)} is too old; the broker needs >= 7.0"
                )
    return cast(redis.Redis, client)


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
