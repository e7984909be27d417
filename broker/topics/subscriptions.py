"""Subscriptions: their records, ``subscribe`` and ``unsubscribe``.

A subscription is a topic filter (MQTT 5 §4.7), optionally a selector
(Jakarta Messaging §3.8.1.1) and no-local, and a subscriber queue
``{qm}:sub:<sub id>`` (one list per priority band). Its id is
``<client id>$<name>`` as in SwiftMQ's durable subscriptions. A **durable**
subscription keeps collecting while its consumers are away and lasts until
``unsubscribe``; a non-durable one is removed (with its queue) when its last
consumer closes it, or ``subscription_expiry_ms`` after its consumers stopped
renewing their leases (``broker.clients.consumer.sweep_subscriptions``). Consumers
(``broker.clients.consumer.Subscriber``) are the other half.

Every change bumps ``{qm}:version`` in the same MULTI as the change itself, and
logs the subscription id with the new version in ``{qm}:sub_changes``. A worker
reads that counter in the same atomic call that dequeues, and brings its routing
table to it before it resolves, so a publication enqueued after ``subscribe``
returned always reaches the new subscription (the worker applies the logged
changes alone: ``broker.topics.routing.RoutingTable.refresh``).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from broker.core import clock, hierarchy, keys, wire
from broker.core.config import (
    DEFAULT_MAX_SELECTOR_BYTES,
    DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT,
    DEFAULT_MAX_TOPIC_BYTES,
    DEFAULT_MAX_TOPIC_LEVELS,
    ConsumerMode,
    QueueController,
    Settings,
    first_controller,
)
from broker.core.connection import KEEP, can_name, change_field, read_hash
from broker.core.errors import (
    CorruptRecord,
    ForeignKey,
    InvalidName,
    InvalidSelector,
    InvalidTopicFilter,
    NoSuchSubscription,
    SubscriptionConflict,
    SubscriptionRefused,
    TooManySubscriptions,
    translate_errors,
)
from broker.core.schemes import recorded_scheme, separator
from broker.core.scripts import register
from broker.core.selectors import check_size, compile_selector
from broker.core.topic_rules import limit_problem, split_shared, validate_filter
from broker.topics.retained import NewSubscription
from broker.topics.topic_objects import TopicTree, fixed_prefix, topic_of

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


def check_name(what: str, value: str) -> None:
    if not _NAME.match(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidName(f"{what} {shown!r} must be 1-128 characters of A-Z a-z 0-9 _ . -")


def check_sub_id(sub_id: str) -> None:
    """Check a subscription id: ``<client id>$<name>``, each part as ``subscribe`` requires.

    Raises:
        InvalidName: it is not. (An id with ``:`` would make a queue key that is
            another subscription's in-flight list.)
    """
    client_id, sep, name = sub_id.partition("$")
    if not sep:
        raise InvalidName(f"subscription id {sub_id[:40]!r} is not <client id>$<name>")
    check_name("client id", client_id)
    check_name("subscription name", name)


#: The consumer modes a record may hold (``broker.core.config.ConsumerModeName``).
MODES = ("exclusive", "shared", "activestandby")


@dataclass(frozen=True)
class SubscriptionRecord:
    """A subscription as stored in ``{qm}:subs`` (the protocol document, ``broker.core.keys``).

    Attributes:
        sub_id: ``clientid$name`` (for an MQTT shared subscription, ``<ShareName>$<name>``).
        topic_filter: the MQTT-style filter (without a ``$share/<ShareName>/`` prefix).
        durable: survives its consumers going away.
        created_ms: when it was made, ms since the epoch.
        selector: a message selector (Jakarta Messaging §3.8.1.1), "" for none.
        no_local: publications whose ``client_id`` is this subscription's client
            id are not delivered to it (Jakarta Messaging §6.11.1, MQTT 5 §3.8.3.1).
        mode: ``exclusive``, ``shared`` or ``activestandby`` (``broker.core.config.ConsumerMode``).
        share: the MQTT 5 ShareName of a ``$share/<ShareName>/<filter>`` subscription, or "".
    """

    sub_id: str
    topic_filter: str
    durable: bool
    created_ms: int
    selector: str = ""
    no_local: bool = False
    mode: str = "exclusive"
    share: str = ""

    @property
    def client_id(self) -> str:
        """The part of the id before ``$``: the subscriber's client id (no-local compares with it)."""
        return self.sub_id.partition("$")[0]

    @property
    def shown_filter(self) -> str:
        """The filter as the subscriber wrote it (``$share/<ShareName>/<filter>`` for an MQTT shared one)."""
        return f"$share/{self.share}/{self.topic_filter}" if self.share else self.topic_filter

    def to_json(self) -> str:
        """The JSON stored as the hash value (optional fields only when not at their default)."""
        data: dict[str, Any] = {
            "filter": self.topic_filter,
            "durable": self.durable,
            "created_ms": self.created_ms,
        }
        if self.selector:
            data["selector"] = self.selector
        if self.no_local:
            data["no_local"] = True
        if self.mode != "exclusive":
            data["mode"] = self.mode
        if self.share:
            data["share"] = self.share
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(
        cls, sub_id: str, raw: bytes | str, qm: str = "", max_selector_bytes: int | None = None
    ) -> SubscriptionRecord:
        """Parse and check a hash value written by ``to_json`` (or by hand, by another service).

        Args:
            sub_id: the subscription id (the hash field).
            raw: the record (the hash value), JSON.
            qm: the queue manager, named in the error.
            max_selector_bytes: a selector longer than this, bytes, is refused (the routing
                table's check, ``Settings.max_selector_bytes``); None: any size.

        Raises:
            CorruptRecord: the id or the value cannot be read: not JSON, no valid
                filter, an invalid selector (over ``max_selector_bytes``, or over the
                bounds of ``broker.core.selectors``: "invalid selector: ... more than the
                broker allows"), a field of the wrong type.
        """
        key = keys.subscriptions(qm) if qm else "{qm}:subs"
        try:
            check_sub_id(sub_id)
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            topic_filter = data.get("filter")
            if not isinstance(topic_filter, str):
                raise ValueError('"filter" must be a string')
            validate_filter(topic_filter)
            durable = data.get("durable", False)
            created = data.get("created_ms", 0)
            selector = data.get("selector", "")
            no_local = data.get("no_local", False)
            mode = data.get("mode", "exclusive")
            share = data.get("share", "")
            if not isinstance(durable, bool):
                raise ValueError('"durable" must be true or false')
            if not isinstance(created, int) or isinstance(created, bool):
                raise ValueError('"created_ms" must be an integer')
            if not isinstance(selector, str):
                raise ValueError('"selector" must be a string')
            if not isinstance(no_local, bool):
                raise ValueError('"no_local" must be true or false')
            if mode not in MODES:
                raise ValueError(f'"mode" must be one of {", ".join(MODES)}')
            if not isinstance(share, str):
                raise ValueError('"share" must be a string')
            if selector:
                if max_selector_bytes is not None:
                    check_size(selector, max_selector_bytes)  # before the parse: a long text costs it
                compile_selector(selector)
        except InvalidName as exc:
            raise CorruptRecord(key, sub_id, str(exc)) from exc
        except InvalidTopicFilter as exc:
            raise CorruptRecord(key, sub_id, f"invalid filter: {exc.reason}") from exc
        except InvalidSelector as exc:
            raise CorruptRecord(key, sub_id, f"invalid selector: {exc}") from exc
        except ValueError as exc:  # json.JSONDecodeError included
            reason = "not JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise CorruptRecord(key, sub_id, reason) from exc
        except RecursionError as exc:
            raise CorruptRecord(key, sub_id, "not JSON (nested too deeply)") from exc
        return cls(sub_id, topic_filter, durable, created, selector, no_local, mode, share)


def parse_subscriptions(
    qm: str, raw: dict[Any, Any], max_selector_bytes: int | None = None
) -> tuple[list[SubscriptionRecord], list[CorruptRecord]]:
    """Parse the ``{qm}:subs`` hash, skipping records that cannot be read.

    ``max_selector_bytes``: a record whose selector is longer (bytes) is skipped too;
    None: any size (``SubscriptionRecord.from_json``).

    Returns:
        ``(records sorted by id, problems)``.
    """
    records: list[SubscriptionRecord] = []
    problems: list[CorruptRecord] = []
    for raw_id, value in raw.items():
        try:
            sub_id = wire.text(raw_id)
        except UnicodeDecodeError:
            problems.append(CorruptRecord(keys.subscriptions(qm), repr(raw_id), "the id is not UTF-8"))
            continue
        try:
            records.append(SubscriptionRecord.from_json(sub_id, value, qm, max_selector_bytes))
        except CorruptRecord as exc:
            problems.append(exc)
    records.sort(key=lambda r: r.sub_id)
    return records, problems


@translate_errors
def read_subscriptions(
    client: redis.Redis, qm: str, max_selector_bytes: int | None = None
) -> tuple[list[SubscriptionRecord], list[CorruptRecord]]:
    """Every subscription that can be read, and the records that cannot (``parse_subscriptions``:
    with ``max_selector_bytes``, those whose selector is longer too).

    Raises:
        ForeignKey: ``{qm}:subs`` holds another Redis type.
        redis.RedisError: as redis-py raises it.
    """
    return parse_subscriptions(qm, read_hash(client, keys.subscriptions(qm)), max_selector_bytes)


def _derived_name(topic_filter: str, selector: str) -> str:
    """The name of a shared subscription made without one: the same for the same filter and selector."""
    digest = hashlib.sha1(f"{topic_filter}\n{selector}".encode("utf-8", "surrogateescape")).hexdigest()
    return "share-" + digest[:12]


@translate_errors
def subscribe(
    client: redis.Redis,
    qm: str,
    topic_filter: str,
    client_id: str,
    durable_name: str | None = None,
    *,
    shared: bool = False,
    selector: str | None = None,
    no_local: bool = False,
    settings: Settings | None = None,
    consumer_modes: Sequence[ConsumerMode] | None = None,
    topic_object: str | None = None,
    scheme: str | None = None,
    max_topic_bytes: int | None = None,
    max_topic_levels: int | None = None,
    max_subscriptions_per_client: int | None = None,
    max_selector_bytes: int | None = None,
    name: str | None = None,
    retained: bool = True,
) -> SubscriptionRecord:
    """Create a subscription (or attach to an existing one with the same filter and options).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        topic_filter: an MQTT-style filter (``+`` one level, ``#`` the rest), or
            ``$share/<ShareName>/<filter>`` (MQTT 5 §4.8.2) for a shared
            subscription ``<ShareName>$<name>`` that every consumer naming the
            same ShareName and filter shares.
        client_id: the subscriber's client id.
        durable_name: the durable subscription's name; None makes a non-durable
            subscription (with a generated name, or for a shared one a name
            derived from the filter and selector).
        shared: JMS 2 shared subscription: each message goes to one of its consumers.
        selector: a message selector (Jakarta Messaging §3.8.1.1); None or "" for none.
        no_local: do not deliver publications whose ``client_id`` is ``client_id``.
        settings: the broker settings, as ``broker subscribe`` uses them: its queue controllers
            (``Settings.controllers``) give a subscription that is not shared its consumer mode;
            ``topic_scheme`` and the limits below come from it unless given. None: the defaults.
        consumer_modes: ``{predicate, mode}`` rules used in place of the settings' controllers.
        topic_object: subscribe through this topic object: its topic string, joined with
            ``/`` to ``topic_filter`` when that is not empty (IBM MQ).
        scheme: the topic scheme this process is configured with (``Settings.topic_scheme``),
            recorded for the queue manager if none is yet; None reads the recorded one.
            Under ``swiftmq`` the filter is a dot topic whose nodes after the root may be
            SQL-LIKE predicates (``iit.%.US``, ``broker.core.hierarchy``); ``$share/`` is not
            interpreted (use ``shared``).
        max_topic_bytes: the longest filter accepted, bytes (``Settings.max_topic_bytes``;
            without its ``$share/<ShareName>/`` prefix).
        max_topic_levels: the most levels (swiftmq: nodes) in a filter (``Settings.max_topic_levels``).
        max_subscriptions_per_client: a new subscription is refused when its client id (for
            ``$share/<ShareName>/``, the ShareName: the part of the id before ``$``) has this
            many already; 0 for no limit (``Settings.max_subscriptions_per_client``). Counted
            in the transaction that writes it (``{qm}:subs`` is watched), so concurrent
            subscribes never go over it; attaching to an existing subscription is not counted.
        max_selector_bytes: the longest selector accepted, bytes of UTF-8
            (``Settings.max_selector_bytes``), checked before it is parsed.
        name: a non-durable subscription's name (its id ``<client id>$<name>``); None: generated
            (``nd-<hex>``). Ignored when ``durable_name`` is given.
        retained: a new subscription (not shared) receives, flagged, the retained publications its filter,
            selector and no-local admit, in its transaction (``broker.topics.retained``); False: none.

    Returns:
        The subscription record; ``sub_id`` names its queue.

    Raises:
        InvalidTopicFilter: the filter (or its ``$share`` syntax) is invalid under the
            queue manager's scheme (swiftmq: e.g. a predicate root node ``i%.%.swiftmq``),
            or it is over ``max_topic_bytes`` or ``max_topic_levels`` (the reason names the setting).
        TooManySubscriptions: a new subscription, and its client id has
            ``max_subscriptions_per_client`` already.
        ConfigError: ``scheme`` differs from the queue manager's recorded scheme.
        InvalidSelector: the selector is invalid (the position is named).
        SelectorTooComplex: (an ``InvalidSelector``) the selector is over ``max_selector_bytes``
            or over the bounds of ``broker.core.selectors`` on its terms and nesting; ``limit``,
            ``maximum`` and ``found`` say which, and the message says both.
        InvalidName: the client id, name or ShareName has characters other than ``A-Za-z0-9_.-``.
        SubscriptionConflict: the subscription exists with another filter, selector, no-local or sharing.
        SubscriptionRefused: a new subscription under a topic object with ``SUB(DISABLED)``,
            or a durable one under ``DURSUB(NO)`` (``broker.topics.topic_objects``).
        CorruptRecord: the stored record of this subscription cannot be read
            (``unsubscribe`` removes it).
    """
    limits = _Limits.of(
        settings, max_topic_bytes, max_topic_levels, max_subscriptions_per_client, max_selector_bytes
    )
    scheme = scheme if scheme is not None or settings is None else settings.topic_scheme
    if topic_object is not None:
        topic_filter = topic_of(client, qm, topic_object, topic_filter)
    # with a scheme given, bad input is refused before Redis is asked anything
    scheme_name = scheme or recorded_scheme(client, qm)
    share, inner = _parse_filter(topic_filter, scheme_name, limits.topic_bytes, limits.topic_levels)
    selector = selector if selector and selector.strip() else ""  # blank: no selector (Jakarta Messaging)
    if selector:
        check_size(selector, limits.selector_bytes)
        compile_selector(selector)
    check_name("client id", client_id)
    if share:
        check_name("ShareName", share)
        shared = True
    name = durable_name if durable_name is not None else name or _generated_name(shared, inner, selector)
    check_name("subscription name", name)
    if scheme is not None:
        recorded_scheme(client, qm, scheme)  # records it, or refuses a process configured otherwise
    sub_id = f"{share or client_id}${name}"
    mode = "shared" if shared else _mode_of(sub_id, consumer_modes, settings)
    record = SubscriptionRecord(
        sub_id, inner, durable_name is not None, clock.now_ms(), selector, no_local, mode, share
    )
    found: list[SubscriptionRecord] = []
    gets = NewSubscription(qm, sub_id, inner, scheme_name, selector, no_local, retained and not shared)

    def decide(pipe: Any) -> Any:  # a new subscription's retained publications read in the transaction
        return gets.prepare(pipe, _new_or_same(pipe, qm, record, scheme_name, limits.per_client, found))

    change_field(client, keys.subscriptions(qm), sub_id, decide, keys.version(qm), watch=(keys.topic_objects(qm),),
                 change_log=keys.sub_changes(qm), then=gets.push)  # fmt: skip
    return found[-1] if found else record


def _generated_name(shared: bool, topic_filter: str, selector: str) -> str:
    """The name of a subscription made without one: for a shared one, derived from its filter and
    selector (``_derived_name``); else ``nd-`` and 12 random hex digits (a non-durable subscription)."""
    return _derived_name(topic_filter, selector) if shared else "nd-" + uuid.uuid4().hex[:12]


def _new_or_same(
    pipe: Any, qm: str, record: SubscriptionRecord, scheme: str, max_per_client: int, found: list[Any]
) -> Any:
    """``subscribe``'s decision in its transaction (``change_field``): write ``record`` when its id
    is new, or attach to the stored subscription (appended to ``found``) when it has the same
    filter, selector, no-local and sharing.

    Args:
        pipe: the pipeline, ``{qm}:subs`` and ``{qm}:topics`` watched; reads execute at once.
        qm: the queue manager.
        record: the subscription asked for.
        scheme: the queue manager's topic scheme (for the topic objects' tree).
        max_per_client: ``subscribe``'s ``max_subscriptions_per_client`` (0: no limit).
        found: the stored record is appended to it when attaching.

    Returns:
        ``record`` as JSON to write, or ``KEEP`` to write nothing (attaching).

    Raises:
        SubscriptionRefused, TooManySubscriptions, SubscriptionConflict, CorruptRecord: as ``subscribe``.
    """
    subs_key, sub_id = keys.subscriptions(qm), record.sub_id
    existing = pipe.hget(subs_key, sub_id)
    if existing is None:
        tree = TopicTree.parse(qm, read_hash(pipe, keys.topic_objects(qm)), separator(scheme))
        _check_topic_tree(qm, tree, record)
        owner = sub_id.partition("$")[0]
        if max_per_client and _count_of(pipe, subs_key, owner, max_per_client):
            raise TooManySubscriptions(owner, max_per_client)
        return record.to_json()
    try:
        old = SubscriptionRecord.from_json(sub_id, existing, qm)
    except CorruptRecord as exc:
        raise CorruptRecord(exc.key, sub_id, f"{exc.reason}; unsubscribe it first") from exc
    for what, was, now in (
        ("filter", old.shown_filter, record.shown_filter),
        ("selector", old.selector, record.selector),
        ("no-local", old.no_local, record.no_local),
        ("shared", old.mode == "shared", record.mode == "shared"),
    ):
        if was != now:
            raise SubscriptionConflict(
                f"subscription {sub_id!r} exists with {what} {was!r}, not {now!r}; unsubscribe it first"
            )
    found.append(old)
    return KEEP  # attach to it: nothing to write


#: Hash fields looked at per HSCAN call when counting a client id's subscriptions.
_COUNT_SCAN = 10_000


def _count_of(pipe: Any, subs_key: str, owner: str, limit: int) -> bool:
    """Whether ``owner`` (the part of a subscription id before ``$``) has ``limit`` subscriptions or more.

    Read through ``pipe`` while ``{qm}:subs`` is watched, so the count holds until the
    transaction writes. Free while the hash has fewer than ``limit`` fields; otherwise one
    HSCAN over it (MATCH ``<owner>$*``: client ids hold no glob character), stopping at ``limit``.
    """
    if int(pipe.hlen(subs_key)) < limit:
        return False
    found: set[Any] = set()  # HSCAN may return a field twice
    cursor = 0
    while True:
        cursor, page = pipe.hscan(subs_key, cursor, match=f"{owner}$*", count=_COUNT_SCAN)
        found.update(page)
        if len(found) >= limit:
            return True
        if not int(cursor):
            return False


def _parse_filter(topic_filter: str, scheme: str, max_bytes: int, max_levels: int) -> tuple[str, str]:
    """``(ShareName, filter)`` of a subscription's filter under ``scheme``, checked: the broker's
    limits first (``max_topic_bytes``, at most MQTT's 65,535 bytes, is the one in force, and
    the one an error names), then the scheme's rules.

    Raises:
        InvalidTopicFilter: the filter is over ``max_bytes`` or ``max_levels``, or invalid under
            ``scheme``.
    """
    share, inner = ("", topic_filter) if scheme == "swiftmq" else split_shared(topic_filter)
    over = limit_problem(inner, max_bytes, max_levels, separator(scheme))
    if over is not None:
        raise InvalidTopicFilter(topic_filter, over)
    if scheme == "swiftmq":
        return "", hierarchy.validate_filter(topic_filter)
    validate_filter(inner)
    return share, inner


def _check_topic_tree(qm: str, tree: TopicTree, record: SubscriptionRecord) -> None:
    """Refuse a new subscription under ``SUB(DISABLED)``, or a durable one under ``DURSUB(NO)``.

    The node is the filter up to its first wildcard level (``topic_objects.fixed_prefix``).
    """
    node = fixed_prefix(record.topic_filter, tree.separator)
    effective = tree.effective(node)
    if effective["sub"] == "DISABLED":
        name = effective.source["sub"]
        raise SubscriptionRefused(
            f"subscriptions under {node!r} are disabled: topic object {name!r} has SUB(DISABLED)", name
        )
    if record.durable and effective["dursub"] == "NO":
        name = effective.source["dursub"]
        raise SubscriptionRefused(
            f"durable subscriptions under {node!r} are not allowed: topic object {name!r} has DURSUB(NO)",
            name,
        )


@dataclass(frozen=True, slots=True)
class _Limits:
    """``subscribe``'s limits: each keyword argument given, else the settings', else the default."""

    topic_bytes: int
    topic_levels: int
    per_client: int
    selector_bytes: int

    @classmethod
    def of(cls, settings: Settings | None, *given: int | None) -> _Limits:
        found = (
            (
                settings.max_topic_bytes,
                settings.max_topic_levels,
                settings.max_subscriptions_per_client,
                settings.max_selector_bytes,
            )
            if settings is not None
            else (
                DEFAULT_MAX_TOPIC_BYTES,
                DEFAULT_MAX_TOPIC_LEVELS,
                DEFAULT_MAX_SUBSCRIPTIONS_PER_CLIENT,
                DEFAULT_MAX_SELECTOR_BYTES,
            )
        )
        return cls(*(found[i] if value is None else value for i, value in enumerate(given)))


def _mode_of(sub_id: str, rules: Sequence[ConsumerMode] | None, settings: Settings | None) -> str:
    """The consumer mode of a new subscription that is not shared: the first of ``rules`` (given)
    or of the settings' queue controllers whose predicate matches ``sub_id``, else exclusive."""
    controllers: list[QueueController]
    if rules is not None:
        controllers = [QueueController(predicate=r.predicate, consumer_mode=r.mode) for r in rules]
    else:
        controllers = settings.controllers if settings is not None else []
    controller = first_controller(controllers, sub_id)
    return controller.consumer_mode if controller is not None else "exclusive"


@translate_errors
def unsubscribe(client: redis.Redis, qm: str, sub_id: str) -> None:
    """Delete a subscription with its queue, bell, consumers and their in-flight lists, in one atomic call.

    Also removes a record that cannot be read. A worker that resolved a topic
    before the removal delivers nothing to it (``commit.lua`` checks that the
    subscription still exists), so its queue is never made again.

    Raises:
        NoSuchSubscription: there is no such subscription.
    """
    missing = NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {qm!r}")
    if not can_name(sub_id):
        raise missing
    try:
        check_sub_id(sub_id)
    except InvalidName:
        # A record written by hand, or no record: with a ':' in the id, its keys would be other
        # subscriptions' ("a$b:p3" names "{qm}:sub:a$b:p3", the priority 3 band of "a$b"), so
        # only the record is removed; without one, nothing.
        subs_key = keys.subscriptions(qm)

        def decide(pipe: Any) -> None:
            if not pipe.hexists(subs_key, sub_id):
                raise missing
            return

        if ":" in sub_id:
            change_field(client, subs_key, sub_id, decide, keys.version(qm), change_log=keys.sub_changes(qm))
            return
        if not client.hexists(subs_key, sub_id):
            raise missing from None
    if not remove_subscription(client, qm, sub_id):
        raise missing


@dataclass(frozen=True)
class Removal:
    """What ``remove_subscription`` did; true when a record was removed.

    Attributes:
        removed: a subscription record was removed.
        messages: the messages deleted with it (waiting in its bands and in its consumers'
            in-flight lists); when nothing was removed, those waiting in its bands.
    """

    removed: bool
    messages: int = 0

    def __bool__(self) -> bool:
        return self.removed


def remove_subscription(
    client: redis.Redis,
    qm: str,
    sub_id: str,
    abandoned_before_ms: int | None = None,
    min_depth: int | None = None,
    *,
    durable: bool = False,
) -> Removal:
    """Run ``remove_subscription.lua``: remove the subscription and every key it owns.

    Args:
        abandoned_before_ms: only remove an abandoned subscription: a non-durable one whose
            consumers' lease deadlines and creation are all before this time, ms since the
            epoch, or with ``durable`` a durable one whose lease deadlines, creation and
            last use (``keys.sub_last_active``, or protocol 5's ``{qm}:last_active``) are (an
            idle durable subscription). Its poison messages are kept (``broker dlq``).
        min_depth: only remove it while at least this many messages wait in its bands
            (a slow-subscriber condition that still holds), messages.
        durable: the cutoff applies to a durable subscription (and never removes a non-durable one).

    Returns:
        The ``Removal``: true when a record was removed, and how many messages went with it
        (waiting in every band and in flight).

    Raises:
        redis.ResponseError: ``BROKER foreign key`` when the subscription hash, the
            version or the consumers zset holds another type
            (nothing is removed).
    """
    script = register(client, "remove_subscription")
    removed, messages = script(
        keys=[
            keys.subscriptions(qm),
            keys.version(qm),
            keys.sub_consumers(qm, sub_id),
            keys.sub_bell(qm, sub_id),
            keys.sub_holder(qm, sub_id),
            keys.sub_redelivered(qm, sub_id),
            keys.sub_inflight(qm, sub_id),
            *keys.sub_bands(qm, sub_id),
            keys.last_active(qm),
            keys.sub_changes(qm),
            keys.sub_last_active(qm, sub_id),
            keys.sub_expired(qm, sub_id),
        ],
        args=[
            sub_id,
            keys.inflight_prefix(qm, sub_id),
            "" if abandoned_before_ms is None else abandoned_before_ms,
            "durable" if durable else "",
            "" if min_depth is None else min_depth,
            keys.SUB_CHANGES_MAX_LEN,
        ],
    )
    return Removal(bool(removed), int(messages))


@translate_errors
def list_subscriptions(client: redis.Redis, qm: str) -> list[SubscriptionRecord]:
    """Every subscription of the queue manager that can be read, sorted by id (see ``read_subscriptions``).

    Raises:
        ForeignKey: ``{qm}:subs`` holds another Redis type.
    """
    return read_subscriptions(client, qm)[0]


@translate_errors
def purge_subscription(client: redis.Redis, qm: str, sub_id: str) -> int:
    """Delete the messages waiting in a subscription's queue (every priority band), like RabbitMQ's
    queue purge: messages its consumers hold in flight stay, and so does the subscription.

    An operator's action (the management API, ``DELETE /api/subscriptions/<id>/contents``): two
    round trips, the bands' types first (nothing is deleted when one holds another type), then
    one MULTI that counts and deletes them.

    Returns:
        How many messages were deleted.

    Raises:
        NoSuchSubscription: there is no such subscription.
        ForeignKey: a band holds another Redis type (nothing is deleted).
    """
    if not can_name(sub_id) or not client.hexists(keys.subscriptions(qm), sub_id):
        raise NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {qm!r}")
    bands = keys.sub_bands(qm, sub_id)
    probe = client.pipeline(transaction=False)
    for band in bands:
        probe.type(band)
    for band, found in zip(bands, probe.execute(), strict=True):
        kind = wire.text(found)
        if kind not in ("none", "list"):
            raise ForeignKey(band, kind, "list")
    pipe = client.pipeline(transaction=True)
    for band in bands:
        pipe.llen(band)
    pipe.delete(*bands)
    return sum(int(n) for n in pipe.execute()[:-1])


def check_filter(topic_filter: str, scheme: str, settings: Settings | None = None) -> tuple[str, str]:
    """``(ShareName, filter)`` of a subscription's filter, checked as ``subscribe`` checks it, without
    Redis (the settings' ``max_topic_bytes`` and ``max_topic_levels``; the defaults when None).

    Raises:
        InvalidTopicFilter: the filter is over a limit, or invalid under ``scheme``.
    """
    limits = _Limits.of(settings, None, None, None, None)
    return _parse_filter(topic_filter, scheme, limits.topic_bytes, limits.topic_levels)


def check_topic_tree(qm: str, tree: TopicTree, record: SubscriptionRecord) -> None:
    """Whether the topic objects of ``tree`` allow ``record`` as a new subscription (``subscribe``'s
    check, for a caller that checks many before writing any: ``broker.operations.definitions``).

    Raises:
        SubscriptionRefused: ``SUB(DISABLED)`` above its filter, or ``DURSUB(NO)`` for a durable one.
    """
    _check_topic_tree(qm, tree, record)
