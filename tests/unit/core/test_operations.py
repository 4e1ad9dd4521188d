"""The activation's table of operations (`mode.OPERATIONS`, issue 35): every (operation, mode)
cell pinned, the refusals each raising the spec's error, and the flows reading the table."""

from __future__ import annotations

import itertools

import pytest

from choreography_ray.core import tick
from choreography_ray.core.mode import EXITS, OPERATIONS, REFUSALS, Act, Mode, Op, act
from choreography_ray.errors import (
    JobOperationError,
    RemoveJobError,
    ResumeJobError,
    RetryFailedStepsError,
    StopJobError,
)
from choreography_ray.status import JobStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FaultyStorage
from tests.unit.core.jobs import Plan, RetryableJob, StagedJob

pytestmark = pytest.mark.timeout(30)

#: Every cell, as docs/decisions.md shows it. Columns: the modes in `Mode`'s order.
TABLE = """
              load  recov unload idle  prep  run   admit hook  stop  fin   owes  rest  gone
start         wait  wait  wait   run   ref   ref   ref   ref   ref   ref   ref   ref   ref
stop          wait  wait  wait   sto   run   run   run   run   ref   ref   ref   ref   ref
remove        wait  wait  wait   sto   run   run   run   run   run   run   save  run   ref
resume        wait  wait  wait   run   no    no    no    no    run   run   no    run   ref
recover       wait  run   wait   run   no    no    no    no    run   fin   no    no    no
retry         wait  wait  wait   ref   ref   ref   ref   ref   ref   ref   ref   run   ref
report        wait  wait  wait   run   run   run   run   run   run   run   run   run   run
reconcile     wait  wait  wait   run   no    run   run   run   run   run   run   no    no
exit          wait  wait  run    no    no    no    no    no    no    no    no    run   run
"""
OPS = {"retry": Op.RETRY_FAILED, **{op.value: op for op in Op}}
ACTS = {
    "run": Act.RUN,
    "no": Act.NOTHING,
    "ref": Act.REFUSE,
    "wait": Act.WAIT,
    "save": Act.SAVE_OWED_FIRST,
    "fin": Act.FINISH_STOP,
    "sto": Act.FROM_STORAGE,
}


def expected() -> dict[tuple[Op, Mode], Act]:
    rows = [line.split() for line in TABLE.strip().splitlines()[1:]]
    return {
        (OPS[row[0]], mode): ACTS[cell]
        for row in rows
        for mode, cell in zip(Mode, row[1:], strict=True)
    }


def test_operations__every_cell_is_pinned() -> None:
    cells = expected()
    assert {op for op, _ in cells} == set(Op)
    table = {(op, mode): OPERATIONS[op][mode] for op, mode in itertools.product(Op, Mode)}
    assert table == cells


@pytest.mark.parametrize(
    ("op", "mode"), [cell for cell, a in expected().items() if a is Act.REFUSE]
)
def test_operations__a_refused_cell_raises_the_operations_error_naming_the_job(
    op: Op, mode: Mode
) -> None:
    with pytest.raises(JobOperationError) as refused:
        act(op, mode, "job-1", JobStatus.RUNNING)
    assert refused.value.error is REFUSALS[op]
    assert "job-1" in refused.value.message and str(op) in refused.value.message


def test_operations__the_exit_and_the_reconciler_read_the_same_modes_as_the_table() -> None:
    assert {m for m in Mode if OPERATIONS[Op.EXIT][m] is Act.RUN} == set(EXITS)
    reconciling = {m for m in Mode if OPERATIONS[Op.RECONCILE][m] is Act.RUN}
    assert reconciling == set(tick._BY_MODE)


# -- the flows refuse where the table does ---------------------------------------------------------


def test_stop__of_a_job_whose_outcome_is_decided_is_refused_by_the_table(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        storage.fail("save_job", times=1)  # the terminal save is owed
        await h.hosts.finish_all()
        await h.settle()
        assert h.c.mode is Mode.OWES_STATUS
        with pytest.raises(JobOperationError) as refused:
            await h.c.stop()
        assert refused.value.error is StopJobError.JOB_IS_NOT_RUNNING
        assert "being saved" in refused.value.message

    activations.run(scenario)


def test_remove_and_resume__of_a_removed_activation_are_refused_and_recover_does_nothing(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.remove()
        await h.hosts.stop_cancelled()
        await h.settle()
        assert h.c.mode is Mode.REMOVED
        with pytest.raises(JobOperationError) as removing:
            await h.c.remove()
        assert removing.value.error is RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED
        with pytest.raises(JobOperationError) as resuming:
            await h.c.resume()
        assert resuming.value.error is ResumeJobError.JOB_IS_BEING_REMOVED
        await h.c.recover()
        assert h.c.mode is Mode.REMOVED

    activations.run(scenario)


def test_retry_failed_steps__of_a_running_job_is_refused(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(RetryableJob, Plan(sizes=[2]))
        await h.c.start()
        with pytest.raises(JobOperationError) as refused:
            await h.c.retry_failed_steps()
        assert refused.value.error is RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES
        assert (await h.all_succeed()) == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)
