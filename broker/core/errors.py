"""Every error the broker raises, under one base class.

Each error says when it is raised and carries the data a caller needs (the
offending topic, a suggested correction, the cycle a link would close). Each
has an ``exit_code`` that the command line uses (click's
``ClickException.exit_code`` convention): 1 for a generic failure, 2 for bad
input, 3 for a broker-side refusal (a limit against abuse among them), 4 for a
lost or unreachable server, 5 for a full server (out of memory: nothing was
written, retry once memory is freed).

Errors from redis-py are translated at the boundary, here and only here (``redis_error``,
the ``translate_errors`` decorator; ``script_error`` for a script's own
replies), so that callers never need to import redis-py's exception types.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import redis
from redis.exceptions import RedisClusterException, SlotNotCoveredError

#: Most characters of user input (a topic, a filter) echoed in an error message.
ECHO_CHARS = 80


def shown(text: str | None) -> str:
    """``text`` as an error message quotes it: ``repr``, cut to ``ECHO_CHARS`` with its size when longer."""
    if text is None:
        return "None"
    if len(text) <= ECHO_CHARS:
        return repr(text)
    try:
        size = len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte ("\ud800")
        size = len(text.encode("utf-8", "surrogatepass"))
    return f"{text[:ECHO_CHARS]!r}... ({size} bytes)"


class BrokerError(Exception):
    """Base class of every error the broker raises on purpose."""

    exit_code = 1


class ConfigError(BrokerError, ValueError):
    """A configuration file or ``BROKER_*`` environment variable is invalid.

    Raised at start-up by ``broker.core.config.load_settings``; the message names the
    file and the field.
    """

    exit_code = 2


class InvalidTopic(BrokerError, ValueError):
    """A topic string (the name a publication is published on) is invalid.

    Rules are MQTT 5 §4.7: at least one character, at most 65,535 bytes of
    UTF-8, no U+0000, and no wildcard character (``+`` or ``#``) anywhere.

    Attributes:
        topic: the rejected topic string.
        reason: why it was rejected, one short sentence.
        suggestion: a corrected topic string the publisher could use instead,
            or None when none can be proposed (seed 001: "informing the
            publisher about the incorrectness and how the topic can be
            amended").
    """

    exit_code = 2

    def __init__(self, topic: str, reason: str, suggestion: str | None = None) -> None:
        self.topic = topic
        self.reason = reason
        self.suggestion = suggestion
        text = f"invalid topic {shown(topic)}: {reason}"
        if suggestion is not None:
            text += f" (did you mean {shown(suggestion)}?)"
        super().__init__(text)


class InvalidSelector(BrokerError, ValueError):
    """A message selector (Jakarta Messaging 3.1 §3.8.1.1) is invalid.

    Raised by ``broker.core.selectors.compile_selector`` and ``broker.core.selectors.select``
    for a syntax error or a type error found when the selector is parsed, and by
    ``broker.core.selectors.like`` for an invalid LIKE pattern or escape character
    (then ``selector`` holds the pattern).

    Attributes:
        selector: the rejected selector (or LIKE pattern).
        position: the 0-based character offset in ``selector`` where the error
            was found; ``len(selector)`` when the selector ended too early.
        reason: what is wrong there, one short phrase.

    ``what`` names the text in the message when it is not a selector (a Delete
    Durable job's "client id predicate").
    """

    exit_code = 2

    def __init__(self, selector: str, position: int, reason: str, what: str = "selector") -> None:
        self.selector = selector
        self.position = position
        self.reason = reason
        super().__init__(f"invalid {what} {shown(selector)} at position {position}: {reason}")


class SelectorTooComplex(InvalidSelector):
    """A message selector is over one of the broker's bounds on the work it may cost.

    A subscription's selector is evaluated for every publication its filter matches, so its
    size bounds what one subscription adds to each of them (a 768 KB selector of 60,000
    comparisons added 23 ms to every matching publication). Raised by
    ``broker.core.selectors.compile_selector`` (the number of terms, tokens and the nesting, fixed
    in ``broker.core.selectors``) and ``broker.core.selectors.check_size`` (``Settings.max_selector_bytes``)
    when a subscription is made; the routing table skips a stored record over them (a
    ``CorruptRecord`` that ``broker status`` names).

    Attributes:
        limit: the name of the bound (``max_selector_bytes``, ``MAX_TERMS``, ``MAX_TOKENS``,
            ``MAX_DEPTH``, ``MAX_PARENS``).
        maximum: its value.
        found: what the selector has: its size in bytes, its depth, or the count at which
            parsing stopped, past ``maximum`` (a selector is not parsed further).
    """

    exit_code = 2

    def __init__(
        self, selector: str, position: int, limit: str, maximum: int, found: int, reason: str
    ) -> None:
        self.limit = limit
        self.maximum = maximum
        self.found = found
        super().__init__(selector, position, reason)


class InvalidTopicFilter(BrokerError, ValueError):
    """A topic filter (what a subscription names) is invalid.

    Rules are MQTT 5 §4.7.1: ``#`` only as the whole last level, ``+`` only as a
    whole level, at least one character, at most 65,535 bytes, no U+0000.

    Attributes:
        topic_filter: the rejected filter.
        reason: why it was rejected.
    """

    exit_code = 2

    def __init__(self, topic_filter: str, reason: str) -> None:
        self.topic_filter = topic_filter
        self.reason = reason
        super().__init__(f"invalid topic filter {shown(topic_filter)}: {reason}")


class LinkCycle(BrokerError, ValueError):
    """A link from ``source`` to ``target`` would close a cycle of links.

    Raised by ``broker.topics.links.link`` unless the link is requested as a backward
    link (seed 000: "unless the backwards link is explicitly requested ... the
    cyclic dependency checking is performed at link time").

    Attributes:
        source: the link's source topic.
        target: the link's target topic.
        path: the existing chain of links from ``target`` back to ``source``,
            both ends included.
    """

    exit_code = 2

    def __init__(self, source: str, target: str, path: list[str]) -> None:
        self.source = source
        self.target = target
        self.path = path
        chain = " -> ".join(path)
        super().__init__(
            f"linking {source!r} -> {target!r} would close a cycle ({source} -> {chain}); "
            "request it as a backward link to allow it"
        )


class InvalidLink(BrokerError, ValueError):
    """A link request is malformed: a topic is invalid, or source equals target."""

    exit_code = 2


class NoSuchLink(BrokerError, LookupError):
    """``unlink`` named a link that does not exist."""

    exit_code = 2


class NoSuchTopic(BrokerError, LookupError):
    """``broker topic undeclare`` names a topic that is not declared (``broker.topics.declared``)."""

    exit_code = 2


class NoSuchSubscription(BrokerError, LookupError):
    """A subscription id names no subscription of this queue manager."""

    exit_code = 2


class SubscriptionConflict(BrokerError, ValueError):
    """A durable subscription exists already with a different topic filter.

    Jakarta Messaging §6.11.1: re-subscribing with the same name and a different
    topic is an unsubscribe followed by a new subscribe; we refuse it instead
    and ask for an explicit ``unsubscribe`` so no message is dropped by accident.
    """

    exit_code = 2


class TooManySubscriptions(BrokerError):
    """A new subscription is refused: its client id has ``max_subscriptions_per_client`` already.

    Counted in the same transaction that would write it (``broker.topics.subscriptions.subscribe``),
    so concurrent subscribes of one client id never go over the limit. Attaching to an
    existing subscription is never refused.

    Attributes:
        client_id: the client id (for a ``$share/<ShareName>/`` subscription, the ShareName).
        limit: the setting's value.
    """

    exit_code = 3

    def __init__(self, client_id: str, limit: int) -> None:
        self.client_id = client_id
        self.limit = limit
        super().__init__(
            f"client id {client_id!r} has {limit} subscription{'' if limit == 1 else 's'} already, the most allowed "
            f"(max_subscriptions_per_client); unsubscribe one first"
        )


class TooManyConsumers(BrokerError):
    """A consumer is refused: its subscription has ``max_consumers_per_subscription`` live ones.

    Checked by ``receive.lua`` before it writes anything, in the same atomic call that
    would register the consumer; a consumer already attached is never refused.

    Attributes:
        sub_id: the subscription.
        limit: the setting's value.
    """

    exit_code = 3

    def __init__(self, sub_id: str, limit: int) -> None:
        self.sub_id = sub_id
        self.limit = limit
        super().__init__(
            f"subscription {sub_id!r} has {limit} live consumer{'' if limit == 1 else 's'} already, the most allowed "
            f"(max_consumers_per_subscription); close one, or wait for a dead one's lease to run out"
        )


class ConsumerConflict(BrokerError):
    """A second consumer tried to attach to an exclusive subscription that has a live one.

    Jakarta Messaging 3.1 §6.11.1: an unshared durable subscription has at most
    one active consumer. Make the subscription shared, or give it the
    ``activestandby`` consumer mode so that the second consumer waits.

    Attributes:
        sub_id: the subscription.
        holder: the consumer id that holds it.
    """

    exit_code = 3

    def __init__(self, sub_id: str, holder: str) -> None:
        self.sub_id = sub_id
        self.holder = holder
        super().__init__(
            f"subscription {sub_id!r} is exclusive and consumer {holder!r} is attached to it; "
            "make it shared or activestandby (consumer_modes) to have more consumers"
        )


class NoSuchTopicObject(BrokerError):
    """No topic object of that name (``broker topic alter/delete/display``, ``--topic-object``)."""

    exit_code = 2


class TopicObjectConflict(BrokerError, ValueError):
    """A topic object cannot be defined or changed that way: it exists already, its topic string
    would change (IBM MQ: delete and define again), another object has that topic string, or it is
    ``SYSTEM.BASE.TOPIC`` (which always exists and cannot be deleted)."""

    exit_code = 2


class SubscriptionRefused(BrokerError):
    """A subscription is refused by the topic tree: ``SUB(DISABLED)`` or, for a durable one,
    ``DURSUB(NO)`` on the closest topic object at or above the filter (IBM MQ).

    Attributes:
        topic_object: the object whose attribute refused it.
    """

    exit_code = 3

    def __init__(self, reason: str, topic_object: str) -> None:
        self.topic_object = topic_object
        super().__init__(reason)


class InvalidMessage(BrokerError, ValueError):
    """A publication is malformed: a missing or badly typed field, or a body too large."""

    exit_code = 2


class PublicationRefused(BrokerError):
    """The broker refused a publication the publisher waited for.

    Attributes:
        reason: the broker's reason.
        suggestion: a corrected topic, when the topic was invalid.
    """

    exit_code = 3

    def __init__(self, reason: str, suggestion: str | None = None) -> None:
        self.reason = reason
        self.suggestion = suggestion
        text = f"publication refused: {reason if len(reason) <= 4 * ECHO_CHARS else reason[: 4 * ECHO_CHARS] + '...'}"
        if suggestion is not None:
            text += f" (did you mean {shown(suggestion)}?)"
        super().__init__(text)


class ReplyTimeout(BrokerError, TimeoutError):
    """A publisher waited for its publication's result longer than it asked to."""

    exit_code = 3


class BacklogTimeout(ReplyTimeout):
    """A bulk publisher waited for room under the flow-control backlog limit longer than allowed.

    Raised by ``broker.core.flow.wait_for_room``.
    """

    exit_code = 3


class ConnectionLost(BrokerError):
    """The Redis server could not be reached, or the connection broke mid-call."""

    exit_code = 4


class ServerError(BrokerError):
    """The Redis server answered with an error the broker cannot handle (OOM, wrong version)."""

    exit_code = 4


class ServerFull(ServerError):
    """The Redis server is out of memory: its ``maxmemory`` is reached and it refuses writes
    (``maxmemory-policy noeviction``: it never evicts a queue or a lock to make room).

    Nothing was written by the refused command or script: a publication refused this way
    is not in the stream (publish it again, with the same msgid), and a unit of work is
    never half-applied (``broker/lua/lib.lua``). Workers pause and retry until memory is
    freed; consumers go on receiving and acknowledging, which frees it.

    Attributes:
        what: what was refused, a few words ("publication of message m-1").
        accepted: for ``Publisher.publish_many``, the results of the publications that were
            written before (or around) the refused ones; empty otherwise.
    """

    exit_code = 5

    def __init__(self, what: str, detail: str = "") -> None:
        self.what = what
        self.accepted: list[Any] = []
        detail = detail.rpartition("caused error: ")[2]  # redis-py's "Command # 1 (...) of pipeline ..."
        text = (
            f"{what} refused: the Redis server is full (used memory is above its maxmemory) and "
            "refuses new writes; nothing was written. Retry once memory is freed (consume or "
            "delete subscriber queues, trim the publish stream, or raise maxmemory)"
        )
        super().__init__(f"{text} [{detail}]" if detail else text)


class ClusterUnsupported(BrokerError):
    """An operation that cannot run on a Redis Cluster client (``redis+cluster://``).

    Raised by the operations that must see every key of a server (resetting a
    queue manager by ``SCAN``, starting the embedded server for a cluster URL)
    or that reach keys of several queue managers (hence several slots) in one
    atomic step. The hot path (publish, dequeue, unit of work, consume) never
    raises it: every key of one queue manager shares its ``{qm}`` hash slot.

    Attributes:
        operation: what was attempted, a few words.
    """

    exit_code = 2

    def __init__(self, operation: str, why: str) -> None:
        self.operation = operation
        super().__init__(f"{operation} is not supported on a Redis Cluster: {why}")


class WorkerPoolFailed(BrokerError):
    """Worker processes keep dying (more than 30 restarts a minute); the pool gives up."""

    exit_code = 1


class DemoError(BrokerError):
    """``broker demo`` could not run: the data set is missing, or the workers stalled."""

    exit_code = 1


class ServerNotFound(BrokerError):
    """No redis-server / valkey-server binary could be found to start."""

    exit_code = 4


class LibraryMissing(ServerError):
    """The server has no ``broker`` function library (``FCALL`` answered "Function not found").

    The workers and ``broker server`` load it when they start (``broker.core.library``); a
    consumer whose ACL user may load functions (worker, admin) loads it itself, a
    ``subscriber`` may not and gets this error. Raised by every consumer operation.
    """

    exit_code = 4

    def __init__(self, detail: str = "") -> None:
        super().__init__(
            "the server has no broker function library (Function not found): start a worker "
            "(broker worker) or the server (broker server), which load it"
            + (f" ({detail})" if detail else "")
        )


class ForeignKey(BrokerError):
    """A key the broker owns holds a value of another Redis type (a foreign key).

    Something other than the broker wrote it (``SET '{QM1}:sub:app$x' oops``).
    The broker never writes over it and never fails halfway because of it
    (DESIGN.md, "MULTI/EXEC does not roll back"): a publication that would
    have to write to it is refused as a whole with this error's message as
    the reason, and a queue-manager-wide key (the publish stream, the
    subscription hash) stops the workers until an operator removes it. A
    subscriber queue of another type is the exception (a subscriber's own key,
    issue 27): it makes only its subscription unavailable (``commit.lua``).

    Attributes:
        key: the key's name.
        found: the Redis type it holds (``TYPE``), e.g. "string".
        expected: the type the broker keeps there, e.g. "list".
    """

    exit_code = 3

    def __init__(self, key: str, found: str, expected: str) -> None:
        self.key = key
        self.found = found
        self.expected = expected
        super().__init__(f"foreign key: {key} holds a {found}, not a {expected}")


class CorruptRecord(BrokerError, ValueError):
    """A record the broker stored (a subscription or a link) cannot be read back.

    The workers skip such a record (it matches nothing) and report it; ``broker
    status``, ``broker links`` and ``broker topics`` name it.

    Attributes:
        key: the hash holding it, e.g. ``{QM1}:links``.
        field: the hash field (a subscription id or a link's source topic).
        reason: why it cannot be read.
    """

    exit_code = 3

    def __init__(self, key: str, field: str, reason: str) -> None:
        self.key = key
        self.field = field
        self.reason = reason
        super().__init__(f"corrupt record {field!r} in {key}: {reason}")


class InvalidName(BrokerError, ValueError):
    """A client id, subscription name or subscription id is outside its alphabet or length.

    Client ids and durable subscription names are 1-128 characters of
    ``A-Za-z0-9_.-``; a subscription id is ``<client id>$<name>``.
    """

    exit_code = 2


class PublisherIdBound(BrokerError, ValueError):
    """A publisher id is bound to another principal already (``broker acl add USER --role publisher
    --publisher-id ID``, ``broker.core.principals.bind``): one publisher id has one principal, or
    its per-publisher order and its results would belong to two users. Nothing was changed;
    ``--move`` (``move=True``) moves the id instead.

    Attributes:
        principal: the principal the ids were asked for.
        holders: ``{other principal: [its publisher ids among those asked for]}``.
    """

    exit_code = 2

    def __init__(self, principal: str, holders: dict[str, list[str]]) -> None:
        self.principal = principal
        self.holders = holders
        taken = "; ".join(f"{', '.join(ids)} to {holder}" for holder, ids in sorted(holders.items()))
        super().__init__(
            f"publisher id already bound: {taken}; a publisher id has one principal. Give "
            f"{principal} other ids, or add it with --move to move them from "
            f"{', '.join(sorted(holders))} to {principal}"
        )


class InvalidSchedule(BrokerError, ValueError):
    """A scheduled job cannot be made that way: an unknown job, a cron expression that is
    not five valid fields (or never fires), or a missing job parameter.

    Raised by ``broker.operations.schedules.add_schedule`` before anything is stored.
    """

    exit_code = 2


class NoSuchSchedule(BrokerError, LookupError):
    """A schedule id names no scheduled job of this queue manager (``broker jobs cancel``)."""

    exit_code = 2


class LoginRefused(BrokerError):
    """A web console login (``broker.operations.console.auth``) is refused: a wrong user name or password,
    or a user whose role (in ``{qm}:acl``) is neither ``monitor`` nor ``admin``.

    The message never says which of these it was.
    """

    exit_code = 3


class DeadLetterNotFound(BrokerError, LookupError):
    """A dead-letter id names no entry of the dead-letter queue ``{qm}:dlq`` (``broker dlq show``),
    or is not a stream entry id (``<ms>-<n>``).

    Attributes:
        dlq_id: the id asked for.
    """

    exit_code = 2

    def __init__(self, dlq_id: str, why: str = "no such dead letter") -> None:
        self.dlq_id = dlq_id
        super().__init__(f"{why}: {shown(dlq_id)}")


class EmptySelection(BrokerError, ValueError):
    """``broker dlq replay`` or ``purge`` (``broker.operations.dead_letters``) was given no dead-letter ids, no
    filter and not ``--all``: nothing is replayed or deleted."""

    exit_code = 2


class MetricsUnavailable(BrokerError):
    """The metrics server cannot listen on ``metrics_host:metrics_port`` (the port is taken, or
    the address is not this machine's): ``broker worker`` with ``metrics_port`` set, ``broker metrics``."""

    exit_code = 2


class RepairRefused(BrokerError):
    """``broker repair stream`` checked the publish stream and wrote nothing (``broker.operations.repair``).

    Raised for a foreign key (the stream, ``{qm}:publishers``), a missing consumer group
    (which entries were handled is unknown), more entries to move than ``max_entries``, or
    an entry with more fields than one ``XADD`` takes. The message says which, and what to do.
    """

    exit_code = 3


class NotAuthorized(BrokerError):
    """A user's grants (``broker acl grant``, ``broker.topics.grants``) do not cover what it asked:
    a subscription requested on a filter none of its subscribe grants covers. (A publication
    outside its publish grants is refused by the workers and dead-lettered: ``PublicationRefused``.)"""

    exit_code = 3


class InvalidDefinitions(BrokerError, ValueError):
    """A definitions document (``broker definitions import``, ``POST /api/definitions``;
    ``broker.operations.definitions``) is refused before anything is written: not JSON, a field
    of the wrong shape, an invalid filter, topic, name or attribute, a link cycle, or an
    object that exists here with other settings. The message names the entry and the reason.

    Attributes:
        where: the entry, e.g. ``subscriptions[2].filter``.
        conflict: the entry is valid but conflicts with what the queue manager holds (HTTP 409).
    """

    exit_code = 2

    def __init__(self, where: str, reason: str, conflict: bool = False) -> None:
        self.where = where
        self.conflict = conflict
        super().__init__(f"definitions refused, nothing was written: {where}: {reason}")


class UsersNeedOperator(BrokerError):
    """A definitions document names users this queue manager lacks, and the caller's Redis user
    may not make or look up ACL users (``ACL GETUSER`` / ``SETUSER`` are ``@admin``: the broker's
    admin role lacks them; an operator's own user has them). Raised before anything is written;
    ``broker definitions import --skip-users`` (``POST /api/definitions?skip_users=true``) imports
    the rest. HTTP 403, exit code 3.

    Attributes:
        commands: per user, the ``broker acl add`` command an operator runs to make it.
    """

    exit_code = 3

    def __init__(self, commands: dict[str, str]) -> None:
        self.commands = commands
        made = "; ".join(commands.values())
        super().__init__(
            f"definitions refused, nothing was written: the document names {len(commands)} user(s) this "
            f"queue manager lacks ({', '.join(commands)}), and this Redis user may not make ACL users. "
            f"Make them as an operator ({made}) and import again, or import the rest with --skip-users "
            "(API: POST /api/definitions?skip_users=true)"
        )


class NoSuchGrant(BrokerError, LookupError):
    """``broker acl revoke`` named a grant the user does not have; nothing was changed."""

    exit_code = 2


class RequestRefused(BrokerError):
    """The broker answered a control request (``broker.clients.control``) with an error.

    Attributes:
        kind: the name of the error the broker raised (``NotAuthorized``, ``InvalidTopicFilter``...).
        exit_code: that error's exit code (3 when the answer names none).
    """

    def __init__(self, message: str, kind: str = "", exit_code: int = 3) -> None:
        self.kind = kind
        self.exit_code = exit_code
        super().__init__(message)


# --- translating redis-py's errors: the one place ---------------------------------------------

#: A script's foreign-key error reply (``require_types`` in ``lua/lib.lua``); the server may
#: append " script: <sha>, on @user_script:<line>." to it.
_FOREIGN_KEY = re.compile(
    r"^BROKER foreign key: (?P<key>.*) holds a (?P<found>\w+), not a (?P<expected>\w+)(?: script: .*)?$", re.S
)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def script_error(exc: BaseException, what: str) -> BaseException:
    """The broker error a script's error reply stands for, or ``exc`` itself.

    Args:
        exc: what redis-py raised, or left in a pipeline's results, for one script call.
        what: what was refused, a few words (``ServerFull.what``), e.g. "unit of work".

    Returns:
        ``ForeignKey`` (a queue-manager-wide key holds another Redis type; nothing was
        written), ``ServerFull`` (``maxmemory`` reached; nothing was written),
        ``LibraryMissing`` (an ``FCALL`` of the ``broker`` library, which is not loaded) or ``exc``.
    """
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return ServerFull(what, str(exc))
    if isinstance(exc, redis.ResponseError):
        found = _FOREIGN_KEY.match(str(exc))
        if found:
            return ForeignKey(found["key"], found["found"], found["expected"])
        if "function not found" in str(exc).lower():
            return LibraryMissing()
    return exc


def redis_error(exc: BaseException, what: str) -> BaseException:
    """The broker error a redis-py exception stands for at the library's boundary, or ``exc``.

    ``redis.ConnectionError`` and ``redis.TimeoutError`` become ``ConnectionLost``; an
    out-of-memory reply (the server's ``maxmemory`` is reached) ``ServerFull``; any other
    ``redis.RedisError`` (an error reply: a wrong type) ``ServerError``. On a cluster client, a
    slot no master serves (a cluster partly down: redis-py's ``SlotNotCoveredError``) becomes
    ``ConnectionLost``, any other of redis-py's cluster errors (keys of several slots in one
    transaction) ``ServerError``. The broker's own errors, and anything else, are ``exc``.

    Args:
        exc: what redis-py raised.
        what: what was refused, a few words (``ServerFull.what``).
    """
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, SlotNotCoveredError)):
        return ConnectionLost(f"cannot reach Redis: {exc}")
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return ServerFull(what, str(exc))
    if isinstance(exc, (redis.RedisError, RedisClusterException)):
        return ServerError(f"Redis answered with an error: {exc}")
    return exc


def translate_errors(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a public entry point so that callers never see redis-py's exceptions
    (``redis_error``; ``what`` is the function's name in words)."""
    what = func.__name__.replace("_", " ")

    @functools.wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return func(*args, **kwargs)
        except (redis.RedisError, RedisClusterException) as exc:
            raise redis_error(exc, what) from exc

    return wrapper


class ClusterError(RuntimeError):
    """The local cluster (``broker.demo.local_cluster``: the federated demo, the tests, the chaos
    harness) could not be created or did not become ready in time."""


class InjectedFailure(RuntimeError):
    """Raised on purpose by a partition (``fail_partition``) to exercise Spark's task retry
    (``broker.pipeline.publish``)."""
