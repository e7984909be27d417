"""Opening a Redis connection the way every part of the broker needs it."""

from __future__ import annotations

import inspect
import re
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster
from redis.connection import Connection, ConnectionPool, parse_url
from redis.exceptions import RedisClusterException

from broker.core import keys, wire
from broker.core.errors import (
    ClusterUnsupported,
    ConfigError,
    ConnectionLost,
    ForeignKey,
    ServerError,
)

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
            raise ForeignKey(key, wire.text(found), "hash") from exc
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


#: URL schemes of TLS connections: one server, or a Redis Cluster.
TLS_SCHEMES = ("rediss", "rediss+cluster")


def is_tls_url(url: str) -> bool:
    """Whether ``url`` makes TLS connections: ``rediss://`` or ``rediss+cluster://``."""
    return url.split("://", 1)[0].lower() in TLS_SCHEMES


def _no_key_password() -> bytes:
    raise ConfigError(
        "tls_key_file (or tls_cert_file) holds an encrypted private key; the broker needs an unencrypted one"
    )


@dataclass(frozen=True)
class TLSOptions:
    """How the broker's clients make TLS connections (``rediss://``, ``rediss+cluster://`` URLs).

    ``Settings.tls`` makes one from the ``tls_*`` settings; ``connect`` and
    ``wait_for_server`` take it (``tls=``). Frozen and made of strings, so it
    travels to worker processes, rq jobs and Spark tasks as it is.

    Attributes:
        ca_file: PEM file of the CA(s) the server's certificate must be signed by;
            "" for the system's trusted CAs.
        cert_file: PEM file of the client certificate (mutual TLS: the server's
            ``tls-auth-clients yes``); "" for none. It may hold the private key too.
        key_file: PEM file of the client certificate's private key (unencrypted);
            "" when ``cert_file`` holds it.
        verify: verify the server's certificate (and that it names the URL's host,
            as redis-py does); False only for tests.
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    verify: bool = True

    def _settings(self) -> list[tuple[str, Any]]:
        """``(setting name, value)`` of the files set, and ``tls_verify`` when it is off."""
        named = [
            ("tls_ca_file", self.ca_file),
            ("tls_cert_file", self.cert_file),
            ("tls_key_file", self.key_file),
        ]
        return [*named, ("tls_verify = false", not self.verify)]

    @property
    def configured(self) -> bool:
        """Whether any setting differs from the default (no file, verify)."""
        return bool(self.ca_file or self.cert_file or self.key_file) or not self.verify

    def problem(self) -> str | None:
        """What is wrong with the files, one sentence, or None: a file that is missing or
        not PEM, a key without a certificate, a certificate and key that do not match."""
        for name, path in self._settings()[:3]:
            if path and not Path(path).is_file():
                return f"{name} {path!r}: no such file"
        if self.key_file and not self.cert_file:
            return f"tls_key_file {self.key_file!r} is set but tls_cert_file is not: give the client certificate too"
        context = ssl.create_default_context()
        if self.ca_file:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                return f"tls_ca_file {self.ca_file!r} holds no PEM certificate: {exc}"
        if self.cert_file:
            what = f"tls_cert_file {self.cert_file!r}" + (
                f" with tls_key_file {self.key_file!r}" if self.key_file else ""
            )
            try:
                context.load_cert_chain(self.cert_file, self.key_file or None, password=_no_key_password)
            except ConfigError as exc:
                return f"{what}: {exc}"
            except (ssl.SSLError, OSError, ValueError) as exc:
                return f"{what}: not a PEM certificate and its private key, or they do not match: {exc}"
        return None

    def client_options(self, url: str) -> dict[str, Any]:
        """redis-py's keyword arguments for a client of ``url``: ``ssl_ca_certs``, ``ssl_certfile``,
        ``ssl_keyfile``, ``ssl_cert_reqs`` (none when nothing is configured).

        Raises:
            ConfigError: TLS settings with a URL that is not ``rediss://`` or
                ``rediss+cluster://``, or a ``problem`` with the files (named).
        """
        if not self.configured:
            return {}
        if not is_tls_url(url):
            given = [name for name, value in self._settings() if value]
            raise ConfigError(
                f"TLS settings ({', '.join(given)}) are given, but {redact_url(url)} is not a TLS URL: "
                "use rediss:// (or rediss+cluster://), or leave the tls_* settings unset"
            )
        problem = self.problem()
        if problem is not None:
            raise ConfigError(problem)
        return {
            "ssl_ca_certs": self.ca_file or None,
            "ssl_certfile": self.cert_file or None,
            "ssl_keyfile": self.key_file or None,
            "ssl_cert_reqs": "required" if self.verify else "none",
        }


def tls_hint(url: str, tls: TLSOptions | None, error: BaseException | str) -> str:
    """What to change when ``error``, a failed connection to ``url``, looks like a TLS problem; "" otherwise.

    redis-py reports TLS failures in OpenSSL's words (or, for a client certificate the
    server wants, as a connection closed mid-handshake); this names the setting.
    """
    text = str(error)
    lower = text.lower()
    client_cert = tls is not None and bool(tls.cert_file)
    if "certificate_verify_failed" in lower:
        if "mismatch" in lower:
            return (
                "the server's certificate does not name the host of the URL: connect by a name "
                "the certificate holds, or give the server a certificate for this host"
            )
        return (
            "the server's certificate is not signed by a CA this client trusts: set tls_ca_file "
            "(BROKER_TLS_CA_FILE) to the CA that signed it"
        )
    if not is_tls_url(url):
        if "connection reset" in lower or "connection closed" in lower:
            return "if the server listens for TLS connections on this port, use a rediss:// URL"
        return ""
    refused = "unknown ca" in lower or "bad certificate" in lower or "certificate unknown" in lower
    if refused:
        return (
            "the server refused the client certificate (tls_cert_file): it must be signed by "
            "a CA the server trusts (its tls-ca-cert-file)"
        )
    # TLS 1.3: the server checks the client's certificate after the client's handshake is
    # done, so its refusal often reaches the client as a connection closed under it.
    closed = any(
        words in lower
        for words in ("certificate required", "eof occurred", "connection reset", "connection closed")
    )
    if closed and not client_cert:
        return (
            "the server may require a client certificate (tls-auth-clients yes): set tls_cert_file "
            "and tls_key_file (BROKER_TLS_CERT_FILE, BROKER_TLS_KEY_FILE)"
        )
    if closed:
        return (
            "the server closed the TLS connection: it may not trust the client certificate "
            "(tls_cert_file), which must be signed by a CA the server trusts (its tls-ca-cert-file)"
        )
    if "wrong_version_number" in lower or "timeout connecting" in lower or "record layer" in lower:
        return "the server may not speak TLS on this port: use a redis:// URL, or the server's tls-port"
    return ""


def unreachable(url: str, tls: TLSOptions | None, error: BaseException, what: str = "Redis") -> str:
    """The message of a ``ConnectionLost``: ``cannot reach <what> at <url>: <error>``, and a TLS hint."""
    hint = tls_hint(url, tls, error)
    return f"cannot reach {what} at {redact_url(url)}: {error}" + (f" ({hint})" if hint else "")


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


def check_url_options(url: str) -> None:
    """Refuse a URL whose query string redis-py cannot use, before any client is made.

    redis-py takes any ``?name=value`` of a URL as a connection option and refuses an unknown
    one only at the first command, with a ``TypeError`` deep inside a connection; a value it
    cannot read (``?socket_timeout=abc``) it refuses at once, without naming the URL.

    Args:
        url: any URL ``connect`` takes.

    Raises:
        ConfigError: an option redis-py does not know, or a value it cannot read; the message
            names the option and the URL without its query string and password.
    """
    cluster = is_cluster_url(url)
    plain = _cluster_url(url) if cluster else url
    where = redact_url(url.split("?", 1)[0])  # the query may hold a password
    try:
        options = parse_url(plain)
    except ValueError as exc:
        raise ConfigError(f"Redis URL {where}: {exc}") from exc
    connection_class = options.pop("connection_class", Connection)
    for name in inspect.signature(RedisCluster.__init__ if cluster else ConnectionPool.__init__).parameters:
        options.pop(name, None)  # the client's or pool's own options
    try:
        connection_class(**options)  # no I/O: a connection opens its socket at its first command
    except TypeError as exc:
        found = re.search(r"unexpected keyword argument '([^']*)'", str(exc))
        name = found.group(1) if found else str(exc)
        raise ConfigError(
            f"Redis URL {where}: unknown option {name!r} in its query string (redis-py connection "
            "options only, such as socket_timeout, health_check_interval, client_name)"
        ) from exc


def connect(url: str, check: bool = False, tls: TLSOptions | None = None) -> redis.Redis:
    """A redis-py client for ``url``: bytes replies, publisher ids round-trip as bytes.

    Args:
        url: one server, ``redis://host:port/db`` (``rediss://`` for TLS,
            ``unix:///path``), or a Redis Cluster, ``redis+cluster://host:port``
            (``rediss+cluster://`` for TLS): any one node of it; the client
            discovers the others (``CLUSTER SLOTS``) and follows MOVED/ASK.
            Every key of one queue manager shares the hash tag ``{qm}``, so all
            of its keys live in one slot on one master.
        check: make one round trip now (INFO) and check the server's version.
        tls: the CA, client certificate and verification of a TLS URL
            (``Settings.tls``); None or unconfigured for redis-py's defaults
            (the system's CAs, verified, no client certificate).

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
        ConfigError: a cluster URL names a database other than 0; its query string has an
            option redis-py does not know or a value it cannot read (``check_url_options``);
            ``tls`` is configured but ``url`` is not a TLS URL, or one of its files is
            missing, not PEM, or an encrypted key (the message names it).
    """
    if "?" in url:
        check_url_options(url)
    options: dict[str, Any] = {
        "encoding_errors": "surrogateescape",
        "health_check_interval": 30,
        "socket_connect_timeout": CONNECT_TIMEOUT_MS / 1000,
    }
    if tls is not None:
        options.update(tls.client_options(url))
    client: Any
    if is_cluster_url(url):
        try:
            client = RedisCluster.from_url(_cluster_url(url), **options)
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
            raise ConnectionLost(unreachable(url, tls, exc, "the Redis Cluster")) from exc
    else:
        client = redis.Redis.from_url(url, **options)
    if check:
        try:
            if is_cluster(client):
                infos = client.info("server", target_nodes=RedisCluster.PRIMARIES)
            else:
                infos = client.info("server")
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ConnectionLost(unreachable(url, tls, exc)) from exc
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
    change_log: str | None = None,
    then: Callable[[Any], None] | None = None,
) -> Any:
    """Change one record of a hash and bump the index version, in one transaction.

    The one mechanism behind subscriptions, links, topic objects and schedules:
    WATCH ``key`` (and ``watch``), call ``decide(pipe)`` (it reads through
    ``pipe``, which executes at once until MULTI), then ``HSET key field
    <value>`` (a ``str``) or ``HDEL`` (``None``) together with ``INCR
    version_key`` (none when it is None: records the workers do not route by).
    A concurrent change to a watched key makes it start again. ``decide`` may
    raise to refuse, or return ``KEEP`` to write nothing.

    With ``change_log`` (``keys.sub_changes``), once ``decide`` chose to write, the version and
    the log are watched too and the change is logged as ``"<new version> <field>"`` in the same
    transaction (a new log, made when there is none or the version restarts at 1, starts with
    its epoch, ``"epoch <random hex>"`` scored 0), the log
    capped at ``keys.SUB_CHANGES_MAX_LEN`` entries besides its epoch: workers then apply the
    change alone to their routing table.
    A version or log that cannot be read (another type, not an integer) is not logged to, and
    the workers reload their whole table, as for any version bump the log lacks.

    ``then(pipe)``, when given, queues more commands in the same transaction, after the change
    (``subscribe``: the retained publications the new subscription receives); ``decide`` may
    watch more keys through ``pipe`` for them.

    Returns:
        What ``decide`` returned.
    """
    log_to = change_log if version_key is not None else None
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key, *watch)
                value = decide(pipe)
                if value is KEEP:
                    pipe.unwatch()
                    return value
                logged = None
                if log_to is not None and version_key is not None:
                    logged = _next_version(pipe, version_key, log_to)
                pipe.multi()
                if value is None:
                    pipe.hdel(key, field)
                else:
                    pipe.hset(key, field, value)
                if version_key is not None:
                    pipe.incr(version_key)
                if logged is not None and log_to is not None:
                    after, new_log = logged
                    if new_log:  # its epoch: a log made anew (a reset) is never taken for the old one
                        pipe.delete(log_to)
                        pipe.zadd(log_to, {f"epoch {uuid.uuid4().hex}": 0})
                    pipe.zadd(log_to, {f"{after} {field}": after})
                    pipe.zremrangebyrank(log_to, 1, -(keys.SUB_CHANGES_MAX_LEN + 1))
                if then is not None:
                    then(pipe)
                pipe.execute()
                return value
            except redis.WatchError:
                continue


def _next_version(pipe: Any, version_key: str, change_log: str) -> tuple[int, bool] | None:
    """The version the coming ``INCR`` gives (both keys watched from now on) and whether the log
    is to be made, or None when the change cannot be logged: the version is not an integer or
    either key holds another type."""
    try:
        pipe.watch(version_key, change_log)
        kind = as_bytes(pipe.type(change_log))
        if kind not in (b"none", b"zset"):
            return None
        after = int(pipe.get(version_key) or 0) + 1
        return after, kind == b"none" or after == 1  # versions restart: a new log too
    except (redis.ResponseError, ValueError):
        return None


def wait_for_server(
    url: str, timeout_ms: int, poll_ms: int = 200, tls: TLSOptions | None = None
) -> redis.Redis:
    """Connect to ``url``, waiting up to ``timeout_ms`` for the server to come up.

    Processes started together (a Procfile: the server, the workers, the
    scheduler) must not fail because the server is a moment late.

    Args:
        url: ``redis://host:port/db`` (any URL ``connect`` takes).
        timeout_ms: how long to keep trying, ms.
        poll_ms: pause between tries, ms.
        tls: TLS settings of a ``rediss://`` URL (see ``connect``).

    Returns:
        A checked client (see ``connect``).

    Raises:
        ConnectionLost: the server did not answer within ``timeout_ms``, or at
            once when the server's certificate fails verification (waiting
            does not mend a wrong tls_ca_file).
        ServerError: the server is older than Redis 7.0.
        ConfigError: as ``connect`` raises it, at once.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            return connect(url, check=True, tls=tls)
        except ConnectionLost as exc:
            if time.monotonic() >= deadline or "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise
            time.sleep(poll_ms / 1000)
