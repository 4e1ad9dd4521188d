"""The dispatcher: claims due work entries atomically and starts their runs as jobs.

An entry's replay link is checked again as it is claimed (`replay.dispatch_link`): one naming a
run another run already replays, or whose manifest has since opted out, is dispatched without it
and asks afresh; one naming a run whose decisions are gone keeps it, marked `replay_abandoned`,
and asks afresh. A dispatch that never reached the jobs manager is requeued with the dispatch
backoff (`dispatching.after_dispatch_failure`) and its run is DISPATCH_REQUEUED; once it has
used up `max_dispatch_attempts` its run is one failed run. A job the manager refused (an unknown
type, a request that does not validate) is a failed run at once. A run's job id is chosen and
stored on the run before its job starts, so the job's steps find their run. An entry that
resumes a failed run starts its job after that run's latest checkpoint
(`checkpoints.resume_point`); without one it runs from the top, its `resumed_from` cleared.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from choreography_ray.logs import get_logger
from choreography_ray.model import ResumeAfter
from choreography_ray.scheduler import checkpoints, dispatching, replay
from choreography_ray.scheduler.lock import lapsed
from choreography_ray.scheduler.manifest_manager import HISTORY_RUNS, cancelled, chain_checkpoints
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.port import DispatchError, JobsPort
from choreography_ray.scheduler.records import Manifest, ManifestRun, WorkEntry
from choreography_ray.scheduler.status import RunStatus
from choreography_ray.storage.scheduler import SchedulerStorage

log = get_logger(__name__)

#: Entries claimed per dispatch.
CLAIM_BATCH = 100


class Dispatcher:
    def __init__(
        self, scope: str, storage: SchedulerStorage, jobs: JobsPort, options: SchedulerOptions
    ) -> None:
        self.scope = scope
        self.storage = storage
        self.jobs = jobs
        self.options = options
        #: Runs started, and dispatches requeued, by this dispatcher (tests and stats read them).
        self.started = 0
        self.requeued = 0

    async def dispatch_due(self) -> int:
        """Claims the due entries and starts their runs; how many were claimed."""
        claimed = await self.storage.claim_due(self.scope, CLAIM_BATCH)
        # Namespaces whose jobs manager did not answer a start in time: their other entries
        # are requeued at once rather than hold the scope's turn up again.
        stuck: set[str] = set()
        for entry in claimed:
            try:
                await self.dispatch(entry, stuck)
            except Exception as error:
                if lapsed(error):  # its claimed entries are handed back by the next holder
                    log.warning("scheduler/%s: the lock lapsed: the dispatch stops", self.scope)
                    raise
                log.exception("scheduler/%s: dispatching entry %s of %r failed", self.scope,
                              entry.id, entry.manifest)  # fmt: skip
        return len(claimed)

    async def dispatch(self, entry: WorkEntry, stuck: set[str] | None = None) -> None:
        stuck = set() if stuck is None else stuck
        run = await self.storage.get_run(entry.run_id)
        if run is None:
            log.error("scheduler/%s: entry %s names no stored run %s; dropped", self.scope,
                      entry.id, entry.run_id)  # fmt: skip
            return
        waiting = run.status in (RunStatus.QUEUED, RunStatus.DISPATCH_REQUEUED)
        if not waiting or run.entry_id not in (None, entry.id):
            # A second entry of one run (a half-written requeue, written again): the run is
            # the other entry's, or has started; this one is taken off, never started.
            log.warning("scheduler/%s: entry %s names run %s, which is %s and the run of entry "
                        "%s: cancelled", self.scope, entry.id, run.id, run.status.value,
                        run.entry_id)  # fmt: skip
            await self.storage.cancel_entry(entry.id, claimed=True)
            return
        if run.namespace in stuck:
            # No start is tried: the entry waits for the next dispatch with its attempt back.
            log.info("scheduler/%s: run %s waits for the next dispatch: the jobs manager of "
                     "namespace %r did not answer in time", self.scope, run.id,
                     run.namespace)  # fmt: skip
            await self.storage.requeue_dispatch(entry.id, timedelta(0), count_attempt=False)
            return
        manifest = await self.storage.get_manifest(self.scope, entry.manifest)
        if manifest is not None and not manifest.enabled and entry.kind.holds_manifest_key:
            # Disabled after it was queued (the disable's cancel of it may have failed).
            now = await self.storage.now()
            await self.storage.cancel_entry(
                entry.id, cancelled(run, now, "its manifest was disabled"), claimed=True
            )
            return
        replays, abandoned = await self._link(entry, run, manifest)
        if abandoned:
            log.warning("scheduler/%s: run %s asks afresh: run %s, whose decisions it was to "
                        "replay, has none", self.scope, run.id, replays)  # fmt: skip
        # The job's id is chosen here and stored on the run before the job starts, with the
        # link it keeps: a step that asks `decide` finds its run (`run_for_job`) from its
        # first moment. The run stays QUEUED until the start returns.
        resume = None if entry.resume_from is None else await self._resume_after(entry)
        links = {"replays": replays, "replay_abandoned": abandoned,
                 "resumed_from": None if resume is None else entry.resume_from}  # fmt: skip
        # A dispatch requeued after no answer keeps the id it chose: a late start of it is
        # found, and a second start of it is refused (the job exists), never a second job.
        run = run.model_copy(update={"job_id": run.job_id or uuid.uuid4().hex, **links})
        await self.storage.save_run(run)
        assert run.job_id is not None
        timeout = self.options.dispatch_timeout
        try:
            job_id = await asyncio.wait_for(self.jobs.start_job(
                self.scope, run.namespace, run.job_type, run.request, run.job_id, resume,
            ), timeout.total_seconds())  # fmt: skip
        except DispatchError as error:
            await self.failed(entry, run, str(error), reached=error.reached)
            return
        except TimeoutError:
            stuck.add(run.namespace)
            why = f"the jobs manager did not answer within {timeout}"
            await self.failed(entry, run, why, reached=False)
            return
        except Exception as error:  # whatever else: the jobs manager was not reached
            await self.failed(entry, run, f"{type(error).__name__}: {error}", reached=False)
            return
        await self._started(entry, run, job_id)

    async def _link(
        self, entry: WorkEntry, run: ManifestRun, manifest: Manifest | None
    ) -> tuple[str | None, bool]:
        """The replay link the run keeps, and whether it is abandoned (a link to a run whose
        decisions are gone: the run asks afresh and uses up no replay). A lookup that fails is
        logged and the run asks afresh: it holds up no retry (the spec)."""
        replays = entry.replays
        if replays is None:
            return None, False
        try:
            others = await self.storage.runs_replaying(replays)
            link = replay.dispatch_link(entry, manifest, others)
            if link.replays is None:
                log.info("scheduler/%s: run %s asks afresh (%s): it was queued to replay %s",
                         self.scope, run.id, link.afresh, replays)  # fmt: skip
                return None, False
            return replays, await self.storage.count_decisions(replays) == 0
        except Exception as error:
            log.warning("scheduler/%s: looking up the replay of run %s by run %s failed (%s): "
                        "it asks afresh", self.scope, replays, run.id, error)  # fmt: skip
            return None, False

    async def _started(self, entry: WorkEntry, run: ManifestRun, job_id: str) -> None:
        now = await self.storage.now()
        await self.storage.save_run(run.model_copy(update={
            "status": RunStatus.RUNNING, "job_id": job_id, "started_at": now,
            "dispatched_at": entry.dispatched_at, "dispatch_attempts": entry.dispatch_attempts,
            "error": None,
        }))  # fmt: skip
        self.started += 1

    async def _job_exists(self, job_id: str) -> bool:
        """Whether the job a dispatch chose was started after all; a lookup that fails says
        no (the dispatch is requeued, as before the lookup)."""
        try:
            return bool(await self.jobs.job_views([job_id]))
        except Exception as error:
            log.warning("scheduler/%s: looking job %s up failed (%s)", self.scope, job_id, error)
            return False

    async def _resume_after(self, entry: WorkEntry) -> ResumeAfter | None:
        """The checkpoint the entry's run starts after: the latest of the run it resumes (and
        of the runs that one resumed from); None when there is none or it cannot be read (the
        run starts from the top)."""
        assert entry.resume_from is not None
        try:
            failed = await self.storage.get_run(entry.resume_from)
            history = await self.storage.list_runs(self.scope, entry.manifest, HISTORY_RUNS)
            runs = {r.id: r for r in history}
            point = None
            if failed is not None:
                found = await chain_checkpoints(self.storage, failed, runs)
                point = checkpoints.resume_point(failed, runs, found)
        except Exception as error:
            log.warning("scheduler/%s: run %s's checkpoint could not be read (%s); its retry "
                        "runs from the top", self.scope, entry.resume_from, error)  # fmt: skip
            return None
        if point is None:
            log.info("scheduler/%s: run %s stored no checkpoint; its retry runs from the top",
                     self.scope, entry.resume_from)  # fmt: skip
            return None
        return ResumeAfter(stage=point.stage, layout=point.layout, source=point.run_id)

    async def failed(
        self, entry: WorkEntry, run: ManifestRun, why: str, *, reached: bool = False
    ) -> None:
        """A dispatch of `entry` failed: requeued with the dispatch backoff, or (refused by the
        jobs manager, or out of attempts) its run failed. One that did not reach the manager,
        or whose answer was lost, may have started its job all the same: when the job id it
        chose (`run.job_id`) exists, the run is that job's (never a second job)."""
        if not reached and run.job_id is not None and await self._job_exists(run.job_id):
            log.info("scheduler/%s: run %s's job %s was started, though its start did not "
                     "answer (%s): the run is that job's", self.scope, run.id, run.job_id,
                     why)  # fmt: skip
            await self._started(entry, run, run.job_id)
            return
        retry = dispatching.after_dispatch_failure(entry.dispatch_attempts, self.options)
        # No job of its own: the id chosen for the start that failed is cleared, except on a
        # dispatch requeued, which starts that id again.
        attempts = {"dispatch_attempts": entry.dispatch_attempts, "error": why, "job_id": None}
        if not reached and not retry.gives_up:
            assert retry.delay is not None
            if await self.storage.requeue_dispatch(entry.id, retry.delay) is not None:
                update = {**attempts, "status": RunStatus.DISPATCH_REQUEUED, "job_id": run.job_id}
                await self.storage.save_run(run.model_copy(update=update))
                self.requeued += 1
                log.warning("scheduler/%s: dispatch %d of run %s failed (%s); again in %s",
                            self.scope, entry.dispatch_attempts, run.id, why,
                            retry.delay)  # fmt: skip
                return
        if not reached:
            why = f"dispatch failed {entry.dispatch_attempts} time(s), the last: {why}"
        now = await self.storage.now()
        update = {**attempts, "status": RunStatus.FAILED, "ended_at": now, "error": why}
        await self.storage.save_run(run.model_copy(update=update))
        log.warning("scheduler/%s: run %s of %r failed: %s", self.scope, run.id,
                    entry.manifest, why)  # fmt: skip
