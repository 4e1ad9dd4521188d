"""The manifest manager's cycle, carried out against storage and the jobs port.

Per manifest of the scope: read its history (`gather`), settle its runs whose jobs ended
(RUNNING → SUCCEEDED, FAILED or CANCELLED, `port.run_status_of`), then apply `cycle.plan`:
queue a work entry (a retry after its delay, on the database's clock) or dead-letter it. A run
claimed by an earlier activation that died before its job was started (its entry DISPATCHED, the
run still QUEUED) is handed back to the dispatcher as a dispatch that never reached the jobs
manager. A run past its timeout has its job stopped (it settles CANCELLED once the stop is
final). What a failure between two writes left heals here: a waiting run whose entry was
cancelled or never written is CANCELLED, a queued entry whose run was never written is
cancelled, and a dead letter whose requeue queued its run is resolved. Every
`run_cleanup_interval` a cycle also cleans metadata up (`cleanup.py`). A manifest whose turn
fails is logged by name and holds up no other; a lock that lapses stops the cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from choreography_ray.logs import get_logger
from choreography_ray.scheduler import checkpoints, cleanup, cycle, failures
from choreography_ray.scheduler.cycle import DeadLetterIt, History, Queue
from choreography_ray.scheduler.lock import lapsed
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.port import JobsPort, JobView, run_status_of
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Manifest,
    ManifestRun,
    WorkEntry,
    new_id,
)
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus, WorkStatus
from choreography_ray.storage.scheduler import Enqueued, SchedulerStorage

log = get_logger(__name__)

T = TypeVar("T")

#: The newest runs of a manifest (and of its parent) read per cycle; its unfinished runs and
#: the failures inside its failure window are read besides, however many (`runs_in_play`).
HISTORY_RUNS = 100

#: Hands a claimed run back to the dispatcher as a failed dispatch (entry, run, why).
Unclaim = Callable[[WorkEntry, ManifestRun, str], Coroutine[Any, Any, None]]


async def chain_checkpoints(
    storage: SchedulerStorage, failed: ManifestRun, runs: Mapping[str, ManifestRun]
) -> dict[str, list[Checkpoint]]:
    """The checkpoints of `failed` and of the runs it resumed from, by run id."""
    return {
        run_id: await storage.list_checkpoints(run_id)
        for run_id in checkpoints.resume_chain(failed, runs)
    }


async def gather(
    storage: SchedulerStorage,
    manifest: Manifest,
    options: SchedulerOptions,
    now: datetime,
    *,
    checkpoint_stages: bool = False,
) -> History:
    """What `cycle.plan` and `cycle.trigger` read about `manifest`: its newest runs, and every
    run of it that has not finished or failed inside its failure window; the checkpoints of
    its latest failed run's chain when its job type opts in."""
    scope, name = manifest.scope, manifest.name
    since = now - failures.failure_window(manifest, options)
    newest = await storage.list_runs(scope, name, HISTORY_RUNS)
    in_play = await storage.runs_in_play(scope, name, since)
    merged = {r.id: r for r in [*newest, *in_play]}
    runs = sorted(merged.values(), key=lambda r: r.queued_at, reverse=True)
    parent_runs: list[ManifestRun] = []
    if manifest.parent is not None:
        parent_runs = await storage.list_runs(scope, manifest.parent, HISTORY_RUNS)
    latest = cycle.latest_finished(cycle.own_runs(runs))
    decisions = {}
    found: dict[str, list[Checkpoint]] = {}
    if latest is not None and latest.status is RunStatus.FAILED:
        # A lookup that fails asks afresh, or reruns from the top: it holds up no retry.
        decisions[latest.id] = await _looked_up(
            storage.count_decisions(latest.id), 0, f"the decisions of run {latest.id}"
        )
        if checkpoint_stages:
            chain = chain_checkpoints(storage, latest, {r.id: r for r in runs})
            found = await _looked_up(chain, {}, f"the checkpoints of run {latest.id}")
    return History(
        runs=runs,
        dead_letters=await storage.list_dead_letters(scope, name),
        queued=await storage.queued_entries(scope, name),
        parent_runs=parent_runs,
        decisions=decisions,
        checkpoints=found,
    )


async def _looked_up(lookup: Awaitable[T], otherwise: T, what: str) -> T:
    """`lookup`'s answer; `otherwise` (logged) when it fails."""
    try:
        return await lookup
    except Exception as error:
        log.warning("reading %s failed (%s): its retry goes without them", what, error)
        return otherwise


def cancelled(run: ManifestRun, now: datetime, why: str) -> ManifestRun:
    """`run`, which never started, cancelled now."""
    return run.model_copy(update={"status": RunStatus.CANCELLED, "ended_at": now, "error": why})


