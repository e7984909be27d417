"""Every Redis key the broker uses, and the wire protocol around them.

This docstring is the protocol document. A service in any language can publish
with one ``XADD`` and consume with ``BLMOVE``/``LMOVE`` by following it.

PROTOCOL_VERSION = 7 (7: the envelope header of a message of a group (a non-empty string
``JMSXGroupID`` property) starts with the field ``"grouped":true``, so ``broker_receive`` tells a
message of no group by its first bytes; envelopes of 6 or less are searched for the property as
before. 6: consumers call the Redis Functions library ``broker`` (one ``FCALL``
per operation with the subscription's key, ``broker.core.library``; docs/protocol.md), and a
subscription's expired count, last use and poison messages are its own keys
``{qm}:sub:<id>:expired``, ``:last_active`` and ``:poison`` (no longer ``{qm}:expired``,
``{qm}:last_active`` and ``{qm}:dlq``, which only broker roles write). 5: smaller envelopes: the header no longer carries ``size`` (the body
is what follows the first newline), and ``ts`` only when it differs from the entry id's
milliseconds (absent: that time). 4: authenticated ingress: a publisher whose ACL user is a principal
XADDs to its own ingress stream ``{qm}:in:<principal>``; the queue mutex moves the entries into
the publish stream with the field ``principal``, which envelopes carry; forwarded publications
may carry ``origin`` and ``route``. 3: consumers: a list per priority band, a bell, one in-flight
list per consumer with a lease in a consumers zset, a holder key for exclusive and
active-standby subscriptions, redelivery counts; subscription records may carry a
selector, no-local, a consumer mode and an MQTT ShareName; publications may carry
``client_id`` and ``type``. 2: dedup and reply keys carry the publisher id's byte
length, so that ids containing ``:`` cannot collide; dead letters of oversized
bodies keep no copy)

All keys of one queue manager ``<qm>`` start with the hash tag ``{<qm>}`` so that
every MULTI/EXEC and every Lua call touches one Redis Cluster slot.

Keys
----
==================================  ========  ============================================  =======================  ==========================
key                                 type      contents                                      written by               read by
==================================  ========  ============================================  =======================  ==========================
``{qm}:publish``                    stream    publication requests (fields below)           publishers (XADD)        workers, group ``workers``
``{qm}:publish:repair``             stream    the fresh stream ``broker repair stream``     repair_stream.lua        (renamed to
                                              builds, within its one atomic call                                     ``{qm}:publish``)
``{qm}:version``                    string    integer, +1 on every subscription/link change admin, subscriptions     workers (in dequeue.lua)
``{qm}:subs``                       hash      sub id -> subscription JSON                   subscriptions            workers, admin
``{qm}:sub_changes``                zset      ``"<version> <sub id>"`` scored by the        subscriptions (with the  workers (incremental
                                              version its change bumped to; the newest      version bump)            routing-table refresh)
                                              ``SUB_CHANGES_MAX_LEN``, after the log's
                                              epoch ``"epoch <id>"`` scored 0
``{qm}:links``                      hash      source topic -> JSON ``{target: backward}``   admin                    workers, admin
``{qm}:client_copies``              hash      client id -> ``subscriber``: one copy of a    ``broker copies``        workers (routing table),
                                              publication per subscriber (seed 000), not                             ``broker topics`` explain
                                              per subscription (``broker.topics.copies``)                            ``broker status``
``{qm}:sub:<sub id>``               list      envelopes of priority 4 (the default); LPUSH  workers (commit.lua)     consumers (receive.lua)
                                              by workers, taken from the RIGHT (oldest)
``{qm}:sub:<sub id>:p<N>``          list      envelopes of priority N (0-3, 5-9), the same  workers (commit.lua)     consumers (receive.lua)
``{qm}:sub:<sub id>:bell``          list      one element while messages may wait            workers, receive.lua     blocked consumers (BLMOVE)
``{qm}:sub:<sub id>:consumers``     zset      consumer id -> lease deadline, ms              consumers (receive.lua)  recover.lua, sweeps
``{qm}:sub:<sub id>:inflight:<c>``  list      envelopes consumer <c> took, not acknowledged  receive.lua (LMOVE)      consumer <c> (LREM), recover.lua
``{qm}:sub:<sub id>:active``        string    consumer holding an exclusive or               receive.lua              receive.lua, recover.lua
                                              active-standby subscription
``{qm}:sub:<sub id>:redelivered``   hash      entry id -> deliveries that failed             broker_recover           broker_receive (delivery count)
``{qm}:sub:<sub id>:expired``       string    integer: messages that expired while waiting  broker_receive           ``broker status``, metrics
``{qm}:sub:<sub id>:last_active``   string    ms: when its last consumer closed, or the     broker_recover (on close idle durable expiry
                                              newest lease deadline of consumers forgotten  and when it forgets      (``broker.operations.durables``),
                                                                                            dead consumers), the     ``broker durables``
                                                                                            expiry job (SET NX)
``{qm}:sub:<sub id>:groups``        hash      message groups of a shared subscription:      broker_receive (owns a   broker_receive (takes
                                              JMSXGroupID -> the consumer id that owns it   group it takes),         only its own groups'),
                                                                                            broker_recover (frees    broker_recover
                                                                                            a dead or closing
                                                                                            consumer's groups),
                                                                                            remove_subscription
                                                                                            (deletes it)
``{qm}:sub:<sub id>:poison``        stream    its poison messages: ``envelope``,            broker_receive (expired, ``broker dlq`` (list,
                                              ``dlq.reason``, ``dlq.entry_id``,             ``expired_to_dlq``),     replay to this
                                              ``dlq.subscription``; capped at about         broker_recover (too      subscription only, purge)
                                              ``dead_letter_max_len``                       many redeliveries),
                                                                                            broker_reject (malformed)
``{qm}:expired``                    hash      protocol 5's expired counts (sub id -> count), none                     ``broker status`` (added to
                                              read, never written                                                    the subscription's own)
``{qm}:topics``                     hash      topic object name -> JSON (topic string,       ``broker topic``         workers, subscribe
                                              attributes; ``broker.topics.topic_objects``)
``{qm}:manager``                    hash      ``topic_scheme`` -> ``mqtt`` or ``swiftmq``   first worker/subscribe   workers, subscribe
``{qm}:declared``                   hash      declared topic -> JSON ``{"declared_ms": n}`` ``broker topic declare`` workers (indirect
                                                                                                                 selection), operators
``{qm}:skipped``                    hash      sub id -> deliveries skipped: queue full       commit.lua               ``broker status``
                                              (MAXDEPTH) or slow subscriber
``{qm}:slow``                       hash      sub id -> deliveries withheld by a slow-       commit.lua               ``broker status``
                                              subscriber condition (also in ``skipped``)
``{qm}:retained``                   hash      topic string -> the envelope of its last       commit.lua (HSET, HDEL   subscribe (the new
                                              retained publication (``retain 1``; an empty   with an empty body),     subscription's queue),
                                              body clears it; ``broker.topics.retained``)    ``broker retained clear`` ``broker retained``
``{qm}:pub:<publisher>:fifo``       list      stream entry ids of one publisher, in order   dequeue.lua (RPUSH)      commit.lua (LPOP head)
``{qm}:pub:<publisher>:turn``      string    token of the worker holding the turn, PX lease dequeue.lua (SET NX)    commit.lua (fencing)
``{qm}:pub:<publisher>:flow``       string    flow-control delay asked of the publisher,    commit.lua (only when    publishers (GET with
                                              ms; PX the same delay (absent: no delay)      the delay is > 0)        their XADD)
``{qm}:publishers``                 set       publisher ids whose FIFO is not empty         dequeue.lua (SADD)       sweep_turns.lua (orphan sweep)
``{qm}:dedup:<n>:<publisher>:<msgid>`` string stream entry id that delivered it, PX window commit.lua             commit.lua
``{qm}:reply:<n>:<publisher>:<msgid>`` list   one result JSON, PX reply TTL                 commit.lua, dequeue.lua  the waiting publisher
``{qm}:dlq``                        stream    dead-lettered entries (below), capped at      workers (Lua)            operators (``broker dlq``:
                                              about ``dead_letter_max_len`` records                                  list, replay, purge)
``{qm}:workers``                    hash      worker name -> JSON heartbeat                 workers                  ``broker status``
``{qm}:alive``                      zset      worker name, score = last heartbeat (ms)      workers                  dequeue.lua (fair share)
``{qm}:saturated``                  hash      worker name -> ms of its last dequeue that     workers (dequeue.lua)    dequeue.lua (spare
                                              found it holding a saturated publisher                                 workers)
``{qm}:alone``                      hash      worker name -> the entry id it handles alone  workers (only in rounds  take_over (lib.lua: a
                                              this round (a suspect, see "Delivery          that handle a suspect    death is charged to that
                                              counting" below)                              alone); HDEL after them  entry only)
``{qm}:waiter``                     string    the worker waiting on the publish stream      idle workers (SET NX PX  idle workers (one waits
                                              (XREAD), PX its lease (``worker.waiting``)    lease), DEL on hand-on   on the stream at a time)
``{qm}:delayed``                    zset      publications waiting for their delivery time  workers (dequeue.lua)    dequeue.lua (when due),
                                              (``delivery_time``): member ``<original                                ``broker status``
                                              entry id, ms and seq zero-padded to 20
                                              digits each>`` + the MessagePack array of its
                                              fields, scored by the delivery time (ms)
``{qm}:wake``                       list      at most one element: publishers given up,     workers (LPUSH + LTRIM)  idle workers not waiting
                                              a JSON list of publisher ids: wake one                                   on the stream (BLPOP);
                                              idle worker to dequeue                                                   dequeue.lua (LPOP) when
                                                                                                                       nobody waited
``{qm}:journal``                    stream    one record per publication handled (when the  commit.lua (capped)      ``broker journal export``
                                              ``journal`` setting is on): entry_id, msgid,
                                              publisher, seq, topic, subs (JSON list of
                                              subscription ids), enq_ms, dlv_ms, status
``{qm}:usage``                      stream    usage snapshots (field ``snapshot``: JSON)    rq job usage_snapshot    operators
``{qm}:topic_stats:publications``   hash      topic string -> publications delivered (the   workers (housekeeping    ``broker topic status``,
                                              ``""`` field: every topic past the bound)     flush, HINCRBY)          ``topic stats``, metrics
``{qm}:topic_stats:copies``         hash      topic string -> copies put on subscriber      workers (housekeeping    the same
                                              queues (``""``: past the bound)               flush, HINCRBY)
``{qm}:topic_stats:last``           zset      topic string scored by its last publication,  workers (housekeeping    the same
                                              ms (``""``: past the bound)                   flush, ZADD GT)
``{qm}:last_active``                hash      protocol 5's last use (sub id -> ms), read,   none (its field is       idle durable expiry (the
                                              never written                                 removed with the         newer of it and the
                                                                                            subscription)            subscription's own)
``{qm}:schedules``                  hash      schedule id -> JSON (job, cron, parameters,   ``broker jobs``, each    rq job run_schedule,
                                              next run, the rq job id that runs it)         run of the schedule      ``broker jobs list``
``{qm}:network``                    string    the network's topology, JSON (``broker.       ``broker network apply`` workers (routing table),
                                              network.Network``)                                                     channel process
``{qm}:announced``                  string    what this queue manager announces, JSON       channel process (agent)  the other queue managers'
                                              ``{"state", "keys": {key: since ms}}``                                 channel processes
``{qm}:proxies``                    hash      ``<qm> <dynamic|static> <key>`` -> JSON: the  channel process (agent)  workers (``forwards``),
                                              proxy subscriptions held here for <qm>                                 ``broker proxies``
``{qm}:cluster_topics``             hash      topic string -> JSON ``{cluster, clroute,     channel process (agent)  workers (route class)
                                              hosts}``: the network's cluster topic objects
``{qm}:network_seen``               hash      qm -> ms it first announced                   channel process (agent)  channel process (statics)
``{qm}:proxies_removed``            hash      ``<qm>`` (or ``<qm> <topic key>``: one key)   ``broker proxies         channel process (agent:
                                              -> the announcement ``seq`` its dynamic       remove``, a slow remote  none again until a newer
                                              proxy subscriptions were removed at           route's disconnect; the  ``seq``)
                                                                                            agent deletes it
``{qm}:withheld``                   hash      ``<to qm>`` -> JSON ``{roots: {root topic:    channel process          workers (``forwards``),
                                              persistence mode}, backlog, since_ms}``: the  (``slow_routes``)        ``status --network``
                                              root topics a remote slow-subscriber
                                              condition withholds from that channel
``{qm}:xmit:<to qm>``               stream    transmission stream of the channel to <to>:   commit.lua (XADD, in     channel mover
                                              field ``e`` = the envelope; id = channel seq  the unit of work)
``{qm}:channel:<to qm>``            hash      the channel's state: moved, last, state,      channel mover            ``status --network``
                                              in_flight, backoff_ms, last_error
``{qm}:channel:<to qm>:mover``      string    the mover's lease token, PX 3 s               channel mover            channel mover
``{qm}:received``                   hash      ``<from qm>`` -> last channel seq filed,      channel_in.lua           channel mover, status
                                              ``<from qm>:count`` -> entries filed
``{qm}:agents``                     hash      channel process name -> JSON heartbeat        channel process          ``status --network``
``{qm}:in:<principal>``             stream    a principal's publication requests (the       its publisher (XADD;     dequeue.lua (moves them
                                              publish stream's fields)                      its ACL allows no other) into the publish stream)
``{qm}:principals``                 hash      principal -> publisher ids bound to it, one   ``broker acl add``       dequeue.lua, workers
                                              per line
``{qm}:acl``                        hash      user -> JSON role and bindings (no password)  ``broker acl``           ``broker acl list/file``
``{qm}:grants``                     hash      user -> JSON publish / subscribe grants       ``broker acl grant``     workers (publish
                                              (topic filters, topic object names)           (admin)                  grants), control requests
``{qm}:ctl:<client id>``            stream    subscribe / unsubscribe requests of one       its subscriber user      workers (housekeeping;
                                              client id (``op``, ``name``, ``topic``...)    (XADD)                   XDEL once answered)
``{qm}:ctl:<client id>:reply:<r>``  list      the answer to request ``<r>``: JSON ``ok``,   workers (RPUSH, PX)      its subscriber (BLPOP)
                                              ``subscription`` or ``error``
``{qm}:ctl_lock``                   string    the worker answering control requests, PX     workers (SET NX)         workers
``{qm}:trim_lock``                  string    the worker trimming the publish stream, PX    workers (SET NX)         workers
==================================  ========  ============================================  =======================  ==========================

Keys whose names are built inside Lua from data the script reads are built
from a prefix passed in ARGV, never from a prefix written in Lua:

- the per-publisher keys: ``pub_prefix(qm)`` = ``{qm}:pub:``, followed by
  ``<publisher>:fifo``, ``<publisher>:turn`` or ``<publisher>:flow`` (Python
  twins: ``fifo_key``, ``turn_key``, ``flow_key``). These are injective: the
  suffix is fixed.
- the message-id keys: ``dedup_prefix(qm)`` = ``{qm}:dedup:`` and
  ``reply_prefix(qm)`` = ``{qm}:reply:``, followed by ``<n>:<publisher>:<msgid>``
  where ``<n>`` is the publisher id's length in bytes, in decimal (``id_key``
  in ``lua/lib.lua``; Python twins: ``dedup``, ``reply``). The length makes the
  name injective: publisher ``a`` with msgid ``b:c`` is ``{qm}:reply:1:a:b:c``,
  publisher ``a:b`` with msgid ``c`` is ``{qm}:reply:3:a:b:c``.

- the priority bands of a watched queue (``commit.lua``: MAXDEPTH, slow-subscriber
  conditions): ``sub_prefix(qm)`` followed by ``<sub id>`` and, for priorities other
  than 4, ``:p<N>``; and a subscription's bell: ``<sub id>:bell``. The subscription id
  of a queue key is the key without the prefix and without a ``:p<N>`` suffix
  (Python twin: ``band_sub_id``).

- the ingress streams (``dequeue.lua``): ``ingress_prefix(qm)`` = ``{qm}:in:`` followed by
  a principal name from ``{qm}:principals`` (Python twin: ``ingress``); principal names
  hold no ``:`` (``broker.core.principals``).

Tests check that the Lua and Python builders give the same strings.

Topic schemes and declared topics (``{qm}:manager``, ``{qm}:declared``)
-----------------------------------------------------------------------
``HGET {qm}:manager topic_scheme`` says how every topic string and subscription
filter of the queue manager is read: ``mqtt`` (absent means ``mqtt``: ``/`` levels,
``+``/``#``) or ``swiftmq`` (``.`` nodes, SQL-LIKE ``%``/``_`` predicate nodes after
the root with ``\\`` as escape; a subscription to a node also receives its parents'
and sub-nodes' publications: ``broker.core.hierarchy``). ``direct_subscriber_selection``
``false`` makes a swiftmq publication's topic a predicate over the fields of
``{qm}:declared``. The first worker writes both (HSETNX); change them only on an
empty queue manager. Declare a topic as a subscription is made:
``MULTI; HSET {qm}:declared <topic> '{"declared_ms":0,"source":"cli"}'; INCR {qm}:version; EXEC``.

Publishing with security on (``broker.core.principals``, ``broker.operations.acl``)
--------------------------------------------------------------------
A publisher's ACL user (its *principal*) may ``XADD`` to one key only, its ingress stream:
``XADD {qm}:in:<principal> * publisher <id> topic <topic> body <body> ...`` (the same fields as
the publish stream). The queue mutex (``dequeue.lua``) moves each ingress stream's entries,
in order, into ``{qm}:publish`` with the field ``principal`` set to the stream's principal,
and deletes them from the ingress stream; an entry whose ``publisher`` is not one of the ids
bound to its principal (``HGET {qm}:principals <principal>``: ids, one per line) is
dead-lettered with the reason instead. Results are read as before
(``BLPOP {qm}:reply:<n>:<id>:<msgid>``), and envelopes carry ``principal``.

Many queue managers (``broker.topics.topology``, ``broker.network.channel``)
------------------------------------------------------------
A publication that must reach another queue manager is written, in its unit of work, to the
transmission stream ``{qm}:xmit:<to qm>`` of the channel to the next queue manager on its
way (one entry per channel, field ``e`` = the envelope). The channel mover files it in the
receiver's publish stream with ``channel_in.lua`` as an ordinary publication entry whose
fields are rebuilt from the envelope (``publisher``, ``msgid``, ``topic``, ``body``, ``ts``,
``seq``, ``persistent``, ``priority``, ``expiration``, ``correlation_id``, ``reply_to``,
``type``, ``props``) plus two optional fields a publisher never sets: ``origin`` (the queue
manager it was published at) and ``route`` (comma-separated queue managers it passed,
origin first). Both reach subscribers in the envelope header (``origin``, ``route``). The
receiver drops an entry whose channel sequence (its transmission entry id) is not above
``HGET {qm}:received <from qm>``, and a second copy of a message id by its dedup record.

Topic objects (``{qm}:topics``), for a service that is not written in Python
---------------------------------------------------------------------------
One hash field per object: the name (1-48 characters of ``A-Za-z0-9._/%``)
mapped to ``{"topic_string": "/PAYMENTS", "attributes": {"pub": "DISABLED",
"maxdepth": 1000}, "description": "", "altered_ms": 0}`` (attributes left out
are ``ASPARENT``). Change it and ``INCR {qm}:version`` in one ``MULTI``, as for
subscriptions; ``broker topic apply`` does this from a TOML file.
``SYSTEM.BASE.TOPIC`` (topic string "") holds the defaults; a record that cannot
be read is skipped and named by ``broker status``.

Key types are the broker's: a key of another type where the broker keeps one
of the above (a *foreign key*) is never written over. A publication that would
have to write to one is refused as a whole, with the key named in the reason,
except a subscriber queue (any band): its subscription is then unavailable, its
copy dead-lettered, and PMSGDLV/NPMSGDLV decide for the others (``commit.lua``);
a foreign queue-manager-wide key (the stream, the dead-letter stream, the
subscription hash, ...) stops the workers, with nothing half-done, until it is
removed. ``broker status`` names foreign keys and corrupt records.

The wire formats (the publication entry, the envelope, the reply, the flow key, dead letters,
delivery counting, schedules) and how a service in another language subscribes and consumes:
``broker.core.protocol``.
"""

