"""The workers: the process that runs a publication's way (dequeue -> decide -> commit -> apply); its pool.

Owns one worker's loop (``loop``), its pure steps (``decide``: entries, the routing table and the
settings in, units of work out; ``turns``: which turns a round keeps, gives up and reads next),
how idle workers wait (``waiting``), delivery counting (``suspects``), the sweeps and heartbeat on
their timers (``housekeeping``), why rounds fail, told once per problem (``problems``), and the supervised pool of N processes (``pool``, which also runs
a channel's processes). ``worker`` is in the application layer: its modules import ``broker.core``,
``broker.topics`` (the routing table, declared topics, subscription removal), ``broker.clients``
(the subscription sweep), ``broker.network`` (the channel entry point, lazily, in ``pool``),
``broker.operations`` (the metrics recorder and server) and each other (without a circle); never
``broker.cli``, ``broker.demo``, ``broker.pipeline`` or ``broker.testing``, and ``broker`` imports
``worker`` only lazily, from its application layer.
"""
