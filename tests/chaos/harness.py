"""The chaos harness: a run planned from a seed, carried out in a subprocess, checked after.

`plan_run(seed, profile)` draws everything a run does from `random.Random(seed)`: one to three
jobs (random stages, failing, raising and flaky steps, sync and dedicated steps, a step time
that makes each job run for a few seconds), the options (window, leases on or off, attempts)
and the fault schedule (each fault fires when its job has a drawn share of its steps ended, or
once the job has settled). The plan and the schedule are reproducible from the seed; timing is
not: which steps are in flight when a fault fires depends on the machine.

`run_seed(seed, profile)` runs one plan in a subprocess of its own (a Ray cluster cannot share
a process with another one, and a hung run is killed with its process group), and returns the
run's result: what each fault did, the invariants violated, the re-runs of in-flight steps, and
the time each fault took the jobs to make progress again. `python -m tests.chaos.harness SEED
[PROFILE [STORAGE]]` runs one seed in the foreground and prints its result.

A run keeps its jobs in an SQLite file (the storage wrapper's faults) or, with `storage=
"mongodb"`, in MongoDB behind the fault proxy (`tests.mongo_proxy`, its faults in place of the
wrapper's): on `CHOREOGRAPHY_MONGODB_URI`'s server when it is set, else on an nx-27017 server
of the run's own. A seed draws the same jobs on both, its faults from the storage's kinds.

The `pool` profile's runs also have pool jobs (steps batched on hosts of one declared GPU, the
worker nodes declaring GPUs) and the pool faults; what is particular to pools is drawn from a
random stream of its own (`_pool_plan`), so that no other profile's seeds change.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.mongo_proxy import FaultProxy

#: The repository root: the chaos subprocess runs there, with it on PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]

#: Where runs keep their files: per run, its step log, hooks log, SQLite file and driver log.
RUNS_DIR = Path(tempfile.gettempdir()) / "choreography-chaos"

#: The faults of the storage wrapper (`storage_faults`), with the mode each turns on: injected
#: only if a write (a read, for `refuse_reads`) met them.
WRAPPER_FAULTS = {
    "storage_refuse": "refuse",
    "storage_slow": "slow",
    "storage_lost_ack": "lost_ack",
    "stop_storage_read_fail": "refuse_reads",
}

#: The faults during a stop (`faults.STOP_FAULTS`), drawn with a profile's `stop_faults` chance;
#: the read fault is the SQLite wrapper's, so a MongoDB run draws the host restart only.
STOP_FAULTS = ("stop_host_restart", "stop_storage_read_fail")

#: The providers a run may keep its jobs in: an SQLite file under the storage wrapper, or
#: MongoDB behind the fault proxy (`tests.mongo_proxy`), whose faults replace the wrapper's.
STORAGES = ("sqlite", "mongodb")
#: The proxy's faults and their weights, in place of every `storage_` kind on MongoDB.
MONGODB_WEIGHTS = {
    "mongo_latency": 1.5,
    "mongo_reset": 1.5,
    "mongo_lost_ack": 3.0,
    "mongo_partition": 1.5,
    "mongo_blackhole": 1.0,
    "mongo_half_open": 1.5,
}
#: The proxy's faults that fire on a request: injected only if a request met them.
ONE_SHOT_MONGODB_FAULTS = {"mongo_reset": "reset", "mongo_lost_ack": "drop_reply",
                           "mongo_half_open": "hang"}  # fmt: skip

#: Seconds a pool run may have no GPU node (`remove_node` took the last one) before the harness
#: adds one, so that its pool jobs reach the shares its later faults wait for.
GPU_LESS_GRACE = 10.0

#: The Ray namespace of every run (each run has its own cluster).
RAY_NAMESPACE = "chaos"


@dataclass(frozen=True)
class Profile:
    """How big a run is drawn."""

    name: str
    jobs: tuple[int, int]
    steps: tuple[int, int]
    faults: tuple[int, int]
    #: Seconds each job should run for without faults (its step time is drawn to fit).
    job_seconds: tuple[float, float]
    #: Weight of each fault kind in the draw.
    weights: dict[str, float]
    #: Seconds every job has, after the last fault, to settle.
    settle_timeout: float
    #: Seconds the whole run may take before it is stopped and reported.
    deadline: int
    #: The SQLite provider's busy timeout in the run's cluster, which `storage_lock_refuse`
    #: holds the lock past (None: the provider's own, 30 s).
    sqlite_busy_seconds: float | None = None
    #: The chance that a job is a pool job (one at least when above 0); its worker nodes then
    #: declare GPUs. Drawn from a stream of its own (`_pool_plan`).
    pool_jobs: float = 0.0
    #: The chance that a run also has a fault during a stop (`STOP_FAULTS`), drawn from a
    #: stream of its own (`_stop_fault`).
    stop_faults: float = 0.0


_COMMON = {
    "kill_host_ray": 3.0,
    "kill_host_sigkill": 3.0,
    "kill_job_actor": 3.0,
    "kill_manager": 1.5,
    "kill_recovery": 1.0,
    "remove_node": 2.0,
    "add_node": 1.0,
    "restart_cluster": 1.5,
    "storage_lock": 2.0,
    "storage_refuse": 1.5,
    "storage_slow": 1.0,
    "storage_lost_ack": 2.0,
    "drop_deliveries": 1.5,
    "duplicate_delivery": 2.0,
    "op_stop": 1.5,
    "op_resume": 1.0,
    "op_double_resume": 1.0,
    "op_remove": 1.0,
    "op_retry_failed": 1.5,
}

#: Faults that are two faults at once, aimed at one job (drawn only by the `activation`
#: profile, so that every other profile's seeds keep their plans).
COMBINED = {
    # The job actor dies while the stopped (or removed) job's steps wind down.
    "stop_then_kill_job_actor": ("op_stop", "kill_job_actor"),
    "remove_then_kill_job_actor": ("op_remove", "kill_job_actor"),
    # The job actor dies with one of the job's step hosts.
    "kill_job_actor_and_host": ("kill_job_actor", "kill_host_sigkill"),
}

#: A job that keeps counting steps after the last fault settles within this many times the
#: profile's `settle_timeout` (each third of it without progress ends the wait sooner).
SETTLE_CAP = 3


def run_deadline(profile: Profile) -> int:
    """Seconds a run may take: the profile's deadline, and the longer wait of jobs that keep
    counting steps (`SETTLE_CAP`)."""
    return int(profile.deadline + (SETTLE_CAP - 1) * profile.settle_timeout)


#: The pool faults' weights in the `pool` profile (faults.POOL_FAULTS).
POOL_WEIGHTS = {"kill_pool_host": 5.0, "remove_gpu_node": 3.5, "unplaceable_pool": 3.0}

PROFILES = {
    # CI: about 20-30 s a run on two cores, most of it Ray starting.
    "ci": Profile(
        name="ci",
        jobs=(1, 2),
        steps=(150, 400),
        faults=(1, 2),
        job_seconds=(3.0, 6.0),
        weights=_COMMON,
        settle_timeout=60.0,
        deadline=240,
        stop_faults=0.2,
    ),
    # The soak: bigger jobs, more faults, and the lock held past SQLite's busy timeout.
    "soak": Profile(
        name="soak",
        jobs=(1, 3),
        steps=(300, 2000),
        faults=(1, 4),
        job_seconds=(4.0, 12.0),
        weights={**_COMMON, "storage_lock_refuse": 0.5},
        settle_timeout=150.0,
        deadline=480,
        stop_faults=0.2,
    ),
    # The default test tier: the ci profile's jobs with three or four faults a run, drawn from
    # every kind (the soak's too), so that six runs draw every fault kind between them.
    "tier": Profile(
        name="tier",
        jobs=(1, 2),
        steps=(150, 400),
        faults=(3, 4),
        job_seconds=(3.0, 6.0),
        weights={**_COMMON, "storage_lock_refuse": 0.5},
        settle_timeout=90.0,
        deadline=300,
        # A lock held past 8 s refuses writes, not past 30: the same fault, 22 s sooner (and
        # still longer than any `storage_lock`, whose writes wait).
        sqlite_busy_seconds=8.0,
        stop_faults=0.2,
    ),
    # The default tier's MongoDB run: the tier's jobs and six faults of the fault proxy, no
    # other kind, so that one run can draw each proxy fault (issue 27). MongoDB only.
    "proxy": Profile(
        name="proxy",
        jobs=(1, 2),
        steps=(150, 400),
        faults=(6, 6),
        job_seconds=(3.0, 6.0),
        weights={},
        settle_timeout=90.0,
        deadline=300,
    ),
    # The soak's runs, with a job actor killed during a stop, a removal, or with its host
    # (issue 23): what a restarted activation must carry on from.
    "activation": Profile(
        name="activation",
        jobs=(1, 3),
        steps=(300, 2000),
        faults=(1, 4),
        job_seconds=(4.0, 12.0),
        weights={
            **_COMMON,
            "storage_lock_refuse": 0.5,
            "stop_then_kill_job_actor": 3.0,
            "remove_then_kill_job_actor": 1.5,
            "kill_job_actor_and_host": 2.0,
        },
        settle_timeout=150.0,
        deadline=480,
    ),
    # Issue 34: the tier's jobs and fault counts, pool jobs among them (GPU worker nodes), and
    # the pool faults beside every other kind: a pool host killed mid-batch, a GPU node
    # removed (a new one added later), a job whose pool no node can place.
    "pool": Profile(
        name="pool",
        jobs=(1, 2),
        steps=(150, 400),
        faults=(3, 4),
        job_seconds=(3.0, 6.0),
        weights={**_COMMON, "storage_lock_refuse": 0.5, **POOL_WEIGHTS},
        settle_timeout=90.0,
        deadline=300,
        sqlite_busy_seconds=8.0,
        pool_jobs=0.6,
    ),
}


# -- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    #: The index of the job it aims at.
    job: int
    #: Fires once this share of the job's steps have ended (1.0: once the job has settled).
    at: float
    #: How long a lasting fault lasts, in seconds.
    seconds: float
    #: Chooses among candidates (which host, which node), in 0..1.
    pick: float


@dataclass(frozen=True)
class JobPlan:
    job_type: str
    #: The `ChaosRequest` as JSON data (its step log is filled in when the run starts).
    steps: list[dict[str, Any]]

    @property
    def total(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class RunPlan:
    seed: int
    profile: str
    worker_nodes: int
    leases: bool
    window: int | None
    attempts: int
    jobs: list[JobPlan]
    faults: list[FaultPlan]
    #: Whether the cluster runs Ray's dashboard, which serves the state API (`ray.util.state`)
    #: the lease rule asks whether a step's hosting actor is gone.
    state_api: bool = False
    #: One of `STORAGES`.
    storage: str = "sqlite"
    #: GPUs each worker node declares (0 in a run without pool jobs).
    worker_gpus: int = 0

    def options(self) -> Any:
        import choreography_ray as cr

        return cr.JobsOptions(
            job_watchdog_interval=0.5,
            step_delivery_retry_delay=0.1,
            max_step_delivery_retry_delay=0.5,
            step_retry_backoff=0.2,
            max_step_retry_backoff=1.0,
            max_step_attempts=self.attempts,
            max_active_steps_per_job=self.window,
            step_lease_timeout=2.0 if self.leases else 0.0,
            reconciliation_interval=2.0,
            step_hosts_per_node=1,
        )

    def summary(self) -> dict[str, Any]:
        """The plan without its step lists."""
        return {
            "seed": self.seed,
            "profile": self.profile,
            "storage": self.storage,
            "worker_nodes": self.worker_nodes,
            "worker_gpus": self.worker_gpus,
            "leases": self.leases,
            "state_api": self.state_api,
            "window": self.window,
            "attempts": self.attempts,
            "jobs": [
                {
                    "type": j.job_type,
                    "steps": j.total,
                    "stages": sorted({s["stage"] for s in j.steps}),
                    "failing": sum(1 for s in j.steps if s["item"]["ending"] != "ok"),
                    "flaky": sum(1 for s in j.steps if s["item"]["flaky_attempts"]),
                    "dedicated": sum(1 for s in j.steps if s["kind"] == "dedicated"),
                    "sync": sum(1 for s in j.steps if s["kind"] == "sync"),
                    "pool": sum(1 for s in j.steps if s["kind"] in ("pool", "pool2")),
                }
                for j in self.jobs
            ],
            "faults": [asdict(f) for f in self.faults],
        }


def _job_plan(rng: random.Random, profile: Profile, window: int | None, retryable: bool) -> JobPlan:
    total = rng.randint(*profile.steps)
    stages = [0] if retryable else sorted(rng.sample(range(0, 60, 10), rng.randint(1, 3)))
    # Cut points: every stage gets at least one step.
    cuts = sorted(rng.sample(range(1, total), len(stages) - 1))
    bounds = [0, *cuts, total]
    seconds = rng.uniform(*profile.job_seconds)
    parallel = window or total
    average_ms = min(3000.0, max(5.0, seconds * 1000 * parallel / total))
    fail_rate = rng.choice([0.0, 0.005, 0.02])
    flaky_rate = rng.choice([0.0, 0.01, 0.05])
    dedicated = set(rng.sample(range(total), rng.choice([0, 0, 1, 2])))
    steps: list[dict[str, Any]] = []
    for index, stage in enumerate(stages):
        for n in range(bounds[index], bounds[index + 1]):
            roll = rng.random()
            ending = "fail" if roll < fail_rate / 2 else "raise" if roll < fail_rate else "ok"
            kind = "dedicated" if n in dedicated else "sync" if rng.random() < 0.15 else "async"
            steps.append(
                {
                    "kind": kind,
                    "stage": stage,
                    "item": {
                        "log": "",
                        "n": n,
                        "work_ms": round(average_ms * rng.uniform(0.5, 1.5), 1),
                        "ending": ending,
                        "flaky_attempts": rng.randint(1, 2) if rng.random() < flaky_rate else 0,
                    },
                }
            )
    return JobPlan("retryable" if retryable else "staged", steps)


def _pool_plan(
    seed: int, profile: Profile, window: int | None, jobs: list[JobPlan], faults: list[FaultPlan]
) -> tuple[list[JobPlan], list[FaultPlan], int, int]:
    """Pool jobs among `jobs`, the pool faults aimed at them, and the worker nodes and GPUs of
    the run, drawn from a stream of their own: the run's other draws stay as they were.

    A pool job has a share (half, 80 % or all) of its steps on the pool, of one concurrency (1
    or 2 batches a host), their step time drawn so that its pool steps take 3-6 s on the run's
    GPUs; they end `ok` or `fail`, never `raise` (a raising batch fails its neighbours)."""
    rng = random.Random(f"pool:{seed}")
    worker_nodes = rng.choice([1, 1, 2])
    worker_gpus = rng.choice([1, 2, 2])
    pooled = [i for i in range(len(jobs)) if rng.random() < profile.pool_jobs]
    pooled = pooled or [rng.randrange(len(jobs))]
    out = list(jobs)
    for index in pooled:
        job = jobs[index]
        share = rng.choice([0.5, 0.8, 1.0])
        kind = rng.choice(["pool", "pool2"])
        on_pool = [n for n, s in enumerate(job.steps) if s["kind"] != "dedicated"]
        on_pool = [n for n in on_pool if rng.random() < share]
        concurrency = 2 if kind == "pool2" else 1
        parallel = min(window or len(on_pool), worker_nodes * worker_gpus * concurrency * 8)
        seconds = rng.uniform(*profile.job_seconds)
        # A batch works as long as its longest step: about 1.4 times the average of 8.
        average_ms = min(3000.0, max(5.0, seconds * 1000 * parallel / max(1, len(on_pool)) / 1.4))
        steps = [dict(s, item=dict(s["item"])) for s in job.steps]
        for n in on_pool:
            item = steps[n]["item"]
            steps[n]["kind"] = kind
            item["work_ms"] = round(average_ms * rng.uniform(0.5, 1.5), 1)
            if item["ending"] == "raise":
                item["ending"] = "fail"
        out[index] = JobPlan(job.job_type, steps)
    aimed = []
    for fault in faults:
        if fault.kind in POOL_WEIGHTS and fault.kind != "unplaceable_pool":
            fault = FaultPlan(fault.kind, rng.choice(pooled), fault.at, fault.seconds, fault.pick)
        aimed.append(fault)
    return out, aimed, worker_nodes, worker_gpus


def _stop_fault(seed: int, profile: Profile, storage: str, jobs: int) -> FaultPlan | None:
    """A fault during a stop, with the profile's chance, drawn from a stream of its own so that
    the run's other draws stay as they were: the job is stopped once a share of its steps have
    ended, and a host of it restarts, or reads of its steps are refused for 1-3 s."""
    rng = random.Random(f"stop:{seed}")
    if rng.random() >= profile.stop_faults:
        return None
    kinds = [k for k in STOP_FAULTS if storage == "sqlite" or k == "stop_host_restart"]
    kind = rng.choice(kinds)
    job, at = rng.randrange(jobs), round(rng.uniform(0.1, 0.8), 3)
    return FaultPlan(kind, job, at, round(rng.uniform(1.0, 3.0), 2), rng.random())


def fault_weights(profile: Profile, storage: str) -> dict[str, float]:
    """The profile's fault kinds for a run on `storage`: on MongoDB the proxy's faults replace
    the SQLite ones."""
    if storage == "sqlite":
        return profile.weights
    kept = {k: w for k, w in profile.weights.items() if not k.startswith("storage_")}
    return {**kept, **MONGODB_WEIGHTS}


def plan_run(seed: int, profile: str = "ci", storage: str = "sqlite") -> RunPlan:
    """Everything a run does, drawn from `seed`."""
    if storage not in STORAGES:
        raise ValueError(f"unknown storage {storage!r}: one of {', '.join(STORAGES)}")
    shape = PROFILES[profile]
    rng = random.Random(seed)
    window = rng.choice([4, 8, 16, 32, None])
    jobs = [
        _job_plan(rng, shape, window, retryable=rng.random() < 0.35)
        for _ in range(rng.randint(*shape.jobs))
    ]
    drawn = fault_weights(shape, storage)
    if not drawn:
        raise ValueError(f"the {profile} profile draws no fault on {storage}")
    kinds = list(drawn)
    weights = [drawn[k] for k in kinds]
    faults: list[FaultPlan] = []
    for _ in range(rng.randint(*shape.faults)):
        kind = rng.choices(kinds, weights)[0]
        job = rng.randrange(len(jobs))
        at = round(rng.uniform(0.1, 0.8), 3)
        if kind == "op_retry_failed":
            retryable = [i for i, j in enumerate(jobs) if j.job_type == "retryable"]
            job = rng.choice(retryable) if retryable and rng.random() < 0.8 else job
            at = 1.0
        elif kind == "op_resume" and rng.random() < 0.5:
            # A stop first, and the resume once the stop is final.
            faults.append(FaultPlan("op_stop", job, at, 0.0, rng.random()))
            at = 1.0
        seconds, pick = round(rng.uniform(2.0, 6.0), 2), rng.random()
        parts = COMBINED.get(kind, (kind,))
        faults.extend(FaultPlan(part, job, at, seconds, pick) for part in parts)
    faults.sort(key=lambda f: f.at)
    leases = rng.random() < 0.5
    attempts = rng.choice([1, 2, 3])
    # Drawn last, so that adding it left every earlier seed's plan as it was.
    state_api = rng.random() < 0.5
    if (stop := _stop_fault(seed, shape, storage, len(jobs))) is not None:
        faults = sorted([*faults, stop], key=lambda f: f.at)
    worker_nodes, worker_gpus = 1, 0
    if shape.pool_jobs:
        jobs, faults, worker_nodes, worker_gpus = _pool_plan(seed, shape, window, jobs, faults)
    return RunPlan(
        seed=seed,
        profile=profile,
        worker_gpus=worker_gpus,
        worker_nodes=worker_nodes,
        leases=leases,
        window=window,
        attempts=attempts,
        jobs=jobs,
        faults=faults,
        state_api=state_api,
        storage=storage,
    )


# -- the result -------------------------------------------------------------------------------


@dataclass
class FaultRecord:
    kind: str
    job: str
    #: Seconds after the run's first job started.
    at: float
    injected: bool
    detail: str
    #: Epoch seconds the fault began and its effect ended.
    began: float
    ended: float
    answer: str | None = None
    #: Seconds from the fault to every job it found running making progress again.
    progress_again_after: float | None = None
    #: The job the fault started (`unplaceable_pool`), its steps and its start's seconds.
    started: str | None = None
    started_steps: int = 0
    start_seconds: float | None = None


@dataclass
class RunResult:
    seed: int
    profile: str
    plan: dict[str, Any]
    seconds: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    #: Extra starts of a step at an attempt it had started at already, by why they were allowed.
    reruns: dict[str, int] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    client_ray_errors: dict[str, int] = field(default_factory=dict)
    storage_fault_hits: dict[str, int] = field(default_factory=dict)
    ray_sessions: list[str] = field(default_factory=list)
    #: What the harness did besides the faults (a deferred GPU node added, the stop of an
    #: unplaceable job), with the seconds after the first job started.
    notes: list[str] = field(default_factory=list)
    run_dir: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        data = {k: v for k, v in data.items() if k != "ok"}
        data["faults"] = [FaultRecord(**f) for f in data.get("faults", [])]
        return cls(**data)

    def violate(self, kind: str, job: str, detail: str) -> None:
        self.violations.append({"seed": self.seed, "kind": kind, "job": job, "detail": detail})


# -- carrying a run out (in the run's subprocess) ---------------------------------------------


class StepLog:
    """The run's step log, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.ended: defaultdict[str, set[str]] = defaultdict(set)

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            if line.strip():
                event = json.loads(line)
                if event["event"] == "end":
                    self.ended[event["job"]].add(event["step"])


