"""An N-step no-op job against N bare Ray tasks, in one run: prints both times and the ratio.

python benchmarks/fanout.py --steps 100000 --storage sqlite:///bench.db
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import choreography_ray as cr
from choreography_ray.bench.workloads import BenchJob, BenchRequest


@ray.remote
def noop() -> None:
    return None


def bare_tasks(n: int) -> float:
    started = time.perf_counter()
    pending = [noop.remote() for _ in range(n)]
    ray.get(pending)
    return time.perf_counter() - started


def durable_job(
    jobs: cr.Jobs,
    n: int,
    stages: int = 1,
    fail_rate: float = 0.0,
    step_ms: float = 0.0,
    scope: str = "bench",
) -> tuple[float, cr.JobState]:
    manager = jobs.manager(scope, "fanout")
    started = time.perf_counter()
    job = manager.start(
        BenchJob, BenchRequest(steps=n, stages=stages, fail_rate=fail_rate, step_ms=step_ms)
    )
    state = manager.wait(job.job_id, timeout=3600)
    return time.perf_counter() - started, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--storage", default=None)
    args = parser.parse_args()
    storage = args.storage or f"sqlite:///{tempfile.mkdtemp()}/fanout.db"
    with cr.Jobs.connect(storage=storage) as jobs:
        bare_tasks(min(args.steps, 1000))  # warm the worker pool
        durable_job(jobs, 100)  # warm the actors
        durable, state = durable_job(jobs, args.steps)
        bare = bare_tasks(args.steps)
    print(f"steps {args.steps}  storage {storage}  status {state.status}")
    print(f"durable job     {durable:8.2f} s  {args.steps / durable:10.0f} steps/s")
    print(f"bare Ray tasks  {bare:8.2f} s  {args.steps / bare:10.0f} tasks/s")
    print(f"ratio durable / bare tasks: {durable / bare:.3f}")


if __name__ == "__main__":
    main()
