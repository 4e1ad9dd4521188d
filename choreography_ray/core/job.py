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
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from choreography_ray.core import (
    dispatch,
    host_watch,
    job_record,
    plan_writer,
    resume_flow,
    settling,
    stage_flow,
    stop_flow,
    stopping,
    tick,
)
from choreography_ray.core.counting import Counting
from choreography_ray.core.hosts import Hosts
from choreography_ray.core.messages import Outcome, StepStart
from choreography_ray.core.metrics import NO_METRICS, BatchKind, Histogram, Labels, Metrics, Tally
from choreography_ray.core.mode import DRIVING, EXITS, SERVING, Exit, Mode, check_mode
from choreography_ray.core.placement import Placement
from choreography_ray.core.planning import Feed, feed_page
from choreography_ray.core.retries import STANDARD
from choreography_ray.core.sharing import Share
from choreography_ray.core.stages import Stages
from choreography_ray.core.timers import Timers
from choreography_ray.core.turns import Supervisor, Turns
from choreography_ray.core.watchdog import HookBackoff
from choreography_ray.core.window import Window
from choreography_ray.errors import (
    JobOperationError,
    ReportAgainError,
    ResumeJobError,
    StartJobError,
)
from choreography_ray.job import Job
from choreography_ray.logs import get_logger
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage
from choreography_ray.types import import_type

log = get_logger(__name__)

