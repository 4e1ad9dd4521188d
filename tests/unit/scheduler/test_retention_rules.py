"""Issue 36, item 11: which runs the metadata cleanup keeps (`retention.needed`)."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.scheduler import retention
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import WorkEntry
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus
from tests.unit.scheduler.factory import (
    T0,
    dead_letter,
    failed,
    manifest,
    newest_first,
    run,
    succeeded,
)

DAY = timedelta(days=1)


OPTIONS = SchedulerOptions(runs_kept=1, run_retention=DAY)
OLD = T0 - 10 * DAY


def needed(m, *runs, dead_letters=(), entries=()):  # type: ignore[no-untyped-def]
    return retention.needed(m, newest_first(*runs), dead_letters, entries, OPTIONS, T0)


def test_kept__the_newest_recent_unfinished_and_the_points_the_schedule_counts_from() -> None:
    m = manifest()
    newest = succeeded(T0 - DAY / 2)
    recent = succeeded(T0 - DAY / 4, kind=EntryKind.REQUEUE_EXECUTION)
    running = run(RunStatus.RUNNING, OLD)
    latest_success = succeeded(OLD + DAY)
    cancelled = run(RunStatus.CANCELLED, OLD + DAY / 2)
    old_success = succeeded(OLD)
    old_failure = failed(OLD - DAY)
    kept = needed(m, newest, recent, running, latest_success, cancelled, old_success,
                  old_failure)  # fmt: skip
    # `newest` is also the latest success of the manifest's own runs; the older ones go.
    assert kept == {newest.id, recent.id, running.id, cancelled.id}
    assert retention.doomed(m, newest_first(newest, latest_success, old_success), (), (),
                            OPTIONS, T0) == [old_success.id, latest_success.id]  # fmt: skip


def test_kept__a_counted_failure_a_dead_letters_run_and_a_queued_entrys_runs() -> None:
    m = manifest(failure_window=20 * DAY)
    newest = succeeded(T0 - DAY / 2)
    counted = failed(OLD)
    lettered = failed(T0 - 40 * DAY)
    replayed, resumed, requeued = (succeeded(T0 - 50 * DAY) for _ in range(3))
    other = succeeded(T0 - 60 * DAY)
    entry = WorkEntry(scope="s", manifest="m", run_id="r9", replays=replayed.id,
                      resume_from=resumed.id, requeues=requeued.id)  # fmt: skip
    kept = needed(m, newest, counted, lettered, replayed, resumed, requeued, other,
                  dead_letters=[dead_letter(DeadLetterStatus.ACKNOWLEDGED, T0, run_id=lettered.id)],
                  entries=[entry])  # fmt: skip
    assert kept - {"r9"} == {newest.id, counted.id, lettered.id, replayed.id, resumed.id,
                             requeued.id}  # fmt: skip


def test_kept__the_chain_a_kept_run_resumed_from_and_a_replay_of_a_kept_run() -> None:
    m = manifest()
    source = failed(T0 - 40 * DAY)
    resumed_once = failed(T0 - 30 * DAY, resumed_from=source.id)
    newest = failed(T0 - DAY / 2, resumed_from=resumed_once.id)
    replay_of_newest = failed(T0 - 20 * DAY, replays=newest.id)  # (queued_at says older)
    kept = needed(m, newest, resumed_once, source, replay_of_newest)
    assert kept == {newest.id, resumed_once.id, source.id, replay_of_newest.id}
