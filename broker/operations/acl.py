"""The broker's roles as Redis ACL users (``broker acl``).

Redis's own security model is ACL users with command and key-pattern rules; each role
below is one set of rules, as narrow as the role's work allows. Every key of a queue
manager starts with ``{qm}:``, so a pattern names a role's keys exactly.

=========== ============================================= =============================================
role        commands                                      keys
=========== ============================================= =============================================
publisher   XADD; BLPOP (its results); GET (its flow key) ``{qm}:in:<user>`` (write), ``{qm}:reply:<n>:<id>:*``
                                                          and ``{qm}:pub:<id>:flow`` (read) per bound id
subscriber  read, write, list, hash, zset; FCALL and       ``{qm}:sub:<client id>$*`` (its subscriptions' queues,
            FCALL_RO (the function library ``broker``);   consumer state, expired count, last use and poison
            no EVAL, EVALSHA or SCRIPT; no dangerous ones messages: every key it writes is its own);
                                                          ``{qm}:subs``, ``{qm}:version``, ``{qm}:manager``,
                                                          ``{qm}:topics`` (read);
                                                          ``{qm}:ctl:<client id>`` (its control requests),
                                                          ``{qm}:ctl:<client id>:reply:*`` (their answers)
worker      read, write, stream, list, hash, set, zset,   ``{qm}:*``
            string, keyspace, scripting, transactions;
            FUNCTION LOAD / LIST (the library); no
            dangerous or admin ones but INFO
channel     as worker                                     ``{qm}:*``; on each peer (default: every other queue
                                                          manager of the network): its publish stream and
                                                          received record, its announcement, topic objects
                                                          and network record (read)
admin       as worker; SUBSCRIBE (rq's worker channel)    ``{qm}:*`` and ``rq:*`` (the admin jobs' queue);
                                                          channels ``rq:pubsub:*``
monitor     read, transactions, INFO; nothing that writes ``{qm}:*`` (read)
=========== ============================================= =============================================

Every role also gets the connection commands a client library sends (PING, HELLO, AUTH,
CLIENT SETNAME / SETINFO / ID, and the CLUSTER SLOTS / SHARDS / NODES a cluster client
reads). No role gets FLUSHALL, FLUSHDB, KEYS, CONFIG, DEBUG, ACL, SHUTDOWN, MONITOR,
SCRIPT FLUSH / KILL, or FUNCTION but LOAD and LIST (worker, admin): those stay with the
operator's own user.

A publisher's identity is enforced by Redis: it may ``XADD`` to its own ingress stream only,
and the queue mutex files what arrives there under the principal it came from
(``broker.core.principals``). The users the broker made are recorded in ``{qm}:acl`` (no
password): name -> role and bindings. Passwords come from an environment variable or a
secret file, are sent to Redis only (``ACL SETUSER ... >password``) and never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis

from broker.core import clock, keys, wire
from broker.core.connection import is_cluster
from broker.core.errors import ConfigError, InvalidName, PublisherIdBound, translate_errors
from broker.core.principals import bind, check_principal, check_publisher_ids, holders, unbind

Role = Literal["publisher", "subscriber", "worker", "channel", "admin", "monitor"]
ROLES: tuple[Role, ...] = ("publisher", "subscriber", "worker", "channel", "admin", "monitor")

#: Client ids as subscriptions require them.
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

#: What a client library sends on connecting (redis-py: HELLO, CLIENT SETINFO; a cluster
#: client: CLUSTER SLOTS / SHARDS / NODES).
CONNECTION = (
    "+ping",
    "+hello",
    "+auth",
    "+client|setname",
    "+client|setinfo",
    "+client|id",
    "+cluster|slots",
    "+cluster|shards",
    "+cluster|nodes",
    "+readonly",
)

#: The commands of the roles that run the broker's scripts on their queue manager's keys.
OPERATOR = (
    "+@read",
    "+@write",
    "+@stream",
    "+@list",
    "+@hash",
    "+@set",
    "+@sortedset",
    "+@string",
    "+@keyspace",
    "+@scripting",
    "+@transaction",
    "-@dangerous",
    "-@admin",
    "-script|flush",
    "-script|kill",
    "-function",
    "-select",
    "-move",
    "-swapdb",
    "+info",
    "+time",
    "+xgroup|create",
    "+xgroup|createconsumer",
)


#: What the subscriber role leaves out of ``OPERATOR``: every script command (``EVAL``,
#: ``EVALSHA``, ``SCRIPT``: an untrusted user's own Lua could loop and freeze the server), and
#: what only the workers use. It consumes with ``LIBRARY_CALLS``.
SUBSCRIBER_LEFT_OUT = ("+@scripting", "+xgroup|create", "+xgroup|createconsumer", "+info")

#: Calling the function library ``broker`` (``broker.core.library``): every role that consumes.
#: Its functions' key access stays bound by the caller's key patterns (the server checks each
#: key a function touches against the caller's ACL user).
LIBRARY_CALLS = ("+fcall", "+fcall_ro")

#: Loading it (``FUNCTION LOAD REPLACE`` when missing or older; ``FUNCTION LIST`` to tell): the
#: worker and admin roles. Never ``FUNCTION FLUSH`` / ``DELETE``.
LIBRARY_LOAD = ("+function|load", "+function|list")


@dataclass
class RoleSpec:
    """A broker user's role and bindings (stored in ``{qm}:acl``, no password).

    Attributes:
        role: one of ``ROLES``.
        publisher_ids: publisher: the ids it may publish under.
        client_id: subscriber: the client id whose subscriptions it may consume.
        peers: channel: the other queue managers it moves to (their publish streams) and reads
            (announcements, topic objects): every one of the network, as each channel process reads
            every queue manager's announcement, not only its neighbours'.
        created_ms: when it was made, ms since the epoch.
    """

    role: Role
    publisher_ids: list[str] = field(default_factory=list)
    client_id: str = ""
    peers: list[str] = field(default_factory=list)
    created_ms: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str) -> RoleSpec:
        """Raises: ValueError: not a role record."""
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("role") not in ROLES:
            raise ValueError("not a broker ACL user record")
        return cls(
            data["role"],
            list(data.get("publisher_ids", [])),
            str(data.get("client_id", "")),
            list(data.get("peers", [])),
            int(data.get("created_ms", 0)),
        )


def rules(qm: str, user: str, spec: RoleSpec) -> list[str]:
    """The ACL rules of ``user`` in ``spec.role`` on queue manager ``qm`` (after ``reset``; no password).

    Raises:
        InvalidName: a binding the role needs is missing or invalid.
    """
    out = ["resetkeys", "resetchannels", "-@all", *CONNECTION]
    if spec.role == "publisher":
        if spec.publisher_ids:  # none left: every id was moved to another principal (add_user's move)
            check_publisher_ids(spec.publisher_ids)
        out += ["+xadd", "+blpop", "+get", f"%W~{keys.glob_escape(keys.ingress(qm, user))}"]
        for pid in spec.publisher_ids:
            out += [f"~{keys.reply_pattern(qm, pid)}", f"%R~{keys.glob_escape(keys.flow_key(qm, pid))}"]
    elif spec.role == "subscriber":
        if not _CLIENT_ID.match(spec.client_id):
            raise InvalidName(
                f"a subscriber needs --client-id (1-128 of A-Z a-z 0-9 _ . -), not {spec.client_id!r}"
            )
        out += [c for c in OPERATOR if c not in SUBSCRIBER_LEFT_OUT]
        out += [
            *LIBRARY_CALLS,
            f"~{keys.client_subscriptions_pattern(qm, spec.client_id)}",
            f"%R~{keys.subscriptions(qm)}",
            f"%R~{keys.version(qm)}",
            f"%R~{keys.manager(qm)}",
            f"%R~{keys.topic_objects(qm)}",
            # its subscribe / unsubscribe requests (broker.operations.control) and their answers
            f"~{keys.glob_escape(keys.control(qm, spec.client_id))}",  # FCALL broker_request declares it: RW
            f"~{keys.control_reply_pattern(qm, spec.client_id)}",
        ]
    elif spec.role in ("worker", "admin", "channel"):
        out += [*OPERATOR, *LIBRARY_CALLS, f"~{keys.all_keys_pattern(qm)}"]
        if spec.role in ("worker", "admin"):  # they load the function library (broker.core.library)
            out += list(LIBRARY_LOAD)
        if spec.role == "admin":  # rq's queues and jobs, and its worker's command channel
            out += ["~rq:*", "+subscribe", "+unsubscribe", "&rq:pubsub:*"]
        for peer in spec.peers:
            out += [
                f"~{keys.publish_stream(peer)}",
                f"~{keys.received(peer)}",
                f"%R~{keys.announced(peer)}",
                f"%R~{keys.topic_objects(peer)}",
                f"%R~{keys.network(peer)}",
            ]
    elif spec.role == "monitor":
        out += [
            "+@read",
            "+@transaction",
            "-@dangerous",
            "-@admin",
            "+info",
            f"%R~{keys.all_keys_pattern(qm)}",
        ]
    else:  # pragma: no cover - Literal
        raise InvalidName(f"unknown role {spec.role!r}; roles: {', '.join(ROLES)}")
    return out


#: What each role may do, in a few words, for a refusal's message (``refusal_for``); docs/security.md
#: has the whole table.
ROLE_MAY = {
    "publisher": "publish under the publisher ids bound to it (XADD to its ingress stream) and wait for their results",
    "subscriber": "consume the subscriptions of its own client id",
    "worker": "run the workers of its queue manager",
    "channel": "move publications between queue managers",
    "admin": "administer its queue manager (subscriptions, links, topic objects, dead letters, jobs)",
    "monitor": "read (status, listings, the console's pages): it writes nothing",
}

#: How Redis refuses a command a user's rules do not allow at all (as against a key it may not touch).
_NO_COMMAND = re.compile(r"has no permissions to run the '[^']*' command", re.IGNORECASE)


def role_of(client: redis.Redis, qm: str, user: str | None) -> Role | None:
    """The broker role of ACL user ``user`` on ``qm``, to word a refusal for it (an error path only).

    Read from the user's record in ``{qm}:acl`` when the user may read it (monitor, worker,
    channel and admin users may). Publisher and subscriber users may not, and Redis's refusal
    of that read tells them apart: a publisher's rules allow no read command at all (``HGET``
    refused as a command), a subscriber's allow read commands on its own keys only (refused
    for the key).

    Returns:
        One of ``ROLES``, or None: no user (the default user), no record (a user the broker did
        not make), or the server did not answer.
    """
    if not user or user == "default":
        return None
    try:
        raw = client.hget(_registry(qm), user)
    except redis.exceptions.NoPermissionError as exc:
        return "publisher" if _NO_COMMAND.search(str(exc)) else "subscriber"
    except redis.RedisError:
        return None
    if raw is None:
        return None
    try:
        return RoleSpec.from_json(raw).role
    except ValueError:
        return None


def refusal_for(user: str | None, role: str | None) -> str:
    """What to add to an error Redis refused (NOPERM) for ``user`` of ``role`` (``role_of``): the role
    and what it may do when known, and where each role's rules are listed."""
    where = "'broker acl list' shows each role's rules, docs/security.md what each role may do"
    if role in ROLE_MAY:
        return f" (user {user}, role {role}, may not do this: a {role} may only {ROLE_MAY[role]}; {where})"
    return f" (the Redis user of the URL may not do this: {where})"


