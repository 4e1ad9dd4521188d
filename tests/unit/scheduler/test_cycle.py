"""The manifest manager's turn for one manifest (`cycle.plan`) and a trigger: the spec's
"When a retry runs" table row by row, dead-lettering, and its example on an injected clock."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from choreography_ray.model import StageShape
from choreography_ray.scheduler import cycle
from choreography_ray.scheduler.cycle import DeadLetterIt, History, Queue, Release, Wait
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import Checkpoint, ManifestRun, WorkEntry
from choreography_ray.scheduler.replay import AskAfresh
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt
from choreography_ray.scheduler.status import (
    DeadLetterStatus,
    EntryKind,
    RunStatus,
)
from tests.unit.scheduler.factory import (
    T0,
    dead_letter,
    failed,
    manifest,
    newest_first,
    run,
    succeeded,
)

OPTIONS = SchedulerOptions()
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


def plan(m, *runs, now=T0, **history):  # type: ignore[no-untyped-def]
    return cycle.plan(m, History(runs=newest_first(*runs), **history), OPTIONS, now)


# --- "When a retry runs", row by row ---------------------------------------------------------


def test_retry__a_due_interval_run_is_queued_on_the_next_cycle_after_the_delay() -> None:
    m = manifest(schedule=Every.hours(1))
    last_success = succeeded(T0 - 2 * HOUR)
    due_run = failed(T0 - MINUTE - HOUR, occurrence=T0 - HOUR)
    queued = plan(m, last_success, due_run)
    assert isinstance(queued, Queue)
    assert queued.is_retry and queued.delay == timedelta(minutes=5)


def test_retry__a_due_cron_run_is_still_due_after_it_failed() -> None:
    m = manifest(schedule=Cron(expression="0 * * * *"))
    ok = succeeded(T0 - HOUR, occurrence=T0 - HOUR)
    bad = failed(T0, occurrence=T0)
    queued = plan(m, ok, bad, now=T0 + 2 * MINUTE)
    assert isinstance(queued, Queue) and queued.is_retry and queued.occurrence == T0


def test_retry__a_dependents_run_is_retried_while_its_parents_success_is_unconsumed() -> None:
    m = manifest(schedule=After(parent="p"))
    parent = succeeded(T0 - HOUR, manifest_name="p")
    bad = failed(T0 - 30 * MINUTE, parent_run=parent.id)
    queued = plan(m, bad, parent_runs=[parent])
    assert isinstance(queued, Queue) and queued.is_retry and queued.parent_run == parent.id
    assert queued.delay == timedelta(minutes=5)


def test_retry__a_new_parent_success_fires_a_new_run_not_a_retry() -> None:
    m = manifest(schedule=After(parent="p"))
    first = succeeded(T0 - HOUR, manifest_name="p")
    bad = failed(T0 - 50 * MINUTE, parent_run=first.id)
    second = succeeded(T0 - 20 * MINUTE, manifest_name="p")
    queued = plan(m, bad, parent_runs=[second, first])
    assert isinstance(queued, Queue)
    assert not queued.is_retry and queued.delay == timedelta(0) and queued.parent_run == second.id


def test_retry__a_one_off_is_retried_while_it_has_not_succeeded() -> None:
    m = manifest(schedule=OnceAt(at=T0 - HOUR))
    bad = failed(T0 - HOUR, occurrence=T0 - HOUR)
    queued = plan(m, bad)
    assert isinstance(queued, Queue) and queued.is_retry
    assert plan(m, bad, succeeded(T0 - 10 * MINUTE)) == Wait(cycle.WaitReason.NOT_DUE)


def test_retry__an_off_schedule_trigger_that_failed_waits_for_the_schedule() -> None:
    m = manifest(schedule=Every.hours(1))
    ok = succeeded(T0 - 20 * MINUTE, occurrence=T0 - 20 * MINUTE)
    triggered = failed(T0 - 10 * MINUTE, kind=EntryKind.TRIGGER)
    assert plan(m, ok, triggered) == Wait(cycle.WaitReason.NOT_DUE)
    queued = plan(m, ok, triggered, now=T0 + 40 * MINUTE)
    assert isinstance(queued, Queue) and queued.is_retry and queued.delay == timedelta(minutes=5)


# --- what a retry is, and what ends it ------------------------------------------------------


def test_a_cancelled_run_is_not_retried_and_the_next_occurrence_runs_on_time() -> None:
    m = manifest(schedule=Every.hours(1))
    cancelled = run(RunStatus.CANCELLED, T0 - 10 * MINUTE, occurrence=T0 - 10 * MINUTE)
    assert plan(m, cancelled) == Wait(cycle.WaitReason.NOT_DUE)
    queued = plan(m, cancelled, now=T0 + 50 * MINUTE)
    assert queued == Queue(occurrence=T0 + 50 * MINUTE)


def test_a_success_ends_the_backoff_but_its_failures_still_count() -> None:
    m = manifest(schedule=Every.hours(1), max_retries=2)
    ok = succeeded(T0 - HOUR, occurrence=T0 - HOUR)
    runs = [failed(T0 - 3 * HOUR), failed(T0 - 2 * HOUR), ok]
    queued = plan(m, *runs)
    assert queued == Queue(occurrence=T0)
    # One more failure makes three counted: the next cycle dead-letters.
    verdict = plan(m, *runs, failed(T0, occurrence=T0), now=T0 + MINUTE * 2)
    assert isinstance(verdict, DeadLetterIt) and verdict.retry_count == 3


def test_failures_set_aside_by_the_window_are_not_retried_but_leave_the_manifest_due() -> None:
    m = manifest(schedule=Every(interval=timedelta(days=2)))
    old = failed(T0 - 30 * HOUR, occurrence=T0 - 30 * HOUR)
    assert plan(m, old) == Queue(occurrence=T0)  # asked afresh, at once: no retry, no delay


def test_failures_set_aside_by_a_requeue_do_not_move_the_schedule() -> None:
    """A requeued run that fails is retried after its backoff, not an interval later; a
    one-off is retried again after its requeue fails."""
    letter = dead_letter(DeadLetterStatus.RETRIED, resolved_at=T0 - 15 * MINUTE)
    set_aside = [failed(T0 - n * 10 * MINUTE, occurrence=T0 - 60 * MINUTE) for n in range(2, 6)]
    requeued = failed(T0 - 10 * MINUTE, kind=EntryKind.DEAD_LETTER_REQUEUE)
    for schedule in (Every.hours(1), OnceAt(at=T0 - 60 * MINUTE)):
        queued = plan(manifest(schedule=schedule), *set_aside, requeued, dead_letters=[letter])
        assert isinstance(queued, Queue) and queued.is_retry, schedule
        assert queued.delay == timedelta(minutes=5)


def test_dead_letter__max_retries_zero_on_the_first_failure() -> None:
    verdict = plan(manifest(max_retries=0), failed(T0 - MINUTE))
    assert isinstance(verdict, DeadLetterIt) and verdict.retry_count == 1


def test_dead_letter__the_default_on_the_fourth_failure() -> None:
    runs = [failed(T0 - n * 10 * MINUTE) for n in range(1, 4)]
    assert isinstance(plan(manifest(), *runs), Queue)
    assert isinstance(plan(manifest(), *runs, failed(T0 - 5 * MINUTE)), DeadLetterIt)


def test_dead_letter__never_a_manifest_that_has_not_run() -> None:
    assert isinstance(plan(manifest(max_retries=0)), Queue)


def test_a_requeued_manifest_starts_fresh() -> None:
    runs = [failed(T0 - n * 10 * MINUTE) for n in range(2, 6)]
    letter = dead_letter(DeadLetterStatus.RETRIED, resolved_at=T0 - 15 * MINUTE)
    requeued = failed(T0 - 10 * MINUTE, kind=EntryKind.DEAD_LETTER_REQUEUE)
    queued = plan(manifest(schedule=Every.minutes(5)), *runs, requeued, dead_letters=[letter])
    assert isinstance(queued, Queue) and queued.delay == timedelta(minutes=5)  # failure #1


def test_an_acknowledged_dead_letter_lets_the_schedule_carry_on_from_the_acknowledgement() -> None:
    runs = [failed(T0 - n * 10 * MINUTE) for n in range(2, 6)]
    letter = dead_letter(DeadLetterStatus.ACKNOWLEDGED, resolved_at=T0 - 5 * MINUTE)
    m = manifest(schedule=Every.hours(1))
    assert plan(m, *runs, dead_letters=[letter]) == Wait(cycle.WaitReason.NOT_DUE)
    now = T0 + 55 * MINUTE
    assert plan(m, *runs, dead_letters=[letter], now=now) == Queue(occurrence=now)


def test_waits__disabled_dead_lettered_queued_or_running() -> None:
    waiting = dead_letter(DeadLetterStatus.AWAITING_INTERVENTION)
    entry = WorkEntry(scope="s", manifest="m", run_id="r")
    assert plan(manifest(enabled=False)) == Wait(cycle.WaitReason.DISABLED)
    assert plan(manifest(), dead_letters=[waiting]) == Wait(cycle.WaitReason.DEAD_LETTERED)
    assert plan(manifest(), queued=[entry]) == Wait(cycle.WaitReason.QUEUED)
    assert plan(manifest(), run(RunStatus.RUNNING, T0)) == Wait(cycle.WaitReason.RUNNING)
    requeued = run(RunStatus.DISPATCH_REQUEUED, T0)
    assert plan(manifest(), requeued) == Wait(cycle.WaitReason.RUNNING)


def test_a_retry_replays_the_failed_runs_decisions_and_resumes_after_its_checkpoint() -> None:
    bad = failed(T0 - MINUTE)
    layout = (StageShape(stage=0, steps=1), StageShape(stage=10, steps=2))
    point = Checkpoint(run_id=bad.id, scope="s", manifest="m", stage=0, layout=layout)
    history = History(runs=[bad], decisions={bad.id: 2}, checkpoints={bad.id: [point]})
    queued = cycle.plan(manifest(), history, OPTIONS, T0, checkpoint_stages=True)
    assert isinstance(queued, Queue)
    assert queued.replays == bad.id and queued.resume_from == bad.id
    plain = cycle.plan(manifest(), history, OPTIONS, T0)
    assert isinstance(plain, Queue) and plain.resume_from is None


# --- trigger --------------------------------------------------------------------------------


def test_trigger__releases_the_queued_entry_never_a_second_one() -> None:
    entry = WorkEntry(scope="s", manifest="m", run_id="r", replays="x")
    released = cycle.trigger(manifest(), History(queued=[entry]), OPTIONS, T0, ask_afresh=True)
    assert released == Release(entry, clear_link=True)


def test_trigger__a_retry_at_once_replaying_unless_asked_afresh() -> None:
    bad = failed(T0 - MINUTE)
    history = History(runs=[bad], decisions={bad.id: 1})
    queued = cycle.trigger(manifest(), history, OPTIONS, T0)
    assert queued == Queue(is_retry=True, replays=bad.id)
    afresh = cycle.trigger(manifest(), history, OPTIONS, T0, ask_afresh=True)
    assert afresh == Queue(is_retry=True, afresh=AskAfresh.ASKED_AFRESH)
    assert cycle.trigger(manifest(), History(), OPTIONS, T0) == Queue()


# --- the spec's example on an injected clock ------------------------------------------------


def test_spec_example__max_retries_2_delay_2s_runs_three_times_then_dead_letters() -> None:
    """max_retries=2, default_retry_delay 2 s, the default multiplier: a due manifest that
    always fails runs three times, about 2 s and 4 s apart, and is dead-lettered on the next
    cycle, with no fourth run. The cycle runs every second, the dispatcher every half second."""
    options = SchedulerOptions(default_retry_delay=2, manifest_cycle=1, dispatch_interval=0.5)
    m = manifest(schedule=Every.minutes(10), max_retries=2, created=T0)
    runs: list[ManifestRun] = []
    queued: list[tuple[datetime, ManifestRun]] = []  # (due time, run)
    dead_letters: list[tuple[datetime, DeadLetterIt]] = []
    tick = timedelta(milliseconds=500)
    for n in range(60):  # 30 s
        now = T0 + n * tick
        for due, waiting in list(queued):
            if due <= now:  # the dispatcher starts it; the job fails at once
                queued.remove((due, waiting))
                runs.remove(waiting)
                runs.insert(0, waiting.model_copy(update={
                    "status": RunStatus.FAILED, "started_at": now,
                    "ended_at": now + timedelta(milliseconds=100),
                }))  # fmt: skip
        if n % 2 or dead_letters:
            continue
        decided = cycle.plan(m, History(runs=runs), options, now)
        if isinstance(decided, Queue):
            new = run(RunStatus.QUEUED, now, is_retry=decided.is_retry)
            runs.insert(0, new)
            queued.append((now + decided.delay, new))
        elif isinstance(decided, DeadLetterIt):
            dead_letters.append((now, decided))
    starts = sorted(r.counted_from for r in runs)
    assert len(starts) == 3
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    # Each retry waits its delay plus at most one cycle and one dispatch interval.
    assert all(e <= g <= e + 1.5 for g, e in zip(gaps, (2, 4), strict=True)), gaps
    assert len(dead_letters) == 1
    ((when, verdict),) = dead_letters
    assert verdict.retry_count == 3
    assert (when - starts[-1]).total_seconds() <= options.manifest_cycle.total_seconds()
    assert (starts[-1] - starts[0]).total_seconds() < 10


# --- the outlook a page shows -----------------------------------------------------------------


def outlook(m, *runs, now=T0, **history):  # type: ignore[no-untyped-def]
    return cycle.outlook(m, History(runs=newest_first(*runs), **history), OPTIONS, now)


def test_outlook__an_interval_is_next_due_an_interval_after_its_last_success() -> None:
    m = manifest(schedule=Every.hours(1))
    seen = outlook(m, succeeded(T0 - 10 * MINUTE))
    assert seen == cycle.Outlook(counted_failures=0, next_due=T0 + 50 * MINUTE)


def test_outlook__counts_failures_in_the_window_and_a_queued_retry_is_due_when_scheduled() -> None:
    m = manifest(schedule=Every.hours(1))
    runs = [failed(T0 - 3 * HOUR), failed(T0 - 2 * HOUR), failed(T0 - 48 * HOUR)]
    retry = WorkEntry(scope="s", manifest="m", run_id="r", scheduled_at=T0 + 10 * MINUTE)
    seen = outlook(m, *runs, queued=[retry])
    assert seen == cycle.Outlook(2, T0 + 10 * MINUTE, cycle.WaitReason.QUEUED)
    at_once = WorkEntry(scope="s", manifest="m", run_id="r")
    assert outlook(m, *runs, queued=[at_once]).next_due == T0


def test_outlook__running_dead_lettered_disabled_and_done_have_no_due_time() -> None:
    awaiting = dead_letter(DeadLetterStatus.AWAITING_INTERVENTION)
    running = run(RunStatus.RUNNING, T0 - MINUTE)
    once = manifest(schedule=OnceAt(at=T0 - HOUR))
    assert outlook(manifest(), running).waiting is cycle.WaitReason.RUNNING
    assert outlook(manifest(), dead_letters=[awaiting]).waiting is cycle.WaitReason.DEAD_LETTERED
    assert outlook(manifest(enabled=False)).waiting is cycle.WaitReason.DISABLED
    assert outlook(once, succeeded(T0 - HOUR)) == cycle.Outlook(0, None, cycle.WaitReason.NOT_DUE)
    assert outlook(once) == cycle.Outlook(0, T0 - HOUR)
