"""Step retries, RetryFailedSteps, stop, resume, remove and the watchdog, on real Ray (issue 4).

Faults are injected on purpose: the job actor is killed with `ray.kill(..., no_restart=False)` so
Ray restarts it (reactivation), step hosts drop outcome deliveries, and hooks throw. Steps and
hooks leave traces in a directory per job (see `lifecycle_jobs`).
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.core.messages import Outcome
from choreography_ray.model import JobState, StepState
from choreography_ray.storage import CountedKind, Storage
from tests.runtime.conftest import FAST, actor_is_gone
from tests.runtime.lifecycle_jobs import (
    TRACES,
    AdmissionWaits,
    AdmittedOnFlag,
    AdmittedOnFlagStopHookFailsTwice,
    AdmittedOnFlagStopHookFailsWhileFlagged,
    Picky,
    Plan,
    ResumeHookFails,
    ResumeHookFailsOnce,
    Retryable,
    StopHookFailsTwice,
    Traced,
    Windowed,
    Work,
    clear_flag,
    read,
    set_flag,
)
from tests.support import RAY_NAMESPACE, eventually, in_storage

pytestmark = pytest.mark.timeout(90)

#: Turns the background watchdog practically off (it still ticks once, about 1 s after the job
#: activates), so a test drives `tick()` by hand and counts ticks exactly.
HAND_DRIVEN = 3600.0

S = cr.JobStatus


# -- helpers --------------------------------------------------------------------------------------


#: Jobs started by the running test, whose traces it removes when it ends.
_STARTED: list[str] = []


@pytest.fixture(autouse=True)
def _traces() -> Iterator[None]:
    yield
    while _STARTED:
        shutil.rmtree(TRACES / _STARTED.pop(), ignore_errors=True)


def job_actor(job_id: str) -> Any:
    return ray.get_actor(f"job/{job_id}", namespace=RAY_NAMESPACE)


def ask(job_id: str, method: str) -> Any:
    """Calls a job actor method, waiting out a restart in progress (after `kill_job_actor`)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return ray.get(getattr(job_actor(job_id), method).remote())
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.ActorDiedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def kill_job_actor(job_id: str) -> None:
    """Kills the job actor's process; Ray restarts it, which is a reactivation. Returns once
    the new incarnation is alive, so that later calls cannot reach the old one."""
    handle = job_actor(job_id)
    actor_id = handle._actor_id.hex()
    restarts = ray_actor_state(actor_id)["NumRestarts"]
    ray.kill(handle, no_restart=False)
    eventually(
        lambda: (
            (s := ray_actor_state(actor_id))["NumRestarts"] > restarts and s["State"] == "ALIVE"
        ),
        30,
        "Ray to restart the job actor",
    )


def activate_job_actor(storage_url: str, job_id: str) -> None:
    """Activates the job's actor as the manager does, with this test module's options."""
    from choreography_ray.runtime.job_actor import JobActor
    from choreography_ray.runtime.names import actor_options, job_name

    options = cr.JobsOptions(**{**FAST, "job_watchdog_interval": HAND_DRIVEN})
    JobActor.options(**actor_options(job_name(job_id), RAY_NAMESPACE)).remote(  # type: ignore[attr-defined]
        job_id, storage_url, options.model_dump_json(), RAY_NAMESPACE
    )


def watchdog_ticked(job_id: str, times: int = 2) -> None:
    """Waits for `times` more watchdog ticks of the job's actor: what a check that nothing
    happens waits for, instead of a length of time."""
    since = ask(job_id, "watchdog_ticks")
    eventually(
        lambda: ask(job_id, "watchdog_ticks") >= since + times, 15, f"{times} watchdog ticks"
    )


def saved(job_id: str) -> None:
    """Waits until the job actor holds nothing it has not saved: storage shows what it counted."""
    eventually(lambda: not ask(job_id, "unsaved"), 15, "the job's progress to be saved")


def hosts_done_with(job_id: str) -> bool:
    """No step host holds anything of the job: its steps ended, and each delivery of their
    outcomes was made or given up."""
    return all(job_id not in held for held in ray.get([h.held_jobs.remote() for h in step_hosts()]))


def ray_actor_state(actor_id: str) -> dict[str, Any]:
    # The GCS's own record (the public state API needs the dashboard, off in these tests).
    from ray._private import state

    return state.actors(actor_id)


def step_hosts() -> list[Any]:
    return [
        ray.get_actor(actor["name"], namespace=actor["namespace"])
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"].startswith("step-host/")
    ]


def stored_job(storage_url: str, job_id: str) -> JobState | None:
    return in_storage(storage_url, lambda s: s.get_job(job_id))


def stored_steps(storage_url: str, job_id: str) -> list[StepState]:
    return in_storage(storage_url, lambda s: s.list_steps(job_id, limit=10_000))


def operation_error(call: Callable[[], object]) -> object:
    """The error enum member a manager operation answered."""
    with pytest.raises(cr.JobOperationError) as caught:
        call()
    return caught.value.error


def starts(job_id: str, n: int | None = None) -> list[tuple[float, int, int]]:
    """(time, attempt, n) of every step start, in order; only work item `n` when given."""
    found = [(e["at"], e["attempt"], e["n"]) for e in read(job_id, "starts")]
    return [s for s in found if n is None or s[2] == n]