def read_password(env: str | None = None, file: str | None = None) -> str:
    """The password from the environment variable ``env`` or the first line of ``file``.

    Raises:
        ConfigError: neither given, the variable is unset or empty, or the file is missing or empty.
    """
    if file:
        try:
            text = Path(file).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"secret file {file}: {exc.strerror}") from exc
        if not text or not text[0].strip():
            raise ConfigError(f"secret file {file} is empty")
        return text[0].strip()
    if env:
        value = os.environ.get(env, "")
        if not value:
            raise ConfigError(f"environment variable {env} is not set (it holds the password)")
        return value
    raise ConfigError("give the password with --password-env VAR or --password-file FILE")


def _nodes(client: redis.Redis) -> list[Any]:
    """The clients to run an ACL command on: the server, or every master of a cluster (ACLs are per node)."""
    if is_cluster(client):
        return [node.redis_connection for node in client.get_primaries()]  # type: ignore[attr-defined]
    return [client]


def _set_user(client: redis.Redis, user: str, head: list[str], found: list[str]) -> list[str]:
    """ACL SETUSER ``user`` with ``head`` then ``found``; a rule naming a command this server does
    not know (``+client|setinfo`` before Redis 7.2: its clients never send it) is left out.

    Returns:
        The rules applied.
    """
    found = list(found)
    while True:
        try:
            _acl(client, "SETUSER", user, *head, *found)
            return found
        except redis.ResponseError as exc:
            unknown = re.search(r"modifier '([^']+)': Unknown command", str(exc))
            if unknown is None or unknown.group(1) not in found or unknown.group(1) not in CONNECTION:
                raise
            found.remove(unknown.group(1))


