"""Jobs and steps on real Ray: counting, the lifecycle, stages, admission, the window, failed
steps, sync steps, the step context, duplicate deliveries, dedicated step actors, requests that
are refused, the manager's queries and the key catalog.

Steps and hooks record what they observe in trace files (see `scenario_jobs`); the tests assert on
those records and on storage, never on the runtime's internals.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.core.messages import Outcome
from choreography_ray.runtime.names import manager_name
from tests.runtime.conftest import FAST, actor_is_gone, job_actor_names
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.runtime.scenario_jobs import (
    BestEffortPlanJob,
    PlanJob,
    PlanRequest,
    Probe,
    RetryablePlanJob,
    WindowOfTwoJob,
    WindowOfZeroJob,
)
from tests.support import RAY_NAMESPACE, eventually, in_storage, read_trace

#: Seconds a small job gets to finish.
WAIT = 60.0


# -- helpers ----------------------------------------------------------------------------------


class Files:
    """The files one test's steps and hooks record into."""

    def __init__(self, root: Path) -> None:
        self.steps = str(root / "steps.jsonl")
        self.hooks = str(root / "hooks.jsonl")
        self.gate = str(root / "gate")

    def probe(self, n: int, **fields: Any) -> Probe:
        return Probe(n=n, log=self.steps, **fields)

    def request(self, probes: list[Probe], **fields: Any) -> PlanRequest:
        return PlanRequest(steps=probes, hooks=self.hooks, **fields)

    def step_records(self) -> list[dict[str, Any]]:
        return read_trace(self.steps)

    def hook_records(self, hook: str) -> list[dict[str, Any]]:
        return [r for r in read_trace(self.hooks) if r["hook"] == hook]


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def max_overlap(records: list[dict[str, Any]]) -> int:
    """The most steps whose perform ran at the same moment, from their start and end times
    (an end at the same instant as a start does not overlap it)."""
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def by_n(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        grouped[r["n"]].append(r)
    return grouped


def stored_by_n(manager: cr.JobsManager, job_id: str) -> dict[int, cr.StepState]:
    return {s.request["n"]: s for s in manager.steps(job_id)}


def last_message(step: cr.StepState) -> str:
    messages = step.status_changes[-1].exception_messages if step.status_changes else ()
    return messages[0] if messages else ""


def stage_progress(state: cr.JobState) -> dict[int, cr.StageProgress]:
    return {s.stage: s for s in state.progress.stages}


# -- counting ---------------------------------------------------------------------------------


@pytest.mark.slow  # 10,000 steps: about 15 s
def test_fan_out_of_10k_steps__every_outcome_counted_once(connect, scope, storage_url) -> None:
    manager = connect().manager(scope, "big")
    started = manager.start(FanOut, FanOutRequest(count=10_000))
    assert started.error is None

    state = manager.wait(started.job_id, timeout=240)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    progress = state.progress
    assert (progress.total_steps, progress.successful_steps) == (10_000, 10_000)
    assert (progress.failed_steps, progress.unreachable_steps, progress.stopped_steps) == (0, 0, 0)
    assert [(s.stage, s.total_steps, s.successful_steps) for s in progress.stages] == [
        (0, 10_000, 10_000)
    ]
    assert state.completed_steps_counted == ()  # never resumed: nothing recorded
    # Storage agrees: a succeeded step's record is deleted, so none is left.
    assert manager.steps(started.job_id) == []
    assert in_storage(storage_url, lambda s: s.count_by_status(started.job_id)) == {}


# -- lifecycle --------------------------------------------------------------------------------


def test_lifecycle__statuses_in_order_with_times_and_on_completed_once(
    connect, scope, files
) -> None:
    manager = connect().manager(scope, "lifecycle")
    before = datetime.now(UTC)
    started = manager.start(PlanJob, files.request([files.probe(n) for n in range(3)]))
    state = manager.wait(started.job_id, timeout=WAIT)
    after = datetime.now(UTC)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.error is None
    assert [c.status for c in state.status_changes] == [
        cr.JobStatus.PREPARING_JOB,
        cr.JobStatus.PREPARING_STEPS,
        cr.JobStatus.STARTING_STEPS,
        cr.JobStatus.RUNNING,
        cr.JobStatus.COMPLETED_SUCCESSFULLY,
    ]
    times = [c.occurred for c in state.status_changes]
    slack = timedelta(seconds=1)  # clocks of the actor processes and of this one
    assert times == sorted(times)
    assert before - slack <= state.created <= times[0] + slack
    assert all(before - slack <= t <= after + slack for t in times)
    assert all(not c.exception_messages for c in state.status_changes)

    eventually(lambda: actor_is_gone(f"job/{started.job_id}"), what="job actor exit")
    # The record is kept after completion, and on_completed ran exactly once.
    kept = manager.get(started.job_id)
    assert kept.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert kept.progress.successful_steps == 3
    assert [j.id for j in manager.list()] == [started.job_id]
    completed = files.hook_records("on_completed")
    assert [r["job_id"] for r in completed] == [started.job_id]


def test_prepare_steps_raises__job_failed_with_message(connect, scope, files) -> None:
    manager = connect().manager(scope, "lifecycle")
    started = manager.start(
        PlanJob, files.request([files.probe(0)], fail_prepare="cannot plan the shards")
    )
    assert started.error is cr.StartJobError.COULD_NOT_PREPARE_STEPS

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.FAILED
    assert state.error is not None and "cannot plan the shards" in state.error
    assert [c.status for c in state.status_changes] == [
        cr.JobStatus.PREPARING_JOB,
        cr.JobStatus.FAILED,
    ]
    assert any("cannot plan the shards" in m for m in state.status_changes[-1].exception_messages)
    assert manager.steps(started.job_id) == []
    assert files.step_records() == []
    assert files.hook_records("on_completed") == []


def test_job_actor_exits__once_failed_in_prepare_steps(connect, scope, files) -> None:
    manager = connect().manager(scope, "lifecycle")
    started = manager.start(PlanJob, files.request([files.probe(0)], fail_prepare="no plan"))
    assert manager.wait(started.job_id, timeout=WAIT).status is cr.JobStatus.FAILED

    # FAILED is terminal: the job actor exits (after a moment's grace) and the record stays.
    eventually(lambda: actor_is_gone(f"job/{started.job_id}"), timeout=10.0, what="job actor exit")
    assert manager.get(started.job_id).status is cr.JobStatus.FAILED


def test_on_completed_raises__job_failed_with_message(connect, scope, files) -> None:
    manager = connect().manager(scope, "lifecycle")
    # The hook does some work before it fails, as a real one (a notification, a write) would.
    request = files.request(
        [files.probe(n) for n in range(2)], completed_delay=0.5, fail_completed="hook exploded"
    )
    started = manager.start(PlanJob, request)

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.FAILED
    assert state.error is not None and "hook exploded" in state.error
    assert any("hook exploded" in m for m in state.status_changes[-1].exception_messages)
    assert state.progress.successful_steps == 2
    eventually(lambda: actor_is_gone(f"job/{started.job_id}"), what="job actor exit")
    assert manager.get(started.job_id).status is cr.JobStatus.FAILED
    assert len(files.hook_records("on_completed")) == 1


def test_job_actor_exits__while_reports_keep_coming(connect, scope, files) -> None:
    """Late reports (a host's duplicate delivery) queue behind the exit's turn, and keep coming:
    the exit gives way to an operation that can reopen the job, never to them."""
    manager = connect().manager(scope, "lifecycle")
    started = manager.start(PlanJob, files.request([files.probe(n) for n in range(2)]))
    job = ray.get_actor(f"job/{started.job_id}", namespace=RAY_NAMESPACE)
    assert manager.wait(started.job_id, timeout=WAIT).status is cr.JobStatus.COMPLETED_SUCCESSFULLY

    in_flight: list[Any] = [job.report_outcomes.remote([]) for _ in range(4)]
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        done, in_flight = ray.wait(in_flight, num_returns=1)
        try:
            ray.get(done[0])
        except ray.exceptions.RayActorError:
            break  # the actor exited
        in_flight.append(job.report_outcomes.remote([]))
    assert actor_is_gone(f"job/{started.job_id}")


# -- stages -----------------------------------------------------------------------------------


def _four_stage_plan(files: Files) -> list[Probe]:
    """Stages 0, 10, 20, 30; one step of stage 10 fails."""
    return [
        files.probe(0, stage=0),
        files.probe(1, stage=0),
        files.probe(2, stage=10),
        files.probe(3, stage=10, fail_attempts=99),
        files.probe(4, stage=10),
        files.probe(5, stage=20),
        files.probe(6, stage=20),
        files.probe(7, stage=20),
        files.probe(8, stage=30),
        files.probe(9, stage=30),
    ]


def test_stage_barrier__later_stages_unreachable(connect, scope, files) -> None:
    manager = connect().manager(scope, "stages")
    started = manager.start(RetryablePlanJob, files.request(_four_stage_plan(files)))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    progress = state.progress
    assert progress.total_steps == 10
    assert (progress.successful_steps, progress.failed_steps) == (4, 1)
    assert progress.unreachable_steps == 5
    assert progress.is_completed and progress.has_failures
    stages = stage_progress(state)
    assert (stages[20].unreachable_steps, stages[30].unreachable_steps) == (3, 2)
    assert (stages[0].successful_steps, stages[10].successful_steps) == (2, 2)
    # No step behind the barrier ran; their records say UNREACHABLE.
    assert sorted(r["n"] for r in files.step_records()) == [0, 1, 2, 3, 4]
    stored = stored_by_n(manager, started.job_id)
    assert sorted(stored) == [3, 5, 6, 7, 8, 9]
    assert stored[3].status is cr.StepStatus.COMPLETED_WITH_FAILURE
    assert all(stored[n].status is cr.StepStatus.UNREACHABLE for n in (5, 6, 7, 8, 9))


def test_stage_continue_with_next_stage__next_stage_runs(connect, scope, files) -> None:
    manager = connect().manager(scope, "stages")
    started = manager.start(BestEffortPlanJob, files.request(_four_stage_plan(files)))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    progress = state.progress
    assert (progress.successful_steps, progress.failed_steps, progress.unreachable_steps) == (
        9,
        1,
        0,
    )
    records = files.step_records()
    assert sorted(r["n"] for r in records) == list(range(10))
    ends_of_10 = max(r["end"] for r in records if r["stage"] == 10)
    assert all(r["start"] >= ends_of_10 for r in records if r["stage"] == 20)
    stored = stored_by_n(manager, started.job_id)
    assert list(stored) == [3]
    assert stored[3].status is cr.StepStatus.COMPLETED_WITH_FAILURE


def test_stages__run_in_value_order_with_gaps_behind_a_barrier(connect, scope, files) -> None:
    manager = connect().manager(scope, "stages")
    # Planned out of order; each stage has steps of different lengths.
    plan = [
        files.probe(n, stage=stage, sleep=sleep)
        for n, (stage, sleep) in enumerate(
            [(20, 0.1), (0, 0.3), (10, 0.2), (20, 0.3), (0, 0.1), (10, 0.3), (0, 0.2), (10, 0.1)]
        )
    ]
    started = manager.start(PlanJob, files.request(plan))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    records = files.step_records()
    assert len(records) == 8
    by_stage: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_stage[r["stage"]].append(r)
    assert sorted(by_stage) == [0, 10, 20]
    assert [len(by_stage[s]) for s in (0, 10, 20)] == [3, 3, 2]
    for earlier, later in ((0, 10), (10, 20)):
        last_end = max(r["end"] for r in by_stage[earlier])
        first_start = min(r["start"] for r in by_stage[later])
        assert first_start >= last_end, f"stage {later} started before stage {earlier} ended"
    # Within a stage the steps run in parallel, as without stages.
    assert [max_overlap(by_stage[s]) for s in (0, 10, 20)] == [3, 3, 2]
    assert [(s.stage, s.is_started, s.successful_steps) for s in state.progress.stages] == [
        (0, True, 3),
        (10, True, 3),
        (20, True, 2),
    ]
    assert state.stage == 20


def test_single_stage_value__plain_fan_out(connect, scope, files) -> None:
    manager = connect().manager(scope, "stages")
    plan = [files.probe(n, stage=7, sleep=0.3) for n in range(4)]
    plan.append(files.probe(4, stage=7, sleep=0.3, fail_attempts=99))
    started = manager.start(RetryablePlanJob, files.request(plan))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (4, 1)
    assert state.progress.unreachable_steps == 0
    assert [(s.stage, s.total_steps) for s in state.progress.stages] == [(7, 5)]
    # Every step ran at once, the failure stopped nothing ...
    assert max_overlap(files.step_records()) == 5
    # ... and a job without stages may run its failed steps again.
    assert manager.retry_failed_steps(started.job_id) == 1
    again = manager.wait(started.job_id, timeout=WAIT)
    assert again.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (again.progress.successful_steps, again.progress.failed_steps) == (4, 1)
    assert sorted(r["attempt"] for r in by_n(files.step_records())[4]) == [1, 2]


# -- admission --------------------------------------------------------------------------------


@pytest.mark.parametrize("gated_stage", [0, 10], ids=["first-stage", "later-stage"])
def test_admission_refused__job_waits_and_stage_runs_once_admitted(
    connect, scope, files, gated_stage: int
) -> None:
    manager = connect().manager(scope, "admission")
    plan = [files.probe(n, stage=0 if n < 2 else 10) for n in range(4)]
    started = manager.start(PlanJob, files.request(plan, gated_stage=gated_stage, gate=files.gate))
    assert started.error is None

    def refusals() -> int:
        return sum(
            not r["admitted"]
            for r in files.hook_records("admit_stage")
            if r["stage"] == gated_stage
        )

    # Refused, the job stays RUNNING and waiting; the watchdog asks again on its ticks.
    eventually(lambda: refusals() >= 3, what="three refused admissions")
    with pytest.raises(cr.JobTimeoutError):
        manager.wait(started.job_id, timeout=0.5)
    state = manager.get(started.job_id)
    assert state.status is cr.JobStatus.RUNNING
    ran = {r["n"] for r in files.step_records()}
    gated = {n for n, p in enumerate(plan) if p.stage == gated_stage}
    assert not ran & gated
    stored = stored_by_n(manager, started.job_id)
    assert {n for n, s in stored.items() if s.status is cr.StepStatus.SCHEDULED} >= gated
    if gated_stage == 10:
        assert ran == {0, 1}

    opened = time.time()
    Path(files.gate).touch()
    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 4
    records = files.step_records()
    assert sorted(r["n"] for r in records) == [0, 1, 2, 3]
    assert all(r["start"] >= opened for r in records if r["stage"] == gated_stage)
    asks = files.hook_records("admit_stage")
    gated_asks = [r["admitted"] for r in asks if r["stage"] == gated_stage]
    assert gated_asks[-1] is True and gated_asks.count(True) == 1
    other = 10 if gated_stage == 0 else 0
    assert [r["admitted"] for r in asks if r["stage"] == other] == [True]


# -- the window -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_type", "options", "window"),
    [
        # Each case starts a job on Ray (5 s): the two that cover the others run in the default
        # tier, the rest in the slow tier.
        pytest.param(
            PlanJob, {"max_active_steps_per_job": 3}, 3, id="option-3", marks=pytest.mark.slow
        ),
        pytest.param(WindowOfTwoJob, {}, 2, id="class-2", marks=pytest.mark.slow),
        pytest.param(
            WindowOfTwoJob, {"max_active_steps_per_job": 5}, 2, id="class-2-over-option-5"
        ),
        pytest.param(PlanJob, {"max_active_steps_per_job": 0}, 1, id="option-0"),
        pytest.param(
            PlanJob,
            {"max_active_steps_per_job": -4},
            1,
            id="option-negative",
            marks=pytest.mark.slow,
        ),
        pytest.param(WindowOfZeroJob, {}, 1, id="class-0", marks=pytest.mark.slow),
    ],
)
def test_window__never_more_than_n_steps_running(
    connect, scope, files, job_type: type[PlanJob], options: dict[str, Any], window: int
) -> None:
    manager = connect(**options).manager(scope, "window")
    started = manager.start(job_type, files.request([files.probe(n, sleep=0.25) for n in range(6)]))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    records = files.step_records()
    assert len(records) == 6
    assert max_overlap(records) == window