def new_run(
    manifest: Manifest,
    kind: EntryKind,
    now: datetime,
    *,
    source: ManifestRun | None = None,
    requeues: str | None = None,
    run_id: str | None = None,
    **links: Any,
) -> tuple[WorkEntry, ManifestRun]:
    """A run of `manifest` (or again of `source`'s job type and request) and its work entry;
    `requeues`: the run an operator's requeue queues again (`source`'s id when given);
    `run_id`: the run's id (a dead letter's requeue: the dead letter's), else a new one.
    `links`: `occurrence`, `parent_run`, `is_retry`, `replays`, `resume_from`."""
    resume_from = links.pop("resume_from", None)
    of = source or manifest
    run_id, entry_id = run_id or new_id(), new_id()
    run = ManifestRun(
        id=run_id, scope=manifest.scope, manifest=manifest.name, job_type=of.job_type,
        request=of.request, namespace=of.namespace, entry_id=entry_id, kind=kind, queued_at=now,
        resumed_from=resume_from, **links,
    )  # fmt: skip
    entry = WorkEntry(
        id=entry_id, scope=manifest.scope, manifest=manifest.name, kind=kind, run_id=run_id,
        holds_manifest_key=kind.holds_manifest_key, replays=run.replays, resume_from=resume_from,
        requeues=requeues or (source.id if source is not None else None),
    )  # fmt: skip
    return entry, run