def ends(job_id: str) -> list[tuple[float, int, int, str]]:
    """(time, attempt, n, outcome) of every step end."""
    return [(e["at"], e["attempt"], e["n"], e["outcome"]) for e in read(job_id, "ends")]


def step_ids_by_n(job_id: str) -> dict[int, str]:
    return {e["n"]: e["step_id"] for e in read(job_id, "starts")}


def hook_calls(job_id: str, hook: str) -> list[float]:
    return [e["at"] for e in read(job_id, hook)]


def progress(state: JobState) -> dict[str, int]:
    p = state.progress
    return {
        "total": p.total_steps,
        "successful": p.successful_steps,
        "failed": p.failed_steps,
        "stopped": p.stopped_steps,
        "unreachable": p.unreachable_steps,
    }


def statuses(state: JobState) -> list[str]:
    return [change.status for change in state.status_changes]


def start(manager: cr.JobsManager, job_type: type[cr.Job[Any]], *steps: Work) -> str:
    started = manager.start(job_type, Plan(steps=list(steps)))
    _STARTED.append(started.job_id)
    assert started.error is None
    return started.job_id


def wait_started(job_id: str, count: int, timeout: float = 15.0) -> None:
    eventually(lambda: len(starts(job_id)) >= count, timeout, f"{count} steps to start")


# -- 1. step retries ------------------------------------------------------------------------------


def test_step_retry__fails_twice_then_succeeds_counts_one_success_and_no_failure(
    connect: Any, scope: str
) -> None:
    jobs = connect(max_step_attempts=3, step_retry_backoff=0.2, max_step_retry_backoff=5.0)
    manager = jobs.manager(scope, "retries")
    job_id = start(manager, Traced, Work(n=0, fail_attempts=2), Work(n=1))

    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 2,
        "successful": 2,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    attempts = starts(job_id, n=0)
    assert [attempt for _, attempt, _ in attempts] == [1, 2, 3]
    first_gap = attempts[1][0] - attempts[0][0]
    second_gap = attempts[2][0] - attempts[1][0]
    # step_retry_backoff before the second attempt, doubled before the third.
    assert first_gap >= 0.2
    assert second_gap >= 0.4
    assert first_gap < 3.0 and second_gap < 3.0, "the configured backoff, not the default 5 s"
    assert [attempt for _, attempt, _ in starts(job_id, n=1)] == [1]
    assert stored_steps(jobs.storage, job_id) == []  # a succeeded step is no longer stored


def test_step_retry__should_retry_step_refuses__counted_as_failure_at_once(
    connect: Any, scope: str
) -> None:
    jobs = connect(max_step_attempts=3)
    manager = jobs.manager(scope, "retries")
    job_id = start(
        manager,
        Picky,
        Work(n=0, always_fail=True, message="rejected-input"),
        # A "timeout" the job retries; it waits for "go" so the job is still running meanwhile.
        Work(n=1, block=True, fail_attempts=1),
    )

    # The refused failure is counted while the other step still runs.
    state = eventually(
        lambda: (s := manager.get(job_id)).progress.failed_steps == 1 and s,
        15,
        "the refused failure to be counted",
    )
    assert state.status is S.RUNNING
    set_flag(job_id, "go")
    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_WITH_FAILURES
    assert progress(state) == {
        "total": 2,
        "successful": 1,
        "failed": 1,
        "stopped": 0,
        "unreachable": 0,
    }
    assert [attempt for _, attempt, _ in starts(job_id, n=0)] == [1]
    assert [attempt for _, attempt, _ in starts(job_id, n=1)] == [1, 2]
    ids = step_ids_by_n(job_id)
    asked = [(e["step_id"], e["attempt"], e["message"]) for e in read(job_id, "should_retry_step")]
    assert sorted(asked) == sorted(
        [(ids[0], 1, "rejected-input attempt 1"), (ids[1], 1, "attempt 1 failed")]
    )
    (failed,) = stored_steps(jobs.storage, job_id)
    assert (failed.step_id, failed.status, failed.attempt) == (
        ids[0],
        cr.StepStatus.COMPLETED_WITH_FAILURE,
        1,
    )


def test_step_retry__attempts_exhausted_counts_failure_with_last_message(
    connect: Any, scope: str
) -> None:
    jobs = connect(max_step_attempts=3, step_retry_backoff=0.1, max_step_retry_backoff=0.2)
    manager = jobs.manager(scope, "retries")
    job_id = start(
        manager,
        Traced,
        Work(n=0, always_fail=True, message="boom"),
        Work(n=1, raise_error=True),
        Work(n=2),
    )

    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_WITH_FAILURES
    assert progress(state) == {
        "total": 3,
        "successful": 1,
        "failed": 2,
        "stopped": 0,
        "unreachable": 0,
    }
    assert [attempt for _, attempt, _ in starts(job_id, n=0)] == [1, 2, 3]
    assert [attempt for _, attempt, _ in starts(job_id, n=1)] == [1, 2, 3]
    ids = step_ids_by_n(job_id)
    by_id = {s.step_id: s for s in stored_steps(jobs.storage, job_id)}
    assert set(by_id) == {ids[0], ids[1]}
    returned, raised = by_id[ids[0]], by_id[ids[1]]
    assert (returned.status, returned.attempt) == (cr.StepStatus.COMPLETED_WITH_FAILURE, 3)
    assert (raised.status, raised.attempt) == (cr.StepStatus.FAILED, 3)
    # Every failed attempt is recorded on the step, with its message; the last one stands.
    assert [c.exception_messages for c in returned.status_changes if c.exception_messages] == [
        ("boom attempt 1",),
        ("boom attempt 2",),
        ("boom attempt 3",),
    ]
    assert returned.status_changes[-1].exception_messages == ("boom attempt 3",)
    assert raised.status_changes[-1].exception_messages == ("RuntimeError: raised at attempt 3",)


