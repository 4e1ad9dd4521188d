"""What the dashboard's HTTP tests share with its Ray and browser tests: a sync client of the
app through httpx's ASGI transport, and a recording stand-in of the actions."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from choreography_ray.dashboard import ActionRefused, JobOperation
from choreography_ray.limit import LimitState
from choreography_ray.model import PoolState
from choreography_ray.scheduler.options import SchedulerOptions

TOKEN = "test-token-0123456789"
BASE_URL = "http://127.0.0.1:8266"


class RecordingActions:
    """`Actions` that records each call; an operation named in `refuse` raises its refusal."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: dict[str, ActionRefused] = {}
        self.closed = False
        self.pools: list[PoolState] = []

    def _answer(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        if name in self.refuse:
            raise self.refuse[name]

    async def operate(self, scope: str, namespace: str, job_id: str, op: JobOperation) -> str:
        self._answer(op.value, scope, namespace, job_id)
        return f"{op.value} of {job_id} done"

    async def retry_failures(self, scope: str, namespace: str, job_id: str, signature: str) -> str:
        self._answer("retry_failures", scope, namespace, job_id, signature)
        return f"failures {signature} of {job_id} retried"

    async def requeue(self, scope: str, dead_letter_id: str, ask_afresh: bool) -> str:
        self._answer("requeue", scope, dead_letter_id, ask_afresh)
        return f"{dead_letter_id} requeued"

    async def acknowledge(self, scope: str, dead_letter_id: str, note: str) -> str:
        self._answer("acknowledge", scope, dead_letter_id, note)
        return f"{dead_letter_id} acknowledged"

    async def requeue_all(self, scope: str, manifest: str | None, ask_afresh: bool) -> str:
        self._answer("requeue_all", scope, manifest, ask_afresh)
        return "every dead letter requeued"

    async def acknowledge_all(self, scope: str, manifest: str | None, note: str) -> str:
        self._answer("acknowledge_all", scope, manifest, note)
        return "every dead letter acknowledged"

    async def scheduler_options(self, scope: str) -> SchedulerOptions | None:
        return None

    async def job_pools(self, job_id: str) -> list[PoolState]:
        """`pools` for every job (none by default)."""
        return list(self.pools)

    async def limits(self) -> list[LimitState]:
        """None by default."""
        return []

    async def close(self) -> None:
        self.closed = True


class Client:
    """A sync face of `httpx.AsyncClient` on the app, on one event loop; keeps cookies."""

    def __init__(
        self, app: Any, runner: asyncio.Runner, *, raise_app_exceptions: bool = True
    ) -> None:
        self.app = app
        self.runner = runner
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        self.http = httpx.AsyncClient(transport=transport, base_url=BASE_URL)

    def get(self, path: str, **options: Any) -> httpx.Response:
        return self.runner.run(self.http.get(path, **options))

    def post(self, path: str, **options: Any) -> httpx.Response:
        return self.runner.run(self.http.post(path, **options))

    def csrf(self, path: str) -> str:
        """The CSRF field of the form on the page at `path` (which sets the CSRF cookie)."""
        return csrf_of(self.get(path).text)

    def log_in(self) -> None:
        answer = self.get(f"/login?token={TOKEN}")
        assert answer.status_code == 303, answer.text

    def close(self) -> None:
        self.runner.run(self.http.aclose())
        # No lifespan runs through the ASGI transport: the app's storage is closed here.
        self.runner.run(self.app.state.site.storage.close())


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF field"
    return found[1]
