"""The watchdog's rules: what a tick decides, and the resume-hook backoff.

Every `job_watchdog_interval` (and soon after the job activates as RUNNING) a running job counts
its steps by status in storage with one query. When every step of the stage is done there, it
recounts from storage and moves on. Otherwise it settles reports that never arrived (an active
step whose outcome storage holds), starts failed starts again, restarts steps whose lease
expired, asks a waiting stage's admission again and fills the window. A zero, negative or
infinite interval turns it off.
"""

from __future__ import annotations

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


async def lost_reports(
    storage: Storage, job_id: str, stage: int, active: dict[str, tuple[StepStart, str]]
) -> list[Outcome]:
    """The outcomes storage holds for active steps of `stage` whose report never arrived.

    An active step missing from storage succeeded (a success deletes its record); one stored
    FAILED, COMPLETED_WITH_FAILURE or STOPPED at its attempt reached that outcome. A step
    stored as anything else (RUNNING, or SCHEDULED while its start is written) has not
    reported yet. One paged read of the stage's steps.
    """
    outcomes: list[Outcome] = []
    present: set[str] = set()
    async for page in step_pages(storage, job_id, stage=stage):
        for step in page:
            present.add(step.step_id)
            entry = active.get(step.step_id)
            if entry is None or step.attempt != entry[0].attempt:
                continue
            if step.status in FAILED_STEP or step.status is StepStatus.STOPPED:
                changes = step.status_changes
                messages = changes[-1].exception_messages if changes else ()
                message = messages[0] if messages else None
                outcomes.append(Outcome(step.step_id, step.attempt, step.status, message))
    outcomes.extend(
        Outcome(step_id, start.attempt, StepStatus.COMPLETED_SUCCESSFULLY)
        for step_id, (start, _host) in active.items()
        if step_id not in present
    )
    return outcomes
