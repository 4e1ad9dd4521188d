"""The watchdog's rules: what a tick decides, and the resume-hook backoff.

Every `job_watchdog_interval` (and soon after the job activates as RUNNING) a running job counts
its steps by status in storage with one query. When every step of the stage is done there, it
recounts from storage and moves on. Otherwise it settles reports that never arrived (an active
step whose outcome storage holds), starts failed starts again, restarts steps whose lease
expired, asks a waiting stage's admission again and fills the window. A zero, negative or
infinite interval turns it off.
"""

from __future__ import annotations

from collections.abc import Collection

from choreography_ray.model import StepState
from choreography_ray.runtime.messages import Outcome, StepStart
from choreography_ray.status import FAILED_STEP, UNFINISHED_STEP, StepStatus
from choreography_ray.storage import StatusCounts, Storage, step_pages

#: Ticks skipped between retries of a failed `on_before_resuming_job_steps`, by failure count.
HOOK_SKIPS = (0, 1, 3, 7, 15)


class HookBackoff:
    """After the resume hook failed, retry it on the next tick, then skip 1, 3, 7, then 15."""

    def __init__(self) -> None:
        self.failures = 0
        self._skip = 0

    def failed(self) -> None:
        self.failures += 1
        self._skip = HOOK_SKIPS[min(self.failures - 1, len(HOOK_SKIPS) - 1)]

    def should_try(self) -> bool:
        """Called once per tick."""
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self._skip = 0


def stage_done_in_storage(counts: StatusCounts, stage: int) -> bool:
    """Storage holds no unfinished step of the stage."""
    return not any(
        n for (s, status), n in counts.items() if s == stage and status in UNFINISHED_STEP
    )


def stored_outcome(start: StepStart, step: StepState | None) -> Outcome | None:
    """The outcome a step's record holds for `start`'s attempt, if any. A missing record
    succeeded (a success deletes its record); one stored FAILED, COMPLETED_WITH_FAILURE or
    STOPPED at the attempt reached that outcome; anything else (RUNNING, SCHEDULED while its
    start is written, another attempt) has not reported yet."""
    if step is None:
        return Outcome(start.step_id, start.attempt, StepStatus.COMPLETED_SUCCESSFULLY)
    if step.attempt != start.attempt:
        return None
    if step.status not in FAILED_STEP and step.status is not StepStatus.STOPPED:
        return None
    changes = step.status_changes
    messages = changes[-1].exception_messages if changes else ()
    return Outcome(step.step_id, step.attempt, step.status, messages[0] if messages else None)


async def stored_records(
    storage: Storage, job_id: str, stage: int, step_ids: Collection[str]
) -> dict[str, StepState]:
    """The records of `stage` among `step_ids`: one paged read of the stage's steps, up to the
    last of them (the window starts steps in step-id order, so that read covers what has run,
    not the steps of a large stage still waiting)."""
    records: dict[str, StepState] = {}
    last = max(step_ids, default=None)
    if last is None:
        return records
    async for page in step_pages(storage, job_id, stage=stage):
        records.update((step.step_id, step) for step in page if step.step_id in step_ids)
        if page[-1].step_id >= last:
            break
    return records


async def lost_reports(
    storage: Storage, job_id: str, stage: int, active: dict[str, tuple[StepStart, str]]
) -> list[Outcome]:
    """The outcomes storage holds for active steps of `stage` whose report never arrived."""
    records = await stored_records(storage, job_id, stage, active)
    return [
        outcome
        for step_id, (start, _host) in active.items()
        if (outcome := stored_outcome(start, records.get(step_id))) is not None
    ]