def test_step_retry__waiting_retry_is_final_after_job_actor_reactivates(
    connect: Any, scope: str
) -> None:
    # A long backoff: the retry is still waiting when the job actor dies.
    jobs = connect(max_step_attempts=3, step_retry_backoff=60, max_step_retry_backoff=60)
    manager = jobs.manager(scope, "retries")
    job_id = start(manager, Traced, Work(n=0, fail_attempts=1), Work(n=1))
    eventually(
        lambda: manager.get(job_id).progress.successful_steps == 1,
        15,
        "the other step to be counted",
    )
    (waiting,) = eventually(lambda: stored_steps(jobs.storage, job_id), 5, "the failed attempt")
    assert (waiting.status, waiting.attempt) == (cr.StepStatus.COMPLETED_WITH_FAILURE, 1)
    running = manager.get(job_id)
    assert running.status is S.RUNNING
    assert running.progress.failed_steps == 0, "a failure is not counted while a retry waits"

    kill_job_actor(job_id)
    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_WITH_FAILURES
    assert progress(state) == {
        "total": 2,
        "successful": 1,
        "failed": 1,
        "stopped": 0,
        "unreachable": 0,
    }
    assert [attempt for _, attempt, _ in starts(job_id, n=0)] == [1]
    (failed,) = stored_steps(jobs.storage, job_id)
    assert failed.status_changes[-1].exception_messages == ("attempt 1 failed",)


def test_step_retry__stop_counts_a_pending_attempt_as_failed(connect: Any, scope: str) -> None:
    jobs = connect(max_step_attempts=3, step_retry_backoff=60, max_step_retry_backoff=60)
    manager = jobs.manager(scope, "retries")
    job_id = start(manager, Traced, Work(n=0, fail_attempts=2), Work(n=1, block=True))
    eventually(lambda: any(n == 0 for _, _, n, _ in ends(job_id)), 15, "the first attempt")
    first = step_ids_by_n(job_id)[0]
    eventually(
        lambda: any(
            (s.step_id, s.status) == (first, cr.StepStatus.COMPLETED_WITH_FAILURE)
            for s in stored_steps(jobs.storage, job_id)
        ),
        5,
        "the failed attempt to be stored",
    )

    manager.stop(job_id)
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 15, "the stop to be finalized"
    )

    assert state.status is S.STOPPED
    assert progress(state) == {
        "total": 2,
        "successful": 0,
        "failed": 1,
        "stopped": 1,
        "unreachable": 0,
    }
    assert [attempt for _, attempt, _ in starts(job_id, n=0)] == [1]


# -- 2. RetryFailedSteps --------------------------------------------------------------------------


def test_retry_failed_steps__not_supported_when_job_type_does_not_allow_it(
    connect: Any, scope: str
) -> None:
    manager = connect().manager(scope, "retry-failed")
    job_id = start(manager, Traced, Work(n=0, always_fail=True), Work(n=1))
    assert manager.wait(job_id, timeout=30).status is S.COMPLETED_WITH_FAILURES

    assert operation_error(lambda: manager.retry_failed_steps(job_id)) is (
        cr.RetryFailedStepsError.NOT_SUPPORTED
    )
    assert manager.get(job_id).status is S.COMPLETED_WITH_FAILURES
    assert len(starts(job_id)) == 2


def test_retry_failed_steps__a_job_with_stages_runs_its_failed_step_again(
    connect: Any, scope: str
) -> None:
    manager = connect().manager(scope, "retry-failed")
    job_id = start(manager, Retryable, Work(n=0, stage=0), Work(n=1, stage=10, always_fail=True))
    assert manager.wait(job_id, timeout=30).status is S.COMPLETED_WITH_FAILURES

    assert manager.retry_failed_steps(job_id) == 1

    assert manager.wait(job_id, timeout=30).status is S.COMPLETED_WITH_FAILURES
    assert len(starts(job_id)) == 3  # stage 0's step is not run again


def test_retry_failed_steps__refused_for_running_and_successful_jobs(
    connect: Any, scope: str
) -> None:
    manager = connect().manager(scope, "retry-failed")
    job_id = start(manager, Retryable, Work(n=0, block=True))
    wait_started(job_id, 1)

    assert operation_error(lambda: manager.retry_failed_steps(job_id)) is (
        cr.RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES
    )
    assert manager.get(job_id).status is S.RUNNING
    set_flag(job_id, "go")
    assert manager.wait(job_id, timeout=30).status is S.COMPLETED_SUCCESSFULLY
    assert operation_error(lambda: manager.retry_failed_steps(job_id)) is (
        cr.RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES
    )
    assert manager.get(job_id).status is S.COMPLETED_SUCCESSFULLY
    assert len(starts(job_id)) == 1


