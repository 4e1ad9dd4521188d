"""Stages: the plan's stage layout, per-stage counters, the recount from storage, and what a
finished stage leads to.

Stages run in the order of their value (gaps are harmless). A stage is a barrier by default: if
any of its steps failed, the steps of every later stage become UNREACHABLE and the job ends
with failures; a stage whose `get_failure_behavior_for` is CONTINUE_WITH_NEXT_STAGE lets the
next one start, and so does one whose share of successful steps reaches its
`get_min_success_ratio`. Each stage is admitted (`admit_stage`) before it starts.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

from choreography_ray.job import Job
from choreography_ray.model import JobProgress, ResumeAfter, StageProgress, StageShape
from choreography_ray.status import UNFINISHED_STEP, JobStageFailureBehavior, StepStatus
from choreography_ray.storage import (
    PAGE,
    StatusCounts,
    StepUpdate,
    Storage,
    StoredStart,
    starts_of,
    step_pages,
)


@dataclass(slots=True)
class StageCounter:
    """A stage's counters while the job runs: a cache of what storage holds."""

    stage: int
    total: int
    is_started: bool = False
    successful: int = 0
    failed: int = 0
    unreachable: int = 0
    stopped: int = 0

    @property
    def is_completed(self) -> bool:
        return self.successful + self.failed + self.unreachable >= self.total

    @property
    def has_failures(self) -> bool:
        return self.failed + self.unreachable > 0


class Stages:
    """The stages of a plan in the order they run (by value; gaps are harmless)."""

    def __init__(self, counters: list[StageCounter], skipped_through: int | None = None) -> None:
        self.counters = {c.stage: c for c in sorted(counters, key=lambda c: c.stage)}
        #: The last stage a resume after a checkpoint skipped (`skip_through`), or None.
        self.skipped_through = skipped_through

    @classmethod
    def from_totals(cls, totals: dict[int, int]) -> Stages:
        return cls([StageCounter(stage, total) for stage, total in totals.items()])

    @classmethod
    def from_progress(cls, progress: JobProgress, skipped_through: int | None = None) -> Stages:
        return cls(
            [
                StageCounter(
                    s.stage,
                    s.total_steps,
                    s.is_started,
                    s.successful_steps,
                    s.failed_steps,
                    s.unreachable_steps,
                    s.stopped_steps,
                )
                for s in progress.stages
            ],
            skipped_through,
        )

    @property
    def has_stages(self) -> bool:
        """Stages exist only when the plan has more than one distinct stage value."""
        return len(self.counters) > 1

    def first(self) -> int:
        """The first stage to run: the plan's first, or the first after a resume's skipped ones."""
        if self.skipped_through is not None:
            return self.next_after(self.skipped_through) or 0
        return next(iter(self.counters), 0)

    def layout(self) -> tuple[StageShape, ...]:
        return tuple(StageShape(stage=c.stage, steps=c.total) for c in self.counters.values())

    def skip_through(self, resume: ResumeAfter | None) -> list[int]:
        """A resume after a checkpoint: the stages up to the checkpoint's, never the plan's last,
        are counted as succeeded and not run; which. None when there is no resume or the plan's
        stage layout is no longer the checkpoint's (the job runs from the top)."""
        if resume is None or self.layout() != resume.layout:
            return []
        skipped = [s for s in self.counters if s <= resume.stage][: len(self.counters) - 1]
        for stage in skipped:
            counter = self.counters[stage]
            counter.is_started, counter.successful = True, counter.total
        self.skipped_through = skipped[-1] if skipped else None
        return skipped

    def after(self, stage: int) -> list[int]:
        return [s for s in self.counters if s > stage]

    def next_after(self, stage: int) -> int | None:
        later = self.after(stage)
        return later[0] if later else None

    def __getitem__(self, stage: int) -> StageCounter:
        return self.counters[stage]

    def progress(self) -> JobProgress:
        stages = tuple(
            StageProgress(
                stage=c.stage,
                is_started=c.is_started,
                total_steps=c.total,
                successful_steps=c.successful,
                failed_steps=c.failed,
                unreachable_steps=c.unreachable,
                stopped_steps=c.stopped,
            )
            for c in self.counters.values()
        )
        return JobProgress(
            total_steps=sum(c.total for c in self.counters.values()),
            successful_steps=sum(c.successful for c in self.counters.values()),
            failed_steps=sum(c.failed for c in self.counters.values()),
            stopped_steps=sum(c.stopped for c in self.counters.values()),
            unreachable_steps=sum(c.unreachable for c in self.counters.values()),
            stages=stages,
        )

    def recount(self, counts: StatusCounts) -> None:
        """Counters from storage: a succeeded step is no longer stored; FAILED and
        COMPLETED_WITH_FAILURE count as failed."""
        for counter in self.counters.values():
            stored = {status: n for (stage, status), n in counts.items() if stage == counter.stage}
            counter.failed = stored.get(StepStatus.FAILED, 0) + stored.get(
                StepStatus.COMPLETED_WITH_FAILURE, 0
            )
            counter.unreachable = stored.get(StepStatus.UNREACHABLE, 0)
            counter.stopped = stored.get(StepStatus.STOPPED, 0)
            counter.successful = counter.total - sum(stored.values())


