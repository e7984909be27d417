"""The wire protocol for a service that is not written in Python: what it writes and reads.

Every key and ``PROTOCOL_VERSION`` are in the docstring of ``broker.core.keys``; this part is
the publication entry, the envelope, the reply, the flow key, dead letters, delivery
counting, schedules, and how to keep subscription records and consume with the function
library.

Publication entry (fields of one ``XADD {qm}:publish * ...``)
-------------------------------------------------------------
The entry id is ``*`` (the server's clock); a publisher never chooses one. A stream's last
id never goes back, so an id of the client's own either exhausts the stream
(``18446744073709551615-18446744073709551615``: every later ``XADD`` fails) or puts every later
entry's id, and its default ``ts``, after it (``9999999999999-0``: the year 2286). Redis cannot
refuse such an id to one client: ``broker status`` names a stream whose last id is exhausted or
more than a day ahead of the server's clock, and ``broker repair stream`` (``lua/repair_stream.lua``)
moves the pending and unread entries to a fresh stream in order, each with ``msgid`` (its old
id, when it had none) and ``ts`` (its old id's ms, when it had none and that was not in the
future) added. The workers deliver such an entry as any other: every entry after it has a
far-future id as well, so an id is no sign of the client that chose it.

Field names and text values are UTF-8; ``body`` is raw bytes.

=================  ========  ==========================================================
field              required  meaning
=================  ========  ==========================================================
``publisher``      yes       publisher id, 1-256 bytes; order is kept per publisher. An
                             entry without a valid one is dead-lettered in stream order
``topic``          yes       topic string (MQTT 5 §4.7 rules, no wildcards)
``body``           no        message body, bytes (default empty)
``msgid``          no        message id; a second entry of the same publisher with the
                             same msgid inside the dedup window is not delivered again.
                             Default: ``<stream entry id>`` (no dedup across retries).
                             Any bytes: the dedup record and the reply key use them as
                             sent; the envelope header carries a msgid that is not UTF-8
                             with each such byte as U+FFFD
``seq``            no        per-publisher sequence number (decimal, 0 to 2**63-1)
``ts``             no        publish time, ms since the epoch (default: the entry id's ms)
``persistent``     no        ``1`` or ``0`` (default ``1``)
``priority``       no        0-9 (Jakarta Messaging §3.4.10; default 4); higher is received first
``expiration``     no        absolute expiry, ms since the epoch; ``0`` = never (default)
``correlation_id`` no        carried to subscribers
``reply_to``       no        carried to subscribers
``props``          no        JSON object of user properties (string keys, scalar values)
``reply``          no        ``1``: post the result to ``{qm}:reply:<n>:<publisher>:<msgid>``;
                             ``0`` or absent: no result. Anything else is refused
``client_id``      no        the publishing client's id; a subscription made with
                             no-local by the same client id does not receive it
``type``           no        JMSType, carried to subscribers (selectors test ``JMSType``)
``delivery_time``  no        delivery delay (Jakarta Messaging 2.0 §7.9; Artemis scheduled
                             delivery): the earliest time any subscriber receives it, ms
                             since the epoch, 1-15 ASCII digits (``JMSDeliveryTime``: the
                             publish time + the delay, at most ``MAX_DELIVERY_DELAY_MS``,
                             365 days, from ``Publisher.publish``). Absent or empty: at once.
                             Anything else is refused. Publications of one publisher with
                             equal delivery times are delivered in publication order
``delayed_from``   no        set by the queue mutex only (``dequeue.lua``): the entry id of
                             the publication a delayed one was, when it left
                             ``{qm}:delayed``; an entry carrying it is not delayed again
``retain``         no        ``1``: a retained publication (IBM MQ MQPMO_RETAIN, MQTT 5
                             §3.3.1.3 RETAIN): delivered as any other, and kept in
                             ``{qm}:retained`` as its topic's last one in the same unit
                             of work; an empty body clears the topic's retained
                             publication (and is delivered, as MQTT does). A new
                             subscription receives the retained publications of the
                             topics its filter matches, flagged ``retained``.
                             ``0`` or absent: not retained. Anything else is refused
=================  ========  ==========================================================

Delivery delay: the queue mutex moves each entry with a ``delivery_time`` (even one already
due, so that equal delivery times keep their order) into ``{qm}:delayed`` and acknowledges it,
in the same atomic call; once due it is XADDed again with every field, plus ``delayed_from``,
and ``ts`` and ``msgid`` (the original entry's, when it had none), and then handled as any
entry (dedup, reply, order). The reply's and the envelope's ``entry_id`` is the new entry's.

Any other value out of its range (``persistent 2``, ``priority 10``, ``seq -1``,
a ``topic`` with a wildcard or a control character, a body over
``max_body_bytes``, a ``props`` over ``max_properties_bytes``, a ``topic`` over
``max_topic_bytes`` or ``max_topic_levels``) refuses the publication: it is
dead-lettered with the reason and, with ``reply 1``, the result says ``refused``.

Envelope (one element of a subscriber queue)
--------------------------------------------
An envelope is **bytes**, not text: the body is copied as it was published and
need not be UTF-8. Read queue elements as binary strings (in Node.js, pass
``returnBuffers``/use a Buffer reply; in Go, ``[]byte``), and acknowledge with
the exact bytes you received: ``LREM`` compares byte for byte, so an envelope
decoded to text and re-encoded is not found and stays in flight.

``<header JSON, UTF-8, one line>`` ``\\n`` ``<body bytes>``: split at the first
newline byte. The header is a JSON object with ``grouped`` (``true``, the first field, only
on a message of a group: a non-empty string ``JMSXGroupID`` in ``props``; since protocol 7, so
the consumer library tells a message of no group from the header's first bytes, ``{"v":7,``),
``v`` (protocol version),
``msgid``, ``publisher``, ``seq`` (int or null), ``topic`` (the topic it was
published on) and ``entry_id`` (stream id), and, only when they differ from their
defaults, ``ts`` (publish time, ms; absent: the entry id's milliseconds, the time
the publish stream received it), ``persistent``
(default true), ``priority`` (4), ``expiration`` (0), ``correlation_id``,
``reply_to``, ``type`` (absent = null), ``delivery_time`` (ms since the epoch, absent = 0: no
delivery delay; ``Message.delivery_time_ms``), ``msgid_hex`` (the msgid's bytes in hex,
only when they are not UTF-8: ``msgid`` then has U+FFFD for each such byte) and
``retained`` (true only on a retained publication a subscription received when it was
made; absent = false), ``client_id`` (only on a retained publication that gave one: no-local
applies to it when a subscription made later receives it) and ``props`` (absent = ``{}``), which is always the last field (the scripts read header fields before it).

Reply (``{qm}:reply:<n>:<publisher>:<msgid>``, when ``reply=1``)
----------------------------------------------------------------
Exactly one JSON object per publication, posted in the same unit of work as
its final outcome: ``status`` one of ``delivered``, ``duplicate``, ``expired``,
``refused``; ``subscriptions`` (how many queues got it); ``entry_id``;
``publisher``; ``msgid``; for ``refused``: ``reason`` and ``suggestion`` (a
corrected topic, absent when there is none); when the workers run with flow
control on (``flowcontrol_enabled``), ``flow_control_delay_ms``: how long the
publisher should wait before its next publication, ms (0: no wait). ``<n>`` is
the publisher id's length in bytes: publisher ``svc-7`` with msgid ``o-1`` waits
with ``BLPOP '{QM1}:reply:5:svc-7:o-1' 10``.

Flow control (``{qm}:pub:<publisher>:flow``), for a publisher that does not wait for results
------------------------------------------------------------------------------------------
The delay of a publication is that of its slowest subscriber queue (SwiftMQ's
delay-based flow control, seed 003): 0 while every queue it went to holds fewer
than ``flow_control_start_depth`` messages, growing linearly to
``flow_control_max_delay_ms`` at ``flow_control_full_depth``. When it is above 0,
the unit of work also sets ``{qm}:pub:<publisher>:flow`` to the delay (decimal
ms, ``PX`` the delay). A publisher reads it in the same round trip as its
``XADD`` (``GET``) and waits that long before its next publication; an absent
key means no wait. The broker never writes over a flow key of another type.

Dead letter (one entry of ``{qm}:dlq``)
---------------------------------------
The publication's own fields, then ``dlq.reason`` (one line of text) and
``dlq.entry_id`` (the publish stream entry it was, a reference that lasts until
the stream is trimmed). A field larger than ``max_body_bytes`` (the body, or a
``props`` or ``topic`` far over its own limit) is not copied: ``dlq.<field>_bytes``
(``dlq.body_bytes``, ``dlq.props_bytes``) gives its size instead. Only the first 1,000
fields of an entry are copied: ``dlq.fields`` then gives how many it had. An entry of an
ingress stream refused because its ``publisher`` is not bound to the principal also has
``dlq.principal`` (that principal). A poison message of one subscription (``broker_recover``:
more than ``max_redeliveries`` failed deliveries; ``broker_receive``: expired, with
``expired_to_dlq``; ``broker_reject``: a malformed envelope, reason ``malformed envelope: ...``)
has ``envelope``, ``dlq.reason``, ``dlq.entry_id`` and ``dlq.subscription`` instead, and is an
entry of the subscription's own poison stream ``{qm}:sub:<id>:poison``, never of ``{qm}:dlq``
(which only the broker's roles write; protocol 5 put them there).

``broker dlq`` (``broker.operations.dead_letters``) lists, shows, replays and purges dead letters (``XDEL``).
Replay re-publishes a refused publication (``lua/replay.lua``: ``XADD`` and ``XDEL`` in one
atomic call): its fields less ``dlq.*``, ``reply`` and ``principal``, with ``msgid`` set (to
``dlq.entry_id`` when it had none: its default msgid), so that a second copy is a duplicate
within ``dedup_window_ms``; to ``{qm}:in:<principal>`` when it carries ``principal`` or
``dlq.principal`` (the queue mutex checks the binding again), else to ``{qm}:publish``. It
re-queues a poison message to the head of its band of that one subscription
(``lua/requeue.lua``, with the ``XDEL``). No other key or field is written.

Delivery counting (``max_deliveries``, ``{qm}:alone``)
------------------------------------------------------
An entry's delivery count is its pending entry's ``times_delivered`` in group ``workers``:
1 when it is read, +1 each time a worker takes it over as its publisher's FIFO head
(``take_over`` in ``lua/lib.lua``: XCLAIM) from another worker, which may have died on it.
A head taken over from a worker that recorded in ``{qm}:alone`` another entry it was
handling alone is claimed without a count (XCLAIM ``JUSTID``): that worker's death is charged
to the entry it handled alone. A head a worker takes back from its own pending entries (it
lost track of them after an error, and did not die) is not counted either. The entries
behind the heads are claimed with ``JUSTID`` too. A worker handles a head delivered 3 times
or more (a suspect) alone: one entry in the round, its record written before, removed
(``HDEL``) with the round's commit; then, one a round, the next entries of that publisher a
dead worker's batch may have held (``heads``). The record of a worker that died is removed
once none of its entries is pending. A head taken over more than
``max_deliveries`` times is dead-lettered with the reason "taken over N times without being
handled: its workers died".

Schedules (``{qm}:schedules``)
------------------------------
One hash field per scheduled admin job (``broker.operations.schedules``): the schedule id
mapped to ``{"job": "delete-durable", "cron": "0 3 * * *", "params":
{"client_id": "sales", "durable_name": "%"}, "created_ms": n, "next_run_ms": n,
"rq_job": "<id>"}`` and, once it ran, ``"last_run_ms"`` and ``"last_result"``.
``cron`` is five fields (minute hour day-of-month month day-of-week), in UTC.
The rq job ``broker.jobs.run_schedule`` runs it only while the record exists
and names that rq job, then enqueues the next run and records its id; removing
the field cancels the schedule.

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
On a shared subscription, messages of a message group (a string ``JMSXGroupID`` property) go
to the group's owner only (``{qm}:sub:<id>:groups``, group -> consumer id: the consumer that
took the group's first message) until ``broker_recover`` frees the group when its owner closes
or dies (docs/protocol.md, "Message groups").
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
