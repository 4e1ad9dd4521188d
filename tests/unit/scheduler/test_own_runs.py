"""Issue 36, item 8: a run an operator queued with `requeue_execution` or `resume_execution`
runs beside its manifest's schedule: it neither blocks it, settles it, becomes the latest
finished run a retry follows, nor fires the manifest's dependents again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from choreography_ray.scheduler import cycle
from choreography_ray.scheduler.cycle import History, Queue, Wait
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.schedules import After, Every
from choreography_ray.scheduler.status import EntryKind, RunStatus
from tests.unit.scheduler.factory import T0, failed, manifest, newest_first, run, succeeded

OPTIONS = SchedulerOptions()
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)
OPERATORS = [EntryKind.REQUEUE_EXECUTION, EntryKind.RESUME_EXECUTION]


def plan(m, *runs, **history):  # type: ignore[no-untyped-def]
    return cycle.plan(m, History(runs=newest_first(*runs), **history), OPTIONS, T0)


@pytest.mark.parametrize("kind", OPERATORS)
def test_an_operators_run_in_flight_does_not_block_the_schedule(kind: EntryKind) -> None:
    m = manifest(schedule=Every.hours(1))
    last = succeeded(T0 - 2 * HOUR)
    operators = run(RunStatus.RUNNING, T0 - MINUTE, kind=kind)
    assert isinstance(plan(m, last, operators), Queue)


@pytest.mark.parametrize("kind", OPERATORS)
def test_an_operators_success_does_not_settle_the_schedule(kind: EntryKind) -> None:
    m = manifest(schedule=Every.hours(1))
    last = succeeded(T0 - 2 * HOUR)
    operators = succeeded(T0 - 10 * MINUTE, kind=kind)
    assert isinstance(plan(m, last, operators), Queue)


@pytest.mark.parametrize("kind", OPERATORS)
def test_an_operators_success_is_not_the_latest_finished_run_a_retry_follows(
    kind: EntryKind,
) -> None:
    m = manifest(schedule=Every.hours(1))
    last = succeeded(T0 - 3 * HOUR)
    due_failure = failed(T0 - 2 * HOUR, occurrence=T0 - 2 * HOUR)
    operators = succeeded(T0 - 10 * MINUTE, kind=kind)
    queued = plan(m, last, due_failure, operators)
    assert isinstance(queued, Queue) and queued.is_retry
    assert queued.delay == timedelta(minutes=5)


@pytest.mark.parametrize("kind", OPERATORS)
def test_an_operators_success_of_the_parent_does_not_fire_its_dependents(
    kind: EntryKind,
) -> None:
    dependent = manifest("d", schedule=After(parent="p"))
    parent_runs = newest_first(
        succeeded(T0 - 10 * MINUTE, manifest_name="p", kind=kind),
        succeeded(T0 - 2 * HOUR, manifest_name="p"),
    )
    consumed = succeeded(T0 - HOUR, manifest_name="d", parent_run=parent_runs[1].id)
    decided = plan(dependent, consumed, parent_runs=parent_runs)
    assert decided == Wait(cycle.WaitReason.NOT_DUE)
