"""Job and step types of the pool dispatch unit tests (`test_pool_dispatch.py`), at module level
so the core imports them by path. Steps never run here: the fake hosts decide every outcome."""

from __future__ import annotations

from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.job import StepSpec
from tests.unit.core.jobs import Item, NoopStep


class GpuStep(NoopStep):
    """A pool type: one GPU a host (shape `num_gpus=1`, credit `MIN_CREDIT`)."""

    resources = {"num_gpus": 1}


class GpuNoCpuStep(NoopStep):
    """The same shape said with a zero amount: the same pool as `GpuStep`."""

    resources = {"num_gpus": 1, "num_cpus": 0}


class PoolPlan(BaseModel):
    #: Steps of each type per stage, stages in order: `GpuStep`, `GpuNoCpuStep`, `NoopStep`.
    gpu: list[int] = [0]
    gpu_no_cpu: list[int] = [0]
    plain: list[int] = [0]


#: Stages `admit_stage` refuses, by job id (a test opens them by removing them).
REFUSED: dict[str, set[int]] = {}


class PoolJob(cr.Job[PoolPlan]):
    async def admit_stage(self, stage: int) -> bool:
        return stage not in REFUSED.get(self.job_id, set())

    def prepare_steps(self, request: PoolPlan) -> list[StepSpec]:  # type: ignore[override]
        specs: list[StepSpec] = []
        stages = max(len(request.gpu), len(request.gpu_no_cpu), len(request.plain))
        for stage in range(stages):
            for step_type, sizes in (
                (GpuStep, request.gpu),
                (GpuNoCpuStep, request.gpu_no_cpu),
                (NoopStep, request.plain),
            ):
                for _ in range(sizes[stage] if stage < len(sizes) else 0):
                    specs.append(self.create_step(step_type, Item(n=len(specs)), stage))
        return specs