SETTLED = ("CompletedSuccessfully", "CompletedWithFailures", "Failed")


def _state(world: Any, job_id: str) -> Any:
    """The job's stored record; None once it is gone."""
    import choreography_ray as cr

    try:
        return world.call(lambda: world.manager.get(job_id))
    except cr.JobOperationError as error:
        if error.error is cr.JobLookupError.JOB_NOT_FOUND:
            return None
        raise


def _status(world: Any, job_id: str) -> tuple[str, int]:
    """The job's stored status (`removed` once it is gone, `stopped` once a stop is final) and
    how many of its steps have a counted outcome."""
    import choreography_ray as cr

    state = _state(world, job_id)
    if state is None:
        return "removed", 0
    p = state.progress
    done = p.successful_steps + p.failed_steps + p.unreachable_steps + p.stopped_steps
    if state.status is cr.JobStatus.STOPPED:
        return ("stopped" if state.stop_finalized else "stopping"), done
    return str(state.status.value), done


#: MongoDB's deadlines in a run (docs/chaos.md): a half-open connection or a partition fails a
#: call within seconds, not the provider's minute.
RUN_MONGODB_TIMEOUTS = {
    "serverSelectionTimeoutMS": 3000,
    "socketTimeoutMS": 5000,
    "connectTimeoutMS": 10000,
}


