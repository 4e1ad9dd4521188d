"""The slice driver: what a perform raises under its task stays in that task, and the event loop
lives on (asyncio itself lets KeyboardInterrupt and SystemExit out of a task)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from choreography_ray.runtime.driver import PerformExit, SliceDriver

pytestmark = pytest.mark.timeout(10)


async def perform(error: BaseException | None, *, awaits: bool) -> str:
    if awaits:
        await asyncio.sleep(0)
    if error is not None:
        raise error
    return "done"


def drive(error: BaseException | None, *, awaits: bool) -> tuple[bool, Any]:
    """Runs `perform` as the step host does; (ran as a task, the task or the first slice's
    result). The loop must survive: `asyncio.run` returns."""

    async def main() -> tuple[bool, Any]:
        driver = SliceDriver(perform(error, awaits=awaits))
        done, out = driver.step()
        if done:
            return False, out
        task = asyncio.ensure_future(driver.finish(out))
        await asyncio.wait([task])
        return True, task

    return asyncio.run(main())


def test_first_slice__result_and_exceptions_come_back_at_once() -> None:
    assert drive(None, awaits=False) == (False, "done")
    for error in (asyncio.CancelledError(), SystemExit(3), KeyboardInterrupt(), ValueError()):
        with pytest.raises(type(error)):
            drive(error, awaits=False)


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt("ctrl-c")])
def test_under_a_task__exit_and_interrupt_are_carried_by_perform_exit(error: BaseException) -> None:
    as_task, task = drive(error, awaits=True)

    assert as_task
    carried = task.exception()
    assert isinstance(carried, PerformExit) and carried.error is error


def test_under_a_task__cancelled_error_cancels_only_the_task() -> None:
    as_task, task = drive(asyncio.CancelledError(), awaits=True)

    assert as_task and task.cancelled()


def test_under_a_task__result_and_ordinary_errors_as_asyncio_gives_them() -> None:
    _, succeeded = drive(None, awaits=True)
    _, failed = drive(ValueError("bad"), awaits=True)

    assert succeeded.result() == "done"
    assert isinstance(failed.exception(), ValueError)