# -- failed steps -----------------------------------------------------------------------------


def test_step_failures__recorded_and_job_completes_with_failures(connect, scope, files) -> None:
    manager = connect(step_event_loop_block_limit=0.5).manager(scope, "failures")
    plan = [
        files.probe(0, fail_attempts=1),
        files.probe(1, behaviour="raise"),
        files.probe(2, behaviour="garbage"),
        files.probe(3, behaviour="block", sleep=1.5),
        *(files.probe(n) for n in range(4, 10)),
    ]
    started = manager.start(PlanJob, files.request(plan))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    progress = state.progress
    assert (progress.total_steps, progress.successful_steps, progress.failed_steps) == (10, 6, 4)
    assert sorted(r["n"] for r in files.step_records()) == list(range(10))
    stored = stored_by_n(manager, started.job_id)
    assert sorted(stored) == [0, 1, 2, 3]
    assert stored[0].status is cr.StepStatus.COMPLETED_WITH_FAILURE
    assert last_message(stored[0]) == "step 0 failed at attempt 1"
    assert stored[1].status is cr.StepStatus.FAILED
    assert "boom from step 1" in last_message(stored[1])
    assert stored[2].status is cr.StepStatus.FAILED
    assert last_message(stored[2])
    assert stored[3].status is cr.StepStatus.FAILED
    assert last_message(stored[3])

    # Nothing crashed: the step hosts serve the next job.
    following = manager.start(
        PlanJob,
        files.request(
            [files.probe(n, kind=k) for n, k in enumerate(["async", "sync"] * 3, start=10)]
        ),
    )
    assert manager.wait(following.job_id, timeout=WAIT).status is (
        cr.JobStatus.COMPLETED_SUCCESSFULLY
    )


