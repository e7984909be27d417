"""The management HTTP API under ``/api/``: JSON, in the console's process (``broker console``).

Laid out like RabbitMQ's management API (``/api/overview``, ``/api/queues``,
``/api/definitions``); ``/api/openapi.json`` (``broker.operations.console.openapi``) documents
every path. The same logins and roles as the console's pages (``auth``): a ``monitor`` reads
(GET), an ``admin`` also writes (PUT, POST, DELETE). A script authenticates each request with
HTTP basic auth (a Redis ACL user's name and password: the request runs on a connection
opened as that user, closed after it); a browser uses the console's session cookie, and sends
the session's CSRF token in the ``X-CSRF-Token`` header with every write (``GET /api/whoami``
gives it). Every call reads and writes with the user's own Redis client, so Redis refuses
what the role may not do even if this module had a bug.

Errors are ``{"error": <message>, "kind": <error class>}`` with the status code: 400 bad input,
401 not authenticated, 403 refused (the role, the CSRF token, or Redis), 404 no such object,
409 a conflict with what exists (or a foreign key), 503 Redis unreachable.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from broker.clients.consumer import BROWSE_MAX, browse, consumers_of
from broker.clients.publish import Publisher
from broker.core import keys, wire
from broker.core.config import Settings
from broker.core.connection import read_hash
from broker.core.errors import (
    BrokerError,
    ConnectionLost,
    CorruptRecord,
    ForeignKey,
    InvalidDefinitions,
    LinkCycle,
    LoginRefused,
    NoSuchSubscription,
    NoSuchTopicObject,
    NotAuthorized,
    PublisherIdBound,
    SubscriptionConflict,
    SubscriptionRefused,
    TooManySubscriptions,
    TopicObjectConflict,
    UsersNeedOperator,
)
from broker.core.models import Message
from broker.core.schemes import recorded_scheme, separator
from broker.core.topic_rules import limit_problem
from broker.operations import dead_letters, definitions
from broker.operations import grants as grant_ops
from broker.operations.acl import RoleSpec
from broker.operations.console import dlq as dlq_views
from broker.operations.console import figures, openapi
from broker.operations.console.auth import Session, SessionStore
from broker.operations.console.samples import SampleRing
from broker.operations.dead_letters import DeadLetter, Selection
from broker.operations.grants import list_grants
from broker.operations.status import status
from broker.topics import declared, links, topic_objects
from broker.topics.subscriptions import (
    SubscriptionRecord,
    check_filter,
    purge_subscription,
    read_subscriptions,
    subscribe,
    unsubscribe,
)

_log = logging.getLogger(__name__)

#: The header a browser session sends its CSRF token in, with every write.
CSRF_HEADER = "x-csrf-token"

#: The lists of a grant (``broker.operations.grants.grant``'s keyword arguments).
GRANT_KINDS = ("publish", "subscribe", "publish_objects", "subscribe_objects")

#: Most dead letters one list answer holds.
MAX_DEAD_LETTERS = 1_000


class ApiError(Exception):
    """An answer other than 2xx, decided by the API itself (a missing field, a role refused).

    Attributes:
        status: the HTTP status code.
        kind: the ``kind`` of the JSON error.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class Call:
    """One API request, as a handler sees it (in a worker thread).

    Attributes:
        session: the caller's session (its Redis client is the user's).
        params: the path's parameters.
        query: the query string's parameters.
        body: the JSON body (an object; ``{}`` when there is none).
    """

    session: Session
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: dict[str, Any]

    @property
    def client(self) -> redis.Redis:
        return self.session.client

    def text(self, name: str, default: str | None = None) -> str:
        """The body's string field ``name``. Raises: ApiError: 400 missing or not a string."""
        value = self.body.get(name, default)
        if not isinstance(value, str):
            raise ApiError(400, "BadRequest", f"field {name!r} must be a string")
        return value

    def flag(self, name: str) -> bool:
        """The body's boolean field ``name`` (false when absent). Raises: ApiError: 400 not a boolean."""
        value = self.body.get(name, False)
        if not isinstance(value, bool):
            raise ApiError(400, "BadRequest", f"field {name!r} must be true or false")
        return value

    def count(self, default: int, most: int) -> int:
        """The query's ``count``: 1 to ``most``. Raises: ApiError: 400 otherwise."""
        raw = self.query.get("count", str(default))
        if not raw.isdigit() or not 1 <= int(raw) <= most:
            raise ApiError(400, "BadRequest", f"count must be 1 to {most}, not {raw!r}")
        return int(raw)


