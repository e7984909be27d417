"""Console logins: a Redis ACL user of role ``monitor`` or ``admin``, one Redis client per session.

A login is checked by Redis itself: the console opens a connection AS the user
(``AUTH user password``) and reads the user's role from the broker's registry
``{qm}:acl`` (``broker.operations.acl``) over that connection. Only ``monitor`` (sees) and
``admin`` (acts) may log in. The session keeps that connection's client, so every
figure a page shows is read with the user's own rights and Redis refuses a
monitor's writes even if the console had a bug.

Sessions live in this process's memory (``SessionStore``); the cookie carries a
random session id signed with a key made at start-up (``itsdangerous``), so a
restart logs everybody out. Each session has its own CSRF token, sent with every
form, and the confirmations waiting for an answer (``Pending``).

A session ends when its user's credentials or role change (``SessionStore.still_valid``,
before every page and action): the connections it holds stay authenticated in Redis after a
password rotation (``broker acl rotate --drop-old``), and a role read at login would outlive a
downgrade, so each request checks the password again (``AUTH``) and the user's record in
``{qm}:acl`` against the one it logged in with.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from itsdangerous import BadSignature, URLSafeSerializer

from broker.core import keys
from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import ConnectionLost, LoginRefused
from broker.operations.acl import RoleSpec

ConsoleRole = Literal["monitor", "admin"]

#: The roles that may log in to the console.
CONSOLE_ROLES: tuple[ConsoleRole, ...] = ("monitor", "admin")

#: The one message of every refused login (it never says whether the name or the password was wrong).
REFUSED = "Login refused: unknown user, wrong password, or a user that is neither monitor nor admin."

#: How long a confirmation page's answer is accepted, ms.
PENDING_TTL_MS = 10 * 60_000


def url_as(url: str, user: str, password: str) -> str:
    """``url`` (a ``redis://`` or ``rediss://`` URL, cluster ones too) with ``user:password`` as its credentials.

    Any credentials ``url`` had are replaced.
    """
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = "&".join(
            p for p in parts.query.split("&") if p and not p.startswith(("username=", "password="))
        )
        extra = f"username={quote(user, safe='')}&password={quote(password, safe='')}"
        return urlunsplit(parts._replace(query=f"{query}&{extra}" if query else extra))
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Pending:
    """A destructive action shown on a confirmation page and not yet answered.

    Attributes:
        action: ``replay`` or ``purge``.
        ids: the dead-letter ids it acts on (resolved when the page was shown).
        keep: replay only: keep the dead letters after replaying them.
        made_ms: when the confirmation page was shown, ms (monotonic clock).
    """

    action: str
    ids: tuple[str, ...]
    keep: bool = False
    made_ms: float = 0.0


@dataclass
class Session:
    """One logged-in user.

    Attributes:
        sid: the session id (the cookie carries it, signed).
        user: the Redis ACL user name.
        role: ``monitor`` or ``admin``.
        client: a Redis client authenticated as ``user``.
        url: the Redis URL with ``user``'s credentials (for a network's other queue managers).
        csrf: the token every form of this session must send back.
        pending: confirmation token -> the action it confirms.
        flash: one line shown on the next page (the outcome of an action).
        seen_ms: the last request, ms (monotonic clock).
        record: the user's record in ``{qm}:acl`` at login (its role and bindings): a change ends
            the session.
        password: the password it logged in with, checked again before every request (never shown).
    """

    sid: str
    user: str
    role: ConsoleRole
    client: redis.Redis
    url: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    pending: dict[str, Pending] = field(default_factory=dict)
    flash: str = ""
    seen_ms: float = 0.0
    record: bytes = b""
    password: str = field(default="", repr=False)

    @property
    def may_act(self) -> bool:
        """Whether this user may run destructive actions (replay, purge)."""
        return self.role == "admin"

    def csrf_ok(self, token: str | None) -> bool:
        """Whether ``token`` is this session's CSRF token (compared in constant time)."""
        return bool(token) and hmac.compare_digest(str(token), self.csrf)

    def add_pending(self, pending: Pending) -> str:
        """Remember ``pending``; returns the token its confirmation form sends back."""
        self._drop_stale(pending.made_ms)
        token = secrets.token_urlsafe(16)
        self.pending[token] = pending
        return token

    def take_pending(self, token: str | None, now_ms: float) -> Pending | None:
        """The action ``token`` confirms, once (it is forgotten); None if unknown or expired."""
        self._drop_stale(now_ms)
        return self.pending.pop(token, None) if token else None

    def _drop_stale(self, now_ms: float) -> None:
        for token, waiting in list(self.pending.items()):
            if now_ms - waiting.made_ms > PENDING_TTL_MS:
                del self.pending[token]


