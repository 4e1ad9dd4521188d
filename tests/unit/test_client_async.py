"""The async path of the client (`Jobs.connect_async`, `jobs.async_manager`) blocks no event
loop: every named-actor lookup runs in a worker thread, and actor answers are awaited, never
fetched with `ray.get` (which Ray warns about inside an async actor, from any thread).

Ray itself is replaced by fakes: an actor handle whose methods' `.remote()` return awaitables,
and `ray.get` made to fail the test."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.runtime import actors
from choreography_ray.runtime.actors import LazyHandle

pytestmark = pytest.mark.timeout(10)


class FakeMethod:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        self.actor.calls.append((self.name, args))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(self.actor.answers.get(self.name))
        return future


class FakeActor:
    """A handle whose method calls are recorded and answered from `answers`."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> FakeMethod:
        return FakeMethod(self, name)


@pytest.fixture(autouse=True)
def no_ray_get(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("ray.get on the async path")

    monkeypatch.setattr(ray, "get", refuse)


class Maker:
    """A `LazyHandle` maker that records the threads it ran on."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.threads: list[threading.Thread] = []

    def __call__(self) -> Any:
        self.threads.append(threading.current_thread())
        return self.handle


def test_lazy_handle__got_once_in_a_worker_thread() -> None:
    make = Maker(FakeActor())
    lazy = LazyHandle(make)

    async def main() -> list[Any]:
        return [await lazy.get(), await lazy.get()]

    assert asyncio.run(main()) == [make.handle, make.handle]
    (thread,) = make.threads
    assert thread is not threading.main_thread()


def test_async_manager__made_without_a_lookup_and_its_first_call_gets_the_actor_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = cr.JobsOptions()
    storage = "sqlite:////tmp/jobs.db"
    manager = FakeActor(
        config={"storage": storage, "options": options.model_dump_json()},
        start=("job-1", None),
    )
    make = Maker(manager)
    monkeypatch.setattr(actors, "manager_actor", lambda *args: make())
    jobs = cr.Jobs(storage, options, "choreography", owns_ray=False)

    async def main() -> cr.StartedJob:
        async_manager = jobs.async_manager("app", "tenant")
        assert make.threads == []  # nothing looked up while the client is made
        return await async_manager.start(cr.Job, {"x": 1})

    started = asyncio.run(main())

    assert started == cr.StartedJob("job-1", None)
    (thread,) = make.threads
    assert thread is not threading.main_thread()
    assert [name for name, _ in manager.calls] == ["config", "start"]


def test_async_manager__a_conflicting_manager_is_refused_at_the_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = cr.JobsOptions()
    other = cr.JobsOptions(max_step_attempts=3).model_dump_json()
    manager = FakeActor(config={"storage": "sqlite:////tmp/jobs.db", "options": other})
    monkeypatch.setattr(actors, "manager_actor", lambda *args: manager)
    jobs = cr.Jobs("sqlite:////tmp/jobs.db", options, "choreography", owns_ray=False)

    with pytest.raises(cr.JobsManagerConflictError, match="max_step_attempts"):
        asyncio.run(jobs.async_manager("app", "tenant").get("job-1"))
    assert [name for name, _ in manager.calls] == ["config"]


def test_connect_async__inside_ray_registers_with_recovery_without_blocking_the_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    recovery_actor = FakeActor()
    make = Maker(recovery_actor)
    monkeypatch.setattr(actors, "recovery_actor", lambda namespace: make())
    # Inside a Ray actor, Ray is joined already.
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init inside Ray"))
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    options = cr.JobsOptions(max_step_attempts=2)

    jobs = asyncio.run(cr.Jobs.connect_async(storage=storage, options=options, namespace="ns"))

    assert (jobs.storage, jobs.options, jobs.namespace) == (storage, options, "ns")
    assert not jobs._owns_ray  # close() leaves the actor's Ray alone
    (thread,) = make.threads
    assert thread is not threading.main_thread()
    assert recovery_actor.calls == [("register", (storage, options.model_dump_json()))]
