"""The step host on real Ray: what a perform raises never strands its batch or the host, and a
lease renewal never turns a stored outcome back into RUNNING.

The step types are in `step_host_jobs`; the tests assert on the job's counts, on storage
and on what the hosts still hold, never on timings.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.core.messages import StepStart, starts_to_wire
from choreography_ray.model import JobState, StatusChange
from choreography_ray.runtime.step_host import StepHost
from choreography_ray.storage import PlannedStep, StepUpdate, Storage
from choreography_ray.types import type_path
from tests.runtime.conftest import FAST
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.runtime.step_host_jobs import AsyncCaseStep, Case, CasesJob, CasesRequest
from tests.support import eventually, in_storage

#: The Ray namespace the `connect` fixture puts every actor in.
RAY_NAMESPACE = "choreography-tests"
#: Seconds a small job gets to finish: far more than it needs, far less than the test timeout.
WAIT = 30.0
UNASKED = "perform raised CancelledError without being stopped"


def step_hosts() -> list[Any]:
    return [
        ray.get_actor(actor["name"], namespace=RAY_NAMESPACE)
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"].startswith("step-host/")
    ]


def held_by_hosts(job_id: str) -> int:
    """How many of the job's steps the step hosts still hold (running or reporting)."""
    return sum(
        len(ids)
        for ids, _incarnation in ray.get([h.running_steps.remote(job_id) for h in step_hosts()])
    )


def held_jobs() -> set[str]:
    """The jobs the step hosts keep entries of."""
    return {job for held in ray.get([h.held_jobs.remote() for h in step_hosts()]) for job in held}


def messages(manager: cr.JobsManager, job_id: str) -> dict[int, str]:
    """The last exception message of each stored step, by case number."""
    return {
        s.request["n"]: s.status_changes[-1].exception_messages[0]
        for s in manager.steps(job_id)
        if s.status_changes and s.status_changes[-1].exception_messages
    }


@pytest.mark.timeout(120)
def test_cancelled_error_unasked__step_failed_and_its_batch_runs(connect, scope) -> None:  # type: ignore[no-untyped-def]
    manager = connect().manager(scope, "step-host")
    raising = {3: "now", 8: "later", 13: "now", 18: "later"}
    cases = [
        Case(n=n, behaviour="cancelled", where=raising[n]) if n in raising else Case(n=n)
        for n in range(20)
    ]
    started = manager.start(CasesJob, CasesRequest(cases=cases))
    assert started.error is None

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    progress = state.progress
    assert (progress.successful_steps, progress.failed_steps, progress.stopped_steps) == (16, 4, 0)
    assert messages(manager, started.job_id) == dict.fromkeys(raising, UNASKED)


@pytest.mark.timeout(120)
def test_keyboard_interrupt_and_system_exit__step_failed_and_host_survives(  # type: ignore[no-untyped-def]
    connect, scope
) -> None:
    manager = connect().manager(scope, "step-host")
    raising: list[Case] = [
        Case(n=0, behaviour="keyboard_interrupt", where="now"),
        Case(n=1, behaviour="keyboard_interrupt", where="later"),
        Case(n=2, behaviour="keyboard_interrupt", where="sync"),
        Case(n=3, behaviour="system_exit", where="now"),
        Case(n=4, behaviour="system_exit", where="later"),
        Case(n=5, behaviour="system_exit", where="sync"),
        Case(n=6, behaviour="cancelled", where="sync"),
    ]
    fine = [Case(n=7 + i, where=("now", "later", "sync")[i % 3]) for i in range(6)]
    started = manager.start(CasesJob, CasesRequest(cases=raising + fine))

    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (6, 7)
    assert messages(manager, started.job_id) == {
        0: "KeyboardInterrupt: case 0",
        1: "KeyboardInterrupt: case 1",
        2: "KeyboardInterrupt: case 2",
        3: "SystemExit: case 3",
        4: "SystemExit: case 4",
        5: "SystemExit: case 5",
        6: UNASKED,
    }
    # The hosts live on and run the next job.
    again = manager.start(CasesJob, CasesRequest(cases=fine))
    assert manager.wait(again.job_id, timeout=WAIT).status is cr.JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.timeout(120)
