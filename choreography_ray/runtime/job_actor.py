"""The job actor `job/{job_id}`: a job's lifecycle, its window of running steps, and counting.

Its storage record is the truth and its counters are a cache. It accepts an outcome once per
(step, attempt): an outcome counts only while its step is active at that attempt here, and once
the job records counted steps (after a resume or reopen), never twice across activations.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import warnings

import ray

from choreography_ray.errors import (
    ChoreographyError,
    StartJobError,
)
from choreography_ray.job import Job, StepSpec
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.job_base import describe
from choreography_ray.runtime.messages import (
    Outcome,
    OutcomeWire,
    StepStart,
    outcomes_from_wire,
)
from choreography_ray.runtime.resuming import Resuming
from choreography_ray.runtime.retries import FAILED_STATUSES, decide
from choreography_ray.runtime.stages import UNFINISHED, Stages
from choreography_ray.runtime.stopping import Stopping
from choreography_ray.runtime.watchdog import HookBackoff, WatchdogTick, run_watchdog
from choreography_ray.runtime.window import Window
from choreography_ray.status import JobStageFailureBehavior, JobStatus, StepStatus
from choreography_ray.storage import CountedKind, PlannedStep, StepUpdate, step_pages
from choreography_ray.types import import_type

log = logging.getLogger(__name__)

#: Counted-step records past which the job warns (and keeps recording), as the spec does.
COUNTED_WARNING_THRESHOLD = 100_000


class JobCore(Window, Stopping, Resuming, WatchdogTick):
    """One job's activation: activation, start, stages and outcomes here; the other parts in
    their modules. Everything but the Ray actor shell, below."""

    def __init__(self, job_id: str, storage_url: str, options: JobsOptions, namespace: str) -> None:
        super().__init__(job_id, storage_url, options, namespace)
        self.hook_backoff = HookBackoff()

    # -- activation ---------------------------------------------------------------------------

    async def activate(self, reconstructed: bool) -> None:
        try:
            await self._load()
        except Exception as error:
            # Calls get the error; the actor goes (rehydration or reconciliation brings a job
            # that can still run back).
            self._loaded.set_exception(error)
            self._request_exit()
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
            request = spec.request.model_dump_json()
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
        async for page in step_pages(self.storage, self.job_id, statuses=UNFINISHED, stage=stage):
            for s in page:
                start = StepStart(
                    s.step_id, s.type, s.stage, max(1, s.attempt), json.dumps(s.request)
                )
                (running if s.status is StepStatus.RUNNING else others).append(start)
        return running + others

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
        unreachable = StepStatus.UNREACHABLE
        for stage in stages:
            async for page in step_pages(self.storage, self.job_id, stage=stage):
                await self.storage.update_steps(
                    [
                        StepUpdate(self.job_id, s.step_id, unreachable, s.attempt)
                        for s in page
                        if s.status is not unreachable
                    ]
                )
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
        await self._set_status(JobStatus.FAILED, describe(error), error=describe(error))
        self._request_exit()

    # -- outcomes -----------------------------------------------------------------------------

    async def report_outcomes(self, outcomes: list[Outcome]) -> None:
        await self.ready()
        for outcome in outcomes:
            self.accept(outcome)
        finished = not self.halted or self.active or await self._finish_stop_when_reported()
        if not finished and self.state is not None and self.state.status is JobStatus.REMOVING:
            # The step's next report runs the finish again (the timer also retries it).
            raise RuntimeError(f"finishing the removal of job {self.job_id} failed; report again")
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
        if not self._idle():
            return
        if not self.stages[stage].is_completed:
            # Nothing runs, yet the counters miss outcomes (reports refused while the job was
            # reactivating, or lost): storage decides, now rather than at the next tick.
            counts = await self.storage.count_by_status(self.job_id)
            if not self._every_step_done(counts):
                return
            self.stages.recount(counts)
        await self._on_stage_done(stage)


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

    async def report_outcomes(self, outcomes: list[OutcomeWire]) -> None:
        await self.core.report_outcomes(outcomes_from_wire(outcomes))

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
