"""The faults of a chaos run, and the cluster they are injected into.

`ChaosCluster` owns one run's `ray.cluster_utils.Cluster` (a head and worker nodes of one CPU
each, Ray's health checks shortened so a removed node is declared dead in about 2 s), the Ray
connection and the `Jobs` handle; it can add and remove nodes and restart the whole cluster on
the same SQLite file.

`inject(kind, ...)` carries out one fault and says what it did. Everything is black-box: actors
are found by name in Ray's actor table and killed with `ray.kill` or SIGKILL of their process,
nodes through the Cluster, storage faults through a second SQLite connection that holds the
write lock (a real fault) or through the run's control file read by the test-only wrapper
(`storage_faults`), operator actions through the public manager API. Two faults reach past the
public API, through actor methods Ray exposes anyway: `drop_deliveries` (the step hosts' test
hook) and a duplicate delivery (the job actor's `report_outcomes` called again with outcomes
the step log shows were already reported).

Two faults come during a stop: the harness stops the job and, before the stop is final, a step
host running its steps restarts (`stop_host_restart`) or reads of its steps are refused
(`stop_storage_read_fail`, the wrapper's `refuse_reads`).

In a run with pool jobs (`worker_gpus`), each worker node declares that many GPUs (Ray accepts
them without real ones) and the head none, so pool hosts live on the workers only. The pool
faults: a pool host killed mid-batch (`kill_pool_host`), a GPU worker removed and a new one added
`seconds` later (`remove_gpu_node`, the add deferred: `ChaosCluster.run_due`), and a job whose
pool no node can place started beside the others (`unplaceable_pool`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from ray.cluster_utils import Cluster

import choreography_ray as cr
from choreography_ray.storage.sqlite import BUSY_TIMEOUT_MS
from tests.chaos import storage_faults
from tests.chaos.jobs import (
    RUN_DIR_ENV,
    UNPLACEABLE_SHAPE,
    ChaosItem,
    ChaosJob,
    ChaosRequest,
    ChaosStepPlan,
)
from tests.chaos.storage_faults import BUSY_ENV
from tests.support import free_port, read_trace

if TYPE_CHECKING:
    from tests.mongo_proxy import FaultProxy

T = TypeVar("T")

#: Ray declares a silent node dead after 3 missed checks 0.5 s apart, not after about 30 s.
HEALTH = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_initial_delay_ms": 0,
}

#: Seconds Ray takes to declare a removed node dead with `HEALTH`, with a margin.
NODE_DEATH_SECONDS = 3.0

#: Seconds a client call keeps retrying while Ray restarts the actor it calls.
CALL_PATIENCE = 60.0

#: Holds the SQLite write lock in a second process: the argument is the file and the seconds.
LOCK_SCRIPT = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("ROLLBACK")
connection.close()
"""

#: Every kind of fault, in the order reports list them.
PROCESS_FAULTS = (
    "kill_host_ray",
    "kill_host_sigkill",
    "kill_job_actor",
    "kill_manager",
    "kill_recovery",
)
NODE_FAULTS = ("remove_node", "add_node", "restart_cluster")
STORAGE_FAULTS = (
    "storage_lock",
    "storage_lock_refuse",
    "storage_refuse",
    "storage_slow",
    "storage_lost_ack",
)
#: The fault proxy's, on MongoDB (`tests.mongo_proxy`).
MONGODB_FAULTS = (
    "mongo_latency",
    "mongo_reset",
    "mongo_lost_ack",
    "mongo_partition",
    "mongo_blackhole",
    "mongo_half_open",
)
DELIVERY_FAULTS = ("drop_deliveries", "duplicate_delivery")
OPERATOR_ACTIONS = ("op_stop", "op_resume", "op_double_resume", "op_remove", "op_retry_failed")
#: Faults during a stop (issue 35): the harness stops the job and, before the stop is final, a
#: step host running its steps restarts, or reads of its steps are refused (SQLite's wrapper).
STOP_FAULTS = ("stop_host_restart", "stop_storage_read_fail")
KINDS = (
    PROCESS_FAULTS + NODE_FAULTS + STORAGE_FAULTS + MONGODB_FAULTS + DELIVERY_FAULTS
    + OPERATOR_ACTIONS + STOP_FAULTS
)  # fmt: skip
#: The faults whose answer is a stop's.
STOPS = ("op_stop", *STOP_FAULTS)
#: The pool faults, drawn by the `pool` profile only (its runs have GPU nodes and pool jobs).
POOL_FAULTS = ("kill_pool_host", "remove_gpu_node", "unplaceable_pool")

