"""Outcomes: each counts once per (step, attempt), only while its step is active here at that
attempt; a failure is retried (with backoff) or counted, a stop counted or taken back; outcomes
the job reaches itself (a step that cannot start, a stop its gone host never stored) are stored
as a host would store them; lost reports are settled from storage.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from choreography_ray.core import dispatch
from choreography_ray.core.messages import Outcome, StepStart
from choreography_ray.core.retries import decide
from choreography_ray.core.watchdog import lost_reports
from choreography_ray.core.window import RUNNING
from choreography_ray.failures import failure_signature
from choreography_ray.logs import get_logger, ids
from choreography_ray.model import StatusChange
from choreography_ray.status import FAILED_STEP, StepStatus
from choreography_ray.storage import StepUpdate

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


def accept(a: Activation, outcome: Outcome) -> bool:
    """Counts an outcome once per (step, attempt); False when it was not counted."""
    entry = a.window.take(outcome.step_id, outcome.attempt)
    if entry is None:
        return False
    start, host = entry
    if dispatch.is_dedicated(a, start.type):
        a.hosts.release(host)
    return settle(a, start, outcome)


def settle(a: Activation, start: StepStart, outcome: Outcome) -> bool:
    counter = a.stages[start.stage]
    step_id = start.step_id
    a.dirty = True
    if outcome.status is StepStatus.STOPPED:
        if a.counting.count_stop(step_id):
            counter.stopped += 1
            a.tally.stopped += 1
        if a.live:
            # Stopped though the job runs (a stop of an earlier execution reached it after
            # a resume): it counts as stopped until it runs again, now, as its next
            # attempt, so the same report delivered again cannot pass for the new run's.
            a.window.queue([start._replace(attempt=start.attempt + 1)])
        return True
    if a.counting.is_counted(step_id):
        return False
    if outcome.status in FAILED_STEP:
        decision = decide(a.loaded_job, a.options, outcome)
        if decision.retry and a.live:
            a.window.wait_retry(start, decision.delay)
            a.timers.arm("retries", a.window.next_due_in() or 0.0)
            a.tally.retried += 1
            return True
        counter.failed += 1
        a.tally.failure(outcome.signature or failure_signature(outcome.message))
    else:
        counter.successful += 1
        a.tally.succeeded += 1
    if a.counting.take_back_stop(step_id):
        # The stop of an earlier execution is taken back; the outcome counts instead.
        counter.stopped -= 1
    a.counting.count_outcome(step_id)
    return True


async def store_outcomes(a: Activation, outcomes: list[Outcome]) -> None:
    """Stores outcomes the job reached itself (not successes), as a host stores a step's."""
    await a.storage.update_steps(
        [
            StepUpdate(
                a.job_id,
                o.step_id,
                o.status,
                o.attempt,
                change=StatusChange(
                    status=o.status,
                    exception_messages=() if o.message is None else (o.message,),
                ),
                failure_signature=o.signature,
            )
            for o in outcomes
        ]
    )


async def store_stops(a: Activation, starts: list[StepStart]) -> None:
    """Steps of a stopping job that will never report their stop (their host is gone):
    stored STOPPED here, as their host would have, then counted."""
    for start in starts:
        if not a.window.is_in_flight(start.step_id):
            a.window.adopt(start, "")
    stops = [Outcome(s.step_id, s.attempt, StepStatus.STOPPED) for s in starts]
    await store_outcomes(a, stops)
    for outcome in stops:
        accept(a, outcome)


async def settle_lost_reports(a: Activation, stage: int) -> None:
    """Active steps whose outcome storage holds but whose report never arrived (steps whose
    start operation is unanswered have nothing stored yet, and wait)."""
    await settle_stored(a, settleable(a, stage))


def settleable(a: Activation, stage: int) -> dict[str, tuple[StepStart, str]]:
    """The stage's active steps that may have an outcome stored (a step whose start
    operation is unanswered has nothing stored yet)."""
    return {
        step_id: entry
        for step_id, entry in a.window.active(*RUNNING).items()
        if entry[0].stage == stage
    }


async def settle_stored(a: Activation, active: dict[str, tuple[StepStart, str]]) -> None:
    if not active:
        return
    for outcome in await lost_reports(a.storage, a.job_id, active):
        log.info("job %s: settling the lost report of step %s", a.job_id, outcome.step_id,
                 extra=ids(a.job_id, outcome.step_id))  # fmt: skip
        accept(a, outcome)


async def forget_stored_outcomes(a: Activation, stage: int) -> None:
    """Active steps whose outcome storage holds: the recount made in the same fence
    counted them."""
    for outcome in await lost_reports(a.storage, a.job_id, settleable(a, stage)):
        entry = a.window.take(outcome.step_id, outcome.attempt)
        if entry is not None and dispatch.is_dedicated(a, entry[0].type):
            a.hosts.release(entry[1])
