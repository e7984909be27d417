"""A snapshot of a queue manager for operators: stream, queues, dead letters, workers, problems.

``status`` never fails because of what it finds: a key of the wrong Redis type
where the broker keeps one (a foreign key), a record that cannot be read, a
worker heartbeat that is not JSON: each is reported in ``problems`` and the
rest of the snapshot is still given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from broker.clients.loads import read_loads, subscription_load
from broker.core import clock, hierarchy, keys, wire
from broker.core.connection import read_hash
from broker.core.errors import BrokerError, ForeignKey, InvalidTopicFilter, translate_errors
from broker.core.schemes import scheme_of
from broker.core.stream import GroupState, clock_problem, group_state
from broker.core.topic_rules import validate_topic
from broker.network.network_admin import static_problems
from broker.topics.copies import read_copies
from broker.topics.links import read_links
from broker.topics.retained import RetainedPublication, count_retained, list_retained
from broker.topics.routing import RoutingTable, network_problems
from broker.topics.subscriptions import SubscriptionRecord, read_subscriptions
from broker.topics.topic_objects import BASE, read_tree
from broker.topics.topology import route_class_text


def _read(problems: list[str], what: str, call: Any, default: Any) -> Any:
    """``call()``, or ``default`` with a line in ``problems`` when the server refuses it."""
    try:
        return call()
    except BrokerError as exc:
        problems.append(str(exc))
    except redis.ResponseError as exc:
        problems.append(f"{what}: {exc}")
    return default


@dataclass
class SubscriptionRow:
    """One subscription in the snapshot.

    Attributes:
        id: the subscription id (``client$name``).
        filter: its topic filter as shown (``SubscriptionRecord.shown_filter``).
        durable: True for a durable subscription.
        mode: its consumer mode.
        consumers: live consumers, or None for a queue key of another Redis type.
        depth: messages waiting, every priority band; None for a queue key of another Redis type.
        inflight: messages in flight, every consumer; None as ``depth``.
        skipped: deliveries left out (a full MAXDEPTH queue or a slow subscriber); None when the
            counter hash is foreign or corrupt.
        slow: those of ``skipped`` a slow-subscriber condition withheld; None as ``skipped``.
        expired: messages that expired before delivery; None as ``skipped``.
    """

    id: str
    filter: str
    durable: bool
    mode: str
    consumers: int | None
    depth: int | None
    inflight: int | None
    skipped: int | None
    slow: int | None
    expired: int | None


@dataclass
class WorkerRow:
    """One worker heartbeat in the snapshot.

    Attributes:
        name: the worker's name.
        pid: its process id, as it wrote it.
        processed: publications it processed, as it wrote it.
        heartbeat_age_ms: time since its last heartbeat, ms; None when the record names no
            heartbeat time (``heartbeat_ms`` 0 or missing: never), shown as "never".
        state: "alive", or "silent" (no heartbeat for ``keys.LIVENESS_MS``, or never).
    """

    name: str
    pid: Any
    processed: Any
    heartbeat_age_ms: int | None
    state: str


@dataclass
class Snapshot:
    """The operator's snapshot of a queue manager (``status``); ``dataclasses.asdict`` gives the
    JSON object of ``broker status --json``.

    Attributes:
        stream_length: entries in the publish stream.
        pending: entries read by the workers and not yet committed.
        lag: entries not yet read.
        dead_lettered: entries in the broker's dead-letter stream ``{qm}:dlq``.
        active_publishers: publishers with a FIFO now.
        version: the routing index version (an int; the raw text when it is not a number).
        subscriptions: one row per subscription.
        links: how many topic links.
        topic_scheme: the queue manager's topic scheme ("?" when it cannot be read).
        workers: one row per worker heartbeat, by name.
        problems: foreign keys, records that cannot be read, a broken publish stream, one line each.
        poison: poison messages in the subscriptions' own poison streams (``{qm}:sub:<id>:poison``;
            one of another type counts 0).
        delayed: publications waiting for their delivery time in ``{qm}:delayed`` (delivery
            delay, Jakarta Messaging 2.0 section 7.9).
        next_delivery_ms: the earliest delivery time among them, ms since the epoch; None when
            none waits.
        retained: topic strings with a retained publication (``{qm}:retained``; 0 when it holds
            another type, named in ``problems``).
    """

    stream_length: int
    pending: int
    lag: int
    dead_lettered: int
    active_publishers: int
    version: int | str
    subscriptions: list[SubscriptionRow]
    links: int
    topic_scheme: str
    workers: list[WorkerRow]
    problems: list[str]
    poison: int = 0
    delayed: int = 0
    next_delivery_ms: int | None = None
    retained: int = 0


def _expired(client: redis.Redis, qm: str, sub_id: str) -> int | None:
    """Messages expired while waiting in a subscription: its own count (``keys.sub_expired``)
    plus protocol 5's field in ``{qm}:expired``; None when its own count cannot be read."""
    try:
        own = int(client.get(keys.sub_expired(qm, sub_id)) or 0)
    except (redis.ResponseError, ValueError):  # its consumers' own key, written by hand: unknown
        return None
    try:
        old = int(client.hget(keys.expired(qm), sub_id) or 0)
    except (redis.ResponseError, ValueError):
        old = 0
    return own + old