#: Faults that can lose a running step or its outcome's write: a step in flight at one of
#: them may run again.
LOSSY = frozenset(
    {
        "kill_host_ray", "kill_host_sigkill", "remove_node", "restart_cluster", *STORAGE_FAULTS,
        *MONGODB_FAULTS, "kill_pool_host", "remove_gpu_node", "stop_host_restart",
    }
)  # fmt: skip
#: The commands a one-shot proxy fault aims at: the writes the runtime makes.
MONGODB_WRITES = ("update", "insert", "delete", "findAndModify")

#: Seconds a pool fault waits for a batch of its job to be in flight before it takes any host
#: (or GPU node) there is.
BATCH_WAIT_SECONDS = 5.0
#: Seconds `stop_host_restart` waits for the job to be stored STOPPED (or its stop to answer)
#: before it kills the host anyway.
STOP_STORED_SECONDS = 5.0
#: A batch logged as started within this many seconds, and not ended, is taken as in flight (a
#: batch of a host killed earlier never logs its end).
IN_FLIGHT_SECONDS = 10.0


@dataclass
class ClientStats:
    """Ray errors the public client let through while the harness rode out a restart."""

    ray_errors: dict[str, int] = field(default_factory=dict)

    def count(self, error: BaseException) -> None:
        name = type(error).__name__
        self.ray_errors[name] = self.ray_errors.get(name, 0) + 1


#: Tries of a cluster start after `restart_cluster` (`ChaosCluster.restart`).
START_TRIES = 3


