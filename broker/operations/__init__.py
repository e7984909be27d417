"""Operating a queue manager: what an operator sees, repairs and administers around the hot path.

Owns security (``acl``: Redis ACL users per role), the dead-letter queue, deleting durable
subscriptions, schedule records, the status snapshot and its live view (``status``,
``watch``), Prometheus metrics, trimming and resetting (``maintenance``), repairing the
publish stream (``repair``) and the web console (``console/``). The rq jobs the scheduler
runs are ``broker.jobs`` (rq records their dotted path in Redis, so that module keeps its
path). Modules here import ``broker.core``, ``broker.topics``, ``broker.clients``,
``broker.network`` and each other (without a circle); never the application layer or
``worker``.
"""