def test_cancelled_error_after_stop__step_stopped(connect, scope) -> None:  # type: ignore[no-untyped-def]
    manager = connect().manager(scope, "step-host")
    cases = [Case(n=n, behaviour="cancelled", where="stop") for n in range(3)]
    started = manager.start(CasesJob, CasesRequest(cases=cases))
    eventually(lambda: held_by_hosts(started.job_id) == 3, WAIT, "3 steps running")

    manager.stop(started.job_id)

    # The stop is final once every step reported it (not when the counts first say 3).
    state = manager.wait(started.job_id, timeout=WAIT)
    assert (state.status, state.stop_finalized) == (cr.JobStatus.STOPPED, True)
    assert (state.progress.stopped_steps, state.progress.failed_steps) == (3, 0)


@pytest.mark.timeout(180)
def test_lease_renewal__never_turns_a_stored_outcome_back_to_running(  # type: ignore[no-untyped-def]
    connect, scope, storage_url
) -> None:
    manager = connect(step_lease_timeout=0.3).manager(scope, "step-host")
    started = manager.start(FanOut, FanOutRequest(count=3_000, fail_every=1))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 3_000
    # Once no host holds a step of the job, nothing renews its leases any more: what storage
    # holds now is final.
    eventually(lambda: held_by_hosts(started.job_id) == 0, WAIT, "hosts to let the steps go")
    counts = in_storage(storage_url, lambda s: s.count_by_status(started.job_id))
    assert counts == {(0, cr.StepStatus.COMPLETED_WITH_FAILURE): 3_000}


@pytest.mark.timeout(120)
def test_host_entries__dropped_once_a_job_has_nothing_left_there(connect, scope) -> None:  # type: ignore[no-untyped-def]
    manager = connect().manager(scope, "step-host")
    done = manager.start(CasesJob, CasesRequest(cases=[Case(n=n) for n in range(5)]))
    removed = manager.start(
        CasesJob, CasesRequest(cases=[Case(n=n, where="stop") for n in range(3)])
    )
    assert manager.wait(done.job_id, timeout=WAIT).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    eventually(lambda: held_by_hosts(removed.job_id) == 3, WAIT, "3 steps running")

    manager.remove(removed.job_id)

    eventually(
        lambda: removed.job_id not in {j.id for j in manager.list()}, WAIT, "the removal done"
    )
    eventually(
        lambda: not held_jobs() & {done.job_id, removed.job_id},
        WAIT,
        "hosts to drop both jobs' entries",
    )


@pytest.mark.timeout(120)
def test_status_history__a_step_done_at_launch_writes_only_its_outcome_a_later_one_running_first(  # type: ignore[no-untyped-def]
    connect, scope
) -> None:
    """A first attempt launches before its RUNNING write joins the group commit: one that is
    done at launch never writes RUNNING; one that awaits has RUNNING stored before its outcome."""
    manager = connect().manager(scope, "step-host")
    cases = [Case(n=0, behaviour="fail", where="now"), Case(n=1, behaviour="fail", where="later")]
    started = manager.start(CasesJob, CasesRequest(cases=cases))
    state = manager.wait(started.job_id, timeout=WAIT)

    assert state.progress.failed_steps == 2
    history = {
        s.request["n"]: [c.status for c in s.status_changes] for s in manager.steps(started.job_id)
    }
    failed, running = cr.StepStatus.COMPLETED_WITH_FAILURE, cr.StepStatus.RUNNING
    assert history == {0: [failed], 1: [running, failed]}


# -- a reactivating job fences its starts (soak 105) ----------------------------------------------


