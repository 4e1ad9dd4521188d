"""Step outputs (`choreography-ray bench --outputs`, docs/outputs.md), in one local Ray.

Each round, for each number of steps N (100,000 by default) and each storage:

- **bare tasks**: N `@ray.remote` tasks, each returning the same ~100-byte pydantic model a
  step returns (`Record`), gathered with one `ray.get`: the anchor;
- **job, no output**: the durable job of N steps (`OutputsJob`) whose steps succeed without an
  output, from `start` to the terminal status it stored (`systems.Connection.run_job`);
- **job, outputs**: the same job, each step returning its `Record` (about 100 bytes of JSON),
  which its host stores in the group commit of its outcome;
- **count**: `jobs.outputs_dataset(job_id).count()` of that job's N outputs;
- **read**: the same Dataset read whole, `iter_batches` in pyarrow batches of `READ_BATCH`
  rows, each batch's `output.n` summed (checked against the sum the steps wrote).

Each job starts `GAP_SECONDS` after the previous measurement (the manager's spare job actor is
then ready). With `repeat` rounds, odd rounds run bare tasks and the two jobs in the reverse
order. The ratios printed: the job with outputs over the job without (the goal: at most
`GOAL_RATIO`), each job over the bare tasks, and rows/s of the count and of the read (the goal:
well over `GOAL_ROWS_PER_SECOND`).

`read_rows` > 0 adds one more measurement: that many outputs seeded straight into storage by a
Ray task (`put_outputs`, `SEED_CHUNK` a call, under a job id with no job record: the outputs
are read by job id, the job is not checked), then read as a Dataset with `iter_batches`; rows/s
and the driver's peak RSS growth over the read, against the bytes of JSON read (bounded memory:
the growth should not follow the rows). The seeded outputs are deleted after.

The job and step types are here, importable by path in Ray workers (`bench/sharing.py` does
the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

import choreography_ray as cr
from choreography_ray.bench.rss import RssSampler, psutil
from choreography_ray.storage import StoredOutput, redact_url

#: Steps per job when none are given.
DEFAULT_STEPS = 100_000
#: The goal for the job with outputs over the job without.
GOAL_RATIO = 1.3
#: The read rate the goal is well over, in rows/s.
GOAL_ROWS_PER_SECOND = 100_000
#: Rows per batch of the full reads (a page of `datasets.PAGE` is one block).
READ_BATCH = 10_000
#: Outputs per `put_outputs` call when seeding `read_rows`.
SEED_CHUNK = 10_000
#: Steps of the warm-up jobs (untimed).
WARMUP_STEPS = 100
#: Seconds the bench waits before each job (untimed): the jobs manager then has its spare job
#: actor ready (`spare_job_actors`), as a warm system starts a job. Without it, a job started
#: as the previous one ends (jobs of a few thousand steps) makes its own actor, every other
#: job, and takes about 0.7 s more.
GAP_SECONDS = 1.0
#: Seconds between two samples of the driver's RSS during the bounded-memory read.
DRIVER_SAMPLE_SECONDS = 0.05
MIB = 1024 * 1024

#: Pads a `Record` to about 100 bytes of JSON (with a 6-digit step id and n).
PAD = "p" * 64


class Record(BaseModel):
    """A step's output, and a bare task's value: about 100 bytes of JSON."""

    step: str
    n: int
    pad: str = PAD


def record(step_id: str) -> Record:
    try:
        n = int(step_id)
    except ValueError:
        n = 0
    return Record(step=step_id, n=n)


class OutputItem(BaseModel):
    output: bool = True


class OutputStep(cr.JobStep[OutputItem]):
    async def perform(self, request: OutputItem, context: cr.StepContext) -> cr.StepResult:
        if request.output:
            return cr.StepResult.succeeded(output=record(context.step_id))
        return cr.StepResult.succeeded()


class OutputsRequest(BaseModel):
    steps: int
    output: bool = True


class OutputsJob(cr.Job[OutputsRequest]):
    def prepare_steps(self, request: OutputsRequest) -> Iterator[cr.StepSpec]:
        """The steps one at a time, sharing one request (as `workloads.BenchJob`)."""
        item = OutputItem(output=request.output)
        for _ in range(request.steps):
            yield self.create_step(OutputStep, item)


@ray.remote
def _bare(i: int) -> Record:
    return record(f"{i:06d}")


def bare_tasks(steps: int) -> float:
    """Seconds to submit `steps` tasks returning a `Record` each and gather them."""
    began = time.perf_counter()
    values = ray.get([_bare.remote(i) for i in range(steps)])
    seconds = time.perf_counter() - began
    if len(values) != steps:
        raise RuntimeError(f"{len(values)} values of {steps} bare tasks")
    return seconds


def _sum_n(batch: Any) -> int:
    """The sum of `output.n` over a pyarrow batch of output rows."""
    # Through importlib: pyarrow ships no type hints (Ray Data needs it; `bench` extra).
    pc: Any = importlib.import_module("pyarrow.compute")
    total = pc.sum(pc.struct_field(batch["output"], "n")).as_py()
    return int(total or 0)


def full_read(ds: Any) -> tuple[int, int]:
    """(rows, sum of `output.n`) of the Dataset, read in pyarrow batches."""
    rows = total = 0
    for batch in ds.iter_batches(batch_size=READ_BATCH, batch_format="pyarrow"):
        rows += batch.num_rows
        total += _sum_n(batch)
    return rows, total


def expected_sum(steps: int) -> int:
    """The sum of `output.n` over steps (or seeded rows) numbered 0 to `steps` - 1."""
    return steps * (steps - 1) // 2


# -- what one run measured --------------------------------------------------------------------


@dataclass(kw_only=True)
class OutputsRound:
    """One round of one size on one storage; seconds of wall clock, memory in bytes."""

    repeat: int
    steps: int
    storage: str
    bare_seconds: float
    without_seconds: float
    without_status: str
    with_seconds: float
    with_status: str
    #: Outputs stored for the job with outputs, as `count()` saw them, and its seconds.
    counted: int
    count_seconds: float
    #: Rows the full read saw, its seconds, and whether the sum of `output.n` was right.
    read_rows: int
    read_seconds: float
    read_sum_ok: bool
    #: The highest RSS sums during each job (`rss.py`): workers, and the whole tree.
    without_peak_rss_workers_bytes: int = 0
    without_peak_rss_all_bytes: int = 0
    with_peak_rss_workers_bytes: int = 0
    with_peak_rss_all_bytes: int = 0

    @property
    def ratio_with_vs_without(self) -> float:
        return self.with_seconds / self.without_seconds

    @property
    def count_rows_per_second(self) -> float:
        return self.counted / self.count_seconds if self.count_seconds > 0 else 0.0

    @property
    def read_rows_per_second(self) -> float:
        return self.read_rows / self.read_seconds if self.read_seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ratio_with_vs_without": self.ratio_with_vs_without,
            "ratio_without_vs_bare_tasks": self.without_seconds / self.bare_seconds,
            "ratio_with_vs_bare_tasks": self.with_seconds / self.bare_seconds,
            "count_rows_per_second": self.count_rows_per_second,
            "read_rows_per_second": self.read_rows_per_second,
        }


@dataclass(kw_only=True)
class ReadScale:
    """`rows` outputs seeded into storage and read as a Dataset (`iter_batches`)."""

    rows: int
    storage: str
    #: Bytes of one output's JSON, and of all of them (what the read carries).
    output_bytes: int
    data_bytes: int
    seed_seconds: float
    read_rows: int
    read_seconds: float
    read_sum_ok: bool
    #: The driver's RSS just before the read, and the highest seen during it.
    driver_rss_before_bytes: int
    driver_rss_peak_bytes: int
    #: The highest RSS sums during the read (`rss.py`): workers, and the whole tree.
    peak_rss_workers_bytes: int = 0
    peak_rss_all_bytes: int = 0

    @property
    def driver_rss_growth_bytes(self) -> int:
        return max(0, self.driver_rss_peak_bytes - self.driver_rss_before_bytes)

    @property
    def read_rows_per_second(self) -> float:
        return self.read_rows / self.read_seconds if self.read_seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "driver_rss_growth_bytes": self.driver_rss_growth_bytes,
            "driver_rss_growth_vs_data": self.driver_rss_growth_bytes / max(1, self.data_bytes),
            "read_rows_per_second": self.read_rows_per_second,
        }


@dataclass
class OutputsReport:
    machine: dict[str, Any]
    config: dict[str, Any]
    rounds: list[OutputsRound] = field(default_factory=list)
    read_scale: list[ReadScale] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Per size and storage over every round: total seconds of each system, the ratios of
        the totals, and the median rows/s of the count and the read."""
        groups: dict[tuple[int, str], list[OutputsRound]] = {}
        for r in self.rounds:
            groups.setdefault((r.steps, r.storage), []).append(r)
        out = []
        for (steps, storage), rounds in groups.items():
            bare = sum(r.bare_seconds for r in rounds)
            without = sum(r.without_seconds for r in rounds)
            with_ = sum(r.with_seconds for r in rounds)
            out.append(
                {
                    "steps": steps,
                    "storage": storage,
                    "rounds": len(rounds),
                    "bare_seconds": bare,
                    "without_seconds": without,
                    "with_seconds": with_,
                    "ratio_with_vs_without": with_ / without,
                    "ratio_without_vs_bare_tasks": without / bare,
                    "ratio_with_vs_bare_tasks": with_ / bare,
                    "count_rows_per_second": statistics.median(
                        r.count_rows_per_second for r in rounds
                    ),
                    "read_rows_per_second": statistics.median(
                        r.read_rows_per_second for r in rounds
                    ),
                }
            )
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "config": self.config,
            "rounds": [r.as_json() for r in self.rounds],
            "summary": self.summary(),
            "read_scale": [r.as_json() for r in self.read_scale],
        }