def test_sync_perform__runs_in_worker_thread(connect, scope, files) -> None:
    manager = connect().manager(scope, "sync")
    started = manager.start(
        PlanJob, files.request([files.probe(n, kind="sync", sleep=0.4) for n in range(3)])
    )

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 3
    records = files.step_records()
    assert len(records) == 3
    assert not any(r["on_loop"] for r in records)  # not on the host's event loop ...
    assert max_overlap(records) == 3  # ... and blocking calls do not hold each other up


# -- the step context -------------------------------------------------------------------------


def test_step_context__carries_job_step_stage_attempt(connect, scope, files) -> None:
    manager = connect(max_step_attempts=2).manager(scope, "context")
    plan = [
        files.probe(0, stage=0),
        files.probe(1, stage=0, fail_attempts=1),
        files.probe(2, stage=10, fail_attempts=99),
        files.probe(3, stage=10),
    ]
    started = manager.start(BestEffortPlanJob, files.request(plan))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (3, 1)
    runs = by_n(files.step_records())
    assert {n: sorted(r["attempt"] for r in rs) for n, rs in runs.items()} == {
        0: [1],
        1: [1, 2],
        2: [1, 2],
        3: [1],
    }
    assert all(r["job_id"] == started.job_id for rs in runs.values() for r in rs)
    assert all(r["stage"] == plan[n].stage for n, rs in runs.items() for r in rs)
    step_ids = {n: {r["step_id"] for r in rs} for n, rs in runs.items()}
    assert all(len(ids) == 1 for ids in step_ids.values())  # one identity across attempts
    assert len(set().union(*step_ids.values())) == 4
    stored = stored_by_n(manager, started.job_id)
    assert list(stored) == [2]
    assert step_ids[2] == {stored[2].step_id}
    assert stored[2].attempt == 2 and stored[2].stage == 10


