"""Recovery across nodes, on real multi-node Ray (`ray.cluster_utils.Cluster`).

Each scenario is a script run in a subprocess: it starts its own Cluster (it cannot share the
session Ray of `conftest.py`), prints its results as one JSON line, and always shuts the
Cluster down, also past its own deadline (SIGALRM). Ray's processes share the script's fate,
and the test kills the script's process group should it hang anyway.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import choreography_ray as cr
from tests.runtime.rehydration_jobs import events_dir, read

ROOT = Path(__file__).resolve().parents[2]

NODE_LOSS = """
import asyncio, json, signal, sys, time

import ray
from ray.cluster_utils import Cluster

import choreography_ray as cr
from choreography_ray.storage import open_storage
from tests.runtime.rehydration_jobs import RecordedJob, RecordedRequest, read

storage, log, scope = sys.argv[1], sys.argv[2], sys.argv[3]
lease, deadline = float(sys.argv[4]), int(sys.argv[5])
STEPS = 24


def on_deadline(*_):
    raise TimeoutError(f"node-loss scenario still running after {deadline} s")


signal.signal(signal.SIGALRM, on_deadline)
signal.alarm(deadline)
# Ray declares a silent node dead after 3 missed checks 0.5 s apart, not after about 30 s.
health = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
          "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "include_dashboard": False, "_system_config": health})
try:
    ray.init(address=cluster.address, namespace="node-loss", logging_level="WARNING")
    head = ray.get_runtime_context().get_node_id()
    # One step per start batch: the steps of one refill go to the step hosts in turn.
    options = cr.JobsOptions(step_lease_timeout=lease, job_watchdog_interval=0.5,
                             max_active_steps_per_job=4, step_batch_size=1,
                             reconciliation_interval=0)
    jobs = cr.Jobs.connect(storage=storage, options=options, namespace="node-loss")
    # The job (and the manager and recovery actors) start while the head is the only node,
    # so they live there: Ray may place a new actor that needs no CPU on any node. The worker
    # then joins and gets a step host of its own (one per CPU of each node); the job finds it
    # at its next watchdog tick.
    manager = jobs.manager(scope, "node-loss")
    job = manager.start(RecordedJob, RecordedRequest(log=log, steps=STEPS, sleep=1.5))
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    placed = {a["Name"]: a["Address"]["NodeID"]
              for a in ray._private.state.actors().values() if a["State"] == "ALIVE"}

    def in_flight_on_worker():
        runs = read(log)
        ended = {r["step"] for r in runs if r["event"] == "end" and r["node"] == worker.node_id}
        return [r["step"] for r in runs
                if r["event"] == "start" and r["node"] == worker.node_id
                and r["step"] not in ended]

    records = open_storage(storage, read_only=True)

    def leased(step_ids):
        # The heartbeats of those steps whose RUNNING write, with its lease, is stored.
        stored = asyncio.run(records.get_steps(job.job_id, step_ids))
        return {s: r.lease.heartbeat.timestamp() for s, r in stored.items()
                if r.status is cr.StepStatus.RUNNING and r.lease is not None}

    # A host runs a first attempt while its RUNNING write waits for its round; a node removed
    # before that write is stored leaves no lease, and the job starts the step again at once.
    # With leases on, the node goes once a step of it holds a stored lease.
    lost, heartbeats = [], {}
    while not lost:
        if manager.get(job.job_id).status is not cr.JobStatus.RUNNING:
            raise AssertionError(f"no step ran on the worker: {read(log)}")
        time.sleep(0.05)
        lost = in_flight_on_worker()
        if lease and lost:
            heartbeats = leased(lost)
            lost = sorted(heartbeats)
    removed_at = time.time()
    cluster.remove_node(worker)
    state = manager.wait(job.job_id, timeout=120)
    # The recovery actor saw the node die and ran a pass (harmless for a job running live).
    recovery = ray.get_actor("recovery", namespace="node-loss")
    stats = {}
    for _ in range(100):
        stats = ray.get(recovery.stats.remote())
        if stats["passes"]:
            break
        time.sleep(0.1)
    print(json.dumps({
        "status": state.status, "progress": state.progress.model_dump(), "head": head,
        "worker": worker.node_id, "lost": lost, "removed_at": removed_at,
        "finished_at": time.time(), "steps": STEPS, "placed": placed,
        "job": job.job_id, "heartbeats": heartbeats, "passes": stats["passes"], "recovery": stats,
    }), flush=True)