class ChaosCluster:
    """One run's Ray cluster, connection and jobs manager."""

    def __init__(
        self,
        *,
        run_dir: Path,
        storage_url: str,
        options: cr.JobsOptions,
        namespace: str,
        scope: str,
        worker_nodes: int = 1,
        worker_gpus: int = 0,
        dashboard: bool = False,
        log: Callable[[str], None] = print,
        sqlite_busy_seconds: float | None = None,
        proxy: FaultProxy | None = None,
    ) -> None:
        self.run_dir = run_dir
        #: The fault proxy in front of MongoDB, on that storage.
        self.proxy = proxy
        self.storage_url = storage_url
        self.storage_path = storage_url.removeprefix("sqlite:///")
        self.options = options
        self.namespace = namespace
        self.scope = scope
        self.initial_workers = worker_nodes
        #: GPUs each worker node declares (0: none, and the head never has any).
        self.worker_gpus = worker_gpus
        #: The ids of the nodes made with GPUs, over every cluster of the run.
        self.gpu_nodes: set[str] = set()
        #: Actions a fault deferred: (epoch seconds due, what, the action), run by `run_due`.
        self.due: list[tuple[float, str, Callable[[], str]]] = []
        #: Since when (monotonic) the cluster has had no GPU worker (`ensure_gpu_node`).
        self._gpu_less_since: float | None = None
        self.dashboard = dashboard
        self.log = log
        self.cluster: Cluster | None = None
        self.jobs: cr.Jobs | None = None
        self._manager: cr.JobsManager | None = None
        self.stats = ClientStats()
        self.restarts = 0
        self.lock_processes: list[subprocess.Popen[str]] = []
        self.sqlite_busy_seconds = sqlite_busy_seconds or BUSY_TIMEOUT_MS / 1000

    # -- the cluster ------------------------------------------------------------------------

    def start(self) -> None:
        os.environ[RUN_DIR_ENV] = str(self.run_dir)
        head = {
            "num_cpus": 1,
            "include_dashboard": self.dashboard,
            "gcs_server_port": free_port(),
            "_system_config": HEALTH,
        }
        if self.dashboard:  # a port of its own: other clusters of the machine may hold 8265
            head["dashboard_port"] = free_port()
        if self.worker_gpus:
            head["num_gpus"] = 0
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        for _ in range(self.initial_workers):
            self.add_worker()
        self.cluster.wait_for_nodes()
        ray.init(
            address=self.cluster.address,
            namespace=self.namespace,
            logging_level=logging.WARNING,
            runtime_env={
                "worker_process_setup_hook": "tests.chaos.storage_faults.install",
                "env_vars": {
                    RUN_DIR_ENV: str(self.run_dir),
                    BUSY_ENV: str(self.sqlite_busy_seconds),
                },
            },
        )
        self.jobs = cr.Jobs.connect(
            storage=self.storage_url, options=self.options, namespace=self.namespace
        )
        self._manager = None

    def shutdown(self) -> None:
        for process in self.lock_processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        self.lock_processes.clear()
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None

    def restart(self) -> None:
        """The whole cluster goes, and a new one starts on the same storage. Ray's own start-up
        can time out on a busy machine ("the current node timed out during startup"): that is
        not the system under test, so a start that fails is made again, START_TRIES times."""
        self.shutdown()
        self.restarts += 1
        for attempt in range(1, START_TRIES + 1):
            try:
                self.start()
                return
            except Exception as error:
                if attempt == START_TRIES:
                    raise
                self.log(f"starting the cluster again failed ({error}); try {attempt + 1}")
                self.shutdown()

    def add_worker(self, gpus: bool = True) -> Any:
        """A worker node of one CPU, with the run's GPUs unless `gpus` is False."""
        assert self.cluster is not None
        if not (gpus and self.worker_gpus):
            return self.cluster.add_node(num_cpus=1)
        node = self.cluster.add_node(num_cpus=1, num_gpus=self.worker_gpus)
        self.gpu_nodes.add(node.node_id)
        return node

    def gpu_workers(self) -> list[Any]:
        """The worker nodes of the cluster that have GPUs."""
        return [n for n in self.worker_nodes() if n.node_id in self.gpu_nodes]

    def defer(self, seconds: float, what: str, action: Callable[[], str]) -> None:
        self.due.append((time.time() + seconds, what, action))

    def run_due(self, wait: bool = False) -> list[str]:
        """Runs the deferred actions that are due (every one, waiting for it, with `wait`);
        says what each did."""
        done: list[str] = []
        self.due.sort(key=lambda d: d[0])
        while self.due and (wait or self.due[0][0] <= time.time()):
            at, what, action = self.due.pop(0)
            time.sleep(max(0.0, at - time.time()))
            try:
                done.append(f"{what}: {action()}")
            except Exception as error:
                done.append(f"{what} failed: {type(error).__name__}: {error}")
        return done

    def ensure_gpu_node(self, grace: float = 0.0) -> str | None:
        """A GPU worker node added once none has been left for `grace` seconds and no fault
        has an add on its way (`remove_node` took the last one), so that the pool jobs can go
        on; says so, or None."""
        if not self.worker_gpus or self.cluster is None or self.gpu_workers() or self.due:
            self._gpu_less_since = None
            return None
        now = time.monotonic()
        if self._gpu_less_since is None:
            self._gpu_less_since = now
        if now - self._gpu_less_since < grace:
            return None
        self._gpu_less_since = None
        node = self.add_worker()
        return f"no GPU node left: added {node.node_id[:12]} so the pool jobs can go on"

    @property
    def manager(self) -> cr.JobsManager:
        if self._manager is None:
            assert self.jobs is not None
            self._manager = self.call(lambda: self.jobs.manager(self.scope, "chaos"))  # type: ignore[union-attr]
        return self._manager

    def call(self, fn: Callable[[], T], patience: float = CALL_PATIENCE) -> T:
        """`fn()`, retried while Ray says the actor it calls is restarting (the public client
        lets Ray's errors through today), or while storage is unavailable (a partition of
        MongoDB: the caller is told, and asks again, as an operator would); each is counted."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return fn()
            except cr.StorageUnavailableError as error:
                self.stats.count(error)
                if time.monotonic() > deadline:
                    raise
            except cr.ChoreographyError:
                raise  # the project's own error (Ray wraps it in a RayTaskError of its type)
            except ray.exceptions.RayError as error:
                self.stats.count(error)
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    # -- what is alive ----------------------------------------------------------------------

    def actors(self) -> list[dict[str, Any]]:
        """Ray's actor table (from the GCS: no dashboard needed). The run's cluster is its own,
        so every named actor in it is the run's."""
        table = ray._private.state.actors()  # type: ignore[attr-defined]
        return list(table.values())

    def alive(self, prefix: str) -> list[dict[str, Any]]:
        return [
            a
            for a in self.actors()
            if a.get("Name", "").startswith(prefix) and a.get("State") in ("ALIVE", "RESTARTING")
        ]

    def worker_nodes(self) -> list[Any]:
        assert self.cluster is not None
        return list(self.cluster.worker_nodes)


