"""The dashboard's HTTP tests: the app on a real SQLite file seeded through the storage API,
asked with httpx through its ASGI transport (no server, no Ray). Actions go to a recording
stand-in here; tests/runtime/test_dashboard.py sends them to real jobs managers."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from choreography_ray.dashboard import ActionRefused, JobOperation, create_app
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.storage import Storage, open_storage
from tests.dashboard.seed import seed

TOKEN = "test-token-0123456789"
BASE_URL = "http://127.0.0.1:8266"


class RecordingActions:
    """`Actions` that records each call; an operation named in `refuse` raises its refusal."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: dict[str, ActionRefused] = {}
        self.closed = False

    def _answer(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        if name in self.refuse:
            raise self.refuse[name]

    async def operate(self, scope: str, namespace: str, job_id: str, op: JobOperation) -> str:
        self._answer(op.value, scope, namespace, job_id)
        return f"{op.value} of {job_id} done"

    async def requeue(self, scope: str, dead_letter_id: str, ask_afresh: bool) -> str:
        self._answer("requeue", scope, dead_letter_id, ask_afresh)
        return f"{dead_letter_id} requeued"

    async def acknowledge(self, scope: str, dead_letter_id: str, note: str) -> str:
        self._answer("acknowledge", scope, dead_letter_id, note)
        return f"{dead_letter_id} acknowledged"

    async def scheduler_options(self, scope: str) -> SchedulerOptions | None:
        return None

    async def close(self) -> None:
        self.closed = True


class Client:
    """A sync face of `httpx.AsyncClient` on the app, on one event loop; keeps cookies."""

    def __init__(self, app: Any, runner: asyncio.Runner) -> None:
        self.app = app
        self.runner = runner
        transport = httpx.ASGITransport(app=app)
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


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture(scope="session")
def seeded_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file seeded once (`tests/dashboard/seed.py`) and closed, for tests to copy."""
    path = tmp_path_factory.mktemp("dashboard") / "seeded.db"
    with asyncio.Runner() as loop_runner:
        opened = open_storage(f"sqlite:///{path}")
        loop_runner.run(seed(opened))
        loop_runner.run(opened.close())
    return path


@pytest.fixture
def storage_url(tmp_path: Path, seeded_file: Path) -> str:
    """A copy of the seeded file, the test's own."""
    shutil.copyfile(seeded_file, tmp_path / "jobs.db")
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def storage(storage_url: str, runner: asyncio.Runner) -> Iterator[Storage]:
    """The test's SQLite file, seeded."""
    opened = open_storage(storage_url)
    try:
        yield opened
    finally:
        runner.run(opened.close())


@pytest.fixture
def actions() -> RecordingActions:
    return RecordingActions()


def make_client(storage: Storage, runner: asyncio.Runner, actions: Any = None) -> Client:
    app = create_app(open_storage(storage.url), token=TOKEN, actions=actions,
                     allowed_hosts=["127.0.0.1", "localhost"])  # fmt: skip
    return Client(app, runner)


@pytest.fixture
def reader(storage: Storage, runner: asyncio.Runner) -> Iterator[Client]:
    """A client of a read-only dashboard (started without --address)."""
    client = make_client(storage, runner)
    yield client
    client.close()


@pytest.fixture
def operator(
    storage: Storage, runner: asyncio.Runner, actions: RecordingActions
) -> Iterator[Client]:
    """A client of a dashboard with actions (to `actions`), not logged in."""
    client = make_client(storage, runner, actions)
    yield client
    client.close()
