"""The benchmark harness behind `choreography-ray bench`: the durable job against bare Ray, in
one run, on one local Ray cluster started here.

A *round* measures, for each number of steps, one after another:

1. the durable job (`workloads.py:BenchJob`) on each storage, from `start` to a terminal
   status;
2. as many bare Ray tasks (`@ray.remote` no-op), submitted and gathered;
3. the storage ceiling on each storage: the provider's raw bulk insert + update + delete of as
   many step records;

and once per round, one detached Ray actor per step on a sample, extrapolated. With `repeat`
rounds, odd rounds run in the reverse order, so that neither side always goes first on a
machine that warms up or gets busier. Peak memory is sampled throughout (`rss.py`).
The extra scenarios (a resume after the job actor is killed halfway, the latency of a 1-step
job, the same job with metrics on and off) run after the rounds.

It ships in the package, so an installed wheel runs it: the Ray workers import the job and
step types (`choreography_ray.bench.workloads`) from wherever `choreography_ray` is installed.
Usable without the CLI:

    from choreography_ray.bench import BenchConfig, run
    report = run(BenchConfig(steps=(1_000, 10_000)))
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import ray

import choreography_ray as cr
from choreography_ray.bench import systems
from choreography_ray.bench.results import (
    BareTasksRun,
    BenchReport,
    DurableRun,
    Memory,
    MetricsRun,
)
from choreography_ray.bench.rss import Peak, RssSampler, total_memory
from choreography_ray.bench.systems import STALL_SECONDS
from choreography_ray.bench.workloads import BenchRequest
from choreography_ray.storage import redact_url

#: The Ray namespace of the benchmark's actors.
RAY_NAMESPACE = "choreography-bench"
#: `step_lease_timeout` when leases are on, in seconds.
LEASE_SECONDS = 30.0
#: Steps of the untimed job each storage runs first (imports, step hosts, connections): enough
#: start batches (`step_batch_size`, 1,024) to reach every shared host of a machine like this
#: one, which a host's first steps create; 100 steps reached one of two, and the first timed
#: round paid for the other's process starting up. No more than the largest timed job.
WARMUP_STEPS = 10_000
#: The directory that holds the `choreography_ray` package: a source checkout's root, or an
#: environment's site-packages.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    #: Numbers of steps, each measured in every round.
    steps: tuple[int, ...] = (10_000,)
    #: Storage URLs; empty = one SQLite file in a temporary directory.
    storages: tuple[str, ...] = ()
    stages: int = 1
    leases: bool = True
    #: `max_active_steps_per_job`; None = no window.
    window: int | None = None
    #: Simulated work per step, in milliseconds (an `asyncio.sleep`).
    step_ms: float = 0.0
    #: Share of steps that fail (every `round(1 / fail_rate)`-th step).
    fail_rate: float = 0.0
    repeat: int = 1
    #: Run the rounds (durable, bare tasks, actors, storage ceiling).
    compare: bool = True
    #: In the rounds, also run as many bare Ray tasks (10,000,000 of them take about 2 hours
    #: and 80 GiB of the driver's references: leave them out for the largest jobs).
    bare_tasks: bool = True
    #: In the rounds, also measure the storage ceiling.
    storage_ceiling: bool = True
    #: Actors created in the actor-per-step sample (0 = skip), and at most in flight.
    actor_sample: int = 200
    actor_window: int = 16
    resume_halfway: bool = False
    #: 1-step jobs timed for the latency scenario (0 = skip).
    latency_runs: int = 0
    #: With `latency_runs`: also break the 1-step jobs' time into its marks.
    breakdown: bool = False
    #: Also run each job with metrics on and off (`JobsOptions.metrics`), `repeat` rounds.
    metrics_overhead: bool = False
    #: Seconds any one job may take before the run fails.
    timeout: float = 6 * 3600
    #: Seconds without a change of a job's status or progress after which it is reported as
    #: stalled and the run goes on.
    stall_seconds: float = STALL_SECONDS

    def options(self, metrics: bool = True) -> cr.JobsOptions:
        return cr.JobsOptions(
            step_lease_timeout=LEASE_SECONDS if self.leases else 0,
            max_active_steps_per_job=self.window,
            metrics=metrics,
        )

    def request(self, steps: int) -> BenchRequest:
        return BenchRequest(
            steps=steps,
            stages=min(self.stages, steps),
            fail_rate=self.fail_rate,
            step_ms=self.step_ms,
        )


def machine() -> dict[str, Any]:
    """What the figures came from; the load average says how busy the machine was."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": total_memory(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "choreography_ray": cr.__version__,
        "load_average_at_start": list(os.getloadavg()),
        **_source(),
    }