@dataclass(frozen=True, kw_only=True)
class OutputsConfig:
    #: Numbers of steps, each measured in every round.
    steps: tuple[int, ...] = (DEFAULT_STEPS,)
    #: Storage URLs; empty = one SQLite file in a temporary directory.
    storages: tuple[str, ...] = ()
    repeat: int = 1
    leases: bool = True
    #: Outputs seeded and read for the bounded-memory measurement (0 = skip it).
    read_rows: int = 0
    #: Seconds any one job may take before the run fails.
    timeout: float = 6 * 3600
    #: Seconds without a change of a job's status or progress after which it counts as stalled.
    stall_seconds: float = 300.0

    def options(self) -> cr.JobsOptions:
        from choreography_ray.bench.harness import LEASE_SECONDS

        return cr.JobsOptions(step_lease_timeout=LEASE_SECONDS if self.leases else 0)


# -- the run ----------------------------------------------------------------------------------

Log = Callable[[str], None]


def run(config: OutputsConfig, log: Log = print) -> OutputsReport:
    """Runs every round (and the bounded-memory read when asked) on a local Ray of its own."""
    from choreography_ray.bench import harness, systems

    scratch = tempfile.mkdtemp(prefix="choreography-bench-outputs-")
    urls = config.storages or (f"sqlite:///{Path(scratch) / 'bench.db'}",)
    report = OutputsReport(machine=harness.machine(), config=asdict(config))
    sampler = RssSampler()
    try:
        with harness.local_ray():
            _quiet_ray_data()
            sampler.start()
            opened = [
                systems.Connection.open(
                    url,
                    config.options(),
                    harness.RAY_NAMESPACE,
                    f"outputs-{i}",
                    config.stall_seconds,
                )
                for i, url in enumerate(urls)
            ]
            connections = {c.storage: c for c in opened}
            report.config["storages"] = [redact_url(url) for url in connections]
            bench = _Bench(config, sampler, log)
            log("warming up (untimed): Ray workers, step hosts, Ray Data's read tasks")
            bare_tasks(min(1_000, max(config.steps)))
            for connection in connections.values():
                bench.job(connection, WARMUP_STEPS, output=False)
                _, job_id, _ = bench.job(connection, WARMUP_STEPS, output=True)
                full_read(connection.jobs.outputs_dataset(job_id))
            for repeat in range(config.repeat):
                if config.repeat > 1:
                    log(f"round {repeat + 1} of {config.repeat}")
                for steps in config.steps:
                    for url, connection in connections.items():
                        report.rounds.append(bench.round(repeat, steps, url, connection))
            if config.read_rows > 0:
                for url, connection in connections.items():
                    report.read_scale.append(bench.read_scale(url, connection))
    finally:
        sampler.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report.machine["load_average_at_end"] = list(os.getloadavg())
    return report