# -- delivery ---------------------------------------------------------------------------------


def test_duplicate_delivery__counted_once(connect, scope, files) -> None:
    manager = connect().manager(scope, "delivery")
    plan = [files.probe(0), files.probe(1, fail_attempts=99), files.probe(2, gate=files.gate)]
    started = manager.start(PlanJob, files.request(plan))

    def counted() -> tuple[int, int]:
        progress = manager.get(started.job_id).progress
        return progress.successful_steps, progress.failed_steps

    eventually(lambda: counted() == (1, 1), what="two outcomes counted")
    ids = {n: rs[0]["step_id"] for n, rs in by_n(files.step_records()).items()}
    job = ray.get_actor(f"job/{started.job_id}", namespace=RAY_NAMESPACE)
    repeated = [
        Outcome(ids[0], 1, cr.StepStatus.COMPLETED_SUCCESSFULLY),
        Outcome(ids[1], 1, cr.StepStatus.COMPLETED_WITH_FAILURE, "step 1 failed at attempt 1"),
    ]
    ray.get(job.report_outcomes.remote(repeated))
    ray.get(job.report_outcomes.remote(repeated[:1]))
    eventually(lambda: not ray.get(job.unsaved.remote()), what="the job's progress saved")

    assert counted() == (1, 1)
    assert manager.get(started.job_id).status is cr.JobStatus.RUNNING

    Path(files.gate).touch()
    state = manager.wait(started.job_id, timeout=WAIT)
    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (2, 1)


