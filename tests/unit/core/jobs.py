"""Job and step types of the core's unit tests, at module level so the core imports them by path.

Steps never run here (the fake hosts decide every outcome), so `NoopStep.perform` is never
called. The job's hooks count their calls in `CALLS`, keyed by job id, and behave as the test
told them in `CONTROLS` (raise a number of times, block on an `asyncio.Event`, refuse a stage).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.job import PlanSteps, StepSpec

#: A step type path that names nothing: its steps fail to start.
MISSING_STEP = "tests.unit.core.jobs:MissingStep"

#: Calls of each hook, by job id then hook name ("admit_stage:1" counts stage 1's admission,
#: "on_stopped:ok" the calls of on_stopped that returned).
CALLS: dict[str, Counter[str]] = {}
#: How each hook behaves, by job id then hook name.
CONTROLS: dict[str, dict[str, Control]] = {}
#: What `get_active_silos` answers, by job id (unset: the fake hosts' node).
SILOS: dict[str, set[str]] = {}


@dataclass
class Control:
    """What a hook does when called: wait for `gate` (when set), then raise `error` while
    `raises` is above zero, else (for `admit_stage`) answer `admit`."""

    raises: int = 0
    error: type[Exception] = RuntimeError
    gate: asyncio.Event | None = None
    #: `admit_stage` only: the stages this control applies to (None: every stage).
    stages: frozenset[int] | None = None
    admit: bool = True
    #: Calls of the hook running now, and the most ever at once.
    running: int = 0
    peak: int = 0
    entered: asyncio.Event = field(default_factory=asyncio.Event)


def control(job_id: str, hook: str, **behaviour: object) -> Control:
    """Tells `hook` of job `job_id` how to behave; returns the control (to open its gate)."""
    made = Control(**behaviour)  # type: ignore[arg-type]
    CONTROLS.setdefault(job_id, {})[hook] = made
    return made


def calls(job_id: str) -> Counter[str]:
    return CALLS.setdefault(job_id, Counter())


def forget(job_id: str) -> None:
    CALLS.pop(job_id, None)
    CONTROLS.pop(job_id, None)
    SILOS.pop(job_id, None)


class Item(BaseModel):
    n: int


class NoopStep(cr.JobStep[Item]):
    async def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        return cr.StepResult.succeeded()


class DedicatedStep(NoopStep):
    dedicated = True


class Plan(BaseModel):
    #: Steps per stage, stages 0, 1, 2, ... in order.
    sizes: list[int] = [2]
    #: Positions in the plan (0-based, over all stages) whose step type cannot be imported.
    missing: list[int] = []
    #: Positions in the plan whose steps run on a dedicated host.
    dedicated: list[int] = []


class StagedJob(cr.Job[Plan]):
    """A plan of `sizes` steps per stage; every hook counted and controlled."""

    #: Every stage continues with the next one on failure (else a stage is a barrier).
    continue_on_failure = False

    async def prepare_steps(self, request: Plan) -> list[StepSpec]:  # type: ignore[override]
        await self._hook("prepare_steps")
        specs: list[StepSpec] = []
        for stage, size in enumerate(request.sizes):
            for _ in range(size):
                n = len(specs)
                step_type: type = DedicatedStep if n in request.dedicated else NoopStep
                spec = self.create_step(step_type, Item(n=n), stage)
                if n in request.missing:
                    spec = StepSpec(step_type=MISSING_STEP, request=spec.request, stage=stage)
                specs.append(spec)
        return specs

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        calls(self.job_id)["get_failure_behavior_for"] += 1
        behaviour = CONTROLS.get(self.job_id, {}).get("get_failure_behavior_for")
        if behaviour is not None and behaviour.raises > 0:
            behaviour.raises -= 1
            raise behaviour.error("get_failure_behavior_for failed on purpose")
        if self.continue_on_failure:
            return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE
        return cr.JobStageFailureBehavior.STOP_JOB

    async def on_before_resuming_job_steps(self) -> None:
        await self._hook("on_before_resuming_job_steps")

    async def on_stopped(self) -> None:
        await self._hook("on_stopped")

    async def on_completed(self) -> None:
        await self._hook("on_completed")

    def get_active_silos(self) -> set[str]:
        calls(self.job_id)["get_active_silos"] += 1
        return SILOS.get(self.job_id, {"node-0"})

    async def admit_stage(self, stage: int) -> bool:
        calls(self.job_id)[f"admit_stage:{stage}"] += 1
        behaviour = CONTROLS.get(self.job_id, {}).get("admit_stage")
        if behaviour is not None and behaviour.stages is not None and stage not in behaviour.stages:
            behaviour = None
        await self._hook("admit_stage", behaviour)
        return True if behaviour is None else behaviour.admit

    async def _hook(self, name: str, behaviour: Control | None = None) -> None:
        calls(self.job_id)[name] += 1
        if behaviour is None and name != "admit_stage":
            behaviour = CONTROLS.get(self.job_id, {}).get(name)
        if behaviour is None:
            calls(self.job_id)[f"{name}:ok"] += 1
            return
        behaviour.running += 1
        behaviour.peak = max(behaviour.peak, behaviour.running)
        behaviour.entered.set()
        try:
            if behaviour.gate is not None:
                await behaviour.gate.wait()
            if behaviour.raises > 0:
                behaviour.raises -= 1
                raise behaviour.error(f"{name} failed on purpose")
        finally:
            behaviour.running -= 1
        calls(self.job_id)[f"{name}:ok"] += 1


class RetryableJob(StagedJob):
    """A job whose failed steps `retry_failed_steps` may run again."""

    can_retry_failed_steps = True


class AtLeast90Job(RetryableJob):
    """Each stage goes on when at least 90 % of its steps succeeded."""

    min_success_ratio = 0.9

    def get_min_success_ratio(self, stage: int) -> float | None:
        return self.min_success_ratio


class AtLeast95Job(AtLeast90Job):
    min_success_ratio = 0.95


class ContinuingJob(StagedJob):
    """Every stage continues with the next one when some of its steps failed."""

    continue_on_failure = True


class NotKeptJob(StagedJob):
    """Drops its records once it completed successfully."""

    keep_after_completed = False


class NotKeptWithFailuresJob(StagedJob):
    """Drops its records once it completed with failures."""

    keep_after_completed_with_failures = False


class Streamed(BaseModel):
    #: Steps of the plan; step i is in stage `i % stages` (the stages interleave in the plan).
    steps: int = 10
    stages: int = 1
    #: How `prepare_steps` returns the plan: "list", "generator", "async" (an async generator),
    #: "awaitable" (a coroutine returning a generator) or "awaitable-async".
    form: str = "generator"
    #: The plan's code raises when it reaches this position (None: never).
    raises_at: int | None = None
    #: The plan yields something that is not a step at this position (None: never).
    not_a_step_at: int | None = None


class StreamedJob(cr.Job[Streamed]):
    """A plan returned in any form `prepare_steps` may return it in; every stage continues."""

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE

    def _specs(self, request: Streamed) -> Iterator[object]:
        for i in range(request.steps):
            if i == request.raises_at:
                raise RuntimeError(f"the plan failed at step {i} on purpose")
            if i == request.not_a_step_at:
                yield {"n": i}
                continue
            yield self.create_step(NoopStep, Item(n=i), stage=i % request.stages)

    def prepare_steps(self, request: Streamed) -> PlanSteps:
        specs: Any = self._specs(request)
        if request.form == "list":
            return list(specs)

        async def streamed() -> AsyncIterator[object]:
            for spec in specs:
                await asyncio.sleep(0)
                yield spec

        async def later(plan: object) -> Any:
            await asyncio.sleep(0)
            return plan

        forms = {
            "generator": lambda: specs,
            "async": streamed,
            "awaitable": lambda: later(specs),
            "awaitable-async": lambda: later(streamed()),
        }
        result: PlanSteps = forms[request.form]()
        return result