def _quiet_ray_data() -> None:
    """No progress bars of Ray Data in the bench's output."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    with contextlib.suppress(AttributeError):
        context.print_on_execution_start = False


class _Bench:
    def __init__(self, config: OutputsConfig, sampler: RssSampler, log: Log) -> None:
        self.config = config
        self.sampler = sampler
        self.log = log

    def job(self, connection: Any, steps: int, output: bool) -> tuple[float, str, Any]:
        """(seconds, job id, final record) of a job of `steps` steps, started `GAP_SECONDS`
        from now; it must succeed."""
        time.sleep(GAP_SECONDS)
        seconds, status, state = connection.run_job(
            OutputsRequest(steps=steps, output=output), self.config.timeout, job_type=OutputsJob
        )
        if status != str(cr.JobStatus.COMPLETED_SUCCESSFULLY):
            raise RuntimeError(f"the bench's job {state.id} ended {status}")
        return seconds, state.id, state

    def round(self, repeat: int, steps: int, url: str, connection: Any) -> OutputsRound:
        found: dict[str, Any] = {}

        def bare() -> None:
            self.log(f"bare Ray tasks returning a Record: {steps:,}")
            found["bare"] = bare_tasks(steps)

        def job(output: bool) -> None:
            name = "with" if output else "without"
            what = "an output each" if output else "no output"
            self.log(f"durable job: {steps:,} steps, {what}, on {redact_url(url)}")
            with self.sampler.measure() as peak:
                seconds, job_id, state = self.job(connection, steps, output)
            found[name] = (seconds, str(state.status), peak, job_id)

        phases: list[Callable[[], None]] = [bare, partial(job, False), partial(job, True)]
        if repeat % 2:
            phases.reverse()
        for phase in phases:
            phase()
        with_job = found["with"][3]
        ds = connection.jobs.outputs_dataset(with_job)
        self.log(f"outputs_dataset(...).count() of {steps:,} outputs")
        began = time.perf_counter()
        counted = ds.count()
        count_seconds = time.perf_counter() - began
        self.log(f"outputs_dataset(...).iter_batches(): {steps:,} rows, output.n summed")
        ds = connection.jobs.outputs_dataset(with_job)  # afresh: nothing cached from count()
        began = time.perf_counter()
        rows, total = full_read(ds)
        read_seconds = time.perf_counter() - began
        without, with_ = found["without"], found["with"]
        return OutputsRound(
            repeat=repeat,
            steps=steps,
            storage=redact_url(url),
            bare_seconds=found["bare"],
            without_seconds=without[0],
            without_status=without[1],
            with_seconds=with_[0],
            with_status=with_[1],
            counted=counted,
            count_seconds=count_seconds,
            read_rows=rows,
            read_seconds=read_seconds,
            read_sum_ok=rows == steps and total == expected_sum(steps),
            without_peak_rss_workers_bytes=without[2].workers,
            without_peak_rss_all_bytes=without[2].all,
            with_peak_rss_workers_bytes=with_[2].workers,
            with_peak_rss_all_bytes=with_[2].all,
        )

    def read_scale(self, url: str, connection: Any) -> ReadScale:
        rows = self.config.read_rows
        namespace = connection.jobs.namespace
        job_id = f"bench-outputs-read-{uuid.uuid4().hex[:12]}"
        self.log(f"seeding {rows:,} outputs into {redact_url(url)} (job id {job_id})")
        began = time.perf_counter()
        output_bytes = ray.get(_seed.remote(url, namespace, job_id, rows))
        seed_seconds = time.perf_counter() - began
        try:
            self.log(f"reading {rows:,} outputs as a Dataset, iter_batches")
            ds = connection.jobs.outputs_dataset(job_id)
            with self.sampler.measure() as peak, _DriverPeak() as driver:
                began = time.perf_counter()
                read, total = full_read(ds)
                read_seconds = time.perf_counter() - began
        finally:
            ray.get(_unseed.remote(url, namespace, job_id))
        return ReadScale(
            rows=rows,
            storage=redact_url(url),
            output_bytes=output_bytes,
            data_bytes=output_bytes * rows,
            seed_seconds=seed_seconds,
            read_rows=read,
            read_seconds=read_seconds,
            read_sum_ok=read == rows and total == expected_sum(rows),
            driver_rss_before_bytes=driver.before,
            driver_rss_peak_bytes=driver.peak,
            peak_rss_workers_bytes=peak.workers,
            peak_rss_all_bytes=peak.all,
        )


def _storage(url: str, namespace: str) -> Any:
    from choreography_ray.runtime.shared_storage import open_shared_storage

    return open_shared_storage(url, namespace)


@ray.remote
def _seed(url: str, namespace: str, job_id: str, rows: int) -> int:
    """Writes `rows` outputs of `job_id` (step ids 0 to rows - 1, `SEED_CHUNK` a call) in a
    worker, so the driver's memory is not touched; returns the bytes of one output's JSON."""
    width = max(6, len(str(rows - 1)))

    async def seed() -> int:
        storage = _storage(url, namespace)
        size = 0
        try:
            for first in range(0, rows, SEED_CHUNK):
                chunk = []
                for i in range(first, min(rows, first + SEED_CHUNK)):
                    step_id = f"{i:0{width}d}"
                    text = record(step_id).model_dump_json()
                    size = len(text.encode())
                    chunk.append(StoredOutput(job_id, step_id, 0, 1, text))
                await storage.put_outputs(chunk)
        finally:
            await storage.close()
        return size

    return asyncio.run(seed())


@ray.remote
def _unseed(url: str, namespace: str, job_id: str) -> None:
    async def unseed() -> None:
        storage = _storage(url, namespace)
        try:
            await storage.remove_job_outputs(job_id)
        finally:
            await storage.close()

    asyncio.run(unseed())


class _DriverPeak:
    """The driver's own private memory: `before` as the block begins, `peak` the highest seen
    during it, sampled every `DRIVER_SAMPLE_SECONDS` by a daemon thread."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driver-rss", daemon=True)
        self.before = self.peak = 0

    def _rss(self) -> int:
        # Private memory: RSS less its shared pages, which include the object store's mapping
        # (every block the driver reads is mapped from it, and stays counted in RSS after Ray
        # frees it).
        info = self._process.memory_info()
        return int(info.rss - getattr(info, "shared", 0))

    def _run(self) -> None:
        while not self._stopped.wait(DRIVER_SAMPLE_SECONDS):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> _DriverPeak:
        self.before = self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, self._rss())