from __future__ import annotations

import os
import re
import socket
import uuid

PROTOCOL_VERSION = 7

#: Consumer group of the workers on the publish stream.
WORKER_GROUP = "workers"


def process_name() -> str:
    """A new name for a worker or channel agent process, ``<host>-<pid>-<8 hex>``: its consumer name in
    ``{qm}:publish``'s group (or a channel's), its fencing token and its heartbeat's field."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


#: Publisher id the dequeue script files an entry under when it has no valid
#: ``publisher`` field (the rule: ``broker.core.wire.publisher_fifo``); such entries are dead-lettered in stream order.
MALFORMED_PUBLISHER = "?"


def _tag(qm: str) -> str:
    return "{" + qm + "}"


def publish_stream(qm: str) -> str:
    """The stream publishers XADD to: ``{qm}:publish``."""
    return f"{_tag(qm)}:publish"


def publish_repair(qm: str) -> str:
    """The fresh stream ``broker repair stream`` builds and renames to ``{qm}:publish`` in one
    atomic call (``lua/repair_stream.lua``): ``{qm}:publish:repair``; it never outlives the call."""
    return f"{_tag(qm)}:publish:repair"


def version(qm: str) -> str:
    """The index version counter: ``{qm}:version``."""
    return f"{_tag(qm)}:version"


def subscriptions(qm: str) -> str:
    """The hash of subscriptions: ``{qm}:subs``."""
    return f"{_tag(qm)}:subs"


def sub_changes(qm: str) -> str:
    """The subscription change log (a zset ``"<version> <sub id>"`` -> version): ``{qm}:sub_changes``."""
    return f"{_tag(qm)}:sub_changes"


#: Most entries kept in ``{qm}:sub_changes``; a worker further behind reloads its whole routing table.
SUB_CHANGES_MAX_LEN = 1000


def links(qm: str) -> str:
    """The hash of topic links: ``{qm}:links``."""
    return f"{_tag(qm)}:links"


def client_copies(qm: str) -> str:
    """The per-client-id copies setting (``broker.topics.copies``): ``{qm}:client_copies``."""
    return f"{_tag(qm)}:client_copies"


def sub_prefix(qm: str) -> str:
    """Prefix of the subscriber queues: ``{qm}:sub:`` (``commit.lua`` is passed its length to journal ids)."""
    return f"{_tag(qm)}:sub:"


def sub_queue(qm: str, sub_id: str) -> str:
    """A subscriber queue: ``{qm}:sub:<sub_id>``."""
    return f"{sub_prefix(qm)}{sub_id}"


def sub_inflight(qm: str, sub_id: str) -> str:
    """Protocol 2's one in-flight list of a subscription, ``{qm}:sub:<sub_id>:inflight``; removed with it."""
    return f"{_tag(qm)}:sub:{sub_id}:inflight"


