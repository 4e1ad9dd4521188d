"""Job and step types of the pool tests (`test_pools.py`), importable by path in Ray workers.

Steps run in pool hosts, other processes than the test: each batch records what it observes in
the trace file its first request names (`tests.support.trace`), and the test reads it afterwards.
The tests end their pool hosts, so each test's hosts are new processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, ClassVar

import ray
from pydantic import BaseModel

import choreography_ray as cr
from tests.support import read_trace, trace


class Doc(BaseModel):
    n: int
    log: str
    #: When set, a batch waits for its job to stop.
    wait_for_stop: bool = False


class EmbedStep(cr.JobStep[Doc]):
    """A GPU-shaped type performing batches of up to 8 steps, one batch at a time a host, on
    both of the session cluster's GPUs however few its steps (`min_hosts`)."""

    resources = {"num_gpus": 1}
    min_hosts = 2
    batch_size = 8
    batch_wait = 0.05

    def setup(self) -> None:
        self.setups = getattr(self, "setups", 0) + 1

    async def perform_batch(self, requests: list[Doc], context: cr.BatchContext) -> list[Any]:
        first = requests[0]
        if first.wait_for_stop:
            trace(first.log, event="waiting", size=len(requests))
            await context.cancelled()
            raise RuntimeError("told to stop")
        trace(
            first.log,
            event="batch",
            ns=[r.n for r in requests],
            steps=[c.step_id for c in context.steps],
            setups=self.setups,
            actor=ray.get_runtime_context().get_actor_name(),
            pid=os.getpid(),
            gpus=ray.get_gpu_ids(),
        )
        return [cr.StepResult.succeeded() for _ in requests]


class FailingSetupEmbedStep(EmbedStep):
    """Its first `setup` in a process raises; the next one succeeds."""

    def setup(self) -> None:
        super().setup()
        if self.setups == 1:
            raise OSError("the model file is not there yet")


class CalledStep(cr.JobStep[Doc]):
    """Steps of an external API: at most 3 running over the cluster, though each of the two
    pool hosts runs 4 at once. Each records when it ran."""

    resources = {"num_gpus": 1}
    min_hosts = 2  # however few its steps, both GPUs' hosts
    concurrency = 4
    max_concurrent: ClassVar[int | None] = 3

    async def perform(self, request: Doc, context: cr.StepContext) -> cr.StepResult:
        began = time.time()
        await asyncio.sleep(0.2)
        trace(request.log, event="call", n=request.n, start=began, end=time.time(), pid=os.getpid())
        return cr.StepResult.succeeded()


class RatedStep(CalledStep):
    """At most 10 starts a second over the cluster."""

    max_concurrent = None
    max_per_second = 10.0


class ElasticStep(cr.JobStep[Doc]):
    """Batches of 8 that take 0.4 s each, recording where they start and end: a node removed
    mid-batch leaves starts without an end."""

    resources = {"num_gpus": 1}
    batch_size = 8

    async def perform_batch(self, requests: list[Doc], context: cr.BatchContext) -> list[Any]:
        context_ = ray.get_runtime_context()
        where = {"node": context_.get_node_id(), "actor": context_.get_actor_name()}
        ns = [r.n for r in requests]
        trace(requests[0].log, event="start", ns=ns, at=time.time(), **where)
        await asyncio.sleep(0.4)
        trace(requests[0].log, event="end", ns=ns, at=time.time(), **where)
        return [cr.StepResult.succeeded() for _ in requests]


class UnplaceableStep(cr.JobStep[Doc]):
    """A GPU step that also needs a resource no node of the cluster has: Ray places no host."""

    resources = {"num_gpus": 1, "widget": 1}

    async def perform(self, request: Doc, context: cr.StepContext) -> cr.StepResult:
        raise AssertionError("an unplaceable step ran")


class SecondShapeStep(EmbedStep):
    """A second shape over the same GPUs as `EmbedStep`'s (1 GPU and 1 MB of memory each)."""

    resources = {"num_gpus": 1, "memory": 1_000_000}


class OwnShapeStep(EmbedStep):
    """A third shape over the same GPUs (1 GPU and 2 MB of memory each), for one test alone:
    every host of it is made for that test's job, never left by an earlier one."""

    resources = {"num_gpus": 1, "memory": 2_000_000}


class BrokenGpuStep(cr.JobStep[Doc]):
    """A GPU-shaped type whose every batch raises, as on a GPU gone bad after `setup`: each
    records its host's process and instance first."""

    resources = {"num_gpus": 1}
    batch_size = 1

    async def perform_batch(self, requests: list[Doc], context: cr.BatchContext) -> list[Any]:
        trace(
            requests[0].log,
            event="batch",
            ns=[r.n for r in requests],
            actor=ray.get_runtime_context().get_actor_name(),
            pid=os.getpid(),
            instance=id(self),
        )
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


STEP_TYPES = {
    "broken": BrokenGpuStep,
    "elastic": ElasticStep,
    "embed": EmbedStep,
    "failing-setup": FailingSetupEmbedStep,
    "called": CalledStep,
    "rated": RatedStep,
    "unplaceable": UnplaceableStep,
    "second-shape": SecondShapeStep,
    "own-shape": OwnShapeStep,
}


class PauseStep(cr.JobStep[Doc]):
    """A step of the shared hosts that ends once every process that ran a batch of stage 0 has
    ended (at most 60 s): the pool's hosts are idle meanwhile, and leave."""

    async def perform(self, request: Doc, context: cr.StepContext) -> cr.StepResult:
        pids = {e["pid"] for e in read_trace(request.log) if e.get("event") == "batch"}
        for _ in range(300):  # polls other processes for up to 60 s: no event to wait on
            if not any(map(alive, pids)):
                break
            await asyncio.sleep(0.2)
        return cr.StepResult.succeeded()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class EmbedRequest(BaseModel):
    count: int
    log: str
    step_type: str = "embed"
    wait_for_stop: bool = False
    #: Stage 0 and stage 2 embed `count` documents each; stage 1 waits for stage 0's hosts to end.
    paused: bool = False


class EmbedJob(cr.Job[EmbedRequest]):
    def prepare_steps(self, request: EmbedRequest) -> list[cr.StepSpec]:
        step_type, wait = STEP_TYPES[request.step_type], request.wait_for_stop
        stages = (0, 2) if request.paused else (0,)
        steps = [
            self.create_step(
                step_type, Doc(n=stage * 1000 + n, log=request.log, wait_for_stop=wait), stage
            )
            for stage in stages
            for n in range(request.count)
        ]
        if request.paused:
            steps.append(self.create_step(PauseStep, Doc(n=-1, log=request.log), stage=1))
        return steps