# -- the report -------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_report(report: OutputsReport, console: Console) -> None:
    table = Table(title="Step outputs: seconds per round (ratios in parentheses)")
    columns = (
        "steps",
        "storage",
        "round",
        "bare tasks s",
        "job, no output s (/ bare)",
        "job, outputs s (/ bare)",
        "outputs / no output",
        "count() rows/s",
        "read rows/s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for r in report.rounds:
        ratio = r.ratio_with_vs_without
        table.add_row(
            f"{r.steps:,}",
            r.storage.split(":", 1)[0],
            str(r.repeat + 1),
            f"{r.bare_seconds:.2f}",
            f"{r.without_seconds:.2f} ({r.without_seconds / r.bare_seconds:.2f})",
            f"{r.with_seconds:.2f} ({r.with_seconds / r.bare_seconds:.2f})",
            f"{ratio:.2f} {_met(ratio <= GOAL_RATIO)}",
            f"{r.count_rows_per_second:,.0f}" + ("" if r.counted == r.steps else " WRONG COUNT"),
            f"{r.read_rows_per_second:,.0f}" + ("" if r.read_sum_ok else " WRONG ROWS"),
        )
    console.print(table)
    for s in report.summary():
        ratio = s["ratio_with_vs_without"]
        console.print(
            f"{s['steps']:,} steps on {s['storage']}, {s['rounds']} round(s): the job with "
            f"outputs took {ratio:.2f} times the job without (goal: at most {GOAL_RATIO}, "
            f"{_met(ratio <= GOAL_RATIO)}); against bare tasks returning the same values: "
            f"{s['ratio_without_vs_bare_tasks']:.2f} without, {s['ratio_with_vs_bare_tasks']:.2f} "
            f"with; reading the outputs: count() {s['count_rows_per_second']:,.0f} rows/s, "
            f"iter_batches {s['read_rows_per_second']:,.0f} rows/s (goal: well over "
            f"{GOAL_ROWS_PER_SECOND:,})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if report.read_scale:
        scale = Table(title="Outputs seeded in storage, read as a Dataset (iter_batches)")
        for column in (
            "rows",
            "storage",
            "JSON MiB",
            "seed s",
            "read s",
            "rows/s",
            "driver private MiB before",
            "driver private growth MiB (/ data)",
            "workers peak MiB",
        ):
            scale.add_column(column, justify="right")
        for read in report.read_scale:
            growth = read.driver_rss_growth_bytes
            scale.add_row(
                f"{read.rows:,}",
                read.storage.split(":", 1)[0],
                f"{read.data_bytes / MIB:,.1f}",
                f"{read.seed_seconds:.1f}",
                f"{read.read_seconds:.2f}",
                f"{read.read_rows_per_second:,.0f}" + ("" if read.read_sum_ok else " WRONG ROWS"),
                f"{read.driver_rss_before_bytes / MIB:,.0f}",
                f"{growth / MIB:,.1f} ({growth / max(1, read.data_bytes):.2f})",
                f"{read.peak_rss_workers_bytes / MIB:,.0f}",
            )
        console.print(scale)


__all__ = ["OutputsConfig", "OutputsReport", "print_report", "run"]
