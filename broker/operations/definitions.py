"""Definitions: a queue manager's configuration as one JSON document, exported and imported.

Like RabbitMQ's definitions (``GET``/``POST /api/definitions``, ``rabbitmqctl
export_definitions``): what an operator defined, not the messages. The document holds
the topic scheme, the durable subscriptions (their filter, selector, no-local, consumer
mode and MQTT ShareName), the links, the topic objects, the declared topics (swiftmq), the
users the broker made (role and bindings, **never a password**), their grants, and the
queue controllers and consumer-mode rules of the exporting process's settings (they are
settings, ``broker.toml``: an import reports whether the importing process has the same,
and gives each subscription the mode the document records).

``broker definitions export/import`` (``broker.cli.definitions``) and the management API
(``broker.operations.console.api``) both call this module.

Import checks the whole document first, against itself and against what the queue manager
holds (filters, topics, names, attributes, link cycles, a subscription or topic object that
exists with other settings, publisher ids bound to another user, grants naming unknown
users or topic objects), and refuses it with ``InvalidDefinitions`` before writing anything.
What exists already with the same settings is kept; a user of the queue manager that exists is
kept as it is (with its password). ACL users are server-wide: a user the document names that
exists on the server but not in this queue manager's registry (another queue manager's, or one
whose keys were deleted) is never reset: it is left as it is and named in the report's notes,
and its grants are not imported. A user made by an import has no password and cannot log in until an
operator gives it one: ``broker acl rotate NAME --password-env VAR``.

Making or looking up an ACL user takes ``ACL SETUSER`` / ``GETUSER`` (``@admin`` in Redis), which
the broker's admin role lacks: as in IBM MQ, where an administrator manages queue manager objects
but the operating system's users are made by the system's administrator, ACL users are made by an
operator with ACL rights (``broker acl add``). So a document naming users this queue manager's
registry lacks is refused to an admin before anything is written (``UsersNeedOperator``, naming
the ``broker acl add`` command of each); ``skip_users`` imports the rest, leaves those users and
their grants out and names each in the report (``skipped``, ``notes``). Users the registry has
already are kept and their grants imported: that needs no ACL command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.core import clock, hierarchy, keys, wire
from broker.core.config import ConsumerMode, Settings
from broker.core.connection import read_hash
from broker.core.errors import BrokerError, InvalidDefinitions, UsersNeedOperator, translate_errors
from broker.core.principals import check_principal, holders
from broker.core.schemes import recorded_scheme, separator
from broker.core.selectors import check_size, compile_selector
from broker.core.topic_rules import validate_topic
from broker.operations.acl import RoleSpec, add_user, rules, server_has_user
from broker.operations.grants import grant, list_grants
from broker.topics import links as links_ops
from broker.topics import topic_objects
from broker.topics.declared import declare, list_declared
from broker.topics.grants import KINDS, validate_grant_filter
from broker.topics.subscriptions import (
    SubscriptionRecord,
    check_filter,
    check_name,
    check_topic_tree,
    read_subscriptions,
    subscribe,
)

#: The version of the document's layout (``broker_definitions``).
FORMAT = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubscriptionDef(_Model):
    """A durable subscription: its id ``<client id>$<name>`` (``<ShareName>$<name>`` with ``share``)."""

    id: str
    filter: str
    selector: str = ""
    no_local: bool = False
    mode: Literal["exclusive", "shared", "activestandby"] = "exclusive"
    share: str = ""


class LinkDef(_Model):
    """A link: publications on ``source`` also reach ``target``'s subscribers."""

    source: str
    target: str
    backward: bool = False


class TopicObjectDef(_Model):
    """A topic object (IBM MQ ``DEFINE TOPIC``): attributes as ``broker.topics.topic_objects.Attributes``."""

    name: str
    topic_string: str
    attributes: topic_objects.Attributes = Field(default_factory=topic_objects.Attributes)
    description: str = ""


class UserDef(_Model):
    """A broker user (``broker acl add``) without its password."""

    name: str
    role: Literal["publisher", "subscriber", "worker", "channel", "admin", "monitor"]
    publisher_ids: list[str] = Field(default_factory=list)
    client_id: str = ""
    peers: list[str] = Field(default_factory=list)


class GrantDef(_Model):
    """A user's grants (``broker acl grant``): topic filters and topic object names."""

    publish: list[str] = Field(default_factory=list)
    publish_objects: list[str] = Field(default_factory=list)
    subscribe: list[str] = Field(default_factory=list)
    subscribe_objects: list[str] = Field(default_factory=list)


