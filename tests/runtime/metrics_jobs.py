"""The job of the metrics test (importable by path in Ray workers), and the driver that runs it
against a cluster as a user's script would:

    python -m tests.runtime.metrics_jobs ADDRESS STORAGE_URL REQUEST_JSON

connects to ADDRESS with `ray.init` (through `Jobs.connect`), starts the job in scope
"metrics", namespace "scrape", waits for it and prints its final state as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr

#: Seconds the gated step waits for its gate before it fails.
GATE_SECONDS = 240.0
SCOPE, NAMESPACE = "metrics", "scrape"
#: Options of the driver's connection: a failed step is tried twice.
OPTIONS = cr.JobsOptions(max_step_attempts=2, step_retry_backoff=0.1, job_watchdog_interval=1)


def is_open(gate: str) -> bool:
    return Path(gate).exists()


class Work(BaseModel):
    fail: bool = False
    #: A file to wait for before succeeding (the job stays RUNNING until it exists).
    gate: str | None = None


class Worker(cr.JobStep[Work]):
    async def perform(self, request: Work, context: cr.StepContext) -> cr.StepResult:
        if request.gate is not None:
            deadline = time.monotonic() + GATE_SECONDS
            while not is_open(request.gate):  # another process opens it
                if time.monotonic() > deadline:
                    return cr.StepResult.failed("the gate never opened")
                await asyncio.sleep(0.05)
        if request.fail:
            return cr.StepResult.failed("failed on purpose")
        return cr.StepResult.succeeded()


class PooledWorker(Worker):
    """A step of a pool that reserves nothing (one host per CPU): the pool's gauges."""

    resources = {"num_cpus": 0}


#: The shape of `PooledWorker`'s pool.
POOL_SHAPE = "none"  # {"num_cpus": 0}: zero amounts are dropped from a shape


class MetricsRequest(BaseModel):
    succeed: int
    fail: int
    gate: str


class MetricsJob(cr.Job[MetricsRequest]):
    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE

    def prepare_steps(self, request: MetricsRequest) -> list[cr.StepSpec]:
        return [
            *(self.create_step(Worker, Work()) for _ in range(request.succeed)),
            *(self.create_step(Worker, Work(fail=True)) for _ in range(request.fail)),
            self.create_step(Worker, Work(gate=request.gate)),
            self.create_step(PooledWorker, Work(gate=request.gate)),
        ]


def main(address: str, storage: str, request_json: str) -> None:
    request = MetricsRequest.model_validate_json(request_json)
    with cr.Jobs.connect(storage=storage, options=OPTIONS, address=address) as jobs:
        manager = jobs.manager(SCOPE, NAMESPACE)
        started = manager.start(MetricsJob, request)
        print(f"started {started.job_id}", file=sys.stderr, flush=True)
        state = manager.wait(started.job_id, timeout=GATE_SECONDS + 60)
    print(state.model_dump_json())


if __name__ == "__main__":
    main(*sys.argv[1:4])
