"""The dashboard's HTTP tests: the app on a real SQLite file seeded through the storage API,
asked with httpx through its ASGI transport (no server, no Ray). Actions go to a recording
stand-in here; tests/runtime/test_dashboard.py sends them to real jobs managers."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.dashboard import create_app
from choreography_ray.storage import Storage, open_storage
from tests.dashboard.client import TOKEN, Client, RecordingActions
from tests.dashboard.seed import seed


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