#: The default priority (Jakarta Messaging §3.4.10): its band is the subscriber queue itself.
DEFAULT_PRIORITY = 4

#: Priorities, highest first: the order a consumer takes the bands in.
PRIORITIES = tuple(range(9, -1, -1))


def sub_band(qm: str, sub_id: str, priority: int) -> str:
    """The list of a subscription's messages of one priority (0-9).

    ``{qm}:sub:<sub_id>`` for the default priority 4, ``{qm}:sub:<sub_id>:p<N>`` for the others.
    """
    queue = sub_queue(qm, sub_id)
    return queue if priority == DEFAULT_PRIORITY else f"{queue}:p{priority}"


def sub_bands(qm: str, sub_id: str) -> list[str]:
    """Every priority band of a subscription, highest priority first (p9 .. p0)."""
    return [sub_band(qm, sub_id, p) for p in PRIORITIES]


def sub_bell(qm: str, sub_id: str) -> str:
    """A subscription's bell, ``{qm}:sub:<sub_id>:bell``: a list of one element while messages may wait."""
    return f"{sub_queue(qm, sub_id)}:bell"


def sub_consumers(qm: str, sub_id: str) -> str:
    """A subscription's consumers, ``{qm}:sub:<sub_id>:consumers``: zset consumer id -> lease deadline, ms."""
    return f"{sub_queue(qm, sub_id)}:consumers"