# -- dedicated step actors --------------------------------------------------------------------


def test_dedicated_step__own_actor_gone_afterwards(connect, scope, files) -> None:
    manager = connect().manager(scope, "dedicated")
    started = manager.start(
        PlanJob, files.request([files.probe(n, kind="dedicated") for n in range(2)])
    )

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    records = files.step_records()
    assert len(records) == 2
    names = {r["actor"] for r in records}
    assert names == {f"step/{started.job_id}/{r['step_id']}" for r in records}
    assert {r["namespace"] for r in records} == {RAY_NAMESPACE}
    assert len({r["pid"] for r in records}) == 2  # a process each
    for name in names:
        eventually(partial(actor_is_gone, name), what=f"{name} gone")


# -- the manager ------------------------------------------------------------------------------


def test_invalid_request__refused_and_nothing_stored(connect, scope) -> None:
    manager = connect().manager(scope, "invalid")

    with pytest.raises(cr.JobOperationError) as missing:
        manager.start(PlanJob, {"steps": []})
    assert missing.value.error is cr.StartJobError.INVALID_REQUEST
    assert "hooks" in missing.value.message and "Field required" in missing.value.message

    with pytest.raises(cr.JobOperationError) as wrong:
        manager.start(FanOut, {"count": "many"})
    assert wrong.value.error is cr.StartJobError.INVALID_REQUEST
    assert "count" in wrong.value.message and "integer" in wrong.value.message

    assert manager.list() == []


