"""Plans streamed in chunks and stages fed from storage in pages (issue 13), on real Ray: a
generator plan of a few thousand steps across stages, with a chunk size small enough that every
part of it pages, and a job actor killed while it writes its plan."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.runtime.names import manager_name
from choreography_ray.storage import open_storage
from tests.runtime.conftest import job_actor_names
from tests.runtime.lifecycle_jobs import TRACES, read, set_flag
from tests.runtime.streaming_jobs import StreamedJob, StreamedPlan
from tests.support import RAY_NAMESPACE, eventually, in_storage

pytestmark = pytest.mark.timeout(180)

#: Plan steps per chunk: 3,000 steps make 15 chunks, and each stage 5 pages of 200.
CHUNK = 200


def stored_steps(storage_url: str, job_id: str) -> int:
    async def count() -> int:
        storage = open_storage(storage_url)
        try:
            return sum((await storage.count_by_status(job_id)).values())
        finally:
            await storage.close()

    return asyncio.run(count())


def job_of(token: str) -> str | None:
    path = TRACES / f"token-{token}"
    return path.read_text() if path.exists() else None


def test_generator_plan__every_step_runs_once_across_stages_and_the_totals_are_right(
    connect: Any, scope: str
) -> None:
    with connect(plan_chunk_size=CHUNK, max_active_steps_per_job=150) as jobs:
        manager = jobs.manager(scope, "streamed")
        plan = StreamedPlan(token=uuid.uuid4().hex, steps=3_000, stages=3)
        started = manager.start(StreamedJob, plan)
        assert started.error is None
        state = manager.wait(started.job_id, timeout=150)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert [(s.stage, s.total_steps, s.successful_steps) for s in state.progress.stages] == [
        (0, 1_000, 1_000),
        (1, 1_000, 1_000),
        (2, 1_000, 1_000),
    ]
    runs = Counter(r["step"] for r in read(started.job_id, "runs"))
    assert runs == Counter({f"{i:010d}": 1 for i in range(3_000)})  # ids of a plan of no length


def test_job_actor_killed_while_it_writes_its_plan__the_job_fails_for_its_missing_plan_cleanly(
    connect: Any, scope: str, storage_url: str
) -> None:
    """The plan is stored only once whole: an activation lost half way leaves a job without a
    plan, which recovery fails with MISSING_STEP_PLAN, its partial records removed and none of
    its steps run (the spec's rule for a job interrupted before its plan was stored)."""
    token = uuid.uuid4().hex
    with connect(plan_chunk_size=CHUNK) as jobs, ThreadPoolExecutor(1) as pool:
        manager = jobs.manager(scope, "killed")
        plan = StreamedPlan(token=token, steps=3_000, pause_after=1_000)
        starting = pool.submit(manager.start, StreamedJob, plan)
        job_id = eventually(lambda: job_of(token), 30, "prepare_steps to run")
        eventually(lambda: read(job_id, "paused"), 30, "the plan to pause")
        assert stored_steps(storage_url, job_id) == 1_000  # five chunks written
        before = manager.get(job_id)
        assert (before.status, before.has_plan) == (cr.JobStatus.PREPARING_JOB, False)

        ray.kill(ray.get_actor(f"job/{job_id}", namespace=RAY_NAMESPACE), no_restart=False)
        with contextlib.suppress(Exception):  # the call dies with the actor it waited on
            starting.result(timeout=60)
        state = manager.wait(job_id, timeout=60)

        assert state.status is cr.JobStatus.FAILED
        assert str(cr.CannotResumeJobError.MISSING_STEP_PLAN) in (state.error or "")
        assert stored_steps(storage_url, job_id) == 0
        assert read(job_id, "runs") == []
        # The same plan started again runs every step once.
        again = manager.start(StreamedJob, StreamedPlan(token=uuid.uuid4().hex, steps=1_000))
        assert manager.wait(again.job_id, timeout=60).progress.successful_steps == 1_000
        assert Counter(r["step"] for r in read(again.job_id, "runs")) == Counter(
            {f"{i:010d}": 1 for i in range(1_000)}
        )
    (TRACES / f"token-{token}").unlink(missing_ok=True)


def test_a_large_start_has_the_next_spare_made_once_its_job_settles(
    connect: Any, scope: str, storage_url: str
) -> None:
    """A new spare job actor is a new process (most of a core for half a second): a start still
    preparing REFILL_SECONDS (50 ms) in, a large plan, does not have the next spare made while
    its job writes its plan and runs, but once the job is seen settled (core/spares.py)."""
    token = uuid.uuid4().hex
    with connect(spare_job_actors=1) as jobs, ThreadPoolExecutor(1) as pool:
        manager = jobs.manager(scope, "large")
        handle = ray.get_actor(manager_name(scope, "large"), namespace=RAY_NAMESPACE)
        small = manager.start(StreamedJob, StreamedPlan(token=uuid.uuid4().hex, steps=1))
        manager.wait(small.job_id, timeout=60)
        (spare,) = eventually(lambda: ray.get(handle.spares.remote()), 30, "a spare")
        before = job_actor_names()

        starting = pool.submit(
            manager.start, StreamedJob, StreamedPlan(token=token, steps=10, pause_after=5)
        )
        job_id = eventually(lambda: job_of(token), 30, "prepare_steps to run")
        assert job_id == spare
        eventually(lambda: read(job_id, "paused"), 30, "the plan to pause")
        time.sleep(1.0)  # 20 times REFILL_SECONDS: a spare made then has its actor by now
        assert ray.get(handle.spares.remote()) == []
        assert job_actor_names() - before == set()  # none being made either

        set_flag(job_id, "go on")
        assert starting.result(timeout=60).error is None
        assert manager.wait(job_id, timeout=60).progress.successful_steps == 10
        (after,) = eventually(lambda: ray.get(handle.spares.remote()), 30, "the next spare")
        assert f"job/{after}" in job_actor_names() - before

        # A large job nobody reads: the manager reads its record (LARGE_JOB_READ_SECONDS).
        second = uuid.uuid4().hex
        starting = pool.submit(
            manager.start, StreamedJob, StreamedPlan(token=second, steps=10, pause_after=5)
        )
        job_id = eventually(lambda: job_of(second), 30, "prepare_steps to run")
        assert job_id == after
        eventually(lambda: read(job_id, "paused"), 30, "the plan to pause")
        time.sleep(1.0)
        assert ray.get(handle.spares.remote()) == []
        set_flag(job_id, "go on")
        assert starting.result(timeout=60).error is None
        eventually(lambda: ray.get(handle.spares.remote()), 30, "the spare after the second")
        assert in_storage(storage_url, lambda s: s.get_job(job_id)).progress.successful_steps == 10
    for name in (token, second):
        (TRACES / f"token-{name}").unlink(missing_ok=True)
