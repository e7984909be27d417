"""The client side of the wire protocol, for a service that is not written in Python.

The rest of the protocol document (every key, the publication entry, the envelope, the
reply, dead letters, ``PROTOCOL_VERSION``) is the docstring of ``broker.core.keys``; this
part says how to keep subscription records and how to consume with plain commands or the
broker's Lua scripts.

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

Remove it with ``lua/remove_subscription.lua`` (or ``HDEL`` of its record and
of its ``{qm}:last_active`` field, ``INCR`` on the version and ``DEL`` of every
``{qm}:sub:<id>*`` key above, in one ``MULTI``, logged as below);
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
A consumer has an id ``<c>`` (``A-Za-z0-9_.-``) and its own in-flight list.
The Python ``Subscriber`` runs ``lua/receive.lua`` (several messages, highest
priority first, expired ones skipped, delivery counts; a band's messages are
taken with one ``LRANGE`` + ``LTRIM`` and pushed onto the in-flight list with
``LPUSH``, leaving it as the ``LMOVE`` below would), ``lua/ack.lua`` (a batch
acknowledged in one call: the envelopes as received, removed with one ``LTRIM``
when they are the oldest in flight, else each with the ``LREM`` below; the
redelivery counts of those removed are deleted; returns how many were still in
flight), ``lua/reject.lua`` (an element it took but cannot read, a malformed envelope, is
removed from its in-flight list and dead-lettered in one call, reason ``malformed envelope: ...``,
so that one bad element never stops a consumer) and ``lua/recover.lua``; another language can
run the same scripts, or these plain commands, in any mix::

    # heartbeat (and before each receive): renew the lease, deadline = now + lease ms, now
    # being the server's TIME in ms (docs/protocol.md does both in one EVAL); never a
    # deadline far in the future: that consumer's messages would never be given back
    ZADD '{QM1}:sub:app$orders:consumers' 1767000010000 c1
    # receive: the bands from priority 9 down to 0 (the default 4 is the key without :p4)
    LMOVE '{QM1}:sub:app$orders:p9' '{QM1}:sub:app$orders:inflight:c1' RIGHT LEFT
    ...
    LMOVE '{QM1}:sub:app$orders' '{QM1}:sub:app$orders:inflight:c1' RIGHT LEFT
    # nothing came: wait for the bell without taking it (a list moved onto itself)
    BLMOVE '{QM1}:sub:app$orders:bell' '{QM1}:sub:app$orders:bell' RIGHT RIGHT 5
    # acknowledge: the exact bytes received, searched from the oldest end
    LREM '{QM1}:sub:app$orders:inflight:c1' -1 <envelope>

A message's delivery count is 1 + ``HGET {qm}:sub:<id>:redelivered <entry_id>``.
Plain commands neither skip expired messages (check ``expiration`` in the
header yourself) nor respect an exclusive subscription's holder
(``{qm}:sub:<id>:active`` names it; leave the subscription to it while its
lease in the consumers zset runs). A consumer whose lease deadline passes is
dead: ``recover.lua`` (run by the workers every ``sweep_interval_ms``, by every
Python consumer's heartbeat, and when one attaches) puts its in-flight
messages back at the head of their band, in the order it took them, counts
the failed delivery, and dead-letters a message that failed more than
``max_redeliveries`` times (fields ``envelope``, ``dlq.reason``,
``dlq.entry_id``, ``dlq.subscription``). Keep a lease well above your
processing time per batch. Nor do plain commands keep
``max_consumers_per_subscription`` (``receive.lua`` refuses a consumer with no live
lease while the subscription has that many: its reply is ``{"full", <live>}``), and
on a full server (``maxmemory``) ``ZADD``, ``LMOVE`` and ``BLMOVE`` are refused with
``OOM`` while ``receive.lua`` and ``recover.lua`` still run (``#!lua flags=allow-oom``):
consuming is how memory is freed. ``LREM`` (acknowledging) is always allowed.

Close a consumer by putting its in-flight messages back (or acknowledging
them), ``ZREM`` it from the consumers zset and record when the subscription
was last used, ``HSET {qm}:last_active <sub id> <now ms>`` (``recover.lua``
does all three when passed the closing consumer). A non-durable subscription is
removed (``lua/remove_subscription.lua``) when its last consumer closes, or
``subscription_expiry_ms`` after the last consumer's lease deadline. A durable
one is removed by ``broker durables delete`` or the Delete Durable job
(``broker jobs``), or, with ``durable_idle_expiry_ms`` set, once no consumer has
used it for that long: its last use is the newest of its consumers' lease
deadlines, its ``{qm}:last_active`` time and its ``created_ms`` (a subscription
with neither consumers nor a ``last_active`` time is first given the time the
expiry job sees it).
"""
