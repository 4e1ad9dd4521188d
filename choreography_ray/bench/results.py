"""What one benchmark run measured: one record per measurement, and the report that holds them.

Times are seconds of wall clock, memory is bytes; `steps_per_second` is derived. The JSON the
`bench` command writes is `BenchReport.to_json()`: these records as dictionaries, under the keys
`durable`, `bare_tasks`, `actors`, `storage_ceiling`, `resume_halfway`, `latency`,
`metrics_overhead` and `metrics_overhead_summary`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def _rate(steps: int, seconds: float) -> float | None:
    return steps / seconds if seconds > 0 else None


@dataclass(kw_only=True)
class Memory:
    """The highest sums of RSS seen during the measurement (see `rss.py`)."""

    #: The Ray worker processes (actors and task workers).
    peak_rss_workers_bytes: int = 0
    #: The driver and every process it started (GCS, raylet, agents, workers).
    peak_rss_all_bytes: int = 0


@dataclass(kw_only=True)
class DurableRun(Memory):
    """The durable job, from `start` to a terminal status; ratios against the baselines of the
    same round (same number of steps)."""

    repeat: int
    steps: int
    storage: str
    seconds: float
    status: str
    successful_steps: int
    failed_steps: int
    bare_tasks_seconds: float | None = None
    ratio_vs_bare_tasks: float | None = None
    storage_ceiling_seconds: float | None = None
    ratio_vs_storage_ceiling: float | None = None
    actors_seconds_extrapolated: float | None = None

    @property
    def steps_per_second(self) -> float | None:
        return _rate(self.steps, self.seconds)


@dataclass(kw_only=True)
class BareTasksRun(Memory):
    """`steps` no-op `@ray.remote` tasks, submitted then gathered."""

    repeat: int
    steps: int
    seconds: float

    @property
    def steps_per_second(self) -> float | None:
        return _rate(self.steps, self.seconds)


@dataclass(kw_only=True)
class ActorSample(Memory):
    """One detached actor per step (create, call, kill) on `sample` steps, `window` at once.
    `seconds_for` extrapolates linearly: it is an estimate, not a measurement."""

    repeat: int
    sample: int
    window: int
    seconds: float

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / self.sample

    def seconds_for(self, steps: int) -> float:
        return self.seconds_per_step * steps


@dataclass(kw_only=True)
class CeilingRun(Memory):
    """The provider's raw bulk writes of `steps` step records, batched as the runtime batches
    them: the fastest any job on this storage could go."""

    repeat: int
    steps: int
    storage: str
    insert_seconds: float
    update_seconds: float
    delete_seconds: float

    @property
    def seconds(self) -> float:
        return self.insert_seconds + self.update_seconds + self.delete_seconds

    @property
    def steps_per_second(self) -> float | None:
        return _rate(self.steps, self.seconds)


@dataclass(kw_only=True)
class ResumeRun(Memory):
    """A job whose job actor was killed (and restarted by Ray) once about half its steps had
    reported; it resumes on the counted-records path."""

    repeat: int
    steps: int
    storage: str
    seconds: float
    #: False when the job ended before its actor could be killed (a short job).
    killed: bool
    #: Whether `start` had returned when the actor was killed (else the call failed with it).
    start_returned_before_kill: bool
    seconds_after_kill: float | None
    #: The share of steps counted in the job's saved progress when the actor was killed.
    progress_at_kill: float | None
    status: str
    successful_steps: int
    failed_steps: int
    counted_records: int
    #: SQLite only: bytes the job's counted records take in the file (pages of the
    #: `job_counted_steps` B-tree, after a WAL checkpoint) per record.
    bytes_per_counted_record: float | None = None
    #: SQLite only: growth of the database file over the whole job, after a WAL checkpoint.
    db_file_growth_bytes: int | None = None


@dataclass(kw_only=True)
class MetricsRun:
    """The same durable job with metrics on and with metrics off (`JobsOptions.metrics`), one
    after the other in the same round (odd rounds run the off job first)."""

    repeat: int
    steps: int
    storage: str
    seconds_on: float
    seconds_off: float
    status_on: str
    status_off: str

    @property
    def ratio_on_vs_off(self) -> float | None:
        return self.seconds_on / self.seconds_off if self.seconds_off > 0 else None


@dataclass(kw_only=True)
class LatencyResult:
    """Start-to-completed latency of a 1-step job, warm: `runs` jobs observed by polling the
    job's record every 10 ms, and as many through `JobsManager.wait`."""

    storage: str
    runs: int
    p50_seconds: float
    p90_seconds: float
    p99_seconds: float
    min_seconds: float
    max_seconds: float
    wait_p50_seconds: float
    samples: list[float]
    wait_samples: list[float]
    #: `--breakdown`: per mark of a 1-step job run through `wait`, the median seconds from the
    #: `start` call to it (`systems.MARKS`), in the order of the medians.
    breakdown: dict[str, float] = field(default_factory=dict)


@dataclass
class BenchReport:
    machine: dict[str, Any]
    config: dict[str, Any]
    durable: list[DurableRun] = field(default_factory=list)
    bare_tasks: list[BareTasksRun] = field(default_factory=list)
    actors: list[ActorSample] = field(default_factory=list)
    storage_ceiling: list[CeilingRun] = field(default_factory=list)
    resume_halfway: list[ResumeRun] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)
    metrics_overhead: list[MetricsRun] = field(default_factory=list)

    def metrics_ratio(self, steps: int, storage: str) -> float | None:
        """Every round's seconds with metrics on over those with metrics off, summed."""
        runs = [r for r in self.metrics_overhead if (r.steps, r.storage) == (steps, storage)]
        off = sum(r.seconds_off for r in runs)
        return sum(r.seconds_on for r in runs) / off if off > 0 else None

    def to_json(self) -> dict[str, Any]:
        def records(items: list[Any], *derived: str) -> list[dict[str, Any]]:
            # The measurement first, derived values next, memory last.
            out = []
            for item in items:
                fields = asdict(item)
                memory = {k: fields.pop(k) for k in list(fields) if k.startswith("peak_rss_")}
                out.append({**fields, **{d: getattr(item, d) for d in derived}, **memory})
            return out

        return {
            "machine": self.machine,
            "config": self.config,
            "durable": records(self.durable, "steps_per_second"),
            "bare_tasks": records(self.bare_tasks, "steps_per_second"),
            "actors": records(self.actors, "seconds_per_step"),
            "storage_ceiling": records(self.storage_ceiling, "seconds", "steps_per_second"),
            "resume_halfway": records(self.resume_halfway),
            "latency": records(self.latency),
            "metrics_overhead": records(self.metrics_overhead, "ratio_on_vs_off"),
            "metrics_overhead_summary": self.metrics_summary(),
        }

    def metrics_summary(self) -> list[dict[str, Any]]:
        """Per (steps, storage): the rounds and every round's total on over total off."""
        groups: dict[tuple[int, str], int] = {}
        for r in self.metrics_overhead:
            groups[r.steps, r.storage] = groups.get((r.steps, r.storage), 0) + 1
        return [
            {
                "steps": steps,
                "storage": storage,
                "rounds": rounds,
                "ratio_on_vs_off": self.metrics_ratio(steps, storage),
            }
            for (steps, storage), rounds in sorted(groups.items())
        ]