def _subscription_row(
    client: redis.Redis, qm: str, record: SubscriptionRecord, foreign: bool
) -> SubscriptionRow:
    """One subscription's row: depth over every priority band, in flight over every consumer."""
    load = None if foreign else subscription_load(client, qm, record.sub_id)
    try:
        skipped: int | None = int(client.hget(keys.skipped(qm), record.sub_id) or 0)
        slow: int | None = int(client.hget(keys.slow(qm), record.sub_id) or 0)
    except (redis.ResponseError, ValueError):  # a foreign or corrupt counter hash: unknown
        skipped = slow = None
    expired = _expired(client, qm, record.sub_id)
    return SubscriptionRow(
        id=record.sub_id,
        filter=record.shown_filter,
        durable=record.durable,
        mode=record.mode,
        consumers=load.consumers if load else None,
        depth=load.depth if load else None,
        inflight=load.in_flight if load else None,
        skipped=skipped,
        slow=slow,
        expired=expired,
    )


# What the workers do about a foreign key, by the key's kind: each problem line says it, so that
# status never claims the workers go on while they wait (issue 27).
#: A queue-manager-wide key the queue mutex or the unit of work checks first (``require_types``).
WORKERS_WAIT = (
    "every worker waits for it to be removed (logged at ERROR): nothing is dequeued or delivered "
    "meanwhile, publications stay in the stream"
)
_EFFECTS = {
    "workers": (
        "every worker's heartbeat fails: a worker cannot start, and a running one fails the round that "
        "sends it and retries; no worker is listed here"
    ),
    "sub_changes": "the workers reload their whole routing table on every subscription change; delivery goes on",
    "inflight": "this subscription's consumers cannot receive or acknowledge; delivery to its queue goes on",
    ":fifo": (
        "this publisher's publications are refused (dead-lettered with the reason, in order) until it is "
        "removed; other publishers go on"
    ),
    ":flow": "this publisher is given no flow-control delay; delivery goes on",
    "waiting": "idle workers wait on the publish stream instead (logged once); delivery goes on",
}
_EFFECTS[":turn"] = _EFFECTS[":fifo"]
# read by the queue mutex only when a worker uses it (issue 25: nothing configured costs a call anything)
_EFFECTS["principals"] = (
    "every worker waits for it to be removed (logged at ERROR) from its next load of the routing table (at "
    "start, after any change of subscriptions, topics or principals; each dequeue while principals are "
    "bound): nothing is dequeued or delivered meanwhile, publications stay in the stream"
)
_EFFECTS["saturated"] = (
    "while more than one worker is live, every worker waits for it to be removed (logged at ERROR): nothing "
    "is dequeued or delivered meanwhile, publications stay in the stream; a worker alone goes on"
)
_EFFECTS["withheld"] = (
    "no channel is withheld from by a remote slow-subscriber condition (the channel process logs it at "
    "ERROR each round); forwarding goes on"
)
_EFFECTS["proxies_removed"] = (
    "proxy subscriptions removed with 'broker proxies remove' (or a slow remote route's disconnect) are "
    "made again from the remote queue managers' announcements"
)
_EFFECTS["bell"] = (
    "this subscription's consumers are not woken by new messages (a consumer blocking on it fails); "
    "delivery to every subscription, this one's queue included, goes on"
)


