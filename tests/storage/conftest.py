"""The storage contract's fixtures: one `storage` per provider, run on a per-test event loop.

The MongoDB leg talks to `CHOREOGRAPHY_MONGODB_URI` when it is set (a real `mongod`), else to an
`nx-27017` server this session starts on a free loopback port and stops by its pid. Each test
gets a database of its own. A server that cannot be reached skips the leg locally and fails it
in CI (`CI=true`).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest

from choreography_ray.storage import Storage, open_storage, redact_url

if TYPE_CHECKING:
    from choreography_ray.storage.mongodb import MongoStorage
from tests.mongo_proxy import SHORT_DEADLINES, FaultProxy, fault_proxy, start_nx
from tests.support import free_port, missing_service

MONGODB_URI_ENV = "CHOREOGRAPHY_MONGODB_URI"
#: How long the server may take to exit once asked to, in seconds.
SERVER_STOP_SECONDS = 10.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests on the test's `runner` loop (the loop its fixtures used)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    coroutine = pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names})
    runner = pyfuncitem.funcargs.get("runner")
    if isinstance(runner, asyncio.Runner):
        runner.run(coroutine)
    else:
        asyncio.run(coroutine)
    return True


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture(scope="session")
def mongodb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a MongoDB wire-protocol server, without a database."""
    if uri := os.environ.get(MONGODB_URI_ENV):
        if error := _ping(uri):
            missing_service(f"{MONGODB_URI_ENV}={redact_url(uri)} does not answer: {error}")
        yield uri
        return
    try:
        server, url = start_nx(tmp_path_factory.mktemp("nx-27017"), free_port())
    except RuntimeError as exc:
        missing_service(str(exc))
    try:
        yield url
    finally:
        server.terminate()
        try:
            server.wait(SERVER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _ping(url: str) -> str | None:
    """None when the server answers, else why not."""
    import pymongo

    client: pymongo.MongoClient[dict[str, object]]
    try:
        with pymongo.MongoClient(url, serverSelectionTimeoutMS=5000) as client:
            client.admin.command("ping")
    except pymongo.errors.PyMongoError as exc:
        return str(exc).split(", Timeout")[0]
    return None


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _drop_database(url: str) -> None:
    import pymongo

    client: pymongo.MongoClient[dict[str, object]]
    with pymongo.MongoClient(url, serverSelectionTimeoutMS=5000) as client:
        client.drop_database(urlsplit(url).path.lstrip("/"))


PROVIDERS = ["memory", "sqlite", pytest.param("mongodb", marks=pytest.mark.mongodb)]


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def storage_url(provider: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if provider == "memory":
        yield "memory://"
    elif provider == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        pytest.importorskip("choreography_ray.storage.mongodb", reason="MongoStorage not written")
        server: str = request.getfixturevalue("mongodb_server")
        url = _with_database(server, f"test_{uuid.uuid4().hex}")
        yield url
        _drop_database(url)


@pytest.fixture
def storage(storage_url: str, runner: asyncio.Runner) -> Iterator[Storage]:
    opened = open_storage(storage_url)
    try:
        yield opened
    finally:
        runner.run(opened.close())


@pytest.fixture
def proxy(mongodb_server: str) -> Iterator[FaultProxy]:
    """A fault proxy in front of the MongoDB server (`tests.mongo_proxy`)."""
    with fault_proxy(mongodb_server) as opened:
        yield opened


@pytest.fixture
def proxied_storage(
    proxy: FaultProxy, mongodb_server: str, runner: asyncio.Runner
) -> Iterator[MongoStorage]:
    """The MongoDB provider through `proxy`, on a database of its own, with short deadlines."""
    from choreography_ray.storage.mongodb import MongoStorage

    database = f"faults_{uuid.uuid4().hex}"
    opened = MongoStorage(proxy.url(database, **SHORT_DEADLINES))
    yield opened
    runner.run(opened.close())
    _drop_database(_with_database(mongodb_server, database))
