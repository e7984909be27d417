"""Administrative topic objects: names bound to topic strings, with attributes inherited down the tree.

IBM MQ's topic space (seed 002): a topic exists dynamically, when someone
publishes or subscribes, or administratively as a **topic object**, a name (up
to 48 characters) bound to a topic string and carrying attributes. Each
attribute is a value or ``ASPARENT``; the *effective* value at a topic string
comes from the closest topic object at or above it (walking up ``/`` levels),
up to ``SYSTEM.BASE.TOPIC``, whose topic string is empty, which always exists,
cannot be deleted and holds the defaults.

Objects live in the hash ``{qm}:topics`` (name -> JSON, ``broker.core.keys``); every
change bumps ``{qm}:version`` in the same transaction, so a worker applies a
change to every publication enqueued after it (the routing table reloads with
the version it dequeues with, as for subscriptions).

Where each attribute is enforced:

==========  ============================  ============================================
attribute   values                        enforced
==========  ============================  ============================================
PUB         ENABLED | DISABLED            worker: a publication under a disabled node is
                                          refused, with the object named in the reason
SUB         ENABLED | DISABLED            ``subscribe``: refused (``SubscriptionRefused``)
DURSUB      YES | NO                      ``subscribe``: a durable subscription refused
DEFPSIST    YES | NO                      worker: persistence of a publication that says none
DEFPRTY     0-9                           worker: priority of a publication that says none
CAPEXPRY    ms | NOLIMIT                  worker: expiration capped at publish time + cap
MAXDEPTH    messages | NOLIMIT            commit.lua: depth bound of the subscriber queues
                                          of subscriptions made under the node; NOLIMIT at
                                          the base is ``Settings.default_maxdepth`` when set
PMSGDLV     ALL | ALLDUR | ALLAVAIL       commit.lua: persistent publications when a queue is
                                          full or unavailable (holds another type)
NPMSGDLV    ALL | ALLDUR | ALLAVAIL       commit.lua: the same, non-persistent publications
USEDLQ      YES | NO                      commit.lua: whether a refused publication is dead-lettered
WILDCARD    PASSTHRU | BLOCK              worker: wildcard subscriptions above the node
                                          get nothing at or below it (not inherited)
PUBSCOPE    QMGR | ALL                    worker: a publication made here under QMGR is not
                                          forwarded to other queue managers (``broker.topics.topology``)
SUBSCOPE    QMGR | ALL                    channel process: a subscription made under QMGR is
                                          not announced to other queue managers
CLUSTER     a cluster name, "" for none   worker: topics under the node are cluster topics of
                                          that publish/subscribe cluster (route class)
CLROUTE     DIRECT | TOPICHOST            worker: cluster edges straight between members, or
                                          only through the topic hosts; not inherited
PROXYSUB    FIRSTUSE | FORCE              channel process: FORCE announces the node even with
                                          no subscription under it; not inherited
==========  ============================  ============================================

The defaults on ``SYSTEM.BASE.TOPIC`` keep the broker's behaviour without
objects: everything enabled, persistent, priority 4, no expiry cap, no depth
bound (so no queue is ever full), ``PMSGDLV(ALLAVAIL)`` and ``NPMSGDLV(ALLAVAIL)``,
dead letters on.

PMSGDLV/NPMSGDLV say what happens to a publication when one of its subscriptions is
*unavailable*: its queue full (MAXDEPTH) or of another Redis type (a key its subscriber
planted). ALL refuses the publication as a whole, ALLDUR when that subscription is
durable, ALLAVAIL delivers to the others (the unavailable one's copy is skipped; of
another type, dead-lettered). IBM MQ's base default is ``PMSGDLV(ALLDUR)``; ours is
ALLAVAIL because a subscriber, an untrusted role (``docs/security.md``), can make its
own durable subscription unavailable, and under ALLDUR would refuse every persistent
publication for everyone. ALL and ALLDUR stay settable per topic object (issue 27).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.core import clock, hierarchy, keys, wire
from broker.core.config import read_toml
from broker.core.connection import can_name, change_field, read_hash
from broker.core.errors import (
    ConfigError,
    CorruptRecord,
    InvalidName,
    NoSuchTopicObject,
    TopicObjectConflict,
    translate_errors,
)
from broker.core.schemes import recorded_scheme, separator
from broker.core.topic_rules import LEVEL_SEPARATOR, split_shared, validate_topic

#: The root topic object: topic string "", holds the defaults, cannot be deleted.
BASE = "SYSTEM.BASE.TOPIC"

#: Most characters of a topic object's name (IBM MQ: MQ_TOPIC_NAME_LENGTH).
MAX_NAME = 48

#: Topic object names: IBM MQ's object name characters.
_NAME = re.compile(r"^[A-Za-z0-9._/%]{1,48}$")

ASPARENT = "ASPARENT"
NOLIMIT = "NOLIMIT"

Switch = Literal["ENABLED", "DISABLED", "ASPARENT"]
YesNo = Literal["YES", "NO", "ASPARENT"]
Delivery = Literal["ALL", "ALLDUR", "ALLAVAIL", "ASPARENT"]
Scope = Literal["QMGR", "ALL", "ASPARENT"]


class Attributes(BaseModel):
    """The attributes of one topic object (see the module docstring for where each is enforced).

    ``ASPARENT`` (the default for inheritable ones) takes the value of the closest
    object above. Durations are in milliseconds, depths in messages.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pub: Switch = "ASPARENT"
    sub: Switch = "ASPARENT"
    dursub: YesNo = "ASPARENT"
    defpsist: YesNo = "ASPARENT"
    defprty: int | Literal["ASPARENT"] = Field(default="ASPARENT")
    capexpry: int | Literal["NOLIMIT", "ASPARENT"] = Field(default="ASPARENT")
    maxdepth: int | Literal["NOLIMIT", "ASPARENT"] = Field(default="ASPARENT")
    pmsgdlv: Delivery = "ASPARENT"
    npmsgdlv: Delivery = "ASPARENT"
    usedlq: YesNo = "ASPARENT"
    wildcard: Literal["PASSTHRU", "BLOCK"] = "PASSTHRU"
    pubscope: Scope = "ASPARENT"
    subscope: Scope = "ASPARENT"
    cluster: str = Field(default="ASPARENT", max_length=48)
    clroute: Literal["DIRECT", "TOPICHOST"] = "DIRECT"
    proxysub: Literal["FIRSTUSE", "FORCE"] = "FIRSTUSE"

    def model_post_init(self, context: Any) -> None:
        for name, low, high, words in (
            ("defprty", 0, 9, "or ASPARENT"),
            ("capexpry", 1, None, "ms, NOLIMIT or ASPARENT"),
            ("maxdepth", 0, None, "messages, NOLIMIT or ASPARENT"),
        ):
            value = getattr(self, name)
            if isinstance(value, int) and (value < low or (high is not None and value > high)):
                bound = f"{low}-{high}" if high is not None else f">= {low}"
                raise ValueError(f"{name.upper()} must be {bound} {words}, not {value}")