@dataclass
class Injected:
    """What one fault did: whether it was injected, and how (or why not)."""

    injected: bool
    detail: str
    #: When the fault's effect ends, for faults that last (epoch seconds); else None.
    until: float | None = None
    #: The operator action's outcome: "ok", or the error's name.
    answer: str | None = None
    #: The job the fault started (`unplaceable_pool`), its steps and its start's seconds.
    started: str | None = None
    started_steps: int = 0
    start_seconds: float | None = None


def _kill_actor(world: ChaosCluster, name: str) -> Injected:
    try:
        handle = ray.get_actor(name, namespace=world.namespace)
    except ValueError:
        return Injected(False, f"{name} is not alive")
    ray.kill(handle, no_restart=False)
    return Injected(True, f"ray.kill({name}, no_restart=False)")


def _host_for(world: ChaosCluster, job_id: str, pick: float) -> dict[str, Any] | None:
    """A step host running steps of the job, else any alive step host."""
    hosts = sorted(
        (a for a in world.alive("step-host/") if a.get("State") == "ALIVE"),
        key=lambda a: str(a["Name"]),
    )
    if not hosts:
        return None
    busy: list[dict[str, Any]] = []
    for host in hosts:
        try:
            handle = ray.get_actor(host["Name"], namespace=world.namespace)
            if ray.get(handle.running_steps.remote(job_id), timeout=5)[0]:
                busy.append(host)
        except Exception as error:
            # A host that cannot be asked (restarting, or gone) is not a busy one to kill.
            logging.getLogger(__name__).info("host %s not asked: %s", host["Name"], error)
    choice = busy or hosts
    return choice[int(pick * len(choice)) % len(choice)]


def _remove_node(world: ChaosCluster, node: Any) -> str:
    """Removes `node` as a machine that dies; says what it did."""
    assert world.cluster is not None
    # The node's Ray workers outlive its raylet for seconds and go on serving direct actor
    # calls; a machine that dies takes them along, so they are killed with it.
    pids = [
        int(a["Pid"])
        for a in world.actors()
        if a.get("State") == "ALIVE"
        and a.get("Address", {}).get("NodeID") == node.node_id
        and a.get("Pid")
    ]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    world.cluster.remove_node(node, allow_graceful=False)
    return (
        f"removed worker node {node.node_id[:12]}: SIGKILL to its {len(pids)} actor "
        "processes, then its raylet and the rest killed"
    )


