"""Step retries: the decision (the schedule is the step runs' RETRY_WAIT, `window.py`).

`Backoff` (in `backoff.py`, re-exported here) is the one helper behind every retry loop.

The step retry schedule is kept in the job activation's memory, not durably: after the job is
reactivated, a failed attempt that was waiting for its retry counts as final (the spec's
caution). While the resume hook is owed, due attempts wait; a stop or removal counts pending
attempts as failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from choreography_ray.core.backoff import STANDARD as STANDARD
from choreography_ray.core.backoff import Backoff as Backoff
from choreography_ray.core.messages import Outcome
from choreography_ray.job import Job
from choreography_ray.options import JobsOptions
from choreography_ray.step import StepResult


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """A failed attempt's fate: retry after `delay` seconds, or count it as failed."""

    retry: bool
    delay: float = 0.0


def decide(job: Job[Any], options: JobsOptions, outcome: Outcome) -> RetryDecision:
    if outcome.attempt >= options.effective_max_step_attempts:
        return RetryDecision(retry=False)
    result = StepResult(success=False, message=outcome.message)
    if not job.should_retry_step(outcome.step_id, result, outcome.attempt):
        return RetryDecision(retry=False)
    return RetryDecision(True, job.get_step_retry_delay(outcome.attempt).total_seconds())