#: The attributes that ``ASPARENT`` can inherit (the others belong to one object).
INHERITED = (
    "pub",
    "sub",
    "dursub",
    "defpsist",
    "defprty",
    "capexpry",
    "maxdepth",
    "pmsgdlv",
    "npmsgdlv",
    "usedlq",
    "pubscope",
    "subscope",
    "cluster",
)

#: ``SYSTEM.BASE.TOPIC``'s values: the broker's behaviour without topic objects.
BASE_DEFAULTS = Attributes(
    pub="ENABLED",
    sub="ENABLED",
    dursub="YES",
    defpsist="YES",
    defprty=keys.DEFAULT_PRIORITY,
    capexpry="NOLIMIT",
    maxdepth="NOLIMIT",
    pmsgdlv="ALLAVAIL",
    npmsgdlv="ALLAVAIL",
    usedlq="YES",
    pubscope="ALL",
    subscope="ALL",
    cluster="",
)


class TopicObject(BaseModel):
    """A topic object as stored in ``{qm}:topics``.

    Attributes:
        name: 1-48 characters of ``A-Za-z0-9._/%``.
        topic_string: the topic string it is bound to ("" only for ``SYSTEM.BASE.TOPIC``).
        attributes: its attributes.
        description: free text.
        altered_ms: last change, ms since the epoch.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    topic_string: str
    attributes: Attributes = Field(default_factory=Attributes)
    description: str = ""
    altered_ms: int = 0

    def to_json(self) -> str:
        """The hash value: everything but the name, attributes left at their default left out."""
        data = self.model_dump(exclude={"name"}, exclude_defaults=True)
        data["topic_string"] = self.topic_string
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, raw: bytes | str, qm: str = "") -> TopicObject:
        """Parse a hash value.

        Raises:
            CorruptRecord: not JSON, an unknown attribute, a value out of range.
        """
        key = keys.topic_objects(qm) if qm else "{qm}:topics"
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls(name=name, **data)
        except (ValueError, TypeError, ValidationError) as exc:
            reason = "not JSON" if isinstance(exc, json.JSONDecodeError) else _first_error(exc)
            raise CorruptRecord(key, name, reason) from exc
        except RecursionError as exc:
            raise CorruptRecord(key, name, "not JSON (nested too deeply)") from exc


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return str(exc)


def check_name(name: str) -> None:
    """Raises InvalidName unless ``name`` is 1-48 characters of ``A-Za-z0-9._/%``."""
    if not _NAME.match(name):
        raise InvalidName(
            f"topic object name {name[:60]!r} must be 1-{MAX_NAME} characters of A-Z a-z 0-9 . _ / %"
        )


def parent_of(topic_string: str, separator: str = LEVEL_SEPARATOR) -> str | None:
    """The topic string one level up ("" above a one-level string), None above "".

    ``separator`` is the scheme's: ``/`` (mqtt) or ``.`` (swiftmq, where the levels are nodes).
    """
    if topic_string == "":
        return None
    head, sep, _ = topic_string.rpartition(separator)
    return head if sep else ""


def fixed_prefix(topic_filter: str, separator: str = LEVEL_SEPARATOR) -> str:
    """The topic string a subscription is made under: its filter up to the first wildcard level.

    ``/PAYMENTS/+/EU`` -> ``/PAYMENTS``; ``#`` -> ""; a ``$share/<name>/`` prefix is dropped.
    Under the swiftmq scheme (``separator`` ``.``): up to the first predicate node
    (``iit.%.US`` -> ``iit``).
    """
    if separator == hierarchy.SEPARATOR:
        nodes = []
        for node in topic_filter.split(separator):
            if hierarchy.is_predicate(node):
                break
            nodes.append(node)
        return separator.join(nodes)
    _, inner = split_shared(topic_filter)
    levels = []
    for level in inner.split(LEVEL_SEPARATOR):
        if level in ("+", "#"):
            break
        levels.append(level)
    return LEVEL_SEPARATOR.join(levels)


@dataclass(frozen=True)
class Effective:
    """The effective attributes at one topic string, and the object each value came from.

    Attributes:
        values: attribute -> effective value.
        source: attribute -> the name of the object that set it.
        blocks: depth (levels) of the deepest ``WILDCARD(BLOCK)`` object at or above
            the topic string, 0 when none: a wildcard subscription whose first
            wildcard level is above that depth gets nothing here.
        blocked_by: the name of that object, "" when none.
    """

    values: dict[str, Any]
    source: dict[str, str]
    blocks: int = 0
    blocked_by: str = ""

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def _levels(topic_string: str, separator: str) -> int:
    return len(topic_string.split(separator)) if topic_string else 0


@dataclass
class TopicTree:
    """Every topic object of a queue manager, by topic string, with the effective values cached.

    Attributes:
        objects: name -> object (``SYSTEM.BASE.TOPIC`` always present).
        problems: records that could not be read (they are skipped).
        separator: the level separator of the queue manager's topic scheme: ``/``, or ``.``
            under swiftmq, where attributes are inherited along dot nodes (``iit.sales.US``
            inherits from an object at ``iit.sales``, then ``iit``).
    """

    objects: dict[str, TopicObject] = field(default_factory=dict)
    problems: list[CorruptRecord] = field(default_factory=list)
    separator: str = LEVEL_SEPARATOR
    _by_string: dict[str, TopicObject] = field(default_factory=dict)
    _cache: dict[str, Effective] = field(default_factory=dict)

    @classmethod
    def parse(
        cls, qm: str, raw: dict[Any, Any], separator: str = LEVEL_SEPARATOR, default_maxdepth: int = 0
    ) -> TopicTree:
        """Build the tree from the ``{qm}:topics`` hash; unreadable records are kept in ``problems``.

        ``separator``: the topic scheme's (``broker.core.schemes.separator``). ``default_maxdepth``
        (``Settings.default_maxdepth``, messages; 0 for none): ``SYSTEM.BASE.TOPIC``'s MAXDEPTH
        when it says NOLIMIT, so that it bounds every queue no object below bounds otherwise.
        """
        tree = cls(separator=separator)
        for raw_name, value in raw.items():
            name = wire.lenient_text(raw_name)
            try:
                obj = TopicObject.from_json(name, value, qm)
                if name != BASE:
                    check_name(name)
                    validate_topic(obj.topic_string)
            except CorruptRecord as exc:
                tree.problems.append(exc)
                continue
            except (InvalidName, ValueError) as exc:
                tree.problems.append(CorruptRecord(keys.topic_objects(qm), name, str(exc)))
                continue
            tree.objects[name] = obj
        base = _as_base(tree.objects.get(BASE))
        if default_maxdepth > 0 and base.attributes.maxdepth == NOLIMIT:
            attributes = base.attributes.model_copy(update={"maxdepth": default_maxdepth})
            base = base.model_copy(update={"attributes": attributes})
        tree.objects[BASE] = base
        tree._by_string = {o.topic_string: o for o in tree.objects.values() if o.name != BASE}
        tree._by_string[""] = tree.objects[BASE]
        return tree

    @property
    def trivial(self) -> bool:
        """Only the base object, at its defaults: no topic needs looking at."""
        return len(self.objects) == 1 and self.objects[BASE].attributes == BASE_DEFAULTS

    def object_at(self, topic_string: str) -> TopicObject | None:
        """The object bound to exactly ``topic_string``, if any."""
        return self._by_string.get(topic_string)

    def effective(self, topic_string: str) -> Effective:
        """The effective attributes at ``topic_string`` (cached)."""
        found = self._cache.get(topic_string)
        if found is not None:
            return found
        values: dict[str, Any] = {}
        source: dict[str, str] = {}
        blocks, blocked_by = 0, ""
        node: str | None = topic_string
        while node is not None:
            obj = self._by_string.get(node)
            if obj is not None:
                attrs = obj.attributes
                if obj.name != BASE and attrs.wildcard == "BLOCK" and not blocked_by:
                    blocks, blocked_by = _levels(node, self.separator), obj.name
                for name in INHERITED:
                    if name not in values:
                        value = getattr(attrs, name)
                        if value != ASPARENT:
                            values[name] = value
                            source[name] = obj.name
            node = parent_of(node, self.separator)
        own = self._by_string.get(topic_string)
        for name in ("wildcard", "clroute", "proxysub"):
            values[name] = getattr(own.attributes, name) if own is not None else getattr(BASE_DEFAULTS, name)
            source[name] = own.name if own is not None else BASE
        result = Effective(values, source, blocks, blocked_by)
        if len(self._cache) >= 100_000:
            self._cache.clear()
        self._cache[topic_string] = result
        return result


def _as_base(stored: TopicObject | None) -> TopicObject:
    """``SYSTEM.BASE.TOPIC``: stored values over the defaults; never ``ASPARENT``."""
    if stored is None:
        return TopicObject(name=BASE, topic_string="", attributes=BASE_DEFAULTS)
    merged = {
        name: (
            getattr(BASE_DEFAULTS, name)
            if getattr(stored.attributes, name) == ASPARENT
            else getattr(stored.attributes, name)
        )
        for name in Attributes.model_fields
    }
    return TopicObject(
        name=BASE,
        topic_string="",
        attributes=Attributes(**merged),
        description=stored.description,
        altered_ms=stored.altered_ms,
    )


@translate_errors
def read_tree(client: redis.Redis, qm: str) -> TopicTree:
    """Every topic object of the queue manager (``SYSTEM.BASE.TOPIC`` always there).

    Raises:
        ForeignKey: ``{qm}:topics`` holds another Redis type.
    """
    return TopicTree.parse(
        qm, read_hash(client, keys.topic_objects(qm)), separator(recorded_scheme(client, qm))
    )


def _change(client: redis.Redis, qm: str, name: str, decide: Any) -> TopicObject | None:
    """Let ``decide(existing or None)`` return the new object (or None to delete) and write it with
    the version bump (``connection.change_field``)."""
    key = keys.topic_objects(qm)
    result: list[TopicObject | None] = []

    def value(pipe: Any) -> str | None:
        raw = pipe.hget(key, name)
        new = decide(TopicObject.from_json(name, raw, qm) if raw is not None else None)
        result[:] = [new]
        return None if new is None else new.to_json()

    change_field(client, key, name, value, keys.version(qm))
    return result[0]


@translate_errors
def define(
    client: redis.Redis,
    qm: str,
    name: str,
    topic_string: str,
    attributes: Attributes | None = None,
    description: str = "",
    replace: bool = False,
) -> TopicObject:
    """Define a topic object (``DEFINE TOPIC``).

    Args:
        client: a redis-py client.
        qm: the queue manager.
        name: 1-48 characters of ``A-Za-z0-9._/%``.
        topic_string: a valid topic string (MQTT 5 §4.7 rules).
        attributes: its attributes (default: all ``ASPARENT``).
        description: free text.
        replace: redefine an existing object (its topic string must be the same).

    Raises:
        InvalidName: a bad name.
        InvalidTopic: a bad topic string.
        TopicObjectConflict: the object exists (without ``replace``), its topic string
            would change, another object is bound to the same topic string, or the name
            is ``SYSTEM.BASE.TOPIC``.
        CorruptRecord: the stored object cannot be read (delete it first).
    """
    check_name(name)
    if name == BASE:
        raise TopicObjectConflict(f"{BASE} always exists; alter it instead")
    validate_topic(topic_string)
    new = TopicObject(
        name=name,
        topic_string=topic_string,
        attributes=attributes or Attributes(),
        description=description,
        altered_ms=clock.now_ms(),
    )
    tree = read_tree(client, qm)
    other = tree.object_at(topic_string)
    if other is not None and other.name != name:
        raise TopicObjectConflict(
            f"topic object {other.name!r} is already bound to topic string {topic_string!r}"
        )

    def decide(existing: TopicObject | None) -> TopicObject:
        if existing is not None:
            if not replace:
                raise TopicObjectConflict(f"topic object {name!r} exists; use alter, or define with replace")
            _same_string(existing, topic_string)
        return new

    result = _change(client, qm, name, decide)
    assert result is not None
    return result


def _same_string(existing: TopicObject, topic_string: str) -> None:
    if existing.topic_string != topic_string:
        raise TopicObjectConflict(
            f"topic object {existing.name!r} is bound to {existing.topic_string!r}; a topic string cannot be "
            "changed (IBM MQ): delete the object and define it again"
        )


@translate_errors
def alter(
    client: redis.Redis, qm: str, name: str, description: str | None = None, **changes: Any
) -> TopicObject:
    """Change some attributes of a topic object (``ALTER TOPIC``); the others keep their value.

    Args:
        changes: attribute name (lower case, e.g. ``pub="DISABLED"``, ``maxdepth=1000``) -> value.

    Raises:
        NoSuchTopicObject: no such object.
        ValueError: an unknown attribute or a value out of range (pydantic's message).
        TopicObjectConflict: ``topic_string`` given (it cannot be changed).
    """
    if "topic_string" in changes:
        raise TopicObjectConflict(
            "a topic string cannot be changed (IBM MQ): delete the object and define it again"
        )

    if not can_name(name):
        raise NoSuchTopicObject(f"no topic object {name!r} in queue manager {qm!r}")

    def decide(existing: TopicObject | None) -> TopicObject:
        if existing is None:
            if name != BASE:
                raise NoSuchTopicObject(f"no topic object {name!r} in queue manager {qm!r}")
            existing = TopicObject(name=BASE, topic_string="")
        attributes = Attributes(**{**existing.attributes.model_dump(), **changes})
        return existing.model_copy(
            update={
                "attributes": attributes,
                "description": existing.description if description is None else description,
                "altered_ms": clock.now_ms(),
            }
        )

    result = _change(client, qm, name, decide)
    assert result is not None
    return result


@translate_errors
def delete(client: redis.Redis, qm: str, name: str) -> None:
    """Delete a topic object (``DELETE TOPIC``); topics below it inherit from the next object up.

    Raises:
        NoSuchTopicObject: no such object.
        TopicObjectConflict: ``SYSTEM.BASE.TOPIC`` cannot be deleted.
    """
    if name == BASE:
        raise TopicObjectConflict(f"{BASE} cannot be deleted")
    missing = NoSuchTopicObject(f"no topic object {name!r} in queue manager {qm!r}")
    if not can_name(name):
        raise missing
    key = keys.topic_objects(qm)

    def decide(pipe: Any) -> None:  # nothing is written (not even the version) for a missing one
        if not pipe.hexists(key, name):
            raise missing

    change_field(client, key, name, decide, keys.version(qm))


@translate_errors
def display(client: redis.Redis, qm: str, pattern: str = "*") -> list[TopicObject]:
    """The topic objects whose name matches ``pattern`` (a name, or a generic name ending in ``*``), sorted."""
    tree = read_tree(client, qm)
    if pattern.endswith("*"):
        prefix = pattern[:-1]
        return [tree.objects[n] for n in sorted(tree.objects) if n.startswith(prefix)]
    found = tree.objects.get(pattern)
    if found is None:
        raise NoSuchTopicObject(f"no topic object {pattern!r} in queue manager {qm!r}")
    return [found]


@translate_errors
def topic_of(client: redis.Redis, qm: str, object_name: str, topic_string: str = "") -> str:
    """The topic string a publication or subscription names through a topic object (IBM MQ's rule):
    the object's topic string, joined with ``/`` (``.`` under the swiftmq scheme) to
    ``topic_string`` when one is given too.

    Raises:
        NoSuchTopicObject: no such object.
    """
    obj = read_tree(client, qm).objects.get(object_name)  # a name, never a generic one ("A*")
    if obj is None:
        raise NoSuchTopicObject(f"no topic object {object_name!r} in queue manager {qm!r}")
    if not topic_string:
        return obj.topic_string
    if not obj.topic_string:
        return topic_string
    return f"{obj.topic_string}{separator(recorded_scheme(client, qm))}{topic_string}"


@dataclass(frozen=True)
class Applied:
    """What ``apply`` did: names defined, altered, unchanged, deleted (with ``prune``)."""

    defined: list[str]
    altered: list[str]
    unchanged: list[str]
    deleted: list[str]


def load_file(path: str | Path) -> list[TopicObject]:
    """Read a declarative topic file (``configs/topics.toml``)::

        [[topic]]
        name = "PAYMENTS"
        topic_string = "/PAYMENTS"
        pub = "DISABLED"
        maxdepth = 10000

    Raises:
        ConfigError: the file is missing, not TOML, or an object in it is invalid.
    """
    where = f"topic file {str(path)!r}"
    data = read_toml(path, where)
    items = data.get("topic", [])
    if not isinstance(items, list):
        raise ConfigError(f"{where}: 'topic' must be an array of tables, [[topic]]")
    out = []
    for n, item in enumerate(items, 1):
        try:
            if not isinstance(item, dict):
                raise ConfigError(f"{where}: [[topic]] number {n} is not a table")
            item = dict(item)
            name, topic_string = item.pop("name"), item.pop("topic_string", "")
            description = item.pop("description", "")
            for what, value in (("name", name), ("topic_string", topic_string), ("description", description)):
                if not isinstance(value, str):
                    raise ConfigError(f"{where}: [[topic]] number {n}: {what} must be a string")
            check_name(name)
            if name != BASE:
                validate_topic(topic_string)
            out.append(
                TopicObject(
                    name=name,
                    topic_string=topic_string,
                    attributes=Attributes(**item),
                    description=description,
                )
            )
        except ConfigError:
            raise
        except KeyError as exc:
            raise ConfigError(f"{where}: [[topic]] number {n} has no {exc.args[0]!r}") from exc
        except (ValueError, ValidationError) as exc:
            raise ConfigError(f"{where}: [[topic]] number {n}: {_first_error(exc)}") from exc
    names: set[str] = set()
    strings: dict[str, str] = {}
    for n, obj in enumerate(out, 1):  # apply() would stop halfway on these
        if obj.name in names:
            raise ConfigError(f"{where}: [[topic]] number {n}: {obj.name!r} is defined twice")
        names.add(obj.name)
        if obj.name == BASE:
            continue
        other = strings.setdefault(obj.topic_string, obj.name)
        if other != obj.name:
            raise ConfigError(
                f"{where}: [[topic]] number {n}: {obj.name!r} and {other!r} have the same topic string"
            )
    return out


@translate_errors
def apply(client: redis.Redis, qm: str, objects: list[TopicObject], prune: bool = False) -> Applied:
    """Make the queue manager's topic objects match ``objects``, idempotently (infrastructure as code).

    Objects not there are defined; objects whose attributes or description differ are
    altered; with ``prune``, objects not in ``objects`` are deleted (never the base).

    Raises:
        TopicObjectConflict: an object's topic string differs from the one defined, or another
            object is bound to its topic string (found before anything is written).
        InvalidName: a bad name; InvalidTopic: a bad topic string (before anything is written).
        CorruptRecord: the stored record of one of the objects cannot be read (delete it first).
    """
    tree = read_tree(client, qm)
    names: set[str] = set()
    strings: set[str] = set()
    for obj in objects:  # every conflict is found before anything is written
        if obj.name == BASE:
            continue
        check_name(obj.name)
        validate_topic(obj.topic_string)
        if obj.name in names or obj.topic_string in strings:
            raise TopicObjectConflict(
                f"topic object {obj.name!r} or its topic string {obj.topic_string!r} is given twice"
            )
        names.add(obj.name)
        strings.add(obj.topic_string)
        corrupt = [problem for problem in tree.problems if problem.field == obj.name]
        if corrupt:
            raise corrupt[0]
        have = tree.objects.get(obj.name)
        if have is not None:
            _same_string(have, obj.topic_string)
        other = tree.object_at(obj.topic_string)
        if other is not None and other.name != obj.name:
            raise TopicObjectConflict(
                f"topic object {other.name!r} is already bound to topic string {obj.topic_string!r}"
            )
    result = Applied([], [], [], [])
    for obj in objects:
        have = tree.objects.get(obj.name)
        if obj.name == BASE:
            if (
                have is not None
                and have.attributes == _as_base(obj).attributes
                and have.description == obj.description
            ):
                result.unchanged.append(obj.name)
            else:
                alter(client, qm, BASE, description=obj.description, **obj.attributes.model_dump())
                result.altered.append(obj.name)
            continue
        if have is None:
            define(client, qm, obj.name, obj.topic_string, obj.attributes, obj.description)
            result.defined.append(obj.name)
        elif have.topic_string != obj.topic_string:
            _same_string(have, obj.topic_string)
        elif have.attributes != obj.attributes or have.description != obj.description:
            define(client, qm, obj.name, obj.topic_string, obj.attributes, obj.description, replace=True)
            result.altered.append(obj.name)
        else:
            result.unchanged.append(obj.name)
    if prune:
        wanted = {o.name for o in objects}
        for name in sorted(tree.objects):
            if name != BASE and name not in wanted:
                delete(client, qm, name)
                result.deleted.append(name)
    return result