def inflight_prefix(qm: str, sub_id: str) -> str:
    """Prefix of a subscription's per-consumer in-flight lists, passed to Lua: ``{qm}:sub:<sub_id>:inflight:``."""
    return f"{sub_queue(qm, sub_id)}:inflight:"


def consumer_inflight(qm: str, sub_id: str, consumer: str) -> str:
    """One consumer's in-flight list: ``{qm}:sub:<sub_id>:inflight:<consumer>``."""
    return inflight_prefix(qm, sub_id) + consumer


def sub_holder(qm: str, sub_id: str) -> str:
    """The consumer holding an exclusive or active-standby subscription: ``{qm}:sub:<sub_id>:active``."""
    return f"{sub_queue(qm, sub_id)}:active"


def sub_redelivered(qm: str, sub_id: str) -> str:
    """Failed deliveries per message: ``{qm}:sub:<sub_id>:redelivered``, hash entry id -> count."""
    return f"{sub_queue(qm, sub_id)}:redelivered"


def sub_poison(qm: str, sub_id: str) -> str:
    """A subscription's poison messages, ``{qm}:sub:<sub_id>:poison``: a stream (``envelope``,
    ``dlq.reason``, ``dlq.entry_id``, ``dlq.subscription``) its consumers write through the library."""
    return f"{sub_queue(qm, sub_id)}:poison"