def unavailable_effect(sub_id: str) -> str:
    """What the workers do about a subscriber queue (any priority band) of another type, and what to do.

    The subscription is *unavailable* (``commit.lua``): its copy of each publication is dead-lettered
    with ``dlq.subscription`` set and counted in ``{qm}:skipped``; the topic's PMSGDLV/NPMSGDLV decide
    for the others (IBM MQ): ALLAVAIL, the default, delivers to them.
    """
    return (
        f"subscription {sub_id!r} is unavailable: its copy of every publication it matches is dead-lettered "
        f"(reason 'subscription unavailable', subscription {sub_id}) and counted as skipped; the other "
        "subscriptions get theirs (PMSGDLV/NPMSGDLV ALLAVAIL, the default; a topic object's ALL refuses "
        "those publications for every subscription, ALLDUR while this one is durable). Remove the key "
        f"(it holds no message of the broker), then `broker dlq replay --subscription '{sub_id}'`"
    )


def foreign_problem(key: Any, found: str, expected: str, effect: str) -> str:
    """A problem line for a foreign key: ``ForeignKey``'s text, then what the workers do about it.

    Args:
        key: the key's name (bytes or str).
        found: the Redis type it holds.
        expected: the type the broker keeps there.
        effect: ``WORKERS_WAIT`` or one of the texts of its kind.
    """
    return f"{ForeignKey(wire.lenient_text(key), found, expected)}: {effect}"


def _foreign_keys(client: redis.Redis, qm: str, subs: list[SubscriptionRecord], keyspace: bool) -> list[str]:
    """Foreign subscription bells, the idle workers' ``{qm}:waiter`` and ``{qm}:wake``, the channel
    process's ``{qm}:withheld`` and ``{qm}:proxies_removed``, and, with ``keyspace``, the
    subscriptions' priority bands other than the default one (9 each) and the per-publisher keys
    (FIFO, turn, flow: every ``{qm}:pub:*`` key, found by ``SCAN``), one line each
    (``foreign_problem``)."""
    wanted: list[tuple[Any, str, str]] = []
    for raw in client.scan_iter(match=keys.pub_pattern(qm), count=1000) if keyspace else ():
        name = wire.lenient_text(raw)
        for suffix, kind in keys.PUB_KEY_TYPES.items():
            if name.endswith(suffix):
                wanted.append((raw, kind, _EFFECTS[suffix]))
    wanted += [(keys.sub_bell(qm, record.sub_id), "list", _EFFECTS["bell"]) for record in subs]
    for record in subs if keyspace else ():
        effect = unavailable_effect(record.sub_id)
        queue = keys.sub_queue(qm, record.sub_id)
        wanted += [(band, "list", effect) for band in keys.sub_bands(qm, record.sub_id) if band != queue]
    wanted += [
        (keys.waiter(qm), "string", _EFFECTS["waiting"]),
        (keys.wake(qm), "list", _EFFECTS["waiting"]),
    ]  # worker.waiting
    wanted += [
        (keys.withheld(qm), "hash", _EFFECTS["withheld"]),
        (keys.proxies_removed(qm), "hash", _EFFECTS["proxies_removed"]),
    ]  # broker.network: the channel process
    pipe = client.pipeline(transaction=False)
    for key, _kind, _effect in wanted:
        pipe.type(key)
    found = [wire.lenient_text(t) for t in pipe.execute()]
    return [
        foreign_problem(key, kind_found, kind, effect)
        for (key, kind, effect), kind_found in zip(wanted, found, strict=True)
        if kind_found not in ("none", kind)
    ]


def _stream_problems(client: redis.Redis, qm: str, state: GroupState | None) -> list[str]:
    """A publish stream whose last id is exhausted or far in the future, or without the workers' group."""
    problems: list[str] = []
    clock = _read(problems, "publish stream", lambda: clock_problem(client, qm), None)
    if clock:
        problems.append(clock)
    if (
        state is not None
        and not state.exists
        and wire.lenient_text(client.type(keys.publish_stream(qm))) == "stream"
    ):
        problems.append(
            f"publish stream {keys.publish_stream(qm)} has no consumer group {keys.WORKER_GROUP!r} "
            f"({state.length} entries): the workers create it when they start, and again when it "
            "was destroyed; start them"
        )
    return problems


