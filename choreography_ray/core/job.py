"""`JobCore`: one job's activation, one turn at a time.

Every operation that changes the activation runs as a turn (`turns.py`): start (in three turns:
prepare, first stage, running), a batch of reports, stop, resume, recover, remove, retry-failed,
a watchdog tick, a pump step, a save, a start operation's answer, a host's loss. Hooks
(`prepare_steps`, `admit_stage`, `on_before_resuming_job_steps`, `on_stopped`, `on_completed`)
run inside the turn that needs them. A start operation is a command: the turn hands the batch to
a host in a named task and the host's answer comes back as a turn of its own, so reports are
never held behind a start. See docs/decisions.md.

The job's storage record is the truth and its counters are a cache. An outcome counts once per
(step, attempt): only while its step is active at that attempt here, and once the job records
counted steps (after a resume or reopen), never twice across activations.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections import defaultdict
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from choreography_ray.core import leases, resuming, stopping
from choreography_ray.core.cleanup import keeps_records
from choreography_ray.core.counting import Counting
from choreography_ray.core.hosts import Hosts
from choreography_ray.core.messages import Outcome, StepStart
from choreography_ray.core.metrics import (
    NO_METRICS,
    BatchKind,
    Histogram,
    Labels,
    Metrics,
    Tally,
    TimedWrites,
)
from choreography_ray.core.mode import Exit, Mode, check_mode
from choreography_ray.core.planning import (
    FEED_STATUSES,
    PLAN_WRITE,
    Feed,
    PlanError,
    PlanReader,
    feed_page,
    first_run,
    id_width,
    plan_records,
    plan_source,
    to_start,
)
from choreography_ray.core.resuming import Recover, Resume
from choreography_ray.core.retries import STANDARD, decide
from choreography_ray.core.stages import (
    Stages,
    after_stage,
    mark_unreachable,
    stored_among,
    stored_running,
)
from choreography_ray.core.timers import Timers
from choreography_ray.core.transitions import check_transition
from choreography_ray.core.turns import Supervisor, Turns
from choreography_ray.core.watchdog import (
    HookBackoff,
    lost_reports,
    stage_done_in_storage,
    stored_outcome,
)
from choreography_ray.core.window import RUNNING, RunState, Window
from choreography_ray.errors import (
    CannotResumeJobError,
    ChoreographyError,
    ConcurrencyError,
    JobOperationError,
    RemoveJobError,
    ReportAgainError,
    ResumeJobError,
    RetryFailedStepsError,
    StartJobError,
    StopJobError,
)
from choreography_ray.job import Job
from choreography_ray.logs import get_logger, ids
from choreography_ray.model import JobState, ResumeAfter, StatusChange
from choreography_ray.options import JobsOptions
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.step import JobStep
from choreography_ray.storage import PlannedStep, StepUpdate, Storage, StoredStart, step_pages
from choreography_ray.types import import_type

log = get_logger(__name__)


class JobCore:
    def __init__(
        self,
        job_id: str,
        storage: Storage,
        hosts: Hosts,
        options: JobsOptions,
        on_exit: Callable[[], None] = lambda: None,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.job_id = job_id
        self.storage = storage
        self.hosts = hosts
        self.options = options
        self.on_exit = on_exit
        self.metrics = metrics
        #: The job's metric tags, once its record is loaded.
        self.labels: Labels | None = None
        #: Counted since the last turn ended: recorded once per turn, never once per step.
        self.tally = Tally()
        self.turns = Turns(after=self._record_metrics)
        self.tasks = Supervisor(f"job {job_id}")
        #: Calls and background turns are served only in SERVING (`mode.py`).
        self.mode = Mode.LOADING
        self.state: JobState | None = None
        self.job: Job[Any] | None = None
        self.stages = Stages([])
        self.window = Window(options)
        self.counting = Counting()
        self.hook_backoff = HookBackoff()
        #: This activation drives the job: it may start steps (set by start and resume).
        self.live = False
        self.hook_owed = False
        self.awaiting_admission: int | None = None
        #: Set once the activation asks its actor to exit (an operation that reopens the job
        #: clears it).
        self.exit: Exit | None = None
        self.ticks = 0
        #: Steps of a stage read before it begins, to start first: the first run's first
        #: chunk, or the steps a resume found running nowhere.
        self._plan: dict[int, list[StepStart]] = {}
        #: The rest of the running stage, read from storage a page at a time.
        self.feed: Feed | None = None
        self._dirty = False
        self._dedicated: dict[str, bool] = {}  # step type path -> dedicated
        #: Per host, the incarnation this activation watches (the last one that answered).
        self._incarnations: dict[str, str | None] = {}
        self._timers = Timers(self._kick)
        #: A terminal status decided (hooks ran) but not saved yet: saved before anything else.
        self._owed: tuple[JobStatus, str | None, str | None] | None = None
        self._completed_hook_ran = False
        self._stopped_hook_ran = False
        self._removed = False
        #: Saves in a row that failed without an answer: each may have been written.
        self._unanswered_saves = 0
        self._first_stage_failed = 0
        self._wake = asyncio.Event()
        self._loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._begun = False

    # -- activation ---------------------------------------------------------------------------

    def begin(self, reconstructed: bool = False) -> None:
        """Activates the job in a named task, once: when its actor is created, or for a spare
        actor (created ahead of its job) at its first call."""
        if not self._begun:
            self.tasks.spawn("activate", self.activate(reconstructed))
            self._begun = True

    async def activate(self, reconstructed: bool) -> None:
        """Loads the record, and recovers first when the actor was restarted (`mode.py`): the
        calls that came meanwhile are served once that is done."""
        self._begun = True
        try:
            async with self.turns.turn("activate"):
                await self._load()
        except Exception as error:
            # Calls get the error; the actor goes (rehydration or reconciliation brings a job
            # that can still run back).
            self._enter(Mode.UNLOADED)
            self._loaded.set_exception(error)
            self._loaded.exception()  # retrieved: the calls that wait see it
            self._request_exit(Exit.UNLOADED)
            return
        if self.state is None:
            self._enter(Mode.UNLOADED)
            self._loaded.set_result(None)
            self._request_exit()
            return
        if self.state.status.is_terminal or (
            self.state.status is JobStatus.STOPPED and self.state.stop_finalized
        ):
            # Activated for an operation on a job at rest: it answers, and the actor goes
            # unless the operation reopened the job.
            self._request_exit()
        if reconstructed:
            # A restarted actor carries on from storage (that is reactivation) before it serves
            # anything: a report served first would find none of its running steps.
            self._enter(Mode.RECOVERING)
            await self._refresh_hosts()
            await self._until_done("recover on reactivation", self._recover)
        else:
            await self._refresh_hosts()
        self._enter(Mode.SERVING)
        self._loaded.set_result(None)
        self.tasks.repeat("pump", self._next_kick, self._pump, STANDARD)
        every = self.options.progress_save_interval.total_seconds()
        self.tasks.repeat("save", lambda: asyncio.sleep(every), self._save_progress, STANDARD)
        interval = self.options.watchdog_seconds
        if interval is not None:
            # The first tick comes soon after activation, then one every interval.
            delays = iter([min(interval, 1.0)])

            async def next_tick() -> None:
                await asyncio.sleep(next(delays, interval))

            self.tasks.repeat("watchdog", next_tick, self.watchdog_tick, STANDARD)

    def _enter(self, mode: Mode) -> None:
        self.mode = check_mode(self.job_id, self.mode, mode)

    async def _refresh_hosts(self) -> None:
        try:
            await self.hosts.refresh()
        except Exception:  # placing the first steps reads the node table again
            log.exception("job %s: reading the step hosts failed", self.job_id)

    async def _until_done(self, what: str, attempt: Callable[[], Awaitable[object]]) -> None:
        """Runs `attempt` until it succeeds, logging each failure and backing off."""
        failures = 0
        while True:
            try:
                await attempt()
                return
            except Exception:
                failures += 1
                delay = STANDARD.delay(failures)
                log.exception("job %s: %s failed; again in %.0f s", self.job_id, what, delay)
                await asyncio.sleep(delay)

    async def _load(self) -> None:
        self.state = await self.storage.get_job(self.job_id)
        if self.state is None:
            return
        resumed = self.state.resume_after
        skipped_through = None if resumed is None else resumed.stage
        self.stages = Stages.from_progress(self.state.progress, skipped_through)
        try:
            job_type = import_type(self.state.type, self.options.allowed_type_prefixes)
            if not issubclass(job_type, Job):  # checked before anything from storage is built
                raise TypeError(f"{self.state.type} is not a choreography_ray.Job")
            job = job_type()
        except Exception as error:
            message = f"cannot load job type {self.state.type!r}: {error}"
            log.error("job %s: %s", self.job_id, message)
            if not self.state.status.is_terminal and self.state.status is not JobStatus.REMOVING:
                await self._save((JobStatus.FAILED, (message,)), error=message)
            raise ChoreographyError(message) from error
        self.labels = Labels(self.state.scope, self.state.namespace, self.state.type)
        if self.metrics.enabled:
            self.storage = TimedWrites(self.storage, self.metrics, self.labels)
        job.job_id, job.scope, job.namespace, job.options = (
            self.job_id,
            self.state.scope,
            self.state.namespace,
            self.options,
        )
        self.job = job
        self.window.configure(job.max_active_steps)
        await self.counting.load(self.storage, self.job_id, self.state.records_counted_steps)

    async def ready(self) -> JobState:
        """The state, once loaded: a read-only query, beside turns."""
        self.begin()
        await asyncio.shield(self._loaded)
        if self.state is None:
            raise JobOperationError(ResumeJobError.UNKNOWN, f"job {self.job_id} does not exist")
        return self.state

    def _request_exit(self, why: Exit = Exit.AT_REST) -> None:
        self.exit = why
        self.on_exit()

    @property
    def exit_requested(self) -> bool:
        return self.exit is not None

    def _record_metrics(self) -> None:
        if self.labels is not None:
            self.tally.record(self.metrics, self.labels)

    def close(self) -> None:
        self.tasks.cancel_all()

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> StartJobError | None:
        await self.ready()
        async with self.turns.turn("start: prepare"):
            error = await self._prepare()
            if error is not None:
                return error
        async with self.turns.turn("start: first stage"):
            state = self._state
            if state.status is not JobStatus.PREPARING_STEPS or not self.live:
                return None  # stopped or removed while it prepared: nothing starts
            try:
                await self._set_status(JobStatus.STARTING_STEPS)
                wave = await self._begin_stage(self.stages.first(), first_run=True)
            except Exception:
                # The plan is stored: the watchdog (or a rehydration) finishes startup.
                self.live = False
                raise
        answers = await asyncio.gather(*wave)
        async with self.turns.turn("start: running"):
            if self._state.status is JobStatus.STARTING_STEPS:
                try:
                    await self._set_status(JobStatus.RUNNING)
                except Exception:
                    # Its steps run: the watchdog (or a rehydration) adopts them through a
                    # resume, as after a failed first stage.
                    self.live = False
                    raise
                try:
                    # A first stage whose steps all failed to start is done: on to the next.
                    await self._check_stage()
                except Exception:
                    log.exception("job %s: moving past its first stage failed", self.job_id)
            self._kick()
            return self._start_error(answers)

    async def _prepare(self) -> StartJobError | None:
        state = self._state
        if state.status is not JobStatus.PREPARING_JOB or state.has_plan or self.live:
            return StartJobError.JOB_ALREADY_EXISTS
        job = self._job
        self.live = True
        try:
            request = job.request_type().model_validate(state.request)
            source = await plan_source(job.prepare_steps(request))
        except Exception as error:
            await self._fail(error)
            return StartJobError.COULD_NOT_PREPARE_STEPS
        try:
            await self._persist_plan(source)
        except PlanError as error:  # the plan's own code, while it was read
            await self._fail_preparing(error.__cause__ or error)
            return StartJobError.COULD_NOT_PREPARE_STEPS
        except Exception as error:
            log.exception("job %s: could not persist its plan", self.job_id)
            await self._fail_preparing(error)
            return StartJobError.COULD_NOT_PERSIST
        return None

    async def _fail_preparing(self, error: BaseException) -> None:
        """The job fails before its plan is stored: a partial plan's records go first."""
        await self._clear_partial_plan()
        await self._fail(error)

    async def _clear_partial_plan(self) -> None:
        try:
            await self.storage.remove_job_steps(self.job_id)
        except Exception as error:  # a job without a plan never runs them; retention clears
            log.warning("job %s: removing its partial plan failed: %s", self.job_id, error)

    async def _persist_plan(self, source: Iterable[Any] | AsyncIterable[Any]) -> None:
        """Reads, checks and writes the plan a chunk at a time, counting per-stage totals; the
        job record says `has_plan` only once every chunk is stored. Errors of the plan's own
        code are `PlanError`s."""
        if await self.storage.list_starts(self.job_id, limit=1):
            # An earlier activation's plan, never finished (no has_plan): its records go first.
            await self.storage.remove_job_steps(self.job_id)
        size = self.options.plan_chunk_size
        reader = PlanReader(source)
        chunk = await reader.read(size)
        # One step past the first chunk says whether the plan ends within it, and so how wide
        # its step ids are when its length is not known.
        probe = await reader.read(1)
        width = id_width(source, len(chunk), bool(probe))
        totals: dict[int, int] = {}
        # The first run keeps the first two chunks' records (the second was begun to size the
        # ids): a plan of up to two chunks is never read back.
        kept: list[PlannedStep] = []
        offset = 0
        writing: asyncio.Task[None] | None = None
        try:
            while chunk:
                # A chunk is written a piece at a time, each piece while the next is built or
                # read (SQLite writes it without holding the GIL); one write at a time, in
                # order. Only the last piece's write is left when the plan ends.
                for first in range(0, len(chunk), PLAN_WRITE):
                    records = plan_records(chunk[first : first + PLAN_WRITE], offset, width)
                    if writing is not None:
                        await writing
                    writing = asyncio.get_running_loop().create_task(
                        self.storage.insert_plan(self.job_id, records),
                        name=f"insert plan of job {self.job_id} at step {offset}",
                    )
                    # The write begins now (reading a plan that is not async never yields).
                    await asyncio.sleep(0)
                    for record in records:
                        totals[record.stage] = totals.get(record.stage, 0) + 1
                    if offset < 2 * size:
                        kept += records
                    offset += len(records)
                    del records
                del chunk  # let it go before the next is read
                chunk, probe = probe + await reader.read(size - len(probe)), []
            if writing is not None:
                await writing
        except BaseException:
            if writing is not None:
                # The write lands (or fails) before the job clears its partial plan; the error
                # raised here is the one to report, not the write's.
                await asyncio.wait([writing])
                if not writing.cancelled():
                    writing.exception()
            raise
        stages = Stages.from_totals(totals)
        resume = self._state.resume_after
        if resume is not None:
            resume = await self._skip_checkpointed(stages, resume)
        update = {"has_plan": True, "progress": stages.progress(), "stage": stages.first()}
        self.state = self._state.model_copy(update={**update, "resume_after": resume})
        self.stages = stages
        await self._set_status(JobStatus.PREPARING_STEPS)
        stage = stages.first()
        self._plan = {stage: first_run(kept, stage)}
        # A plan that ended within the kept chunks is whole in memory: nothing to read.
        self.feed = Feed(stage, after=kept[-1].step_id if kept else None, done=offset == len(kept))

    async def _skip_checkpointed(self, stages: Stages, resume: ResumeAfter) -> ResumeAfter | None:
        """A start after a checkpoint: the checkpointed stages' steps are counted as succeeded
        and their records (written with the plan) deleted again, so they never run. The resume
        as kept (its `stage` the last one skipped), or None when the layout changed and the
        job runs from the top."""
        skipped = stages.skip_through(resume)
        if not skipped:
            log.warning("job %s runs from the top: its plan's stage layout is not the one of run "
                        "%s's checkpoint", self.job_id, resume.source)  # fmt: skip
            return None
        for stage in skipped:
            while page := await self.storage.list_starts(
                self.job_id, stage=stage, limit=self._page
            ):
                await self.storage.delete_steps(self.job_id, [row.step_id for row in page])
        log.info("job %s resumes after stage %d of run %s: stage(s) %s are not run again",
                 self.job_id, skipped[-1], resume.source, skipped)  # fmt: skip
        return resume.model_copy(update={"stage": skipped[-1]})

    def _start_error(self, answers: list[bool]) -> StartJobError | None:
        """The first stage's start error: no step of it started, or some did not."""
        if self._first_stage_failed == 0 and all(answers):
            return None
        if any(answers):
            return StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        first = self.stages.first()
        moved_on = self._state.stage != first and not self._state.status.is_terminal
        # A first stage that continues on failure while a later stage starts: the job runs.
        return (
            StartJobError.FAILED_STARTING_SOME_JOB_STEPS
            if moved_on
            else StartJobError.FAILED_STARTING_ALL_JOB_STEPS
        )

    # -- stages -------------------------------------------------------------------------------

    async def _begin_stage(self, stage: int, first_run: bool = False) -> list[asyncio.Future[bool]]:
        """Asks admission, then starts the stage's steps. Returns the futures of the first
        wave of start operations when `first_run` (what `start` waits for)."""
        if not self.stages.counters:
            await self._complete()
            return []
        try:
            admitted = await self._job.admit_stage(stage)
        except Exception as error:
            log.warning(
                "job %s: admit_stage(%s) failed: %s; asking again", self.job_id, stage, error
            )
            self._timers.arm("admission")
            admitted = False
        if not admitted:
            self.awaiting_admission = stage
            return []
        self.awaiting_admission = None
        self._timers.clear("admission")
        counter = self.stages[stage]
        # Stored now: an activation lost before the next periodic save must find the stage
        # the job had reached, or it would adopt (and stop) the steps of the one before. A
        # failed save leaves the stage unstarted, so the pump's retry begins it again.
        was_started, counter.is_started = counter.is_started, True
        try:
            await self._save(stage=stage)
        except Exception:
            counter.is_started = was_started
            raise
        starts = self._plan.pop(stage, None)
        if starts is None:
            starts = await self._adopt_stage(stage)
        # Steps whose type cannot be loaded fail to start, the whole stage at once: what
        # `start` answers covers the first stage, not only its first wave.
        starts, cannot = self._startable(starts)
        if cannot:
            await self._cannot_start(cannot)
        self.window.queue(starts)
        if first_run:
            self._first_stage_failed = len(cannot)
            return await self._fill()
        if not starts and not self.window.in_flight() and counter.is_completed:
            await self._stage_done(stage)
        return []

    async def _adopt_stage(
        self, stage: int, host_of: dict[str, str] | None = None
    ) -> list[StepStart]:
        """The stage's steps stored running: those still running on a live host (`host_of`,
        else asked now) become active here again instead of being started twice; returns the
        others, to start first. The rest of the stage's unfinished steps come from the feed,
        from the top."""
        # Hosts first, storage after: a step that finishes between the two reads is then either
        # adopted and stored as finished (so left alone), never read running and found idle.
        if host_of is None:
            host_of = await self.hosts.running(self.job_id)
        running = await stored_running(self.storage, self.job_id, stage, host_of)
        self.feed = Feed(stage, skip={row.step_id for row in running})
        return self._adopt(running, host_of)

    def _adopt(self, rows: list[StoredStart], host_of: dict[str, str]) -> list[StepStart]:
        """A stopped step runs again as its next attempt, so a stop report of the run it
        replaces, delivered again, cannot pass for the new run's outcome."""
        rest: list[StepStart] = []
        for row in rows:
            host = host_of.get(row.step_id)
            if host is not None:
                start = StepStart(row.step_id, row.type, row.stage, max(1, row.attempt),
                                  row.request_json)  # fmt: skip
                self.window.adopt(start, host)
                self._watch(host, None)
            else:
                rest.append(to_start(row))
        return rest

    async def _refill(self) -> None:
        """The running stage's next page of steps from storage, once few wait to start."""
        feed = self.feed
        if feed is None or feed.done or self.window.count(RunState.QUEUED) >= self._page:
            return
        if feed.stage != self._state.stage:
            return
        page = await self.storage.list_starts(
            self.job_id, statuses=FEED_STATUSES, stage=feed.stage, after=feed.after,
            limit=self._page,
        )  # fmt: skip
        starts, cannot = self._startable(feed.take(page, self._page))
        self.window.queue(starts)
        if cannot:
            await self._cannot_start(cannot)

    async def _stop_unread(self) -> tuple[int, int]:
        """A stop counts the running stage's steps the feed has not read yet as stopped (they
        never started): (how many it counted now, how many it read)."""
        feed = self.feed
        counter = None if feed is None else self.stages.counters.get(feed.stage)
        if feed is None or counter is None or feed.stage != self._state.stage:
            return 0, 0
        counted = read = 0
        while not feed.done:
            page = await self.storage.list_starts(
                self.job_id, statuses=FEED_STATUSES, stage=feed.stage, after=feed.after,
                limit=self._page,
            )  # fmt: skip
            for start in feed.take(page, self._page):
                if start.step_id in self.window.runs:
                    continue
                read += 1
                if self.counting.count_stop(start.step_id):
                    counter.stopped += 1
                    counted += 1
        return counted, read

    async def _forget_stored_outcomes(self, stage: int) -> None:
        """Active steps whose outcome storage holds: the recount made in the same fence
        counted them."""
        for outcome in await lost_reports(self.storage, self.job_id, self._settleable(stage)):
            entry = self.window.take(outcome.step_id, outcome.attempt)
            if entry is not None and self._dedicated_type(entry[0].type):
                self.hosts.release(entry[1])

    @contextlib.asynccontextmanager
    async def _fenced(self) -> AsyncIterator[dict[str, str]]:
        """The job's steps on live hosts (step id -> host), the hosts fenced while the block
        reads storage: none of the job's outcomes is written meanwhile, and no start sent
        before lands after. A recount and the steps adopted are then one picture: a step
        listed has no outcome stored (it counts when it reports), and an outcome stored is of
        a step not listed (the recount counts it)."""
        try:  # a host that does not answer fails the read: those that did are lifted too
            yield await self.hosts.running(self.job_id, fence=True)
        finally:
            await self.hosts.lift_fence(self.job_id)

    async def _stage_done(self, stage: int) -> None:
        if self._state.stage != stage or self._state.status is not JobStatus.RUNNING:
            return  # another turn moved on already
        after = after_stage(self.stages, stage, self._job)
        if after.unreachable:
            for later in after.unreachable:
                self._plan.pop(later, None)
            await mark_unreachable(self.storage, self.job_id, self.stages, after.unreachable)
        if after.next_stage is not None:
            await self._begin_stage(after.next_stage)
            self._kick()
            return
        await self._complete()

    async def _complete(self) -> None:
        if self._state.status.is_terminal:
            return
        status = (
            JobStatus.COMPLETED_WITH_FAILURES
            if self.stages.progress().has_failures
            else JobStatus.COMPLETED_SUCCESSFULLY
        )
        if not self._completed_hook_ran:
            try:
                await self._job.on_completed()
            except Exception as error:
                await self._fail(error)
                return
            self._completed_hook_ran = True
        await self._finish_with(status)

    async def _fail(self, error: BaseException) -> None:
        """A job hook threw: the job is FAILED with the message, and its actor exits."""
        await self._finish_with(JobStatus.FAILED, describe(error))

    async def _finish_with(
        self, status: JobStatus, message: str | None = None, error: str | None = None
    ) -> None:
        """Saves a terminal status (`error`, else `message`, as the job's error); if the save
        fails, the pump saves it before anything else, and the hooks do not run again."""
        self.live = False
        self._owed = (status, message, error or message)
        await self._save_owed()

    async def _save_owed(self) -> None:
        assert self._owed is not None
        status, message, error = self._owed
        messages = () if message is None else (message,)
        await self._set_status(status, *messages, error=error)
        self._owed = None
        job = self.job
        if job is not None and not self._state.held and not keeps_records(type(job), status):
            await self._drop_records()
        self._request_exit()

    async def _drop_records(self) -> None:
        """A completed job whose type does not keep its records drops them, in the turn that
        saved its outcome (so nothing of this activation writes them again). A drop that fails
        leaves them to the cleanup pass's retention."""
        try:
            await stopping.remove_records(self.storage, self.job_id)
        except Exception as error:
            log.warning("job %s: dropping its records (its type does not keep them) failed: "
                        "%s; terminal_job_retention removes them", self.job_id, error)  # fmt: skip
            return
        self._removed = True
        log.info("job %s: %s, its records dropped (not kept)", self.job_id, self._state.status)

    # -- the window ---------------------------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()

    async def _next_kick(self) -> None:
        await self._wake.wait()
        self._wake.clear()

    async def _pump(self) -> None:
        async with self.turns.turn("pump"):
            await self._advance()

    async def _advance(self) -> None:
        """Starts what may start and moves on when the stage is done."""
        if self._owed is not None:
            await self._save_owed()
            return
        if self._timers.due("finish"):
            await self._finish_stop_when_reported()
        if not self.live or self.hook_owed or self.state is None:
            return
        if self.state.status not in (JobStatus.STARTING_STEPS, JobStatus.RUNNING):
            return
        if self._timers.due("starts"):
            await self._retry_failed_starts()
        if self._timers.due("admission") and self.awaiting_admission is not None:
            await self._begin_stage(self.awaiting_admission)
        self._timers.due("retries")  # re-armed below for the next one
        self.window.retry_due()
        if (due_in := self.window.next_due_in()) is not None:
            self._timers.arm("retries", due_in)
        await self._fill()
        if self.state.status is JobStatus.RUNNING:
            await self._check_stage()

    def _startable(
        self, starts: list[StepStart]
    ) -> tuple[list[StepStart], list[tuple[StepStart, str]]]:
        """The steps whose type loads, and the others with the reason."""
        good: list[StepStart] = []
        cannot: list[tuple[StepStart, str]] = []
        for start in starts:
            try:
                self._is_dedicated(start.type)
            except Exception as error:
                cannot.append((start, describe(error)))
            else:
                good.append(start)
        return good, cannot

    async def _fill(self) -> list[asyncio.Future[bool]]:
        """Hands pending steps to hosts while the window and the throttle allow. A step whose
        type cannot be loaded fails to start: it is recorded FAILED and counted."""
        answers: list[asyncio.Future[bool]] = []
        while self.live:
            await self._refill()
            if not (batch := self.window.next_batch()):
                break
            shared: list[StepStart] = []
            cannot: list[tuple[StepStart, str]] = []
            for start in batch:
                try:
                    dedicated = self._is_dedicated(start.type)
                except Exception as error:
                    cannot.append((start, describe(error)))
                    continue
                if dedicated:
                    host = self.hosts.place(self.job_id, start, dedicated=True)
                    answers.append(self._send(host, [start]))
                else:
                    shared.append(start)
            if shared:
                host = self.hosts.place(self.job_id, shared[0], dedicated=False)
                answers.append(self._send(host, shared))
            if cannot:
                await self._cannot_start(cannot)
        return answers

    async def _cannot_start(self, failures: list[tuple[StepStart, str]]) -> None:
        outcomes = [Outcome(s.step_id, s.attempt, StepStatus.FAILED, why) for s, why in failures]
        try:
            await self._store_outcomes(outcomes)
        except Exception:
            self.window.queue((start for start, _why in failures), front=True)
            raise
        # Its attempt ended here: out of the table (a retry's too, else a stop after a
        # RetryFailedSteps would count it failed once more).
        self.window.forget(start.step_id for start, _why in failures)
        for (start, why), outcome in zip(failures, outcomes, strict=True):
            log.warning("job %s: step %s cannot start: %s", self.job_id, start.step_id, why,
                        extra=ids(self.job_id, start.step_id))  # fmt: skip
            self._settle(start, outcome)

    async def _store_outcomes(self, outcomes: list[Outcome]) -> None:
        """Stores outcomes the job reached itself (not successes), as a host stores a step's."""
        await self.storage.update_steps(
            [
                StepUpdate(
                    self.job_id,
                    o.step_id,
                    o.status,
                    o.attempt,
                    change=StatusChange(
                        status=o.status,
                        exception_messages=() if o.message is None else (o.message,),
                    ),
                )
                for o in outcomes
            ]
        )

    def _is_dedicated(self, type_path: str) -> bool:
        dedicated = self._dedicated.get(type_path)
        if dedicated is None:
            step_type = import_type(type_path, self.options.allowed_type_prefixes)
            if not issubclass(step_type, JobStep):
                raise TypeError(f"{type_path} is not a choreography_ray.JobStep")
            dedicated = self._dedicated[type_path] = bool(step_type.dedicated)
        return dedicated

    def _send(self, host: str, batch: list[StepStart]) -> asyncio.Future[bool]:
        """The start operation as a command: its answer comes back as a turn."""
        self.window.started(batch, host)
        labels = self._labels
        self.metrics.observe(Histogram.BATCH_SIZE, len(batch), labels, BatchKind.START)
        answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def send() -> None:
            error: Exception | None = None
            incarnation = None
            try:
                incarnation = await self.hosts.start(host, self.job_id, batch, labels)
            except Exception as failure:
                error = failure
            try:
                async with self.turns.turn(f"start answered by {host}"):
                    await self._answered(host, batch, error, incarnation)
            finally:
                if not answered.done():
                    answered.set_result(error is None)

        self.tasks.spawn(f"start {len(batch)} steps on {host}", send())
        return answered

    async def _answered(
        self,
        host: str,
        batch: list[StepStart],
        error: Exception | None,
        incarnation: str | None = None,
    ) -> None:
        known = self._incarnations.get(host)
        if error is None and known is not None and known != incarnation:
            # The host restarted since it last answered: the steps it ran then are gone (this
            # batch's are still being started, so not among them).
            await self._host_lost(host)
        self.window.answered(batch, error is None)
        self._kick()
        if error is not None:
            # One retry round for every start that failed meanwhile: the backoff grows by
            # round, not by the number of batches that failed in it.
            log.warning(
                "job %s: starting %d steps on %s failed (started again soon): %s",
                self.job_id,
                len(batch),
                host,
                error,
            )
            if self.live or not stopping.stop_owed(self._state):
                self._timers.arm("starts")
            else:
                await self._stop_failed_starts()
            return
        if not self.window.count(RunState.START_FAILED):
            self._timers.clear("starts")
        self.tally.started += len(batch)
        self._watch(host, incarnation)
        if not self.live and self._state.status in (JobStatus.STOPPED, JobStatus.REMOVING):
            # The stop reached this host before these steps did: tell them again.
            await self.hosts.cancel([host], self.job_id, self._state.status is JobStatus.REMOVING)

    async def _stop_failed_starts(self) -> None:
        """A stopping job's starts that threw (the stop came first): a step a host has all the
        same is active again and told to stop, a step whose outcome storage holds counts it,
        and the others never ran: they count as the stop counts a step that never started."""
        failed = {start.step_id: start for start in self.window.failed_starts()}
        on_hosts = await self.hosts.running(self.job_id)  # before storage: see _adopt_stage
        unsure = [step_id for step_id in failed if step_id not in on_hosts]
        records = await self.storage.get_steps(self.job_id, unsure) if unsure else {}
        outcomes = {
            step_id: outcome
            for step_id in unsure
            if (outcome := stored_outcome(failed[step_id], records.get(step_id))) is not None
        }
        for step_id, host in on_hosts.items():
            if step_id in failed:
                self.window.adopt(failed[step_id], host)
        for step_id, outcome in outcomes.items():
            self.window.adopt(failed[step_id], "")
            self.accept(outcome)
        halted = stopping.halt(self.window, self.stages, self.counting)
        self.tally.failed += halted.failed
        self.tally.stopped += halted.stopped
        self._dirty = True
        told = {on_hosts[step_id] for step_id in failed if step_id in on_hosts}
        if told:
            removing = self._state.status is JobStatus.REMOVING
            await self.hosts.cancel(told, self.job_id, removing)
        await self._finish_stop_when_reported()

    async def _retry_failed_starts(self) -> None:
        """Start operations that threw may have run on their host all the same (Ray: "the task
        may or may not have been executed"): a step whose outcome storage holds counts it; a
        step a host still has goes back to that host, which skips it when it runs that attempt
        and refuses it while it lets an earlier one go; the others start again anywhere."""
        failed = {start.step_id: start for start in self.window.failed_starts()}
        if not failed:
            return
        on_hosts = await self.hosts.running(self.job_id)  # before storage: see _adopt_stage
        unsure = [step_id for step_id in failed if step_id not in on_hosts]
        records = await self.storage.get_steps(self.job_id, unsure) if unsure else {}
        back: dict[str, list[StepStart]] = defaultdict(list)
        again: list[StepStart] = []
        for step_id, start in failed.items():
            if step_id in on_hosts:
                back[on_hosts[step_id]].append(start)
            elif (outcome := stored_outcome(start, records.get(step_id))) is not None:
                self.window.adopt(start, "")
                self.accept(outcome)
            else:
                again.append(start)
        for host, batch in back.items():
            self._send(host, batch)
        self.window.queue(again, front=True)

    def _watch(self, host: str, incarnation: str | None) -> None:
        """Learns that this incarnation of a host is gone (it died, or restarted) from its
        watch call ending; a watch that fails without telling is asked again (None: whatever
        incarnation runs now, for a host found running the job's steps)."""
        if host in self._incarnations and incarnation in (None, self._incarnations[host]):
            return
        self._incarnations[host] = incarnation

        async def gone() -> None:
            async with self.turns.turn(f"host {host} gone"):
                if self._incarnations.get(host) != incarnation:
                    return  # a later incarnation answered since: its answer handled the loss
                await self._host_lost(host)
                del self._incarnations[host]
                await self.hosts.refresh()

        async def watch() -> None:
            failures = 0
            while True:
                try:
                    await self.hosts.watch(host, incarnation)
                    break
                except Exception as error:
                    failures += 1
                    delay = STANDARD.delay(failures)
                    log.warning("job %s: watching host %s failed (%s); again in %.0f s",
                                self.job_id, host, error, delay)  # fmt: skip
                    await asyncio.sleep(delay)
            log.info("job %s: host %s (%s) is gone", self.job_id, host, incarnation)
            await self._until_done(f"handling the loss of host {host}", gone)
            self._kick()

        self.tasks.spawn(f"watch {host}", watch())

    async def _host_lost(self, host: str) -> None:
        """The incarnation of `host` that ran this activation's answered steps is gone: a step
        whose outcome it stored counts that; the others never report. A stopping job stores
        them STOPPED; a running one starts them again (leases off) or leaves them to the lease
        (on). Steps whose start is unanswered wait for their answer."""
        stage = self._state.stage
        lost_ids = {s.step_id for s in self.window.on_host(host)
                    if self.window.state_of(s.step_id) in RUNNING}  # fmt: skip
        await self._settle_stored({k: v for k, v in self._settleable(stage).items()
                                   if k in lost_ids})  # fmt: skip
        lost = [s for s in self.window.on_host(host) if s.step_id in lost_ids]
        if lost and not self.live:
            await self._store_stops(lost)
            await self._finish_stop_when_reported()
        elif lost and self.options.lease_seconds is None:
            log.warning("job %s: host %s died with %d steps; starting them again", self.job_id,
                        host, len(lost))  # fmt: skip
            self.window.queue(lost, front=True)
        elif lost:
            # With leases the lease decides; that this host's process is gone is known now,
            # whatever Ray's state API can tell later.
            self.window.lose_owner(start.step_id for start in lost)

    async def _check_stage(self) -> None:
        stage = self._state.stage
        if not self._idle():
            return
        if not self.stages[stage].is_completed:
            # Nothing runs, yet the counters miss outcomes (reports refused while the job was
            # reactivating, or lost): storage decides, now rather than at the next tick.
            if not await stage_done_in_storage(self.storage, self.job_id, stage):
                return
            self.stages.recount(await self.storage.count_by_status(self.job_id))
        await self._stage_done(stage)

    def _idle(self) -> bool:
        """No step of the running stage is active, waiting to start, or waiting to retry."""
        return (
            not self.window.runs and self.awaiting_admission is None
            and self._state.stage in self.stages.counters and self._fed()
        )  # fmt: skip

    @property
    def _page(self) -> int:
        """Steps the feed reads per page."""
        return feed_page(self.options.plan_chunk_size)

    def _fed(self) -> bool:
        """The feed has no more steps of the running stage to read."""
        feed = self.feed
        return feed is None or feed.done or feed.stage != self._state.stage

    # -- outcomes -----------------------------------------------------------------------------

    async def report_outcomes(self, outcomes: list[Outcome]) -> None:
        await self.ready()
        async with self.turns.turn("report"):
            self.metrics.observe(
                Histogram.BATCH_SIZE, len(outcomes), self._labels, BatchKind.OUTCOMES
            )
            for outcome in outcomes:
                self.accept(outcome)
            finished = self.live or bool(self.window.in_flight())
            if not finished:
                finished = await self._finish_stop_when_reported()
            if not finished and self._state.status is JobStatus.REMOVING:
                # The step's next report runs the finish again (the timer also retries it).
                raise ReportAgainError(
                    f"finishing the removal of job {self.job_id} failed; report again"
                )
        self._kick()

    def accept(self, outcome: Outcome) -> bool:
        """Counts an outcome once per (step, attempt); False when it was not counted."""
        entry = self.window.take(outcome.step_id, outcome.attempt)
        if entry is None:
            return False
        start, host = entry
        if self._dedicated_type(start.type):
            self.hosts.release(host)
        return self._settle(start, outcome)

    def _dedicated_type(self, type_path: str) -> bool:
        try:
            return self._is_dedicated(type_path)
        except Exception:
            return False

    def _settle(self, start: StepStart, outcome: Outcome) -> bool:
        counter = self.stages[start.stage]
        step_id = start.step_id
        self._dirty = True
        if outcome.status is StepStatus.STOPPED:
            if self.counting.count_stop(step_id):
                counter.stopped += 1
                self.tally.stopped += 1
            if self.live:
                # Stopped though the job runs (a stop of an earlier execution reached it after
                # a resume): it counts as stopped until it runs again, now, as its next
                # attempt, so the same report delivered again cannot pass for the new run's.
                self.window.queue([start._replace(attempt=start.attempt + 1)])
            return True
        if self.counting.is_counted(step_id):
            return False
        if outcome.status in FAILED_STEP:
            decision = decide(self._job, self.options, outcome)
            if decision.retry and self.live:
                self.window.wait_retry(start, decision.delay)
                self._timers.arm("retries", self.window.next_due_in() or 0.0)
                self.tally.retried += 1
                return True
            counter.failed += 1
            self.tally.failed += 1
        else:
            counter.successful += 1
            self.tally.succeeded += 1
        if self.counting.take_back_stop(step_id):
            # The stop of an earlier execution is taken back; the outcome counts instead.
            counter.stopped -= 1
        self.counting.count_outcome(step_id)
        return True

    # -- stop and remove ----------------------------------------------------------------------

    async def stop(self) -> None:
        await self.ready()
        async with self.turns.turn("stop"):
            if self._owed is not None:
                # Its outcome is decided (its hooks ran): only the save of it is owed.
                raise JobOperationError(
                    StopJobError.JOB_IS_NOT_RUNNING,
                    f"job {self.job_id} has ended ({self._owed[0]}); its status is being saved",
                )
            stopping.refuse_stop(self._state)
            try:
                await self._set_status(JobStatus.STOPPED, stop_finalized=False)
            except Exception as error:
                raise JobOperationError(StopJobError.COULD_NOT_PERSIST_STOP, str(error)) from error
            await self._halt_and_tell(removing=False)

    async def remove(self) -> None:
        await self.ready()
        async with self.turns.turn("remove"):
            if self._owed is not None:
                # Its outcome is decided: saved first, then the ended job is removed.
                try:
                    await self._save_owed()
                except Exception as error:
                    raise JobOperationError(RemoveJobError.UNKNOWN, str(error)) from error
            if self._state.status is JobStatus.REMOVING:
                if self.window.in_flight():
                    raise JobOperationError(RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED)
                finished = await self._finish_stop()
                raise JobOperationError(
                    RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED
                    if finished
                    else RemoveJobError.UNKNOWN
                )
            try:
                await self._set_status(JobStatus.REMOVING, stop_finalized=False)
            except Exception as error:
                raise JobOperationError(RemoveJobError.UNKNOWN, str(error)) from error
            await self._halt_and_tell(removing=True)

    async def _halt_and_tell(self, removing: bool) -> None:
        self.live = False
        self.awaiting_admission = None
        self._stopped_hook_ran = False
        if self.state is not None and self.stages.counters.get(self.state.stage):
            # Steps a resume read and the resume hook has not started yet never started.
            self.window.queue(self._plan.pop(self.state.stage, []))
        failed, stopped = stopping.halt(self.window, self.stages, self.counting)
        self.tally.failed += failed
        self.tally.stopped += stopped
        self._dirty = True
        try:
            self.tally.stopped += (await self._stop_unread())[0]
        except Exception as error:  # they start when the job resumes all the same
            log.warning("job %s: counting its unread steps as stopped failed: %s", self.job_id,
                        error)  # fmt: skip
        await self.hosts.cancel(self.window.hosts(), self.job_id, removing)
        try:
            await self._stop_lost_owners()
        except Exception as error:  # the next watchdog tick stores them
            log.warning("job %s: storing the stop of steps whose host is gone failed: %s",
                        self.job_id, error)  # fmt: skip
        await self._finish_stop_when_reported()

    async def _stop_lost_owners(self) -> None:
        """A stopping job's steps whose host the job saw go (leases on) never report: a step
        whose outcome that host stored counts it, the others are stored STOPPED."""
        lost = self.window.active(RunState.OWNER_LOST)
        if not lost:
            return
        await self._settle_stored(lost)
        await self._store_stops(
            [start for start, _host in self.window.active(RunState.OWNER_LOST).values()]
        )

    async def _tell_stop_again(self) -> None:
        """Finishes a stop left by an earlier activation: steps that never recorded their stop
        are told again; steps of stages never started are left alone."""
        removing = self._state.status is JobStatus.REMOVING
        stage = self._state.stage
        self.live = False
        # Progress from storage; a step of the stage with no outcome that runs nowhere has
        # stopped, and one still running counts when it reports.
        async with self._fenced() as host_of:
            not_running = await self._adopt_stage(stage, host_of)
            self.stages.recount(await self.storage.count_by_status(self.job_id))
            # Entries this activation had before (a stop it made) may have stored outcomes.
            await self._forget_stored_outcomes(stage)
        for start in not_running:
            if self.counting.count_stop(start.step_id):
                self.tally.stopped += 1
        counted, read = await self._stop_unread()
        self.tally.stopped += counted
        if stage in self.stages.counters:
            # Running steps whose stop an earlier execution counted stay counted: their stop
            # report is then a duplicate. Every step read here is counted stopped now.
            active = sum(s in self.counting.stopped for s in self.window.active())
            self.stages[stage].stopped = len(not_running) + read + active
        self._dirty = True
        await self.hosts.cancel(self.window.hosts(), self.job_id, removing)
        await self._finish_stop_when_reported()

    async def _finish_stop_when_reported(self) -> bool:
        """Finishes the stop once every step has reported; False when finishing failed."""
        if self.window.in_flight() or self.state is None or not stopping.stop_owed(self.state):
            return True
        if self._removed:
            return True
        return await self._finish_stop()

    async def _finish_stop(self) -> bool:
        """`on_stopped` once every step has reported; a removal then clears the job. A failed
        finish is retried on one timer, 1 s doubling to 60 s."""
        removing = self._state.status is JobStatus.REMOVING
        try:
            await self._sweep_stop()
            if self.window.in_flight():
                return True  # their reports finish it
            await self._save()
            if not self._stopped_hook_ran:
                # Once per execution: a finish retried after a later part failed skips it.
                await self._job.on_stopped()
                self._stopped_hook_ran = True
            if removing:
                await stopping.remove_records(self.storage, self.job_id)
                self._removed = True
            else:
                await self._save(stop_finalized=True)
        except Exception as error:
            what = "removal" if removing else "stop"
            log.warning("job %s: finishing the %s failed: %s", self.job_id, what, error)
            self._timers.arm("finish")
            return False
        self._timers.clear("finish")
        self._request_exit()
        return True

    async def _sweep_stop(self) -> None:
        """What a stop still waits for, checked against the hosts and storage in one fenced
        read: an active step whose outcome storage holds counts it; one that runs on no live
        host (its host died, before or after the stop) is stored STOPPED, as its host would
        have, and counted; a step storage holds RUNNING that runs nowhere is stored STOPPED
        too; one a live host runs though this activation had not told it (a start whose
        answer was lost, a dedicated actor of an earlier activation) is active again and told
        to stop. Steps whose start is unanswered wait for their answer."""
        stage = self._state.stage
        async with self._fenced() as host_of:
            rows = await stored_running(self.storage, self.job_id, stage, host_of)
            await self._settle_stored(self._settleable(stage))
        lost = [
            start
            for step_id, (start, _host) in self.window.active(*RUNNING).items()
            if step_id not in host_of
        ]
        lost += [
            StepStart(row.step_id, row.type, row.stage, row.attempt, row.request_json)
            for row in rows
            if row.step_id not in host_of and not self.window.is_in_flight(row.step_id)
        ]
        if lost:
            await self._store_stops(lost)
        before = self.window.hosts()
        self._adopt([row for row in rows if not self.window.is_in_flight(row.step_id)], host_of)
        if told := self.window.hosts() - before:
            await self.hosts.cancel(told, self.job_id, self._state.status is JobStatus.REMOVING)

    async def _store_stops(self, starts: list[StepStart]) -> None:
        """Steps of a stopping job that will never report their stop (their host is gone):
        stored STOPPED here, as their host would have, then counted."""
        for start in starts:
            if not self.window.is_in_flight(start.step_id):
                self.window.adopt(start, "")
        stops = [Outcome(s.step_id, s.attempt, StepStatus.STOPPED) for s in starts]
        await self._store_outcomes(stops)
        for outcome in stops:
            self.accept(outcome)

    # -- resume, recover, retry-failed --------------------------------------------------------

    async def resume(self, explicit: bool = True) -> None:
        await self.ready()
        async with self.turns.turn("resume"):
            await self._resume(explicit)

    async def recover(self) -> None:
        """What rehydration does to this job: resume it, or finish its stop; never both."""
        await self.ready()
        await self._recover()

    async def _recover(self) -> None:
        async with self.turns.turn("recover"):
            action = resuming.recover_action(self._state)
            if action is Recover.FINISH_STOP and not self.live:
                await self._tell_stop_again()
            elif action is Recover.RESUME:
                await self._resume(explicit=False)

    async def _resume(self, explicit: bool) -> None:
        state = self._state
        action = resuming.resume_action(state, explicit, self.live)
        if action is Resume.NOTHING:
            return
        if action is Resume.MISSING_PLAN:
            message = "the job was interrupted before its step plan was stored"
            # A plan cut short while it was written is no plan: its records go, never run.
            await self._clear_partial_plan()
            if state.status is not JobStatus.FAILED:
                await self._finish_with(
                    JobStatus.FAILED, message, str(CannotResumeJobError.MISSING_STEP_PLAN)
                )
            raise JobOperationError(CannotResumeJobError.MISSING_STEP_PLAN, message)
        # Every read before the first change: a failed read leaves the activation as it was.
        async with self._fenced() as host_of:
            counts = await self.storage.count_by_status(self.job_id)
            running = await stored_running(self.storage, self.job_id, state.stage, host_of)
            stopped = self.counting.stopped
            stored = (
                await stored_among(self.storage, self.job_id, state.stage, stopped)
                if stopped
                else set()
            )
        # The counts the resume saves; the activation goes back to them when the save fails.
        stages, counting = copy.deepcopy(self.stages), copy.deepcopy(self.counting)
        self.stages.recount(counts)
        # A stop counted for a step that has since reached its outcome (a take-back lost with
        # an activation before it was saved) is taken back now.
        for step_id in [s for s in self.counting.stopped if s not in stored]:
            self.counting.take_back_stop(step_id)
        resuming.rebase_stops(self.stages, len(self.counting.stopped), state.stage)
        self.counting.records = True
        self.state = state.model_copy(
            update={"records_counted_steps": True, "stop_finalized": False}
        )
        try:
            await self._set_status(JobStatus.RUNNING)
        except Exception:
            # Nothing of the resume applies: steps still winding down stay active here.
            self.state, self.stages, self.counting = state, stages, counting
            raise
        self.window.clear()
        # Steps still running on a live host are this activation's again before the hook runs:
        # their reports count (the fence kept their outcomes out of the recount), and a stop
        # while the hook is owed reaches them.
        # The others start once the resume hook succeeded; until then they are the stage's
        # never-started steps (a stop counts them as stopped).
        self._plan = {state.stage: self._adopt(running, host_of)}
        self.feed = Feed(state.stage, skip={row.step_id for row in running})
        self.live = True
        self.exit = None
        self._completed_hook_ran = False
        await self._run_resume_hook()

    async def _run_resume_hook(self) -> None:
        try:
            await self._job.on_before_resuming_job_steps()
        except Exception as error:
            log.warning("job %s: on_before_resuming_job_steps failed: %s", self.job_id, error)
            self.hook_owed = True
            self.hook_backoff.failed()
            return
        self.hook_owed = False
        self.hook_backoff.succeeded()
        stage = self._state.stage
        if stage not in self.stages.counters:
            stage = self.stages.first()
        await self._begin_stage(stage)
        self._kick()

    async def retry_failed_steps(self) -> int:
        await self.ready()
        async with self.turns.turn("retry failed steps"):
            state = self._state
            resuming.check_retry_failed(self._job, self.stages, state)
            failed = [
                StepStart(s.step_id, s.type, s.stage, s.attempt + 1, json.dumps(s.request))
                async for page in step_pages(self.storage, self.job_id, statuses=FAILED_STEP)
                for s in page
            ]
            # Retrying a counted failure removes its failed count: the counts change with the
            # RUNNING save, and go back when it fails.
            for start in failed:
                self.stages[start.stage].failed -= 1
            try:
                self.state = state.model_copy(update={"records_counted_steps": True})
                await self._set_status(JobStatus.RUNNING)
            except Exception as error:
                for start in failed:
                    self.stages[start.stage].failed += 1
                self.state = state
                raise JobOperationError(
                    RetryFailedStepsError.COULD_NOT_PERSIST, str(error)
                ) from error
            self.exit = None
            self._completed_hook_ran = False
            self.counting.records = True
            for start in failed:
                self.counting.uncount_outcome(start.step_id)
            try:
                # Durable before they run: a lost activation resumes them as scheduled.
                await self.counting.flush(self.storage, self.job_id)
                scheduled = StatusChange(status=StepStatus.SCHEDULED)
                await self.storage.update_steps(
                    [
                        StepUpdate(
                            self.job_id, s.step_id, StepStatus.SCHEDULED, s.attempt, None, scheduled
                        )
                        for s in failed
                    ]
                )
            except Exception as error:
                # The job is RUNNING with its failed steps stored as failed: the pump recounts
                # from storage and completes it again.
                self.live = True
                self._kick()
                raise JobOperationError(
                    RetryFailedStepsError.COULD_NOT_PERSIST, str(error)
                ) from error
            self.live = True
            # They are the whole stage now: nothing is read from storage (where they are
            # SCHEDULED again) on top of them.
            self.feed = None
            self.window.queue(failed)
            self._kick()
            return len(failed)

    # -- the watchdog -------------------------------------------------------------------------

    async def watchdog_tick(self) -> None:
        """One tick, once the activation serves (a tick asked for while it loads or recovers
        waits for that; one of an activation with no job to serve does nothing)."""
        with contextlib.suppress(Exception):  # the calls get the load's error
            await self.ready()
        if self.mode is not Mode.SERVING:
            return
        async with self.turns.turn("watchdog"):
            await self._tick()

    async def _tick(self) -> None:
        self.ticks += 1
        if self.state is None:
            return
        if self._unanswered_saves:
            await self._reconcile()
        state = self._state
        if state.status.is_preparing and state.has_plan and not self.live:
            # Startup was interrupted after its plan was stored: it finishes through resume.
            await self._resume(explicit=False)
            return
        if stopping.stop_owed(state) and not self.live:
            # A stop is final once every step reported it: lost reports are settled here too,
            # and a finish that failed waits for its own timer.
            if self.window.in_flight():
                await self._settle_lost_reports(state.stage)
                await self._stop_lost_owners()
                if not self._timers.armed("finish"):
                    await self._finish_stop_when_reported()
            return
        if state.status is not JobStatus.RUNNING:
            return
        if self.hook_owed:
            if not self.hook_backoff.should_try():
                return
            await self._run_resume_hook()
            if self.hook_owed:
                return
        if not self.live:
            return
        stage = self._state.stage
        if self._idle() and await stage_done_in_storage(self.storage, self.job_id, stage):
            # Every step of the stage is done in storage: recount from storage and move on (the
            # recount reads every record of the job, so only then).
            self.stages.recount(await self.storage.count_by_status(self.job_id))
            await self._stage_done(stage)
            return
        await self._settle_lost_reports(stage)
        await self._retry_failed_starts()
        lease = self.options.lease_seconds
        if lease is not None:
            # The spec's override point: the job type says which owners are alive.
            silos = await asyncio.to_thread(self._job.get_active_silos)
            # A step whose start is unanswered has, in storage, the record of its last run.
            stale = await leases.expired(
                self.storage,
                self.hosts,
                silos,
                self.job_id,
                stage,
                self._settleable(stage),
                lease,
                self.window.active(RunState.OWNER_LOST).keys(),
            )
            self.tally.restarted_by_lease += len(stale)
            self.window.queue(stale, front=True)
        if self.awaiting_admission is not None:
            await self._begin_stage(self.awaiting_admission)
        elif self._idle():
            await self._restart_orphans(stage)
        await self.hosts.refresh()
        self._kick()

    async def _settle_lost_reports(self, stage: int) -> None:
        """Active steps whose outcome storage holds but whose report never arrived (steps whose
        start operation is unanswered have nothing stored yet, and wait)."""
        await self._settle_stored(self._settleable(stage))

    def _settleable(self, stage: int) -> dict[str, tuple[StepStart, str]]:
        """The stage's active steps that may have an outcome stored (a step whose start
        operation is unanswered has nothing stored yet)."""
        return {
            step_id: entry
            for step_id, entry in self.window.active(*RUNNING).items()
            if entry[0].stage == stage
        }

    async def _settle_stored(self, active: dict[str, tuple[StepStart, str]]) -> None:
        if not active:
            return
        for outcome in await lost_reports(self.storage, self.job_id, active):
            log.info("job %s: settling the lost report of step %s", self.job_id, outcome.step_id,
                     extra=ids(self.job_id, outcome.step_id))  # fmt: skip
            self.accept(outcome)

    async def _restart_orphans(self, stage: int) -> None:
        """Nothing runs here, yet storage holds unfinished steps of the stage (an answer or a
        report was lost across a reactivation): those running nowhere start again."""
        self.window.queue(await self._adopt_stage(stage))
        await self._refill()
        if self.window.count(RunState.QUEUED):
            log.warning(
                "job %s: unfinished steps of stage %s run nowhere; starting them (%d read so far)",
                self.job_id,
                stage,
                self.window.count(RunState.QUEUED),
            )

    # -- persistence --------------------------------------------------------------------------

    @property
    def _state(self) -> JobState:
        assert self.state is not None
        return self.state

    @property
    def _job(self) -> Job[Any]:
        assert self.job is not None
        return self.job

    @property
    def _labels(self) -> Labels:
        assert self.labels is not None
        return self.labels

    async def _set_status(
        self,
        status: JobStatus,
        *messages: str,
        error: str | None = None,
        stop_finalized: bool | None = None,
    ) -> None:
        check_transition(self.job_id, self._state.status, status)
        update: dict[str, Any] = {}
        if error is not None:
            update["error"] = error
        if stop_finalized is not None:
            update["stop_finalized"] = stop_finalized
        await self._save((status, messages), **update)

    async def _save(
        self, change: tuple[JobStatus, tuple[str, ...]] | None = None, **update: Any
    ) -> None:
        """Saves the record with the current progress, counted records first. The in-memory
        state changes only once the save succeeded."""
        state = self._state if change is None else self._state.with_status(change[0], *change[1])
        await self.counting.flush(self.storage, self.job_id)
        record = state.model_copy(update={"progress": self.stages.progress(), **update})
        try:
            self.state = await self._save_job(record)
        except ConcurrencyError:
            # The record moved on by as many versions as this activation's saves whose answer
            # was lost (they may have been written): those were its own, and its state wins.
            # Any other move is another writer's, and the save fails.
            stored = await self.storage.get_job(self.job_id)
            if stored is None or not 0 < stored.version - record.version <= self._unanswered_saves:
                raise
            log.warning("job %s: saving over its own unacknowledged save", self.job_id)
            self.state = await self._save_job(record.model_copy(update={"version": stored.version}))
        self._dirty = False

    async def _save_job(self, record: JobState) -> JobState:
        try:
            saved = await self.storage.save_job(record)
        except ConcurrencyError:
            raise
        except Exception:
            written = await self._written_anyway(record)
            if written is None:
                self._unanswered_saves += 1  # it may have been written all the same
                raise
            saved = written
        self._unanswered_saves = 0
        return saved

    async def _written_anyway(self, record: JobState) -> JobState | None:
        """The stored record, when a save that failed without an answer was written after all
        (read back once); None when that cannot be known now."""
        try:
            stored = await self.storage.get_job(self.job_id)
        except Exception as error:
            # The save's own error is raised; the watchdog reconciles once storage answers.
            log.warning(
                "job %s: reading back a save without an answer failed: %s", self.job_id, error
            )
            return None
        if stored is None or stored.version != record.version + 1 or _gist(stored) != _gist(record):
            return None
        log.warning("job %s: a save whose answer was lost was written", self.job_id)
        return stored

    async def _reconcile(self) -> None:
        """After saves whose answer was lost: a stop or removal storage holds though its caller
        got an error (it was this activation's own write) is carried out, as storage says."""
        stored = await self.storage.get_job(self.job_id)
        state = self._state
        if stored is None or not 0 < stored.version - state.version <= self._unanswered_saves:
            return
        self._unanswered_saves = 0
        if stored.status is state.status or not stopping.stop_owed(stored):
            # The next save writes this activation's state over its own write.
            self.state = state.model_copy(update={"version": stored.version})
            return
        log.warning("job %s: its %s was stored after all", self.job_id, stored.status)
        self.state = stored
        await self._halt_and_tell(removing=stored.status is JobStatus.REMOVING)

    @property
    def unsaved(self) -> bool:
        """Progress counted since the last save (the next progress save writes it)."""
        return self._dirty or self.counting.unsaved

    async def _save_progress(self) -> None:
        async with self.turns.turn("save progress"):
            state = self.state
            if state is None or state.status.is_terminal:
                return
            if not self.unsaved:
                return
            await self._save()


def _gist(state: JobState) -> tuple[object, ...]:
    """What a save changes, compared without timestamps (providers round them)."""
    return (state.status, len(state.status_changes), state.stage, state.progress,
            state.stop_finalized, state.error)  # fmt: skip


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