def sub_expired(qm: str, sub_id: str) -> str:
    """Messages that expired while waiting in a subscription, ``{qm}:sub:<sub_id>:expired``: an integer."""
    return f"{sub_queue(qm, sub_id)}:expired"


def sub_groups(qm: str, sub_id: str) -> str:
    """A shared subscription's message groups, ``{qm}:sub:<sub_id>:groups``: hash JMSXGroupID -> the
    id of the consumer that owns the group (``library/receive.lua`` assigns, ``recover.lua`` frees)."""
    return f"{sub_queue(qm, sub_id)}:groups"


def sub_last_active(qm: str, sub_id: str) -> str:
    """A subscription's last use by a consumer, ``{qm}:sub:<sub_id>:last_active``: ms since the epoch."""
    return f"{sub_queue(qm, sub_id)}:last_active"


def topic_objects(qm: str) -> str:
    """The hash of administrative topic objects: ``{qm}:topics``, name -> JSON (``broker.topics.topic_objects``)."""
    return f"{_tag(qm)}:topics"


def manager(qm: str) -> str:
    """The queue manager's own record, ``{qm}:manager``: hash ``topic_scheme`` -> ``mqtt`` | ``swiftmq``
    (written once, by the first worker or subscribe; ``broker.core.schemes.recorded_scheme``)."""
    return f"{_tag(qm)}:manager"