def _scheme_text(client: redis.Redis, qm: str) -> str:
    """``mqtt``, ``swiftmq (direct selection)`` or ``swiftmq (indirect, N declared topics)``."""
    manager = read_hash(client, keys.manager(qm))
    scheme = scheme_of(qm, manager)
    if scheme != "swiftmq":
        return scheme
    if manager.get(b"direct_subscriber_selection", b"true") != b"false":
        return "swiftmq (direct selection)"
    declared = len(read_hash(client, keys.declared_topics(qm)))
    return f"swiftmq (indirect selection, {declared} declared topics)"


def _swiftmq_problems(subs: list[SubscriptionRecord]) -> list[str]:
    """A line per subscription whose filter the swiftmq scheme refuses (the workers skip it)."""
    found = []
    for record in subs:
        try:
            hierarchy.validate_filter(record.topic_filter)
        except InvalidTopicFilter as exc:
            found.append(f"subscription {record.sub_id!r} matches nothing under the swiftmq scheme: {exc}")
    return found


@translate_errors
def status(
    client: redis.Redis, qm: str, max_selector_bytes: int | None = None, keyspace: bool = True
) -> Snapshot:
    """A snapshot of the queue manager.

    ``max_selector_bytes``: ``Settings.max_selector_bytes``, as the workers have it: a
    subscription whose selector is longer is named in ``problems`` (the workers skip it),
    as one over the fixed bounds of ``broker.core.selectors`` always is; None: any size.

    ``problems`` names foreign keys, each with what the workers do about it (``foreign_problem``:
    for most queue-manager-wide ones, ``WORKERS_WAIT``; for a subscription's queue, ``unavailable_effect``):
    the queue-manager-wide ones, subscriber queues, bells and, with ``keyspace``, the other priority
    bands and the per-publisher keys (FIFO, turn, flow), found with a ``SCAN`` of the
    server's keys (a cost that grows with the whole database: ``status --watch``, the console's
    live pages and the usage snapshot job leave it out);
    a publish stream whose last entry id is exhausted or far in the future
    (``broker.core.stream.clock_problem``), or that has no consumer group.

    Returns:
        A ``Snapshot`` (its fields say the units: depths are messages, ages ms).

    Raises:
        ConnectionLost, redis.ConnectionError: the server cannot be reached.
    """
    problems: list[str] = []
    state = _read(problems, "publish stream", lambda: group_state(client, qm), None)
    problems += _stream_problems(client, qm, state)
    subs, bad_subs = _read(
        problems, "subscriptions", lambda: read_subscriptions(client, qm, max_selector_bytes), ([], [])
    )
    graph, bad_links = _read(problems, "links", lambda: read_links(client, qm), (None, []))
    tree = _read(problems, "topic objects", lambda: read_tree(client, qm), None)
    problems += [str(p) for p in (*bad_subs, *bad_links, *(tree.problems if tree else []))]
    problems += [str(p) for p in _read(problems, "network records", lambda: network_problems(client, qm), [])]
    problems += _read(problems, "static remote subscriptions", lambda: static_problems(client, qm), [])
    problems += [str(p) for p in _read(problems, "copies", lambda: read_copies(client, qm), (None, []))[1]]
    scheme = _read(problems, "topic scheme", lambda: _scheme_text(client, qm), "?")
    if scheme.startswith("swiftmq"):  # the workers skip a filter the scheme refuses (it matches nothing)
        problems += _swiftmq_problems(subs)

    pipe = client.pipeline(transaction=False)
    for record in subs:
        pipe.llen(keys.sub_queue(qm, record.sub_id))
        pipe.llen(keys.sub_inflight(qm, record.sub_id))
    pipe.xlen(keys.dead_letter(qm))
    pipe.scard(keys.active_publishers(qm))
    pipe.get(keys.version(qm))
    pipe.hgetall(keys.workers(qm))
    pipe.zcard(keys.sub_changes(qm))  # foreign: workers reload their whole table on every change
    pipe.zcard(keys.alive(qm))  # read for their type only: the queue mutex checks them first
    pipe.hlen(keys.principals(qm))
    pipe.hlen(keys.saturated(qm))
    replies = pipe.execute(raise_on_error=False)
    flat_keys: list[tuple[str, str, str]] = []
    for record in subs:
        flat_keys.append((keys.sub_queue(qm, record.sub_id), "list", unavailable_effect(record.sub_id)))
        flat_keys.append((keys.sub_inflight(qm, record.sub_id), "list", _EFFECTS["inflight"]))
    flat_keys += [
        (keys.dead_letter(qm), "stream", WORKERS_WAIT),
        (keys.active_publishers(qm), "set", WORKERS_WAIT),
        (keys.version(qm), "string", WORKERS_WAIT),
        (keys.workers(qm), "hash", _EFFECTS["workers"]),
        (keys.sub_changes(qm), "zset", _EFFECTS["sub_changes"]),
        (keys.alive(qm), "zset", WORKERS_WAIT),
        (keys.principals(qm), "hash", _EFFECTS["principals"]),
        (keys.saturated(qm), "hash", _EFFECTS["saturated"]),
    ]
    values: list[Any] = []
    for (key, expected, effect), reply in zip(flat_keys, replies, strict=True):
        if isinstance(reply, redis.exceptions.NoPermissionError):  # the URL's user may not read it
            values.append(None)
        elif isinstance(reply, redis.ResponseError):
            problems.append(foreign_problem(key, wire.lenient_text(client.type(key)), expected, effect))
            values.append(None)
        else:
            values.append(reply)
    dead, active, version, beats = values[-8:-4]
    problems += _foreign_keys(client, qm, subs, keyspace)
    delayed, next_delivery_ms = _delayed(client, qm, problems)

    now_ms = clock.now_ms()
    workers: list[WorkerRow] = []
    for name, raw in sorted((beats or {}).items()):
        try:
            beat = json.loads(raw)
            heartbeat_ms = int(beat.get("heartbeat_ms", 0))
        except (ValueError, TypeError, AttributeError):
            problems.append(
                f"corrupt record {wire.lenient_text(name)!r} in {keys.workers(qm)}: not a JSON heartbeat"
            )
            continue
        age = now_ms - heartbeat_ms if heartbeat_ms > 0 else None  # 0: the epoch, i.e. never
        workers.append(
            WorkerRow(
                name=wire.lenient_text(name),
                pid=beat.get("pid"),
                processed=beat.get("processed"),
                heartbeat_age_ms=age,
                state="alive" if age is not None and age <= keys.LIVENESS_MS else "silent",
            )
        )
    return Snapshot(
        stream_length=state.length if state else 0,
        pending=state.pending if state else 0,
        lag=(state.lag or 0) if state else 0,
        dead_lettered=int(dead or 0),
        active_publishers=int(active or 0),
        version=int(version)
        if version is not None and wire.lenient_text(version).isdigit()
        else wire.lenient_text(version or 0),
        subscriptions=[_subscription_row(client, qm, r, values[2 * i] is None) for i, r in enumerate(subs)],
        links=len(graph.links()) if graph is not None else 0,
        topic_scheme=scheme,
        workers=workers,
        problems=problems,
        poison=_poison(client, qm, subs),
        delayed=delayed,
        next_delivery_ms=next_delivery_ms,
        retained=_read(problems, "retained publications", lambda: count_retained(client, qm), 0),
    )


