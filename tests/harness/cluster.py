"""The local Redis Cluster now ships in ``broker.local_cluster``; tests import it from here too."""

from broker.local_cluster import ClusterError, LocalCluster

__all__ = ["ClusterError", "LocalCluster"]
