"""A throwaway local Redis Cluster for tests: three masters, no replicas, in memory.

Each master is a ``broker.server.Server`` (the embedded ``valkey-server``, or
``$BROKER_REDIS_SERVER_BIN``) started with ``cluster-enabled yes`` on a free
port in a temporary directory of its own; the shipped ``valkey-cli`` (or
``redis-cli``) joins them with ``--cluster create``. ``start`` returns once
every master reports ``cluster_state:ok`` and agrees on all 16384 slots.
"""

from __future__ import annotations

import subprocess
import time

import redis

from broker.server import EPHEMERAL, Server, cli_binary, free_port

#: Directives every master gets besides ``EPHEMERAL`` (in memory, no AOF).
CLUSTER_ARGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
    "--cluster-require-full-coverage",
    "yes",
)


class ClusterError(RuntimeError):
    """The local cluster could not be created or did not become ready in time."""


class LocalCluster:
    """``masters`` valkey-server processes joined into one cluster on 127.0.0.1.

    Args:
        masters: how many masters (at least 3: ``--cluster create`` refuses fewer).
    """

    def __init__(self, masters: int = 3) -> None:
        # The cluster bus port defaults to the client port + 10000, which a free port above
        # 55535 cannot have: each master gets a free bus port of its own.
        self.servers = [
            Server(args=(*EPHEMERAL, *CLUSTER_ARGS, "--cluster-port", str(free_port())))
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<port of the first master>`` (``broker.connection.connect``)."""
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def start(self, timeout_ms: int = 20_000) -> LocalCluster:
        """Start every master, create the cluster, wait until it is ready.

        Args:
            timeout_ms: how long to wait for ``cluster_state:ok`` on every master, ms.

        Returns:
            self.

        Raises:
            ClusterError: ``--cluster create`` failed, or the cluster was not ready in time
                (everything started is stopped first).
            ServerNotFound: a server binary is missing or exited at once.
        """
        try:
            for server in self.servers:
                server.start()
            addresses = [f"127.0.0.1:{port}" for port in self.ports]
            done = subprocess.run(
                [cli_binary(), "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=timeout_ms / 1000,
                check=False,
            )
            if done.returncode != 0:
                raise ClusterError(f"--cluster create failed ({done.returncode}): {done.stdout}{done.stderr}")
            self._wait_ready(timeout_ms)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_ms: int, poll_ms: int = 50) -> None:
        """Poll every master until it says ``cluster_state:ok`` and knows every slot's owner."""
        deadline = time.monotonic() + timeout_ms / 1000
        clients = [redis.Redis(port=port, socket_connect_timeout=1, socket_timeout=2) for port in self.ports]
        try:
            while True:
                states = [client.cluster("INFO") for client in clients]
                if all(
                    s.get("cluster_state") == "ok"
                    and int(s.get("cluster_slots_ok", 0)) == 16384
                    and int(s.get("cluster_known_nodes", 0)) == len(clients)
                    for s in states
                ):
                    return
                if time.monotonic() >= deadline:
                    raise ClusterError(f"cluster not ready after {timeout_ms} ms: {states}")
                time.sleep(poll_ms / 1000)
        finally:
            for client in clients:
                client.close()

    def owner(self, key: str) -> int:
        """The port of the master serving ``key``'s slot (``CLUSTER KEYSLOT``, ``CLUSTER SHARDS``)."""
        client = redis.Redis(port=self.ports[0])
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, *nodes in client.execute_command("CLUSTER SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(nodes[0][1])
        finally:
            client.close()
        raise ClusterError(f"no master serves slot {slot}")

    def stop(self) -> None:
        """Stop every master and remove its directory."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
