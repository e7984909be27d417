"""The client side of the wire protocol, for a service that is not written in Python.

The rest of the protocol document (every key, the publication entry, the envelope, the
reply, dead letters, ``PROTOCOL_VERSION``) is the docstring of ``broker.core.keys``; this
part says how to keep subscription records and how to consume with the function library.

Subscriptions (``{qm}:subs``), for a service that is not written in Python
--------------------------------------------------------------------------
A subscription is one hash field: the id ``<client id>$<name>`` (each part
1-128 characters of ``A-Za-z0-9_.-``) mapped to a JSON object ``{"filter":
"<MQTT topic filter>", "durable": true|false, "created_ms": <ms>}``. Create it
and bump the version in one transaction, so that every worker sees it before
the next publication it handles. Optional fields: ``"selector"`` (a Jakarta
Messaging selector, evaluated by the workers at fan-out), ``"no_local": true``,
``"mode"`` (``"exclusive"``, the default, ``"shared"`` or ``"activestandby"``)
and ``"share"`` (an MQTT 5 ShareName, for display)::

    MULTI
    HSET {QM1}:subs app$orders '{"filter":"/ORDERS/+","durable":true,"created_ms":0}'
    INCR {QM1}:version
    EXEC

Remove it with ``lua/remove_subscription.lua`` (or ``HDEL`` of its record (and of protocol 5's
``{qm}:last_active`` field), ``INCR`` on the version and ``DEL`` of every
``{qm}:sub:<id>*`` key above but its poison stream ``{qm}:sub:<id>:poison``, in one ``MULTI``,
logged as below);
a worker that resolved a topic before the removal delivers nothing to it
(``commit.lua`` checks the record still exists), so its queue is never made again. A record the workers cannot read (not JSON,
an invalid filter, an id outside that alphabet) matches nothing, and is named
by ``broker status``, ``broker topics`` and the worker log.

A subscription change may also be logged, so that workers apply it to their routing
table alone instead of reloading every subscription: in the same transaction, with the
version the ``INCR`` returns (``WATCH`` the version and read it first, or do it in Lua),
``ZADD {qm}:sub_changes <version> "<version> <sub id>"`` and ``ZREMRANGEBYRANK
{qm}:sub_changes 1 -(SUB_CHANGES_MAX_LEN + 1)``; when the log does not exist yet or the
version restarts (the ``INCR`` gives 1), first ``DEL {qm}:sub_changes`` and
``ZADD {qm}:sub_changes 0 "epoch <unique id>"``: its epoch, the first entry, kept by the trim
(a worker applies only the entries of the log it loaded its table with, so a log made anew
after a reset is never taken for the old one). A version bump without its log entry
(links, topic objects, declared topics, the network, principals, a writer that does not
log) is always allowed: a worker that finds a version missing from the log reloads its
whole table, as it does when the log is trimmed past its version, absent or unreadable.

Consumers (receive, acknowledge, heartbeat), for a service that is not written in Python
-----------------------------------------------------------------------------------------
Every consumer operation is one ``FCALL`` of the function library ``broker``
(``broker.core.library``, the source in ``lua/library/``), with the subscription's key
``{qm}:sub:<id>`` as its one key; docs/protocol.md is the API (arguments, defaults, replies,
errors). A consumer has an id ``<c>`` (``A-Za-z0-9_.-``) and its own in-flight list::

    # receive up to 10 (also the heartbeat: the lease, 30 s here, is renewed)
    FCALL broker_receive 1 '{QM1}:sub:app$orders' c1 10 30000
    # nothing came: wait for the bell without taking it (a list moved onto itself)
    BLMOVE '{QM1}:sub:app$orders:bell' '{QM1}:sub:app$orders:bell' RIGHT RIGHT 5
    # acknowledge: the exact bytes received
    FCALL broker_ack 1 '{QM1}:sub:app$orders' c1 <envelope> ...
    # a consumer's lease passed: give its messages back (the workers do it too)
    FCALL broker_recover 1 '{QM1}:sub:app$orders'

``broker_receive`` takes the bands highest priority first, skips expired messages, gives
delivery counts, keeps an exclusive subscription's holder and
``max_consumers_per_subscription``; ``broker_recover`` puts a dead consumer's in-flight
messages back at the head of their band, in the order it took them, counts the failed
delivery, and makes a poison message of one that failed more than ``max_redeliveries``
times: the subscription's own stream ``{qm}:sub:<id>:poison`` (fields ``envelope``,
``dlq.reason``, ``dlq.entry_id``, ``dlq.subscription``), never the broker's ``{qm}:dlq``.
Keep a lease well above your processing time per batch. On a full server (``maxmemory``)
the library's functions still run (flag ``allow-oom``): consuming is how memory is freed.

Close a consumer with ``FCALL broker_recover 1 <key> "" "" "" "" <c>``: its in-flight
messages go back, it leaves the consumers zset, and the subscription's last use
``{qm}:sub:<id>:last_active`` is set. A non-durable subscription is
removed (``lua/remove_subscription.lua``, a broker role's) when its last consumer closes, or
``subscription_expiry_ms`` after the last consumer's lease deadline. A durable
one is removed by ``broker durables delete`` or the Delete Durable job
(``broker jobs``), or, with ``durable_idle_expiry_ms`` set, once no consumer has
used it for that long: its last use is the newest of its consumers' lease
deadlines, its ``last_active`` time and its ``created_ms`` (a subscription
with neither consumers nor a ``last_active`` time is first given the time the
expiry job sees it).
"""
