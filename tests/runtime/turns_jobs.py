"""Job types of the turn tests: hooks that block, raise once, or count their calls.

Ray workers import them by path, so they live at module level; they trace through
`tests.runtime.lifecycle_jobs` (one directory per job id), and a job that blocks in
`prepare_steps` also names its job id under its request's token, since `start` has not
returned it yet.
"""

from __future__ import annotations

import asyncio

import choreography_ray as cr
from tests.runtime.lifecycle_jobs import (
    TRACES,
    Plan,
    Traced,
    TracedStep,
    flag_set,
    is_set,
    record,
    set_flag,
)


class SlowPlan(Plan):
    token: str


class SlowToPrepare(cr.Job[SlowPlan]):
    """`prepare_steps` blocks until the job's flag "prepare" is set."""

    async def prepare_steps(self, request: SlowPlan) -> list[cr.StepSpec]:  # type: ignore[override]
        TRACES.mkdir(parents=True, exist_ok=True)
        (TRACES / f"token-{request.token}").write_text(self.job_id)
        record(self.job_id, "prepare_steps")
        await flag_set(self.job_id, "prepare")
        return [self.create_step(TracedStep, work) for work in request.steps]

    async def on_stopped(self) -> None:
        record(self.job_id, "on_stopped")


class AdmissionFailsOnce(Traced):
    """`admit_stage` raises `ConnectionError` the first time it is asked about a later stage."""

    async def admit_stage(self, stage: int) -> bool:
        record(self.job_id, "admit_stage", stage=stage)
        if stage > 0 and not is_set(self.job_id, "admission-failed"):
            set_flag(self.job_id, "admission-failed")
            raise ConnectionError("admission service unreachable")
        return True


class SlowResumeHook(Traced):
    """`on_before_resuming_job_steps` takes a moment: long enough for a second resume."""

    async def on_before_resuming_job_steps(self) -> None:
        record(self.job_id, "on_before_resuming_job_steps")
        await asyncio.sleep(0.5)
