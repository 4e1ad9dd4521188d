"""The retry policy (decision, backoff, schedule) and the resume-hook backoff: pure logic."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from pydantic import BaseModel

import choreography_ray as cr
from choreography_ray.core.messages import Outcome
from choreography_ray.core.retries import RetryDecision, decide
from choreography_ray.core.watchdog import HookBackoff

pytestmark = pytest.mark.timeout(10)


class Nothing(BaseModel):
    pass


class PlainJob(cr.Job[Nothing]):
    pass


class RetriesTimeouts(PlainJob):
    """Retries a timeout, never a rejected input; waits 7 s times the failed attempt."""

    asked: list[tuple[str, cr.StepResult, int]]

    def should_retry_step(self, step_id: str, result: cr.StepResult, attempt: int) -> bool:
        self.asked.append((step_id, result, attempt))
        return "rejected" not in (result.message or "")

    def get_step_retry_delay(self, failed_attempt: int) -> timedelta:
        return timedelta(seconds=7 * failed_attempt)


def make_job(job_type: type[PlainJob] = PlainJob, **options: object) -> PlainJob:
    job = job_type()
    job.options = cr.JobsOptions(**options)
    if isinstance(job, RetriesTimeouts):
        job.asked = []
    return job


def failed(attempt: int, message: str = "timeout", step_id: str = "000001") -> Outcome:
    return Outcome(step_id, attempt, cr.StepStatus.COMPLETED_WITH_FAILURE, message)


# -- the default backoff --------------------------------------------------------------------------


def test_default_retry_delay__step_retry_backoff_doubling_up_to_the_maximum() -> None:
    job = make_job()  # 5 s, at most 5 min

    delays = [job.get_step_retry_delay(attempt).total_seconds() for attempt in range(1, 10)]

    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300]


def test_default_retry_delay__follows_the_options() -> None:
    job = make_job(step_retry_backoff=0.2, max_step_retry_backoff=1.0)

    delays = [job.get_step_retry_delay(attempt).total_seconds() for attempt in range(1, 6)]

    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])


# -- the decision ---------------------------------------------------------------------------------


def test_decide__one_attempt_by_default_never_retries() -> None:
    assert decide(make_job(), make_job().options, failed(1)) == RetryDecision(retry=False)


@pytest.mark.parametrize("configured", [0, -3])
def test_decide__max_step_attempts_below_one_is_one(configured: int) -> None:
    job = make_job(max_step_attempts=configured)

    assert decide(job, job.options, failed(1)).retry is False


def test_decide__retries_until_the_attempts_run_out_with_the_jobs_delay() -> None:
    job = make_job(max_step_attempts=3, step_retry_backoff=0.2, max_step_retry_backoff=1.0)

    decisions = [decide(job, job.options, failed(attempt)) for attempt in (1, 2, 3)]

    assert decisions == [
        RetryDecision(True, pytest.approx(0.2)),  # type: ignore[arg-type]
        RetryDecision(True, pytest.approx(0.4)),  # type: ignore[arg-type]
        RetryDecision(retry=False),
    ]


def test_decide__should_retry_step_sees_the_failure_and_can_refuse() -> None:
    job = make_job(RetriesTimeouts, max_step_attempts=5)
    assert isinstance(job, RetriesTimeouts)

    retried = decide(job, job.options, failed(2, "timeout", "000007"))
    refused = decide(job, job.options, failed(1, "rejected input", "000008"))

    assert retried == RetryDecision(True, 14.0)  # the job's own delay for failed attempt 2
    assert refused == RetryDecision(retry=False)
    assert job.asked == [
        ("000007", cr.StepResult.failed("timeout"), 2),
        ("000008", cr.StepResult.failed("rejected input"), 1),
    ]


def test_decide__the_job_is_not_asked_once_attempts_run_out() -> None:
    job = make_job(RetriesTimeouts, max_step_attempts=2)
    assert isinstance(job, RetriesTimeouts)

    assert decide(job, job.options, failed(2)).retry is False
    assert job.asked == []


# -- the resume-hook backoff ----------------------------------------------------------------------


def attempt_ticks(backoff: HookBackoff, ticks: int, succeed_at: int | None = None) -> list[int]:
    """Runs `ticks` watchdog ticks after a first failed attempt (on activation): the ticks at
    which the hook is tried again; each try fails but the one at tick `succeed_at`."""
    backoff.failed()
    tried: list[int] = []
    for tick in range(1, ticks + 1):
        if not backoff.should_try():
            continue
        tried.append(tick)
        if tick == succeed_at:
            backoff.succeeded()
        else:
            backoff.failed()
    return tried


def test_hook_backoff__next_tick_then_skips_1_3_7_then_15() -> None:
    tried = attempt_ticks(HookBackoff(), 80)

    assert tried == [1, 3, 7, 15, 31, 47, 63, 79]
    gaps = [later - earlier - 1 for earlier, later in itertools.pairwise(tried)]
    assert gaps == [1, 3, 7, 15, 15, 15, 15]


def test_hook_backoff__success_resets_it() -> None:
    backoff = HookBackoff()
    assert attempt_ticks(backoff, 7, succeed_at=7) == [1, 3, 7]
    assert backoff.failures == 0
    assert all(backoff.should_try() for _ in range(3))  # nothing owed, nothing skipped

    assert attempt_ticks(backoff, 3) == [1, 3]  # a new failure is retried on the next tick
