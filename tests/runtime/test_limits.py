"""Limits across the cluster on real Ray (docs/pools.md#limits-across-the-cluster): a per-key
limit held over two jobs and three step hosts, and a named limit lowered while a job runs."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray

import choreography_ray as cr
from choreography_ray.runtime.names import LIMITER
from tests.runtime.limit_jobs import NAMED, Calls, CallsRequest
from tests.runtime.test_cli_jobs import cli, explain
from tests.support import RAY_NAMESPACE, eventually, read_trace

#: The per-key limit of `KeyedCall`, as `jobs.limits()` names it.
KEYED = "tests.runtime.limit_jobs:KeyedCall"


def peak(calls: list[dict[str, Any]], since: float = 0.0) -> int:
    """The most calls running at one moment at or after `since` (an end at a start's instant
    does not count)."""
    events = sorted(
        [(max(c["start"], since), 1) for c in calls if c["end"] > since]
        + [(c["end"], -1) for c in calls if c["end"] > since]
    )
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


def test_max_concurrent_per_key__holds_over_two_jobs_and_three_hosts(
    connect, scope, tmp_path: Path
):
    # Batches of 2 steps, each to the next of the node's 3 shared hosts in turn.
    jobs = connect(step_hosts_per_node=3, step_batch_size=2)
    manager = jobs.manager(scope, "limits")
    log = tmp_path / "calls.log"
    request = CallsRequest(count=12, keys=["a", "b"], log=str(log))
    started = [manager.start(Calls, request) for _ in range(2)]

    states = [manager.wait(s.job_id, timeout=120) for s in started]

    assert all(s.status is cr.JobStatus.COMPLETED_SUCCESSFULLY for s in states)
    calls = read_trace(log)
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        by_key[call["key"]].append(call)
    assert {key: len(c) for key, c in by_key.items()} == {"a": 12, "b": 12}
    assert {key: peak(c) for key, c in by_key.items()} == {"a": 2, "b": 2}
    assert len({call["host"] for call in calls}) == 3

    def keyed() -> tuple[cr.Limit, int, int]:
        state = {(s.kind, s.name): s for s in jobs.limits()}[("per-key", KEYED)]
        return state.limit, state.held, state.waiting

    # A host tells the limiter what it holds a moment after that changes: `wait` may answer
    # first.
    eventually(lambda: keyed()[1] == 0, timeout=10, what="the permits given back")
    assert keyed() == (cr.Limit(max_concurrent=2), 0, 0)

    address = str(ray.get_runtime_context().gcs_address)
    listed = cli("limits", "--address", address, "--ray-namespace", RAY_NAMESPACE, "--json")
    assert listed.returncode == 0, explain(listed)
    rows = {(row["kind"], row["name"]): row for row in json.loads(listed.stdout)}
    assert rows[("per-key", KEYED)]["limit"]["max_concurrent"] == 2


def test_set_limit__a_lower_named_limit_holds_within_a_second_while_the_job_runs(
    connect, scope, tmp_path: Path
):
    jobs = connect(limits={NAMED: cr.Limit(max_concurrent=4)})
    manager = jobs.manager(scope, "limits")
    log = tmp_path / "calls.log"
    request = CallsRequest(count=24, keys=["x"], log=str(log), named=True)
    started = manager.start(Calls, request)
    eventually(lambda: len(read_trace(log)) >= 4, timeout=60, what="the first calls ended")

    jobs.set_limit(NAMED, cr.Limit(max_concurrent=1))
    changed = time.time()
    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    calls = read_trace(log)
    assert peak(calls) == 4  # before the change
    # In effect within a second; the calls running then run on (0.2 s each).
    assert peak(calls, since=changed + 1.0 + request.seconds) == 1
    assert sum(1 for call in calls if call["start"] > changed + 1.0) >= 10
    (named,) = [s for s in jobs.limits() if s.name == NAMED]
    assert (named.kind, named.limit, named.live) == ("named", cr.Limit(max_concurrent=1), True)

    # The limiter keeps it over its own restart (its node lost, say).
    ray.kill(ray.get_actor(LIMITER, namespace=RAY_NAMESPACE), no_restart=False)

    def live() -> list[cr.LimitState]:
        try:
            return [s for s in jobs.limits() if s.name == NAMED and s.live]
        except ray.exceptions.RayError:  # restarting
            return []

    restarted = eventually(live, timeout=30, what="the restarted limiter answering")
    assert restarted[0].limit == cr.Limit(max_concurrent=1)