class Definitions(_Model):
    """The definitions document (``FORMAT`` 1). Every list may be empty or left out."""

    broker_definitions: Literal[1] = 1
    qm: str = ""
    topic_scheme: Literal["mqtt", "swiftmq"] = "mqtt"
    exported_ms: int = 0
    subscriptions: list[SubscriptionDef] = Field(default_factory=list)
    links: list[LinkDef] = Field(default_factory=list)
    topic_objects: list[TopicObjectDef] = Field(default_factory=list)
    declared_topics: list[str] = Field(default_factory=list)
    users: list[UserDef] = Field(default_factory=list)
    grants: dict[str, GrantDef] = Field(default_factory=dict)
    queue_controllers: list[dict[str, Any]] = Field(default_factory=list)


@dataclass
class ImportReport:
    """What ``import_definitions`` did, per section: names created, names kept (already there),
    and names skipped (``skip_users``: users the queue manager lacks, and their grants)."""

    created: dict[str, list[str]] = field(default_factory=dict)
    kept: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, name: str, made: bool) -> None:
        (self.created if made else self.kept).setdefault(section, []).append(name)

    def as_dict(self) -> dict[str, Any]:
        return {"created": self.created, "kept": self.kept, "skipped": self.skipped, "notes": self.notes}


def _controllers(settings: Settings) -> list[dict[str, Any]]:
    return [c.model_dump() for c in settings.controllers]


@translate_errors
def export_definitions(client: redis.Redis, settings: Settings) -> dict[str, Any]:
    """The queue manager's definitions as a JSON-ready dict (``Definitions``'s shape).

    Reads only (a monitor may export). Non-durable subscriptions are left out (they belong to
    their live consumers), and so are records that cannot be read.

    Raises:
        ForeignKey: a hash the broker reads holds another Redis type.
    """
    qm = settings.qm
    subs = [
        SubscriptionDef(
            id=s.sub_id,
            filter=s.shown_filter,
            selector=s.selector,
            no_local=s.no_local,
            mode=s.mode,  # type: ignore[arg-type]
            share=s.share,
        )
        for s in read_subscriptions(client, qm)[0]
        if s.durable
    ]
    tree = topic_objects.read_tree(client, qm)
    stored = set(wire.lenient_text(f) for f in read_hash(client, keys.topic_objects(qm)))
    objects = [
        TopicObjectDef(
            name=o.name, topic_string=o.topic_string, attributes=o.attributes, description=o.description
        )
        for name, o in sorted(tree.objects.items())
        if name in stored
    ]
    users = []
    for raw_user, raw in sorted(read_hash(client, keys.acl_users(qm)).items()):
        try:
            spec = RoleSpec.from_json(raw)
        except ValueError:
            continue
        users.append(
            UserDef(
                name=wire.lenient_text(raw_user),
                role=spec.role,
                publisher_ids=spec.publisher_ids,
                client_id=spec.client_id,
                peers=spec.peers,
            )
        )
    grants = {
        user: GrantDef(**{k: getattr(r, k) for k in KINDS}) for user, r in list_grants(client, qm)[0].items()
    }
    doc = Definitions(
        qm=qm,
        topic_scheme=recorded_scheme(client, qm),
        exported_ms=clock.now_ms(),
        subscriptions=subs,
        links=[LinkDef(source=s, target=t, backward=b) for s, t, b in links_ops.list_links(client, qm)],
        topic_objects=objects,
        declared_topics=[d.topic for d in list_declared(client, qm)[0]],
        users=users,
        grants=grants,
        queue_controllers=_controllers(settings),
    )
    return doc.model_dump(mode="json")


