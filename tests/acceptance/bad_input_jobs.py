"""Job types of `test_bad_input`, imported by path in Ray workers: steps that never return,
that ignore their stop, or that end their host's process with `os._exit`.

Steps log to the trace file their request names (`tests.support.trace`).
"""

from __future__ import annotations

import asyncio
import os
import time

from pydantic import BaseModel

import choreography_ray as cr
from tests.support import trace


class StepOrder(BaseModel):
    log: str
    #: "until-stopped": never returns on its own, but returns once told to stop; "hang": awaits
    #: forever without looking at its stop; "ignore": a sync loop that never looks at it;
    #: "exit": `os._exit(1)` the first time (a marker file next to the log says it happened);
    #: "ok": succeeds.
    mode: str


class OrderedStep(cr.JobStep[StepOrder]):
    async def perform(self, request: StepOrder, context: cr.StepContext) -> cr.StepResult:
        trace(request.log, event="start", step=context.step_id, pid=os.getpid(),
              attempt=context.attempt, mode=request.mode, at=time.time())  # fmt: skip
        if request.mode == "until-stopped":
            await context.cancelled()
            trace(request.log, event="told", step=context.step_id, at=time.time())
            raise RuntimeError("stopped")  # raised once told: the step counts as stopped
        if request.mode == "hang":
            await asyncio.Event().wait()  # never set
        elif request.mode == "ignore":
            await asyncio.to_thread(_spin_forever, request.log, context.step_id)
        elif request.mode == "exit":
            try:  # the first run only: O_EXCL makes the marker once
                marker = os.open(f"{request.log}.exited", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                pass
            else:
                os.write(marker, str(os.getpid()).encode())
                os.close(marker)
                os._exit(1)
        trace(request.log, event="end", step=context.step_id, at=time.time())
        return cr.StepResult.succeeded()


def _spin_forever(log: str, step_id: str) -> None:
    # A step stuck in code that never checks `context.is_cancelled`.
    while True:
        time.sleep(0.2)


class OrdersRequest(BaseModel):
    log: str
    modes: list[str]


class OrderedJob(cr.Job[OrdersRequest]):
    """One step per mode, in one stage."""

    def prepare_steps(self, request: OrdersRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(OrderedStep, StepOrder(log=request.log, mode=mode))
            for mode in request.modes
        ]


class BigRequest(BaseModel):
    blob: str


class BigJob(cr.Job[BigRequest]):
    def prepare_steps(self, request: BigRequest) -> list[cr.StepSpec]:
        return [self.create_step(OrderedStep, StepOrder(log="/dev/null", mode="ok"))]