def declared_topics(qm: str) -> str:
    """Topics declared administratively (SwiftMQ's ``<topics>``), ``{qm}:declared``: hash topic -> JSON."""
    return f"{_tag(qm)}:declared"


def skipped(qm: str) -> str:
    """Deliveries skipped because a subscriber queue was full (MAXDEPTH) or its subscriber slow,
    ``{qm}:skipped``: hash sub id -> count."""
    return f"{_tag(qm)}:skipped"


def retained(qm: str) -> str:
    """The retained publications, ``{qm}:retained``: hash topic string -> the envelope of the
    topic's last retained publication (IBM MQ MQPMO_RETAIN, MQTT 5 §3.3.1.3 RETAIN)."""
    return f"{_tag(qm)}:retained"


def slow(qm: str) -> str:
    """Deliveries withheld by a slow-subscriber condition, ``{qm}:slow``: hash sub id -> count
    (each is also counted in ``{qm}:skipped``)."""
    return f"{_tag(qm)}:slow"


def expired(qm: str) -> str:
    """Protocol 5's expired counts, ``{qm}:expired``: hash sub id -> count (read only now: ``sub_expired``)."""
    return f"{_tag(qm)}:expired"


def pub_prefix(qm: str) -> str:
    """Prefix of the per-publisher keys, passed to Lua in ARGV: ``{qm}:pub:``."""
    return f"{_tag(qm)}:pub:"


def fifo_key(qm: str, publisher: str) -> str:
    """A publisher's FIFO of entry ids: ``{qm}:pub:<publisher>:fifo`` (Lua: prefix .. pub .. ':fifo')."""
    return f"{pub_prefix(qm)}{publisher}:fifo"


def turn_key(qm: str, publisher: str) -> str:
    """A publisher's turn, the worker token holding it: ``{qm}:pub:<publisher>:turn``."""
    return f"{pub_prefix(qm)}{publisher}:turn"


def flow_key(qm: str, publisher: str) -> str:
    """The flow-control delay asked of a publisher, ms: ``{qm}:pub:<publisher>:flow`` (Lua: prefix ..
    pub .. ':flow'); a string, PX the delay, written only when the delay is above 0."""
    return f"{pub_prefix(qm)}{publisher}:flow"


def band_sub_id(qm: str, queue: str) -> str:
    """The subscription id of a queue key (any priority band): ``sub_id_of`` in ``commit.lua``.

    ``band_sub_id(qm, sub_band(qm, s, p)) == s`` for every priority ``p``.
    """
    rest = queue[len(sub_prefix(qm)) :]
    head, sep, band = rest.rpartition(":p")
    return head if sep and len(band) == 1 and band.isdigit() else rest


def active_publishers(qm: str) -> str:
    """The set of publishers with a non-empty FIFO: ``{qm}:publishers``."""
    return f"{_tag(qm)}:publishers"


def _id_part(publisher: str, msgid: str) -> str:
    # Lua's twin: id_key in lua/lib.lua (#pub is the length in bytes).
    return f"{len(publisher.encode('utf-8', 'surrogateescape'))}:{publisher}:{msgid}"


def dedup_prefix(qm: str) -> str:
    """Prefix of the dedup records, passed to Lua in ARGV: ``{qm}:dedup:``."""
    return f"{_tag(qm)}:dedup:"


def reply_prefix(qm: str) -> str:
    """Prefix of the reply lists, passed to Lua in ARGV: ``{qm}:reply:``."""
    return f"{_tag(qm)}:reply:"


def dedup(qm: str, publisher: str, msgid: str) -> str:
    """The record of a delivered message id: ``{qm}:dedup:<n>:<publisher>:<msgid>``.

    ``<n>`` is the publisher id's length in bytes, so that ids containing ``:``
    cannot collide (publisher ``a``, msgid ``b:c`` vs publisher ``a:b``, msgid ``c``).
    """
    return dedup_prefix(qm) + _id_part(publisher, msgid)


def reply(qm: str, publisher: str, msgid: str) -> str:
    """Where the result of a publication is posted: ``{qm}:reply:<n>:<publisher>:<msgid>``.

    ``<n>`` is the publisher id's length in bytes (see ``dedup``).
    """
    return reply_prefix(qm) + _id_part(publisher, msgid)


def dead_letter(qm: str) -> str:
    """The dead-letter stream: ``{qm}:dlq``."""
    return f"{_tag(qm)}:dlq"


def workers(qm: str) -> str:
    """The hash of worker heartbeats: ``{qm}:workers``."""
    return f"{_tag(qm)}:workers"


def journal(qm: str) -> str:
    """The delivery journal stream: ``{qm}:journal``."""
    return f"{_tag(qm)}:journal"


def alive(qm: str) -> str:
    """Live workers, scored by their last heartbeat in ms: ``{qm}:alive``."""
    return f"{_tag(qm)}:alive"


#: A worker whose last heartbeat (its score in ``alive``) is older than this is not live, ms:
#: ``dequeue.lua`` does not count it in the fair share (ARGV[8]), a replay of dead letters does
#: not count it as running, and ``broker status`` shows it "silent". A worker beats about once
#: a second (``worker.housekeeping.HEARTBEAT_MS``).
LIVENESS_MS = 5_000


def saturated(qm: str) -> str:
    """Workers holding a saturated publisher (``dequeue.lua``): ``{qm}:saturated``, hash worker
    name -> ms of the last dequeue that found it so."""
    return f"{_tag(qm)}:saturated"


