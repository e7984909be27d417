"""The web console's ASGI app (Starlette): server-rendered pages, htmx for live refresh.

Pages (GET): ``/`` overview, ``/subscriptions``, ``/topics``, ``/dlq`` (and
``/dlq/entry/<id>``), ``/workers``; each answers an htmx request (header
``HX-Request``) with its live fragment only, which the page asks for every
``REFRESH_S`` seconds. ``/login`` and ``/logout`` (POST). Destructive actions are
POST forms that need an ``admin`` session and its CSRF token: ``/dlq/confirm``
shows what would be done and to how many entries, and only its answer,
``/dlq/replay`` or ``/dlq/purge`` with the confirmation's one-time token, runs it.

``/api/`` is the management HTTP API (``broker.operations.console.api``), on the same sessions;
the managing pages (``/subscriptions/<id>``, ``/publish``, ``/manage``) are ``manage``'s, on it.
The chart samples' ring is filled by a background task the lifespan starts (``samples.run``).

Every figure is read with the logged-in user's own Redis client
(``broker.operations.console.auth``), so Redis refuses what the user's role may not do.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.core.config import Settings
from broker.core.connection import connect
from broker.core.errors import BrokerError, ConnectionLost, LoginRefused
from broker.operations.console import dlq as dlq_views
from broker.operations.console import figures, manage, samples
from broker.operations.console.api import Api, mount
from broker.operations.console.auth import Pending, Session, SessionStore, describe

#: The session cookie's name.
COOKIE = "broker_console"

#: How often a page asks for its live fragment, seconds.
REFRESH_S = 2

#: Most dead letters an "all matching" action covers (the oldest first); the confirmation says so.
CONFIRM_LIMIT = 10_000

#: Dead letters listed on one page.
PAGE_SIZE = 100

#: Headers of every answer: no framing, no scripts or styles from elsewhere, no referrer.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]

_HERE = Path(str(resources.files("broker.operations.console")))


class _SecurityHeaders:
    """ASGI middleware adding ``SECURITY_HEADERS`` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                names = {name for name, _ in message["headers"]}
                static = scope["path"].startswith("/static/")  # htmx and the stylesheet may be cached
                message["headers"] += [
                    (n, v)
                    for n, v in SECURITY_HEADERS
                    if n not in names and not (static and n == b"cache-control")
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _utc(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}/s"


def _number(value: Any) -> str:
    if value is None:
        return "?"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _templates() -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(str(_HERE / "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(utc=_utc, rate=_rate, number=_number, human_bytes=figures.human_bytes)
    env.globals["refresh_s"] = REFRESH_S
    return Jinja2Templates(env=env)


#: A page's handler: the request and its session in, the response out.
_Page = Callable[[Request, Session], Awaitable[Response]]
#: A Starlette endpoint.
_Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    settings: Settings,
    *,
    clock_ms: Callable[[], float] | None = None,
    sessions: SessionStore | None = None,
    sample_interval_s: float | None = samples.SAMPLE_INTERVAL_S,
) -> Starlette:
    """The console app for ``settings.qm`` on ``settings.redis_url``.

    Args:
        settings: the broker settings (Redis URL, TLS, queue manager, ``console_session_idle_ms``).
        clock_ms: a monotonic clock in ms for sessions and rates (injectable for tests).
        sessions: the session store (made from ``settings`` when None).
        sample_interval_s: seconds between two chart samples (``samples.run``, started with the
            app); None takes none (a test fills ``app.state.samples`` itself).

    Returns:
        A Starlette app; serve it with uvicorn (``broker console``). ``app.state.sessions`` is
        its ``SessionStore``, ``app.state.meter`` its ``figures.RateMeter``, ``app.state.samples``
        its ``samples.SampleRing``.
    """
    store = sessions or (SessionStore(settings, clock_ms) if clock_ms else SessionStore(settings))
    console = _Console(settings, store, figures.RateMeter(clock_ms))
    ring = samples.SampleRing()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        def own_client() -> redis.Redis:
            return connect(settings.redis_url, tls=settings.tls)

        sampler = None
        if sample_interval_s is not None:
            sampler = asyncio.create_task(samples.run(ring, own_client, settings.qm, sample_interval_s))
        yield
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        store.close()

    api = Api(settings, store, console.meter, COOKIE, ring)
    console.api = api  # the pages of ``manage`` read through the API's own handlers
    app = Starlette(
        routes=[mount(api), *_routes(console)], exception_handlers={404: _not_found}, lifespan=lifespan
    )
    app.add_middleware(_SecurityHeaders)
    app.state.sessions = store
    app.state.meter = console.meter
    app.state.samples = ring
    app.state.settings = settings
    return app


def _routes(console: _Console) -> list[Route | Mount]:
    """The console's routes: the login, the pages (a session needed), the confirmed actions
    (an admin session and its CSRF token), the static files."""
    static = StaticFiles(directory=str(_HERE / "static"))
    page, action = console.page, console.action
    return [
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route("/", page(console.overview)),
        Route("/subscriptions", page(console.subscriptions)),
        *[Route(path, page(handler)) for path, handler in manage.pages(console)],
        Route("/favicon.ico", _favicon),
        Route("/topics", page(console.topics)),
        Route("/workers", page(console.workers)),
        Route("/dlq", page(console.dlq)),
        Route("/dlq/entry/{dlq_id:path}", page(console.dlq_entry)),
        Route("/dlq/confirm", action(console.dlq_confirm), methods=["POST"]),
        Route("/dlq/replay", action(console.run_confirmed("replay")), methods=["POST"]),
        Route("/dlq/purge", action(console.run_confirmed("purge")), methods=["POST"]),
        Mount("/static", app=static, name="static"),
    ]


async def _favicon(request: Request) -> Response:
    return RedirectResponse("/static/favicon.svg", status_code=301)


async def _not_found(request: Request, exc: Exception) -> Response:
    return HTMLResponse(f"<p>{html.escape(request.url.path)}: no such page</p>", status_code=404)


class _Console:
    """The console's handlers for one queue manager: its sessions, rate meter and templates
    (``create_app`` routes to them)."""

    def __init__(self, settings: Settings, store: SessionStore, meter: figures.RateMeter) -> None:
        self.settings = settings
        self.qm = settings.qm
        self.store = store
        self.meter = meter
        self.templates = _templates()
        self.api: Api | None = None

    # --- answers ----------------------------------------------------------------------------

    def render(
        self,
        request: Request,
        name: str,
        context: dict[str, Any],
        session: Session | None,
        status_code: int = 200,
    ) -> Response:
        page = {"qm": self.qm, "session": describe(session) if session else None, **context}
        if session is not None and session.flash and name != "_flash.html":
            page["flash"], session.flash = session.flash, ""
        return self.templates.TemplateResponse(request, name, page, status_code=status_code)

    def error(self, request: Request, session: Session | None, status_code: int, message: str) -> Response:
        return self.render(
            request, "error.html", {"status_code": status_code, "message": message}, session, status_code
        )

    def fragment_or_page(
        self, request: Request, name: str, context: dict[str, Any], session: Session
    ) -> Response:
        if request.headers.get("hx-request"):
            return self.render(request, f"_{name}.html", context, session)
        return self.render(request, f"{name}.html", context, session)

    def current(self, request: Request) -> Session | None:
        return self.store.find(request.cookies.get(COOKIE))

    def to_login(self, request: Request) -> Response:
        if request.headers.get("hx-request"):
            return Response(status_code=200, headers={"HX-Redirect": "/login"})
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response = RedirectResponse(f"/login?next={_quote(target)}", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    # --- guards -----------------------------------------------------------------------------

    def page(self, handler: _Page) -> _Endpoint:
        """A page that needs a session; Redis refusals and lost connections become error pages."""

        async def endpoint(request: Request) -> Response:
            session = self.current(request)
            if session is None:
                return self.to_login(request)
            try:
                if not await run_in_threadpool(self.store.still_valid, session):  # password or role changed
                    return self.to_login(request)
                return await handler(request, session)
            except (redis.RedisError, BrokerError) as exc:
                return self.refused(request, session, exc)

        return endpoint

    def refused(self, request: Request, session: Session, exc: redis.RedisError | BrokerError) -> Response:
        """The answer to a page whose reading failed: the login page when the user's credentials
        no longer hold, else an error page (403 refused by Redis, 503 unreachable, 500 otherwise)."""
        # the broker's readers translate redis-py's errors: look at the cause
        cause = exc.__cause__ if isinstance(exc, BrokerError) and exc.__cause__ else exc
        if isinstance(cause, redis.AuthenticationError):  # the user was deleted, or its password changed
            self.store.logout(session)
            return self.to_login(request)
        if isinstance(cause, redis.exceptions.NoPermissionError):
            return self.error(request, session, 403, f"Redis refused this to user {session.user!r}: {cause}")
        if isinstance(exc, ConnectionLost) or isinstance(cause, (redis.ConnectionError, redis.TimeoutError)):
            return self.error(request, session, 503, f"Cannot reach Redis: {cause}")
        return self.error(request, session, 500, str(exc))

    def action(self, handler: _Page) -> _Endpoint:
        """A destructive POST: an admin session and its CSRF token, or 403 and nothing done."""

        async def guarded(request: Request, session: Session) -> Response:
            form = await request.form()
            if not session.may_act:
                return self.error(request, session, 403, f"User {session.user!r} (monitor) may not do this.")
            token = form.get("csrf")
            if not session.csrf_ok(token if isinstance(token, str) else None):
                return self.error(
                    request, session, 403, "This form is stale or forged (bad CSRF token); nothing was done."
                )
            return await handler(request, session)

        wrapped = self.page(guarded)

        async def endpoint(request: Request) -> Response:
            # a POST never redirects to the login page: refused (also once the password or role changed)
            session = self.current(request)
            if session is None:
                return self.error(request, None, 403, "Not logged in; nothing was done.")
            try:
                if not await run_in_threadpool(self.store.still_valid, session):
                    return self.error(request, None, 403, "Not logged in; nothing was done.")
            except (redis.RedisError, BrokerError) as exc:
                return self.refused(request, session, exc)
            return await wrapped(request)

        return endpoint

    # --- login ------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self.current(request) is not None:
            return RedirectResponse("/", status_code=303)
        return self.render(
            request, "login.html", {"next": _safe_next(request.query_params.get("next"))}, None
        )

    async def login(self, request: Request) -> Response:
        form = await request.form()
        user, password = str(form.get("user", "")).strip(), str(form.get("password", ""))
        target = _safe_next(str(form.get("next", "/")))
        try:
            session = await run_in_threadpool(self.store.login, user, password)
        except LoginRefused as exc:
            context = {"error": str(exc), "user": user, "next": target}
            return self.render(request, "login.html", context, None, 401)
        except (ConnectionLost, redis.ConnectionError, redis.TimeoutError) as exc:
            context = {"error": f"Cannot reach Redis: {exc}", "next": target}
            return self.render(request, "login.html", context, None, 503)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, self.store.cookie_value(session), httponly=True, samesite="strict", path="/"
        )
        return response

    async def logout(self, request: Request) -> Response:
        session = self.current(request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        form = await request.form()
        token = form.get("csrf")
        if not session.csrf_ok(token if isinstance(token, str) else None):
            return self.error(request, session, 403, "This form is stale or forged (bad CSRF token).")
        self.store.logout(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # --- pages ------------------------------------------------------------------------------

    async def overview(self, request: Request, session: Session) -> Response:
        data = await run_in_threadpool(figures.overview, session.client, self.qm, self.meter)
        return self.fragment_or_page(request, "overview", {"page": "overview", "s": data}, session)

    async def subscriptions(self, request: Request, session: Session) -> Response:
        search = request.query_params.get("q", "")
        data = await run_in_threadpool(figures.subscriptions, session.client, self.qm, search)
        return self.fragment_or_page(
            request, "subscriptions", {"page": "subscriptions", "s": data, "q": search}, session
        )

    async def topics(self, request: Request, session: Session) -> Response:
        data = await run_in_threadpool(figures.topics, session.client, self.qm)
        wanted = request.query_params.get("topic", "")
        found: dict[str, Any] | None = None
        problem = ""
        if wanted:
            try:
                found = await run_in_threadpool(figures.topic, session.client, self.settings, wanted)
            except ValueError as exc:  # InvalidTopic
                problem = str(exc)
        context = {"page": "topics", "s": data, "topic": wanted, "found": found, "problem": problem}
        return self.fragment_or_page(request, "topics", context, session)

    async def workers(self, request: Request, session: Session) -> Response:
        data = await run_in_threadpool(
            figures.workers_and_channels, session.client, self.settings, session.url
        )
        return self.fragment_or_page(request, "workers", {"page": "workers", "s": data}, session)

    # --- dead letters -----------------------------------------------------------------------

    async def dlq(self, request: Request, session: Session) -> Response:
        filters = dlq_views.filters_of(request.query_params)
        if request.headers.get("hx-request"):
            counts = await run_in_threadpool(dlq_views.counts, session.client, self.qm)
            context = {"page": "dlq", "counts": counts, "filters": filters}
            return self.render(request, "_dlq.html", context, session)
        data = await run_in_threadpool(dlq_views.listing, session.client, self.qm, filters, PAGE_SIZE)
        return self.render(request, "dlq.html", {"page": "dlq", "filters": filters, **data}, session)

    async def dlq_entry(self, request: Request, session: Session) -> Response:
        dlq_id = request.path_params["dlq_id"]
        try:
            entry = await run_in_threadpool(dlq_views.entry, session.client, self.qm, dlq_id)
        except LookupError:
            return self.error(request, session, 404, f"No dead letter {dlq_id!r}.")
        return self.render(request, "dlq_entry.html", {"page": "dlq", "e": entry}, session)

    async def dlq_confirm(self, request: Request, session: Session) -> Response:
        form = await request.form()
        what = str(form.get("action", ""))
        if what not in ("replay", "purge"):
            return self.error(request, session, 400, f"Unknown action {what!r}; nothing was done.")
        filters = dlq_views.filters_of(form)
        scope = str(form.get("scope", "selected"))
        ids = [str(v) for v in form.getlist("id")] if scope == "selected" else None
        keep = form.get("keep") == "1"
        plan = await run_in_threadpool(
            dlq_views.plan, session.client, self.qm, what, filters, ids, keep, CONFIRM_LIMIT
        )
        if not plan["ids"]:
            session.flash = "Nothing selected: no dead letter matches; nothing was done."
            return RedirectResponse("/dlq?" + dlq_views.query_of(filters), status_code=303)
        token = session.add_pending(Pending(what, tuple(plan["ids"]), keep, self.store.clock_ms()))
        context = {"page": "dlq", "action": what, "token": token, "filters": filters, "keep": keep, **plan}
        return self.render(request, "confirm.html", context, session)

    def run_confirmed(self, what: str) -> _Page:
        """The answer to a confirmation of ``what`` (``replay`` or ``purge``): run it, once."""

        async def run(request: Request, session: Session) -> Response:
            form = await request.form()
            token = form.get("token")
            pending = session.take_pending(token if isinstance(token, str) else None, self.store.clock_ms())
            if pending is None or pending.action != what:
                return self.error(
                    request,
                    session,
                    400,
                    "This confirmation has expired or was already answered; nothing was done.",
                )
            session.flash = await run_in_threadpool(dlq_views.execute, session.client, self.qm, pending)
            back = str(form.get("back", ""))
            return RedirectResponse(
                "/dlq" + (f"?{back}" if back and back.isprintable() else ""), status_code=303
            )

        return run


def _quote(text: str) -> str:
    return quote(text, safe="/")


def _safe_next(target: str | None) -> str:
    """A local path to go to after logging in ("/" for anything else: no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