def _source() -> dict[str, Any]:
    """The commit measured, and whether the checkout had changes on top of it; nothing when the
    package is installed (a wheel in site-packages, even one inside some git work tree)."""

    def git(*args: str) -> str:
        try:
            completed = subprocess.run(
                ["git", "-C", str(PACKAGE_PARENT), *args],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError:  # no git on this machine
            return ""
        return completed.stdout.strip() if completed.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != PACKAGE_PARENT:
        return {}
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain"))}


def _worker_paths() -> list[str]:
    """`PYTHONPATH` for the Ray workers: the driver's, with this package's parent first when it
    is a source checkout (not installed), so that the workers import the same `choreography_ray`
    (the job and step types are stored by import path). An installed package is on every
    worker's path already, and site-packages must not be put before the standard library."""
    paths = list(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    installed = {Path(sysconfig.get_path(kind)).resolve() for kind in ("purelib", "platlib")}
    if PACKAGE_PARENT not in installed:
        paths.insert(0, str(PACKAGE_PARENT))
    return list(dict.fromkeys(paths))


@contextmanager
def local_ray(num_gpus: int | None = None) -> Iterator[None]:
    """A fresh local Ray, stopped at the end, declaring `num_gpus` GPUs (Ray takes them on a
    machine without any). An already initialized Ray is used as it is."""
    if ray.is_initialized():
        yield
        return
    previous = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONWARNINGS")}
    os.environ["PYTHONPATH"] = os.pathsep.join(_worker_paths())
    # Ray 2.60's `was_current_actor_reconstructed` (asked by every job actor as it starts)
    # warns about Ray's own use of a deprecated property; once per job floods the output.
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [previous["PYTHONWARNINGS"], "ignore::DeprecationWarning:ray.runtime_context"])
    )
    try:
        # "local": a new cluster even when RAY_ADDRESS or a `ray start` on this machine names
        # another. The sampler measures the processes this one starts, and the benchmark's
        # detached actors must not outlive it in someone else's cluster.
        ray.init(
            address="local",
            namespace=RAY_NAMESPACE,
            num_gpus=num_gpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _with_memory(record: Memory, peak: Peak) -> None:
    record.peak_rss_workers_bytes = peak.workers
    record.peak_rss_all_bytes = peak.all


@dataclass
class _Session:
    config: BenchConfig
    sampler: RssSampler
    connections: dict[str, systems.Connection]
    report: BenchReport
    log: Log
    #: The same storages' connections with metrics off (`--metrics-overhead`), by URL.
    metrics_off: dict[str, systems.Connection] = field(default_factory=dict)

    def durable(self, repeat: int, steps: int, url: str) -> None:
        self.log(f"durable job: {steps:,} steps on {redact_url(url)}")
        connection = self.connections[url]
        # A job starts on a warm system, its manager's spare job actor ready (as the latency
        # runs do): the one before it (the rounds alternate, so two can follow one another)
        # has the next spare made once it settles (`core/spares.py`).
        connection.await_spares(self.config.timeout)
        with self.sampler.measure() as peak:
            seconds, status, state = connection.run_job(
                self.config.request(steps), self.config.timeout
            )
        run = DurableRun(
            repeat=repeat,
            steps=steps,
            storage=redact_url(url),
            seconds=seconds,
            status=status,
            successful_steps=state.progress.successful_steps,
            failed_steps=state.progress.failed_steps,
        )
        _with_memory(run, peak)
        self.report.durable.append(run)

    def bare(self, repeat: int, steps: int) -> None:
        self.log(f"bare Ray tasks: {steps:,}")
        with self.sampler.measure() as peak:
            seconds = systems.bare_tasks(steps, self.config.step_ms)
        run = BareTasksRun(repeat=repeat, steps=steps, seconds=seconds)
        _with_memory(run, peak)
        self.report.bare_tasks.append(run)

    def ceiling(self, repeat: int, steps: int, url: str) -> None:
        self.log(f"storage ceiling: {steps:,} records on {redact_url(url)}")
        with self.sampler.measure() as peak:
            run = systems.storage_ceiling(repeat, url, steps, self.config.leases)
        _with_memory(run, peak)
        self.report.storage_ceiling.append(run)

    def actors(self, repeat: int) -> None:
        sample, window = self.config.actor_sample, self.config.actor_window
        self.log(f"one actor per step: a sample of {sample}, {window} at once")
        with self.sampler.measure() as peak:
            run = systems.actor_sample(repeat, sample, window, RAY_NAMESPACE)
        _with_memory(run, peak)
        self.report.actors.append(run)

    def round(self, repeat: int) -> None:
        phases: list[partial[None]] = []
        for steps in self.config.steps:
            phases += [partial(self.durable, repeat, steps, url) for url in self.connections]
            if self.config.bare_tasks:
                phases.append(partial(self.bare, repeat, steps))
            if self.config.storage_ceiling:
                phases += [partial(self.ceiling, repeat, steps, url) for url in self.connections]
        if self.config.actor_sample > 0:
            phases.append(partial(self.actors, repeat))
        if repeat % 2:
            phases.reverse()
        for phase in phases:
            phase()

    def resumes(self) -> None:
        for repeat in range(self.config.repeat):
            for steps in self.config.steps:
                for url, connection in self.connections.items():
                    self.log(f"job actor killed halfway: {steps:,} steps on {redact_url(url)}")
                    with self.sampler.measure() as peak:
                        run = systems.resume_halfway(
                            connection, repeat, self.config.request(steps), self.config.timeout
                        )
                    _with_memory(run, peak)
                    self.report.resume_halfway.append(run)

    def metrics_overheads(self) -> None:
        """Each job with metrics on, then off (odd rounds: off first), on each storage."""
        for repeat in range(self.config.repeat):
            for steps in self.config.steps:
                for url, on in self.connections.items():
                    off = self.metrics_off[url]
                    self.log(f"metrics on and off: {steps:,} steps on {redact_url(url)}")
                    request = self.config.request(steps)
                    runs = [("on", on), ("off", off)]
                    if repeat % 2:
                        runs.reverse()
                    timed = {
                        name: connection.run_job(request, self.config.timeout)
                        for name, connection in runs
                    }
                    self.report.metrics_overhead.append(
                        MetricsRun(
                            repeat=repeat,
                            steps=steps,
                            storage=redact_url(url),
                            seconds_on=timed["on"][0],
                            seconds_off=timed["off"][0],
                            status_on=timed["on"][1],
                            status_off=timed["off"][1],
                        )
                    )

    def latencies(self) -> None:
        runs = self.config.latency_runs
        for url, connection in self.connections.items():
            self.log(f"latency of a 1-step job: {runs} runs on {redact_url(url)}")
            self.report.latency.append(
                systems.latency(connection, runs, self.config.timeout, self.config.breakdown)
            )

    def warm_up(self) -> None:
        self.log("warming up (untimed): Ray workers, step hosts, storage connections")
        systems.bare_tasks(min(1_000, max(self.config.steps)))
        for connection in [*self.connections.values(), *self.metrics_off.values()]:
            warm_up = self.config.request(min(WARMUP_STEPS, max(self.config.steps)))
            connection.run_job(warm_up, self.config.timeout)
            connection.await_spares(self.config.timeout)
        if self.config.compare and self.config.actor_sample > 0:
            systems.actor_per_step(min(16, self.config.actor_sample), 16, RAY_NAMESPACE)


def attach_baselines(report: BenchReport) -> None:
    """Gives every durable run the bare-task, storage-ceiling and actor times of its round."""
    bare = {(r.repeat, r.steps): r.seconds for r in report.bare_tasks}
    ceiling = {(r.repeat, r.steps, r.storage): r.seconds for r in report.storage_ceiling}
    actors = {r.repeat: r for r in report.actors}
    for run in report.durable:
        run.bare_tasks_seconds = bare.get((run.repeat, run.steps))
        if run.bare_tasks_seconds:
            run.ratio_vs_bare_tasks = run.seconds / run.bare_tasks_seconds
        run.storage_ceiling_seconds = ceiling.get((run.repeat, run.steps, run.storage))
        if run.storage_ceiling_seconds:
            run.ratio_vs_storage_ceiling = run.seconds / run.storage_ceiling_seconds
        sample = actors.get(run.repeat)
        if sample is not None:
            run.actors_seconds_extrapolated = sample.seconds_for(run.steps)


def run(config: BenchConfig, log: Log = print) -> BenchReport:
    """Runs every round and scenario `config` asks for and returns what was measured."""
    scratch = tempfile.mkdtemp(prefix="choreography-bench-")
    urls = config.storages or (f"sqlite:///{Path(scratch) / 'bench.db'}",)
    report = BenchReport(machine=machine(), config=asdict(config))
    report.config["storages"] = [redact_url(url) for url in urls]
    report.config["lease_seconds"] = LEASE_SECONDS if config.leases else 0
    sampler = RssSampler()
    try:
        with local_ray():
            sampler.start()
            options = config.options()
            # A step's simulated work is time without progress too.
            stall = config.stall_seconds + 2 * config.step_ms / 1000
            opened = [
                systems.Connection.open(url, options, RAY_NAMESPACE, f"storage-{i}", stall)
                for i, url in enumerate(urls)
            ]
            # Keyed by the URL as resolved by `Jobs.connect` (relative SQLite paths made
            # absolute), so that the storage ceiling writes the same database as the job.
            connections = {connection.storage: connection for connection in opened}
            report.config["storages"] = [redact_url(url) for url in connections]
            session = _Session(config, sampler, connections, report, log)
            if config.metrics_overhead:
                off = config.options(metrics=False)
                session.metrics_off = {
                    url: systems.Connection.open(
                        url, off, RAY_NAMESPACE, f"storage-{i}-metrics-off", stall
                    )
                    for i, url in enumerate(connections)
                }
            session.warm_up()
            if config.compare:
                for repeat in range(config.repeat):
                    if config.repeat > 1:
                        log(f"round {repeat + 1} of {config.repeat}")
                    session.round(repeat)
                attach_baselines(report)
            if config.resume_halfway:
                session.resumes()
            if config.latency_runs > 0:
                session.latencies()
            if config.metrics_overhead:
                session.metrics_overheads()
    finally:
        sampler.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report.machine["load_average_at_end"] = list(os.getloadavg())
    return report


__all__ = ["LEASE_SECONDS", "RAY_NAMESPACE", "BenchConfig", "attach_baselines", "run"]
