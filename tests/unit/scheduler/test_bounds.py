"""Issue 36, items 2 and 6: the backoff in float seconds for any multiplier, a start-up warning
that never fails, and the scheduler's options refused out of range, naming the option."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import ValidationError

from choreography_ray.options import JobsOptions
from choreography_ray.scheduler import failures
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.schedules import Every
from tests.unit.scheduler.harness import JOB, Harness, run


def test_retry_delay__small_multiplier_follows_the_spec_formula_past_64_failures() -> None:
    options = SchedulerOptions(retry_backoff_multiplier=1.01, max_retry_delay=timedelta(days=1))
    # 5 min * 1.01^99 = 13 min 23.4 s (an exponent cap of 64 gave 9 min 27 s).
    delay = failures.retry_delay(100, options)
    assert timedelta(minutes=13, seconds=23) < delay < timedelta(minutes=13, seconds=24)


def test_retry_delay__an_infinite_cap_never_overflows() -> None:
    options = SchedulerOptions(max_retry_delay=float("inf"))
    assert failures.retry_delay(10**9, options) == failures.LONGEST_DELAY
    assert failures.backoff_total(2**31 - 1, options) == timedelta.max


def test_start__an_overflowing_backoff_warning_still_starts_the_scheduler() -> None:
    async def scenario() -> None:
        h = Harness(max_retry_delay=float("inf"), default_max_retries=2**31 - 1)
        core = await asyncio.wait_for(h.start(), 5)
        assert core.lock.held
        # An operation is answered, not left waiting for a start that never finished.
        manifest = await asyncio.wait_for(
            core.schedule("m", JOB, {}, Every.hours(1), max_retries=2**31 - 1), 5
        )
        assert manifest.max_retries == 2**31 - 1
        await h.run_for(1)

    run(scenario)


@pytest.mark.parametrize(
    "option",
    ["manifest_cycle", "dispatch_interval", "failure_count_window", "dispatch_timeout",
     "replay_answers_for", "dead_letter_retention", "lock_ttl", "default_run_timeout",
     "run_retention", "run_cleanup_interval"],
)  # fmt: skip
@pytest.mark.parametrize("value", [0, -1])
def test_options__zero_or_less_refused_naming_the_option(option: str, value: float) -> None:
    with pytest.raises(ValidationError, match=f"{option} must be longer than zero"):
        SchedulerOptions(**{option: value})
    with pytest.raises(ValidationError, match=f"scheduler.{option}"):
        JobsOptions(scheduler={option: value})


@pytest.mark.parametrize(
    "option",
    ["default_retry_delay", "max_retry_delay", "dispatch_retry_delay", "max_dispatch_retry_delay"],
)
def test_options__negative_delays_refused_naming_the_option(option: str) -> None:
    with pytest.raises(ValidationError, match=f"{option} must not be negative"):
        SchedulerOptions(**{option: -1})
    assert SchedulerOptions(**{option: 0})  # zero: no delay


def test_options__runs_kept_at_least_one() -> None:
    with pytest.raises(ValidationError, match="runs_kept"):
        SchedulerOptions(runs_kept=0)
