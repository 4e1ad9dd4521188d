"""The Ray shell's jobs port without a cluster: how a start's errors map to `DispatchError`
(reached: a failed run; not reached: a dispatch to try again). No Ray is started: the manager
handle is a fake, and Ray's exceptions are built as a caller of an actor receives them."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest
from pydantic import BaseModel
from ray.exceptions import ActorDiedError, RayTaskError

from choreography_ray.errors import JobOperationError, StartJobError, TypeImportError
from choreography_ray.job import Job
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import actors
from choreography_ray.runtime import scheduler_actor as shell
from choreography_ray.scheduler.port import DispatchError
from choreography_ray.types import type_path


def task_error(cause: Exception) -> RayTaskError:
    try:
        raise cause
    except Exception as exc:
        return RayTaskError("start", traceback.format_exc(), exc)


class FakeManager:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.start = self
        self.calls: list[tuple[Any, ...]] = []

    def remote(
        self,
        job_type: str,
        request: dict[str, Any],
        job_id: str,
        resume_after: Any = None,
        held: bool = False,
    ) -> Any:
        self.calls.append((job_type, request, job_id, resume_after, held))

        async def answer() -> Any:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return answer()


def start_with(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> str:
    monkeypatch.setattr(actors, "manager_actor", lambda *args: FakeManager(outcome))
    port = shell.RayJobsPort(storage=None, storage_url="sqlite:///x.db", options_json="{}",  # type: ignore[arg-type]
                             ns="n")  # fmt: skip
    return asyncio.run(port.start_job("s", "n", "pkg:J", {}, "job-1"))


def test_a_started_job__its_id_even_with_a_first_stage_start_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert start_with(monkeypatch, ("job-1", StartJobError.FAILED_STARTING_SOME_JOB_STEPS)) == (
        "job-1"
    )


@pytest.mark.parametrize(
    "cause",
    [
        JobOperationError(StartJobError.INVALID_REQUEST, "bad"),
        JobOperationError(StartJobError.UNKNOWN, "not a Job"),
        TypeImportError("no module pkg"),
    ],
    ids=["invalid-request", "not-a-job", "type-import"],
)
def test_a_job_the_manager_refuses__reached(
    monkeypatch: pytest.MonkeyPatch, cause: Exception
) -> None:
    with pytest.raises(DispatchError) as refused:
        start_with(monkeypatch, task_error(cause))
    assert refused.value.reached


@pytest.mark.parametrize(
    "error",
    [task_error(JobOperationError(StartJobError.COULD_NOT_PERSIST, "disk")), ActorDiedError()],
    ids=["storage-refused-the-job", "manager-unreachable"],
)
def test_a_manager_not_reached__requeued(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    with pytest.raises(DispatchError) as failed:
        start_with(monkeypatch, error)
    assert not failed.value.reached


class Checkpointed(Job[BaseModel]):
    checkpoint_stages = True


def test_checkpoint_stages__of_a_job_type_that_opts_in_and_of_one_that_cannot_be_imported() -> None:
    def port(options: JobsOptions) -> shell.RayJobsPort:
        return shell.RayJobsPort(storage=None, storage_url="sqlite:///x.db",  # type: ignore[arg-type]
                                 options_json=options.model_dump_json(), ns="n")  # fmt: skip

    anywhere = port(JobsOptions())
    assert anywhere.checkpoint_stages(type_path(Checkpointed))
    assert not anywhere.checkpoint_stages(type_path(Job))
    assert not anywhere.checkpoint_stages("no.such.module:Job")
    elsewhere = port(JobsOptions(allowed_type_prefixes=["myapp."]))
    assert not elsewhere.checkpoint_stages(type_path(Checkpointed))


class NotKept(Job[BaseModel]):
    keep_after_completed = False


class Releases:
    """A manager handle whose `release.remote` records the job it is given."""

    def __init__(self) -> None:
        self.released: list[str] = []
        self.release = self

    def remote(self, job_id: str) -> Any:
        self.released.append(job_id)

        async def answer() -> None:
            return None

        return answer()


def test_start__asks_the_manager_to_hold_the_job_for_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = FakeManager(("job-1", None))
    monkeypatch.setattr(actors, "manager_actor", lambda *args: manager)
    port = shell.RayJobsPort(storage=None, storage_url="sqlite:///x.db", options_json="{}",  # type: ignore[arg-type]
                             ns="n")  # fmt: skip
    asyncio.run(port.start_job("s", "n", "pkg:J", {}, "job-1"))
    assert manager.calls == [("pkg:J", {}, "job-1", None, True)]


def test_release_job__reaches_the_manager_only_for_a_job_type_that_drops_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = Releases()
    asked: list[tuple[str, str]] = []

    def manager_actor(scope: str, namespace: str, *args: Any) -> Releases:
        asked.append((scope, namespace))
        return manager

    monkeypatch.setattr(actors, "manager_actor", manager_actor)
    port = shell.RayJobsPort(storage=None, storage_url="sqlite:///x.db", options_json="{}",  # type: ignore[arg-type]
                             ns="n")  # fmt: skip

    async def release_all() -> None:
        await port.release_job("s", "n", type_path(NotKept), "dropped")
        await port.release_job("s", "n", type_path(Checkpointed), "kept")
        await port.release_job("s", "n", "no.such.module:Job", "unknown")

    asyncio.run(release_all())
    assert manager.released == ["dropped"]
    assert asked == [("s", "n")]