def test_retry_failed_steps__runs_failed_steps_as_next_attempt_and_completes(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "retry-failed")
    job_id = start(
        manager,
        Retryable,
        Work(n=0),
        Work(n=1, fail_until_fixed=True),
        Work(n=2),
        Work(n=3, fail_until_fixed=True),
    )
    failed = manager.wait(job_id, timeout=30)
    assert failed.status is S.COMPLETED_WITH_FAILURES
    assert progress(failed)["failed"] == 2
    set_flag(job_id, "fixed")

    assert manager.retry_failed_steps(job_id) == 2
    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 4,
        "successful": 4,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    assert statuses(state)[-3:] == [S.COMPLETED_WITH_FAILURES, S.RUNNING, S.COMPLETED_SUCCESSFULLY]
    for n in (1, 3):
        assert [attempt for _, attempt, _ in starts(job_id, n=n)] == [1, 2]
    for n in (0, 2):
        assert [attempt for _, attempt, _ in starts(job_id, n=n)] == [1]
    ids = step_ids_by_n(job_id)
    # The reopened execution records the outcomes it counts.
    assert sorted(state.completed_steps_counted) == sorted([ids[1], ids[3]])
    assert stored_steps(storage_url, job_id) == []


def test_resume__a_job_completed_with_failures_does_nothing(connect: Any, scope: str) -> None:
    manager = connect().manager(scope, "retry-failed")
    job_id = start(manager, Traced, Work(n=0, always_fail=True), Work(n=1))
    before = manager.wait(job_id, timeout=30)
    assert before.status is S.COMPLETED_WITH_FAILURES

    manager.resume(job_id)
    # The actor that answered the resume exits: nothing of the job runs after that.
    eventually(lambda: actor_is_gone(f"job/{job_id}"), 15, "the job actor to exit")

    after = manager.get(job_id)
    assert after.status is S.COMPLETED_WITH_FAILURES
    assert statuses(after) == statuses(before)
    assert after.progress == before.progress
    assert len(starts(job_id)) == 2
    assert hook_calls(job_id, "on_before_resuming_job_steps") == []


# -- 3. stop, 4. resume ---------------------------------------------------------------------------


def test_stop_during_running_stage__then_resume_counts_every_step_once(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "stop")
    # Stage 0 finishes; stage 10 runs two steps at a time (the window) and they wait for "go".
    job_id = start(
        manager,
        Windowed,
        Work(n=0),
        Work(n=1),
        *(Work(n=n, stage=10, block=True) for n in range(2, 6)),
        Work(n=6, stage=20),  # not started when the job stops
    )
    eventually(
        lambda: len([s for s in starts(job_id) if s[2] >= 2]) == 2,
        15,
        "two steps of stage 10 to run",
    )

    manager.stop(job_id)
    assert manager.get(job_id).status is S.STOPPED  # persisted before the steps report
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 15, "the stop to be finalized"
    )

    assert state.status is S.STOPPED
    # Two steps told to stop, two never started; stage 20 has nothing to stop.
    assert progress(state) == {
        "total": 7,
        "successful": 2,
        "failed": 0,
        "stopped": 4,
        "unreachable": 0,
    }
    stage_10 = {s.step_id for s in stored_steps(storage_url, job_id) if s.stage == 10}
    assert len(stage_10) == 4
    assert sorted(state.stopped_steps_counted) == sorted(stage_10)
    stopped_at = next(
        c.occurred.timestamp() for c in reversed(state.status_changes) if c.status == S.STOPPED
    )
    told = [t for t, _, _, outcome in ends(job_id) if outcome == "stopped"]
    assert len(told) == 2, "the running steps were told to stop"
    assert all(stopped_at <= t for t in told)
    (on_stopped,) = hook_calls(job_id, "on_stopped")
    assert on_stopped >= max(told)
    by_status = sorted((s.stage, s.status) for s in stored_steps(storage_url, job_id))
    assert by_status == [
        (10, cr.StepStatus.SCHEDULED),
        (10, cr.StepStatus.SCHEDULED),
        (10, cr.StepStatus.STOPPED),
        (10, cr.StepStatus.STOPPED),
        (20, cr.StepStatus.SCHEDULED),
    ]

    set_flag(job_id, "go")
    manager.resume(job_id)
    state = manager.wait(job_id, timeout=30)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 7,
        "successful": 7,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    assert state.stopped_steps_counted == ()
    ids = step_ids_by_n(job_id)
    assert sorted(state.completed_steps_counted) == sorted([*stage_10, ids[6]])
    (resumed_at,) = hook_calls(job_id, "on_before_resuming_job_steps")
    assert all(t > resumed_at for t, _, n in starts(job_id) if n >= 2 and t > on_stopped)
    for n in (0, 1):  # successful steps stay done
        assert len(starts(job_id, n=n)) == 1
    succeeded = sorted(n for _, _, n, outcome in ends(job_id) if outcome == "succeeded")
    assert succeeded == [0, 1, 2, 3, 4, 5, 6]
    # The stage behind waited for the stage the job had reached.
    stage_10_done = max(t for t, _, n, outcome in ends(job_id) if 2 <= n <= 5)
    ((stage_20_started, _, _),) = starts(job_id, n=6)
    assert stage_20_started >= stage_10_done
    assert len(hook_calls(job_id, "on_stopped")) == 1
    assert stored_steps(storage_url, job_id) == []


def shift_stored_version(storage_url: str, job_id: str, by: int) -> None:
    """Storage fault injection: another writer's version, so the job's next save is refused
    (`ConcurrencyError`) and writes nothing."""
    with sqlite3.connect(storage_url.removeprefix("sqlite:///"), timeout=30) as connection:
        connection.execute("UPDATE jobs SET version = version + ? WHERE id = ?", (by, job_id))
    connection.close()


