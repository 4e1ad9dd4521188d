"""The pool comparison (`choreography-ray bench --pools`, docs/benchmarks.md): N items on G
declared GPUs, in batches, each batch costing a simulated `batch_ms + item_ms * size` (a sleep:
a model's time on the device), measured in one local Ray:

- the durable job: one step per item, of a GPU-shaped type performing batches on a pool of G
  hosts (`JobStep.resources`, `perform_batch`);
- Ray Data: `map_batches` over the same items with a pool of G actors, one GPU each, the same
  batch size and cost (nothing durable: a lost node or driver loses the run);
- the same job as `dedicated` steps (an actor each, one GPU each), timed on a sample and
  extrapolated to N items.

The batch size is a class attribute of the step type, read by every worker from
`BATCH_SIZE_ENV`, which the local Ray passes on to them.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

import choreography_ray as cr

#: The environment variable that carries the batch size to the workers.
BATCH_SIZE_ENV = "CHOREOGRAPHY_BENCH_BATCH_SIZE"
#: Seconds a pool host of the bench stays idle before it leaves, giving its GPU back.
POOL_IDLE_SECONDS = 1.0
#: Ray Data's blocks per actor of its pool.
RAY_DATA_BLOCKS_PER_ACTOR = 16


class Cost(BaseModel):
    batch_ms: float = 5.0
    item_ms: float = 0.05


def spend(cost: Cost, items: int) -> None:
    """A batch's simulated device time: the thread sleeps, as it would wait for a GPU."""
    time.sleep((cost.batch_ms + cost.item_ms * items) / 1000)


class EmbedStep(cr.JobStep[Cost]):
    resources = {"num_gpus": 1}
    batch_size = int(os.environ.get(BATCH_SIZE_ENV, "64"))
    batch_wait = 0.05

    def perform_batch(self, requests: list[Cost], context: cr.BatchContext) -> list[cr.StepResult]:
        spend(requests[0], len(requests))
        return [cr.StepResult.succeeded()] * len(requests)


class DedicatedEmbedStep(cr.JobStep[Cost]):
    dedicated = True
    actor_options = {"num_cpus": 0, "num_gpus": 1}

    def perform(self, request: Cost, context: cr.StepContext) -> cr.StepResult:
        spend(request, 1)
        return cr.StepResult.succeeded()


class EmbedRequest(BaseModel):
    items: int
    cost: Cost
    dedicated: bool = False


class EmbedJob(cr.Job[EmbedRequest]):
    def prepare_steps(self, request: EmbedRequest) -> Iterator[cr.StepSpec]:
        step_type = DedicatedEmbedStep if request.dedicated else EmbedStep
        for _ in range(request.items):
            yield self.create_step(step_type, request.cost)


class _Model:
    """Ray Data's callable class: the same cost per batch."""

    def __init__(self, batch_ms: float, item_ms: float) -> None:
        self.cost = Cost(batch_ms=batch_ms, item_ms=item_ms)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        spend(self.cost, len(batch["id"]))
        return batch


@dataclass
class PoolConfig:
    items: int = 100_000
    gpus: int = 4
    batch_size: int = 64
    cost: Cost = field(default_factory=Cost)
    #: Steps of the dedicated sample (0 skips it).
    dedicated_sample: int = 40
    repeat: int = 1
    timeout: float = 3600.0


@dataclass
class PoolReport:
    config: dict[str, Any]
    #: Seconds per round.
    durable: list[float] = field(default_factory=list)
    ray_data: list[float] = field(default_factory=list)
    #: Seconds of the dedicated sample, and those extrapolated to `items`.
    dedicated_sample: list[float] = field(default_factory=list)

    @property
    def dedicated(self) -> list[float]:
        sample = self.config["dedicated_sample"]
        return [s * self.config["items"] / sample for s in self.dedicated_sample]

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "dedicated_extrapolated": self.dedicated}