def test_manager_queries__get_list_steps_and_job_actor_exits(connect, scope, files) -> None:
    jobs = connect()
    manager = jobs.manager(scope, "queries")
    good_request = files.request([files.probe(n) for n in range(3)])
    good = manager.start(PlanJob, good_request)
    bad = manager.start(
        PlanJob,
        files.request(
            [
                files.probe(10),
                files.probe(11, fail_attempts=99),
                files.probe(12, behaviour="raise", stage=0),
            ]
        ),
    )
    for job_id in (good.job_id, bad.job_id):
        manager.wait(job_id, timeout=WAIT)

    state = manager.get(good.job_id)
    assert (state.id, state.scope, state.namespace) == (good.job_id, scope, "queries")
    assert state.type == "tests.runtime.scenario_jobs:PlanJob"
    assert state.request == good_request.model_dump(mode="json")
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY

    assert {j.id for j in manager.list()} == {good.job_id, bad.job_id}
    assert [j.id for j in manager.list(status=cr.JobStatus.COMPLETED_SUCCESSFULLY)] == [good.job_id]
    assert [j.id for j in manager.list(status=cr.JobStatus.COMPLETED_WITH_FAILURES)] == [bad.job_id]
    assert manager.list(status=cr.JobStatus.RUNNING) == []

    assert manager.steps(good.job_id) == []
    steps = manager.steps(bad.job_id)
    assert [(s.job_id, s.request["n"], s.status, s.attempt, s.stage) for s in steps] == [
        (bad.job_id, 11, cr.StepStatus.COMPLETED_WITH_FAILURE, 1, 0),
        (bad.job_id, 12, cr.StepStatus.FAILED, 1, 0),
    ]
    assert {s.type for s in steps} == {"tests.runtime.scenario_jobs:AsyncProbeStep"}
    assert steps[0].step_id < steps[1].step_id

    # Another (scope, namespace) does not see them.
    other = jobs.manager(scope, "elsewhere")
    assert other.list() == []
    with pytest.raises(cr.JobOperationError) as unknown:
        other.get(good.job_id)
    assert unknown.value.error is cr.JobLookupError.JOB_NOT_FOUND

    for job_id in (good.job_id, bad.job_id):
        eventually(partial(actor_is_gone, f"job/{job_id}"), what="job actor exit")