def _acl(client: redis.Redis, *args: Any) -> list[Any]:
    return [node.execute_command("ACL", *args) for node in _nodes(client)]


@translate_errors
def add_user(
    client: redis.Redis, qm: str, user: str, spec: RoleSpec, password: str, move: bool = False
) -> list[str]:
    """Create or replace ACL user ``user`` with ``spec``'s role on ``qm``; returns its rules.

    A publisher is also bound to its publisher ids (``broker.core.principals``). A publisher id
    has one principal: an id bound to another user is refused, or with ``move`` taken from it
    (that user's binding, record and ACL rules lose the id: it may no longer wait for the id's
    results). The password is sent with ``>``, never stored by the broker.

    Raises:
        InvalidName: a bad user name or binding.
        PublisherIdBound: a publisher id is bound to another user and ``move`` is false; nothing
            was changed.
    """
    check_principal(user)
    if user == "default":
        raise InvalidName("the default user is not a broker role; pick another name")
    if spec.role == "publisher":
        check_publisher_ids(spec.publisher_ids)
        taken = holders(client, qm, user, spec.publisher_ids)
        if taken and not move:
            raise PublisherIdBound(user, taken)
    spec.created_ms = spec.created_ms or clock.now_ms()
    found = rules(qm, user, spec)
    found = _set_user(client, user, ["reset", "on", f">{password}"], found)
    client.hset(_registry(qm), user, spec.to_json())
    if spec.role == "publisher":
        for other, ids in bind(client, qm, user, spec.publisher_ids, move=move).items():
            _drop_publisher_ids(client, qm, other, ids)
    return found


