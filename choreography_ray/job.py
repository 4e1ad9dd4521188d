"""The user's job type: `Job`, its plan (`StepSpec`) and its hooks."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar, Generic, TypeAlias

from pydantic import BaseModel

from choreography_ray.core.sharing import DEFAULT_PRIORITY
from choreography_ray.status import JobStageFailureBehavior
from choreography_ray.step import JobStep, RequestT, StepResult, request_type_of
from choreography_ray.types import type_path

if TYPE_CHECKING:
    from choreography_ray.options import JobsOptions


#: Step types' paths, each found once: `create_step` runs once per planned step. Only types
#: defined at module level have a path, so this holds no more than the program defines.
_STEP_PATHS: dict[type, str] = {}


def _step_path(step_type: type) -> str:
    path = _STEP_PATHS.get(step_type)
    if path is None:
        path = _STEP_PATHS[step_type] = type_path(step_type)
    return path


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step of a plan, made by `Job.create_step`."""

    step_type: str
    request: BaseModel
    stage: int = 0


#: What `prepare_steps` may return: the steps as a list, any iterable (a generator), an async
#: iterable (an async generator), or an awaitable of one of those.
PlanSteps: TypeAlias = (
    Iterable[StepSpec]
    | AsyncIterable[StepSpec]
    | Awaitable[Iterable[StepSpec] | AsyncIterable[StepSpec]]
)


class Job(Generic[RequestT]):
    """A job type. Override `prepare_steps`; every other hook is optional.

    `prepare_steps` returns the plan: a list of `create_step(...)` results, or any iterable,
    async iterable, or awaitable of one. The job reads and stores it in chunks of 50,000
    steps (`core/planning.py`), so a generator plan of millions of steps is never held whole
    in memory; the job is `PREPARING_STEPS` only once every step is stored. See docs/jobs.md.

    The runtime sets `job_id`, `scope`, `namespace` and `options` before calling a hook.
    """

    #: Steps running at once for this job type; None uses `JobsOptions.max_active_steps_per_job`.
    max_active_steps: ClassVar[int | None] = None
    #: Whether `retry_failed_steps` may run this job's failed steps again.
    can_retry_failed_steps: ClassVar[bool] = False
    #: Whether a scheduler's retry of a failed run of this job type resumes after the failed
    #: run's latest completed stage (docs/scheduler.md, "Checkpoints"), instead of the top.
    checkpoint_stages: ClassVar[bool] = False
    #: Whether a job that completed successfully keeps its records (job, steps, counted steps)
    #: until `terminal_job_retention` removes them; False drops them as it completes (when the
    #: scheduler started it, once its run has settled). See docs/retention.md.
    keep_after_completed: ClassVar[bool] = True
    #: The same for a job that completed with failures (its failed steps go with it, so
    #: `retry_failed_steps` has nothing left to retry). A FAILED job is always kept.
    keep_after_completed_with_failures: ClassVar[bool] = True
    #: The priority of this type's jobs when their start names none: where steps wait for
    #: capacity, 1 goes first ... 5 (docs/sharing.md). Checked at each start.
    priority: ClassVar[int] = DEFAULT_PRIORITY

    job_id: str
    scope: str
    namespace: str
    options: JobsOptions

    def prepare_steps(self, request: RequestT) -> PlanSteps:
        raise NotImplementedError(f"{type(self).__qualname__} does not implement prepare_steps")

    def fairness_key(self, request: RequestT) -> str | None:
        """The key whose weighted share (`JobsOptions.fairness_weights`) of the capacity its
        steps wait for this job takes, a tenant say; None: the manager's namespace. Asked once,
        at start, before the job has an id (`job_id` is not set); one that raises or returns
        no str refuses the start (`INVALID_REQUEST`)."""
        return None

    def create_step(
        self, step_type: type[JobStep[BaseModel]] | type, request: BaseModel, stage: int = 0
    ) -> StepSpec:
        return StepSpec(step_type=_step_path(step_type), request=request, stage=stage)

    def get_failure_behavior_for(self, stage: int) -> JobStageFailureBehavior:
        return JobStageFailureBehavior.STOP_JOB

    def get_min_success_ratio(self, stage: int) -> float | None:
        """A share of the stage's steps (0 to 1): when at least that many succeeded, the next
        stage starts, failures or not; below it the stage is a barrier (its failures stop the
        job). None: `get_failure_behavior_for` decides."""
        return None

    def should_retry_step(self, step_id: str, result: StepResult, attempt: int) -> bool:
        return True

    def get_step_retry_delay(self, failed_attempt: int) -> timedelta:
        """`step_retry_backoff` before the second attempt, doubling up to the maximum."""
        from choreography_ray.core.retries import Backoff

        backoff = Backoff.of(self.options.step_retry_backoff, self.options.max_step_retry_backoff)
        return timedelta(seconds=backoff.delay(failed_attempt))

    async def on_before_resuming_job_steps(self) -> None:
        return None

    async def on_stopped(self) -> None:
        return None

    async def on_completed(self) -> None:
        return None

    async def admit_stage(self, stage: int) -> bool:
        return True

    def get_active_silos(self) -> set[str]:
        """The Ray node ids that are alive: the owners a lease may belong to."""
        from choreography_ray.runtime.membership import alive_nodes

        return alive_nodes()

    @classmethod
    def request_type(cls) -> type[BaseModel]:
        return request_type_of(cls, Job)
