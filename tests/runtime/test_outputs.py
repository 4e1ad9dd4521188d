"""Step outputs on real Ray (docs/outputs.md): stored with their outcome, one per succeeded
step, read back by page, by a later stage's step, and as a Ray Dataset; removed with the job."""

from __future__ import annotations

import pytest

import choreography_ray as cr
from tests.runtime.output_jobs import (
    FromDataset,
    MapReduce,
    MapReduceRequest,
    RowsRequest,
    Square,
    Sum,
)
from tests.support import in_storage


def test_outputs__a_reduce_stage_reads_the_map_stage_and_pages_read_them_back(connect, scope):
    jobs = connect()
    manager = jobs.manager(scope, "outputs")
    started = manager.start(MapReduce, MapReduceRequest(count=50))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    (reduced,) = manager.outputs(started.job_id, stage=1)
    assert reduced.output_as(Sum) == Sum(outputs=50, total=sum(n * n for n in range(50)))
    first = manager.outputs(started.job_id, stage=0, limit=20)
    rest = manager.outputs(started.job_id, stage=0, after=first[-1].step_id, limit=100)
    outputs = first + rest
    assert len(first) == 20 and len(outputs) == 50
    assert [o.step_id for o in outputs] == sorted(o.step_id for o in outputs)
    assert sorted(o.output_as(Square).n for o in outputs) == list(range(50))
    assert {(o.job_id, o.stage, o.attempt) for o in outputs} == {(started.job_id, 0, 1)}
    assert len(manager.outputs(started.job_id)) == 51  # both stages


def test_outputs_dataset__streams_the_outputs_of_a_stage_from_storage(connect, scope):
    jobs = connect()
    manager = jobs.manager(scope, "outputs")
    started = manager.start(MapReduce, MapReduceRequest(count=300, reduce=""))
    manager.wait(started.job_id, timeout=120)

    ds = jobs.outputs_dataset(started.job_id, stage=0)

    assert ds.count() == 300
    rows = ds.take_all()
    assert sorted(row["output"]["n"] for row in rows) == list(range(300))
    row = rows[0]
    assert set(row) == {"job_id", "step_id", "stage", "attempt", "output"}
    assert cr.StepOutput(**row).output_as(Square).square == row["output"]["n"] ** 2
    assert jobs.outputs_dataset(started.job_id, stage=1).count() == 0
    assert jobs.outputs_dataset("no-such-job").count() == 0


def test_outputs__failed_and_too_big_steps_have_none_and_the_limit_is_named(connect, scope):
    manager = connect(max_output_bytes=65_536).manager(scope, "outputs")
    special = {3: "fail", 4: "big", 5: "nothing"}
    started = manager.start(MapReduce, MapReduceRequest(count=8, special=special))

    state = manager.wait(started.job_id, timeout=120)

    assert state.progress.failed_steps == 2
    by_n = {o.output_as(Square).n for o in manager.outputs(started.job_id, stage=0)}
    assert by_n == {0, 1, 2, 6, 7}
    (reduced,) = manager.outputs(started.job_id, stage=1)
    assert reduced.output_as(Sum).outputs == 5
    failed = {s.step_id: s for s in manager.steps(started.job_id)}
    messages = [s.status_changes[-1].exception_messages for s in failed.values()]
    assert ("item 3 failed",) in messages
    big = next(m[0] for m in messages if "max_output_bytes" in m[0])
    assert big.startswith(
        "the step's output is 70,011 bytes of JSON, over max_output_bytes (65,536)"
    )


def test_outputs__batches_and_a_sync_reduce(connect, scope):
    manager = connect().manager(scope, "outputs")
    request = MapReduceRequest(count=40, batched=True, reduce="sum_sync")
    started = manager.start(MapReduce, request)

    manager.wait(started.job_id, timeout=120)

    assert len(manager.outputs(started.job_id, stage=0)) == 40
    (reduced,) = manager.outputs(started.job_id, stage=1)
    assert reduced.output_as(Sum) == Sum(outputs=40, total=sum(n * n for n in range(40)))


def test_outputs__removed_with_the_job(connect, scope, storage_url):
    manager = connect().manager(scope, "outputs")
    started = manager.start(MapReduce, MapReduceRequest(count=10))
    manager.wait(started.job_id, timeout=120)
    assert in_storage(storage_url, lambda s: s.count_outputs(started.job_id)) == 11

    manager.remove(started.job_id)

    assert in_storage(storage_url, lambda s: s.count_outputs(started.job_id)) == 0


@pytest.mark.slow  # a Ray Data read in the job actor: about 10 s
def test_steps_from_dataset__a_plan_read_from_a_dataset(connect, scope):
    manager = connect().manager(scope, "outputs")
    started = manager.start(FromDataset, RowsRequest(rows=500))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.total_steps == 500
    outputs = manager.outputs(started.job_id, limit=1000)
    assert sorted(o.output_as(Square).n for o in outputs) == list(range(500))