def _drop_publisher_ids(client: redis.Redis, qm: str, user: str, ids: list[str]) -> None:
    """Take ``ids`` out of broker user ``user``'s record and ACL rules (its password and state kept);
    a user the broker did not record, or the server does not know, is left alone."""
    raw = client.hget(_registry(qm), user)
    if raw is None or _nodes(client)[0].execute_command("ACL", "GETUSER", user) is None:
        return
    try:
        spec = RoleSpec.from_json(raw)
    except ValueError:
        return
    spec.publisher_ids = [pid for pid in spec.publisher_ids if pid not in ids]
    _set_user(client, user, [], rules(qm, user, spec))
    client.hset(_registry(qm), user, spec.to_json())


@translate_errors
def rotate(client: redis.Redis, user: str, password: str, keep_old: bool = True) -> None:
    """Give ``user`` a new password; with ``keep_old`` the old ones stay valid until a second
    rotation with ``keep_old=False`` (clients move over without a moment refused)."""
    args = [f">{password}"] if keep_old else ["resetpass", f">{password}"]
    _acl(client, "SETUSER", user, *args)


@translate_errors
def delete_user(client: redis.Redis, qm: str, user: str) -> bool:
    """Delete ACL user ``user`` (and its principal binding); returns whether it existed."""
    done = _acl(client, "DELUSER", user)
    client.hdel(_registry(qm), user)
    unbind(client, qm, user)
    return any(int(n) for n in done)