def _delayed(client: redis.Redis, qm: str, problems: list[str]) -> tuple[int, int | None]:
    """How many publications wait for their delivery time, and the earliest one (ms since the
    epoch, None: none); a ``{qm}:delayed`` of another type is named in ``problems`` (0, None)."""
    key = keys.delayed(qm)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(key)
    pipe.zrange(key, 0, 0, withscores=True)
    count, head = pipe.execute(raise_on_error=False)
    if isinstance(count, redis.exceptions.NoPermissionError):
        return 0, None
    if isinstance(count, redis.ResponseError):
        effect = "publications with a delivery time are dead-lettered, none waiting is released"
        problems.append(foreign_problem(key, wire.lenient_text(client.type(key)), "zset", effect))
        return 0, None
    return int(count), (int(head[0][1]) if head else None)


def _poison(client: redis.Redis, qm: str, subs: list[SubscriptionRecord]) -> int:
    """Poison messages of every subscription (one ``XLEN`` each, pipelined); a key of another type,
    or one this user may not read, counts 0."""
    pipe = client.pipeline(transaction=False)
    for record in subs:
        pipe.xlen(keys.sub_poison(qm, record.sub_id))
    return sum(n for n in pipe.execute(raise_on_error=False) if isinstance(n, int))


@dataclass
class TopicStatus:
    """One topic string's status (IBM MQ's ``DISPLAY TPSTATUS``).

    Attributes:
        topic: the topic string.
        attributes: ``[(attribute, effective value, topic object it comes from)]``.
        via: topic reached (the topic, then linked ones) -> subscription ids matched there.
        subscriptions: the subscriptions a publication on it reaches, once each (after WILDCARD(BLOCK)).
        publishers: publisher id -> publications on this topic among the stream entries scanned.
        last_publication_ms: the newest of those, ms since the epoch, or None.
        scanned: how many of the newest stream entries were looked at (trimmed ones are gone).
        blocked: subscriptions matched in ``via`` that get nothing here: wildcard ones above a
            ``WILDCARD(BLOCK)`` topic object (named in ``blocked_by``).
        blocked_by: that topic object, "" when none.
        route_class: how far a publication on it may travel in a network of queue managers, as
            the workers route it (``RoutingTable.route_class``): ``local`` (hierarchy edges only),
            ``cluster <name>`` (CLROUTE(DIRECT)) or ``cluster <name> via topic hosts <qm>, ...``.
        retained: the topic's retained publication (``broker.topics.retained``), or None.
    """

    topic: str
    attributes: list[tuple[str, Any, str]]
    via: dict[str, list[str]]
    subscriptions: list[str]
    publishers: dict[str, int]
    last_publication_ms: int | None
    scanned: int
    blocked: list[str] = field(default_factory=list)
    blocked_by: str = ""
    route_class: str = "local"
    retained: RetainedPublication | None = None