def host_with_failed_steps(storage_url: str, capacity: int) -> tuple[Any, str, tuple[str, str]]:
    """A step host of its own, and a job whose steps "a" and "b" are stored FAILED at attempt 1
    (each step, once started, runs until it is told to stop): (host, job id, its context)."""
    job_id = f"fence-{uuid.uuid4().hex[:8]}"
    request = Case(n=0, where="stop").model_dump_json()

    async def seed(storage: Storage) -> None:
        await storage.create_job(JobState(id=job_id, scope="fence", namespace="t", type="T"))
        await storage.insert_plan(
            job_id, [PlannedStep(s, type_path(AsyncCaseStep), 0, request) for s in "ab"]
        )
        change = StatusChange(status=cr.StepStatus.FAILED)
        failed = cr.StepStatus.FAILED
        await storage.update_steps([StepUpdate(job_id, s, failed, 1, None, change) for s in "ab"])

    in_storage(storage_url, seed)
    host = StepHost.options(name=f"test-fence/{job_id}").remote(RAY_NAMESPACE, capacity)  # type: ignore[attr-defined]
    return host, job_id, (storage_url, cr.JobsOptions(**FAST).model_dump_json())


def starts(step_id: str, attempt: int) -> bytes:
    request = Case(n=0, where="stop").model_dump_json()
    return starts_to_wire([StepStart(step_id, type_path(AsyncCaseStep), 0, attempt, request)])


