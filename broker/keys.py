'''Every Redis key the broker uses, and the wire protocol around them.

This docstring is the protocol document. A service in any language can publish
with one ``XADD`` and consume with ``BLMOVE``/``LMOVE`` by following it.

PROTOCOL_VERSION = 1

All keys of one queue manager ``<qm>`` start with the hash tag ``{<qm>}`` so that
every MULTI/EXEC and every Lua call touches one Redis Cluster slot.

Keys
----
==================================  ========  ============================================  =======================  ==========================
key                                 type      contents                                      written by               read by
==================================  ========  ============================================  =======================  ==========================
``{qm}:publish``                    stream    publication requests (fields below)           publishers (XADD)        workers, group ``workers``
``{qm}:version``                    string    integer, +1 on every subscription/link change admin, subscriptions     workers (in dequeue.lua)
``{qm}:subs``                       hash      sub id -> subscription JSON                   subscriptions            workers, admin
``{qm}:links``                      hash      source topic -> JSON ``{target: backward}``   admin                    workers, admin
``{qm}:sub:<sub id>``               list      envelopes; LPUSH by workers, pop from RIGHT   workers                  subscribers
``{qm}:sub:<sub id>:inflight``      list      envelopes taken but not yet acknowledged      subscribers (LMOVE)      subscribers (LREM on ack)
``{qm}:pub:<publisher>:fifo``       list      stream entry ids of one publisher, in order   dequeue.lua (RPUSH)      commit.lua (LPOP head)
``{qm}:pub:<publisher>:owner``      string    token of the worker holding the turn, PX lease dequeue.lua (SET NX)    commit.lua (fencing)
``{qm}:publishers``                 set       publisher ids whose FIFO is not empty         dequeue.lua (SADD)       reclaim.lua (orphan sweep)
``{qm}:dedup:<publisher>:<msgid>``  string    stream entry id that delivered it, PX window  commit.lua               commit.lua
``{qm}:reply:<publisher>:<msgid>``  list      one result JSON, PX reply TTL                 commit.lua               the waiting publisher
``{qm}:dlq``                        stream    dead-lettered entries: original fields plus   workers                  operators
                                              ``dlq.reason``, ``dlq.entry_id``
``{qm}:workers``                    hash      worker name -> JSON heartbeat                 workers                  ``broker status``
``{qm}:alive``                      zset      worker name, score = last heartbeat (ms)      workers                  dequeue.lua (fair share)
``{qm}:journal``                    stream    one record per publication handled (when the  commit.lua (capped)      ``broker journal export``
                                              ``journal`` setting is on): entry_id, msgid,
                                              publisher, seq, topic, subs (JSON list of
                                              subscription ids), enq_ms, dlv_ms, status
``{qm}:usage``                      stream    usage snapshots (field ``snapshot``: JSON)    rq job usage_snapshot    operators
==================================  ========  ============================================  =======================  ==========================

Keys whose names are built inside Lua from data the script reads (the two
per-publisher keys) are built from a prefix passed in ARGV,
``pub_prefix(qm)`` = ``{qm}:pub:``, followed by ``<publisher>:fifo`` or
``<publisher>:owner``; ``fifo_key``/``owner_key`` below are the Python twins and a
test checks that both give the same string.

Publication entry (fields of one ``XADD {qm}:publish * ...``)
-------------------------------------------------------------
Field names and text values are UTF-8; ``body`` is raw bytes.

=================  ========  ==========================================================
field              required  meaning
=================  ========  ==========================================================
``publisher``      yes       publisher id, 1-256 bytes; order is kept per publisher
``topic``          yes       topic string (MQTT 5 §4.7 rules, no wildcards)
``body``           no        message body, bytes (default empty)
``msgid``          no        message id; a second entry of the same publisher with the
                             same msgid inside the dedup window is not delivered again.
                             Default: ``<stream entry id>`` (no dedup across retries)
``seq``            no        per-publisher sequence number (decimal)
``ts``             no        publish time, ms since the epoch (default: the entry id's ms)
``persistent``     no        ``1`` or ``0`` (default ``1``)
``priority``       no        0-9 (Jakarta Messaging §3.4.10; default 4); carried, not reordered
``expiration``     no        absolute expiry, ms since the epoch; ``0`` = never (default)
``correlation_id`` no        carried to subscribers
``reply_to``       no        carried to subscribers
``props``          no        JSON object of user properties (string keys, scalar values)
``reply``          no        ``1``: post the result to ``{qm}:reply:<publisher>:<msgid>``
=================  ========  ==========================================================

Envelope (one element of a subscriber queue)
--------------------------------------------
``<header JSON, UTF-8, one line>`` ``\\n`` ``<body bytes>``: split at the first
newline byte. The header is a JSON object with ``v`` (protocol version),
``msgid``, ``publisher``, ``seq`` (int or null), ``topic`` (the topic it was
published on), ``ts`` (ms), ``entry_id`` (stream id) and ``size`` (body length
in bytes), and, only when they differ from their defaults, ``persistent``
(default true), ``priority`` (4), ``expiration`` (0), ``correlation_id``,
``reply_to`` (absent = null) and ``props`` (absent = ``{}``).

Reply (``{qm}:reply:<publisher>:<msgid>``, when ``reply=1``)
------------------------------------------------------------
A JSON object: ``status`` one of ``delivered``, ``duplicate``, ``expired``,
``refused``; ``subscriptions`` (how many queues got it); ``entry_id``;
``msgid``; for ``refused``: ``reason`` and ``suggestion`` (a corrected topic or null).

Subscriber's reliable pop
-------------------------
``LMOVE {qm}:sub:<id> {qm}:sub:<id>:inflight RIGHT LEFT`` (or ``BLMOVE`` with a
timeout), process, then ``LREM {qm}:sub:<id>:inflight 1 <envelope>``. At start a
subscriber moves whatever is left in ``:inflight`` back with
``LMOVE ... :inflight {qm}:sub:<id> LEFT RIGHT`` until it is empty, so the
oldest unacknowledged message is redelivered first.
'''

