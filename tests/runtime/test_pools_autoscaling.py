"""The pools under a real autoscaler (`tests/autoscaling.py`: Ray's autoscaler with the fake
multi-node provider, a head without GPU and 0 to 2 GPU worker nodes): a job of GPU steps starts
on a cluster with no GPU, the pools' owner asks for a bundle per wanted host, the autoscaler
adds GPU nodes, the job's batches run on them, and once it is done the request is emptied, the
pool's hosts leave after `pool_idle_timeout` and the autoscaler removes the nodes.

The scenario is a script run as a driver in a subprocess (it cannot share the session Ray of
`conftest.py`), as in `test_autoscaling_kit.py`: it joins the kit's head with the head's
driver environment (token authentication).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import choreography_ray as cr
from tests.autoscaling import autoscaling_cluster
from tests.runtime.test_autoscaling_kit import run_driver
from tests.support import read_trace

SCENARIO = """
import json, signal, sys, time

import ray

import choreography_ray as cr
from tests.autoscaling import alive_gpus, requested_bundles
from tests.runtime.pool_jobs import EmbedJob, EmbedRequest
from tests.support import read_trace

address, storage, log, scope, deadline = sys.argv[1:5] + [int(sys.argv[5])]
STEPS = 200


def on_deadline(*_):
    raise TimeoutError(f"pools autoscaling scenario still running after {deadline} s")


signal.signal(signal.SIGALRM, on_deadline)
signal.alarm(deadline)


def seconds_until(check, what, timeout):
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what} ({alive_gpus()} GPUs alive, "
                                 f"request {requested_bundles()}, actors on GPU nodes "
                                 f"{on_gpu_nodes()})")
        time.sleep(0.2)
    took = round(time.monotonic() - start, 1)
    print(f"{what}: {took} s", file=sys.stderr, flush=True)  # shown should a later wait fail
    return took


def gpu_nodes():
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0)}


def on_gpu_nodes():
    nodes = gpu_nodes()
    return sorted(a["Name"] for a in ray._private.state.actors().values()
                  if a["Address"]["NodeID"] in nodes and a["State"] != "DEAD")


def pool_hosts():
    return sorted(a["Name"] for a in ray._private.state.actors().values()
                  if a["Name"].startswith("pool/") and a["State"] != "DEAD")


began = time.monotonic()
options = cr.JobsOptions(pool_idle_timeout=2, job_watchdog_interval=0.5, spare_job_actors=0)
jobs = cr.Jobs.connect(storage=storage, options=options, address=address,
                       namespace="autoscaling")
try:
    joined = round(time.monotonic() - began, 1)
    manager = jobs.manager(scope, "autoscaling")
    gpus_before = alive_gpus()
    asked = time.monotonic()
    # `start` answers once the job is RUNNING, though no node has a GPU for its pool's hosts.
    job = manager.start(EmbedJob, EmbedRequest(count=STEPS, log=log, step_type="elastic"))
    start_took = round(time.monotonic() - asked, 1)
    started_status = manager.get(job.job_id).status
    gpus_at_start = alive_gpus()

    requested_in = seconds_until(lambda: {"GPU": 1.0} in requested_bundles(),
                                 "the pools' request for GPU bundles", 60)
    requested = requested_bundles()
    seconds_until(lambda: alive_gpus() >= 1, "a GPU node joined", 120)
    first_node = round(time.monotonic() - asked, 1)
    print(f"first GPU node {first_node} s from the start", file=sys.stderr, flush=True)

    # Until the job ends: the GPU nodes that joined, and the largest request seen.
    seen_nodes, most_requested = gpu_nodes(), len(requested)
    while not (state := manager.get(job.job_id)).status.is_terminal:
        if time.monotonic() - asked > 300:
            raise AssertionError(f"the job is still {state.status} after 300 s: "
                                 f"{read_trace(log)[-3:]}")
        seen_nodes |= gpu_nodes()
        most_requested = max(most_requested, len(requested_bundles()))
        time.sleep(0.5)
    done = time.monotonic()
    job_took = round(done - asked, 1)
    print(f"job {state.status} in {job_took} s from the start", file=sys.stderr, flush=True)

    cleared_in = seconds_until(lambda: requested_bundles() == [], "the request emptied", 60)
    seconds_until(lambda: not pool_hosts(), "the pool's hosts left", 60)
    hosts_left_in = round(time.monotonic() - done, 1)
    seconds_until(lambda: alive_gpus() == 0, "the GPU nodes removed", 120)
    removed_after = round(time.monotonic() - done, 1)
