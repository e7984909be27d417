"""The topic space of a queue manager and how a publication's topic resolves to subscriber queues.

Owns the subscription records (filter, selector, no-local, mode; subscribe and unsubscribe),
links, administrative topic objects, declared topics (SwiftMQ), the network's topology as
the topic space sees it (route classes, announce filters, proxy subscription records), the
queue controllers' persistence modes per subscriber queue (``queue_controllers``), and
the workers' routing table built from all of these (``routing``). Modules here import
``broker.core`` and each other (without a circle); never ``broker.clients``,
``broker.network``, ``broker.operations``, the application layer or ``worker``.
"""