def _as_bytes(raw: Any) -> bytes:
    """A reply as bytes (the broker's clients never decode; a ``decode_responses`` client gives str)."""
    return raw.encode() if isinstance(raw, str) else bytes(raw)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class SessionStore:
    """The console's sessions, in memory, and the signing of their cookie.

    Args:
        settings: the broker settings (Redis URL, TLS, queue manager, ``console_session_idle_ms``).
        clock_ms: a monotonic clock in ms (injectable for tests).
        connector: makes a Redis client from a URL (``broker.core.connection.connect`` with the TLS settings).
    """

    def __init__(
        self,
        settings: Settings,
        clock_ms: Callable[[], float] = _monotonic_ms,
        connector: Callable[[str], redis.Redis] | None = None,
    ) -> None:
        self.settings = settings
        self.clock_ms = clock_ms
        self._connect = connector or (lambda url: connect(url, tls=settings.tls))
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._signer = URLSafeSerializer(secrets.token_bytes(32), salt="broker-console-session")

    def login(self, user: str, password: str) -> Session:
        """Check ``user``/``password`` against Redis and make a session.

        Raises:
            LoginRefused: wrong name or password, or a role other than monitor/admin.
            ConnectionLost: the server cannot be reached.
        """
        if not user or not password:
            raise LoginRefused(REFUSED)
        url = url_as(self.settings.redis_url, user, password)
        client = self._connect(url)
        try:
            raw = client.hget(keys.acl_users(self.settings.qm), user)
            spec = RoleSpec.from_json(raw) if raw is not None else None
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError, ValueError) as exc:
            client.close()
            raise LoginRefused(REFUSED) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            client.close()
            raise ConnectionLost(f"cannot reach Redis: {exc}") from exc
        except redis.ResponseError as exc:  # WRONGPASS comes as a ResponseError from some servers
            client.close()
            raise LoginRefused(REFUSED) from exc
        if spec is None or spec.role not in CONSOLE_ROLES:
            client.close()
            raise LoginRefused(REFUSED)
        now = self.clock_ms()
        session = Session(
            secrets.token_urlsafe(32),
            user,
            spec.role,  # type: ignore[arg-type]
            client,
            url,
            seen_ms=now,
            record=_as_bytes(raw),
            password=password,
        )
        with self._lock:
            self._expire(now)
            self._sessions[session.sid] = session
        return session

    def cookie_value(self, session: Session) -> str:
        """The signed session id the cookie carries."""
        return str(self._signer.dumps(session.sid))

    def find(self, cookie: str | None) -> Session | None:
        """The live session a cookie names, or None (no cookie, a bad signature, logged out, idle too long)."""
        if not cookie:
            return None
        try:
            sid = self._signer.loads(cookie)
        except BadSignature:
            return None
        now = self.clock_ms()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(str(sid))
            if session is not None:
                session.seen_ms = now
            return session

    def still_valid(self, session: Session) -> bool:
        """Whether ``session``'s user still holds what it logged in with; the session is ended if not.

        Its password must still authenticate (``AUTH`` on the session's connection: a password
        rotated with ``--drop-old`` no longer does, though the connections stay authenticated),
        and its record in ``{qm}:acl`` must be the one read at login (a role changed, the user
        made again). Two commands per request of the console, none on the broker's way.

        Raises:
            redis.ConnectionError, redis.TimeoutError: the server cannot be reached (the session is kept).
        """
        client = session.client
        try:
            client.execute_command("AUTH", session.user, session.password)
            record = client.hget(keys.acl_users(self.settings.qm), session.user)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except redis.RedisError:  # WRONGPASS (an AuthenticationError or a ResponseError), NOPERM
            record = None
        if record is not None and _as_bytes(record) == session.record:
            return True
        self.logout(session)
        return False

    def logout(self, session: Session) -> None:
        """End ``session`` and close its Redis client."""
        with self._lock:
            self._sessions.pop(session.sid, None)
        session.client.close()

    def close(self) -> None:
        """End every session (the app stops)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.client.close()

    def _expire(self, now: float) -> None:
        idle = self.settings.console_session_idle_ms
        for sid, session in list(self._sessions.items()):
            if now - session.seen_ms > idle:
                del self._sessions[sid]
                session.client.close()

    def __len__(self) -> int:
        return len(self._sessions)


def describe(session: Session) -> dict[str, Any]:
    """What templates show of a session: user, role, whether it may act, its CSRF token."""
    return {"user": session.user, "role": session.role, "may_act": session.may_act, "csrf": session.csrf}
