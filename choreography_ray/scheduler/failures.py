"""Counting failures, the retry delay and dead-lettering, as the spec's "Counting failures".

A run counts as a failure when it is FAILED (its job ended COMPLETED_WITH_FAILURES or FAILED,
or its dispatch used up `max_dispatch_attempts`), it started inside the manifest's failure window
(`failure_window`, else the scheduler's `failure_count_window`) and after the manifest's latest
resolved dead letter. A run an operator queued for an execution (`requeue_execution`,
`resume_execution`) never counts: it belongs to no manifest's retry count. A cancelled run
never counts, nor a dispatch waiting for another attempt (DISPATCH_REQUEUED). A success does
not reset the count inside the window; it ends the backoff.

More than `max_retries` counted failures dead-letter the manifest: `max_retries=0` on the first
failure, the default 3 on the fourth; a manifest that has not run never.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus

#: The longest delay in float seconds a `timedelta` holds with room for rounding.
_MAX_SECONDS = (timedelta.max - timedelta(days=1)).total_seconds()
#: The longest retry delay stored: a `scheduled_at` must stay a date (100 years is never).
LONGEST_DELAY = timedelta(days=36_500)


def failure_window(manifest: Manifest, options: SchedulerOptions) -> timedelta:
    return manifest.failure_window or options.failure_count_window


def latest_resolved(dead_letters: Iterable[DeadLetter]) -> DeadLetter | None:
    """The manifest's latest resolved dead letter: failures before its resolution are set
    aside, so a requeued manifest starts fresh."""
    resolved = [d for d in dead_letters if d.status.is_resolved and d.resolved_at]
    return max(resolved, key=lambda d: d.resolved_at or d.dead_lettered_at, default=None)


def awaiting_intervention(dead_letters: Iterable[DeadLetter]) -> DeadLetter | None:
    return next(
        (d for d in dead_letters if d.status is DeadLetterStatus.AWAITING_INTERVENTION), None
    )


def counts(
    run: ManifestRun,
    manifest: Manifest,
    dead_letters: Sequence[DeadLetter],
    options: SchedulerOptions,
    now: datetime,
) -> bool:
    """The run is a failure that counts toward the manifest's retries now."""
    if run.status is not RunStatus.FAILED or not run.kind.counts_toward_retries:
        return False
    started = run.counted_from
    if started < now - failure_window(manifest, options):
        return False
    latest = latest_resolved(dead_letters)
    if latest is None or latest.resolved_at is None:
        return True
    # The dead letter's own requeue (its run has the dead letter's id) is queued just before
    # the resolution, and is the first run after it, started or not.
    return run.id == latest.id or started >= latest.resolved_at


def counted_failures(
    runs: Iterable[ManifestRun],
    manifest: Manifest,
    dead_letters: Sequence[DeadLetter],
    options: SchedulerOptions,
    now: datetime,
) -> list[ManifestRun]:
    return [r for r in runs if counts(r, manifest, dead_letters, options, now)]


def _delay_seconds(failures: int, options: SchedulerOptions) -> float:
    """The spec's delay of the `failures`-th failure in float seconds, capped at
    `max_retry_delay` (an overflowing power is past any cap)."""
    base = options.default_retry_delay.total_seconds()
    cap = options.max_retry_delay.total_seconds()
    if base <= 0:
        return 0.0
    try:
        seconds = base * options.retry_backoff_multiplier ** (failures - 1)
    except OverflowError:
        seconds = math.inf
    return min(seconds, cap)


def _as_timedelta(seconds: float) -> timedelta:
    """`seconds` as a duration, clamped to the longest one `timedelta` holds."""
    return timedelta.max if seconds >= _MAX_SECONDS else timedelta(seconds=seconds)


def retry_delay(failures: int, options: SchedulerOptions) -> timedelta:
    """`min(default_retry_delay * retry_backoff_multiplier^(failures-1), max_retry_delay)`,
    computed in float seconds with no exponent cap (the spec's formula for any multiplier)."""
    if failures < 1:
        return timedelta(0)
    return min(_as_timedelta(_delay_seconds(failures, options)), LONGEST_DELAY)


def exceeds_retries(counted: Sequence[ManifestRun], manifest: Manifest) -> bool:
    """Dead-letter on this cycle: more counted failures than `max_retries`."""
    return len(counted) > manifest.max_retries


def dead_letter_reason(counted: Sequence[ManifestRun], manifest: Manifest) -> str:
    window = "its failure window"
    return (
        f"{len(counted)} counted failure(s) inside {window}, more than max_retries="
        f"{manifest.max_retries}; latest: {counted[0].error or counted[0].id}"
    )


def backoff_total(retries: int, options: SchedulerOptions) -> timedelta:
    """The delays of `retries` retries in a row, added up, in closed form (float seconds):
    a geometric sum up to the first capped delay, then the cap for each further one, so
    `max_retries=2**31-1` costs no more than one retry; clamped to `timedelta.max`."""
    if retries < 1:
        return timedelta(0)
    base = options.default_retry_delay.total_seconds()
    cap = options.max_retry_delay.total_seconds()
    multiplier = options.retry_backoff_multiplier
    if base <= 0 or cap <= 0:
        return timedelta(0)
    if multiplier == 1.0 or base >= cap:
        return _as_timedelta(retries * min(base, cap))
    # The delays below the cap: base * multiplier^(n-1) < cap for n <= uncapped.
    uncapped = min(retries, max(0, math.ceil(math.log(cap / base, multiplier))))
    while uncapped > 0 and _delay_seconds(uncapped, options) >= cap:
        uncapped -= 1
    while uncapped < retries and _delay_seconds(uncapped + 1, options) < cap:
        uncapped += 1
    geometric = base * (multiplier**uncapped - 1) / (multiplier - 1)
    return _as_timedelta(geometric + (retries - uncapped) * cap)


def backoff_warning(
    options: SchedulerOptions, max_retries: int | None = None, window: timedelta | None = None
) -> str | None:
    """The start-up warning when the backoff of `max_retries` retries alone (default
    `default_max_retries`) reaches the failure window: a manifest that always fails would then
    never be dead-lettered, since its first failures leave the window before the last retry."""
    retries = options.default_max_retries if max_retries is None else max_retries
    window = options.failure_count_window if window is None else window
    try:
        total = backoff_total(retries, options)
    except (OverflowError, ValueError, ZeroDivisionError):  # a warning never fails its caller
        return None
    if retries < 1 or total < window:
        return None
    return (
        f"the backoff of {retries} retries ({total}) reaches the failure window ({window}): "
        "a manifest that always fails would never be dead-lettered; shorten the retry delays "
        "or widen the window"
    )