Answer = tuple[int, Any]
Handler = Callable[[Call], Answer]


def status_of(exc: BaseException) -> int:
    """The HTTP status of an error a handler raised (see the module docstring)."""
    cause = exc.__cause__ if isinstance(exc, BrokerError) and exc.__cause__ else exc
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(cause, redis.exceptions.NoPermissionError) or isinstance(
        exc, (NotAuthorized, UsersNeedOperator)
    ):
        return 403
    if isinstance(cause, redis.ResponseError) and "no permissions" in str(cause):  # ACL failure in a script
        return 403
    if isinstance(cause, redis.AuthenticationError):
        return 401
    if isinstance(exc, ConnectionLost) or isinstance(cause, (redis.ConnectionError, redis.TimeoutError)):
        return 503
    if isinstance(exc, (LookupError, NoSuchTopicObject)):
        return 404
    conflicts = (
        SubscriptionConflict,
        TopicObjectConflict,
        LinkCycle,
        PublisherIdBound,
        ForeignKey,
        CorruptRecord,
        TooManySubscriptions,
        SubscriptionRefused,
    )
    if isinstance(exc, conflicts) or (isinstance(exc, InvalidDefinitions) and exc.conflict):
        return 409
    if isinstance(exc, (ValueError, ValidationError)):
        return 400
    return 500


def error_response(status_code: int, kind: str, message: str) -> JSONResponse:
    """The JSON error answer; a 401 asks for basic auth."""
    headers = {"WWW-Authenticate": 'Basic realm="broker"'} if status_code == 401 else None
    return JSONResponse({"error": message, "kind": kind}, status_code=status_code, headers=headers)


def _basic(header: str) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic`` header, or None."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


