"""Elastic pools on real multi-node Ray (`ray.cluster_utils.Cluster`): a pool no node fits makes
no host and its steps wait in their job (the demand an autoscaler is asked for), it grows onto
GPU nodes that join, each taking part of the backlog, and loses the hosts of a node removed
mid-job, whose steps run again elsewhere and count once.

The scenario is a script run in a subprocess with its own Cluster (it cannot share the session
Ray of `conftest.py`), as in `test_recovery_cluster.py`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

import choreography_ray as cr
from tests.runtime.test_recovery_cluster import run_scenario
from tests.support import read_trace

ELASTIC = """
import json, signal, sys, time

import ray
from ray.cluster_utils import Cluster

import choreography_ray as cr
from tests.runtime.pool_jobs import EmbedJob, EmbedRequest
from tests.support import read_trace

storage, log, scope, deadline = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
STEPS = 480
SHAPE = "num_gpus=1"


def on_deadline(*_):
    raise TimeoutError(f"elastic pool scenario still running after {deadline} s")


signal.signal(signal.SIGALRM, on_deadline)
signal.alarm(deadline)
health = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
          "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
# The head has no GPU: the job, its manager and the recovery actor live there, and the pool
# has no node to place a host on until a GPU node joins.
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "_system_config": health})


def wait_until(check, what, timeout=60):
    end = time.time() + timeout
    while not check():
        if time.time() > end:
            raise AssertionError(f"timed out waiting for {what}: {read_trace(log)[-5:]}")
        time.sleep(0.05)


def pool_actors():
    return {a["Name"]: (a["State"], a["Address"]["NodeID"])
            for a in ray._private.state.actors().values()
            if a["Name"].startswith("pool/") and a["State"] != "DEAD"}


def ran_on(node):
    return any(e["event"] == "end" and e["node"] == node for e in read_trace(log))


try:
    ray.init(address=cluster.address, namespace="elastic", logging_level="WARNING")
    # The job keeps the steps its pool's hosts have no room for, so hosts that join take
    # part of the backlog.
    options = cr.JobsOptions(job_watchdog_interval=0.5, step_batch_size=8,
                             pool_idle_timeout=2, reconciliation_interval=0)
    jobs = cr.Jobs.connect(storage=storage, options=options, namespace="elastic")
    manager = jobs.manager(scope, "elastic")
    # `start` answers once the job is RUNNING, though no node can hold a host of its pool.
    job = manager.start(EmbedJob, EmbedRequest(count=STEPS, log=log, step_type="elastic"))
    started_status = manager.get(job.job_id).status
    wait_until(lambda: any(p.waiting == STEPS for p in jobs.pools()), "the pool's demand shown")
    time.sleep(1.0)
    pending = pool_actors()
    shown = [p.model_dump() for p in jobs.pools()]
    (listed,) = manager.list()
    progress_before = listed.progress.successful_steps

    first = cluster.add_node(num_cpus=1, num_gpus=2)
    wait_until(lambda: ran_on(first.node_id), "a batch on the first GPU node")
    second = cluster.add_node(num_cpus=1, num_gpus=2)
    joined_at = time.time()
    wait_until(lambda: ran_on(second.node_id), "a batch on the second GPU node")
    grew_in = time.time() - joined_at
    # Remove the first node while batches run on it.
    wait_until(lambda: any(e["event"] == "start" and e["node"] == first.node_id
                           for e in read_trace(log)[-4:]), "a batch running on the first node")
    removed_at = time.time()
    cluster.remove_node(first)
    state = manager.wait(job.job_id, timeout=120)
    print(json.dumps({
        "status": state.status, "progress": state.progress.model_dump(), "steps": STEPS,
        "pending": pending, "progress_before": progress_before, "shown": shown,
        "started_status": started_status,
        "first": first.node_id, "second": second.node_id, "removed_at": removed_at,
        "grew_in": grew_in, "pools": pool_actors(),
    }), flush=True)
finally:
    signal.alarm(0)
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.timeout(300)
@pytest.mark.slow  # a cluster of its own: nodes join and one leaves, about 40 s
def test_elastic_pool__waits_for_gpus_grows_onto_joining_nodes_and_survives_a_removal(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    log = tmp_path / "batches.jsonl"
    scope = f"elastic-{uuid.uuid4().hex[:8]}"

    result = run_scenario(ELASTIC, storage, str(log), scope, timeout=200)

    # No node had a GPU: the job ran (start answered), its steps waited in it as the pool's
    # demand, no host was made that Ray could not place, and no step ran.
    assert result["started_status"] == cr.JobStatus.RUNNING
    assert result["pending"] == {}
    assert [(p["hosts"], p["waiting"]) for p in result["shown"]] == [(0, result["steps"])]
    assert result["progress_before"] == 0
    # Then every step counted exactly once.
    assert result["status"] == cr.JobStatus.COMPLETED_SUCCESSFULLY
    progress = result["progress"]
    assert progress["successful_steps"] == progress["total_steps"] == result["steps"]
    assert progress["failed_steps"] == progress["stopped_steps"] == 0
    events = read_trace(log)
    first, second = result["first"], result["second"]
    ended = Counter(n for e in events if e["event"] == "end" for n in e["ns"])
    assert set(ended) == set(range(result["steps"]))
    # The pool grew onto both GPU nodes as they joined, two hosts each.
    hosts = {e["actor"] for e in events if e["node"] == second}
    assert hosts <= {f"pool/num_gpus=1/{second}/0", f"pool/num_gpus=1/{second}/1"}
    assert {e["node"] for e in events} == {first, second}
    # The node that joined second took part of the backlog the job held.
    assert sum(len(e["ns"]) for e in events if e["event"] == "end" and e["node"] == second) > 48
    # The batches cut short by the removal ran again on the node that stayed.
    cut_short = {
        n
        for e in events
        if e["event"] == "start" and e["node"] == first
        for n in e["ns"]
        if not any(x["event"] == "end" and x["node"] == first and n in x["ns"] for x in events)
    }
    assert cut_short
    for n in cut_short:
        assert any(
            e["event"] == "end"
            and e["node"] == second
            and n in e["ns"]
            and e["at"] > result["removed_at"]
            for e in events
        )
    # Only the hosts of the node that stayed are left.
    assert all(node == second for _, node in result["pools"].values())
