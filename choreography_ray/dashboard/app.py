"""The dashboard's ASGI application: routes, login, error pages and the guarding middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from choreography_ray.dashboard import bulk, jobs, schedules
from choreography_ray.dashboard.actions import Actions
from choreography_ray.dashboard.security import SECURITY_HEADERS, Guard, Refused
from choreography_ray.dashboard.site import Site, site_of
from choreography_ray.errors import StorageError
from choreography_ray.logs import get_logger
from choreography_ray.storage import Storage

log = get_logger(__name__)

#: The page names of HTTP errors the router raises.
_TITLES = {404: "No such page", 405: "Not allowed here"}


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                            if k.encode() not in present]  # fmt: skip
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _local_target(target: str) -> str:
    """`target` when it is a path of this site, else "/": a login never sends elsewhere."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


async def login_page(request: Request) -> Response:
    site = site_of(request)
    token = request.query_params.get("token")
    target = _local_target(request.query_params.get("next", "/"))
    if token is not None:
        if site.guard.is_token(token):
            response = RedirectResponse(target, status_code=303)
            site.guard.log_in(response)
            return response
        return site.render(request, "login.html", {"wrong": True, "next": target}, 403)
    return site.render(request, "login.html", {"wrong": False, "next": target})


async def log_in(request: Request) -> Response:
    site = site_of(request)
    form = await request.form()
    target = _local_target(str(form.get("next") or "/"))
    try:
        site.guard.check_form(request, form)
    except Refused as refused:
        return site.error(request, refused.status, "Not allowed", refused.reason)
    token = form.get("token")
    if not site.guard.is_token(token if isinstance(token, str) else None):
        return site.render(request, "login.html", {"wrong": True, "next": target}, 403)
    response = RedirectResponse(target, status_code=303)
    site.guard.log_in(response)
    return response


async def log_out(request: Request) -> Response:
    site = site_of(request)
    try:
        site.guard.check_form(request, await request.form())
    except Refused as refused:
        return site.error(request, refused.status, "Not allowed", refused.reason)
    response = RedirectResponse("/", status_code=303)
    site.guard.log_out(response)
    return response


async def limits_page(request: Request) -> Response:
    """`/limits`: what `Jobs.limits()` says of each limit of the cluster, asked through the
    actions (`--address`); read only, like the jobs list."""
    site = site_of(request)
    states = [] if site.actions is None else await site.actions.limits()
    return site.render(request, "limits.html", {"limits": states})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    title = _TITLES.get(exc.status_code, "Error")
    detail = f"{request.url.path} is not a page here." if exc.status_code == 404 else exc.detail
    return site_of(request).error(request, exc.status_code, title, str(detail))


async def _storage_error(request: Request, exc: Exception) -> Response:
    log.warning("dashboard: %s %s: %s", request.method, request.url.path, exc)
    return site_of(request).error(request, 503, "Storage did not answer", str(exc))


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("dashboard: %s %s failed", request.method, request.url.path, exc_info=exc)
    message = f"The page failed with {type(exc).__name__}; the dashboard's log has the details."
    response = site_of(request).error(request, 500, "Something went wrong", message)
    # This answer leaves through Starlette's outermost middleware, outside `SecurityHeaders`.
    response.headers.update(SECURITY_HEADERS)
    return response


def create_app(
    storage: Storage,
    *,
    token: str,
    actions: Actions | None = None,
    allowed_hosts: Sequence[str] = ("*",),
) -> Starlette:
    """The dashboard on `storage`. Actions (`actions`, else none: the pages only read) need
    `token`; requests naming a host outside `allowed_hosts` are refused (DNS rebinding). The
    app closes `storage` and `actions` when it shuts down."""
    site = Site(storage, Guard(token), actions)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if actions is not None:
                await actions.close()
            await storage.close()

    routes = [
        *jobs.routes,
        *bulk.routes,
        *schedules.routes,
        Route("/limits", limits_page, methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", log_in, methods=["POST"]),
        Route("/logout", log_out, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("choreography_ray.dashboard", "static")]),
              name="static"),
    ]  # fmt: skip
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
        ],
        exception_handlers={
            HTTPException: _http_error,
            StorageError: _storage_error,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
    app.state.site = site
    return app