#: The turns of the operations a caller waits on: those that can take a job out of rest again,
#: and a stop or removal (its caller would get a Ray error from an actor that exits).
CALLED = ("start: prepare", "stop", "remove", "resume", "recover", "retry failed steps")


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
        #: What the activation does now (`mode.py`): calls and background turns are served only
        #: once it has loaded (and, after a restart, recovered).
        self.mode = Mode.LOADING
        self.state: JobState | None = None
        self.job: Job[Any] | None = None
        self.stages = Stages([])
        self.window = Window(options)
        self.counting = Counting()
        self.hook_backoff = HookBackoff()
        #: The stage that waits for `admit_stage` (in AWAITING_ADMISSION).
        self.admission_stage = 0
        self.ticks = 0
        #: The rest of the running stage, read from storage a page at a time.
        self.feed: Feed | None = None
        self.page = feed_page(options.plan_chunk_size)
        #: This activation's epoch (`job_record.take_epoch`): every start and every read of the
        #: hosts carries it; 0 until taken.
        self.epoch = 0
        self.dirty = False
        self.placements: dict[str, Placement] = {}  # step type path -> where its steps run
        #: Per host, the incarnation this activation watches (the last one that answered).
        self.incarnations: dict[str, str | None] = {}
        self.timers = Timers(self.kick)
        #: The terminal status decided, with its message and error (in OWES_STATUS).
        self.owed: tuple[JobStatus, str | None, str | None] | None = None
        #: Saves in a row that failed without an answer: each may have been written.
        self.unanswered_saves = 0
        self.first_stage_failed = 0
        self._wake = asyncio.Event()
        self._loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._begun = False
        #: Warmed up ahead of its job (`warm`): it knows the hosts already, and reads them
        #: again once its start's first wave has answered.
        self._warm = False

    # -- activation ---------------------------------------------------------------------------

    async def warm(self, job_types: Collection[str]) -> None:
        """A spare's work ahead of its job, none of it an activation: storage reached (its
        record, absent yet, read), `job_types` imported (its manager's latest), the first
        hosts reached. What fails is left to the activation, which does it again."""
        for path in job_types:
            try:
                import_type(path, self.options.allowed_type_prefixes)
            except Exception as error:
                log.warning("job %s: importing %s ahead failed: %s", self.job_id, path, error)
        try:
            await self.storage.get_job(self.job_id)
            await self.hosts.warm()
        except Exception as error:
            log.warning("job %s: warming up ahead of the job failed: %s", self.job_id, error)
        else:
            self._warm = True

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
                await job_record.load(self)
                if self.state is not None and not stopping.settled(self.state):
                    await job_record.take_epoch(self)
        except Exception as error:
            # Calls get the error; the actor goes (rehydration or reconciliation brings a job
            # that can still run back).
            self.enter(Mode.UNLOADED)
            self._loaded.set_exception(error)
            self._loaded.exception()  # retrieved: the calls that wait see it
            return
        state = self.state
        if state is None:
            self.enter(Mode.AT_REST)  # no job: nothing to serve
            self._loaded.set_result(None)
            return
        if not self._warm:
            # (A spare's node table, at most minutes old, places the first steps: `start`.)
            await self.refresh_hosts()
        if stopping.settled(state):
            # Activated for an operation on a job at rest: it answers, and the actor goes
            # unless the operation reopened the job.
            self.enter(Mode.AT_REST)
        elif reconstructed:
            # A restarted actor carries on from storage (that is reactivation) before it serves
            # anything: a report served first would find none of its running steps.
            self.enter(Mode.RECOVERING)
            await self.until_done("recover on reactivation", self._recover)
        if self.mode in (Mode.LOADING, Mode.RECOVERING):
            self.enter(Mode.IDLE)
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

    def enter(self, mode: Mode) -> None:
        """Goes to `mode` (`mode.py`'s table); the actor is asked to exit when it comes to
        rest."""
        old, self.mode = self.mode, check_mode(self.job_id, self.mode, mode)
        if mode in EXITS and old not in EXITS:
            self.on_exit()

    @property
    def exit(self) -> Exit | None:
        """Why the actor is to exit; None while the activation has a job to serve."""
        return EXITS.get(self.mode)

    @property
    def live(self) -> bool:
        """This activation drives the job: it may start steps."""
        return self.mode in DRIVING

    @property
    def awaiting_admission(self) -> int | None:
        """The stage that waits for `admit_stage`, if one does."""
        return self.admission_stage if self.mode is Mode.AWAITING_ADMISSION else None

    async def refresh_hosts(self) -> None:
        try:
            await self.hosts.refresh()
        except Exception:  # placing the first steps reads the node table again
            log.exception("job %s: reading the step hosts failed", self.job_id)

    async def until_done(self, what: str, attempt: Callable[[], Awaitable[object]]) -> None:
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

    async def ready(self) -> JobState:
        """The state, once loaded: a read-only query, beside turns."""
        self.begin()
        await asyncio.shield(self._loaded)
        if self.state is None:
            raise JobOperationError(ResumeJobError.UNKNOWN, f"job {self.job_id} does not exist")
        return self.state

    def _record_metrics(self) -> None:
        if self.labels is not None:
            self.tally.record(self.metrics, self.labels)

    def close(self) -> None:
        self.tasks.cancel_all()

    @property
    def caller_waiting(self) -> bool:
        """Whether an operation a caller waits on waits for its turn (the exit gives way to it;
        reports, ticks and saves keep coming, and nobody waits for their answer)."""
        return any(self.turns.waiting[name] for name in CALLED)

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> StartJobError | None:
        """Prepares the plan, begins the first stage, then saves RUNNING once the first wave of
        start operations has answered: three turns, so reports are served in between."""
        await self.ready()
        try:
            async with self.turns.turn("start: prepare"):
                error = await plan_writer.prepare(self)
                if error is not None:
                    return error
            async with self.turns.turn("start: first stage"):
                wave = await stage_flow.begin_first_stage(self)
            if wave is None:
                return None  # stopped or removed while it prepared: nothing starts
            answers = await asyncio.gather(*wave)
            async with self.turns.turn("start: running"):
                return await stage_flow.first_wave_answered(self, answers)
        finally:
            if self._warm:
                # A spare's node table placed the first steps; it is read again now, not
                # beside the start's own turns (a small job is done by now).
                self._warm = False
                self.tasks.spawn("refresh hosts", self.refresh_hosts())

    # -- the pump, start operations, host watches ---------------------------------------------

    def kick(self) -> None:
        self._wake.set()

    async def _next_kick(self) -> None:
        await self._wake.wait()
        self._wake.clear()

    async def _pump(self) -> None:
        async with self.turns.turn("pump"):
            await tick.reconcile(self, look=False)

    def send(self, host: str, batch: list[StepStart]) -> asyncio.Future[bool]:
        """The start operation as a command: its answer comes back as a turn."""
        self.window.started(batch, host)
        labels = self.metric_labels
        self.metrics.observe(Histogram.BATCH_SIZE, len(batch), labels, BatchKind.START)
        answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def send() -> None:
            error: Exception | None = None
            incarnation = None
            try:
                incarnation = await self.hosts.start(
                    host, self.job_id, batch, labels, self.epoch, self.share
                )
            except Exception as failure:
                error = failure
            try:
                async with self.turns.turn(f"start answered by {host}"):
                    await dispatch.answered(self, host, batch, error, incarnation)
            finally:
                if not answered.done():
                    answered.set_result(error is None)

        self.tasks.spawn(f"start {len(batch)} steps on {host}", send())
        return answered

    def watch(self, host: str, incarnation: str | None) -> None:
        """Learns that this incarnation of a host is gone (it died, or restarted) from its
        watch call ending; a watch that fails without telling is asked again (None: whatever
        incarnation runs now, for a host found running the job's steps)."""
        if host in self.incarnations and incarnation in (None, self.incarnations[host]):
            return
        self.incarnations[host] = incarnation

        async def gone() -> None:
            async with self.turns.turn(f"host {host} gone"):
                if host not in self.incarnations or self.incarnations[host] != incarnation:
                    # Handled already, or a later incarnation answered since: its answer
                    # handled the loss.
                    return
                await host_watch.host_lost(self, host)
                del self.incarnations[host]
                await self.refresh_hosts()

        async def watch() -> None:
            await host_watch.until_gone(self, host, incarnation)
            await self.until_done(f"handling the loss of host {host}", gone)
            self.kick()

        self.tasks.spawn(f"watch {host}", watch())

    def lose_later(self, host: str, step_ids: set[str]) -> None:
        """Handles the loss of these steps of an incarnation of `host` that is gone, in a
        turn, until it succeeds: a loss that failed in the turn that learned it."""

        async def lose() -> None:
            async with self.turns.turn(f"steps lost by host {host}"):
                await host_watch.host_lost(self, host, step_ids)

        async def again() -> None:
            await self.until_done(f"handling the steps lost by host {host}", lose)
            self.kick()

        self.tasks.spawn(f"steps lost by host {host}", again())

    # -- outcomes -----------------------------------------------------------------------------

    async def report_outcomes(self, outcomes: list[Outcome]) -> None:
        await self.ready()
        async with self.turns.turn("report"):
            self.metrics.observe(
                Histogram.BATCH_SIZE, len(outcomes), self.metric_labels, BatchKind.OUTCOMES
            )
            for outcome in outcomes:
                settling.accept(self, outcome)
            finished = await stop_flow.finish_stop_when_reported(self)
            if not finished and self.job_state.status is JobStatus.REMOVING:
                # The step's next report runs the finish again (the timer also retries it).
                raise ReportAgainError(
                    f"finishing the removal of job {self.job_id} failed; report again"
                )
        self.kick()

    # -- stop and remove ----------------------------------------------------------------------

    async def stop(self) -> None:
        await self.ready()
        async with self.turns.turn("stop"):
            await stop_flow.stop(self)

    async def remove(self) -> None:
        await self.ready()
        async with self.turns.turn("remove"):
            await stop_flow.remove(self)

    # -- resume, recover, retry-failed --------------------------------------------------------

    async def resume(self, explicit: bool = True) -> None:
        await self.ready()
        async with self.turns.turn("resume"):
            await resume_flow.resume(self, explicit)

    async def recover(self) -> None:
        """What rehydration does to this job: resume it, or finish its stop; never both."""
        await self.ready()
        await self._recover()

    async def _recover(self) -> None:
        async with self.turns.turn("recover"):
            await resume_flow.recover(self)

    async def retry_failed_steps(
        self, signature: str | None = None, step_ids: Collection[str] | None = None
    ) -> int:
        await self.ready()
        async with self.turns.turn("retry failed steps"):
            return await resume_flow.retry_failed(self, signature, step_ids)

    # -- the watchdog -------------------------------------------------------------------------

    async def watchdog_tick(self) -> None:
        """One tick, once the activation serves (a tick asked for while it loads or recovers
        waits for that; one of an activation with no job to serve does nothing)."""
        with contextlib.suppress(Exception):  # the calls get the load's error
            await self.ready()
        if self.mode not in SERVING:
            return
        async with self.turns.turn("watchdog"):
            await tick.reconcile(self, look=True)

    # -- persistence --------------------------------------------------------------------------

    @property
    def job_state(self) -> JobState:
        assert self.state is not None
        return self.state

    @property
    def loaded_job(self) -> Job[Any]:
        assert self.job is not None
        return self.job

    @property
    def share(self) -> Share:
        """What orders this job's steps where they wait for capacity (`core.sharing`)."""
        key = self.job_state.share_key
        return Share(self.job_state.priority, key, self.options.fairness_weight(key))

    @property
    def metric_labels(self) -> Labels:
        assert self.labels is not None
        return self.labels

    @property
    def unsaved(self) -> bool:
        """Progress counted since the last save (the next progress save writes it)."""
        return self.dirty or self.counting.unsaved

    async def _save_progress(self) -> None:
        async with self.turns.turn("save progress"):
            if self.state is not None and not self.state.status.is_terminal and self.unsaved:
                await job_record.save(self)
