"""The console's managing pages, on the management API (``api.Api``): one owner per rule.

``/subscriptions/<id>`` a subscription (detail and consumers read server-side through the API's
own handlers; get messages, purge and delete call ``/api/...`` from the page), ``/publish``
the publish form (``POST /api/publish``), ``/manage`` the forms for subscriptions, links,
topic objects and definitions import/export, and the lists of users and grants (never a
password). The forms are sent by ``static/console.js`` with the session's CSRF token in
``X-CSRF-Token``; a monitor sees no form that writes, and the API refuses its writes anyway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from broker.operations.console.api import Api, Call
from broker.operations.console.auth import Session


class Console(Protocol):
    """What these pages use of the console (``app._Console``): its API and its answers."""

    api: Api | None

    def render(
        self,
        request: Request,
        name: str,
        context: dict[str, Any],
        session: Session | None,
        status_code: int = 200,
    ) -> Response: ...

    def error(
        self, request: Request, session: Session | None, status_code: int, message: str
    ) -> Response: ...


#: A page's handler: the request and its session in, the response out.
_Page = Callable[[Request, Session], Awaitable[Response]]


def _read(api: Api, session: Session, handler: Callable[[Call], tuple[int, Any]], **params: str) -> Any:
    """What the API's ``handler`` answers to this session (a GET: no body)."""
    return handler(Call(session, params, {}, {}))[1]


def pages(console: Console) -> list[tuple[str, _Page]]:
    """The routes ``(path, handler)`` of the managing pages, for ``app._routes``."""

    def api() -> Api:
        assert console.api is not None  # create_app sets it before serving
        return console.api

    async def subscription(request: Request, session: Session) -> Response:
        sub_id = request.path_params["sub_id"]
        try:
            found = await run_in_threadpool(_read, api(), session, api().subscription, sub_id=sub_id)
        except LookupError:
            return console.error(request, session, 404, f"No subscription {sub_id!r}.")
        context = {"page": "subscriptions", "sub": found}
        return console.render(request, "subscription.html", context, session)

    async def publish(request: Request, session: Session) -> Response:
        context = {"page": "publish", "topic": request.query_params.get("topic", "")}
        return console.render(request, "publish.html", context, session)

    async def manage(request: Request, session: Session) -> Response:
        def read_all() -> dict[str, Any]:
            a = api()
            return {
                "links": _read(a, session, a.links),
                "objects": _read(a, session, a.topic_objects),
                "users": _read(a, session, a.users),
                "grants": _read(a, session, a.grants),
            }

        data = await run_in_threadpool(read_all)
        return console.render(request, "manage.html", {"page": "manage", **data}, session)

    return [("/subscriptions/{sub_id:path}", subscription), ("/publish", publish), ("/manage", manage)]
