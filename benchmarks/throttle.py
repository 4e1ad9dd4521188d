"""The start throttle swept: one 100k-step no-op job per `max_concurrent_step_starts` value,
against as many bare Ray tasks, in one run. What the option's default rests on.

python benchmarks/throttle.py --steps 100000 --starts 256 1024 4096 16384
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import choreography_ray as cr
from benchmarks.fanout import bare_tasks, durable_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--starts", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    args = parser.parse_args()
    storage = f"sqlite:///{tempfile.mkdtemp()}/throttle.db"
    times: dict[int, float] = {}
    for starts in args.starts:
        options = cr.JobsOptions(max_concurrent_step_starts=starts, step_lease_timeout=30)
        jobs = cr.Jobs.connect(storage=storage, options=options, address="local")
        durable_job(jobs, 100, scope=f"throttle-{starts}")  # warm the actors
        times[starts], state = durable_job(jobs, args.steps, scope=f"throttle-{starts}")
        print(f"max_concurrent_step_starts {starts:6d}: {times[starts]:7.2f} s  {state.status}")
    bare = bare_tasks(args.steps)
    print(f"bare Ray tasks: {bare:.2f} s")
    for starts, seconds in times.items():
        print(f"ratio at {starts:6d}: {seconds / bare:.3f}")


if __name__ == "__main__":
    main()
