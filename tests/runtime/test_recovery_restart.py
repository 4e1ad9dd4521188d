"""The recovery actor outlives itself (issue 9, item 10), on real Ray: a registered storage is
kept in Ray's internal KV, and a recovery actor that Ray restarts reads it back and runs a pass.

Each test connects in a Ray namespace of its own, so it has a recovery actor of its own (one per
namespace) that knows only this test's storage.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.experimental import internal_kv

import choreography_ray as cr
from choreography_ray.runtime.recovery import KV_NAMESPACE, Registrations
from tests.runtime.recovery_jobs import LoggedJob, LoggedRequest
from tests.support import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ray_namespace(ray_cluster: None) -> str:
    return f"recovery-restart-{uuid.uuid4().hex[:8]}"


def recovery_stats(ray_namespace: str) -> dict[str, Any]:
    actor: Any = ray.get_actor("recovery", namespace=ray_namespace)
    stats: dict[str, Any] = ray.get(actor.stats.remote(), timeout=30)
    return stats


def test_registration__is_kept_in_rays_internal_kv(ray_namespace: str, storage_url: str) -> None:
    options = cr.JobsOptions(reconciliation_interval=0)
    cr.Jobs.connect(storage=storage_url, options=options, namespace=ray_namespace)

    registrations = Registrations(ray_namespace)
    keys = internal_kv._internal_kv_list(registrations.prefix, namespace=KV_NAMESPACE)
    assert keys == [registrations.key(storage_url, options.model_dump_json()).encode()]
    value = internal_kv._internal_kv_get(keys[0], namespace=KV_NAMESPACE)
    assert json.loads(value) == {
        "storage_url": storage_url,
        "options_json": options.model_dump_json(),
    }
    assert registrations.load() == [(storage_url, options.model_dump_json())]


def test_recovery_actor_restarted__reloads_its_storages_and_recovers_an_orphaned_job(
    ray_namespace: str, storage_url: str, scope: str, tmp_path: Path
) -> None:
    """Reconciliation is off and no node dies: only the restarted actor's own pass can bring
    back a job whose actor is gone."""
    options = cr.JobsOptions(reconciliation_interval=0, job_watchdog_interval=0.5)
    jobs = cr.Jobs.connect(storage=storage_url, options=options, namespace=ray_namespace)
    manager = jobs.manager(scope, "restart")
    log = tmp_path / "runs.log"
    job = manager.start(LoggedJob, LoggedRequest(log=str(log), steps=12, sleep=0.2))
    ray.kill(ray.get_actor(f"job/{job.job_id}", namespace=ray_namespace), no_restart=True)
    before = recovery_stats(ray_namespace)
    assert before["storages"] == 1 and before["restored"] == 0

    ray.kill(ray.get_actor("recovery", namespace=ray_namespace), no_restart=False)

    after = eventually(
        lambda: (s := _stats_if_up(ray_namespace)) and s["restored"] and s,
        30,
        "the restarted recovery actor to restore the storage",
    )
    assert after["storages"] == 1 and after["passes"] >= 1
    state = manager.wait(job.job_id, timeout=60)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 12
    assert set(log.read_text().split()) == {f"{i:06d}" for i in range(12)}


def _stats_if_up(ray_namespace: str) -> dict[str, Any] | None:
    try:
        return recovery_stats(ray_namespace)
    except (ray.exceptions.RayActorError, ValueError):  # restarting, or not named yet
        return None
