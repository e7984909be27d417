"""The core: what every other part of the broker stands on.

Owns the Redis key names and the protocol document (``keys``, ``protocol``), the errors
and the one translation of redis-py's, the wall clock (``clock``), the ``Settings`` model,
opening a client, the wire (``wire``: text read from Redis, publisher ids, priorities, the
reply JSON; ``models``: publication entries and envelopes), logging, the Lua script registry and its typed wrappers (``scripts``), the
publish stream's consumer group (``stream``), flow control, units of work, the embedded
server, principals, and the pure rules the settings themselves are checked with: topic
rules (``topic_rules`` for MQTT, ``hierarchy`` for SwiftMQ), the topic scheme (``schemes``)
and message selectors with SQL ``LIKE`` (``selectors``). Modules here import only each
other (without a circle), never ``broker.topics``, ``broker.clients``, ``broker.network``,
``broker.operations``, the application layer or ``worker``.
"""
