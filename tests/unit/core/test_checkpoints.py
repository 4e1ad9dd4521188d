"""A start after a checkpoint (`JobState.resume_after`, the scheduler's retry of a job type with
`checkpoint_stages`): the checkpointed stages are counted as succeeded and never stored nor run,
while the plan's stage layout is the checkpoint's; otherwise the job runs from the top."""

from __future__ import annotations

import pytest

from choreography_ray.model import ResumeAfter, StageShape
from choreography_ray.status import JobStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)

#: The layout of `Plan(sizes=[2, 1, 1])`: stages 0, 1, 2 of 2, 1 and 1 steps.
LAYOUT = (StageShape(stage=0, steps=2), StageShape(stage=1, steps=1), StageShape(stage=2, steps=1))


def after(stage: int, layout: tuple[StageShape, ...] = LAYOUT) -> ResumeAfter:
    return ResumeAfter(stage=stage, layout=layout, source="run-1")


def test_resume_after__the_checkpointed_stage_is_counted_succeeded_and_never_run(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2, 1, 1]), resume_after=after(0))
        assert await h.c.start() is None
        await h.settle()
        assert h.hosts.running_ids() == {"000002"}  # stage 1's step: the ids of the plan
        assert set(await h.steps()) == {"000002", "000003"}  # stage 0's never stored
        assert h.calls["admit_stage:0"] == 0
        stored = await h.stored()
        assert stored.stage == 1
        assert stored.resume_after == after(0)
        first = stored.progress.stages[0]
        assert (first.is_started, first.successful_steps, first.total_steps) == (True, 2, 2)

        await h.hosts.finish_all()
        await h.settle()
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == stored.progress.total_steps == 4

    activations.run(scenario)


def test_resume_after__the_plans_last_stage_always_runs(activations: Activations) -> None:
    """A checkpoint at the last stage (a run that failed after its stages, say): the stages
    before it are skipped, the last runs again; the kept resume names the last stage skipped."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2, 1, 1]), resume_after=after(2))
        await h.c.start()
        await h.settle()
        assert h.hosts.running_ids() == {"000003"}
        assert (await h.stored()).resume_after == after(1)

    activations.run(scenario)


def test_resume_after__a_changed_stage_layout_runs_from_the_top_and_clears_it(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        other = (StageShape(stage=0, steps=3), *LAYOUT[1:])
        h = await activations.new(StagedJob, Plan(sizes=[2, 1, 1]), resume_after=after(0, other))
        await h.c.start()
        await h.settle()
        assert h.hosts.running_ids() == {"000000", "000001"}
        assert len(await h.steps()) == 4
        assert (await h.stored()).resume_after is None

    activations.run(scenario)


def test_resume_after__a_new_activation_keeps_the_skipped_stages(activations: Activations) -> None:
    """The job's activation is lost while stage 1 runs: the next one counts stage 0 as done
    and the job completes with every step counted once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2, 1, 1]), resume_after=after(0))
        await h.c.start()
        await h.settle()
        await h.activate(reconstructed=True)
        await h.settle()
        assert h.c.stages.first() == 1
        for _ in range(2):
            await h.hosts.finish_all()
            await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 4

    activations.run(scenario)