@contextlib.contextmanager
def run_storage(plan: RunPlan, run_dir: Path) -> Iterator[tuple[str, FaultProxy | None]]:
    """The run's storage URL, and the fault proxy in front of it on MongoDB: a database of its
    own on `CHOREOGRAPHY_MONGODB_URI`'s server (dropped at the end), else on an nx-27017 server
    of the run's own (stopped at the end)."""
    if plan.storage == "sqlite":
        yield f"sqlite:///{run_dir / 'jobs.db'}", None
        return
    from tests.mongo_proxy import fault_proxy, start_nx
    from tests.support import free_port

    upstream = os.environ.get("CHOREOGRAPHY_MONGODB_URI")
    server = None
    if upstream is None:
        server, upstream = start_nx(run_dir / "nx-27017", free_port())
    database = f"chaos_{plan.seed}_{os.getpid()}"
    try:
        with fault_proxy(upstream) as proxy:
            yield proxy.url(database, **RUN_MONGODB_TIMEOUTS), proxy
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        else:
            import pymongo

            client: pymongo.MongoClient[dict[str, Any]]
            with pymongo.MongoClient(upstream, serverSelectionTimeoutMS=5000) as client:
                client.drop_database(database)


def execute(plan: RunPlan, run_dir: Path, log: Any = print) -> RunResult:
    """Carries the plan out on a cluster of its own and checks the invariants."""
    with run_storage(plan, run_dir) as (storage_url, proxy):
        return _execute(plan, run_dir, storage_url, proxy, log)