def test_stop__could_not_persist_stop_leaves_the_job_as_it_was(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, block=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    saved(job_id)  # the job is idle
    before = stored_job(storage_url, job_id)
    assert before is not None

    shift_stored_version(storage_url, job_id, 1000)
    error = operation_error(lambda: manager.stop(job_id))
    shift_stored_version(storage_url, job_id, -1000)

    assert error is cr.StopJobError.COULD_NOT_PERSIST_STOP
    after = stored_job(storage_url, job_id)
    assert after is not None
    assert (after.status, statuses(after)) == (S.RUNNING, statuses(before))
    assert ask(job_id, "active_steps") == 2
    assert ends(job_id) == [], "no step was told to stop"
    set_flag(job_id, "go")
    state = manager.wait(job_id, timeout=20)
    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert hook_calls(job_id, "on_stopped") == []


def test_stop__a_step_that_ignores_the_stop_is_counted_when_it_ends(
    connect: Any, scope: str
) -> None:
    manager = connect().manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, block=True), Work(n=1, ignore_stop=True))
    wait_started(job_id, 2)

    manager.stop(job_id)
    eventually(lambda: [e for e in ends(job_id) if e[2] == 0], 10, "the obedient step to stop")
    watchdog_ticked(job_id)  # the stop waits for the other step's report
    waiting = manager.get(job_id)
    assert (waiting.status, waiting.stop_finalized) == (S.STOPPED, False)
    assert hook_calls(job_id, "on_stopped") == []

    set_flag(job_id, "go")
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 15, "the stop to be finalized"
    )

    assert state.status is S.STOPPED
    assert progress(state) == {
        "total": 2,
        "successful": 1,
        "failed": 0,
        "stopped": 1,
        "unreachable": 0,
    }
    (ended,) = [t for t, _, n, outcome in ends(job_id) if n == 1 and outcome == "succeeded"]
    (on_stopped,) = hook_calls(job_id, "on_stopped")
    assert on_stopped >= ended


def test_stop__unfinished_when_the_job_actor_dies__is_finished_on_reactivation(
    connect: Any, scope: str, storage_url: str
) -> None:
    # Progress is saved rarely: the job dies before it saves the stop it counted in memory,
    # and storage (the step's STOPPED record) is what the reactivated job has to go by.
    manager = connect(progress_save_interval=60).manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, ignore_stop=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    manager.stop(job_id)
    eventually(lambda: [e for e in ends(job_id) if e[2] == 1], 10, "the obedient step to stop")
    eventually(
        lambda: cr.StepStatus.STOPPED in {s.status for s in stored_steps(storage_url, job_id)},
        10,
        "its stop to be stored",
    )

    kill_job_actor(job_id)  # the stop is stored, not finished
    watchdog_ticked(job_id)
    waiting = manager.get(job_id)
    assert (waiting.status, waiting.stop_finalized) == (S.STOPPED, False)
    set_flag(job_id, "go")
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 15, "the stop to be finalized"
    )

    assert state.status is S.STOPPED
    assert progress(state) == {
        "total": 2,
        "successful": 1,
        "failed": 0,
        "stopped": 1,
        "unreachable": 0,
    }
    (on_stopped,) = hook_calls(job_id, "on_stopped")
    assert on_stopped >= max(t for t, _, _, _ in ends(job_id))
    assert hook_calls(job_id, "on_before_resuming_job_steps") == [], "nothing resumes"
    assert len(starts(job_id)) == 2


