"""Counting failures, the retry delay, dead-lettering and the start-up warning (spec 003)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from choreography_ray.options import JobsOptions
from choreography_ray.scheduler import failures
from choreography_ray.scheduler.dispatching import after_dispatch_failure
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus
from tests.unit.scheduler.factory import T0, dead_letter, failed, manifest, run

OPTIONS = SchedulerOptions()
HOUR = timedelta(hours=1)


def counted(runs, dead_letters=(), m=None, options=OPTIONS, now=T0):  # type: ignore[no-untyped-def]
    return failures.counted_failures(runs, m or manifest(), list(dead_letters), options, now)


def test_a_failure_counts_while_it_started_inside_the_window() -> None:
    inside, outside = failed(T0 - 23 * HOUR), failed(T0 - 25 * HOUR)
    assert counted([inside, outside]) == [inside]


def test_failures_weeks_apart_never_add_up() -> None:
    runs = [failed(T0 - timedelta(weeks=w)) for w in range(5)]
    assert len(counted(runs)) == 1


def test_the_manifests_own_failure_window_overrides_the_schedulers() -> None:
    runs = [failed(T0 - 2 * HOUR), failed(T0 - 30 * HOUR)]
    assert len(counted(runs, m=manifest(failure_window=timedelta(hours=1)))) == 0
    assert len(counted(runs, m=manifest(failure_window=timedelta(hours=48)))) == 2


@pytest.mark.parametrize(
    "status",
    [RunStatus.CANCELLED, RunStatus.DISPATCH_REQUEUED, RunStatus.SUCCEEDED, RunStatus.RUNNING],
)
def test_only_failed_runs_count(status: RunStatus) -> None:
    assert counted([run(status, T0 - HOUR)]) == []


def test_a_success_does_not_reset_the_count_inside_the_window() -> None:
    runs = [failed(T0 - HOUR), run(RunStatus.SUCCEEDED, T0 - 2 * HOUR), failed(T0 - 3 * HOUR)]
    assert len(counted(runs)) == 2


@pytest.mark.parametrize("status", [DeadLetterStatus.RETRIED, DeadLetterStatus.ACKNOWLEDGED])
def test_a_resolved_dead_letter_sets_earlier_failures_aside(status: DeadLetterStatus) -> None:
    before, after = failed(T0 - 3 * HOUR), failed(T0 - HOUR)
    letters = [dead_letter(status, resolved_at=T0 - 2 * HOUR)]
    assert counted([after, before], letters) == [after]


def test_an_unresolved_dead_letter_sets_nothing_aside() -> None:
    runs = [failed(T0 - HOUR)]
    assert len(counted(runs, [dead_letter(DeadLetterStatus.AWAITING_INTERVENTION)])) == 1


def test_a_dispatch_that_ran_out_of_attempts_counts_from_when_it_was_queued() -> None:
    never_started = failed(T0 - HOUR, started_at=None)
    assert counted([never_started]) == [never_started]


@pytest.mark.parametrize(
    ("failure", "minutes"), [(1, 5), (2, 10), (3, 20), (4, 40), (5, 60), (6, 60), (500, 60)]
)
def test_retry_delay__the_specs_table(failure: int, minutes: int) -> None:
    assert failures.retry_delay(failure, OPTIONS) == timedelta(minutes=minutes)


def test_retry_delay__follows_the_options() -> None:
    options = SchedulerOptions(
        default_retry_delay=2, retry_backoff_multiplier=3, max_retry_delay=60
    )
    assert [failures.retry_delay(n, options).total_seconds() for n in (1, 2, 3, 4)] == [
        2, 6, 18, 54,
    ]  # fmt: skip
    assert failures.retry_delay(1, SchedulerOptions(default_retry_delay=0)) == timedelta(0)


@pytest.mark.parametrize(("max_retries", "dead_at"), [(0, 1), (1, 2), (3, 4)])
def test_more_than_max_retries_counted_failures_dead_letter(max_retries: int, dead_at: int) -> None:
    m = manifest(max_retries=max_retries)
    runs = [failed(T0 - n * timedelta(minutes=10)) for n in range(1, dead_at + 1)]
    assert not failures.exceeds_retries(runs[:-1], m)
    assert failures.exceeds_retries(runs, m)


def test_a_manifest_that_has_not_run_is_never_dead_lettered() -> None:
    assert not failures.exceeds_retries([], manifest(max_retries=0))


def test_backoff_warning__none_with_the_defaults() -> None:
    # 5 + 10 + 20 minutes against 24 hours.
    assert failures.backoff_total(3, OPTIONS) == timedelta(minutes=35)
    assert failures.backoff_warning(OPTIONS) is None


def test_backoff_total__in_closed_form_for_any_number_of_retries() -> None:
    # 5, 10, 20, 40 minutes, then the 1 hour cap for every further retry.
    first_four = timedelta(minutes=75)
    assert failures.backoff_total(4, OPTIONS) == first_four
    huge = 2**31 - 1
    assert failures.backoff_total(huge, OPTIONS) == first_four + (huge - 4) * timedelta(hours=1)
    assert failures.backoff_warning(OPTIONS, max_retries=huge) is not None
    unbounded = SchedulerOptions(max_retry_delay=timedelta(days=10**6))
    assert failures.backoff_total(huge, unbounded) == timedelta.max
    for retries in range(0, 80, 7):  # the closed form is the sum, delay by delay
        one_by_one = sum((failures.retry_delay(n, OPTIONS) for n in range(1, retries + 1)),
                         timedelta(0))  # fmt: skip
        assert failures.backoff_total(retries, OPTIONS) == one_by_one


def test_backoff_warning__when_the_backoff_of_the_retries_reaches_the_window() -> None:
    options = SchedulerOptions(failure_count_window=timedelta(minutes=35))
    warning = failures.backoff_warning(options)
    assert warning is not None and "never be dead-lettered" in warning
    assert failures.backoff_warning(options, max_retries=2) is None
    assert failures.backoff_warning(OPTIONS, max_retries=30) is not None


@pytest.mark.parametrize(("attempts", "seconds"), [(1, 5), (2, 10), (3, 20), (4, 40)])
def test_dispatch_failure__requeued_with_its_own_backoff(attempts: int, seconds: float) -> None:
    retry = after_dispatch_failure(attempts, OPTIONS)
    assert not retry.gives_up and retry.delay == timedelta(seconds=seconds)


def test_dispatch_failure__counts_once_max_dispatch_attempts_are_used_up() -> None:
    assert after_dispatch_failure(5, OPTIONS).gives_up
    many = SchedulerOptions(max_dispatch_attempts=100)
    assert after_dispatch_failure(20, many).delay == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("name", "default"),
    [
        ("manifest_cycle", timedelta(seconds=5)),
        ("dispatch_interval", timedelta(seconds=2)),
        ("default_retry_delay", timedelta(minutes=5)),
        ("retry_backoff_multiplier", 2.0),
        ("max_retry_delay", timedelta(hours=1)),
        ("failure_count_window", timedelta(hours=24)),
        ("default_max_retries", 3),
        ("max_dispatch_attempts", 5),
        ("replay_answers_for", timedelta(hours=24)),
        ("dead_letter_retention", timedelta(days=30)),
    ],
)
def test_scheduler_option_defaults_are_the_specs(name: str, default: object) -> None:
    assert getattr(JobsOptions().scheduler, name) == default


def test_scheduler_options_read_from_json_with_seconds() -> None:
    options = JobsOptions.model_validate({"scheduler": {"manifest_cycle": 0.5}})
    assert options.scheduler.manifest_cycle == timedelta(milliseconds=500)


def test_a_requeues_run_that_never_started_counts_after_its_dead_letter() -> None:
    """The requeue queues its run (with the dead letter's id), then resolves the dead letter:
    the run is the first after the resolution even though it was queued just before it."""
    letter = dead_letter(DeadLetterStatus.RETRIED, resolved_at=T0)
    never_started = failed(T0 - timedelta(milliseconds=5), id=letter.id, started_at=None,
                           kind=EntryKind.DEAD_LETTER_REQUEUE)  # fmt: skip
    older = failed(T0 - timedelta(minutes=10))
    counted = failures.counted_failures([never_started, older], manifest(), [letter], OPTIONS,
                                        T0 + timedelta(minutes=1))  # fmt: skip
    assert counted == [never_started]