def test_key_catalog__records_every_manager_key(connect, scope, storage_url, files) -> None:
    jobs = connect()
    for namespace in ("alpha", "beta"):
        manager = jobs.manager(scope, namespace)
        started = manager.start(PlanJob, files.request([files.probe(0)]))
        manager.wait(started.job_id, timeout=WAIT)

    keys = in_storage(storage_url, lambda s: s.list_manager_keys())
    assert {cr.JobsManagerKey(scope=scope, namespace=n) for n in ("alpha", "beta")} <= set(keys)
    assert all(k.scope == scope for k in keys)


def test_spare_job_actor__the_next_start_takes_it_and_a_spare_without_a_job_exits(
    connect, scope, files, storage_url
) -> None:
    from choreography_ray.runtime import actors

    manager = connect(spare_job_actors=1).manager(scope, "spares")
    before = job_actor_names()
    first = manager.start(PlanJob, files.request([files.probe(0)]))
    manager.wait(first.job_id, timeout=WAIT)
    # The first start had the manager create a spare: a job actor for an id with no record,
    # taken once it answers.
    manager_actor = ray.get_actor(manager_name(scope, "spares"), namespace=RAY_NAMESPACE)
    spares: list[str] = eventually(lambda: ray.get(manager_actor.spares.remote()), what="a spare")
    (spare_id,) = spares
    assert job_actor_names() - before - {f"job/{first.job_id}"} == {f"job/{spare_id}"}
    assert in_storage(storage_url, lambda s: s.get_job(spare_id)) is None

    second = manager.start(PlanJob, files.request([files.probe(1)]))
    assert second.job_id == spare_id
    assert manager.wait(second.job_id, timeout=WAIT).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert sorted(r["n"] for r in files.step_records()) == [0, 1]

    # A spare whose job never comes answers its first call "does not exist", and exits.
    orphan_id = uuid.uuid4().hex
    options = cr.JobsOptions(**FAST).model_dump_json()
    orphan = actors.job_actor(orphan_id, storage_url, options, RAY_NAMESPACE, spare=True)
    with pytest.raises(Exception, match="does not exist"):
        ray.get(orphan.state.remote(), timeout=WAIT)
    eventually(partial(actor_is_gone, f"job/{orphan_id}"), what="the spare's exit")