from __future__ import annotations

PROTOCOL_VERSION = 1

#: Consumer group of the workers on the publish stream.
WORKER_GROUP = "workers"

#: Publisher id the dequeue script files an entry under when it has no valid
#: ``publisher`` field; such entries are dead-lettered in stream order.
MALFORMED_PUBLISHER = "?"


def _tag(qm: str) -> str:
    return "{" + qm + "}"


def publish_stream(qm: str) -> str:
    """The stream publishers XADD to: ``{qm}:publish``."""
    return f"{_tag(qm)}:publish"


def version(qm: str) -> str:
    """The index version counter: ``{qm}:version``."""
    return f"{_tag(qm)}:version"


def subscriptions(qm: str) -> str:
    """The hash of subscriptions: ``{qm}:subs``."""
    return f"{_tag(qm)}:subs"


def links(qm: str) -> str:
    """The hash of topic links: ``{qm}:links``."""
    return f"{_tag(qm)}:links"


def sub_queue(qm: str, sub_id: str) -> str:
    """A subscriber queue: ``{qm}:sub:<sub_id>``."""
    return f"{_tag(qm)}:sub:{sub_id}"


def sub_inflight(qm: str, sub_id: str) -> str:
    """A subscriber's in-flight list: ``{qm}:sub:<sub_id>:inflight``."""
    return f"{_tag(qm)}:sub:{sub_id}:inflight"


def pub_prefix(qm: str) -> str:
    """Prefix of the per-publisher keys, passed to Lua in ARGV: ``{qm}:pub:``."""
    return f"{_tag(qm)}:pub:"


def fifo_key(qm: str, publisher: str) -> str:
    """A publisher's FIFO of entry ids: ``{qm}:pub:<publisher>:fifo`` (Lua: prefix .. pub .. ':fifo')."""
    return f"{pub_prefix(qm)}{publisher}:fifo"


def owner_key(qm: str, publisher: str) -> str:
    """A publisher's turn, the worker token holding it: ``{qm}:pub:<publisher>:owner``."""
    return f"{pub_prefix(qm)}{publisher}:owner"


def active_publishers(qm: str) -> str:
    """The set of publishers with a non-empty FIFO: ``{qm}:publishers``."""
    return f"{_tag(qm)}:publishers"


def dedup(qm: str, publisher: str, msgid: str) -> str:
    """The record of a delivered message id: ``{qm}:dedup:<publisher>:<msgid>``."""
    return f"{_tag(qm)}:dedup:{publisher}:{msgid}"


def reply(qm: str, publisher: str, msgid: str) -> str:
    """Where the result of a publication is posted: ``{qm}:reply:<publisher>:<msgid>``."""
    return f"{_tag(qm)}:reply:{publisher}:{msgid}"


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


def usage(qm: str) -> str:
    """The stream of usage snapshots: ``{qm}:usage``."""
    return f"{_tag(qm)}:usage"


def all_keys_pattern(qm: str) -> str:
    """A SCAN pattern matching every key of the queue manager."""
    return f"{_tag(qm)}:*"