finally:
    signal.alarm(0)
    ray.shutdown()
    cluster.shutdown()
"""


def run_scenario(script: str, *args: str, timeout: int) -> dict[str, Any]:
    """Runs the script in a process group of its own; the last line of its output is JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""}
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args, str(timeout)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"scenario hung past its deadline:\n{err[-3000:]}")
    assert process.returncode == 0, err[-5000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


LEASE = 2.0
#: Seconds by which the job's clock and the test's may disagree (one machine: rounding only).
CLOCK_SLACK = 0.05


@pytest.mark.timeout(300)
@pytest.mark.slow  # a cluster of its own that loses a node: about 25 s each
@pytest.mark.parametrize("lease", [LEASE, 0.0], ids=["leases-on", "leases-off"])
def test_node_removed_mid_job__its_steps_restart_on_the_survivor_and_count_once(
    tmp_path: Path, lease: float
) -> None:
    """Leases on: the lost steps restart once the owner node is gone and the lease expired.
    Leases off: the job learns of the dead step host from Ray's error and restarts them."""
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    log = tmp_path / "steps.jsonl"
    scope = f"cluster-{uuid.uuid4().hex[:8]}"
    try:
        result = run_scenario(NODE_LOSS, storage, str(log), scope, str(lease), timeout=180)
    finally:
        for path in events_dir().glob(f"{scope}*"):
            path.unlink(missing_ok=True)

    steps, head, worker = result["steps"], result["head"], result["worker"]
    # The scenario's premise: the job's own actor and the recovery actor live on the head;
    # only steps are lost.
    assert result["placed"].get(f"job/{result['job']}") == head, result["placed"]
    assert result["placed"].get("recovery") == head, result["placed"]
    assert result["status"] == cr.JobStatus.COMPLETED_SUCCESSFULLY
    progress = result["progress"]
    # Every step counted exactly once: no step lost, none counted twice.
    assert progress["successful_steps"] == progress["total_steps"] == steps
    assert progress["failed_steps"] == progress["stopped_steps"] == 0

    runs = read(log)
    starts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        (starts if r["event"] == "start" else ends)[r["step"]].append(r)
    assert set(ends) == {f"{i:06d}" for i in range(steps)}
    assert {r["node"] for r in runs} == {head, worker}  # both nodes ran steps
    # The steps in flight on the removed node never ended there; each ran again on the
    # surviving node, after the removal.
    cut_short = {
        step_id
        for step_id, started in starts.items()
        if any(r["node"] == worker for r in started)
        and not any(r["node"] == worker for r in ends[step_id])
    }
    assert set(result["lost"]) <= cut_short
    assert cut_short
    for step_id in cut_short:
        again = [
            r["at"] for r in starts[step_id] if r["node"] == head and r["at"] > result["removed_at"]
        ]
        assert again, step_id
        assert [r for r in ends[step_id] if r["node"] == head], step_id
        if lease and step_id in result["heartbeats"]:
            # Not before its stored lease expired (a renewal only moves the heartbeat later).
            heartbeat = result["heartbeats"][step_id]
            assert min(again) - heartbeat >= lease - CLOCK_SLACK, (step_id, heartbeat, again)
    # Only steps that ran on the removed node ran twice: the surviving node's steps were
    # never started again (not by the job, nor by the recovery pass for the dead node).
    on_worker_at_all = {
        s for s, started in starts.items() if any(r["node"] == worker for r in started)
    }
    twice = {s for s, started in starts.items() if len(started) > 1}
    assert twice <= on_worker_at_all, twice - on_worker_at_all
    # Ray reported the node dead, and the recovery actor ran a pass for it.
    assert result["passes"] >= 1, result["recovery"]
    assert worker in result["recovery"]["node_deaths"], result["recovery"]
