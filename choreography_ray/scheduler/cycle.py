"""One manifest's turn in the manifest manager's cycle: what is due, as a returned value.

`plan` reads a manifest's history (its runs newest first, dead letters, queued entries, its
parent's runs, how many decisions each run recorded, their checkpoints) and returns `Wait`,
`Queue` or `DeadLetterIt`; the actor shell carries it out against storage. `trigger` is the same
for an operator's off-schedule run. Nothing here does I/O or reads a clock: `now` is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from choreography_ray.scheduler import checkpoints, failures, replay
from choreography_ray.scheduler.due import Settled, next_due
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Manifest,
    ManifestRun,
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus


@dataclass(frozen=True)
class History:
    """What storage holds about one manifest, as `plan` reads it."""

    #: The manifest's runs, newest first: those inside its failure window and its latest
    #: finished ones at least.
    runs: Sequence[ManifestRun] = ()
    dead_letters: Sequence[DeadLetter] = ()
    #: The manifest's queued work entries.
    queued: Sequence[WorkEntry] = ()
    #: For a dependent: its parent's runs, newest first.
    parent_runs: Sequence[ManifestRun] = ()
    #: Decisions recorded per run id.
    decisions: Mapping[str, int] = field(default_factory=dict)
    #: Checkpoints per run id.
    checkpoints: Mapping[str, Sequence[Checkpoint]] = field(default_factory=dict)


class WaitReason(enum.StrEnum):
    #: The manifest is disabled.
    DISABLED = "Disabled"
    #: It is dead-lettered and awaits an operator.
    DEAD_LETTERED = "DeadLettered"
    #: An entry of it is queued already.
    QUEUED = "Queued"
    #: A run of it has not finished.
    RUNNING = "Running"
    #: Its schedule is not due (or never will be again).
    NOT_DUE = "NotDue"


@dataclass(frozen=True, slots=True)
class Wait:
    reason: WaitReason


@dataclass(frozen=True, slots=True)
class Queue:
    """Queue a run: at once, or (a retry) after `delay` on the database's clock."""

    delay: timedelta = timedelta(0)
    occurrence: datetime | None = None
    parent_run: str | None = None
    is_retry: bool = False
    replays: str | None = None
    afresh: replay.AskAfresh | None = None
    resume_from: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterIt:
    reason: str
    retry_count: int
    run_id: str | None


@dataclass(frozen=True, slots=True)
class Release:
    """A trigger releases the queued entry (dispatched at once), clearing its link if asked."""

    entry: WorkEntry
    clear_link: bool


@dataclass(frozen=True, slots=True)
class InFlight:
    """A trigger finds a run of the manifest in flight (claimed, running, waiting for another
    dispatch attempt, or queued by an operator's requeue): it answers with that run and
    queues nothing."""

    run: ManifestRun


Plan = Wait | Queue | DeadLetterIt


@dataclass(frozen=True, slots=True)
class Outlook:
    """A manifest as an operator sees it: its counted failures and when it runs next."""

    counted_failures: int
    #: When it is due next: the queued run's `scheduled_at` (now, for one queued to run at
    #: once), else its schedule's next due time, which may be past (due at the next cycle).
    #: None while it waits for something else, or when it never runs again.
    next_due: datetime | None
    #: What it waits for instead of a due time (QUEUED has one: the queued run's).
    waiting: WaitReason | None = None


def plan(
    manifest: Manifest,
    history: History,
    options: SchedulerOptions,
    now: datetime,
    *,
    checkpoint_stages: bool = False,
) -> Plan:
    if not manifest.enabled:
        return Wait(WaitReason.DISABLED)
    if failures.awaiting_intervention(history.dead_letters) is not None:
        return Wait(WaitReason.DEAD_LETTERED)
    if _holding_entry(history.queued) is not None:
        return Wait(WaitReason.QUEUED)
    if in_flight(own_runs(history.runs)) is not None:
        return Wait(WaitReason.RUNNING)
    counted = failures.counted_failures(history.runs, manifest, history.dead_letters, options, now)
    if failures.exceeds_retries(counted, manifest):
        reason = failures.dead_letter_reason(counted, manifest)
        return DeadLetterIt(reason, len(counted), counted[0].id)
    parent_success = latest_success(own_runs(history.parent_runs))
    settled = _settled(history)
    due = next_due(manifest, settled, now, parent_success)
    if due is None or due.at > now:
        return Wait(WaitReason.NOT_DUE)
    failed = _retry_of(manifest, history.runs, counted, parent_success)
    if failed is None:
        return Queue(occurrence=due.occurrence, parent_run=due.parent_run)
    return _retry(manifest, history, failed, len(counted), options, checkpoint_stages,
                  parent_success, due.occurrence, due.parent_run)  # fmt: skip


def outlook(
    manifest: Manifest, history: History, options: SchedulerOptions, now: datetime
) -> Outlook:
    """What `plan` would see, for a page: nothing here is queued or changed."""
    counted = failures.counted_failures(history.runs, manifest, history.dead_letters, options, now)
    n = len(counted)
    if not manifest.enabled:
        return Outlook(n, None, WaitReason.DISABLED)
    if failures.awaiting_intervention(history.dead_letters) is not None:
        return Outlook(n, None, WaitReason.DEAD_LETTERED)
    if (entry := _holding_entry(history.queued)) is not None:
        return Outlook(n, entry.scheduled_at or now, WaitReason.QUEUED)
    if in_flight(own_runs(history.runs)) is not None:
        return Outlook(n, None, WaitReason.RUNNING)
    settled = _settled(history)
    due = next_due(manifest, settled, now, latest_success(own_runs(history.parent_runs)))
    return Outlook(n, None, WaitReason.NOT_DUE) if due is None else Outlook(n, due.at)