@contextmanager
def write_lock(storage_url: str) -> Iterator[sqlite3.Connection]:
    """This process holds SQLite's write lock: other writers wait (readers do not, in WAL)."""
    connection = sqlite3.connect(storage_url.removeprefix("sqlite:///"), isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    try:
        yield connection
    finally:
        connection.execute("ROLLBACK")
        connection.close()


def stored(storage_url: str, job_id: str, step_id: str) -> tuple[cr.StepStatus, int]:
    step = in_storage(storage_url, lambda s: s.get_step(job_id, step_id))
    assert step is not None
    return step.status, step.attempt


@pytest.mark.timeout(120)
def test_fence__waits_for_a_later_attempts_running_write_then_lists_it(  # type: ignore[no-untyped-def]
    ray_cluster, storage_url
) -> None:
    """A retry whose RUNNING write waits (here on a lock) is not listed as running yet; a fenced
    ask waits for that write, so a reactivating job reads storage only after it: it then finds
    the step RUNNING and adopts it, never counting the failure the write replaces."""
    host, job_id, context = host_with_failed_steps(storage_url, capacity=4)
    try:
        # "a" runs first: the host has its storage open before the lock is taken.
        assert (
            ray.get(host.start_steps.remote(job_id, context, starts("a", 2)), timeout=WAIT)[0] == 1
        )
        with write_lock(storage_url) as locked:
            started = host.start_steps.remote(job_id, context, starts("b", 2))
            assert ray.get(host.running_steps.remote(job_id), timeout=WAIT)[0] == ["a"]
            fenced = host.running_steps.remote(job_id, True)
            ready, _ = ray.wait([fenced], timeout=1.0)
            assert not ready, "the fenced ask answered before the RUNNING write was stored"
            row = locked.execute(
                "SELECT status, attempt FROM job_steps WHERE job_id = ? AND step_id = 'b'",
                (job_id,),
            ).fetchone()
            assert row == (cr.StepStatus.FAILED.value, 1)

        assert sorted(ray.get(fenced, timeout=WAIT)[0]) == ["a", "b"]
        assert ray.get(started, timeout=WAIT)[0] == 1
        assert stored(storage_url, job_id, "b") == (cr.StepStatus.RUNNING, 2)
    finally:
        ray.kill(host)


@pytest.mark.timeout(120)
def test_fence__refuses_a_start_still_waiting_for_room(ray_cluster, storage_url) -> None:  # type: ignore[no-untyped-def]
    """A start that waits for room when the job reactivates was sent by the activation before:
    it is refused, and its step never runs over the outcome the new activation counts."""
    host, job_id, context = host_with_failed_steps(storage_url, capacity=1)
    try:
        assert (
            ray.get(host.start_steps.remote(job_id, context, starts("a", 2)), timeout=WAIT)[0] == 1
        )
        waiting = host.start_steps.remote(job_id, context, starts("b", 2))  # no room for it

        assert ray.get(host.running_steps.remote(job_id, True), timeout=WAIT)[0] == ["a"]
        with pytest.raises(ray.exceptions.RayTaskError, match="reactivated"):
            ray.get(waiting, timeout=WAIT)
        ray.get(host.lift_fence.remote(job_id), timeout=WAIT)
        assert stored(storage_url, job_id, "b") == (cr.StepStatus.FAILED, 1)
        # A start sent after the fence waits for room as any other.
        again = host.start_steps.remote(job_id, context, starts("b", 2))
        ray.get(host.cancel_steps.remote(job_id), timeout=WAIT)
        assert ray.get(again, timeout=WAIT)[0] == 1
    finally:
        ray.kill(host)


@pytest.mark.timeout(120)
def test_epochs__a_start_of_an_older_activation_is_refused_once_a_newer_one_asked(
    ray_cluster, storage_url
) -> None:  # type: ignore[no-untyped-def]
    """Once an activation of a newer epoch has asked the host (a read of the job's steps), a
    start of an older activation is refused, also one that waited for room meanwhile; the
    newer activation's starts run."""
    host, job_id, context = host_with_failed_steps(storage_url, capacity=1)
    labels = ("unit", "epochs", "job")
    try:
        started = host.start_steps.remote(job_id, context, starts("a", 2), labels, 5)
        assert ray.get(started, timeout=WAIT)[0] == 1
        waiting = host.start_steps.remote(job_id, context, starts("b", 2), labels, 5)

        assert ray.get(host.running_steps.remote(job_id, False, 6), timeout=WAIT)[0] == ["a"]
        with pytest.raises(ray.exceptions.RayTaskError, match="StaleActivationError"):
            ray.get(waiting, timeout=WAIT)
        late = host.start_steps.remote(job_id, context, starts("b", 2), labels, 5)
        with pytest.raises(ray.exceptions.RayTaskError, match="epoch 5 is older than 6"):
            ray.get(late, timeout=WAIT)
        assert stored(storage_url, job_id, "b") == (cr.StepStatus.FAILED, 1)

        newer = host.start_steps.remote(job_id, context, starts("b", 2), labels, 6)
        ray.get(host.cancel_steps.remote(job_id), timeout=WAIT)
        assert ray.get(newer, timeout=WAIT)[0] == 1
    finally:
        ray.kill(host)


@pytest.mark.timeout(120)
def test_fence__holds_the_jobs_outcome_writes_until_it_is_lifted(ray_cluster, storage_url) -> None:  # type: ignore[no-untyped-def]
    """While a resuming job reads storage nothing of it changes there: a step that ends under
    the fence (here it succeeds once told to stop) stays running here and unwritten, and is
    written once the job lifts the fence."""
    host, job_id, context = host_with_failed_steps(storage_url, capacity=4)
    try:
        assert (
            ray.get(host.start_steps.remote(job_id, context, starts("a", 2)), timeout=WAIT)[0] == 1
        )
        assert ray.get(host.running_steps.remote(job_id, True), timeout=WAIT)[0] == ["a"]

        assert ray.get(host.cancel_steps.remote(job_id), timeout=WAIT) == 1  # "a" ends
        eventually(
            lambda: ray.get(host.fenced_writes.remote(job_id), timeout=WAIT) == 1,
            WAIT,
            "the outcome's write to wait for the fence",
        )
        assert stored(storage_url, job_id, "a") == (cr.StepStatus.RUNNING, 2)
        assert ray.get(host.running_steps.remote(job_id), timeout=WAIT)[0] == ["a"]

        ray.get(host.lift_fence.remote(job_id), timeout=WAIT)
        eventually(
            lambda: in_storage(storage_url, lambda s: s.get_step(job_id, "a")) is None,
            WAIT,
            "the success written (the record deleted) once the fence is lifted",
        )
        eventually(lambda: not ray.get(host.running_steps.remote(job_id))[0], WAIT, "a let go")
    finally:
        ray.kill(host)