@translate_errors
def topic_status(
    client: redis.Redis, qm: str, topic: str, scan: int = 10_000, default_maxdepth: int = 0
) -> TopicStatus:
    """Effective attributes (with their object), matching subscriptions (and through which link),
    publishers seen and the last publication time of ``topic``.

    Publishers and the last publication come from the newest ``scan`` entries of the
    publish stream (no per-publication bookkeeping on the hot path). ``default_maxdepth``:
    ``Settings.default_maxdepth``, the base's MAXDEPTH when it says NOLIMIT (as the workers see it).

    Raises:
        InvalidTopic: the topic is invalid.
        ForeignKey: a record hash holds another Redis type.
    """
    validate_topic(topic)
    table = RoutingTable(qm, default_maxdepth)
    table.load(client)
    effective = table.tree.effective(topic)
    attributes = [(name, effective.values[name], effective.source[name]) for name in sorted(effective.values)]
    via: dict[str, list[str]] = {}
    kept: set[str] = set()
    for linked in table.links.closure(topic):
        via[linked] = sorted(table.index.match(linked))
        kept |= table.matching(linked)
    publishers: dict[str, int] = {}
    last: int | None = None
    entries: Any = client.xrevrange(keys.publish_stream(qm), count=scan)
    for entry_id, fields in entries:
        if fields.get(b"topic") != topic.encode("utf-8", "surrogateescape"):
            continue
        who = wire.lenient_text(fields.get(b"publisher", b"?"))
        publishers[who] = publishers.get(who, 0) + 1
        ms = int(wire.lenient_text(entry_id).split("-", 1)[0])
        last = ms if last is None else max(last, ms)
    delivered = list(table.resolve(topic).sub_ids)
    blocked = sorted({s for matched in via.values() for s in matched} - kept)  # not one copy's left out
    return TopicStatus(
        topic,
        attributes,
        via,
        delivered,
        publishers,
        last,
        len(entries),
        blocked,
        effective.blocked_by,
        route_class_text(table.route_class(topic)),
        next(iter(list_retained(client, qm, topic=topic)), None),
    )


@dataclass
class TopicNode:
    """One node of the topic tree: a level of the topic strings that objects, subscriptions and links name."""

    topic_object: str = ""
    subscriptions: int = 0
    links_to: list[str] = field(default_factory=list)
    children: dict[str, TopicNode] = field(default_factory=dict)


