"""The watchdog's rules: what a tick decides, and the resume-hook backoff.

Every `job_watchdog_interval` (and soon after the job activates as RUNNING) a running job that
has nothing active asks storage whether the stage still has an unfinished step (indexed
look-ups that stop at the first one). When none is left, it recounts from storage and moves
on. Otherwise it settles reports that never arrived (an active step whose outcome storage
holds), starts failed starts again, restarts steps whose lease expired, asks a waiting stage's
admission again and fills the window. Those read the active steps' records by id: a tick costs
what runs, never the job's size. A zero, negative or infinite interval turns it off.
"""

from __future__ import annotations

from choreography_ray.core.messages import Outcome, StepStart
from choreography_ray.model import StepState
from choreography_ray.status import FAILED_STEP, UNFINISHED_STEP, StepStatus
from choreography_ray.storage import Storage

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


async def stage_done_in_storage(storage: Storage, job_id: str, stage: int) -> bool:
    """Storage holds no unfinished step of the stage."""
    return not await storage.has_steps(job_id, stage, UNFINISHED_STEP)


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
    message = messages[0] if messages else None
    return Outcome(step.step_id, step.attempt, step.status, message, step.failure_signature)


async def lost_reports(
    storage: Storage, job_id: str, active: dict[str, tuple[StepStart, str]]
) -> list[Outcome]:
    """The outcomes storage holds for active steps whose report never arrived: their records
    read by id."""
    if not active:
        return []
    records = await storage.get_steps(job_id, list(active))
    return [
        outcome
        for step_id, (start, _host) in active.items()
        if (outcome := stored_outcome(start, records.get(step_id))) is not None
    ]