def _execute(
    plan: RunPlan, run_dir: Path, storage_url: str, proxy: FaultProxy | None, log: Any
) -> RunResult:
    from tests.chaos import faults as chaos_faults
    from tests.chaos import invariants
    from tests.chaos.jobs import JOB_TYPES, ChaosRequest

    result = RunResult(seed=plan.seed, profile=plan.profile, plan=plan.summary())
    result.run_dir = str(run_dir)
    step_log = run_dir / "steps.jsonl"
    world = chaos_faults.ChaosCluster(
        run_dir=run_dir,
        storage_url=storage_url,
        proxy=proxy,
        options=plan.options(),
        namespace=RAY_NAMESPACE,
        scope=f"chaos-{plan.seed}",
        worker_nodes=plan.worker_nodes,
        worker_gpus=plan.worker_gpus,
        dashboard=plan.state_api,
        log=log,
        sqlite_busy_seconds=PROFILES[plan.profile].sqlite_busy_seconds,
    )
    shape = PROFILES[plan.profile]
    began = time.time()
    try:
        world.start()
        result.ray_sessions.append(_session_dir())
        job_ids: list[str] = []
        for job in plan.jobs:
            steps = [{**s, "item": {**s["item"], "log": str(step_log)}} for s in job.steps]
            request = ChaosRequest.model_validate({"steps": steps})
            start_job = functools.partial(world.manager.start, JOB_TYPES[job.job_type], request)
            started = world.call(start_job)
            job_ids.append(started.job_id)
            log(f"seed {plan.seed}: job {started.job_id} ({job.job_type}, {job.total} steps)")
        t0 = time.time()
        follower = StepLog(step_log)
        progress: dict[str, list[tuple[float, int]]] = {j: [] for j in job_ids}
        states: dict[str, str] = {}
        #: Per job, seconds after t0 it was first seen settled.
        settled_at: dict[str, float] = {}
        #: Pool hosts of an unplaceable job's shape ever seen in Ray's actor table.
        unplaceable_hosts: set[str] = set()

        def note(what: str) -> None:
            result.notes.append(f"+{time.time() - t0:.1f}s {what}")
            log(f"seed {plan.seed}: +{time.time() - t0:.1f}s {what}")

        def look() -> None:
            follower.poll()
            for job_id in job_ids:
                status, done = _status(world, job_id)
                states[job_id] = status
                progress[job_id].append((time.time(), done))
                if settled(job_id):
                    settled_at.setdefault(job_id, round(time.time() - t0, 1))
                else:
                    settled_at.pop(job_id, None)  # a resume or retry reopened it
            if any(f.started for f in result.faults):
                unplaceable_hosts.update(invariants.unplaceable_hosts(world))

        def settled(job_id: str) -> bool:
            return states.get(job_id) in (*SETTLED, "stopped", "removed")

        pending = list(plan.faults)
        #: Per injected fault, the jobs that had not settled when it began.
        running_at: list[list[str]] = []
        last_look = 0.0
        fault_deadline = time.monotonic() + shape.deadline / 2
        while pending:
            if time.monotonic() - last_look > 0.3:
                look()
                last_look = time.monotonic()
            for done in world.run_due():
                note(done)
            if (added := world.ensure_gpu_node(grace=GPU_LESS_GRACE)) is not None:
                note(added)
            fault = pending[0]
            job_id = job_ids[fault.job]
            share = len(follower.ended[job_id]) / plan.jobs[fault.job].total
            late = time.monotonic() > fault_deadline
            if settled(job_id) or late or (fault.at < 1.0 and share >= fault.at):
                pending.pop(0)
                running = [j for j in job_ids if not settled(j)]
                start = time.time()
                try:
                    injected = chaos_faults.inject(
                        world,
                        fault.kind,
                        job_id,
                        seconds=fault.seconds,
                        pick=fault.pick,
                        step_log=step_log,
                    )
                except Exception as error:
                    injected = chaos_faults.Injected(
                        False, f"the injection raised {type(error).__name__}: {error}"
                    )
                end = injected.until or time.time()
                if fault.kind == "restart_cluster":
                    result.ray_sessions.append(_session_dir())
                record = FaultRecord(
                    kind=fault.kind,
                    job=job_id,
                    at=round(start - t0, 3),
                    injected=injected.injected,
                    detail=injected.detail,
                    began=start,
                    ended=end,
                    answer=injected.answer,
                    started=injected.started,
                    started_steps=injected.started_steps,
                    start_seconds=injected.start_seconds,
                )
                running_at.append(running)
                result.faults.append(record)
                log(f"seed {plan.seed}: +{record.at:.1f}s {fault.kind}: {injected.detail}")
            else:
                time.sleep(0.05)

        # A GPU node a fault removed comes back (or one is added when none is left), so that the
        # pool jobs can finish.
        for done in world.run_due(wait=True):
            note(done)
        if (added := world.ensure_gpu_node()) is not None:
            note(added)
        # Every job settles within the bound; a stop is final only if one was the last word.
        expectations = invariants.expectations(result.faults, job_ids)
        for job_id, expectation in expectations.items():
            if expectation.remove_unsure and invariants.untouched_by_remove(_state(world, job_id)):
                expectation.removed = False
        # A job still counting steps is slow, not stuck (with its deliveries dropped, its
        # watchdog settles a window of outcomes a tick): its bound runs from its last progress,
        # up to SETTLE_CAP times the bound after the last fault.
        began_settling = time.monotonic()
        cap = began_settling + SETTLE_CAP * shape.settle_timeout
        deadline = began_settling + shape.settle_timeout
        counted = -1
        while True:
            look()
            waiting = [j for j in job_ids if not expectations[j].satisfied_by(states[j])]
            now = time.monotonic()
            if (done := sum(progress[j][-1][1] for j in waiting)) != counted:
                counted, deadline = done, max(deadline, now + shape.settle_timeout / 3)
            if not waiting or now > min(deadline, cap):
                break
            time.sleep(0.3)
        waited = f"{time.monotonic() - began_settling:.0f} s after the last fault" + (
            " (still counting steps)" if time.monotonic() > cap else ""
        )
        beside = [f"{f.started} since +{f.at:.1f}s" for f in result.faults if f.started]
        for job_id in waiting:
            result.violate(
                "not_settled",
                job_id,
                f"still {states[job_id]} {waited} "
                f"(expected {expectations[job_id].describe()})"
                + (f"; an unplaceable job ran beside it: {', '.join(beside)}" if beside else ""),
            )
        # Only now, every other job settled (or late), is an unplaceable job stopped.
        stops = [
            _stop_unplaceable(world, record, result.faults, note)
            for record in result.faults
            if record.started
        ]
        for record, running in zip(result.faults, running_at, strict=True):
            if record.injected and not record.kind.startswith("op_"):
                record.progress_again_after = invariants.progress_again(
                    progress, running, record.began, record.ended
                )
        if proxy is not None:
            proxy.heal()  # the checks read storage: a fault not fired yet is not theirs
        invariants.check(world, plan, result, job_ids, states, expectations, step_log, run_dir)
        for record, stop in zip([f for f in result.faults if f.started], stops, strict=True):
            invariants.check_unplaceable(world, result, record, stop, step_log, unplaceable_hosts)
        if plan.worker_gpus:
            invariants.check_pool_hosts(world, result)
        result.jobs = [
            {
                "job": j,
                "status": states[j],
                "steps": plan.jobs[i].total,
                "settled_at": settled_at.get(j),
            }
            for i, j in enumerate(job_ids)
        ]
    except Exception:
        result.error = traceback.format_exc()
    finally:
        result.client_ray_errors = dict(world.stats.ray_errors)
        result.storage_fault_hits = dict(
            Counter(e["mode"] for e in _read(run_dir / "storage_faults.jsonl"))
            if proxy is None
            else Counter(kind for kind, _ in proxy.hits)
        )
        for record in result.faults:
            mode = WRAPPER_FAULTS.get(record.kind)
            if mode is not None and not result.storage_fault_hits.get(mode):
                # Turned on, but no call met it (or the wrapper is not in place).
                record.injected = False
                record.detail += f" (no {'read' if mode == 'refuse_reads' else 'write'} met it)"
            one_shot = ONE_SHOT_MONGODB_FAULTS.get(record.kind)
            if one_shot is not None and not result.storage_fault_hits.get(one_shot):
                record.injected = False
                record.detail += " (no request met it)"
        try:
            world.shutdown()
        except Exception:
            log(f"seed {plan.seed}: cluster shutdown failed: {traceback.format_exc()}")
        result.seconds = round(time.time() - began, 1)
    return result


