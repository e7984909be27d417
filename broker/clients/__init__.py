"""The clients' side: publishing, consuming, and request/reply on top of both.

Owns the ``Publisher`` (one ``XADD`` per publication, waiting for its result), the
``Subscriber`` (receive, acknowledge, heartbeat, browse; recovery of dead consumers; the
subscription sweep) and the ``Requestor``/``Responder`` pair. Modules here import
``broker.core``, ``broker.topics`` and each other (without a circle); never
``broker.network``, ``broker.operations``, the application layer or ``worker``.
"""