def batches_in_flight(step_log: Path, job_id: str) -> list[dict[str, Any]]:
    """The starts of the job's pool steps that have no end yet, from the step log (recent
    ones: a batch of a host killed earlier never ends)."""
    started: dict[str, dict[str, Any]] = {}
    for event in read_trace(step_log):
        if event["event"] == "start" and str(event.get("actor", "")).startswith("pool/"):
            started[event["run"]] = event
        elif event["event"] == "end":
            started.pop(event["run"], None)
    recent = time.time() - IN_FLIGHT_SECONDS
    return [e for e in started.values() if e["job"] == job_id and e["at"] > recent]


def _busy(step_log: Path, job_id: str, key: str, among: Callable[[], set[str]]) -> list[str]:
    """The `key`s (actor names, node ids) among `among()` where a batch of the job is in
    flight, waiting up to BATCH_WAIT_SECONDS for one (the pool may have no host yet)."""
    deadline = time.monotonic() + BATCH_WAIT_SECONDS
    while True:
        busy = sorted({str(e[key]) for e in batches_in_flight(step_log, job_id)} & among())
        if busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.1)


def _pool_hosts(world: ChaosCluster) -> dict[str, dict[str, Any]]:
    return {a["Name"]: a for a in world.alive("pool/") if a.get("State") == "ALIVE"}


def _kill_pool_host(world: ChaosCluster, job_id: str, pick: float, step_log: Path) -> Injected:
    """A pool host killed while a batch of the job runs on it (else any pool host): SIGKILL of
    its process or `ray.kill` with restart, as `pick` says."""
    busy = _busy(step_log, job_id, "actor", lambda: set(_pool_hosts(world)))
    alive = _pool_hosts(world)
    choice = [name for name in busy if name in alive] or sorted(alive)
    if not choice:
        return Injected(False, "no pool host alive")
    name = choice[int(pick * len(choice)) % len(choice)]
    where = "mid-batch of the job" if name in busy else "no batch of the job in flight"
    if int(pick * 1000) % 2:
        return Injected(True, f"{_kill_actor(world, name).detail} ({where})")
    pid = int(alive[name].get("Pid") or 0)
    if pid <= 0:
        return Injected(False, f"no pid for {name}")
    os.kill(pid, signal.SIGKILL)
    return Injected(True, f"SIGKILL to {name} (pid {pid}, {where})")


def _remove_gpu_node(
    world: ChaosCluster, job_id: str, seconds: float, pick: float, step_log: Path
) -> Injected:
    """A GPU worker node removed (one running a batch of the job, else any), and a new one
    added `seconds` later so the pool jobs can finish."""
    if not world.gpu_workers():
        return Injected(False, "no GPU worker node")
    busy = _busy(step_log, job_id, "node", lambda: {n.node_id for n in world.gpu_workers()})
    gpu_nodes = {n.node_id: n for n in world.gpu_workers()}
    choice = [n for n in busy if n in gpu_nodes] or sorted(gpu_nodes)
    if not choice:
        return Injected(False, "no GPU worker node")
    node = gpu_nodes[choice[int(pick * len(choice)) % len(choice)]]
    where = "mid-batch of the job" if node.node_id in busy else "no batch of the job in flight"

    def add() -> str:
        if world.cluster is None:
            return "no cluster"
        return f"added GPU node {world.add_worker().node_id[:12]}"

    # Due `seconds` after the node dies: `Cluster.remove_node` itself may take 10-20 s on a
    # busy machine, waiting for the processes it killed.
    world.defer(seconds, "the GPU node's replacement", add)
    detail = _remove_node(world, node)
    return Injected(
        True,
        f"{detail} ({where}); a GPU node added in {seconds:.1f} s",
        until=time.time() + max(seconds, NODE_DEATH_SECONDS),
    )


#: Steps of an unplaceable job: `10 + pick * UNPLACEABLE_STEPS`.
UNPLACEABLE_STEPS = 50