#: Seconds the stop of an unplaceable job has to answer, and then to be final.
UNPLACEABLE_STOP_SECONDS = 30.0


def _stop_unplaceable(
    world: Any, record: FaultRecord, faults: list[FaultRecord], note: Any
) -> dict[str, Any]:
    """Stops the unplaceable job `record` started and waits for the stop to be final; what it
    saw: the stop's answer and seconds (of its last call), the job's last status and when it
    was final. The stop is the operator's, not a fault: it waits for the lasting faults to end,
    and a stop storage refused (`COULD_NOT_PERSIST_STOP`, `UNKNOWN`) is asked again."""
    import choreography_ray as cr

    assert record.started is not None
    job_id = record.started
    time.sleep(max(0.0, max(f.ended for f in faults) + 0.5 - time.time()))
    began = time.monotonic()
    refused = (cr.StopJobError.COULD_NOT_PERSIST_STOP, cr.StopJobError.UNKNOWN)
    while True:
        call = time.monotonic()
        try:
            answer = repr(world.call(lambda: world.manager.stop(job_id)))
        except cr.JobOperationError as error:
            answer = f"raised {error.error!r}"
            if error.error in refused and call - began < UNPLACEABLE_STOP_SECONDS:
                note(f"the stop of the unplaceable job {job_id} {answer}: asked again")
                time.sleep(1.0)
                continue
        except Exception as error:
            answer = f"raised {type(error).__name__}: {error}"
        break
    stop_seconds = round(time.monotonic() - call, 2)
    status = ""
    while time.monotonic() - call < stop_seconds + UNPLACEABLE_STOP_SECONDS:
        status, _ = _status(world, job_id)
        if status in ("stopped", "removed", *SETTLED):
            break
        time.sleep(0.3)
    final = round(time.monotonic() - call, 2)
    note(f"stopped the unplaceable job {job_id}: {answer} in {stop_seconds} s, {status} "
         f"after {final} s")  # fmt: skip
    return {"answer": answer, "stop_seconds": stop_seconds, "status": status, "final": final}