@translate_errors
def topic_tree(client: redis.Redis, qm: str) -> TopicNode:
    """The topic tree administration knows: topic objects, subscription filters and links, by level.

    The root is ``SYSTEM.BASE.TOPIC`` (topic string ""). A node's ``subscriptions``
    counts the subscriptions whose filter is exactly that string.
    """
    table = RoutingTable(qm)
    table.load(client)
    root = TopicNode(topic_object=BASE)

    def node(topic_string: str) -> TopicNode:
        at = root
        if topic_string == "":
            return at
        for level in topic_string.split(table.tree.separator):  # "/" levels, or swiftmq's "." nodes
            at = at.children.setdefault(level, TopicNode())
        return at

    for obj in table.tree.objects.values():
        if obj.name != BASE:
            node(obj.topic_string).topic_object = obj.name
    for record in table.subscriptions.values():
        node(record.topic_filter).subscriptions += 1
    for source, target, _backward in table.links.links():
        node(source).links_to.append(target)
        node(target)
    return root


@dataclass(frozen=True)
class SubscriberUsage:
    """One row of SwiftMQ's Topic Manager usage lists ``durables`` and ``subscriber`` (seed 003).

    Attributes:
        name: the subscription id, ``<client id>$<durable name>``.
        client_id: the part before ``$`` (an MQTT shared subscription's ShareName).
        durable_name: the part after ``$`` (a generated name for a non-durable subscription).
        topic: the topic filter as the subscriber wrote it.
        selector: the message selector, "" for none.
        no_local: it does not receive its own client id's publications.
        bound_to: the subscriber queue it is bound to, ``{qm}:sub:<id>`` (the default priority
            band; the other bands are ``:p<N>`` beside it).
        durable: a durable subscription.
        consumers: consumers with a live lease; None when the consumers key is foreign.
        depth: messages waiting, every priority band; None when a band key is foreign.
    """

    name: str
    client_id: str
    durable_name: str
    topic: str
    selector: str
    no_local: bool
    bound_to: str
    durable: bool
    consumers: int | None
    depth: int | None


def _usage_rows(
    client: redis.Redis, qm: str, records: list[SubscriptionRecord], now_ms: int, problems: list[str]
) -> list[SubscriberUsage]:
    """Live consumers and depth of each subscription, in one round trip; foreign keys go to ``problems``."""
    readings = read_loads(client, qm, [r.sub_id for r in records], now_ms, in_flight=False)
    rows = []
    for record, reading in zip(records, readings, strict=True):
        for key, expected in reading.foreign:
            problems.append(str(ForeignKey(key, wire.lenient_text(client.type(key)), expected)))
        live, depth = reading.consumers, reading.depth
        client_id, _, name = record.sub_id.partition("$")
        rows.append(
            SubscriberUsage(
                record.sub_id,
                client_id,
                name,
                record.shown_filter,
                record.selector,
                record.no_local,
                keys.sub_queue(qm, record.sub_id),
                record.durable,
                live,
                depth,
            )
        )
    return rows


#: SwiftMQ's usage lists: ``durables`` (every durable subscription) and ``subscriber``
#: (subscriptions, durable or not, with at least one live consumer).
UsageList = Literal["durables", "subscribers"]


@translate_errors
def usage_list(
    client: redis.Redis, qm: str, which: UsageList, now_ms: int | None = None
) -> tuple[list[SubscriberUsage], list[str]]:
    """One of the Topic Manager's usage lists (seed 003): ``durables`` or ``subscribers``.

    Never fails because of what it finds: a corrupt record or a foreign key is a line of problems.

    Args:
        client: a redis-py client.
        qm: the queue manager.
        which: ``durables``: every durable subscription, with its queue and depth;
            ``subscribers``: the active ones, durable or not, with at least one live consumer.
        now_ms: the time for live leases, ms since the epoch; None for this machine's clock.

    Returns:
        ``(rows sorted by name, problems)``.
    """
    problems: list[str] = []
    records, corrupt = _read(problems, "subscriptions", lambda: read_subscriptions(client, qm), ([], []))
    problems += [str(p) for p in corrupt]
    now = clock.now_ms() if now_ms is None else now_ms
    if which == "durables":
        return _usage_rows(client, qm, [r for r in records if r.durable], now, problems), problems
    return [row for row in _usage_rows(client, qm, records, now, problems) if row.consumers], problems