finally:
    signal.alarm(0)
    jobs.close()
print(json.dumps({
    "steps": STEPS, "joined": joined, "gpus_before": gpus_before, "start_took": start_took,
    "started_status": started_status, "gpus_at_start": gpus_at_start,
    "requested_in": requested_in, "requested": requested, "most_requested": most_requested,
    "first_node": first_node, "seen_nodes": sorted(seen_nodes), "status": state.status,
    "progress": state.progress.model_dump(), "job_took": job_took, "cleared_in": cleared_in,
    "hosts_left_in": hosts_left_in, "removed_after": removed_after,
}), flush=True)
"""


@pytest.mark.timeout(600)
@pytest.mark.slow  # a head of its own whose autoscaler adds and removes two GPU nodes: ~1.5 min
def test_pools_autoscaling__gpu_nodes_join_for_the_backlog_and_leave_once_it_is_done(
    tmp_path: Path,
) -> None:
    """A head without GPU, 0 to 2 worker nodes of 1 CPU and 1 GPU (idle timeout 6 s); a job of
    200 GPU steps (batches of 8, 0.4 s each)."""
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    log = tmp_path / "batches.jsonl"
    scope = f"autoscaling-{uuid.uuid4().hex[:8]}"
    with autoscaling_cluster(
        max_workers=2, worker={"CPU": 1, "GPU": 1}, idle_timeout_minutes=0.1
    ) as head:
        result: dict[str, Any] = run_driver(
            SCENARIO, head.driver_env, head.address, storage, str(log), scope, timeout=420
        )
    print(
        f"driver joined {result['joined']} s, start answered {result['start_took']} s; "
        f"from the start: GPU bundles asked {result['requested_in']} s, first GPU node "
        f"{result['first_node']} s, job done {result['job_took']} s; from completion: request "
        f"emptied {result['cleared_in']} s, pool hosts gone {result['hosts_left_in']} s, GPU "
        f"nodes removed {result['removed_after']} s; bundles asked at most "
        f"{result['most_requested']}"
    )

    # `start` answered with the job RUNNING while no node had a GPU; its steps were the
    # demand: a bundle per wanted host.
    assert result["gpus_before"] == result["gpus_at_start"] == 0
    assert result["started_status"] == cr.JobStatus.RUNNING
    assert {"GPU": 1.0} in result["requested"]
    assert all(bundle == {"GPU": 1.0} for bundle in result["requested"])
    # The autoscaler added GPU nodes, the batches ran on them, every step counted once.
    assert result["status"] == cr.JobStatus.COMPLETED_SUCCESSFULLY
    progress = result["progress"]
    assert progress["successful_steps"] == progress["total_steps"] == result["steps"]
    assert progress["failed_steps"] == progress["stopped_steps"] == 0
    events = read_trace(log)
    ended = Counter(n for e in events if e["event"] == "end" for n in e["ns"])
    assert set(ended) == set(range(result["steps"]))
    assert {e["node"] for e in events} <= set(result["seen_nodes"])
    assert all(e["actor"].startswith("pool/num_gpus=1/") for e in events)
    # Then the request was emptied, the hosts left and the nodes were removed (the waits in the
    # scenario), each timed above.