def parse_definitions(raw: str | bytes | dict[str, Any]) -> Definitions:
    """Parse a definitions document (JSON text, or the dict of one).

    Raises:
        InvalidDefinitions: not JSON, not an object, or a field of the wrong shape (the first
            problem is named, e.g. ``subscriptions.0.filter``).
    """
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except (ValueError, RecursionError) as exc:
        raise InvalidDefinitions("document", f"not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InvalidDefinitions("document", "not a JSON object")
    try:
        return Definitions.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "document"
        raise InvalidDefinitions(where, err["msg"]) from exc


def _checked(where: str, check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``check(*args, **kwargs)``; a broker error or ValueError becomes ``InvalidDefinitions`` naming ``where``."""
    try:
        return check(*args, **kwargs)
    except (BrokerError, ValueError) as exc:
        raise InvalidDefinitions(where, str(exc)) from exc


def _check_subscriptions(client: redis.Redis, settings: Settings, doc: Definitions) -> None:
    qm, scheme = settings.qm, doc.topic_scheme
    existing = {s.sub_id: s for s in read_subscriptions(client, qm)[0]}
    per_client: dict[str, int] = {}
    for sub_id in existing:
        per_client[sub_id.partition("$")[0]] = per_client.get(sub_id.partition("$")[0], 0) + 1
    # the topic objects there will be: those stored, then the document's
    raw = dict(read_hash(client, keys.topic_objects(qm)))
    for obj in doc.topic_objects:
        new = topic_objects.TopicObject(
            name=obj.name,
            topic_string=obj.topic_string,
            attributes=obj.attributes,
            description=obj.description,
        )
        raw[obj.name.encode()] = new.to_json()
    tree = topic_objects.TopicTree.parse(qm, raw, separator(scheme))
    for i, sub in enumerate(doc.subscriptions):
        where = f"subscriptions[{i}] ({sub.id})"
        owner, dollar, name = sub.id.partition("$")
        if not dollar:
            raise InvalidDefinitions(where, "an id is <client id>$<name>")
        _checked(where, check_name, "client id", owner)
        _checked(where, check_name, "subscription name", name)
        share, inner = _checked(where, check_filter, sub.filter, scheme, settings)
        if share != sub.share or (share and owner != share):
            raise InvalidDefinitions(
                where, "share must be the filter's $share/<ShareName>/ and the id's owner"
            )
        if sub.selector:
            _checked(where, check_size, sub.selector, settings.max_selector_bytes)
            _checked(where, compile_selector, sub.selector)
        old = existing.get(sub.id)
        if old is None:
            record = SubscriptionRecord(sub.id, inner, True, 0, sub.selector, sub.no_local, sub.mode, share)
            _checked(where, check_topic_tree, qm, tree, record)
            per_client[owner] = per_client.get(owner, 0) + 1
            limit = settings.max_subscriptions_per_client
            if limit and per_client[owner] > limit:
                raise InvalidDefinitions(where, f"{owner!r} would have more than {limit} subscriptions")
        if old is not None and (
            old.shown_filter,
            old.selector,
            old.no_local,
            old.mode == "shared",
            old.durable,
        ) != (sub.filter, sub.selector, sub.no_local, sub.mode == "shared", True):
            raise InvalidDefinitions(
                where, "exists here with other settings; unsubscribe it first", conflict=True
            )


def _check_topics(client: redis.Redis, settings: Settings, doc: Definitions) -> set[str]:
    """Check topic objects, declared topics and links; returns every topic object name there will be."""
    qm = settings.qm
    valid = validate_topic  # links and topic objects take topic strings under either scheme
    tree = topic_objects.read_tree(client, qm)
    bound = {o.topic_string: o.name for o in tree.objects.values()}
    for i, obj in enumerate(doc.topic_objects):
        where = f"topic_objects[{i}] ({obj.name})"
        _checked(where, topic_objects.check_name, obj.name)
        if obj.name == topic_objects.BASE:
            continue
        _checked(where, valid, obj.topic_string)
        old = tree.objects.get(obj.name)
        if old is not None and old.topic_string != obj.topic_string:
            raise InvalidDefinitions(where, f"exists here bound to {old.topic_string!r}", conflict=True)
        other = bound.get(obj.topic_string)
        if other is not None and other != obj.name:
            raise InvalidDefinitions(
                where, f"topic object {other!r} is bound to {obj.topic_string!r}", conflict=True
            )
        bound[obj.topic_string] = obj.name
    for i, topic in enumerate(doc.declared_topics):
        _checked(f"declared_topics[{i}]", hierarchy.validate_topic, topic)
    graph = links_ops.read_links(client, qm)[0]
    for i, link in enumerate(doc.links):
        where = f"links[{i}] ({link.source} -> {link.target})"
        _checked(where, valid, link.source)
        _checked(where, valid, link.target)
        _checked(where, graph.add, link.source, link.target, backward=link.backward)
    return set(tree.objects) | {o.name for o in doc.topic_objects}


def _check_users(
    client: redis.Redis, settings: Settings, doc: Definitions, objects: set[str], may_manage: bool
) -> None:
    qm = settings.qm
    known = {wire.lenient_text(u) for u in read_hash(client, keys.acl_users(qm))}
    for i, user in enumerate(doc.users):
        where = f"users[{i}] ({user.name})"
        _checked(where, check_principal, user.name)
        if user.name == "default":
            raise InvalidDefinitions(where, "the default user is not a broker role")
        spec = RoleSpec(user.role, user.publisher_ids, user.client_id, user.peers)
        _checked(where, rules, qm, user.name, spec)
        new = user.name not in known and not (may_manage and server_has_user(client, user.name))
        if user.role == "publisher" and new:
            taken = holders(client, qm, user.name, user.publisher_ids)
            if taken:
                raise InvalidDefinitions(
                    where, f"publisher ids bound to another user: {taken}", conflict=True
                )
    users = known | {u.name for u in doc.users}
    for holder, record in doc.grants.items():
        where = f"grants.{holder}"
        if holder not in users:
            raise InvalidDefinitions(where, "no such user in the document or the queue manager")
        for kind in ("publish", "subscribe"):
            for topic_filter in getattr(record, kind):
                _checked(where, validate_grant_filter, topic_filter, doc.topic_scheme)
        for kind in ("publish_objects", "subscribe_objects"):
            for name in getattr(record, kind):
                if name not in objects:
                    raise InvalidDefinitions(where, f"no topic object {name!r}")


def add_command(qm: str, user: UserDef) -> str:
    """The ``broker acl add`` command an operator runs to make ``user`` on ``qm`` (a password option last)."""
    words = ["broker", "--qm", qm, "acl", "add", user.name, "--role", user.role]
    words += [w for pid in user.publisher_ids for w in ("--publisher-id", pid)]
    words += ["--client-id", user.client_id] if user.client_id else []
    words += [w for peer in user.peers for w in ("--peer", peer)]
    return " ".join(shlex.quote(w) for w in [*words, "--password-env", "VAR"])


def _may_manage_users(client: redis.Redis, name: str) -> bool:
    """Whether the client's Redis user may run ``ACL GETUSER`` (and so, for the broker's roles,
    ``ACL SETUSER``): asked once, about ``name``, on an import's rare path."""
    try:
        server_has_user(client, name)
    except redis.exceptions.NoPermissionError:
        return False
    return True


def without_new_users(client: redis.Redis, qm: str, doc: Definitions) -> tuple[Definitions, list[UserDef]]:
    """``doc`` without the users ``qm``'s registry lacks and their grants; and those users."""
    known = {wire.lenient_text(u) for u in read_hash(client, keys.acl_users(qm))}
    new = [u for u in doc.users if u.name not in known]
    names = {u.name for u in new}
    kept = doc.model_copy(
        update={
            "users": [u for u in doc.users if u.name in known],
            "grants": {h: g for h, g in doc.grants.items() if h not in names},
        }
    )
    return kept, new


def check_definitions(client: redis.Redis, settings: Settings, doc: Definitions) -> None:
    """Check ``doc`` against itself and the queue manager, writing nothing.

    Raises:
        InvalidDefinitions: the first problem found (``conflict`` set when it is a conflict with
            what the queue manager holds).
        UsersNeedOperator: ``doc`` names users the queue manager lacks and the client may not
            make ACL users (the admin role); checked after the rest, so a bad document is named first.
    """
    recorded = read_hash(client, keys.manager(settings.qm)).get(b"topic_scheme")
    if recorded is not None and wire.lenient_text(recorded) != doc.topic_scheme:
        raise InvalidDefinitions(
            "topic_scheme",
            f"this queue manager uses {wire.lenient_text(recorded)!r}, not {doc.topic_scheme!r}",
            conflict=True,
        )
    objects = _check_topics(client, settings, doc)
    _check_subscriptions(client, settings, doc)
    new = without_new_users(client, settings.qm, doc)[1]
    may_manage = not new or _may_manage_users(client, new[0].name)
    _check_users(client, settings, doc, objects, may_manage)
    if not may_manage:
        raise UsersNeedOperator({u.name: add_command(settings.qm, u) for u in new})


@translate_errors
def import_definitions(
    client: redis.Redis, settings: Settings, raw: str | bytes | dict[str, Any], *, skip_users: bool = False
) -> ImportReport:
    """Check a definitions document, then create what it defines that the queue manager lacks.

    Args:
        client: a client that may administer the queue manager (the admin role: ``ACL SETUSER``).
        settings: the broker settings (``qm``, limits; its queue controllers are compared with the
            document's).
        raw: the document: JSON text or its dict.
        skip_users: leave out the users the queue manager's registry lacks and their grants (an
            admin's import: it may not make ACL users), each named in the report.

    Returns:
        The ``ImportReport``: per section, what was created, kept as it was, or skipped.

    Raises:
        InvalidDefinitions: the document is refused (see the module docstring); nothing was written.
        UsersNeedOperator: the document names users the queue manager lacks, ``skip_users`` is
            false and the client may not make ACL users; nothing was written.
    """
    doc = parse_definitions(raw)
    qm, report = settings.qm, ImportReport()
    if skip_users:
        doc, left_out = without_new_users(client, qm, full := doc)
        for user in left_out:
            report.skipped.setdefault("users", []).append(user.name)
            if user.name in full.grants:
                report.skipped.setdefault("grants", []).append(user.name)
            then = ", then imports again for its grants" if user.name in full.grants else ""
            report.notes.append(
                f"user {user.name!r} ({user.role}) was not made (skip_users): an operator with ACL rights "
                f"makes it with `{add_command(qm, user)}`{then}"
            )
    check_definitions(client, settings, doc)
    recorded_scheme(client, qm, doc.topic_scheme)
    existing = {o.name: o for o in topic_objects.read_tree(client, qm).objects.values()}
    for obj in doc.topic_objects:
        old = existing.get(obj.name)
        same = old is not None and (old.attributes, old.description) == (obj.attributes, obj.description)
        if obj.name == topic_objects.BASE and not same:
            topic_objects.alter(client, qm, obj.name, obj.description, **obj.attributes.model_dump())
        elif not same:
            topic_objects.define(
                client, qm, obj.name, obj.topic_string, obj.attributes, obj.description, replace=True
            )
        report.add("topic_objects", obj.name, not same)
    for topic in doc.declared_topics:
        report.add("declared_topics", topic, declare(client, qm, topic, source="definitions"))
    current = set(links_ops.list_links(client, qm))
    for link in doc.links:
        made = (link.source, link.target, link.backward) not in current
        if made:
            links_ops.link(client, qm, link.source, link.target, backward=link.backward)
        report.add("links", f"{link.source} -> {link.target}", made)
    _import_users(client, qm, doc, report)
    subs = {s.sub_id for s in read_subscriptions(client, qm)[0]}
    for sub in doc.subscriptions:
        _import_subscription(client, settings, sub)
        report.add("subscriptions", sub.id, sub.id not in subs)
    if doc.queue_controllers != _controllers(settings):
        report.notes.append(
            "the document's queue_controllers differ from this process's settings (broker.toml); "
            "the subscriptions keep the consumer modes the document records"
        )
    return report


def _import_users(client: redis.Redis, qm: str, doc: Definitions, report: ImportReport) -> None:
    known = {wire.lenient_text(u) for u in read_hash(client, keys.acl_users(qm))}
    left: set[str] = set()
    for user in doc.users:
        made = user.name not in known
        if made and server_has_user(client, user.name):  # ACL users are server-wide: never reset one
            left.add(user.name)
            report.notes.append(
                f"user {user.name!r} exists on the server but not for {qm} (another queue manager's, or "
                "made before the keys were deleted): left as it is, with its password; `broker acl add` "
                "it for this queue manager if it should be one of its users (its grants were not imported)"
            )
            continue
        if made:  # no password: it cannot log in until `broker acl rotate` gives it one
            spec = RoleSpec(user.role, list(user.publisher_ids), user.client_id, list(user.peers))
            add_user(client, qm, user.name, spec, None)
        report.add("users", user.name, made)
    stored = list_grants(client, qm)[0]
    for holder, record in doc.grants.items():
        if holder in left:
            continue
        have = stored.get(holder)
        missing = {
            k: [v for v in getattr(record, k) if have is None or v not in getattr(have, k)] for k in KINDS
        }
        if any(missing.values()):
            grant(client, qm, holder, missing["publish"], missing["subscribe"],
                  missing["publish_objects"], missing["subscribe_objects"])  # fmt: skip
        report.add("grants", holder, any(missing.values()))


def _import_subscription(client: redis.Redis, settings: Settings, sub: SubscriptionDef) -> SubscriptionRecord:
    owner, _, name = sub.id.partition("$")
    shared = sub.mode == "shared"
    modes = [] if shared else [ConsumerMode(predicate=sub.id, mode=sub.mode)]
    return subscribe(
        client,
        settings.qm,
        sub.filter,
        owner,
        name,
        shared=shared,
        selector=sub.selector or None,
        no_local=sub.no_local,
        settings=settings,
        consumer_modes=modes,
    )
