"""A step's outcome from how its perform ended: whatever a perform raises is its step's outcome,
never its batch's or the host's. A `CancelledError` the host did not ask for (the step was not
told to stop) is a failure, and so is `KeyboardInterrupt` or `SystemExit`; a perform that blocked
the event loop longer than `step_event_loop_block_limit` fails its step too."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from choreography_ray.core.messages import Outcome, Output, StepStart, describe, failed
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.driver import SliceDriver
from choreography_ray.status import StepStatus
from choreography_ray.step import StepResult

#: The failure message of a step whose perform raised CancelledError when nobody stopped it.
UNASKED_CANCEL = "perform raised CancelledError without being stopped"


def outcome_of(
    step: StepStart,
    result: Any,
    error: BaseException | None,
    stopping: bool,
    driver: SliceDriver | None,
    options: JobsOptions,
) -> Outcome:
    """The outcome of a perform that returned `result` or raised `error`; `stopping`: the
    step was told to stop, so an error ends it STOPPED."""
    limit = options.step_event_loop_block_limit.total_seconds()
    if driver is not None and limit > 0 and driver.longest_slice > limit:
        return failed(
            step.step_id,
            step.attempt,
            StepStatus.FAILED,
            f"perform blocked the event loop for {driver.longest_slice:.2f} s "
            f"(limit {limit:g} s): await instead of blocking, or make perform sync",
        )
    if error is not None:
        if stopping:
            return Outcome(step.step_id, step.attempt, StepStatus.STOPPED)
        if isinstance(error, asyncio.CancelledError):
            return failed(step.step_id, step.attempt, StepStatus.FAILED, UNASKED_CANCEL)
        return failed(step.step_id, step.attempt, StepStatus.FAILED, describe(error))
    if not isinstance(result, StepResult):
        return failed(
            step.step_id,
            step.attempt,
            StepStatus.FAILED,
            f"perform returned {type(result).__name__}, not a StepResult",
        )
    if result.success:
        if result.output is None:
            return Outcome(step.step_id, step.attempt, StepStatus.COMPLETED_SUCCESSFULLY)
        return _with_output(step, result.output, options.max_output_bytes)
    status = StepStatus.COMPLETED_WITH_FAILURE
    return failed(step.step_id, step.attempt, status, result.message, result.code)


def _with_output(step: StepStart, output: BaseModel, limit: int) -> Outcome:
    """A success with its output as JSON, or a failure naming why it cannot be stored."""
    try:
        text = output.model_dump_json()
    except Exception as error:
        message = f"the step's output could not be serialized to JSON: {describe(error)}"
        return failed(step.step_id, step.attempt, StepStatus.FAILED, message)
    size = len(text.encode())
    if size > limit:
        return failed(
            step.step_id,
            step.attempt,
            StepStatus.FAILED,
            f"the step's output is {size:,} bytes of JSON, over max_output_bytes ({limit:,}): "
            "return less (a reference to a file, say) or raise JobsOptions.max_output_bytes",
        )
    status = StepStatus.COMPLETED_SUCCESSFULLY
    return Outcome(step.step_id, step.attempt, status, output=Output(step.stage, text))
