"""Many queue managers, one topic space: the channel process and the network's administration.

Owns the channel process (``channel``: the agent that announces subscriptions and keeps proxy
subscriptions and cluster topic copies, and runs the movers), the movers (``mover``:
transmission stream -> receiver's publish stream, each entry once, in order), the clients of
the other queue managers (``peers``), and ``broker network apply/show/withdraw`` with the
network status (``network_admin``). The topology itself (route classes, announce filters,
proxy subscription records) is ``broker.topics.topology``, which routing reads. Modules here
import ``broker.core``, ``broker.topics`` and each other (without a circle); never
``broker.clients``, ``broker.operations``, the application layer or ``worker``.
"""