def alone(qm: str) -> str:
    """The entries workers handle alone (``worker.loop``: a suspect of ``max_deliveries``): ``{qm}:alone``,
    hash worker name -> entry id, read by ``take_over`` in ``lua/lib.lua``."""
    return f"{_tag(qm)}:alone"


def waiter(qm: str) -> str:
    """The one idle worker waiting on the publish stream (``worker.waiting``): ``{qm}:waiter``, a string
    holding its name, PX its lease in ms."""
    return f"{_tag(qm)}:waiter"


def delayed(qm: str) -> str:
    """Publications waiting for their delivery time (Jakarta Messaging 2.0 delivery delay;
    ``dequeue.lua``): ``{qm}:delayed``, a zset scored by the delivery time (ms since the epoch),
    each member the original entry id (``DELAYED_ID_BYTES``: ms and seq zero-padded to 20 digits
    each, so equal delivery times keep stream order) followed by the MessagePack array of the
    entry's fields."""
    return f"{_tag(qm)}:delayed"


#: Bytes of the zero-padded original entry id that starts each member of ``{qm}:delayed``.
DELAYED_ID_BYTES = 41


def wake(qm: str) -> str:
    """Wakes one idle worker that is not the waiter (``worker.waiting``): ``{qm}:wake``, a list of at most
    one element, the publishers given up (a JSON list of str, any bytes of an id surrogate-escaped)."""
    return f"{_tag(qm)}:wake"


def usage(qm: str) -> str:
    """The stream of usage snapshots: ``{qm}:usage``."""
    return f"{_tag(qm)}:usage"


def topic_publications(qm: str) -> str:
    """Topic statistics (``broker.operations.topic_stats``), ``{qm}:topic_stats:publications``: hash
    topic string -> publications delivered; the field ``""`` counts the topics past the bound."""
    return f"{_tag(qm)}:topic_stats:publications"


def topic_copies(qm: str) -> str:
    """Topic statistics, ``{qm}:topic_stats:copies``: hash topic string -> copies put on subscriber queues."""
    return f"{_tag(qm)}:topic_stats:copies"


def topic_last_publication(qm: str) -> str:
    """Topic statistics, ``{qm}:topic_stats:last``: zset topic string scored by its last publication, ms."""
    return f"{_tag(qm)}:topic_stats:last"


def last_active(qm: str) -> str:
    """Protocol 5's last use of subscriptions, ``{qm}:last_active``: hash sub id -> ms (read only now:
    ``sub_last_active``)."""
    return f"{_tag(qm)}:last_active"


def schedules(qm: str) -> str:
    """Scheduled admin jobs, ``{qm}:schedules``: hash schedule id -> JSON (``broker.operations.schedules``)."""
    return f"{_tag(qm)}:schedules"


# --- Many queue managers, one topic space (``broker.topics.topology``, ``broker.network.channel``) ---


def network(qm: str) -> str:
    """The network's topology as this queue manager knows it, ``{qm}:network``: a string of JSON
    (``broker.topics.topology.Network``, with its digest), written by ``broker network apply``."""
    return f"{_tag(qm)}:network"


def announced(qm: str) -> str:
    """What this queue manager announces to the others (SwiftMQ's "some/none"), ``{qm}:announced``:
    a string of JSON ``{"state": "up" | "withdrawn", "keys": {topic key: since ms}, "at_ms": n, "seq": n}``
    (a topic key is a root topic, or a subscription's filter), written by its channel process;
    ``seq`` counts its writes (a record without it is 0): one more each time it announces again."""
    return f"{_tag(qm)}:announced"


def proxies(qm: str) -> str:
    """The proxy subscriptions held here for other queue managers, ``{qm}:proxies``: hash
    ``<remote qm> <dynamic|static> <topic key>`` -> JSON (``broker.topics.topology.ProxySubscription``)."""
    return f"{_tag(qm)}:proxies"


def cluster_topics(qm: str) -> str:
    """Copies of the cluster topic objects of every publish/subscribe cluster in the network,
    ``{qm}:cluster_topics``: hash topic string -> JSON ``{"cluster", "clroute", "hosts"}``."""
    return f"{_tag(qm)}:cluster_topics"


def network_seen(qm: str) -> str:
    """Remote queue managers seen announcing at least once, ``{qm}:network_seen``: hash qm -> ms
    (a static remote subscription without keep_on_unsubscribe ends then)."""
    return f"{_tag(qm)}:network_seen"


def proxies_removed(qm: str) -> str:
    """Dynamic proxy subscriptions removed here, ``{qm}:proxies_removed``: hash field -> the
    announcement ``seq`` they came from; field ``<qm>``: all of that queue manager's (``broker
    proxies remove``), ``<qm> <topic key>``: one (a slow remote route's disconnect,
    ``broker.network.slow_routes``). The channel process makes none of them again until that
    queue manager announces with a higher ``seq`` (it announced again), then deletes the field."""
    return f"{_tag(qm)}:proxies_removed"


def withheld(qm: str) -> str:
    """The channels a remote slow-subscriber condition withholds publications from,
    ``{qm}:withheld``: hash ``<to qm>`` -> JSON ``{"roots": {root topic: persistence mode},
    "backlog": n, "since_ms": n}`` (``broker.network.slow_routes``), read by the workers."""
    return f"{_tag(qm)}:withheld"


def xmit_prefix(qm: str) -> str:
    """Prefix of the transmission streams: ``{qm}:xmit:`` (``commit.lua`` tells them from subscriber queues)."""
    return f"{_tag(qm)}:xmit:"