@dataclass
class UserRow:
    """A broker ACL user for ``broker acl list`` (never its password)."""

    user: str
    role: str
    bindings: str
    enabled: bool
    rules: str


@translate_errors
def list_users(client: redis.Redis, qm: str) -> tuple[list[UserRow], list[str]]:
    """The users the broker made for ``qm``, with their rules as Redis holds them; and problems."""
    rows, problems = [], []
    for raw_user, raw in sorted(client.hgetall(_registry(qm)).items()):
        user = wire.text(raw_user)
        try:
            spec = RoleSpec.from_json(raw)
        except ValueError as exc:
            problems.append(f"{_registry(qm)} field {user!r}: {exc}")
            continue
        found = _nodes(client)[0].execute_command("ACL", "GETUSER", user)
        if found is None:
            problems.append(f"user {user!r} is recorded but not in the server's ACL")
            continue
        info = _getuser(found)
        bindings = (
            ", ".join(spec.publisher_ids)
            if spec.role == "publisher"
            else spec.client_id or ", ".join(spec.peers)
        )
        rows.append(
            UserRow(
                user,
                spec.role,
                bindings,
                "on" in info.get("flags", []),
                f"{info.get('commands', '')} {info.get('keys', '')}".strip(),
            )
        )
    return rows, problems


def _getuser(found: Any) -> dict[str, Any]:
    """ACL GETUSER's reply as a dict of text (RESP2 flat list or RESP3 map)."""
    if isinstance(found, dict):
        items = list(found.items())
    else:
        items = [(found[i], found[i + 1]) for i in range(0, len(found), 2)]

    def text(value: Any) -> Any:
        if isinstance(value, bytes):
            return wire.text(value)
        if isinstance(value, list):
            return [text(v) for v in value]
        return value

    return {text(k): text(v) for k, v in items}


@translate_errors
def acl_file(client: redis.Redis, qm: str) -> str:
    """ACL file lines (``user <name> on #<sha256> <rules>``) for every broker user of ``qm``,
    for an operator's own Redis (``aclfile``); passwords appear only as their SHA-256."""
    lines = []
    for raw_user, raw in sorted(client.hgetall(_registry(qm)).items()):
        user = wire.text(raw_user)
        try:
            spec = RoleSpec.from_json(raw)
        except ValueError:
            continue
        found = _nodes(client)[0].execute_command("ACL", "GETUSER", user)
        if found is None:
            continue
        info = _getuser(found)
        hashes = " ".join(f"#{h}" for h in info.get("passwords", []))
        state = "on" if "on" in info.get("flags", []) else "off"
        lines.append(f"user {user} {state} {hashes} {' '.join(rules(qm, user, spec))}".replace("  ", " "))
    return "\n".join(lines) + ("\n" if lines else "")


def admin_acl_file(user: str, password: str) -> str:
    """The ACL file of an embedded server run with ``security = true``: the default user off,
    and ``user`` (from the URL's credentials) allowed everything."""
    check_principal(user)
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user default off\nuser {user} on #{digest} ~* &* +@all\n"


def _registry(qm: str) -> str:
    return keys.acl_users(qm)