def trigger(
    manifest: Manifest,
    history: History,
    options: SchedulerOptions,
    now: datetime,
    *,
    ask_afresh: bool = False,
    checkpoint_stages: bool = False,
) -> Queue | Release | InFlight:
    """An off-schedule run: never a second queued entry (a queued one is released at once,
    its link cleared when asked afresh) nor a second run in flight (it answers with that run);
    else a run at once, replaying the latest failed run's decisions when it is a retry of it
    and not asked afresh."""
    if (entry := _holding_entry(history.queued)) is not None:
        return Release(entry, clear_link=ask_afresh)
    if (flying := in_flight(history.runs)) is not None:
        return InFlight(flying)
    counted = failures.counted_failures(history.runs, manifest, history.dead_letters, options, now)
    parent_success = latest_success(own_runs(history.parent_runs))
    failed = _retry_of(manifest, history.runs, counted, parent_success)
    if failed is None:
        return Queue()
    queued = _retry(manifest, history, failed, len(counted), options, checkpoint_stages,
                    parent_success, None, None)  # fmt: skip
    if ask_afresh:
        return Queue(is_retry=True, afresh=replay.AskAfresh.ASKED_AFRESH,
                     resume_from=queued.resume_from)  # fmt: skip
    return Queue(is_retry=True, replays=queued.replays, afresh=queued.afresh,
                 resume_from=queued.resume_from)  # fmt: skip


def own_runs(runs: Sequence[ManifestRun]) -> list[ManifestRun]:
    """The runs that belong to their manifest's schedule: not those an operator queued for an
    execution (`requeue_execution`, `resume_execution`), which neither block, settle nor
    retry the schedule, nor fire its dependents (issue 36, item 8)."""
    return [r for r in runs if r.kind.belongs_to_manifest]


def latest_success(runs: Sequence[ManifestRun]) -> ManifestRun | None:
    done = [r for r in runs if r.status is RunStatus.SUCCEEDED and r.ended_at is not None]
    return max(done, key=lambda r: r.ended_at or r.queued_at, default=None)


def latest_finished(runs: Sequence[ManifestRun]) -> ManifestRun | None:
    done = [r for r in runs if r.status.is_finished]
    return max(done, key=lambda r: r.ended_at or r.counted_from, default=None)


def in_flight(runs: Sequence[ManifestRun]) -> ManifestRun | None:
    """The newest run of the manifest that has not finished, of any kind."""
    return next((r for r in runs if not r.status.is_finished), None)


def _holding_entry(queued: Sequence[WorkEntry]) -> WorkEntry | None:
    return next((e for e in queued if e.status is WorkStatus.QUEUED and e.holds_manifest_key), None)


def _settled(history: History) -> list[Settled]:
    """Successes and cancellations settle the schedule; so does an acknowledged dead letter,
    from when it was acknowledged. A failed run never does, counted or set aside (the spec's
    "a failed run does not move the point a schedule counts from")."""
    points = [
        Settled(r.counted_from, r.occurrence, r.parent_run)
        for r in own_runs(history.runs)
        if r.status in (RunStatus.SUCCEEDED, RunStatus.CANCELLED)
    ]
    points += [
        Settled(d.resolved_at)
        for d in history.dead_letters
        if d.status is DeadLetterStatus.ACKNOWLEDGED and d.resolved_at is not None
    ]
    return points


def _retry_of(
    manifest: Manifest,
    runs: Sequence[ManifestRun],
    counted: Sequence[ManifestRun],
    parent_success: ManifestRun | None,
) -> ManifestRun | None:
    """The failed run the next run retries: the latest finished one, failed and still counted;
    for a dependent, not when its parent has succeeded again since (a new firing)."""
    latest = latest_finished(own_runs(runs))
    if latest is None or latest.id not in {r.id for r in counted}:
        return None
    if manifest.parent is not None and replay.parent_succeeded_since(latest, parent_success):
        return None
    return latest


def _retry(
    manifest: Manifest,
    history: History,
    failed: ManifestRun,
    failure_count: int,
    options: SchedulerOptions,
    checkpoint_stages: bool,
    parent_success: ManifestRun | None,
    occurrence: datetime | None,
    parent_run: str | None,
) -> Queue:
    link = replay.retry_link(
        manifest,
        failed,
        runs=history.runs,
        queued=history.queued,
        recorded_decisions=history.decisions.get(failed.id, 0),
        parent_success=parent_success,
    )
    resume_from = None
    if checkpoint_stages and replay.same_input(manifest, failed):
        runs = {r.id: r for r in history.runs}
        if checkpoints.resume_point(failed, runs, history.checkpoints) is not None:
            resume_from = failed.id
    return Queue(
        delay=failures.retry_delay(failure_count, options),
        occurrence=occurrence,
        parent_run=parent_run or failed.parent_run,
        is_retry=True,
        replays=link.replays,
        afresh=link.afresh,
        resume_from=resume_from,
    )
