"""`JobsOptions`: the spec's defaults, durations in seconds, and the values treated specially."""

from __future__ import annotations

import math
from datetime import timedelta

import pydantic
import pytest

from choreography_ray import JobsOptions
from choreography_ray.options import window_size


@pytest.mark.parametrize(
    ("name", "default"),
    [
        ("max_concurrent_step_starts", 16_384),
        ("max_active_steps_per_job", None),
        ("step_delivery_max_attempts", 10),
        ("step_delivery_retry_delay", timedelta(seconds=1)),
        ("max_step_delivery_retry_delay", timedelta(seconds=30)),
        ("job_watchdog_interval", timedelta(seconds=60)),
        ("max_step_attempts", 1),
        ("step_retry_backoff", timedelta(seconds=5)),
        ("max_step_retry_backoff", timedelta(minutes=5)),
        ("max_concurrent_rehydration", 8),
        ("step_lease_timeout", timedelta(0)),
        ("keys_providers", ()),
        ("allowed_type_prefixes", None),
        ("cleanup_interval", timedelta(minutes=5)),
        ("terminal_job_retention", timedelta(days=7)),
        ("max_terminal_jobs_per_cleanup", 100),
        ("dead_job_threshold", timedelta(hours=1)),
        ("max_concurrent_cleanup", 4),
    ],
)
def test_default_is_the_specs(name: str, default: object) -> None:
    assert getattr(JobsOptions(), name) == default


def test_defaults_turn_the_watchdog_on_and_leases_off() -> None:
    options = JobsOptions()
    assert options.watchdog_seconds == 60.0
    assert options.lease_seconds is None
    assert options.effective_max_step_attempts == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, timedelta(seconds=3)),
        (2.5, timedelta(seconds=2.5)),
        (0, timedelta(0)),
        (0.005, timedelta(milliseconds=5)),
        (timedelta(minutes=2), timedelta(minutes=2)),
    ],
)
def test_plain_numbers_read_as_seconds(value: float | timedelta, expected: timedelta) -> None:
    options = JobsOptions(
        step_delivery_retry_delay=value,
        max_step_delivery_retry_delay=value,
        job_watchdog_interval=value,
        step_retry_backoff=value,
        max_step_retry_backoff=value,
        step_lease_timeout=value,
        group_commit_delay=value,
    )
    assert options.step_delivery_retry_delay == expected
    assert options.max_step_delivery_retry_delay == expected
    assert options.job_watchdog_interval == expected
    assert options.step_retry_backoff == expected
    assert options.max_step_retry_backoff == expected
    assert options.step_lease_timeout == expected
    assert options.group_commit_delay == expected


def test_options_load_from_json_with_seconds() -> None:
    options = JobsOptions.model_validate_json('{"step_retry_backoff": 7, "max_step_attempts": 3}')
    assert options.step_retry_backoff == timedelta(seconds=7)
    assert options.max_step_attempts == 3


@pytest.mark.parametrize(("configured", "effective"), [(-5, 1), (0, 1), (1, 1), (3, 3)])
def test_effective_max_step_attempts_treats_values_below_one_as_one(
    configured: int, effective: int
) -> None:
    assert JobsOptions(max_step_attempts=configured).effective_max_step_attempts == effective


@pytest.mark.parametrize(("configured", "effective"), [(-1, 1), (0, 1), (1, 1), (16, 16)])
def test_effective_max_concurrent_step_starts_treats_values_below_one_as_one(
    configured: int, effective: int
) -> None:
    options = JobsOptions(max_concurrent_step_starts=configured)
    assert options.effective_max_concurrent_step_starts == effective


@pytest.mark.parametrize(
    ("configured", "window"), [(None, None), (-3, 1), (0, 1), (1, 1), (250, 250)]
)
def test_window_size_treats_values_below_one_as_one(configured: int | None, window: int) -> None:
    assert window_size(configured) == window
    options = JobsOptions(max_active_steps_per_job=configured)
    assert window_size(options.max_active_steps_per_job) == window


@pytest.mark.parametrize(
    "interval",
    [0, 0.0, -1, -0.5, timedelta(0), timedelta(seconds=-30), math.inf, -math.inf, timedelta.max],
    ids=repr,
)
def test_watchdog_is_off_for_zero_negative_or_infinite_intervals(
    interval: float | timedelta,
) -> None:
    assert JobsOptions(job_watchdog_interval=interval).watchdog_seconds is None


@pytest.mark.parametrize(
    ("interval", "seconds"),
    [(0.25, 0.25), (1, 1.0), (timedelta(minutes=10), 600.0)],
)
def test_watchdog_is_on_for_a_positive_finite_interval(
    interval: float | timedelta, seconds: float
) -> None:
    assert JobsOptions(job_watchdog_interval=interval).watchdog_seconds == seconds


@pytest.mark.parametrize(
    ("timeout", "seconds"), [(0, None), (-1, None), (math.inf, None), (30, 30.0)]
)
def test_lease_seconds_is_none_when_leases_are_off(timeout: float, seconds: float | None) -> None:
    assert JobsOptions(step_lease_timeout=timeout).lease_seconds == seconds


def test_unknown_option_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="max_step_attempt"):
        JobsOptions(max_step_attempt=3)  # type: ignore[call-arg]


def test_unknown_option_in_json_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        JobsOptions.model_validate({"watchdog_interval": 5})


def test_options_are_frozen() -> None:
    options = JobsOptions()
    with pytest.raises(pydantic.ValidationError):
        options.max_step_attempts = 5  # type: ignore[misc]
    assert options.max_step_attempts == 1


@pytest.mark.parametrize("name", ["step_host_capacity", "step_batch_size"])
def test_batch_sizes_must_be_positive(name: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        JobsOptions.model_validate({name: 0})


@pytest.mark.parametrize("off", [None, 0, -1, math.inf, timedelta(0), timedelta.max], ids=repr)
def test_cleanup_options__none_zero_negative_or_infinite_turn_each_off(
    off: float | timedelta | None,
) -> None:
    options = JobsOptions(cleanup_interval=off, terminal_job_retention=off, dead_job_threshold=off)
    assert options.cleanup_seconds is None
    assert options.effective_terminal_job_retention is None
    assert options.effective_dead_job_threshold is None


def test_cleanup_options__on_by_default_and_read_as_seconds() -> None:
    assert JobsOptions().cleanup_seconds == 300.0
    assert JobsOptions().effective_terminal_job_retention == timedelta(days=7)
    options = JobsOptions(terminal_job_retention=60, dead_job_threshold=1.5)
    assert options.effective_terminal_job_retention == timedelta(seconds=60)
    assert options.effective_dead_job_threshold == timedelta(seconds=1.5)


@pytest.mark.parametrize("name", ["max_terminal_jobs_per_cleanup", "max_concurrent_cleanup"])
def test_cleanup_limits__none_is_no_limit_and_below_one_is_refused(name: str) -> None:
    assert getattr(JobsOptions.model_validate({name: None}), name) is None
    with pytest.raises(pydantic.ValidationError):
        JobsOptions.model_validate({name: 0})
