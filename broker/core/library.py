"""The Redis Functions library ``broker`` (Redis 7 / Valkey ``FUNCTION``): the consumer protocol
and the workers' unit of work.

Every consumer operation is one ``FCALL`` of it (``broker_receive``, ``broker_renew``,
``broker_ack``, ``broker_reject``, ``broker_recover``, ``broker_browse``, ``broker_version``, and
the subscribe request ``broker_request``;
docs/protocol.md is the API): a client in any language passes the subscription's key, and
may be a ``subscriber`` ACL user with ``FCALL`` and no ``EVAL``. The workers' unit of work is
``broker_commit`` (``lua/library/commit.lua``, called by ``broker.core.scripts.Scripts.commit``),
and their queue mutex ``broker_dequeue`` (``lua/library/dequeue.lua``, ``Scripts.dequeue``): functions
rather than scripts because a function's helpers are made once, when the library loads, where an
``EVALSHA`` runs its whole chunk, making every ``local function`` again, on each call
(docs/design.md, the cost of the unit of work). The other worker scripts stay ``EVALSHA``
(``broker.core.scripts``).

The library's source is assembled here from files, one copy of each: a line
``#!lua name=broker``, ``local PROTOCOL_VERSION = <keys.PROTOCOL_VERSION>``,
``lua/lib.lua`` (the helpers every script shares), then ``lua/library/subscription.lua``
(keys found from the subscription's key, arguments checked) and each function group in
``LIBRARY_FILES``.

Loading (``load_library``): the workers at start and ``broker server`` load it with
``FUNCTION LOAD REPLACE`` when the server has none, an older version, or the same version
with other code (``FUNCTION LIST LIBRARYNAME broker WITHCODE``), on every master of a Redis
Cluster (functions are per node). A newer version on the server is left alone. A consumer
whose call finds no library (``Function not found``) loads it itself when its ACL user may
(``FUNCTION LOAD``: the worker and admin roles), else raises ``LibraryMissing``
(``ensure_loaded``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from typing import Any

import redis

from broker.core import keys
from broker.core.connection import is_cluster
from broker.core.errors import LibraryMissing, script_error

#: The library's name (``FUNCTION LOAD``'s ``#!lua name=``); function names are server-global,
#: so each starts with ``broker_``.
LIBRARY = "broker"

#: The function groups, in load order, after ``lua/lib.lua`` and ``library/subscription.lua``
#: (``commit``, the workers' unit of work, and ``dequeue``, their queue mutex, each keep their names
#: in a ``do ... end`` block: Lua 5.1 allows 200 locals in the library's main chunk).
LIBRARY_FILES = ("receive", "ack", "recover", "browse", "control", "commit", "dequeue")

#: Every function of the library.
FUNCTIONS = (
    "broker_version",
    "broker_receive",
    "broker_renew",
    "broker_ack",
    "broker_reject",
    "broker_recover",
    "broker_browse",
    "broker_request",
    "broker_commit",
    "broker_dequeue",
)

#: The workers' unit of work (``lua/library/commit.lua``; ``broker.core.scripts.Scripts.commit``).
COMMIT = "broker_commit"

#: The workers' queue mutex (``lua/library/dequeue.lua``; ``broker.core.scripts.Scripts.dequeue``).
DEQUEUE = "broker_dequeue"

_VERSION_LINE = re.compile(r"^local PROTOCOL_VERSION = (\d+)$", re.M)


def _read(*parts: str) -> str:
    return resources.files("broker").joinpath("lua", *parts).read_text(encoding="utf-8")


@functools.cache
def library_source() -> str:
    """The library's source as ``FUNCTION LOAD`` takes it (see the module docstring)."""
    parts = [
        f"#!lua name={LIBRARY}",
        f"local PROTOCOL_VERSION = {keys.PROTOCOL_VERSION}",
        _read("lib.lua"),
        _read("library", "subscription.lua"),
        *(_read("library", f"{name}.lua") for name in LIBRARY_FILES),
    ]
    return "\n".join(parts)


def library_digest() -> str:
    """SHA1 of ``library_source()`` (hex): tells a loaded library's code from this one's."""
    return hashlib.sha1(library_source().encode(), usedforsecurity=False).hexdigest()


def missing(reply: Any) -> bool:
    """Whether ``reply`` (an exception, or a pipelined reply) is the server's "Function not found":
    the library is not loaded (``FUNCTION FLUSH``, a new server), or an older broker's is, without
    the function called; nothing was written."""
    return isinstance(reply, redis.ResponseError) and "function not found" in str(reply).lower()


def _nodes(client: Any) -> list[Any]:
    """The clients to load on: the server, or every master of a cluster (functions are per node)."""
    if is_cluster(client):
        return [node.redis_connection for node in client.get_primaries()]
    return [client]


def _loaded(node: Any) -> tuple[int, str] | None:
    """``(version, code)`` of the library on ``node``, or None when it has none."""
    found = node.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY, "WITHCODE")
    for entry in found or []:
        fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(entry, list) else entry
        fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        name = fields.get("library_name")
        if (name.decode() if isinstance(name, bytes) else name) != LIBRARY:
            continue
        code = fields.get("library_code") or b""
        text = code.decode("utf-8", "replace") if isinstance(code, bytes) else str(code)
        match = _VERSION_LINE.search(text)
        return (int(match[1]) if match else 0), text
    return None


def load_library(client: Any) -> int:
    """Load the library on the server (every master of a cluster) unless it is there already
    at this version and code, or newer.

    Returns:
        How many nodes it was loaded on (0: every node had it).

    Raises:
        redis.exceptions.NoPermissionError: the client's ACL user may not ``FUNCTION LIST`` /
            ``FUNCTION LOAD`` (only the worker and admin roles may).
        redis.RedisError: the server refused the code (a server older than Redis 7).
    """
    source = library_source()
    done = 0
    for node in _nodes(client):
        found = _loaded(node)
        if found is not None and (found[0] > keys.PROTOCOL_VERSION or found[1] == source):
            continue  # newer (a later broker's), or this very code
        node.execute_command("FUNCTION", "LOAD", "REPLACE", source)
        done += 1
    return done


def ensure_loaded(client: Any) -> None:
    """After a call found no library: load it if this client's ACL user may, else say who loads it.

    Raises:
        LibraryMissing: the client's ACL user may not load functions (a subscriber).
    """
    try:
        load_library(client)
    except redis.exceptions.NoPermissionError as exc:
        raise LibraryMissing(f"this user may not load it: {exc}") from exc


def fcall(client: Any, function: str, key: str, *args: Any, read_only: bool = False) -> Any:
    """One ``FCALL`` (``FCALL_RO`` with ``read_only``) of the library with the subscription's key;
    loads the library once when the server has none (``ensure_loaded``).

    Returns:
        The function's reply, as redis-py gives it (bytes inside).

    Raises:
        LibraryMissing: the library is not loaded and this client's user may not load it.
        ForeignKey: a key of the subscription holds another Redis type (nothing was written).
        ServerFull: the server is out of memory (nothing was written).
        redis.ResponseError: any other error reply of the function (a bad argument).
    """
    command = "FCALL_RO" if read_only else "FCALL"
    try:
        try:
            return client.execute_command(command, function, 1, key, *args)
        except redis.ResponseError as exc:
            if not missing(exc):
                raise
        ensure_loaded(client)
        return client.execute_command(command, function, 1, key, *args)
    except redis.ResponseError as exc:
        translated = script_error(exc, function)
        if translated is exc:
            raise
        raise translated from exc