def transmission(qm: str, to_qm: str) -> str:
    """The transmission stream of the channel from ``qm`` to ``to_qm``: ``{qm}:xmit:<to_qm>``; each
    entry is one envelope (field ``e``), its entry id the channel sequence."""
    return f"{xmit_prefix(qm)}{to_qm}"


def channel_state(qm: str, to_qm: str) -> str:
    """The sending side's state of a channel, ``{qm}:channel:<to_qm>``: hash (moved, last id, lag,
    last error, backoff), written by its mover."""
    return f"{_tag(qm)}:channel:{to_qm}"


def channel_mover(qm: str, to_qm: str) -> str:
    """The lease of a channel's mover, ``{qm}:channel:<to_qm>:mover``: one mover per channel."""
    return f"{_tag(qm)}:channel:{to_qm}:mover"


def received(qm: str) -> str:
    """The receiving side of every channel into ``qm``, ``{qm}:received``: hash ``<from qm>`` ->
    the last channel sequence (transmission entry id) filed, ``<from qm>:count`` -> how many."""
    return f"{_tag(qm)}:received"


def network_agents(qm: str) -> str:
    """Heartbeats of this queue manager's channel processes, ``{qm}:agents``: hash name -> JSON."""
    return f"{_tag(qm)}:agents"


# --- Security: authenticated ingress (``broker.core.principals``, ``broker.operations.acl``) ---


def ingress_prefix(qm: str) -> str:
    """Prefix of the principals' ingress streams: ``{qm}:in:`` (``dequeue.lua`` builds them from it)."""
    return f"{_tag(qm)}:in:"


def ingress(qm: str, principal: str) -> str:
    """The ingress stream of one principal (an ACL user), ``{qm}:in:<principal>``: the only stream
    its user may XADD to; the queue mutex moves its entries into the publish stream."""
    return f"{ingress_prefix(qm)}{principal}"


def principals(qm: str) -> str:
    """The principals allowed to publish through ingress streams, ``{qm}:principals``: hash
    principal -> newline-separated publisher ids bound to it."""
    return f"{_tag(qm)}:principals"


def acl_users(qm: str) -> str:
    """The ACL users ``broker acl`` made for this queue manager, ``{qm}:acl``: hash user -> JSON
    (role, publisher ids, client id, peers; never a password)."""
    return f"{_tag(qm)}:acl"


def all_keys_pattern(qm: str) -> str:
    """A SCAN pattern matching every key of the queue manager (and an ACL key pattern: ``broker.acl``)."""
    return f"{_tag(qm)}:*"


def glob_escape(text: str) -> str:
    """``text`` as a literal in a key pattern (SCAN, ACL): ``*``, ``?``, ``[``, ``]`` and ``\\`` escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def reply_pattern(qm: str, publisher: str) -> str:
    """A pattern matching every reply list of ``publisher``: ``{qm}:reply:<n>:<publisher>:*`` (``reply``)."""
    return reply_prefix(qm) + glob_escape(_id_part(publisher, "")) + "*"


def client_subscriptions_pattern(qm: str, client_id: str) -> str:
    """A pattern matching every key of the subscriptions of ``client_id`` (ids ``<client id>$<name>``:
    their queues, bands and consumer state): ``{qm}:sub:<client id>$*``."""
    return sub_prefix(qm) + glob_escape(client_id) + "$*"


def pub_pattern(qm: str) -> str:
    """A SCAN pattern matching every per-publisher key (FIFO, turn, flow): ``{qm}:pub:*``."""
    return f"{pub_prefix(qm)}*"


#: The Redis type of each per-publisher key, by the suffix after the publisher id.
PUB_KEY_TYPES = {":fifo": "list", ":turn": "string", ":flow": "string"}


# --- Grants and control requests (``broker.topics.grants``, ``broker.operations.control``) ---


def grants(qm: str) -> str:
    """Per-topic authorization, ``{qm}:grants``: hash user -> JSON ``{"publish": [filter...],
    "publish_objects": [name...], "subscribe": [...], "subscribe_objects": [...]}``."""
    return f"{_tag(qm)}:grants"


def control_prefix(qm: str) -> str:
    """Prefix of the control streams, ``{qm}:ctl:`` (a client id follows)."""
    return f"{_tag(qm)}:ctl:"


def control(qm: str, client_id: str) -> str:
    """The control stream of one client id, ``{qm}:ctl:<client id>``: its subscriber user XADDs
    subscribe and unsubscribe requests there (client ids hold no ``:``)."""
    return f"{control_prefix(qm)}{client_id}"


def control_reply(qm: str, client_id: str, request_id: str) -> str:
    """The answer to one control request, ``{qm}:ctl:<client id>:reply:<request id>``: a list
    holding one JSON answer, with a TTL."""
    return f"{control(qm, client_id)}:reply:{request_id}"


def control_reply_pattern(qm: str, client_id: str) -> str:
    """A pattern matching every answer key of ``client_id``: ``{qm}:ctl:<client id>:reply:*``."""
    return glob_escape(control(qm, client_id)) + ":reply:*"


def control_lock(qm: str) -> str:
    """The lock of the worker answering control requests, ``{qm}:ctl_lock`` (SET NX PX): one at a time."""
    return f"{_tag(qm)}:ctl_lock"


def trim_lock(qm: str) -> str:
    """The lock of the worker trimming acknowledged entries from the publish stream,
    ``{qm}:trim_lock`` (SET NX PX, never deleted: at most one trim per its PX)."""
    return f"{_tag(qm)}:trim_lock"