def _start_unplaceable(world: ChaosCluster, pick: float, step_log: Path) -> Injected:
    """A job whose every step needs a resource no node has, started beside the others; the
    harness stops it once they have settled."""
    count = 10 + int(pick * UNPLACEABLE_STEPS)
    request = ChaosRequest(
        steps=[
            ChaosStepPlan(
                kind="unplaceable",
                stage=0,
                item=ChaosItem(log=str(step_log), n=n, work_ms=50.0),
            )
            for n in range(count)
        ]
    )
    began = time.monotonic()
    started = world.call(lambda: world.manager.start(ChaosJob, request))
    took = round(time.monotonic() - began, 2)
    return Injected(
        True,
        f"started job {started.job_id} of {count} steps of shape {UNPLACEABLE_SHAPE} "
        f"(start answered in {took:.1f} s)",
        started=started.job_id,
        started_steps=count,
        start_seconds=took,
    )


def _lock(world: ChaosCluster, seconds: float) -> Injected:
    process = subprocess.Popen(
        [sys.executable, "-c", LOCK_SCRIPT, world.storage_path, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    world.lock_processes.append(process)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != "locked":
        return Injected(False, f"the lock helper did not get the write lock ({line!r})")
    return Injected(
        True,
        f"a second process holds BEGIN EXCLUSIVE on the SQLite file for {seconds:.1f} s",
        until=time.time() + seconds,
    )


def _outcome_wire(event: dict[str, Any]) -> tuple[str, int, str, str | None]:
    """A step's logged end as the job actor receives it: (step_id, attempt, status, message)."""
    status = {
        "ok": cr.StepStatus.COMPLETED_SUCCESSFULLY,
        "fail": cr.StepStatus.COMPLETED_WITH_FAILURE,
        "raise": cr.StepStatus.FAILED,
        "stopped": cr.StepStatus.STOPPED,
    }[event["result"]]
    message = None
    if event["result"] == "fail":
        message = f"chaos step {event['n']} fails at attempt {event['attempt']}"
    elif event["result"] == "raise":
        message = f"RuntimeError: chaos step {event['n']} raises at attempt {event['attempt']}"
    return (event["step"], int(event["attempt"]), status.value, message)


def _operate(world: ChaosCluster, job_id: str, method: str) -> Injected:
    manager = world.manager
    try:
        answer = world.call(lambda: getattr(manager, method)(job_id))
    except cr.JobOperationError as error:
        return Injected(True, f"{method} raised {error.error!r}", answer=str(error.error))
    return Injected(True, f"{method} answered {answer!r}", answer="ok")


def _stop_final(world: ChaosCluster, job_id: str) -> bool | None:
    """Whether the job's stop is final; None while it is not stored STOPPED (or is gone)."""
    try:
        state = world.call(lambda: world.manager.get(job_id))
    except cr.JobOperationError:
        return None
    return state.stop_finalized if state.status is cr.JobStatus.STOPPED else None


def _stop_host_restart(world: ChaosCluster, job_id: str, pick: float) -> Injected:
    """A step host running the job's steps killed (Ray restarts it) during the job's stop:
    the stop is asked in a thread of its own, and the host dies once the job is stored
    STOPPED or the stop answered, while the stop waits for its steps."""
    host = _host_for(world, job_id, pick)  # before the stop: once it is final, none runs
    if host is None:
        return Injected(False, "no step host alive")
    answers: list[Injected] = []

    def ask() -> None:
        try:
            answers.append(_operate(world, job_id, "stop"))
        except Exception as error:
            answers.append(Injected(False, f"the stop raised {type(error).__name__}: {error}"))

    stop = threading.Thread(target=ask, name="chaos-stop")
    asked = time.monotonic()
    stop.start()
    while stop.is_alive() and time.monotonic() - asked < STOP_STORED_SECONDS:
        if _stop_final(world, job_id) is not None:
            break
        time.sleep(0.01)
    answered = not stop.is_alive()
    killed = _kill_actor(world, host["Name"])
    took = time.monotonic() - asked
    final = _stop_final(world, job_id)
    stop.join()
    answer = answers[0]
    seen = {None: "not stored STOPPED", False: "not final", True: "final"}[final]
    when = "after" if answered else "before"
    return Injected(
        killed.injected,
        f"{killed.detail} {took:.2f} s after the stop was asked ({when} it answered; the stop "
        f"{seen} just after); {answer.detail}",
        answer=answer.answer,
    )


def _stop_refusing_reads(world: ChaosCluster, job_id: str, seconds: float) -> Injected:
    """The job stopped while the wrapper refuses every read of its steps for `seconds`: the
    stop's reads fail, and it must still become final, every step counted once."""
    if world.proxy is not None:
        return Injected(False, "no storage wrapper: the run is on MongoDB")
    storage_faults.set_fault(world.run_dir, "refuse_reads", seconds, job=job_id)
    until = time.time() + seconds
    stop = _operate(world, job_id, "stop")
    return Injected(
        True,
        f"wrapper: reads of the job's steps refused for {seconds:.1f} s; {stop.detail}",
        until=until,
        answer=stop.answer,
    )


def _mongodb_fault(world: ChaosCluster, kind: str, seconds: float, pick: float) -> Injected:
    """A fault of the proxy: lasting ones for `seconds`; one-shot ones on the next one to
    three requests of a write command `pick` chooses (a half-open connection on any request)."""
    proxy = world.proxy
    if proxy is None:
        return Injected(False, "no fault proxy: the run is not on MongoDB")
    until = time.time() + seconds
    if kind == "mongo_latency":
        delay = round(0.02 + 0.2 * pick, 3)
        proxy.slow(delay, seconds)
        return Injected(True, f"{delay * 1000:.0f} ms a request for {seconds:.1f} s", until=until)
    if kind in ("mongo_partition", "mongo_blackhole"):
        refuse = kind == "mongo_partition"
        proxy.partition(seconds, refuse=refuse)
        how = "refused" if refuse else "black-holed"
        return Injected(True, f"every connection {how} for {seconds:.1f} s", until=until)
    times = 1 + int(pick * 3) % 3
    command = None if kind == "mongo_half_open" else MONGODB_WRITES[int(pick * 97) % 4]
    {"mongo_reset": proxy.reset, "mongo_lost_ack": proxy.drop_reply,
     "mongo_half_open": proxy.hang}[kind](command, times)  # fmt: skip
    return Injected(True, f"{kind.removeprefix('mongo_')} on the next {times} "
                          f"{command or 'request'}(s)")  # fmt: skip


def inject(
    world: ChaosCluster,
    kind: str,
    job_id: str,
    *,
    seconds: float,
    pick: float,
    step_log: Path,
) -> Injected:
    """Carries out one fault of `kind` aimed at the job `job_id`. `seconds` is how long a
    lasting fault lasts; `pick` (0..1, from the seed) chooses among candidates."""
    if kind == "kill_host_ray" or kind == "kill_host_sigkill":
        host = _host_for(world, job_id, pick)
        if host is None:
            return Injected(False, "no step host alive")
        if kind == "kill_host_ray":
            return _kill_actor(world, host["Name"])
        pid = int(host.get("Pid") or 0)
        if pid <= 0:
            return Injected(False, f"no pid for {host['Name']}")
        os.kill(pid, signal.SIGKILL)
        return Injected(True, f"SIGKILL to {host['Name']} (pid {pid})")
    if kind == "kill_job_actor":
        return _kill_actor(world, f"job/{job_id}")
    if kind == "kill_manager":
        return _kill_actor(world, f"jobs-manager/{world.scope}/chaos")
    if kind == "kill_recovery":
        return _kill_actor(world, "recovery")
    if kind == "remove_node":
        workers = world.worker_nodes()
        if not workers:
            return Injected(False, "only the head node is left")
        node = workers[int(pick * len(workers)) % len(workers)]
        return Injected(
            True,
            _remove_node(world, node),
            # Ray declares it dead about 2 s later; until then the job may still place steps.
            until=time.time() + NODE_DEATH_SECONDS,
        )
    if kind == "add_node":
        node = world.add_worker(gpus=False)
        return Injected(True, f"added node {node.node_id[:12]}")
    if kind == "kill_pool_host":
        return _kill_pool_host(world, job_id, pick, step_log)
    if kind == "remove_gpu_node":
        return _remove_gpu_node(world, job_id, seconds, pick, step_log)
    if kind == "unplaceable_pool":
        return _start_unplaceable(world, pick, step_log)
    if kind == "restart_cluster":
        world.restart()
        return Injected(True, "shut the whole cluster down and started a new one on the file")
    if kind == "storage_lock":
        return _lock(world, seconds)
    if kind == "storage_lock_refuse":
        return _lock(world, world.sqlite_busy_seconds + seconds)
    if kind in MONGODB_FAULTS:
        return _mongodb_fault(world, kind, seconds, pick)
    if kind in ("storage_refuse", "storage_slow", "storage_lost_ack"):
        mode = kind.removeprefix("storage_")
        storage_faults.set_fault(world.run_dir, mode, seconds, delay=0.3 + pick, p=0.5)
        return Injected(True, f"wrapper: {mode} for {seconds:.1f} s", until=time.time() + seconds)
    if kind == "drop_deliveries":
        told = 0
        errors: list[str] = []
        # A pool's hosts too (a run without pools has none): they deliver outcomes the same way.
        for host in world.alive("step-host/") + world.alive("pool/"):
            try:
                handle = ray.get_actor(host["Name"], namespace=world.namespace)
                ray.get(handle.drop_deliveries.remote([job_id]), timeout=10)
                told += 1
            except Exception as error:
                errors.append(f"{host['Name']}: {type(error).__name__}: {error}")
        if not told:
            return Injected(False, f"no step host answered ({'; '.join(errors) or 'none alive'})")
        return Injected(True, f"{told} step hosts drop every delivery to the job from now on")
    if kind == "duplicate_delivery":
        now = time.time()
        ended = [
            e
            for e in read_trace(step_log)
            if e["event"] == "end" and e["job"] == job_id and e["at"] < now - 1.0
        ]
        if not ended:
            return Injected(False, "no outcome reported yet")
        start = int(pick * len(ended)) % len(ended)
        batch = [_outcome_wire(e) for e in (ended[start:] + ended[:start])[:25]]
        try:
            handle = ray.get_actor(f"job/{job_id}", namespace=world.namespace)
            ray.get(handle.report_outcomes.remote(batch), timeout=30)
        except Exception as error:
            return Injected(False, f"the job actor is not there ({type(error).__name__})")
        return Injected(True, f"delivered {len(batch)} reported outcomes again")
    if kind == "op_stop":
        return _operate(world, job_id, "stop")
    if kind == "stop_host_restart":
        return _stop_host_restart(world, job_id, pick)
    if kind == "stop_storage_read_fail":
        return _stop_refusing_reads(world, job_id, seconds)
    if kind == "op_resume":
        return _operate(world, job_id, "resume")
    if kind == "op_remove":
        return _operate(world, job_id, "remove")
    if kind == "op_retry_failed":
        return _operate(world, job_id, "retry_failed_steps")
    if kind == "op_double_resume":
        answers: list[Injected] = []
        threads = [
            threading.Thread(target=lambda: answers.append(_operate(world, job_id, "resume")))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        oks = sum(1 for a in answers if a.answer == "ok")
        return Injected(
            True,
            "two resumes at once: " + "; ".join(a.detail for a in answers),
            answer="ok" if oks else (answers[0].answer if answers else None),
        )
    raise ValueError(f"unknown fault kind {kind!r}")
