"""Job and step types of the limit tests (`test_limits.py`), importable by path in Ray workers.

Steps run on the shared step hosts, other processes than the test: each records when it
started and ended, on which host, in the trace file its request names (`tests.support.trace`),
and the test reads it afterwards."""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import ray
from pydantic import BaseModel

import choreography_ray as cr
from tests.support import trace

#: The named limit of `NamedCall`, configured by its test (a limit set live outlives its test in
#: the session's cluster: no other test names it).
NAMED = "test-limits-crm"


class Call(BaseModel):
    n: int
    key: str
    log: str
    seconds: float


class KeyedCall(cr.JobStep[Call]):
    """At most 2 at once per key over the cluster."""

    max_concurrent_per_key: ClassVar[int | None] = 2

    def concurrency_key(self, request: Call) -> str | None:
        return request.key

    async def perform(self, request: Call, context: cr.StepContext) -> cr.StepResult:
        began = time.time()
        await asyncio.sleep(request.seconds)
        trace(
            request.log,
            n=request.n,
            key=request.key,
            start=began,
            end=time.time(),
            host=ray.get_runtime_context().get_actor_name(),
        )
        return cr.StepResult.succeeded()


class NamedCall(KeyedCall):
    """Takes a permit of the named limit `NAMED`, and of no key."""

    max_concurrent_per_key = None
    limits = (NAMED,)


class CallsRequest(BaseModel):
    count: int
    keys: list[str]
    log: str
    seconds: float = 0.2
    named: bool = False


class Calls(cr.Job[CallsRequest]):
    def prepare_steps(self, request: CallsRequest) -> list[cr.StepSpec]:
        step_type = NamedCall if request.named else KeyedCall
        return [
            self.create_step(
                step_type,
                Call(
                    n=n,
                    key=request.keys[n % len(request.keys)],
                    log=request.log,
                    seconds=request.seconds,
                ),
            )
            for n in range(request.count)
        ]
