"""Reaching the other queue managers of a network: one client per Redis URL, made when first used.

The channel's agent and movers share a ``Peers``; a server that cannot be reached raises one
of ``UNREACHABLE``, which they retry and never treat as fatal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.exceptions import RedisClusterException

from broker.core.connection import TLSOptions, connect, is_tls_url
from broker.topics.topology import Network

#: Errors that mean "that server cannot be reached now": retried, never fatal.
UNREACHABLE = (redis.RedisError, RedisClusterException, OSError)

Clock = Callable[[], int]


class Peers:
    """Clients of the network's queue managers, one per distinct Redis URL, made when first used.

    Args:
        own_url: the process's own ``redis_url`` (a node without ``url`` is there).
        own_client: the client already open on it.
        tls: the process's TLS settings (``Settings.tls``), used for every node whose
            URL is a TLS one (``rediss://``); a ``redis://`` node is reached without.
    """

    def __init__(self, own_url: str, own_client: redis.Redis, tls: TLSOptions | None = None) -> None:
        self.own_url = own_url
        self.tls = tls
        self._clients: dict[str, redis.Redis] = {own_url: own_client}
        self.network: Network | None = None

    def url(self, qm: str) -> str:
        """``qm``'s Redis URL: its node's (with this process's own credentials, since the network
        record holds none), or the process's own."""
        node = self.network.queue_managers.get(qm) if self.network else None
        if node is None or not node.url:
            return self.own_url
        return with_credentials(node.url, self.own_url)

    def client(self, qm: str) -> redis.Redis:
        """The client of ``qm``'s Redis (connected lazily; ``drop`` it after an error)."""
        url = self.url(qm)
        found = self._clients.get(url)
        if found is None:
            found = self._clients[url] = connect(url, tls=self.tls if is_tls_url(url) else None)
        return found

    def drop(self, qm: str) -> None:
        """Forget ``qm``'s client (not the process's own): the next use connects again."""
        url = self.url(qm)
        if url != self.own_url:
            client = self._clients.pop(url, None)
            if client is not None:
                with contextlib.suppress(*UNREACHABLE):
                    client.close()


def with_credentials(url: str, own_url: str) -> str:
    """``url`` with the user and password of ``own_url`` when it has none of its own."""
    parts, own = urlsplit(url), urlsplit(own_url)
    if parts.username or parts.password or not (own.username or own.password):
        return url
    auth = own.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{parts.netloc}"))
