"""The local Redis Cluster now ships in ``broker.demo.local_cluster``; tests import it from here too."""

from __future__ import annotations

from collections.abc import Sequence

from broker.core import keys
from broker.core.errors import ClusterError
from broker.demo.local_cluster import LocalCluster

__all__ = ["ClusterError", "LocalCluster", "spread_names"]


def spread_names(cluster: LocalCluster, roles: Sequence[str]) -> list[str]:
    """One queue manager name per role (``<role>``, else ``<role><n>``), each in a ``{qm}`` slot served
    by a master no other of them uses (at most as many roles as masters)."""
    taken: set[int] = set()
    names = []
    for role in roles:
        for n in range(10_000):
            qm = role if n == 0 else f"{role}{n}"
            owner = cluster.owner(keys.publish_stream(qm))
            if owner not in taken:
                taken.add(owner)
                names.append(qm)
                break
        else:
            raise ClusterError(f"no name for {role} on a master of its own")
    return names
