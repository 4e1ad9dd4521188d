"""Pools of step hosts per resource shape (docs/pools.md) on real Ray: the session's cluster
declares 2 GPUs, so a `num_gpus=1` shape gets two hosts on its one node."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.dashboard.actions import RayActions
from tests.runtime.conftest import actor_is_gone
from tests.runtime.pool_jobs import EmbedJob, EmbedRequest
from tests.runtime.test_cli_jobs import cli
from tests.runtime.test_pools_sharing import free_gpus  # noqa: F401 (a fixture)
from tests.support import RAY_NAMESPACE, eventually, read_trace

SHAPE = "num_gpus=1"


@pytest.mark.usefixtures("free_gpus")  # both hosts placed: no earlier test's host holds a GPU
def test_pool__batches_on_gpu_shaped_hosts_each_set_up_once(connect, scope, tmp_path: Path):
    """Both hosts are placed first (a job holds a batch on each until it is stopped): a job of
    200 quick steps can end before a second host Ray places in a second or so takes part
    (one fresh-clone CI run had one host run all 25 batches)."""
    manager = connect().manager(scope, "pools")
    held = tmp_path / "held.log"
    holding = manager.start(EmbedJob, EmbedRequest(count=16, log=str(held), wait_for_stop=True))
    eventually(lambda: len(read_trace(held)) >= 2, timeout=60, what="a batch on each host")
    manager.stop(holding.job_id)
    assert manager.wait(holding.job_id, timeout=60).status is cr.JobStatus.STOPPED
    log = tmp_path / "batches.log"
    started = manager.start(EmbedJob, EmbedRequest(count=200, log=str(log)))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 200
    batches = [event for event in read_trace(log) if event["event"] == "batch"]
    assert sorted(n for batch in batches for n in batch["ns"]) == list(range(200))
    assert max(len(batch["ns"]) for batch in batches) == 8  # batches fill up to batch_size
    node = ray.get_runtime_context().get_node_id()
    by_host = defaultdict(list)
    for batch in batches:
        by_host[(batch["actor"], batch["pid"])].append(batch)
    # The hosts of the node took a share each, each reserving a GPU of its own.
    assert {actor for actor, _ in by_host} == {f"pool/{SHAPE}/{node}/0", f"pool/{SHAPE}/{node}/1"}
    gpus = {tuple(batch["gpus"]) for batch in batches}
    assert len(gpus) == 2 and all(len(ids) == 1 for ids in gpus)
    # One instance per host, set up once before its first batch.
    assert all(batch["setups"] == 1 for batch in batches)


@pytest.mark.slow  # a pool's two hosts and 64 steps: about 8 s
def test_pool__a_failed_setup_fails_its_batch_and_is_tried_again(connect, scope, tmp_path: Path):
    manager = connect().manager(scope, "pools")
    log = tmp_path / "batches.log"
    request = EmbedRequest(count=64, log=str(log), step_type="failing-setup")
    started = manager.start(EmbedJob, request)

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    progress = state.progress
    batches = [event for event in read_trace(log) if event["event"] == "batch"]
    performed = sum(len(batch["ns"]) for batch in batches)
    # Each host's first batch failed with its set-up; the next batches set up again and ran.
    assert 1 <= progress.failed_steps <= 16
    assert (progress.successful_steps, performed) == (64 - progress.failed_steps,) * 2
    assert all(batch["setups"] == 2 for batch in batches)
    failed = manager.steps(started.job_id)
    assert len(failed) == progress.failed_steps
    message = failed[0].status_changes[-1].exception_messages[0]
    assert message.startswith("SetupError: FailingSetupEmbedStep.setup failed: OSError: the model")


def test_pool__shown_busy_and_queued_then_a_stop_reaches_every_batch(
    connect, scope, storage_url, tmp_path
):
    jobs = connect()
    manager = jobs.manager(scope, "pools")
    log = tmp_path / "batches.log"
    started = manager.start(EmbedJob, EmbedRequest(count=40, log=str(log), wait_for_stop=True))
    # One batch of 8 runs on each host (concurrency 1); the other steps wait in the hosts.
    eventually(lambda: len(read_trace(log)) >= 2, timeout=60, what="a batch on each host")
    node = ray.get_runtime_context().get_node_id()
    shown = cr.PoolState(shape=SHAPE, hosts=2, busy=16, queued=24, nodes=(node,))
    # What the jobs hold back for the pool (none of this job's 40 steps) is the pools' owner's
    # word, where a job of an earlier test may still count for a few seconds.
    shown_now = [pool.model_copy(update={"waiting": 0, "wanted": 0}) for pool in jobs.pools()]
    assert shown_now == [shown]
    # The dashboard's job page asks the job's actor (its own process is in the cluster here).
    actions = RayActions(storage_url, ray_namespace=RAY_NAMESPACE)
    on_page = asyncio.run(actions.job_pools(started.job_id))
    assert [p.model_copy(update={"waiting": 0, "wanted": 0}) for p in on_page] == [shown]
    address = ["--address", str(ray.get_runtime_context().gcs_address)]
    listed = cli("pools", *address, "--ray-namespace", RAY_NAMESPACE, "--json")
    printed = [cr.PoolState(**pool) for pool in json.loads(listed.stdout)]
    assert [p.model_copy(update={"waiting": 0, "wanted": 0}) for p in printed] == [shown], (
        listed.stderr
    )
    show = ["jobs", "show", started.job_id, "--storage", storage_url, *address]
    table = cli(*show, "--ray-namespace", RAY_NAMESPACE).stdout
    assert "Pools" in table and SHAPE in table and " 16 " in table and " 24 " in table, table

    manager.stop(started.job_id)
    state = manager.wait(started.job_id, timeout=60)

    assert state.status is cr.JobStatus.STOPPED
    assert state.progress.stopped_steps == 40
    assert state.progress.successful_steps + state.progress.failed_steps == 0


@pytest.mark.slow  # hosts failing 6 batches each and started again: about 20 s
def test_pool__a_host_whose_batches_keep_failing_is_set_up_again_then_replaced(
    connect, scope, tmp_path: Path
):
    manager = connect().manager(scope, "pools")
    log = tmp_path / "batches.log"
    started = manager.start(EmbedJob, EmbedRequest(count=24, log=str(log), step_type="broken"))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert (state.progress.failed_steps, state.progress.successful_steps) == (24, 0)
    steps = manager.steps(started.job_id)
    assert len(steps) == len({step.step_id for step in steps}) == 24  # each counted once
    message = steps[0].status_changes[-1].exception_messages[0]
    assert message == "RuntimeError: CUDA error: an illegal memory access was encountered"
    batches = [event for event in read_trace(log) if event["event"] == "batch"]
    pids, instances = defaultdict(set), defaultdict(set)
    for batch in batches:
        pids[batch["actor"]].add(batch["pid"])
        instances[batch["pid"]].add(batch["instance"])
    # A host's process set a new instance up after 3 failures, and was replaced after 6: its
    # actor ran in a new process (the old one's queued steps started again).
    assert any(len(seen) >= 2 for seen in pids.values()), dict(pids)
    assert any(len(seen) == 2 for seen in instances.values()), dict(instances)
    assert all(len(seen) <= 2 for seen in instances.values()), dict(instances)


def test_leave_if_idle__a_host_holding_a_step_stays_and_one_holding_nothing_leaves(
    connect, scope, tmp_path: Path
):
    manager = connect().manager(scope, "pools")
    log = tmp_path / "batches.log"
    # One batch of 8 on each host, waiting for the stop.
    started = manager.start(EmbedJob, EmbedRequest(count=16, log=str(log), wait_for_stop=True))
    eventually(lambda: len(read_trace(log)) >= 2, timeout=60, what="a batch on each host")
    node = ray.get_runtime_context().get_node_id()
    name = f"pool/{SHAPE}/{node}/0"
    host: Any = ray.get_actor(name, namespace=RAY_NAMESPACE)

    assert ray.get(host.leave_if_idle.remote(), timeout=10) is False
    described = ray.get(host.describe.remote(), timeout=10)
    assert (described["idle"], described["leaving"], described["running"]) == (False, False, 8)

    manager.stop(started.job_id)
    assert manager.wait(started.job_id, timeout=60).status is cr.JobStatus.STOPPED
    eventually(
        lambda: ray.get(host.describe.remote(), timeout=10)["idle"],
        timeout=30,
        what="the host holding nothing of the stopped job",
    )

    assert ray.get(host.leave_if_idle.remote(), timeout=10) is True
    eventually(lambda: actor_is_gone(name), timeout=30, what="the host gone for good")
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(host.describe.remote(), timeout=10)


@pytest.mark.slow  # 96 steps of 0.2 s, 3 at a time: about 20 s
@pytest.mark.usefixtures("free_gpus")  # both hosts placed: no earlier test's host holds a GPU
def test_max_concurrent__holds_over_the_hosts_of_the_cluster(connect, scope, tmp_path: Path):
    """The peak over the cluster is the limit, and both hosts ran steps. Both hosts are placed
    first (a job holds a batch on each until it is stopped), so which host runs what is the
    limiter's and the dispatch's doing, not how late an earlier test's leftovers let the second
    host come (in slow-tier CI one host once ran all 96 steps)."""
    jobs = connect()
    manager = jobs.manager(scope, "limits")
    held = tmp_path / "held.log"
    holding = manager.start(EmbedJob, EmbedRequest(count=16, log=str(held), wait_for_stop=True))
    eventually(lambda: len(read_trace(held)) >= 2, timeout=60, what="a batch on each host")
    manager.stop(holding.job_id)
    assert manager.wait(holding.job_id, timeout=60).status is cr.JobStatus.STOPPED
    log = tmp_path / "calls.log"
    started = manager.start(EmbedJob, EmbedRequest(count=96, log=str(log), step_type="called"))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    calls = read_trace(log)
    assert sorted(call["n"] for call in calls) == list(range(96))
    assert max_overlap(calls) == 3
    per_host = Counter(call["pid"] for call in calls)
    assert len(per_host) == 2, (per_host, jobs.pools())


@pytest.mark.slow  # 30 starts at 10 a second: about 12 s
def test_max_per_second__spreads_the_starts_over_the_cluster(connect, scope, tmp_path: Path):
    manager = connect().manager(scope, "limits")
    log = tmp_path / "calls.log"
    started = manager.start(EmbedJob, EmbedRequest(count=30, log=str(log), step_type="rated"))

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    starts = sorted(call["start"] for call in read_trace(log))
    assert len(starts) == 30
    # A bucket of one second's starts (10), filled at 10 a second from empty: at most 20 in any
    # second, and the 30 starts take at least 2 s.
    assert max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts) <= 20
    assert starts[-1] - starts[0] >= 1.9


def max_overlap(calls: list[dict[str, float]]) -> int:
    """The most calls running at the same moment (an end at a start's instant does not count)."""
    events = sorted([(c["start"], 1) for c in calls] + [(c["end"], -1) for c in calls])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


@pytest.mark.slow  # stage 0's hosts leaving, and new ones: about 15 s
def test_pool__idle_hosts_leave_and_the_next_stage_brings_new_ones(connect, scope, tmp_path):
    # A shape of its own: hosts of a shape earlier tests used may be made again for their
    # jobs' last demand, with the 60 s idle timeout (stage 0 would run on them and they would
    # not leave). Theirs hold the GPUs at most until this shape reclaims them.
    manager = connect(pool_idle_timeout=1.0).manager(scope, "pools")
    log = tmp_path / "batches.log"
    request = EmbedRequest(count=16, log=str(log), paused=True, step_type="own-shape")
    started = manager.start(EmbedJob, request)

    state = manager.wait(started.job_id, timeout=120)

    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 33
    batches = [event for event in read_trace(log) if event["event"] == "batch"]
    first = {b["pid"] for b in batches if b["ns"][0] < 1000}
    last = {b["pid"] for b in batches if b["ns"][0] >= 2000}
    # The hosts of stage 0 left while stage 1 waited for them to end; stage 2 ran on new ones.
    assert first and last and not first & last
    eventually(
        lambda: not [name for name in pool_actors() if "memory=2000000" in name],
        timeout=30,
        what="the pool's hosts leaving",
    )


def pool_actors() -> list[str]:
    named = ray.util.list_named_actors(all_namespaces=True)
    return [actor["name"] for actor in named if actor["name"].startswith("pool/")]
