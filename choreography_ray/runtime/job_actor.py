"""The job actor `job/{job_id}`: a job's lifecycle, its window of running steps, and counting.

Its storage record is the truth and its counters are a cache. It accepts an outcome once per
(step, attempt): an outcome counts only while its step is active at that attempt here, and once
the job records counted steps (after a resume or reopen), never twice across activations.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import ray

from choreography_ray.errors import (
    CannotResumeJobError,
    ChoreographyError,
    JobOperationError,
    RemoveJobError,
    ResumeJobError,
    RetryFailedStepsError,
    StartJobError,
    StopJobError,
)
from choreography_ray.job import Job, StepSpec
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions, window_size
from choreography_ray.runtime import leases
from choreography_ray.runtime.hosts import HostPool
from choreography_ray.runtime.messages import Outcome, StepStart
from choreography_ray.runtime.retries import FAILED_STATUSES, RetrySchedule, decide
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.runtime.stages import UNFINISHED, Stages
from choreography_ray.runtime.watchdog import HookBackoff, run_watchdog
from choreography_ray.status import JobStageFailureBehavior, JobStatus, StepStatus
from choreography_ray.step import JobStep
from choreography_ray.storage import CountedKind, PlannedStep, StepUpdate
from choreography_ray.types import import_type

log = logging.getLogger(__name__)

#: Counted-step records past which the job warns (and keeps recording), as the spec does.
COUNTED_WARNING_THRESHOLD = 100_000
#: Steps read from storage per page.
PAGE = 5_000
#: Seconds before start operations that threw are tried again (the watchdog also retries them).
START_RETRY_DELAY = 1.0
#: Removal finish retries: first delay and longest delay, in seconds.
REMOVE_RETRY_FIRST, REMOVE_RETRY_LONGEST = 1.0, 60.0


class JobCore:
    """One job's activation. Everything but the Ray actor shell, below."""

    def __init__(self, job_id: str, storage_url: str, options: JobsOptions, namespace: str) -> None:
        self.job_id = job_id
        self.options = options
        self.storage = open_shared_storage(storage_url, namespace)
        self.hosts = HostPool(storage_url, options, namespace)
        self.state: JobState | None = None
        self.job: Job[Any] | None = None
        self.stages = Stages([])
        self.plan: dict[int, list[StepStart]] = {}  # the first run's steps, by stage
        self.pending: deque[StepStart] = deque()
        self.active: dict[str, tuple[StepStart, str]] = {}  # step id -> (start, host name)
        self.start_failed: list[StepStart] = []
        self.retries = RetrySchedule()
        self.counted: set[str] = set()
        self.stopped_counted: set[str] = set()
        self._new_counted: list[str] = []
        self._new_stopped: list[str] = []
        self.halted = True  # no steps are started while halted (stopped, removing, terminal)
        self.awaiting_admission: int | None = None
        self.hook_owed = False
        self.hook_backoff = HookBackoff()
        self.ticks = 0
        self._starts_in_flight = 0
        self._dirty = False
        self._wake = asyncio.Event()
        self._watched: dict[str, asyncio.Future[Any]] = {}
        self._dedicated: dict[str, Any] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._finishing_stop = False
        self._in_first_wave = False
        self._save_lock = asyncio.Lock()
        self._loaded = asyncio.get_running_loop().create_future()
        self.exit_requested = False
        self.on_exit: Callable[[], None] = lambda: None

    def _request_exit(self) -> None:
        self.exit_requested = True
        self.on_exit()

    # -- activation ---------------------------------------------------------------------------

    async def activate(self, reconstructed: bool) -> None:
        try:
            await self._load()
        except Exception as error:
            self._loaded.set_exception(error)
            return
        self._loaded.set_result(None)
        self._spawn(self._pump())
        self._spawn(self._save_loop())
        interval = self.options.watchdog_seconds
        if interval is not None:
            self._spawn(run_watchdog(interval, self.watchdog_tick))
        if reconstructed and self.state is not None:
            # A restarted actor carries on from storage: that is reactivation.
            await self.recover()

    async def ready(self) -> JobState:
        await asyncio.shield(self._loaded)
        if self.state is None:
            raise JobOperationError(ResumeJobError.UNKNOWN, f"job {self.job_id} does not exist")
        return self.state

    async def _load(self) -> None:
        self.state = await self.storage.get_job(self.job_id)
        if self.state is None:
            return
        self.stages = Stages.from_progress(self.state.progress)
        try:
            job_type = import_type(self.state.type, self.options.allowed_type_prefixes)
            job = job_type()
            if not isinstance(job, Job):
                raise TypeError(f"{self.state.type} is not a choreography_ray.Job")
        except Exception as error:
            message = f"cannot load job type {self.state.type!r}: {error}"
            log.error("job %s: %s", self.job_id, message)
            if not self.state.status.is_terminal:
                await self._set_status(JobStatus.FAILED, message, error=message)
            raise ChoreographyError(message) from error
        job.job_id, job.scope, job.namespace, job.options = (
            self.job_id,
            self.state.scope,
            self.state.namespace,
            self.options,
        )
        self.job = job
        if self.state.records_counted_steps:
            self.counted = set(await self.storage.list_counted(self.job_id, CountedKind.COMPLETED))
        self.stopped_counted = set(
            await self.storage.list_counted(self.job_id, CountedKind.STOPPED)
        )

    async def recover(self) -> None:
        """What rehydration does to this job: resume it, or finish its stop; never both."""
        state = await self.ready()
        if state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
            if not state.stop_finalized or state.status is JobStatus.REMOVING:
                await self._tell_stop_again()
        elif state.status is JobStatus.RUNNING or state.status.is_preparing:
            await self.resume(explicit=False)

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> StartJobError | None:
        state = await self.ready()
        assert self.job is not None
        if state.status is not JobStatus.PREPARING_JOB or state.has_plan:
            return StartJobError.JOB_ALREADY_EXISTS
        try:
            request = self.job.request_type().model_validate(state.request)
            specs = self.job.prepare_steps(request)
            if inspect.isawaitable(specs):
                specs = await specs
            specs = list(specs)
            if not all(isinstance(s, StepSpec) for s in specs):
                raise TypeError("prepare_steps must return steps made by create_step")
        except Exception as error:
            await self._fail(error)
            return StartJobError.COULD_NOT_PREPARE_STEPS
        try:
            await self._persist_plan(specs)
        except Exception as error:
            log.exception("job %s: could not persist its plan", self.job_id)
            await self._fail(error)
            return StartJobError.COULD_NOT_PERSIST
        await self._set_status(JobStatus.STARTING_STEPS)
        self.halted = False
        first_error = await self._begin_stage(self.stages.first(), first_run=True)
        if self.state is not None and self.state.status is JobStatus.STARTING_STEPS:
            await self._set_status(JobStatus.RUNNING)
        self._kick()
        return first_error

    async def _persist_plan(self, specs: list[StepSpec]) -> None:
        width = max(6, len(str(len(specs))))
        records: list[PlannedStep] = []
        totals: dict[int, int] = {}
        for index, spec in enumerate(specs):
            step_id = f"{index:0{width}d}"
            request = spec.request.model_dump(mode="json")
            records.append(PlannedStep(step_id, spec.step_type, spec.stage, request))
            self.plan.setdefault(spec.stage, []).append(
                StepStart(step_id, spec.step_type, spec.stage, 1, request)
            )
            totals[spec.stage] = totals.get(spec.stage, 0) + 1
        for offset in range(0, len(records), 50_000):
            await self.storage.insert_plan(self.job_id, records[offset : offset + 50_000])
        self.stages = Stages.from_totals(totals)
        assert self.state is not None
        self.state = self.state.model_copy(
            update={
                "has_plan": True,
                "progress": self.stages.progress(),
                "stage": self.stages.first(),
            }
        )
        await self._set_status(JobStatus.PREPARING_STEPS)

    # -- stages -------------------------------------------------------------------------------

    async def _begin_stage(self, stage: int, first_run: bool = False) -> StartJobError | None:
        """Asks admission, then starts the stage's steps. Returns the start error of the
        stage's first wave of start operations, if any."""
        assert self.job is not None and self.state is not None
        if not self.stages.counters:
            await self._complete()
            return None
        if not await self.job.admit_stage(stage):
            self.awaiting_admission = stage
            return None
        self.awaiting_admission = None
        counter = self.stages[stage]
        counter.is_started = True
        self.state = self.state.model_copy(update={"stage": stage})
        self._dirty = True
        starts = self.plan.pop(stage, None) if first_run or self.plan else None
        if starts is None:
            starts = await self._adopt_running(await self._stored_unfinished(stage))
        self.pending.extend(starts)
        if not starts and counter.is_completed:
            await self._on_stage_done(stage)
            return None
        return await self._first_wave() if first_run else None

    async def _first_wave(self) -> StartJobError | None:
        """Starts the first wave and waits for it: `start` returns once the stage runs."""
        tasks = self._fill()
        if not tasks:
            return None
        # The rest of the stage starts once this wave has: `start` waits for this wave only.
        self._in_first_wave = True
        try:
            results = await asyncio.gather(*tasks)
        finally:
            self._in_first_wave = False
        if all(results):
            return None
        return (
            StartJobError.FAILED_STARTING_ALL_JOB_STEPS
            if not any(results)
            else StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        )

    async def _stored_unfinished(self, stage: int) -> list[StepStart]:
        """The stage's unfinished steps from storage, the ones that were running first."""
        running: list[StepStart] = []
        others: list[StepStart] = []
        after: str | None = None
        while True:
            page = await self.storage.list_steps(
                self.job_id, statuses=UNFINISHED, stage=stage, after=after, limit=PAGE
            )
            for s in page:
                start = StepStart(s.step_id, s.type, s.stage, max(1, s.attempt), s.request)
                (running if s.status is StepStatus.RUNNING else others).append(start)
            if len(page) < PAGE:
                return running + others
            after = page[-1].step_id

    async def _on_stage_done(self, stage: int) -> None:
        assert self.job is not None
        counter = self.stages[stage]
        later = self.stages.after(stage)
        if (
            counter.has_failures
            and later
            and (self.job.get_failure_behavior_for(stage) is JobStageFailureBehavior.STOP_JOB)
        ):
            await self._mark_unreachable(later)
        elif later:
            await self._begin_stage(later[0])
            self._kick()
            return
        await self._complete()

    async def _mark_unreachable(self, stages: list[int]) -> None:
        change_status = StepStatus.UNREACHABLE
        for stage in stages:
            after: str | None = None
            while True:
                page = await self.storage.list_steps(
                    self.job_id, stage=stage, after=after, limit=PAGE
                )
                await self.storage.update_steps(
                    [
                        StepUpdate(self.job_id, s.step_id, change_status, s.attempt)
                        for s in page
                        if s.status is not change_status
                    ]
                )
                if len(page) < PAGE:
                    break
                after = page[-1].step_id
            counter = self.stages[stage]
            counter.unreachable = counter.total - counter.successful - counter.failed

    async def _complete(self) -> None:
        assert self.job is not None and self.state is not None
        if self.state.status.is_terminal:
            return
        self.halted = True
        progress = self.stages.progress()
        status = (
            JobStatus.COMPLETED_WITH_FAILURES
            if progress.has_failures
            else JobStatus.COMPLETED_SUCCESSFULLY
        )
        try:
            await self.job.on_completed()
        except Exception as error:
            await self._fail(error)
            return
        await self._set_status(status)
        self._request_exit()

    async def _fail(self, error: BaseException) -> None:
        """A job hook threw: the job is FAILED with the message, and its actor exits."""
        self.halted = True
        await self._set_status(JobStatus.FAILED, _describe(error), error=_describe(error))
        self._request_exit()

    # -- the window ---------------------------------------------------------------------------

    @property
    def window(self) -> float:
        assert self.job is not None
        configured = self.job.max_active_steps
        if configured is None:
            configured = self.options.max_active_steps_per_job
        size = window_size(configured)
        return math.inf if size is None else size

    def _kick(self) -> None:
        self._wake.set()

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.halted and not self.hook_owed and not self._in_first_wave:
                self._fill()
                await self._check_stage()

    def _fill(self) -> list[asyncio.Future[bool]]:
        """Starts pending steps while the window and the start throttle allow."""
        started: list[asyncio.Future[bool]] = []
        room = self.window - len(self.active)
        while (
            self.pending
            and room > 0
            and not self.halted
            and self._starts_in_flight < self.options.effective_max_concurrent_step_starts
        ):
            batch: list[StepStart] = []
            size = int(min(self.options.step_batch_size, room))
            while self.pending and len(batch) < size:
                batch.append(self.pending.popleft())
            room -= len(batch)
            started.extend(self._start(batch))
        return started

    def _start(self, batch: list[StepStart]) -> list[asyncio.Future[bool]]:
        shared: list[StepStart] = []
        tasks: list[asyncio.Future[bool]] = []
        for start in batch:
            if self._is_dedicated(start.type):
                assert self.job is not None
                step_type = import_type(start.type, self.options.allowed_type_prefixes)
                name, handle = self.hosts.dedicated(
                    self.job_id, start.step_id, getattr(step_type, "actor_options", {})
                )
                self._dedicated[start.step_id] = handle
                tasks.append(self._spawn(self._start_on(name, handle, [start])))
            else:
                shared.append(start)
        if shared:
            name, handle = self.hosts.next()
            tasks.append(self._spawn(self._start_on(name, handle, shared)))
        return tasks

    async def _start_on(self, name: str, handle: Any, batch: list[StepStart]) -> bool:
        self._starts_in_flight += 1
        for start in batch:
            self.active[start.step_id] = (start, name)
        try:
            await handle.start_steps.remote(self.job_id, self.hosts.context, batch)
        except Exception as error:
            log.warning(
                "job %s: starting %d steps on %s failed: %s", self.job_id, len(batch), name, error
            )
            for start in batch:
                if self.active.get(start.step_id, (None,))[0] == start:
                    del self.active[start.step_id]
                    self.start_failed.append(start)
            asyncio.get_running_loop().call_later(START_RETRY_DELAY, self._retry_failed_starts)
            return False
        else:
            self._watch(name, handle)
            if (
                self.halted
                and self.state is not None
                and self.state.status in (JobStatus.STOPPED, JobStatus.REMOVING)
            ):
                # The stop reached this host before these steps did: tell them again.
                await handle.cancel_steps.remote(
                    self.job_id, self.state.status is JobStatus.REMOVING
                )
            return True
        finally:
            self._starts_in_flight -= 1
            self._kick()

    def _retry_failed_starts(self) -> None:
        if self.start_failed and not self.halted:
            self.pending.extendleft(reversed(self.start_failed))
            self.start_failed.clear()
            self._kick()

    def _is_dedicated(self, type_path: str) -> bool:
        step_type = import_type(type_path, self.options.allowed_type_prefixes)
        return (
            isinstance(step_type, type) and issubclass(step_type, JobStep) and step_type.dedicated
        )

    def _watch(self, name: str, handle: Any) -> None:
        """Learns from Ray's error on a never-returning call that a host died."""
        if name in self._watched:
            return
        self._watched[name] = self._spawn(self._watch_host(name, handle))

    async def _watch_host(self, name: str, handle: Any) -> None:
        try:
            await handle.watch.remote()
        except Exception:
            pass
        finally:
            self._watched.pop(name, None)
        if self.options.lease_seconds is None:
            lost = [start for start, host in self.active.values() if host == name]
            if lost:
                log.warning(
                    "job %s: host %s died with %d steps; starting them again",
                    self.job_id,
                    name,
                    len(lost),
                )
                self._requeue(lost)
        self.hosts.refresh()

    def _requeue(self, starts: Iterable[StepStart]) -> None:
        starts = list(starts)
        for start in starts:
            self.active.pop(start.step_id, None)
        self.pending.extendleft(reversed(starts))
        self._kick()

    # -- outcomes -----------------------------------------------------------------------------

    async def report_outcomes(self, outcomes: list[Outcome]) -> None:
        await self.ready()
        for outcome in outcomes:
            self.accept(outcome)
        if self.halted and not self.active:
            await self._finish_stop_when_reported()
        self._kick()

    def accept(self, outcome: Outcome) -> bool:
        """Counts an outcome once per (step, attempt); False when it was not counted."""
        entry = self.active.get(outcome.step_id)
        if entry is None or entry[0].attempt != outcome.attempt:
            return False
        start, _host = self.active.pop(outcome.step_id)
        if start.step_id in self._dedicated:
            self._dedicated.pop(start.step_id)
            self.hosts.kill_dedicated(self.job_id, start.step_id)
        counter = self.stages[start.stage]
        step_id = start.step_id
        self._dirty = True
        if outcome.status is StepStatus.STOPPED:
            if step_id not in self.stopped_counted:
                counter.stopped += 1
                self.stopped_counted.add(step_id)
                self._new_stopped.append(step_id)
            return True
        if step_id in self.counted:
            return False
        if outcome.status in FAILED_STATUSES:
            assert self.job is not None
            decision = decide(self.job, self.options, outcome)
            if decision.retry and not self.halted:
                self.retries.schedule(start, decision.delay)
                return True
            counter.failed += 1
        else:
            counter.successful += 1
        if step_id in self.stopped_counted:
            # The stop of an earlier execution is taken back; the outcome counts instead.
            counter.stopped -= 1
            self.stopped_counted.discard(step_id)
            self._spawn(self.storage.remove_counted(self.job_id, CountedKind.STOPPED, step_id))
        self._record_counted(step_id)
        return True

    def _record_counted(self, step_id: str) -> None:
        assert self.state is not None
        if not self.state.records_counted_steps:
            return
        self.counted.add(step_id)
        self._new_counted.append(step_id)
        if len(self.counted) == COUNTED_WARNING_THRESHOLD:
            log.warning(
                "job %s has %d counted-step records; recording goes on",
                self.job_id,
                COUNTED_WARNING_THRESHOLD,
            )

    async def _check_stage(self) -> None:
        assert self.state is not None
        if self.state.status is not JobStatus.RUNNING:
            return
        due = self.retries.take_due()
        if due:
            self.pending.extendleft(reversed(due))
            self._fill()
        elif self.retries.pending:
            delay = self.retries.next_due_in() or 0.0
            asyncio.get_running_loop().call_later(delay, self._kick)
        stage = self.state.stage
        if (
            self.awaiting_admission is None
            and not self.pending
            and not self.active
            and not self.retries.pending
            and not self.start_failed
            and stage in self.stages.counters
            and self.stages[stage].is_completed
        ):
            await self._on_stage_done(stage)

    # -- stop, resume, remove -----------------------------------------------------------------

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
        self.halted = True
        await self._adopt_running(await self._stored_unfinished(self.state.stage))
        await self._tell_running(removing)
        await self._finish_stop_when_reported()

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

    async def _finish_stop_when_reported(self) -> None:
        state = self.state
        if state is None or self.active or self._finishing_stop:
            return
        if not (
            state.status is JobStatus.REMOVING
            or (state.status is JobStatus.STOPPED and not state.stop_finalized)
        ):
            return
        self._finishing_stop = True
        try:
            await self._finish_stop()
        finally:
            self._finishing_stop = False
        self._in_first_wave = False

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

    async def retry_failed_steps(self) -> int:
        state = await self.ready()
        assert self.job is not None
        if not self.job.can_retry_failed_steps or self.stages.has_stages:
            raise JobOperationError(RetryFailedStepsError.NOT_SUPPORTED)
        if state.status is not JobStatus.COMPLETED_WITH_FAILURES:
            raise JobOperationError(RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES)
        failed: list[StepStart] = []
        after: str | None = None
        while True:
            page = await self.storage.list_steps(
                self.job_id, statuses=FAILED_STATUSES, after=after, limit=PAGE
            )
            failed += [
                StepStart(s.step_id, s.type, s.stage, s.attempt + 1, s.request) for s in page
            ]
            if len(page) < PAGE:
                break
            after = page[-1].step_id
        try:
            for start in failed:
                # Retrying a counted failure removes its entry along with its failed count.
                self.stages[start.stage].failed -= 1
                self.counted.discard(start.step_id)
                await self.storage.remove_counted(self.job_id, CountedKind.COMPLETED, start.step_id)
            self.state = state.model_copy(update={"records_counted_steps": True})
            await self._set_status(JobStatus.RUNNING)
        except Exception as error:
            raise JobOperationError(RetryFailedStepsError.COULD_NOT_PERSIST, str(error)) from error
        self.exit_requested = False
        self.halted = False
        self.pending.extend(failed)
        self._kick()
        return len(failed)

    # -- the watchdog -------------------------------------------------------------------------

    async def watchdog_tick(self) -> None:
        self.ticks += 1
        state = self.state
        if state is None or state.status is not JobStatus.RUNNING:
            return
        if self.hook_owed:
            if not self.hook_backoff.should_try():
                return
            await self._run_resume_hook()
            if self.hook_owed:
                return
        if self.halted:
            return
        counts = await self.storage.count_by_status(self.job_id)
        await self._settle_lost_reports(counts)
        self._retry_failed_starts()
        if self.options.lease_seconds is not None:
            self._requeue(
                await leases.expired(
                    self.storage, self.job, self.job_id, state.stage, self.active, self.options
                )
            )
        if self.awaiting_admission is not None:
            await self._begin_stage(self.awaiting_admission)
        self.hosts.refresh()
        self._kick()

    async def _settle_lost_reports(self, counts: dict[tuple[int, StepStatus], int]) -> None:
        """Active steps whose outcome storage holds but whose report never arrived."""
        assert self.state is not None
        stage = self.state.stage
        stored_running = counts.get((stage, StepStatus.RUNNING), 0)
        candidates = {sid: entry for sid, entry in self.active.items() if entry[1]}
        if (
            stored_running
            >= len(candidates) - self._starts_in_flight * self.options.step_batch_size
        ):
            return
        running: set[str] = set()
        after: str | None = None
        while True:
            page = await self.storage.list_steps(
                self.job_id, statuses=UNFINISHED, stage=stage, after=after, limit=PAGE
            )
            running.update(s.step_id for s in page)
            if len(page) < PAGE:
                break
            after = page[-1].step_id
        for step_id, (start, _host) in candidates.items():
            if step_id in running or step_id not in self.active:
                continue
            stored = await self.storage.get_step(self.job_id, step_id)
            if stored is None:
                self.accept(Outcome(step_id, start.attempt, StepStatus.COMPLETED_SUCCESSFULLY))
            elif stored.status in FAILED_STATUSES and stored.attempt == start.attempt:
                messages = (
                    stored.status_changes[-1].exception_messages if stored.status_changes else ()
                )
                self.accept(
                    Outcome(
                        step_id, start.attempt, stored.status, messages[0] if messages else None
                    )
                )

    # -- persistence --------------------------------------------------------------------------

    async def _set_status(
        self,
        status: JobStatus,
        *messages: str,
        error: str | None = None,
        stop_finalized: bool | None = None,
    ) -> None:
        update: dict[str, Any] = {}
        if error is not None:
            update["error"] = error
        if stop_finalized is not None:
            update["stop_finalized"] = stop_finalized
        await self._save((status, messages), **update)

    async def _save(
        self, change: tuple[JobStatus, tuple[str, ...]] | None = None, **update: Any
    ) -> None:
        """Saves the record with the current progress, counted records first. One save at a
        time: each carries the version the previous one returned."""
        async with self._save_lock:
            assert self.state is not None
            state = self.state if change is None else self.state.with_status(change[0], *change[1])
            self._dirty = False
            await self._flush_counted()
            self.state = await self.storage.save_job(
                state.model_copy(update={"progress": self.stages.progress(), **update})
            )

    async def _flush_counted(self) -> None:
        new_counted, self._new_counted = self._new_counted, []
        new_stopped, self._new_stopped = self._new_stopped, []
        try:
            if new_counted:
                await self.storage.add_counted(self.job_id, CountedKind.COMPLETED, new_counted)
            if new_stopped:
                await self.storage.add_counted(self.job_id, CountedKind.STOPPED, new_stopped)
        except Exception:
            self._new_counted[:0] = new_counted
            self._new_stopped[:0] = new_stopped
            raise

    async def _flush_progress(self) -> None:
        if self._dirty or self._new_counted or self._new_stopped:
            await self._save()

    async def _save_loop(self) -> None:
        every = self.options.progress_save_interval.total_seconds()
        while True:
            await asyncio.sleep(every)
            if self.state is None or self.state.status.is_terminal:
                continue
            try:
                await self._flush_progress()
            except Exception:
                log.exception("job %s: saving progress failed; retrying", self.job_id)
                with contextlib.suppress(Exception):
                    reloaded = await self.storage.get_job(self.job_id)
                    if reloaded is not None and self.state is not None:
                        self.state = self.state.model_copy(update={"version": reloaded.version})

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task: asyncio.Future[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@ray.remote
class JobActor:
    """`job/{job_id}`: a thin shell over `JobCore`. Exits once its job is terminal or removed;
    its record stays (but for a removal)."""

    def __init__(self, job_id: str, storage_url: str, options_json: str, namespace: str) -> None:
        options = JobsOptions.model_validate_json(options_json)
        self.core = JobCore(job_id, storage_url, options, namespace)
        self.core.on_exit = self._exit_soon
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self._activation = asyncio.ensure_future(self.core.activate(reconstructed))

    def _exit_soon(self) -> None:
        # A moment's grace lets the call that finished the job answer first.
        asyncio.get_running_loop().call_later(1.0, self._exit)

    def _exit(self) -> None:
        if self.core.exit_requested:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def start(self) -> StartJobError | None:
        return await self.core.start()

    async def report_outcomes(self, outcomes: list[Outcome]) -> None:
        await self.core.report_outcomes(outcomes)

    async def stop(self) -> None:
        await self.core.stop()

    async def resume(self) -> None:
        await self.core.resume(explicit=True)

    async def recover(self) -> None:
        await self.core.recover()

    async def remove(self) -> None:
        await self.core.remove()

    async def retry_failed_steps(self) -> int:
        return await self.core.retry_failed_steps()

    async def state(self) -> JobState:
        return await self.core.ready()

    async def watchdog_ticks(self) -> int:
        return self.core.ticks

    async def tick(self) -> None:
        """Runs one watchdog tick now (tests, and the recovery reconciliation)."""
        await self.core.watchdog_tick()

    async def active_steps(self) -> int:
        return len(self.core.active)
