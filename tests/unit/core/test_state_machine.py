"""A Hypothesis state machine over one job activation: random sequences of start, outcomes
(normal, duplicate, lost, late), stop, resume, recover, reactivation, remove, retry-failed, a
dead host, a failing start operation and watchdog ticks, on small jobs, with the counting,
hook and progress invariants checked after every step.

What storage holds for a job, precisely (per stage): a succeeded step's record is deleted, so
`total - stored records` succeeded; stored FAILED and COMPLETED_WITH_FAILURE records failed;
stored UNREACHABLE records are unreachable; stored SCHEDULED, RUNNING, STOPPED and REMOVING
records are unfinished. The job's saved progress must equal that where the job has settled:
COMPLETED_* (no unfinished record, nothing stopped) and STOPPED with its stop final (every
unfinished record of a started stage counted as stopped; a stage never started counts nothing
but its unreachable steps).

Every rule runs its coroutine on one event loop the machine keeps, then lets the loop settle
(`harness.settle`): every turn it set off has run. The core's standard backoff is zero here, so
a timer (start retry, admission, finish) is due at once and settling runs it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from choreography_ray.core.messages import Outcome
from choreography_ray.core.mode import STOPPING, Mode
from choreography_ray.core.retries import Backoff
from choreography_ray.core.stopping import stop_owed
from choreography_ray.core.window import WAITING, RunState
from choreography_ray.errors import JobOperationError, StartJobError, StorageError
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import CountedKind
from tests.unit.core import jobs
from tests.unit.core.fakes import FAILED, STOPPED, SUCCESS, FaultyStorage, Run
from tests.unit.core.harness import Harness, create, settle
from tests.unit.core.jobs import ContinuingJob, Plan, RetryableJob, StagedJob

pytestmark = pytest.mark.timeout(300)

#: The standard backoff while the machine runs: every timer due at once.
NO_WAIT = Backoff(0.0, 0.0)

OUTCOMES = st.sampled_from([SUCCESS, FAILED, StepStatus.COMPLETED_WITH_FAILURE])
#: How a report travels: once, twice (a duplicate), or never (lost after its write).
DELIVERIES = st.sampled_from([1, 2, 0])

SETTLED_STOP = (JobStatus.STOPPED, True)

#: Statuses a move to RUNNING from opens a new execution of the job.
REOPENED = (JobStatus.STOPPED, JobStatus.FAILED, JobStatus.COMPLETED_WITH_FAILURES)

#: Stored statuses of a step with no outcome yet (the module docstring's definition, kept here
#: rather than read from the core under test).
UNFINISHED = (StepStatus.SCHEDULED, StepStatus.RUNNING, StepStatus.STOPPED, StepStatus.REMOVING)

#: Storage calls the storage-fault machine may make fail.
STORAGE_FAULTS = (
    "save_job",
    "update_steps",
    "delete_steps",
    "count_by_status",
    "has_steps",
    "get_steps",
    "list_steps",
    "add_counted",
    "remove_counted",
    "remove_job_steps",
)

#: Hooks a job may be told to raise once (ConnectionError): each is retried, or fails the job.
HOOK_FAULTS = ("admit_stage", "on_before_resuming_job_steps", "on_completed", "on_stopped")


class JobMachine(RuleBasedStateMachine):
    """One job, from creation to its end (or removal)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self._patched: list[tuple[ModuleType, Any]] = []
        for name, module in list(sys.modules.items()):
            if name.startswith("choreography_ray.core.") and hasattr(module, "STANDARD"):
                self._patched.append((module, getattr(module, "STANDARD")))  # noqa: B009
                setattr(module, "STANDARD", NO_WAIT)  # noqa: B010
        self.h: Harness | None = None
        #: Reports delivered (for duplicates) and lost (for late deliveries), each with the
        #: execution it belongs to.
        self.delivered: list[tuple[int, Outcome]] = []
        self.lost: list[tuple[int, Outcome]] = []
        self.execution = 0
        #: Hook calls at the start of the current execution (on_completed) and of the
        #: current stop or removal (on_stopped).
        self.completed_before = 0
        self.stopped_before = 0
        self.errors: Counter[str] = Counter()

    def teardown(self) -> None:
        try:
            if self.h is not None:
                self.h.close()
                jobs.forget(self.h.job_id)
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            self.loop.close()
            for module, original in self._patched:
                setattr(module, "STANDARD", original)  # noqa: B010

    # -- running on the machine's loop ----------------------------------------------------------

    def run(self, coro: Any) -> Any:
        async def then_settle() -> Any:
            result = await coro
            assert await settle(limit=5_000), "the activation never settles: something spins"
            return result

        return self.loop.run_until_complete(asyncio.wait_for(then_settle(), 30))

    #: What an operation may raise besides the spec's refusals (storage faults may add some).
    operation_errors: tuple[type[Exception], ...] = (JobOperationError,)

    def operate(self, coro: Any) -> Any:
        """An operation the job may refuse with one of the spec's errors."""
        try:
            return self.run(coro)
        except self.operation_errors as error:
            code = error.error if isinstance(error, JobOperationError) else type(error).__name__
            self.errors[str(code)] += 1
            return error

    @property
    def removed(self) -> bool:
        return self.h is not None and self.h.job_id not in self.h.storage.jobs

    @property
    def harness(self) -> Harness:
        assert self.h is not None
        return self.h

    def stored_status(self) -> tuple[JobStatus, bool] | None:
        state = self.harness.storage.jobs.get(self.harness.job_id)
        return None if state is None else (state.status, state.stop_finalized)

    # -- the job --------------------------------------------------------------------------------

    @initialize(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(lambda s: sum(s) <= 8),
        attempts=st.integers(1, 2),
        window=st.sampled_from([None, 1, 2]),
        continuing=st.booleans(),
        missing=st.sets(st.integers(0, 7), max_size=2),
        first_start_fails=st.booleans(),
        hooks_fail=st.sets(st.sampled_from(HOOK_FAULTS)),
    )
    def start_job(
        self,
        sizes: list[int],
        attempts: int,
        window: int | None,
        continuing: bool,
        missing: set[int],
        first_start_fails: bool,
        hooks_fail: set[str],
    ) -> None:
        """A job of 1-3 stages and 1-8 steps (a stage a barrier or not; some steps' types
        cannot be imported), created and started; its first start operation may throw and
        each of `hooks_fail` raises once. A job with no stages may retry its failed steps."""
        job_type = RetryableJob if len(sizes) == 1 else ContinuingJob if continuing else StagedJob
        plan = Plan(sizes=sizes, missing=sorted(n for n in missing if n < sum(sizes)))
        self.h = self.loop.run_until_complete(
            self.created(
                job_type=job_type,
                request=plan,
                max_step_attempts=attempts,
                max_active_steps_per_job=window,
                step_batch_size=2,
                max_concurrent_step_starts=3,
            )
        )
        for hook in hooks_fail:
            self.harness.control(hook, raises=1, error=ConnectionError)
        self.harness.hosts.fail_starts = int(first_start_fails)
        error = self.run(self.harness.c.start())
        if not (first_start_fails or plan.missing):
            assert error is None, error
        else:
            failed = (
                None,
                StartJobError.FAILED_STARTING_ALL_JOB_STEPS,
                StartJobError.FAILED_STARTING_SOME_JOB_STEPS,
            )
            assert error in failed, error

    def created(self, **options: Any) -> Any:
        """The coroutine that creates and activates the job (a subclass picks the storage)."""
        return create(**options)

    # -- rules ----------------------------------------------------------------------------------

    @rule()
    def start_again(self) -> None:
        error = self.operate(self.harness.c.start())
        assert error is StartJobError.JOB_ALREADY_EXISTS or self.removed, error

    def runs(self) -> list[Run]:
        return sorted(self.harness.hosts.running_steps(), key=lambda r: (r.start.step_id, r.host))

    @precondition(lambda self: not self.removed and bool(self.harness.hosts.running_steps()))
    @rule(data=st.data(), status=OUTCOMES, deliver=DELIVERIES)
    def step_ends(self, data: st.DataObject, status: StepStatus, deliver: int) -> None:
        self.finish(data.draw(st.sampled_from(self.runs())), status, deliver)

    @precondition(lambda self: not self.removed and bool(self.harness.hosts.running_steps()))
    @rule(data=st.data())
    def running_steps_end(self, data: st.DataObject) -> None:
        """Every step running now ends, each its own way."""
        for run in self.runs():
            status = STOPPED if run.cancelled else data.draw(OUTCOMES)
            self.finish(run, status, data.draw(DELIVERIES))

    @precondition(
        lambda self: (
            not self.removed and any(r.cancelled for r in self.harness.hosts.running_steps())
        )
    )
    @rule(data=st.data(), deliver=DELIVERIES)
    def step_honours_its_stop(self, data: st.DataObject, deliver: int) -> None:
        run = data.draw(st.sampled_from([r for r in self.runs() if r.cancelled]))
        self.finish(run, STOPPED, deliver)

    def finish(self, run: Run, status: StepStatus, deliver: int) -> None:
        hosts = self.harness.hosts
        before = len(hosts.reports)
        message = None if status is SUCCESS else "failed on purpose"
        outcome = self.run(
            hosts.finish(run.start.step_id, status, message, deliver=deliver, host=run.host)
        )
        (self.delivered if deliver else self.lost).append((self.execution, outcome))
        self.redeliver_refused(before)

    @precondition(lambda self: not self.removed and bool(self.delivered))
    @rule(data=st.data())
    def duplicate_report(self, data: st.DataObject) -> None:
        self.report(data.draw(st.sampled_from(self.delivered))[1])

    @precondition(lambda self: not self.removed and bool(self.lost))
    @rule(data=st.data())
    def late_report(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.lost))
        self.lost.remove(entry)
        self.delivered.append(entry)
        self.report(entry[1])

    def report(self, outcome: Outcome) -> None:
        hosts = self.harness.hosts
        before = len(hosts.reports)
        self.run(hosts.report(outcome))
        self.redeliver_refused(before)

    def redeliver_refused(self, since: int) -> None:
        """A report the job answered with an error (a removal whose finish failed: a hook
        fault) is delivered again, as a real host does; a second refusal is a bug here, where
        each hook fails at most once."""
        hosts = self.harness.hosts
        refused = [outcomes for outcomes, error in hosts.reports[since:] if error is not None]
        for outcomes in refused:
            again = len(hosts.reports)
            self.run(hosts.report(*outcomes))
            errors = [error for _, error in hosts.reports[again:] if error is not None]
            assert not errors, f"the job refused a report twice: {errors!r}"

    @precondition(lambda self: not self.removed)
    @rule()
    def stop(self) -> None:
        before = self.harness.calls["on_stopped:ok"]
        if not isinstance(self.operate(self.harness.c.stop()), Exception):
            self.stopped_before = before

    @precondition(lambda self: not self.removed)
    @rule()
    def resume(self) -> None:
        self.reopening(self.harness.c.resume())

    @precondition(lambda self: not self.removed)
    @rule()
    def recover(self) -> None:
        """What a rehydration does to the live activation."""
        self.operate(self.harness.c.recover())

    @precondition(lambda self: not self.removed)
    @rule()
    def reactivate(self) -> None:
        """The job actor is lost and comes back: a new activation recovers the job."""
        self.run(self.harness.activate(reconstructed=True))

    @precondition(lambda self: not self.removed)
    @rule(now=st.integers(0, 3))
    def remove(self, now: int) -> None:
        """(Drawn a quarter of the times it is picked: a removal ends the sequence's story.)"""
        if now:
            return
        before = self.harness.calls["on_stopped:ok"]
        if not isinstance(self.operate(self.harness.c.remove()), JobOperationError):
            self.stopped_before = before

    @precondition(lambda self: not self.removed)
    @rule()
    def retry_failed_steps(self) -> None:
        self.reopening(self.harness.c.retry_failed_steps())

    @rule()
    def watchdog_tick(self) -> None:
        """(Also the one rule left once the job is removed: a tick then does nothing.)"""
        self.operate(self.harness.c.watchdog_tick())

    @precondition(lambda self: not self.removed)
    @rule()
    def next_start_operation_fails(self) -> None:
        self.harness.hosts.fail_starts += 1

    @precondition(lambda self: not self.removed)
    @rule()
    def next_start_answer_is_lost(self) -> None:
        """The host starts the steps and the job is told the operation failed."""
        self.harness.hosts.lose_start_answers += 1

    @precondition(lambda self: not self.removed)
    @rule(data=st.data())
    def host_dies(self, data: st.DataObject) -> None:
        hosts = self.harness.hosts
        used = sorted({r.host for r in hosts.running_steps()})
        if not used:
            return
        hosts.kill(data.draw(st.sampled_from(used)))
        self.run(asyncio.sleep(0))

    def reopening(self, operation: Any) -> None:
        """Runs an operation that may open a new execution of the job: one did when the job's
        stored history gained a move to RUNNING from STOPPED, FAILED or COMPLETED_WITH_FAILURES
        (whatever the operation answered)."""
        calls = self.harness.calls.copy()
        before = self.reopenings()
        self.operate(operation)
        if self.reopenings() > before:
            self.new_execution(calls)

    def reopenings(self) -> int:
        state = self.harness.storage.jobs.get(self.harness.job_id)
        if state is None:
            return 0
        statuses = [change.status for change in state.status_changes]
        return sum(
            1
            for old, new in itertools.pairwise(statuses)
            if new == JobStatus.RUNNING and old in REOPENED
        )

    def new_execution(self, calls_before: Counter[str]) -> None:
        """The operation that just returned opened a new execution of the job."""
        self.execution += 1
        self.completed_before = calls_before["on_completed:ok"]
        self.stopped_before = calls_before["on_stopped:ok"]

    # -- invariants -----------------------------------------------------------------------------

    def stored_by_stage(self) -> dict[int, Counter[StepStatus]]:
        h = self.harness
        by_stage: dict[int, Counter[StepStatus]] = {}
        for step in h.storage.steps.get(h.job_id, {}).values():
            by_stage.setdefault(step.stage, Counter())[step.status] += 1
        return by_stage

    @invariant()
    def no_step_counted_twice(self) -> None:
        if self.h is None:
            return
        state = self.harness.storage.jobs.get(self.harness.job_id)
        progresses = [self.harness.c.stages.progress()]
        if state is not None:
            progresses.append(state.progress)
        for progress in progresses:
            for stage in progress.stages:
                counts = (
                    stage.successful_steps,
                    stage.failed_steps,
                    stage.unreachable_steps,
                    stage.stopped_steps,
                )
                assert min(counts) >= 0, f"a negative count in {stage}"
                assert sum(counts) <= stage.total_steps, f"counted twice: {stage}"
            done = (
                progress.successful_steps
                + progress.failed_steps
                + progress.unreachable_steps
                + progress.stopped_steps
            )
            assert done <= progress.total_steps, f"counted twice: {progress}"
        counting = self.harness.c.counting
        both = counting.counted & counting.stopped
        assert not both, f"steps counted as an outcome and as stopped: {sorted(both)}"

    @invariant()
    def counted_records_are_unique(self) -> None:
        if self.h is None:
            return
        h = self.harness
        for kind in CountedKind:
            records = self.loop.run_until_complete(h.storage.list_counted(h.job_id, kind))
            assert len(records) == len(set(records))
        if not self.removed and not h.c.counting.unsaved:
            completed = set(self.loop.run_until_complete(h.counted(CountedKind.COMPLETED)))
            stopped = set(self.loop.run_until_complete(h.counted(CountedKind.STOPPED)))
            assert not completed & stopped, f"recorded both ways: {completed & stopped}"

    @invariant()
    def counters_match_storage_where_the_job_settled(self) -> None:
        if self.h is None or self.removed:
            return
        state = self.harness.storage.jobs.get(self.harness.job_id)
        if state is None:
            return
        completed = state.status in (
            JobStatus.COMPLETED_SUCCESSFULLY,
            JobStatus.COMPLETED_WITH_FAILURES,
        )
        stopped = (state.status, state.stop_finalized) == SETTLED_STOP
        if not (completed or stopped):
            return
        stored = self.stored_by_stage()
        for stage in state.progress.stages:
            held = stored.get(stage.stage, Counter())
            unfinished = sum(held[s] for s in UNFINISHED)
            expected = (
                stage.total_steps - sum(held.values()),
                held[StepStatus.FAILED] + held[StepStatus.COMPLETED_WITH_FAILURE],
                held[StepStatus.UNREACHABLE],
            )
            counted = (stage.successful_steps, stage.failed_steps, stage.unreachable_steps)
            if completed:
                assert unfinished == 0, f"{state.status} with unfinished steps: {held}"
                assert counted == expected, f"{state.status}: {stage} but storage {held}"
                assert stage.stopped_steps == 0, f"{state.status} with stops: {stage}"
            elif stage.is_started:
                assert counted == expected, f"stopped: {stage} but storage {held}"
                assert stage.stopped_steps == unfinished, f"stopped: {stage}, storage {held}"
            else:
                # A stage never started holds at most unreachable steps (after a barrier).
                assert counted == (0, 0, expected[2]), f"never started: {stage}, {held}"
                assert stage.stopped_steps == 0, f"never started: {stage}"

    @invariant()
    def hooks_run_at_most_once_per_execution(self) -> None:
        if self.h is None:
            return
        calls = self.harness.calls
        assert calls["on_completed:ok"] - self.completed_before <= 1, dict(calls)
        assert calls["on_stopped:ok"] - self.stopped_before <= 1, dict(calls)

    @invariant()
    def a_stop_at_rest_leaves_no_step_waiting(self) -> None:
        """Issue 35: a final stop counted every step; none is left in the run table waiting
        (held, queued, start failed, waiting for a retry) uncounted."""
        if self.h is None:
            return
        core = self.harness.c
        if core.mode in (Mode.AT_REST, Mode.REMOVED):
            assert not core.window.count(*WAITING), core.window.runs

    @invariant()
    def each_step_is_in_one_state_and_the_counts_agree(self) -> None:
        """The activation's table of step runs: one row per step, its state's count kept
        with it, and the window never over its size while the job runs."""
        if self.h is None:
            return
        core = self.harness.c
        window = core.window
        assert all(step_id == run.start.step_id for step_id, run in window.runs.items())
        by_state = Counter(run.state for run in window.runs.values())
        assert all(window.count(state) == by_state[state] for state in RunState), by_state
        assert window.in_flight() <= window.size or not core.live

    @invariant()
    def the_mode_agrees_with_the_status(self) -> None:
        """The activation's mode and its job's status tell one story: it drives only a job
        that prepares, starts or runs; it stops only a job stopped or being removed; it is at
        rest only with a job ended or stopped for good."""
        if self.h is None:
            return
        core = self.harness.c
        state = core.state
        if state is None or core.mode in (Mode.LOADING, Mode.RECOVERING, Mode.UNLOADED):
            return
        status, mode = state.status, core.mode
        if core.live:
            assert status.is_preparing or status is JobStatus.RUNNING, (mode, status)
        if mode in STOPPING:
            assert stop_owed(state), (mode, status)
        if mode is Mode.AT_REST:
            assert status.is_terminal or (status is JobStatus.STOPPED and state.stop_finalized), (
                mode, status, state.stop_finalized,
            )  # fmt: skip
        assert (mode is Mode.OWES_STATUS) == (core.owed is not None), (mode, core.owed)

    @invariant()
    def no_step_runs_twice_at_once(self) -> None:
        if self.h is None:
            return
        running = Counter(run.start.step_id for run in self.harness.hosts.running_steps())
        assert all(n == 1 for n in running.values()), f"steps running twice: {running}"

    #: Whether a background task may fail (and be run again): only when storage fails.
    tasks_may_fail = False

    @invariant()
    def no_background_task_failed(self) -> None:
        if self.h is None or self.tasks_may_fail:
            return
        for core in self.harness.activations:
            assert core.tasks.failures == {}, core.tasks.failures

    @invariant()
    def the_job_can_still_make_progress(self) -> None:
        """Settled (terminal, a final stop, removed), or something can still move it: a step
        running on a live host whose report counts, work waiting in a live activation, or
        else the next watchdog tick (run here, a legal step of any sequence) moves it."""
        if self.h is None or self.removed:
            return
        if self.can_move():
            return
        before = self.snapshot()
        for _ in range(3):  # a tick that met a storage fault runs again, as the watchdog does
            if not isinstance(self.operate(self.harness.c.watchdog_tick()), StorageError):
                break
        assert self.can_move() or self.snapshot() != before, (
            f"stuck: {self.stored_status()}, stored {self.stored_by_stage()}, "
            f"active {sorted(self.harness.c.window.active())}, "
            f"running {sorted(self.harness.hosts.running_ids())}"
        )

    def can_move(self) -> bool:
        status = self.stored_status()
        if status is None or status[0].is_terminal or status == SETTLED_STOP:
            return True
        core = self.harness.c
        active = core.window.active()
        for run in self.harness.hosts.running_steps():
            entry = active.get(run.start.step_id)
            if entry is not None and entry[0].attempt == run.start.attempt:
                return True
        waiting = (
            core.window.count(RunState.QUEUED, RunState.START_FAILED, RunState.RETRY_WAIT)
            or core.awaiting_admission is not None
            or core.mode is Mode.HOOK_OWED
        )
        return bool(core.live and waiting)

    def snapshot(self) -> object:
        h = self.harness
        state = h.storage.jobs.get(h.job_id)
        return (
            None if state is None else (state.status, state.stop_finalized, state.progress),
            self.stored_by_stage(),
            len(h.hosts.started),
            sorted(h.c.window.active()),
        )


JobMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # The same sequences every run: the test tier is never flaky. New sequences are explored
    # with `explore` (docs/testing.md), and what they find becomes a test.
    derandomize=True,
    database=None,
)
TestJobMachine = JobMachine.TestCase


class StorageFaultsJobMachine(JobMachine):
    """The same machine over a storage whose calls fail on purpose, one at a time: a rule picks
    the next call to fail (or to write and lose its answer). Operations may then raise a
    storage error, and the pump or the save may fail and run again; every invariant else
    holds."""

    operation_errors = (JobOperationError, StorageError)
    tasks_may_fail = True

    @initialize(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(lambda s: sum(s) <= 8),
        attempts=st.integers(1, 2),
        window=st.sampled_from([None, 1, 2]),
        continuing=st.booleans(),
        missing=st.sets(st.integers(0, 7), max_size=2),
        first_start_fails=st.booleans(),
        hooks_fail=st.sets(st.sampled_from(HOOK_FAULTS)),
    )
    def start_job(self, **arguments: Any) -> None:
        self.storage = FaultyStorage()
        super().start_job(**arguments)

    def created(self, **options: Any) -> Any:
        return create(storage=self.storage, **options)

    @precondition(lambda self: not self.removed)
    @rule(method=st.sampled_from(STORAGE_FAULTS), lost_answer=st.booleans())
    def next_storage_call_fails(self, method: str, lost_answer: bool) -> None:
        if lost_answer and method not in (
            "count_by_status",
            "has_steps",
            "get_steps",
            "list_steps",
        ):
            self.storage.ack_lost(method)
        else:
            self.storage.fail(method)


StorageFaultsJobMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # The same sequences every run: the test tier is never flaky. New sequences are explored
    # with `explore` (docs/testing.md), and what they find becomes a test.
    derandomize=True,
    database=None,
)
TestStorageFaultsJobMachine = StorageFaultsJobMachine.TestCase


def explore(machine: type[RuleBasedStateMachine], examples: int, steps: int) -> None:
    """Runs `machine` for `examples` random sequences of up to `steps` steps and prints the
    shrunk failing sequence, if any."""
    import logging

    from hypothesis.stateful import run_state_machine_as_test

    logging.disable(logging.CRITICAL)
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
            ),
        )
    except Exception as error:
        print(f"{type(error).__name__}: {error}")
        print("\n".join(getattr(error, "__notes__", [])))
    else:
        print(f"no failure in {examples} sequences")


if __name__ == "__main__":
    # python -m tests.unit.core.test_state_machine [examples] [steps] [--storage-faults]
    numbers = [int(a) for a in sys.argv[1:] if not a.startswith("--")]
    explore(
        StorageFaultsJobMachine if "--storage-faults" in sys.argv else JobMachine,
        numbers[0] if numbers else 1000,
        numbers[1] if len(numbers) > 1 else 30,
    )