def test_stop__a_dedicated_step_of_the_activation_before_a_restart_is_waited_for(
    connect: Any, scope: str, storage_url: str
) -> None:
    """Issue 23 (4): a stop waits for a dedicated step that ignores it; the job actor
    restarts. The new activation finds the step actor the one before it created and waits
    for it too, instead of finishing the stop (and killing the actor mid-perform)."""
    manager = connect().manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, ignore_stop=True, dedicated=True))
    wait_started(job_id, 1)
    manager.stop(job_id)
    kill_job_actor(job_id)
    watchdog_ticked(job_id)
    waiting = manager.get(job_id)
    assert (waiting.status, waiting.stop_finalized) == (S.STOPPED, False)
    set_flag(job_id, "go")
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 20, "the stop to be finalized"
    )

    assert [outcome for _, _, _, outcome in ends(job_id)] == ["succeeded"]
    assert len(starts(job_id)) == 1
    assert progress(state) == {
        "total": 1,
        "successful": 1,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    assert stored_steps(storage_url, job_id) == []


def test_stop__while_the_resume_hook_is_owed__tells_the_running_steps(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect(job_watchdog_interval=HAND_DRIVEN).manager(scope, "stop")
    job_id = start(manager, ResumeHookFails, Work(n=0, block=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    kill_job_actor(job_id)  # reactivated RUNNING; the hook throws, the steps still run
    eventually(lambda: hook_calls(job_id, "on_before_resuming_job_steps"), 15, "the resume hook")

    manager.stop(job_id)
    state = eventually(
        lambda: (s := manager.get(job_id)).stop_finalized and s, 15, "the stop to be finalized"
    )

    assert sorted(n for _, _, n, outcome in ends(job_id) if outcome == "stopped") == [0, 1]
    assert state.status is S.STOPPED
    assert progress(state) == {
        "total": 2,
        "successful": 0,
        "failed": 0,
        "stopped": 2,
        "unreachable": 0,
    }
    assert state.progress.is_stopped
    (on_stopped,) = hook_calls(job_id, "on_stopped")
    assert on_stopped >= max(t for t, _, _, _ in ends(job_id))
    calls = len(hook_calls(job_id, "on_before_resuming_job_steps"))
    for _ in range(20):  # a stopped job's resume hook is not retried
        ask(job_id, "tick")
    assert len(hook_calls(job_id, "on_before_resuming_job_steps")) == calls
    assert manager.get(job_id).status is S.STOPPED


def test_watchdog__never_resumes_a_stopped_job(connect: Any, scope: str, storage_url: str) -> None:
    manager = connect().manager(scope, "stop")
    job_id = start(manager, Traced, Work(n=0, block=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    manager.stop(job_id)
    eventually(lambda: manager.get(job_id).stop_finalized, 15, "the stop to be finalized")
    set_flag(job_id, "go")
    # The stopped job's actor exits; a new activation (as an operation or a rehydration would
    # make) ticks its watchdog, and the stop stands.
    eventually(lambda: actor_is_gone(f"job/{job_id}"), 15, "the stopped job's actor to exit")
    activate_job_actor(storage_url, job_id)
    for _ in range(3):
        ask(job_id, "tick")

    state = manager.get(job_id)
    assert (state.status, state.stop_finalized) == (S.STOPPED, True)
    assert len(starts(job_id)) == 2
    assert hook_calls(job_id, "on_before_resuming_job_steps") == []
    assert len(hook_calls(job_id, "on_stopped")) == 1
    assert ask(job_id, "active_steps") == 0
    assert sorted(s.status for s in stored_steps(storage_url, job_id)) == [
        cr.StepStatus.STOPPED,
        cr.StepStatus.STOPPED,
    ]


# -- 5. remove ------------------------------------------------------------------------------------


def assert_removed(storage_url: str, manager: cr.JobsManager, job_id: str) -> None:
    assert stored_job(storage_url, job_id) is None
    assert stored_steps(storage_url, job_id) == []

    async def counted(storage: Storage) -> dict[CountedKind, list[str]]:
        return {kind: await storage.list_counted(job_id, kind) for kind in CountedKind}

    assert in_storage(storage_url, counted) == {kind: [] for kind in CountedKind}
    assert operation_error(lambda: manager.get(job_id)) is cr.JobLookupError.JOB_NOT_FOUND


def test_remove__a_completed_job_is_cleared(connect: Any, scope: str, storage_url: str) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, Traced, Work(n=0), Work(n=1, always_fail=True))
    assert manager.wait(job_id, timeout=30).status is S.COMPLETED_WITH_FAILURES

    manager.remove(job_id)
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")

    assert_removed(storage_url, manager, job_id)
    assert len(starts(job_id)) == 2


def test_remove_while_steps_run__leaves_no_step_record_and_no_job_record(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, Windowed, *(Work(n=n, block=True) for n in range(4)))
    wait_started(job_id, 2)

    manager.remove(job_id)
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")

    assert_removed(storage_url, manager, job_id)
    assert sorted(n for _, _, n, outcome in ends(job_id) if outcome == "stopped") == [0, 1]
    assert len(starts(job_id)) == 2
    assert len(hook_calls(job_id, "on_stopped")) == 1


def test_remove__on_stopped_throws_twice__finishes_on_the_timer(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    # Admission refuses the stage: no step is running, so only the job's timer retries.
    job_id = start(manager, AdmittedOnFlagStopHookFailsTwice, Work(n=0))
    eventually(lambda: hook_calls(job_id, "admit_stage"), 10, "admission to be asked")

    manager.remove(job_id)
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")

    calls = hook_calls(job_id, "on_stopped")
    assert len(calls) == 3
    # 1 s after the first failure, then 2 s after the second.
    assert calls[1] - calls[0] >= 0.95
    assert calls[2] - calls[1] >= 1.9
    assert_removed(storage_url, manager, job_id)
    assert starts(job_id) == []


def test_remove__unfinished_when_the_job_actor_dies__is_finished_on_reactivation(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, Traced, Work(n=0, ignore_stop=True))
    wait_started(job_id, 1)
    manager.remove(job_id)

    kill_job_actor(job_id)  # REMOVING is stored; the step has not reported
    removing = stored_job(storage_url, job_id)
    assert removing is not None and removing.status is S.REMOVING
    set_flag(job_id, "go")
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")

    assert_removed(storage_url, manager, job_id)
    assert len(hook_calls(job_id, "on_stopped")) == 1


def test_remove__a_failed_finish_runs_again_on_the_steps_next_report(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, StopHookFailsTwice, Work(n=0, block=True))
    wait_started(job_id, 1)

    manager.remove(job_id)
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")

    calls = hook_calls(job_id, "on_stopped")
    assert len(calls) == 3
    # The job answered the step's stop report with an error, so the step reported again after
    # step_delivery_retry_delay (0.1 s here) and that report ran the finish again: sooner than
    # the job's own timer (1 s).
    assert calls[1] - calls[0] < 0.9
    assert_removed(storage_url, manager, job_id)


def test_remove__already_being_removed_answers_job_is_already_being_removed(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, Traced, Work(n=0, ignore_stop=True), Work(n=1, block=True))
    wait_started(job_id, 2)

    manager.remove(job_id)
    removing = stored_job(storage_url, job_id)
    assert removing is not None and removing.status is S.REMOVING  # the step still runs
    # Should the answer wait for the last step to report, let that step end meanwhile.
    threading.Timer(1.0, set_flag, (job_id, "go")).start()
    assert operation_error(lambda: manager.remove(job_id)) is (
        cr.RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED
    )

    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the job record to go")
    assert_removed(storage_url, manager, job_id)


def test_remove__already_being_removed_answers_unknown_when_the_finish_fails_again(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "remove")
    job_id = start(manager, AdmittedOnFlagStopHookFailsWhileFlagged, Work(n=0))
    eventually(lambda: hook_calls(job_id, "admit_stage"), 10, "admission to be asked")
    set_flag(job_id, "hook-fails")
    manager.remove(job_id)
    assert len(hook_calls(job_id, "on_stopped")) >= 1

    assert operation_error(lambda: manager.remove(job_id)) is cr.RemoveJobError.UNKNOWN
    assert len(hook_calls(job_id, "on_stopped")) >= 2
    removing = stored_job(storage_url, job_id)
    assert removing is not None and removing.status is S.REMOVING

    clear_flag(job_id, "hook-fails")
    eventually(lambda: stored_job(storage_url, job_id) is None, 15, "the timer to finish")
    assert_removed(storage_url, manager, job_id)


# -- 6. the watchdog ------------------------------------------------------------------------------


def drop_deliveries(job_id: str) -> None:
    hosts = step_hosts()
    assert hosts
    ray.get([host.drop_deliveries.remote([job_id]) for host in hosts])


def test_watchdog__settles_an_outcome_whose_delivery_was_dropped(
    connect: Any, scope: str, storage_url: str
) -> None:
    # The hosts give up delivering soon: the watchdog is what settles the outcomes.
    options = {"job_watchdog_interval": HAND_DRIVEN, "step_delivery_max_attempts": 2}
    manager = connect(**options).manager(scope, "watchdog")
    job_id = start(
        manager,
        Traced,
        Work(n=0, block=True),
        Work(n=1, block=True),
        Work(n=2, block=True, always_fail=True),
    )
    wait_started(job_id, 3)
    eventually(lambda: ask(job_id, "watchdog_ticks") >= 1, 10, "the watchdog's first tick")
    drop_deliveries(job_id)

    set_flag(job_id, "go")
    eventually(lambda: len(ends(job_id)) == 3, 10, "every step to end")
    eventually(
        lambda: (
            [s.status for s in stored_steps(storage_url, job_id)]
            == [cr.StepStatus.COMPLETED_WITH_FAILURE]
        ),
        10,
        "the outcomes to be stored",
    )
    eventually(lambda: hosts_done_with(job_id), 15, "the hosts to give up delivering")
    assert manager.get(job_id).status is S.RUNNING, "no report arrived"
    assert ask(job_id, "active_steps") == 3

    ask(job_id, "tick")
    state = manager.wait(job_id, timeout=10)

    assert state.status is S.COMPLETED_WITH_FAILURES
    assert progress(state) == {
        "total": 3,
        "successful": 2,
        "failed": 1,
        "stopped": 0,
        "unreachable": 0,
    }
    assert len(starts(job_id)) == 3


def test_watchdog__settles_dropped_outcomes_on_its_own(connect: Any, scope: str) -> None:
    manager = connect().manager(scope, "watchdog")
    job_id = start(manager, Traced, *(Work(n=n, block=True) for n in range(3)))
    wait_started(job_id, 3)
    drop_deliveries(job_id)

    set_flag(job_id, "go")
    state = manager.wait(job_id, timeout=20)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 3,
        "successful": 3,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }


def test_watchdog__resume_hook_backoff_skips_1_3_7_15_ticks(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect(job_watchdog_interval=HAND_DRIVEN).manager(scope, "watchdog")
    job_id = start(manager, ResumeHookFails, Work(n=0, block=True), Work(n=1, block=True))
    wait_started(job_id, 2)

    kill_job_actor(job_id)  # reactivated RUNNING: the resume hook runs, and throws
    eventually(
        lambda: ask(job_id, "watchdog_ticks") >= 1,
        15,
        "the reactivated job's first (background) tick",
    )
    calls = len(
        eventually(
            lambda: (c := hook_calls(job_id, "on_before_resuming_job_steps"))[1:] and c,
            10,
            "the hook to be called by that tick",
        )
    )
    called_at: list[int] = [1] * (calls - 1)  # the first call ran on activation, before a tick
    assert calls == 2, "on activation, then again on the next tick"
    ticks = 1
    while ticks < 34:
        ask(job_id, "tick")
        ticks = ask(job_id, "watchdog_ticks")
        now = len(hook_calls(job_id, "on_before_resuming_job_steps"))
        called_at += [ticks] * (now - calls)
        calls = now
        if calls <= ResumeHookFails.FAILURES:
            # Until the hook succeeds the job stays RUNNING and starts nothing (the steps still
            # running on their hosts are adopted, not started).
            assert len(starts(job_id)) == 2
            assert ask(job_id, "state").status is S.RUNNING

    # Retried on the next tick, then after skipping 1, 3, 7 and 15 ticks; then it succeeded.
    assert called_at == [1, 3, 7, 15, 31]
    assert len(starts(job_id)) == 2, "the running steps were adopted, not started again"
    assert ask(job_id, "active_steps") == 2
    set_flag(job_id, "go")
    state = manager.wait(job_id, timeout=20)
    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state)["successful"] == 2


def test_watchdog__recounts_from_storage_and_completes_when_every_step_is_done(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect(job_watchdog_interval=HAND_DRIVEN).manager(scope, "watchdog")
    job_id = start(manager, ResumeHookFailsOnce, Work(n=0, block=True), Work(n=1, block=True))
    wait_started(job_id, 2)
    kill_job_actor(job_id)  # reactivated: the job recounts, then its resume hook throws
    eventually(lambda: hook_calls(job_id, "on_before_resuming_job_steps"), 15, "the resume hook")

    # The steps end while the hook is owed: their reports reach a job that does not count them.
    set_flag(job_id, "go")
    eventually(lambda: len(ends(job_id)) == 2, 10, "both steps to end")
    eventually(lambda: stored_steps(storage_url, job_id) == [], 10, "both outcomes stored")
    eventually(lambda: hosts_done_with(job_id), 10, "the reports to be delivered")
    for _ in range(3):  # the hook succeeds on the first; storage shows every step done
        ask(job_id, "tick")
    state = manager.wait(job_id, timeout=10)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 2,
        "successful": 2,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    assert len(starts(job_id)) == 2
    assert len(hook_calls(job_id, "on_before_resuming_job_steps")) == 2


def test_watchdog__asks_admission_again(connect: Any, scope: str) -> None:
    manager = connect().manager(scope, "watchdog")
    job_id = start(manager, AdmittedOnFlag, Work(n=0), Work(n=1))
    eventually(
        lambda: len(hook_calls(job_id, "admit_stage")) >= 3,
        10,
        "admission to be asked on later ticks",
    )
    assert starts(job_id) == []
    assert manager.get(job_id).status is S.RUNNING

    set_flag(job_id, "admit")
    state = manager.wait(job_id, timeout=20)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state)["successful"] == 2


@pytest.mark.parametrize(
    "interval",  # 5 s each on Ray: zero in the default tier, the others in the slow tier
    [
        pytest.param(0, id="zero"),
        pytest.param(-5, id="negative", marks=pytest.mark.slow),
        pytest.param(math.inf, id="infinite", marks=pytest.mark.slow),
    ],
)
def test_watchdog__zero_negative_or_infinite_interval_turns_it_off(
    connect: Any, scope: str, interval: float
) -> None:
    manager = connect(job_watchdog_interval=interval).manager(scope, "watchdog")
    job_id = start(manager, Traced, Work(n=0, block=True))
    wait_started(job_id, 1)
    # Activated (its saves repeat), with no watchdog to tick.
    tasks = eventually(lambda: (t := ask(job_id, "tasks")) and "save" in t and t, 10, "activation")
    assert "watchdog" not in tasks
    assert ask(job_id, "watchdog_ticks") == 0
    set_flag(job_id, "go")
    assert manager.wait(job_id, timeout=20).status is S.COMPLETED_SUCCESSFULLY


def test_startup_interrupted_with_a_saved_plan__finishes_through_resume(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "watchdog")
    outcome: list[object] = []

    def start_job() -> None:
        try:
            outcome.append(manager.start(AdmissionWaits, Plan(steps=[Work(n=0), Work(n=1)])))
        except Exception as error:  # the job actor dies under this call
            outcome.append(error)

    starter = threading.Thread(target=start_job)
    starter.start()
    (job,) = eventually(lambda: manager.list(), 15, "the job record")
    job_id = job.id
    _STARTED.append(job_id)
    eventually(lambda: hook_calls(job_id, "admit_stage"), 15, "admission to be asked")
    interrupted = stored_job(storage_url, job_id)
    assert interrupted is not None
    assert (interrupted.status, interrupted.has_plan) == (S.STARTING_STEPS, True)

    kill_job_actor(job_id)
    set_flag(job_id, "admit")
    state = manager.wait(job_id, timeout=30)
    starter.join(timeout=30)

    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 2,
        "successful": 2,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
    assert sorted(n for _, _, n in starts(job_id)) == [0, 1]
    assert outcome, "the start call returned"


def test_delivery__a_repeated_outcome_is_counted_once(connect: Any, scope: str) -> None:
    manager = connect().manager(scope, "watchdog")
    job_id = start(manager, Traced, Work(n=0), Work(n=1, block=True))
    eventually(
        lambda: manager.get(job_id).progress.successful_steps == 1,
        15,
        "the first outcome to be counted",
    )
    ids = step_ids_by_n(job_id)
    done = Outcome(ids[0], 1, cr.StepStatus.COMPLETED_SUCCESSFULLY)
    not_running = Outcome(ids[1], 2, cr.StepStatus.COMPLETED_SUCCESSFULLY)

    for _ in range(2):  # a delivery repeated after a lost acknowledgement
        ray.get(job_actor(job_id).report_outcomes.remote([done, not_running]))
    saved(job_id)

    assert manager.get(job_id).progress.successful_steps == 1
    assert ask(job_id, "active_steps") == 1
    set_flag(job_id, "go")
    state = manager.wait(job_id, timeout=20)
    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert progress(state) == {
        "total": 2,
        "successful": 2,
        "failed": 0,
        "stopped": 0,
        "unreachable": 0,
    }
