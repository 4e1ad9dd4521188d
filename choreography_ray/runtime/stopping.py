"""Stop and remove: persist the stop first, tell running steps, finish once all reported.

A stop counts never-started steps as stopped and pending retries as failed, runs `on_stopped`
once every step has reported, and records `stop_finalized`. A removal then clears the job; a
finish that fails is retried on a timer, 1 s doubling to 60 s.
"""

from __future__ import annotations

import asyncio

from choreography_ray.errors import (
    JobOperationError,
    RemoveJobError,
    StopJobError,
)
from choreography_ray.runtime.job_base import JobBase, log
from choreography_ray.status import JobStatus

#: Removal finish retries: first delay and longest delay, in seconds.
REMOVE_RETRY_FIRST, REMOVE_RETRY_LONGEST = 1.0, 60.0


class Stopping(JobBase):
    """The stop and removal part of a job activation (see `JobCore`)."""

    async def stop(self) -> None:
        state = await self.ready()
        if state.status.is_terminal or state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
            raise JobOperationError(
                StopJobError.JOB_IS_NOT_RUNNING, f"job {self.job_id} is {state.status}"
            )
        try:
            await self._set_status(JobStatus.STOPPED, stop_finalized=False)
        except Exception as error:
            raise JobOperationError(StopJobError.COULD_NOT_PERSIST_STOP, str(error)) from error
        await self._halt_and_tell(removing=False)

    async def _halt_and_tell(self, removing: bool) -> None:
        """Counts never-started steps as stopped and pending attempts as failed, then tells
        every running step to stop."""
        self.halted = True
        self.awaiting_admission = None
        for start in self.retries.drain():
            self.stages[start.stage].failed += 1
            self._record_counted(start.step_id)
        never_started = list(self.pending) + self.start_failed
        self.pending.clear()
        self.start_failed.clear()
        for start in never_started:
            if start.step_id not in self.stopped_counted:
                self.stages[start.stage].stopped += 1
                self.stopped_counted.add(start.step_id)
                self._new_stopped.append(start.step_id)
        self._dirty = True
        await self._tell_running(removing)
        await self._finish_stop_when_reported()

    async def _tell_running(self, removing: bool) -> None:
        handles = {name: self.hosts.hosts.get(name) for _, name in self.active.values()}
        handles.update(self._dedicated)
        await asyncio.gather(
            *(h.cancel_steps.remote(self.job_id, removing) for h in handles.values() if h),
            return_exceptions=True,
        )

    async def _tell_stop_again(self) -> None:
        """Finishes a stop left by an earlier activation: steps that never recorded their stop
        are told again; steps of stages never started are left alone."""
        assert self.state is not None
        removing = self.state.status is JobStatus.REMOVING
        stage = self.state.stage
        self.halted = True
        # Progress from storage; a step of the stage with no outcome that runs nowhere has
        # stopped, and one still running counts when it reports.
        not_running = await self._adopt_running(await self._stored_unfinished(stage))
        self.stages.recount(await self.storage.count_by_status(self.job_id))
        if stage in self.stages.counters:
            self.stages[stage].stopped = len(not_running)
        new = [s.step_id for s in not_running if s.step_id not in self.stopped_counted]
        self.stopped_counted.update(new)
        self._new_stopped.extend(new)
        self._dirty = True
        await self._tell_running(removing)
        await self._finish_stop_when_reported()

    async def _finish_stop_when_reported(self) -> bool:
        """Finishes the stop once every step has reported; False when finishing failed."""
        state = self.state
        if state is None or self.active or self._finishing_stop:
            return True
        if not (
            state.status is JobStatus.REMOVING
            or (state.status is JobStatus.STOPPED and not state.stop_finalized)
        ):
            return True
        self._finishing_stop = True
        try:
            return await self._finish_stop()
        finally:
            self._finishing_stop = False

    async def _finish_stop(self, retry_delay: float = REMOVE_RETRY_FIRST) -> bool:
        """`on_stopped` once every step has reported; a removal then clears the job. A failed
        removal finish is retried on a timer, 1 s doubling to 60 s."""
        assert self.state is not None and self.job is not None
        removing = self.state.status is JobStatus.REMOVING
        try:
            await self._flush_progress()
            await self.job.on_stopped()
            if removing:
                await self.storage.remove_job_steps(self.job_id)
                await self.storage.remove_job_counted(self.job_id)
                await self.storage.remove_job(self.job_id)
                self._request_exit()
            else:
                await self._save(stop_finalized=True)
            return True
        except Exception as error:
            log.warning(
                "job %s: finishing the %s failed: %s",
                self.job_id,
                "removal" if removing else "stop",
                error,
            )
            if removing:
                later = min(retry_delay * 2, REMOVE_RETRY_LONGEST)
                asyncio.get_running_loop().call_later(
                    retry_delay, lambda: self._spawn(self._finish_stop(later))
                )
            return False

    async def remove(self) -> None:
        state = await self.ready()
        if state.status is JobStatus.REMOVING:
            if self.active:
                raise JobOperationError(RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED)
            finished = await self._finish_stop()
            raise JobOperationError(
                RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED if finished else RemoveJobError.UNKNOWN
            )
        try:
            await self._set_status(JobStatus.REMOVING, stop_finalized=False)
        except Exception as error:
            raise JobOperationError(RemoveJobError.UNKNOWN, str(error)) from error
        await self._halt_and_tell(removing=True)