class Api:
    """The API's handlers for one queue manager: the console's sessions, settings and rate meter."""

    def __init__(
        self,
        settings: Settings,
        store: SessionStore,
        meter: figures.RateMeter,
        cookie: str,
        samples: SampleRing | None = None,
    ) -> None:
        self.settings = settings
        self.qm = settings.qm
        self.store = store
        self.meter = meter
        self.cookie = cookie
        self.samples = samples if samples is not None else SampleRing()

    # --- authentication and the one wrapper of every endpoint --------------------------------

    async def _caller(self, request: Request, write: bool) -> tuple[Session, bool]:
        """The session of a request and whether it was made for it alone (basic auth).

        Raises:
            ApiError: 401 no credentials, refused ones or a session ended; 403 a write without
                the session's CSRF token.
        """
        header = request.headers.get("authorization")
        if header is not None:
            pair = _basic(header)
            if pair is None:
                raise ApiError(
                    401, "LoginRefused", "use HTTP basic auth: Authorization: Basic <user:password>"
                )
            try:
                return await run_in_threadpool(self.store.login, *pair), True
            except LoginRefused as exc:
                raise ApiError(401, "LoginRefused", str(exc)) from exc
        session = self.store.find(request.cookies.get(self.cookie))
        if session is None or not await run_in_threadpool(self.store.still_valid, session):
            raise ApiError(401, "LoginRefused", "not logged in: use HTTP basic auth or the console's session")
        if write and not session.csrf_ok(request.headers.get(CSRF_HEADER)):
            raise ApiError(
                403, "CsrfRefused", "a write from a session needs its X-CSRF-Token header; nothing was done"
            )
        return session, False

    def endpoint(self, handler: Handler, write: bool) -> Callable[[Request], Awaitable[Response]]:
        """An endpoint: authenticate, check the role (a write needs admin), parse the body, run
        ``handler`` in a thread, answer JSON; every error becomes ``{"error", "kind"}``."""

        async def run(request: Request) -> Response:
            session: Session | None = None
            transient = False
            try:
                session, transient = await self._caller(request, write)
                if write and not session.may_act:
                    raise ApiError(403, "RoleRefused", f"user {session.user!r} (monitor) may only read")
                body = await self._body(request) if write else {}
                call = Call(session, dict(request.path_params), dict(request.query_params), body)
                code, data = await run_in_threadpool(handler, call)
            except (ApiError, BrokerError, redis.RedisError, ValueError) as exc:
                kind = exc.kind if isinstance(exc, ApiError) else type(exc).__name__
                return error_response(status_of(exc), kind, str(exc))
            except Exception as exc:  # a bug: logged, and still a JSON answer
                _log.exception("management API: %s %s failed", request.method, request.url.path)
                return error_response(500, "InternalError", f"{type(exc).__name__}: {exc}")
            finally:
                if transient and session is not None:
                    self.store.logout(session)
            if code == 204:
                return Response(status_code=204)
            return JSONResponse(data, status_code=code)

        return run

    @staticmethod
    async def _body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        return data

    # --- overview, identity ------------------------------------------------------------------

    def whoami(self, call: Call) -> Answer:
        s = call.session
        return 200, {"user": s.user, "role": s.role, "may_act": s.may_act, "csrf": s.csrf}

    def overview(self, call: Call) -> Answer:
        data = figures.overview(call.client, self.qm, self.meter)
        return 200, {"qm": self.qm, **json.loads(json.dumps(data, default=str))}

    def series(self, call: Call) -> Answer:
        return 200, self.samples.series()

    # --- publishing --------------------------------------------------------------------------

    def publish(self, call: Call) -> Answer:
        """Publish one message as the console's user, with ``broker.clients.publish.Publisher``
        (its checks: the topic, 0-9 priority, scalar properties). Body: ``topic``, ``body``
        (UTF-8 text), optional ``properties`` (an object of scalars), ``priority``,
        ``persistent``, ``msgid``, ``publisher_id`` (default ``console-<user>``).
        Answers 202 ``{"msgid", "entry_id", "status"}``: handed to the broker, not yet delivered;
        400 ``InvalidTopic`` for a topic over ``Settings.max_topic_bytes`` / ``max_topic_levels``."""
        properties = call.body.get("properties") or {}
        if not isinstance(properties, dict):
            raise ApiError(400, "BadRequest", "field 'properties' must be an object")
        priority = call.body.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise ApiError(400, "BadRequest", "field 'priority' must be an integer 0-9")
        persistent = call.body.get("persistent")
        if persistent is not None and not isinstance(persistent, bool):
            raise ApiError(400, "BadRequest", "field 'persistent' must be true or false")
        publisher_id = call.text("publisher_id", f"console-{call.session.user}")
        msgid = call.text("msgid", "") or None
        scheme = recorded_scheme(call.client, self.qm)
        topic = call.text("topic")
        s = self.settings  # the workers would dead-letter it (worker.decide): refuse it here instead
        over = limit_problem(topic, s.max_topic_bytes, s.max_topic_levels, separator(scheme), "the topic")
        if over is not None:
            raise ApiError(400, "InvalidTopic", f"{over}; nothing was published")
        publisher = Publisher(call.client, self.qm, publisher_id, scheme=scheme, flow_control=False)
        result = publisher.publish(
            topic,
            call.text("body", ""),
            properties=properties,
            msgid=msgid,
            priority=priority,
            persistent=persistent,
        )
        return 202, {"msgid": result.msgid, "entry_id": result.entry_id, "status": result.status}

    # --- subscriptions -----------------------------------------------------------------------

    def _rows(self, client: redis.Redis) -> dict[str, dict[str, Any]]:
        snap = status(client, self.qm, keyspace=False)
        return {row.id: asdict(row) for row in snap.subscriptions}

    @staticmethod
    def _record(record: SubscriptionRecord) -> dict[str, Any]:
        return {
            "id": record.sub_id,
            "filter": record.shown_filter,
            "durable": record.durable,
            "selector": record.selector,
            "no_local": record.no_local,
            "mode": record.mode,
            "share": record.share,
            "created_ms": record.created_ms,
        }

    def _find(self, client: redis.Redis, sub_id: str) -> SubscriptionRecord:
        for record in read_subscriptions(client, self.qm)[0]:
            if record.sub_id == sub_id:
                return record
        raise NoSuchSubscription(f"no subscription {sub_id!r} in queue manager {self.qm!r}")

    def subscriptions(self, call: Call) -> Answer:
        rows = self._rows(call.client)
        records = read_subscriptions(call.client, self.qm)[0]
        return 200, [{**rows.get(r.sub_id, {}), **self._record(r)} for r in records]

    def subscription(self, call: Call) -> Answer:
        record = self._find(call.client, call.params["sub_id"])
        row = self._rows(call.client).get(record.sub_id, {})
        found = consumers_of(call.client, self.qm, record.sub_id)
        consumers = [{"consumer": c, "lease_deadline_ms": ms} for c, ms in found]
        return 200, {**row, **self._record(record), "consumer_leases": consumers}

    def create_subscription(self, call: Call) -> Answer:
        sub_id = call.params["sub_id"]
        owner, dollar, name = sub_id.partition("$")
        if not dollar:
            raise ApiError(400, "BadRequest", "a subscription id is <client id>$<name>")
        topic_filter = call.text("filter")
        share, _ = check_filter(topic_filter, recorded_scheme(call.client, self.qm), self.settings)
        if share and share != owner:  # before anything is written
            raise ApiError(
                400, "BadRequest", f"a $share/{share}/ filter makes {share}$<name>, not {sub_id!r}"
            )
        existed = bool(call.client.hexists(keys.subscriptions(self.qm), sub_id))
        record = subscribe(
            call.client,
            self.qm,
            topic_filter,
            owner,
            name,
            shared=call.flag("shared"),
            selector=call.text("selector", "") or None,
            no_local=call.flag("no_local"),
            settings=self.settings,
        )
        return (200 if existed else 201), self._record(record)

    def delete_subscription(self, call: Call) -> Answer:
        unsubscribe(call.client, self.qm, call.params["sub_id"])
        return 204, None

    def purge(self, call: Call) -> Answer:
        return 200, {"purged": purge_subscription(call.client, self.qm, call.params["sub_id"])}

    def messages(self, call: Call) -> Answer:
        record = self._find(call.client, call.params["sub_id"])
        found = browse(call.client, self.qm, record, call.count(10, BROWSE_MAX))
        return 200, [_message(m) for m in found]

    def consumers(self, call: Call) -> Answer:
        out = []
        for record in read_subscriptions(call.client, self.qm)[0]:
            for consumer, deadline in consumers_of(call.client, self.qm, record.sub_id):
                out.append(
                    {"subscription": record.sub_id, "consumer": consumer, "lease_deadline_ms": deadline}
                )
        return 200, out

    # --- links, topic objects, declared topics -----------------------------------------------

    def links(self, call: Call) -> Answer:
        found = links.list_links(call.client, self.qm)
        return 200, [{"source": s, "target": t, "backward": b} for s, t, b in found]

    def create_link(self, call: Call) -> Answer:
        source, target = call.text("source"), call.text("target")
        links.link(call.client, self.qm, source, target, backward=call.flag("backward"))
        return 201, {"source": source, "target": target, "backward": call.flag("backward")}

    def delete_link(self, call: Call) -> Answer:
        source, target = call.query.get("source"), call.query.get("target")
        if not source or not target:
            raise ApiError(400, "BadRequest", "give the link's source and target as query parameters")
        links.unlink(call.client, self.qm, source, target)
        return 204, None

    def topic_objects(self, call: Call) -> Answer:
        return 200, [o.model_dump(mode="json") for o in topic_objects.display(call.client, self.qm, "*")]

    def topic_object(self, call: Call) -> Answer:
        return 200, topic_objects.display(call.client, self.qm, call.params["name"])[0].model_dump(
            mode="json"
        )

    def define_topic_object(self, call: Call) -> Answer:
        name = call.params["name"]
        given = call.body.get("attributes", {})
        if not isinstance(given, dict):
            raise ApiError(400, "BadRequest", "attributes must be an object of attribute -> value")
        attributes = topic_objects.Attributes(**given)
        existed = name in topic_objects.read_tree(call.client, self.qm).objects
        obj = topic_objects.define(
            call.client,
            self.qm,
            name,
            call.text("topic_string"),
            attributes,
            call.text("description", ""),
            replace=True,
        )
        return (200 if existed else 201), obj.model_dump(mode="json")

    def delete_topic_object(self, call: Call) -> Answer:
        topic_objects.delete(call.client, self.qm, call.params["name"])
        return 204, None

    def declared_topics(self, call: Call) -> Answer:
        found = declared.list_declared(call.client, self.qm)[0]
        return 200, [{"topic": d.topic, "declared_ms": d.declared_ms, "source": d.source} for d in found]

    def declare(self, call: Call) -> Answer:
        made = declared.declare(call.client, self.qm, call.params["topic"], source="api")
        return (201 if made else 200), {"topic": call.params["topic"]}

    def undeclare(self, call: Call) -> Answer:
        declared.undeclare(call.client, self.qm, call.params["topic"])
        return 204, None

    # --- dead letters ------------------------------------------------------------------------

    def dead_letters(self, call: Call) -> Answer:
        selection = dlq_views.selection_of(dlq_views.filters_of(call.query))
        found, problems = dead_letters.list_dead_letters(
            call.client, self.qm, selection, count=call.count(100, MAX_DEAD_LETTERS)
        )
        return 200, {
            "dead_letters": [_dead_letter(e) for e in found],
            "problems": problems,
            "by_reason": dead_letters.count_by_reason(call.client, self.qm),
        }

    def dead_letter(self, call: Call) -> Answer:
        return 200, dlq_views.entry(call.client, self.qm, call.params["dlq_id"])

    def _selection(self, call: Call) -> Selection:
        ids = call.body.get("ids", [])
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ApiError(400, "BadRequest", "ids must be a list of dead-letter ids")
        given = {k: call.text(k) for k in ("reason", "publisher", "topic", "subscription") if k in call.body}
        return Selection(ids=tuple(ids), everything=call.flag("all"), **given)

    def replay(self, call: Call) -> Answer:
        report = dead_letters.replay(call.client, self.qm, self._selection(call), keep=call.flag("keep"))
        return 200, {
            "replayed": report.replayed,
            "requeued": report.requeued,
            "skipped": [{"id": i, "why": why} for i, why in report.skipped],
            "kept": report.kept,
            "live_workers": report.live_workers,
        }

    def purge_dead_letters(self, call: Call) -> Answer:
        return 200, {"purged": dead_letters.purge(call.client, self.qm, self._selection(call))}

    # --- workers, channels, users, grants, definitions ----------------------------------------

    def workers(self, call: Call) -> Answer:
        return 200, [asdict(w) for w in status(call.client, self.qm, keyspace=False).workers]

    def channels(self, call: Call) -> Answer:
        data = figures.workers_and_channels(call.client, self.settings, call.session.url)
        return 200, json.loads(
            json.dumps({"network": data["network"], "problems": data["problems"]}, default=str)
        )

    def users(self, call: Call) -> Answer:
        out = []
        for raw_user, raw in sorted(read_hash(call.client, keys.acl_users(self.qm)).items()):
            try:
                spec = RoleSpec.from_json(raw)
            except ValueError:
                continue
            out.append({"name": wire.lenient_text(raw_user), **asdict(spec)})
        return 200, out

    def grants(self, call: Call) -> Answer:
        found = list_grants(call.client, self.qm)[0]
        return 200, {user: asdict(record) for user, record in found.items()}

    def _kinds(self, call: Call) -> dict[str, list[str]]:
        """The body's grant lists (``GRANT_KINDS``), each a list of strings. Raises: ApiError: 400."""
        out: dict[str, list[str]] = {}
        for kind in GRANT_KINDS:
            value = call.body.get(kind, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ApiError(400, "BadRequest", f"field {kind!r} must be a list of strings")
            out[kind] = value
        return out

    def grant(self, call: Call) -> Answer:
        """Add grants to a user (``broker acl grant``); answers the user's grants now."""
        record = grant_ops.grant(call.client, self.qm, call.params["user"], **self._kinds(call))
        return 200, asdict(record)

    def revoke(self, call: Call) -> Answer:
        """Take grants from a user (``broker acl revoke``; ``"all": true`` every one); answers
        the grants left."""
        kinds = self._kinds(call)
        record = grant_ops.revoke(
            call.client, self.qm, call.params["user"], **kinds, everything=call.flag("all")
        )
        return 200, asdict(record)

    def export(self, call: Call) -> Answer:
        return 200, definitions.export_definitions(call.client, self.settings)

    def import_(self, call: Call) -> Answer:
        """Import the body's definitions document; query ``skip_users=true`` leaves out the users
        the queue manager lacks (an admin may not make ACL users: 403 ``UsersNeedOperator`` without it)."""
        skip = call.query.get("skip_users", "false")
        if skip not in ("true", "false"):
            raise ApiError(400, "BadRequest", f"skip_users must be true or false, not {skip!r}")
        report = definitions.import_definitions(
            call.client, self.settings, call.body, skip_users=skip == "true"
        )
        return 200, report.as_dict()


def _dead_letter(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter in a list: its id, time (ms since the epoch), reason and where it came from."""
    return {
        "id": letter.id,
        "time_ms": letter.time_ms,
        "reason": letter.reason,
        "publisher": letter.publisher,
        "topic": letter.topic,
        "msgid": letter.msgid,
        "subscription": letter.subscription,
        "entry_id": letter.entry_id,
        "body_size": letter.body_size,
    }


def _message(message: Message) -> dict[str, Any]:
    """A browsed message as JSON: its body as text when it is UTF-8, else base64 (``body_encoding``)."""
    data = message.model_dump(mode="json", exclude={"body", "msgid_bytes"})
    try:
        data["body"], data["body_encoding"] = message.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        data["body"], data["body_encoding"] = base64.b64encode(message.body).decode(), "base64"
    return data


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi.document())


async def _no_endpoint(request: Request) -> Response:
    return error_response(404, "NotFound", f"no endpoint {request.method} {request.url.path}")


def mount(api: Api) -> Mount:
    """``/api``: the routes, ``/api/openapi.json`` (no login: it documents, it shows no data) and a
    JSON 404 for any other path or method."""
    every = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"]
    extra = [Route("/openapi.json", _openapi), Route("/{rest:path}", _no_endpoint, methods=every)]
    return Mount("/api", routes=[*routes(api), *extra])


def routes(api: Api) -> list[Route]:
    """The API's routes under ``/api``; ``openapi.OPERATIONS`` documents each."""
    read, write = (lambda h: api.endpoint(h, False)), (lambda h: api.endpoint(h, True))
    sub = "/subscriptions/{sub_id}"
    return [
        Route("/whoami", read(api.whoami)),
        Route("/overview", read(api.overview)),
        Route("/samples", read(api.series)),
        Route("/publish", write(api.publish), methods=["POST"]),
        Route("/subscriptions", read(api.subscriptions)),
        Route(sub, read(api.subscription), methods=["GET"]),
        Route(sub, write(api.create_subscription), methods=["PUT"]),
        Route(sub, write(api.delete_subscription), methods=["DELETE"]),
        Route(sub + "/contents", write(api.purge), methods=["DELETE"]),
        Route(sub + "/messages", read(api.messages)),
        Route("/consumers", read(api.consumers)),
        Route("/links", read(api.links), methods=["GET"]),
        Route("/links", write(api.create_link), methods=["POST"]),
        Route("/links", write(api.delete_link), methods=["DELETE"]),
        Route("/topic-objects", read(api.topic_objects)),
        Route("/topic-objects/{name:path}", read(api.topic_object), methods=["GET"]),
        Route("/topic-objects/{name:path}", write(api.define_topic_object), methods=["PUT"]),
        Route("/topic-objects/{name:path}", write(api.delete_topic_object), methods=["DELETE"]),
        Route("/declared-topics", read(api.declared_topics)),
        Route("/declared-topics/{topic}", write(api.declare), methods=["PUT"]),
        Route("/declared-topics/{topic}", write(api.undeclare), methods=["DELETE"]),
        Route("/dead-letters", read(api.dead_letters)),
        Route("/dead-letters/replay", write(api.replay), methods=["POST"]),
        Route("/dead-letters/purge", write(api.purge_dead_letters), methods=["POST"]),
        Route("/dead-letters/{dlq_id:path}", read(api.dead_letter)),
        Route("/workers", read(api.workers)),
        Route("/channels", read(api.channels)),
        Route("/users", read(api.users)),
        Route("/grants", read(api.grants)),
        Route("/grants/{user}", write(api.grant), methods=["POST"]),
        Route("/grants/{user}/revoke", write(api.revoke), methods=["POST"]),
        Route("/definitions", read(api.export), methods=["GET"]),
        Route("/definitions", write(api.import_), methods=["POST"]),
    ]