@dataclass(frozen=True, slots=True)
class AfterStage:
    """What a finished stage leads to: the next stage to begin, or completion (with the later
    stages to mark UNREACHABLE first)."""

    next_stage: int | None
    unreachable: tuple[int, ...] = ()


def after_stage(stages: Stages, stage: int, job: Job[Any]) -> AfterStage:
    later = stages.after(stage)
    if not later:
        return AfterStage(None)
    if not goes_on(stages[stage], job):
        return AfterStage(None, tuple(later))
    return AfterStage(later[0])


def goes_on(counter: StageCounter, job: Job[Any]) -> bool:
    """Whether the stage after this finished one starts: with no failures; with failures, when
    enough steps succeeded (`get_min_success_ratio`), else as `get_failure_behavior_for` says."""
    ratio = job.get_min_success_ratio(counter.stage)
    if ratio is not None:
        return counter.total == 0 or counter.successful / counter.total >= ratio
    return not counter.has_failures or (
        job.get_failure_behavior_for(counter.stage)
        is JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE
    )


async def stored_running(
    storage: Storage, job_id: str, stage: int, host_of: dict[str, str]
) -> list[StoredStart]:
    """The stage's steps stored RUNNING, and those a live host runs whatever their stored
    status (a host's RUNNING write may not be flushed yet): what a resume adopts or starts
    first. As many as were active, not the stage's size."""
    running: list[StoredStart] = []
    after: str | None = None
    while True:
        page = await storage.list_starts(
            job_id, statuses=(StepStatus.RUNNING,), stage=stage, after=after, limit=PAGE
        )
        running += page
        if len(page) < PAGE:
            break
        after = page[-1].step_id
    seen = {row.step_id for row in running}
    for step_id in sorted(host_of.keys() - seen):
        step = await storage.get_step(job_id, step_id)
        if step is not None and step.stage == stage and step.status in UNFINISHED_STEP:
            running += starts_of([step])
    return running


async def stored_among(storage: Storage, job_id: str, stage: int, ids: Set[str]) -> set[str]:
    """Which of `ids` are among the stage's unfinished steps in storage, read a page at a
    time."""
    found: set[str] = set()
    after: str | None = None
    while True:
        page = await storage.list_starts(
            job_id, statuses=UNFINISHED_STEP, stage=stage, after=after, limit=PAGE
        )
        found.update(row.step_id for row in page if row.step_id in ids)
        if len(page) < PAGE:
            return found
        after = page[-1].step_id


async def mark_unreachable(
    storage: Storage, job_id: str, stages: Stages, which: Sequence[int]
) -> None:
    """The steps of these stages will never run: stored and counted as UNREACHABLE."""
    unreachable = StepStatus.UNREACHABLE
    for stage in which:
        async for page in step_pages(storage, job_id, stage=stage):
            await storage.update_steps(
                [
                    StepUpdate(job_id, s.step_id, unreachable, s.attempt)
                    for s in page
                    if s.status is not unreachable
                ]
            )
        counter = stages[stage]
        counter.unreachable = counter.total - counter.successful - counter.failed