def ray_data_seconds(config: PoolConfig) -> float:
    import ray.data  # needs pandas and pyarrow: pip install 'choreography-ray[bench]'

    began = time.perf_counter()
    # Blocks enough for every actor to take many (one block is one actor's task), and actors
    # reserving a GPU and no CPU, as the pool's hosts do.
    blocks = config.gpus * RAY_DATA_BLOCKS_PER_ACTOR
    dataset = ray.data.range(config.items, override_num_blocks=blocks).map_batches(
        _Model,
        fn_constructor_kwargs={"batch_ms": config.cost.batch_ms, "item_ms": config.cost.item_ms},
        batch_size=config.batch_size,
        concurrency=config.gpus,
        num_gpus=1,
        num_cpus=0,
    )
    rows = dataset.materialize().count()
    seconds = time.perf_counter() - began
    if rows != config.items:
        raise RuntimeError(f"Ray Data returned {rows} rows of {config.items}")
    return seconds


def run(config: PoolConfig, log: Callable[[str], None] = print) -> PoolReport:
    """Each round: the dedicated sample first (while every GPU is free), Ray Data, then the
    durable job. Pool hosts leave one second after their job (`pool_idle_timeout`), so the
    next round's dedicated actors find the GPUs free."""
    from choreography_ray.bench import harness, systems

    os.environ[BATCH_SIZE_ENV] = str(config.batch_size)
    report = PoolReport(config={**asdict(config), "cost": config.cost.model_dump()})
    scratch = Path(tempfile.mkdtemp(prefix="choreography-bench-pools-"))
    options = cr.JobsOptions(pool_idle_timeout=POOL_IDLE_SECONDS)
    try:
        with harness.local_ray(num_gpus=config.gpus):
            connection = systems.Connection.open(
                f"sqlite:///{scratch / 'bench.db'}", options, harness.RAY_NAMESPACE, "pools"
            )

            def durable(items: int, dedicated: bool = False) -> float:
                request = EmbedRequest(items=items, cost=config.cost, dedicated=dedicated)
                seconds, status, _ = connection.run_job(request, config.timeout, job_type=EmbedJob)
                if status != cr.JobStatus.COMPLETED_SUCCESSFULLY:
                    raise RuntimeError(f"the bench's job ended {status}")
                return seconds

            for repeat in range(config.repeat):
                if config.dedicated_sample:
                    log(f"round {repeat + 1}: {config.dedicated_sample} dedicated steps")
                    report.dedicated_sample.append(durable(config.dedicated_sample, True))
                    time.sleep(2 * POOL_IDLE_SECONDS)
                log(f"round {repeat + 1}: Ray Data map_batches, {config.items} items")
                report.ray_data.append(ray_data_seconds(config))
                log(f"round {repeat + 1}: the durable job, {config.items} batched steps")
                report.durable.append(durable(config.items))
                time.sleep(2 * POOL_IDLE_SECONDS)  # the pool leaves
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def print_report(report: PoolReport, console: Console) -> None:
    """Median seconds of each system, items a second, and the ratio to Ray Data's time."""
    items = report.config["items"]
    table = Table(title=f"{items} items, {report.config['gpus']} GPUs, batches of "
                  f"{report.config['batch_size']}, {report.config['repeat']} round(s)")  # fmt: skip
    for column in ("system", "seconds", "items/s", "/ Ray Data"):
        table.add_column(column, justify="left" if column == "system" else "right")
    base = statistics.median(report.ray_data)
    rows = [
        ("Ray Data map_batches (not durable)", report.ray_data),
        ("durable job, batched pool", report.durable),
        ("durable job, dedicated (extrapolated)", report.dedicated),
    ]
    for name, seconds in rows:
        if seconds:
            median = statistics.median(seconds)
            table.add_row(name, f"{median:.1f}", f"{items / median:,.0f}", f"{median / base:.2f}")
    console.print(table)
