"""Rehydration on real Ray: what a manager's `rehydrate()` does to the jobs a dead cluster left
behind, and how the recovery actor finds the keys to rehydrate.

The state a dead cluster leaves is written straight into the test's SQLite file (jobs, their
step plans, the key catalog); then a manager rehydrates it, or the recovery actor does when a
connection registers the storage. Hooks and steps record what they do in files (see
`rehydration_jobs`).
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.runtime.names import manager_name
from choreography_ray.storage import CountedKind, Storage
from choreography_ray.types import type_path
from tests.runtime.conftest import actor_is_gone
from tests.runtime.rehydration_jobs import (
    RecordedJob,
    RecordedStep,
    SlowResumeJob,
    events_dir,
    events_file,
    flaky_keys_path,
)
from tests.support import RAY_NAMESPACE, eventually, in_storage, left_behind, read_trace, seed_job

#: An hour ago: jobs left by a cluster that died a while back.
EPOCH = datetime.now(UTC) - timedelta(hours=1)


# -- helpers --------------------------------------------------------------------------------------


def seed_recorded_job(
    url: str,
    *,
    scope: str,
    namespace: str,
    status: cr.JobStatus,
    log: str,
    steps: list[tuple[int, cr.StepStatus]],
    job_type: str = type_path(RecordedJob),
    created: datetime = EPOCH,
    has_plan: bool = True,
    stop_finalized: bool = False,
    started: frozenset[int] = frozenset({0}),
    succeeded: int = 0,
    stopped_counted: tuple[str, ...] = (),
) -> str:
    """Writes a job of `RecordedStep`s logging to `log` as a dead cluster left it (see
    `tests.support.left_behind`), and returns its id."""
    state, records = left_behind(
        scope=scope,
        namespace=namespace,
        status=status,
        job_type=job_type,
        step_type=type_path(RecordedStep),
        steps=steps,
        created=created,
        request={"log": log, "steps": len(steps) + succeeded},
        step_request={"log": log, "sleep": 0.05},
        has_plan=has_plan,
        stop_finalized=stop_finalized,
        started=started,
        succeeded=succeeded,
    )
    return seed_job(url, state, records, stopped_counted=stopped_counted)


def get_job(url: str, job_id: str) -> cr.JobState | None:
    return in_storage(url, lambda s: s.get_job(job_id))


def wait_status(url: str, job_id: str, *statuses: cr.JobStatus, timeout: float = 60) -> cr.JobState:
    def settled() -> cr.JobState | None:
        state = get_job(url, job_id)
        return state if state is not None and state.status in statuses else None

    return eventually(settled, timeout, f"job {job_id} to be one of {statuses}")


def drain_stats(scope: str, namespace: str) -> dict[str, Any]:
    manager: Any = ray.get_actor(manager_name(scope, namespace), namespace=RAY_NAMESPACE)
    stats: dict[str, Any] = ray.get(manager.drain_stats.remote())
    return stats


def wait_drained(scope: str, namespace: str, timeout: float = 60) -> dict[str, Any]:
    return eventually(
        lambda: (lambda s: s if s["done"] else None)(drain_stats(scope, namespace)),
        timeout,
        "the rehydration drain to finish",
    )


def ran(log: str, job_id: str) -> Counter[str]:
    """How many times each step of the job ran to its end."""
    return Counter(r["step"] for r in read_trace(log) if r["job"] == job_id and r["event"] == "end")


@pytest.fixture
def events(scope: str) -> Iterator[None]:
    yield
    for path in events_dir().glob(f"{scope}*"):
        path.unlink(missing_ok=True)


# -- stops left behind are finished, never resumed ------------------------------------------------


@pytest.mark.timeout(120)
def test_stopped_and_removing_jobs_left_behind_are_finished_not_resumed(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    jobs = connect(reconciliation_interval=0)
    manager = jobs.manager(scope, "left")
    log = str(tmp_path / "steps.jsonl")
    # Stage 0 had started: one step recorded its stop, one was running when the cluster died.
    # Stage 1 never started: its steps have nothing to stop and are left alone.
    layout = [
        (0, cr.StepStatus.STOPPED),
        (0, cr.StepStatus.RUNNING),
        (1, cr.StepStatus.SCHEDULED),
        (1, cr.StepStatus.SCHEDULED),
    ]
    stopped = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="left",
        status=cr.JobStatus.STOPPED,
        log=log,
        steps=layout,
        succeeded=1,
        stopped_counted=("000001",),
    )
    removing = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="left",
        status=cr.JobStatus.REMOVING,
        log=log,
        steps=layout,
        succeeded=1,
        stopped_counted=("000001",),
        created=EPOCH + timedelta(seconds=1),
    )

    snapshot = manager.rehydrate()
    assert snapshot == [stopped, removing]

    eventually(
        lambda: (lambda j: j is not None and j.stop_finalized)(get_job(storage_url, stopped)),
        60,
        "the stop to be finalized",
    )
    eventually(lambda: get_job(storage_url, removing) is None, 60, "the removal to complete")
    wait_drained(scope, "left")

    # The removal completed: the job, its steps and its counted records are gone.
    async def leftovers(storage: Storage) -> tuple[int, int, int]:
        return (
            len(await storage.list_steps(removing)),
            await storage.count_counted(removing, CountedKind.STOPPED),
            await storage.count_counted(removing, CountedKind.COMPLETED),
        )

    assert in_storage(storage_url, leftovers) == (0, 0, 0)
    # The stopped job stays stopped; its never-started stage is left alone.
    state = get_job(storage_url, stopped)
    assert state is not None
    assert state.status is cr.JobStatus.STOPPED
    steps = in_storage(storage_url, lambda s: s.list_steps(stopped))
    assert {s.step_id: s.status for s in steps if s.stage == 1} == {
        "000003": cr.StepStatus.SCHEDULED,
        "000004": cr.StepStatus.SCHEDULED,
    }
    # on_stopped ran once for each; nothing resumed and no step ran.
    assert Counter(e["job"] for e in read_trace(events_file(scope, "stopped"))) == {
        stopped: 1,
        removing: 1,
    }
    assert read_trace(events_file(scope, "resumed")) == []
    assert read_trace(log) == []

    # A later pass leaves the finalized stop alone: on_stopped does not run again.
    assert manager.rehydrate() == []
    wait_drained(scope, "left")
    eventually(lambda: actor_is_gone(f"job/{stopped}"), 15, "the stopped job's actor to exit")
    assert Counter(e["job"] for e in read_trace(events_file(scope, "stopped"))) == {
        stopped: 1,
        removing: 1,
    }
    assert get_job(storage_url, stopped).stop_finalized  # type: ignore[union-attr]


# -- no plan: MISSING_STEP_PLAN; a saved plan: the job continues ----------------------------------


@pytest.mark.timeout(120)
def test_job_without_plan_fails_with_missing_step_plan_and_one_with_a_plan_continues(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    jobs = connect(reconciliation_interval=0)
    manager = jobs.manager(scope, "preparing")
    log = str(tmp_path / "steps.jsonl")
    no_plan = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="preparing",
        status=cr.JobStatus.PREPARING_JOB,
        log=log,
        steps=[],
        has_plan=False,
    )
    planned = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="preparing",
        status=cr.JobStatus.PREPARING_STEPS,
        log=log,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 3,
        started=frozenset(),
        created=EPOCH + timedelta(seconds=1),
    )

    assert manager.rehydrate() == [no_plan, planned]

    failed = wait_status(storage_url, no_plan, cr.JobStatus.FAILED)
    assert cr.CannotResumeJobError.MISSING_STEP_PLAN in (failed.error or "")
    with pytest.raises(cr.JobOperationError) as raised:
        manager.resume(no_plan)
    assert raised.value.error is cr.CannotResumeJobError.MISSING_STEP_PLAN
    assert get_job(storage_url, no_plan).status is cr.JobStatus.FAILED  # type: ignore[union-attr]

    # Interrupted while preparing, with its plan saved: continues from that plan.
    done = manager.wait(planned, timeout=60)
    assert done.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert done.progress.successful_steps == 3
    assert ran(log, planned) == {"000000": 1, "000001": 1, "000002": 1}


# -- a type that cannot be imported fails its job; the drain goes on ------------------------------


@pytest.mark.timeout(120)
def test_unimportable_job_type_is_failed_and_the_drain_goes_on(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    jobs = connect(reconciliation_interval=0, max_concurrent_rehydration=1)
    manager = jobs.manager(scope, "types")
    log = str(tmp_path / "steps.jsonl")
    broken = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="types",
        status=cr.JobStatus.RUNNING,
        log=log,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
        job_type="nope.missing:Job",
    )
    # One step succeeded before the cluster died (its record is gone), one was running.
    good = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="types",
        status=cr.JobStatus.RUNNING,
        log=log,
        succeeded=1,
        steps=[
            (0, cr.StepStatus.RUNNING),
            (0, cr.StepStatus.SCHEDULED),
            (0, cr.StepStatus.SCHEDULED),
        ],
        created=EPOCH + timedelta(seconds=1),
    )

    assert manager.rehydrate() == [broken, good]

    state = wait_status(storage_url, broken, cr.JobStatus.FAILED)
    assert "nope.missing:Job" in (state.error or "")
    assert any("nope.missing:Job" in m for c in state.status_changes for m in c.exception_messages)
    done = manager.wait(good, timeout=60)
    assert done.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert done.progress.successful_steps == done.progress.total_steps == 4
    # Only the unfinished prepared steps ran, each once; the job kept its id, scope and key.
    assert ran(log, good) == {"000001": 1, "000002": 1, "000003": 1}
    assert (done.id, done.scope, done.namespace) == (good, scope, "types")
    assert wait_drained(scope, "types")["drained"] == [broken, good]


# -- the drain: bounded and oldest first ----------------------------------------------------------


@pytest.mark.timeout(180)
def test_drain_runs_at_most_max_concurrent_rehydration_resumes_oldest_first(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    limit, count = 3, 8
    jobs = connect(reconciliation_interval=0, max_concurrent_rehydration=limit)
    manager = jobs.manager(scope, "drain")
    log = str(tmp_path / "steps.jsonl")
    order = list(range(count))
    random.Random(5).shuffle(order)  # stored in another order than created
    created: dict[int, str] = {}
    for n in order:
        created[n] = seed_recorded_job(
            storage_url,
            scope=scope,
            namespace="drain",
            status=cr.JobStatus.RUNNING,
            log=log,
            job_type=type_path(SlowResumeJob),
            steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
            created=EPOCH + timedelta(seconds=n),
        )
    oldest_first = [created[n] for n in range(count)]

    assert manager.rehydrate() == oldest_first
    # A call during the drain shares it: same snapshot, nothing dispatched twice.
    assert manager.rehydrate() == oldest_first

    for job_id in oldest_first:
        state = manager.wait(job_id, timeout=120)
        assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        assert state.progress.successful_steps == 2
    stats = wait_drained(scope, "drain")
    assert stats["drained"] == oldest_first
    assert 2 <= stats["peak"] <= limit

    hooks = read_trace(events_file(scope, "resumed"))
    assert sorted(h["job"] for h in hooks) == sorted(oldest_first)  # each resumed once
    # The peak overlap of resume hooks, from their own clocks.
    edges = sorted(
        [(h["start"], 1) for h in hooks] + [(h["end"], -1) for h in hooks],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, delta in edges:
        running += delta
        peak = max(peak, running)
    assert peak <= limit
    # Oldest first: when a job's hook starts, at most limit - 1 older jobs have not started
    # theirs (they hold the other slots), and no job more than that many places younger has.
    rank = {job_id: i for i, job_id in enumerate(oldest_first)}
    started = [rank[h["job"]] for h in sorted(hooks, key=lambda h: h["start"])]
    for position, r in enumerate(started):
        older_after = sum(1 for later in started[position + 1 :] if later < r)
        assert older_after <= limit - 1, started


@pytest.mark.timeout(120)
def test_drain_reloads_each_job_before_dispatch_and_leaves_a_finished_one_alone(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    jobs = connect(reconciliation_interval=0, max_concurrent_rehydration=1)
    manager = jobs.manager(scope, "reload")
    log = str(tmp_path / "steps.jsonl")
    slow = [
        seed_recorded_job(
            storage_url,
            scope=scope,
            namespace="reload",
            status=cr.JobStatus.RUNNING,
            log=log,
            job_type=type_path(SlowResumeJob),
            steps=[(0, cr.StepStatus.SCHEDULED)],
            created=EPOCH + timedelta(seconds=n),
        )
        for n in range(3)
    ]
    finished = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="reload",
        status=cr.JobStatus.RUNNING,
        log=log,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
        created=EPOCH + timedelta(seconds=3),
    )

    assert manager.rehydrate() == [*slow, finished]

    # While the older jobs resume one at a time, the last one is finished by someone else.
    async def complete(storage: Storage) -> None:
        state = await storage.get_job(finished)
        assert state is not None
        await storage.save_job(state.with_status(cr.JobStatus.COMPLETED_SUCCESSFULLY))

    in_storage(storage_url, complete)
    assert not read_trace(events_file(scope, "resumed")), "the first resume was not slow enough"

    stats = wait_drained(scope, "reload")
    assert stats["drained"] == slow
    for job_id in slow:
        assert manager.wait(job_id, timeout=60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert get_job(storage_url, finished).status is cr.JobStatus.COMPLETED_SUCCESSFULLY  # type: ignore[union-attr]
    assert ran(log, finished) == {}
    with pytest.raises(ValueError):
        ray.get_actor(f"job/{finished}", namespace=RAY_NAMESPACE)


# -- actors lost inside a live cluster ------------------------------------------------------------


@pytest.mark.slow  # a manager killed mid-drain and back (20 s); the drain's rules: default tier
@pytest.mark.timeout(120)
def test_killed_manager_comes_back_and_continues_its_drain(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    """Issue 5, item 4: a killed manager is restarted by Ray and carries on with the jobs its
    drain had not resumed yet, without another `rehydrate()` (reconciliation is off here)."""
    jobs = connect(reconciliation_interval=0, max_concurrent_rehydration=1)
    manager = jobs.manager(scope, "killed")
    log = str(tmp_path / "steps.jsonl")
    ids = [
        seed_recorded_job(
            storage_url,
            scope=scope,
            namespace="killed",
            status=cr.JobStatus.RUNNING,
            log=log,
            job_type=type_path(SlowResumeJob),
            steps=[(0, cr.StepStatus.SCHEDULED)],
            created=EPOCH + timedelta(seconds=n),
        )
        for n in range(4)
    ]

    assert manager.rehydrate() == ids
    eventually(lambda: read_trace(events_file(scope, "resumed")), 60, "the first job to resume")
    actor = ray.get_actor(manager_name(scope, "killed"), namespace=RAY_NAMESPACE)
    ray.kill(actor, no_restart=False)

    def statuses() -> list[str]:
        return [str(get_job(storage_url, job_id).status) for job_id in ids]  # type: ignore[union-attr]

    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and set(statuses()) != {cr.JobStatus.COMPLETED_SUCCESSFULLY}:
        time.sleep(0.2)
    resumed = [h["job"] for h in read_trace(events_file(scope, "resumed"))]
    assert statuses() == [cr.JobStatus.COMPLETED_SUCCESSFULLY] * len(ids), (
        f"statuses oldest first: {statuses()}; resumed: {[ids.index(j) for j in resumed]}"
    )


@pytest.mark.timeout(120)
def test_killed_job_actor_restarts_and_adopts_its_running_steps(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    """A job actor killed mid-job is restarted by Ray and resumes from storage; the steps still
    running on their hosts are adopted, not started twice, and duplicate rehydration passes
    change nothing."""
    jobs = connect(reconciliation_interval=0)
    manager = jobs.manager(scope, "actor")
    log = str(tmp_path / "steps.jsonl")
    job = manager.start(RecordedJob, {"log": log, "steps": 6, "sleep": 2.0})
    eventually(
        lambda: len([r for r in read_trace(log) if r["event"] == "start"]) == 6,
        30,
        "every step to start",
    )
    ray.kill(ray.get_actor(f"job/{job.job_id}", namespace=RAY_NAMESPACE), no_restart=False)
    manager.rehydrate()
    manager.rehydrate()

    state = manager.wait(job.job_id, timeout=60)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 6
    starts = Counter(r["step"] for r in read_trace(log) if r["event"] == "start")
    assert starts == {f"{i:06d}": 1 for i in range(6)}


# -- a failing key provider is retried alone, with backoff ----------------------------------------


@pytest.mark.timeout(120)
def test_failing_key_provider_is_retried_with_backoff_while_the_catalog_keys_recover(
    connect,
    scope,
    storage_url,
    tmp_path,
    events,
) -> None:
    log = str(tmp_path / "steps.jsonl")
    # A key of the durable catalog, and a key only the provider knows, each with a job left
    # running by a dead cluster.
    in_storage(
        storage_url,
        lambda s: s.add_manager_key(cr.JobsManagerKey(scope=scope, namespace="catalog")),
    )
    known = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="catalog",
        status=cr.JobStatus.RUNNING,
        log=log,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
    )
    provided = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="provided",
        status=cr.JobStatus.RUNNING,
        log=log,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
    )
    token = scope
    # The provider fails twice, and then until the catalog's job has resumed: had recovery
    # waited for the provider before the catalog's keys, neither job would finish.
    config = {"fail": 2, "keys": [[scope, "provided"]], "after": [scope, known]}
    (events_dir() / f"{token}.json").write_text(json.dumps(config))

    # Registering the storage with the recovery actor runs a pass.
    jobs = connect(reconciliation_interval=0, keys_providers=(flaky_keys_path(token),))

    catalog = jobs.manager(scope, "catalog")
    state = catalog.wait(known, timeout=60)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2
    state = jobs.manager(scope, "provided").wait(provided, timeout=60)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 2

    calls = [c["at"] for c in read_trace(events_dir() / f"{token}.calls.jsonl")]
    assert len(calls) >= 3, calls  # failed at least twice, then answered: never asked again
    # Retried after 1 s, 2 s, 4 s, ...
    for n, (earlier, later) in enumerate(itertools.pairwise(calls)):
        assert 0.9 * 2**n <= later - earlier <= 2**n + 1.5, calls
    resumed = {e["job"]: e["at"] for e in read_trace(events_file(scope, "resumed"))}
    # The provided job resumed once the provider answered.
    assert resumed[known] < calls[-1] < resumed[provided], (resumed, calls)
    assert ran(log, known) == {"000000": 1, "000001": 1}
    assert ran(log, provided) == {"000000": 1, "000001": 1}