def _read(path: Path) -> list[dict[str, Any]]:
    from tests.support import read_trace

    return read_trace(path)


def _session_dir() -> str:
    import ray

    try:
        node: Any = ray._private.worker._global_node
        return str(node.get_session_dir_path())
    except Exception:
        return ""


# -- running a seed (in the caller's process) -------------------------------------------------


def run_seed(
    seed: int,
    profile: str = "ci",
    keep: bool = False,
    stream: Any = None,
    storage: str = "sqlite",
) -> RunResult:
    """Runs one seed in a subprocess with its own process group and returns its result. The
    run's directory (step log, hooks log, SQLite file or nx-27017 databases, driver log) is
    kept when the run fails or `keep` is set."""
    name = f"{profile}-{seed}" if storage == "sqlite" else f"{profile}-{storage}-{seed}"
    run_dir = RUNS_DIR / f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    deadline = run_deadline(PROFILES[profile])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1"}
    env.pop("CHAOS_RUN_DIR", None)
    driver_log = run_dir / "driver.log"
    with driver_log.open("w") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.chaos.harness",
                "--child",
                str(seed),
                profile,
                str(run_dir),
                storage,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = process.communicate(timeout=deadline + 90)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            out += "\n"
    result: RunResult | None = None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if lines:
        try:
            result = RunResult.from_json(json.loads(lines[-1]))
        except (ValueError, TypeError):
            result = None
    if result is None:
        plan = plan_run(seed, profile, storage)
        result = RunResult(seed=seed, profile=profile, plan=plan.summary(), run_dir=str(run_dir))
        tail = driver_log.read_text()[-4000:] if driver_log.exists() else ""
        code = process.returncode
        result.error = f"the run's process ended without a result (code {code}):\n{tail}"
    # Ray's processes share the run's process group; none may outlive it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if stream is not None:
        stream.write(driver_log.read_text() if driver_log.exists() else "")
    if result.ok and not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _child(seed: int, profile: str, run_dir: Path, storage: str) -> None:
    plan = plan_run(seed, profile, storage)
    deadline = run_deadline(PROFILES[profile])

    def on_deadline(*_: Any) -> None:
        raise TimeoutError(f"chaos run of seed {seed} still running after {deadline} s")

    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(deadline)
    try:
        result = execute(plan, run_dir, log=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        signal.alarm(0)
    print(json.dumps(result.to_json()), flush=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        _child(int(argv[1]), argv[2], Path(argv[3]), argv[4])
        return 0
    seed = int(argv[0]) if argv else 0
    profile = argv[1] if len(argv) > 1 else "ci"
    storage = argv[2] if len(argv) > 2 else "sqlite"
    result = run_seed(seed, profile, keep=True, stream=sys.stderr, storage=storage)
    print(json.dumps(result.to_json(), indent=2))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# -- many runs ----------------------------------------------------------------------------------


def summarize(results: list[RunResult]) -> dict[str, Any]:
    """The figures of a soak: runs, faults by kind (injected and not), violations with their
    seeds, re-runs of in-flight steps, and the longest time from a fault to progress."""
    injected: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    reruns: Counter[str] = Counter()
    longest: dict[str, Any] | None = None
    violations: list[dict[str, Any]] = []
    for result in results:
        for fault in result.faults:
            (injected if fault.injected else skipped)[fault.kind] += 1
            after = fault.progress_again_after
            if after is not None and (longest is None or after > longest["seconds"]):
                longest = {"seconds": after, "seed": result.seed, "kind": fault.kind}
        reruns.update(result.reruns)
        violations.extend(result.violations)
        if result.error is not None:
            first = result.error.strip().splitlines()[-1] if result.error.strip() else ""
            violations.append(
                {"seed": result.seed, "kind": "harness_error", "job": "", "detail": first}
            )
    in_flight = sum(n for key, n in reruns.items() if key.startswith("in_flight:"))
    return {
        "runs": len(results),
        "failed_seeds": sorted({v["seed"] for v in violations}),
        "faults_injected": dict(sorted(injected.items())),
        "faults_not_injected": dict(sorted(skipped.items())),
        "violations": violations,
        "reruns": dict(sorted(reruns.items())),
        "reruns_in_flight": in_flight,
        "reruns_after_outcome": sum(reruns.values()) - in_flight,
        "longest_fault_to_progress": longest,
        "seconds": round(sum(r.seconds for r in results), 1),
    }


def describe(result: RunResult) -> str:
    """A failing run in a few lines, with the command that runs its seed again."""
    lines = [
        f"chaos seed {result.seed} ({result.profile}) failed; run it again with "
        f"`choreography-ray chaos --runs 1 --seed {result.seed} --profile {result.profile}` "
        f"or `python -m tests.chaos.harness {result.seed} {result.profile}`",
        f"run directory: {result.run_dir}; Ray sessions: {', '.join(result.ray_sessions)}",
        "faults: "
        + "; ".join(
            f"+{f.at:.1f}s {f.kind} ({'injected' if f.injected else 'not injected'}: {f.detail})"
            for f in result.faults
        ),
    ]
    lines += [f"violated {v['kind']} (job {v['job']}): {v['detail']}" for v in result.violations]
    if result.error:
        lines.append(f"harness error:\n{result.error}")
    return "\n".join(lines)