class ManifestManager:
    def __init__(
        self,
        scope: str,
        storage: SchedulerStorage,
        jobs: JobsPort,
        options: SchedulerOptions,
        unclaim: Unclaim,
    ) -> None:
        self.scope = scope
        self.storage = storage
        self.jobs = jobs
        self.options = options
        self.unclaim = unclaim
        self.cycles = 0
        #: When (the database's clock) the next metadata cleanup is due (None: this cycle).
        self._next_cleanup: datetime | None = None

    async def cycle(self) -> None:
        manifests = await self.storage.list_manifests(self.scope)
        for manifest in manifests:
            try:
                await self.manifest_turn(manifest)
            except Exception as error:
                if lapsed(error):
                    log.warning("scheduler/%s: the lock lapsed: the cycle stops", self.scope)
                    raise
                log.exception("scheduler/%s: the cycle of manifest %r failed", self.scope,
                              manifest.name)  # fmt: skip
        now = await self.storage.now()
        if self._next_cleanup is None or now >= self._next_cleanup:
            await cleanup.clean_up(self.storage, self.scope, manifests, self.options)
            self._next_cleanup = now + self.options.run_cleanup_interval
        self.cycles += 1

    async def manifest_turn(self, manifest: Manifest) -> None:
        opts_in = self.jobs.checkpoint_stages(manifest.job_type)
        now = await self.storage.now()
        history = await gather(self.storage, manifest, self.options, now,
                               checkpoint_stages=opts_in)  # fmt: skip
        limit = manifest.timeout or self.options.default_run_timeout
        if await self._settle(history, limit):
            now = await self.storage.now()
            history = await gather(self.storage, manifest, self.options, now,
                                   checkpoint_stages=opts_in)  # fmt: skip
        decided = cycle.plan(manifest, history, self.options, now, checkpoint_stages=opts_in)
        if isinstance(decided, Queue):
            await self.queue(manifest, decided, EntryKind.SCHEDULED, now)
        elif isinstance(decided, DeadLetterIt):
            letter = DeadLetter(scope=self.scope, manifest=manifest.name, reason=decided.reason,
                                retry_count_at_dead_letter=decided.retry_count,
                                run_id=decided.run_id, dead_lettered_at=now)  # fmt: skip
            if not await self.storage.add_dead_letter(letter):
                return  # another scheduler's cycle dead-lettered it first
            log.warning("scheduler/%s: manifest %r dead-lettered: %s", self.scope,
                        manifest.name, decided.reason)  # fmt: skip

    async def queue(
        self, manifest: Manifest, decided: Queue, kind: EntryKind, now: datetime
    ) -> Enqueued:
        entry, run = new_run(
            manifest, kind, now, occurrence=decided.occurrence, parent_run=decided.parent_run,
            is_retry=decided.is_retry, replays=decided.replays, resume_from=decided.resume_from,
        )  # fmt: skip
        done = await self.storage.enqueue(entry, run, decided.delay)
        if done.replay_dropped:
            log.info("scheduler/%s: %s's retry asks afresh: another entry replays %s",
                     self.scope, manifest.name, decided.replays)  # fmt: skip
        return done

    async def _save_checkpoint(self, run: ManifestRun, view: JobView, now: datetime) -> None:
        """A failed or cancelled run of a job type that opts in: its latest checkpoint, stored
        before the run is settled (so the cycle that sees it ended sees its checkpoint)."""
        stage = checkpoints.latest_checkpoint(view.stages)
        if stage is None or not self.jobs.checkpoint_stages(run.job_type):
            return
        await self.storage.save_checkpoint(Checkpoint(
            run_id=run.id, scope=run.scope, manifest=run.manifest, stage=stage,
            layout=checkpoints.layout_of(view.stages), completed_at=now,
        ))  # fmt: skip

    async def _settle(self, history: History, limit: timedelta | None = None) -> bool:
        """Settles the runs whose jobs ended, stops those running past `limit` (settled
        CANCELLED once their stop is final), hands back runs an earlier activation claimed
        but never started, and heals what a failure between two writes left (a waiting run
        whose entry was cancelled or never written; a queued entry whose run was never
        written); whether anything changed."""
        runs = history.runs
        changed = await self._cancel_orphans(history) | await self._resolve_requeued(history)
        running = [r for r in runs if r.status is RunStatus.RUNNING and r.job_id is not None]
        if running:
            views = await self.jobs.job_views([r.job_id for r in running if r.job_id])
            now = await self.storage.now()
            for run in running:
                assert run.job_id is not None
                view = views.get(run.job_id)
                status = run_status_of(view)
                if status is None:
                    changed |= await self._time_out(run, limit, now)
                    continue
                update: dict[str, Any] = {"status": status, "ended_at": now, "error": None}
                if view is None:
                    update["error"] = f"its job {run.job_id} was removed"
                else:
                    if status in (RunStatus.FAILED, RunStatus.CANCELLED):
                        # A cancelled run (a timeout, a stop) resumes too (`resume_execution`).
                        await self._save_checkpoint(run, view, now)
                    if view.resumed_after is None:  # its job ran from the top
                        update["resumed_from"] = None
                await self.storage.save_run(run.model_copy(update=update))
                changed = True
                if view is not None:
                    await self._release(run)
        for run in runs:
            waiting = run.status in (RunStatus.QUEUED, RunStatus.DISPATCH_REQUEUED)
            if not waiting or run.entry_id is None:
                continue
            entry = await self.storage.get_entry(run.entry_id)
            if entry is None or entry.status is WorkStatus.CANCELLED:
                # Its entry was cancelled (a disabled manifest) and a failure stopped the write
                # of the run, or (an earlier release's MongoDB enqueue) its entry was never
                # written: it is settled here, or it would block its manifest.
                now = await self.storage.now()
                why = "its work entry was " + ("cancelled" if entry else "never written")
                await self.storage.save_run(cancelled(run, now, why))
                changed = True
            elif entry is not None and entry.status is WorkStatus.DISPATCHED:
                # Claimed by an earlier activation that stopped before it saved the run
                # started: the run is its job's when the job exists, else dispatched again.
                await self.unclaim(entry, run, "claimed by a scheduler that stopped before "
                                   "its job was started")  # fmt: skip
                changed = True
        return changed

    async def _time_out(self, run: ManifestRun, limit: timedelta | None, now: datetime) -> bool:
        """Stops the job of a run past its timeout `limit`, once; whether the run was marked.
        A stop that fails is logged and asked again on the next cycle."""
        started = run.started_at
        if limit is None or started is None or run.timed_out_at or now - started < limit:
            return False
        assert run.job_id is not None
        try:
            await self.jobs.stop_job(run.scope, run.namespace, run.job_id)
        except Exception as error:
            log.warning("scheduler/%s: stopping job %s of run %s past its timeout (%s) failed: "
                        "%s", self.scope, run.job_id, run.id, limit, error)  # fmt: skip
            return False
        log.info("scheduler/%s: run %s ran past its timeout (%s): its job %s is stopped",
                 self.scope, run.id, limit, run.job_id)  # fmt: skip
        await self.storage.save_run(run.model_copy(update={"timed_out_at": now}))
        return True

    async def _resolve_requeued(self, history: History) -> bool:
        """Resolves RETRIED a dead letter whose requeue queued its run (the run has the dead
        letter's id) but failed to resolve it."""
        letter = failures.awaiting_intervention(history.dead_letters)
        if letter is None or await self.storage.get_run(letter.id) is None:
            return False
        log.info("scheduler/%s: dead letter %s of %r was requeued as run %s: resolved",
                 self.scope, letter.id, letter.manifest, letter.id)  # fmt: skip
        await self.storage.resolve_dead_letter(letter.id, DeadLetterStatus.RETRIED)
        return True

    async def _cancel_orphans(self, history: History) -> bool:
        """Cancels the queued entries whose run was never written (MongoDB writes an entry
        before its run): each holds its manifest's key for nothing."""
        known = {r.id for r in history.runs}
        orphans = [e for e in history.queued if e.run_id not in known
                   and await self.storage.get_run(e.run_id) is None]  # fmt: skip
        for entry in orphans:
            log.warning("scheduler/%s: entry %s of %r names no stored run %s: cancelled",
                        self.scope, entry.id, entry.manifest, entry.run_id)  # fmt: skip
            await self.storage.cancel_entry(entry.id)
        return bool(orphans)

    async def _release(self, run: ManifestRun) -> None:
        """A settled run's job is no longer held (see `port`); a failed release leaves the
        job's records to the jobs manager's retention."""
        assert run.job_id is not None
        try:
            await self.jobs.release_job(run.scope, run.namespace, run.job_type, run.job_id)
        except Exception as error:
            log.warning("scheduler/%s: releasing job %s of run %s failed (%s); its records stay "
                        "until terminal_job_retention", self.scope, run.job_id, run.id,
                        error)  # fmt: skip
