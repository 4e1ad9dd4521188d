"""What every page shares: the dashboard's state, its templates and filters, the flash message,
and the error pages.

Templates and static files ship in the package (`templates/`, `static/`; see
`[tool.setuptools.package-data]`): nothing is fetched from elsewhere when a page is shown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from choreography_ray.dashboard.actions import Actions
from choreography_ray.dashboard.progress import Bar, RateTracker
from choreography_ray.dashboard.security import Guard, Refused
from choreography_ray.model import JobProgress, StageProgress, utcnow
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage, redact_url
from choreography_ray.storage.scheduler import SchedulerStorage, scheduler_storage

FLASH_COOKIE = "cr_flash"


class Site:
    """The dashboard's state: one per app, at `request.app.state.site`."""

    def __init__(self, storage: Storage, guard: Guard, actions: Actions | None) -> None:
        self.storage = storage
        self.guard = guard
        self.actions = actions
        #: The storage URL as pages show it: without its password.
        self.storage_shown = redact_url(storage.url)
        self.rates = RateTracker()
        environment = Environment(
            loader=PackageLoader("choreography_ray.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        environment.filters.update(
            when=when,
            number=number,
            short_type=short_type,
            seconds=seconds,
            relative=relative,
            status_name=status_name,
        )
        environment.globals["bar"] = bar
        self.templates = Jinja2Templates(env=environment)

    @property
    def scheduler_storage(self) -> SchedulerStorage:
        return scheduler_storage(self.storage)

    def render(
        self,
        request: Request,
        name: str,
        context: Mapping[str, Any] | None = None,
        status_code: int = 200,
    ) -> Response:
        flash = self._pop_flash(request)
        page = {
            "site": self,
            "csrf": self.guard.csrf_field(request),
            "logged_in": self.guard.logged_in(request),
            "actions": self.actions is not None,
            "flash": flash,
            "now": utcnow(),
            **(context or {}),
        }
        response = self.templates.TemplateResponse(request, name, page, status_code=status_code)
        self.guard.remember_csrf(request, response)
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, httponly=True, samesite="strict")
        return response

    def error(self, request: Request, status_code: int, title: str, message: str) -> Response:
        context = {"title": title, "message": message, "status_code": status_code}
        return self.render(request, "error.html", context, status_code)

    def not_a_page(self, request: Request) -> Response:
        return self.error(request, 404, "No such page", f"{request.url.path} is not a page here.")

    def no_actions(self, request: Request) -> Response:
        return self.error(request, 403, "Actions are off", "This dashboard was started without "
                          "--address, so it cannot reach the jobs managers: it only reads "
                          "storage.")  # fmt: skip

    def actions_for(self, request: Request, form: Mapping[str, Any]) -> Actions | Response:
        """The actions a POSTed action runs through; the error page when it may not run (its
        token or CSRF check fails, or actions are off)."""
        try:
            self.guard.check_action(request, form)
        except Refused as refused:
            return self.error(request, refused.status, "Not allowed", refused.reason)
        return self.no_actions(request) if self.actions is None else self.actions

    def flash(self, response: Response, message: str) -> None:
        """A message the next page shows once (after a redirect)."""
        sealed = self.guard.seal("flash", json.dumps(message))
        response.set_cookie(FLASH_COOKIE, sealed, max_age=60, httponly=True, samesite="strict")

    def _pop_flash(self, request: Request) -> str | None:
        text = self.guard.unseal("flash", request.cookies.get(FLASH_COOKIE, ""))
        if text is None:
            return None
        message = json.loads(text)
        return message if isinstance(message, str) else None


def site_of(request: Request) -> Site:
    site: Site = request.app.state.site
    return site


# -- template filters ----------------------------------------------------------------------


def when(at: datetime | None) -> str:
    if at is None:
        return "-"
    return at.strftime("%Y-%m-%d %H:%M:%S")


def number(n: int | float | None) -> str:
    if n is None:
        return "-"
    return f"{n:,.0f}" if isinstance(n, float) else f"{n:,}"


def short_type(path: str) -> str:
    """A job type's class name: the import path after its ':'."""
    return path.rpartition(":")[2] or path


def seconds(value: float | timedelta | None) -> str:
    """A duration as "2 h 05 min", "3 min 07 s" or "12 s"."""
    if value is None:
        return "-"
    total = round(value.total_seconds() if isinstance(value, timedelta) else value)
    hours, rest = divmod(abs(total), 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 48:
        text = f"{hours // 24} d {hours % 24:02d} h"
    elif hours:
        text = f"{hours} h {minutes:02d} min"
    elif minutes:
        text = f"{minutes} min {secs:02d} s"
    else:
        text = f"{secs} s"
    return f"-{text}" if total < 0 else text


def relative(at: datetime | None, now: datetime) -> str:
    """`at` from `now`: "in 4 min 10 s", "12 s ago", "now"."""
    if at is None:
        return "-"
    delta = (at - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {seconds(delta)}" if delta > 0 else f"{seconds(-delta)} ago"


def status_name(value: str) -> str:
    """A stored job status value as its member name (RUNNING for "Running")."""
    try:
        return JobStatus(value).name
    except ValueError:
        return value


def bar(progress: JobProgress | StageProgress) -> Bar:
    return Bar.of(progress)
