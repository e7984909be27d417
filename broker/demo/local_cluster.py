"""A local Redis Cluster from the embedded server binaries: three masters, no replicas.

Each master is a ``broker.core.server.Server`` (the embedded ``valkey-server``, or
``$BROKER_REDIS_SERVER_BIN``) started with ``cluster-enabled yes`` on a free
port in a temporary directory of its own; the shipped ``valkey-cli`` (or
``redis-cli``) joins them with ``--cluster create``. ``start`` returns once
every master reports ``cluster_state:ok`` and agrees on all 16384 slots.

In memory by default (the test suite); ``aof=True`` gives each master an AOF
(every second) so that ``restart`` brings a killed master back with its data
(``broker demo --federation``, the chaos harness). With ``full_coverage=False`` the
other masters keep answering for their slots while one is down.
"""

from __future__ import annotations

import subprocess
import time

import redis

from broker.core.errors import ClusterError
from broker.core.server import EPHEMERAL, Server, cli_binary, free_port

#: Directives that give a master an AOF, written every second (instead of ``EPHEMERAL``).
DURABLE = (
    "--save",
    "",
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
    "--maxmemory-policy",
    "noeviction",
)

#: Directives every master gets besides ``EPHEMERAL`` or ``DURABLE``.
CLUSTER_ARGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
)


class LocalCluster:
    """``masters`` valkey-server processes joined into one cluster on 127.0.0.1.

    Args:
        masters: how many masters (at least 3: ``--cluster create`` refuses fewer).
        aof: give each master an AOF (``DURABLE``), so that ``restart`` keeps its data.
        full_coverage: ``cluster-require-full-coverage``: with False, the masters that are up
            keep serving their slots while another is down.
    """

    def __init__(self, masters: int = 3, aof: bool = False, full_coverage: bool = True) -> None:
        # The cluster bus port defaults to the client port + 10000, which a free port above
        # 55535 cannot have: each master gets a free bus port of its own.
        base = DURABLE if aof else EPHEMERAL
        coverage = ("--cluster-require-full-coverage", "yes" if full_coverage else "no")
        self.servers = [
            Server(args=(*base, *CLUSTER_ARGS, *coverage, "--cluster-port", str(free_port())))
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<port of the first master>`` (``broker.core.connection.connect``)."""
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

    def kill(self, index: int) -> None:
        """SIGKILL master ``index`` (its AOF, if any, keeps what was written up to a second ago)."""
        self.servers[index].kill()

    def restart(self, index: int, timeout_ms: int = 20_000) -> None:
        """Start master ``index`` again on its port and directory (``nodes.conf`` and AOF kept), then
        wait until the cluster is whole again."""
        server = self.servers[index]
        if server.process is not None and server.process.poll() is None:
            server.kill()
        server.start()
        self._wait_ready(timeout_ms)

    def stop(self) -> None:
        """Stop every master and remove its directory."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
