"""Resume, rehydration's decision, and RetryFailedSteps.

A resume recounts progress from storage, runs `on_before_resuming_job_steps` and rebuilds the
window at the stage the job had reached, steps that were running first; a step still running on
a live host is adopted rather than started twice.
"""

from __future__ import annotations

import asyncio
import json

from choreography_ray.errors import (
    CannotResumeJobError,
    JobOperationError,
    ResumeJobError,
    RetryFailedStepsError,
)
from choreography_ray.runtime.job_base import JobBase, log
from choreography_ray.runtime.messages import StepStart
from choreography_ray.runtime.retries import FAILED_STATUSES
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind, step_pages


class Resuming(JobBase):
    """The resume part of a job activation (see `JobCore`)."""

    async def recover(self) -> None:
        """What rehydration does to this job: resume it, or finish its stop; never both."""
        state = await self.ready()
        if state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
            if not state.stop_finalized or state.status is JobStatus.REMOVING:
                await self._tell_stop_again()
        elif state.status is JobStatus.RUNNING or state.status.is_preparing:
            await self.resume(explicit=False)

    async def _adopt_running(self, starts: list[StepStart]) -> list[StepStart]:
        """Steps still running on a live host become active here again instead of being
        started twice; returns the others."""
        self.hosts.refresh()
        names = list(self.hosts.hosts)
        answers = await asyncio.gather(
            *(self.hosts.hosts[n].running_steps.remote(self.job_id) for n in names),
            return_exceptions=True,
        )
        host_of = {
            step_id: name
            for name, answer in zip(names, answers, strict=True)
            if isinstance(answer, list)
            for step_id in answer
        }
        rest: list[StepStart] = []
        for start in starts:
            host = host_of.get(start.step_id)
            if host is None:
                rest.append(start)
            else:
                self.active[start.step_id] = (start, host)
                self._watch(host, self.hosts.hosts[host])
        return rest

    async def resume(self, explicit: bool = True) -> None:
        state = await self.ready()
        assert self.job is not None
        if state.status in (JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES):
            return  # resuming a completed job does nothing
        if state.status is JobStatus.REMOVING:
            raise JobOperationError(ResumeJobError.JOB_IS_BEING_REMOVED)
        if state.status is JobStatus.STOPPED and not explicit:
            return  # a stopped job is never resumed automatically
        if not state.has_plan:
            message = "the job was interrupted before its step plan was stored"
            await self._set_status(
                JobStatus.FAILED, message, error=str(CannotResumeJobError.MISSING_STEP_PLAN)
            )
            raise JobOperationError(CannotResumeJobError.MISSING_STEP_PLAN, message)
        if not self.halted:
            return  # running already in this activation
        if state.status is JobStatus.FAILED and not explicit:
            return
        counts = await self.storage.count_by_status(self.job_id)
        self.stages.recount(counts)
        # Stops of an earlier execution stay counted until their step reports again.
        stopped_total = len(self.stopped_counted)
        for counter in self.stages.counters.values():
            counter.stopped = 0
        if stopped_total and state.stage in self.stages.counters:
            self.stages[state.stage].stopped = stopped_total
        self.state = state.model_copy(
            update={"records_counted_steps": True, "stop_finalized": False}
        )
        self.pending.clear()
        self.active.clear()
        # Steps still running on a live host are this activation's again before the hook runs:
        # their reports count, and a stop while the hook is owed reaches them.
        await self._adopt_running(await self._stored_unfinished(state.stage))
        await self._set_status(JobStatus.RUNNING)
        self.halted = False
        await self._run_resume_hook()

    async def _run_resume_hook(self) -> None:
        assert self.job is not None and self.state is not None
        try:
            await self.job.on_before_resuming_job_steps()
        except Exception as error:
            log.warning("job %s: on_before_resuming_job_steps failed: %s", self.job_id, error)
            self.hook_owed = True
            self.hook_backoff.failed()
            return
        self.hook_owed = False
        self.hook_backoff.succeeded()
        stage = self.state.stage
        if stage not in self.stages.counters:
            stage = self.stages.first()
        self.stages[stage].is_started = False
        await self._begin_stage(stage)
        self._kick()

    async def retry_failed_steps(self) -> int:
        state = await self.ready()
        assert self.job is not None
        if not self.job.can_retry_failed_steps or self.stages.has_stages:
            raise JobOperationError(RetryFailedStepsError.NOT_SUPPORTED)
        if state.status is not JobStatus.COMPLETED_WITH_FAILURES:
            raise JobOperationError(RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES)
        failed = [
            StepStart(s.step_id, s.type, s.stage, s.attempt + 1, json.dumps(s.request))
            async for page in step_pages(self.storage, self.job_id, statuses=FAILED_STATUSES)
            for s in page
        ]
        # Retrying a counted failure removes its entry along with its failed count: the counts
        # change with the RUNNING save, and go back when it fails.
        for start in failed:
            self.stages[start.stage].failed -= 1
        try:
            self.state = state.model_copy(update={"records_counted_steps": True})
            await self._set_status(JobStatus.RUNNING)
        except Exception as error:
            for start in failed:
                self.stages[start.stage].failed += 1
            self.state = state
            raise JobOperationError(RetryFailedStepsError.COULD_NOT_PERSIST, str(error)) from error
        for start in failed:
            self.counted.discard(start.step_id)
            await self.storage.remove_counted(self.job_id, CountedKind.COMPLETED, start.step_id)
        self.exit_requested = False
        self.halted = False
        self.pending.extend(failed)
        self._kick()
        return len(failed)
