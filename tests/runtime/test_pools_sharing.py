"""One cluster, many jobs (issue 34, docs/pools.md "Sharing the cluster"): a pool Ray cannot
place holds up no other job; pools are sized by what Ray can place, across shapes and beside
other actors. The session's cluster declares 2 GPUs and no `widget`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import choreography_ray as cr
from tests.autoscaling import requested_bundles
from tests.runtime.pool_jobs import EmbedJob, EmbedRequest
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.support import RAY_NAMESPACE, eventually, read_trace

#: Generous bounds for what takes a second or two alone: a job held up by another takes for
#: ever (the defect this file pins took over 90 s).
PROMPTLY = 45


@pytest.fixture
def free_gpus(ray_cluster: None) -> Iterator[None]:
    """Both GPUs free: the pool hosts earlier tests left are gone (ended again while an
    earlier job's last demand, current for a few seconds, has the owner make them again)."""

    def free() -> bool:
        _end_pool_hosts()
        return ray.available_resources().get("GPU", 0) == 2

    eventually(free, timeout=30, what="both GPUs free", every=1.0)
    yield


def _end_pool_hosts() -> None:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == RAY_NAMESPACE and actor["name"].startswith("pool/"):
            try:
                ray.kill(ray.get_actor(actor["name"], namespace=RAY_NAMESPACE), no_restart=True)
            except ValueError:
                continue


def _pool_hosts(shape: str | None = None) -> list[str]:
    """The pool hosts of the namespace (placed or not), of one shape when given."""
    prefix = "pool/" if shape is None else f"pool/{shape}/"
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"].startswith(prefix)
    ]


def test_a_pool_ray_cannot_place_holds_up_no_other_job(connect, scope, tmp_path: Path):
    jobs = connect()
    gpu_manager = jobs.manager(scope, "gpu-tenant")
    request = EmbedRequest(count=50, log=str(tmp_path / "never.log"), step_type="unplaceable")

    # start answers once the job is RUNNING, though no host of its pool can be placed.
    started = gpu_manager.start(EmbedJob, request)
    assert started.error is None
    assert gpu_manager.get(started.job_id).status is cr.JobStatus.RUNNING
    shape = "num_gpus=1,widget=1"
    waiting = eventually(
        lambda: next((p for p in jobs.pools() if p.shape == shape and p.waiting), None),
        what="the pool's demand shown",
    )
    assert (waiting.hosts, waiting.waiting) == (0, 50)
    # The autoscaler is asked for a bundle per host the backlog wants (50 steps, 32 a host),
    # beside what pools of earlier tests on this cluster may still ask for.
    bundle = {"GPU": 1.0, "widget": 1.0}
    assert eventually(widget_bundles, what="the pools' request") == [bundle, bundle]

    # A two-stage plain job of another tenant runs as it would alone.
    plain = jobs.manager(scope, "plain-tenant")
    other = plain.start(FanOut, FanOutRequest(count=20, stages=2))
    state = plain.wait(other.job_id, timeout=PROMPTLY)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY

    # A rehydration reaches the waiting job and returns.
    rehydrated = threading.Thread(target=gpu_manager.rehydrate, daemon=True)
    rehydrated.start()
    rehydrated.join(PROMPTLY)
    assert not rehydrated.is_alive(), "rehydrate() did not return"

    # The stop returns, and counts every waiting step stopped; the remove of another returns.
    began = time.monotonic()
    gpu_manager.stop(started.job_id)
    stopped = gpu_manager.wait(started.job_id, timeout=PROMPTLY)
    assert time.monotonic() - began < PROMPTLY
    assert stopped.status is cr.JobStatus.STOPPED
    assert stopped.progress.stopped_steps == 50
    removed = gpu_manager.start(EmbedJob, request)
    gpu_manager.remove(removed.job_id)
    eventually(
        lambda: removed.job_id not in {j.id for j in gpu_manager.list()},
        timeout=PROMPTLY,
        what="the removed job gone",
    )
    assert _pool_hosts(shape) == []  # never a host that cannot be placed
    # No job holds a step of the pool any more: its bundles leave the request.
    eventually(lambda: widget_bundles() == [], timeout=PROMPTLY, what="the request emptied")


def widget_bundles() -> list[dict[str, float]]:
    """The bundles of the autoscaler's request that ask for a `widget` (the unplaceable pool)."""
    return [b for b in requested_bundles() if "widget" in b]


@pytest.mark.slow  # waits for both GPUs free, then a host (17 s)
def test_a_gpu_held_by_another_actor_leaves_one_host_that_runs_every_step(
    connect, scope, free_gpus: None, tmp_path: Path
):
    @ray.remote(num_gpus=1)
    class HoldsAGpu:
        def ping(self) -> None:
            pass

    holder = HoldsAGpu.remote()  # type: ignore[attr-defined]
    try:
        ray.get(holder.ping.remote(), timeout=30)
        manager = connect().manager(scope, "held")
        log = tmp_path / "batches.log"
        started = manager.start(EmbedJob, EmbedRequest(count=200, log=str(log)))

        state = manager.wait(started.job_id, timeout=120)

        assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        assert state.progress.successful_steps == 200
        batches = [event for event in read_trace(log) if event["event"] == "batch"]
        assert sorted(n for b in batches for n in b["ns"]) == list(range(200))
        assert len({b["actor"] for b in batches}) == 1  # the one host Ray could place
        assert len(_pool_hosts()) == 1
    finally:
        ray.kill(holder)


@pytest.mark.slow  # waits for both GPUs free (10 s)
def test_two_shapes_over_the_same_gpus_never_make_more_hosts_than_gpus(
    connect, scope, free_gpus: None, tmp_path: Path
):
    jobs = connect(pool_idle_timeout=2)
    manager = jobs.manager(scope, "shapes")
    first = manager.start(EmbedJob, EmbedRequest(count=120, log=str(tmp_path / "a.log")))
    second = manager.start(
        EmbedJob, EmbedRequest(count=120, log=str(tmp_path / "b.log"), step_type="second-shape")
    )
    most = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        most = max(most, len(_pool_hosts()))
        states = [manager.get(first.job_id), manager.get(second.job_id)]
        if all(state.status.is_terminal for state in states):
            break
        time.sleep(0.2)
    assert [s.status for s in states] == [cr.JobStatus.COMPLETED_SUCCESSFULLY] * 2
    assert 1 <= most <= 2
