"""Recovery after loss, on real Ray: whole-cluster restarts run in subprocesses, each with its
own local Ray, on one SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest
import ray

import choreography_ray as cr
from tests.runtime.conftest import FAST
from tests.runtime.recovery_jobs import LoggedJob, LoggedRequest

ROOT = Path(__file__).resolve().parents[2]

FIRST_CLUSTER = """
import sys, time, ray
import choreography_ray as cr
from tests.runtime.recovery_jobs import LoggedJob, LoggedRequest
storage, log = sys.argv[1], sys.argv[2]
with cr.Jobs.connect(storage=storage, namespace="recovery-test") as jobs:
    manager = jobs.manager("recovery", "cluster")
    job = manager.start(LoggedJob, LoggedRequest(log=log, steps=24))
    while manager.get(job.job_id).progress.successful_steps < 6:
        time.sleep(0.05)
    print(job.job_id, flush=True)
# leaving the block shuts the whole local cluster down mid-job
"""

SECOND_CLUSTER = """
import sys
import choreography_ray as cr
storage, job_id = sys.argv[1], sys.argv[2]
with cr.Jobs.connect(storage=storage, namespace="recovery-test") as jobs:
    state = jobs.manager("recovery", "cluster").wait(job_id, timeout=120)
    print(state.status, state.progress.successful_steps, flush=True)
"""


def _run(script: str, *args: str) -> str:
    # "local": a Ray of its own. Without an address, `ray.init` joins the cluster of the last
    # `ray start` on this machine (/tmp/ray/ray_current_cluster): another test's, or a dead one.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "local"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(400)
@pytest.mark.slow  # a whole-cluster restart: about 30 s
def test_cluster_restart__durable_catalog_recovers_job_and_succeeded_steps_do_not_rerun(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    log = tmp_path / "runs.log"
    job_id = _run(FIRST_CLUSTER, storage, str(log))
    ran_before = Counter(log.read_text().split())
    status, successful = _run(SECOND_CLUSTER, storage, job_id).split()
    assert status == cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert int(successful) == 24
    runs = Counter(log.read_text().split())
    assert set(runs) == {f"{i:06d}" for i in range(24)}
    # Only the steps interrupted mid-flight may run twice: at most the window (4) of them.
    assert sum(n - 1 for n in runs.values()) <= LoggedJob.max_active_steps
    assert len(ran_before) >= 6


def test_reconciliation__orphaned_running_job_resumes(
    ray_cluster: None, storage_url: str, scope: str, tmp_path: Path
) -> None:
    """A job stored RUNNING whose job actor is gone (a lost acknowledgement) is picked up by the
    recovery actor's reconciliation, without a rehydrate call or a membership change.

    In a Ray namespace of its own, so with a recovery actor of its own: the shared one would
    reconcile every storage of the session's earlier tests each second from here on (its
    interval is the shortest of its storages'), for the rest of the session."""
    namespace = f"reconcile-{uuid.uuid4().hex[:8]}"
    options = cr.JobsOptions(**{**FAST, "reconciliation_interval": 1.0})
    jobs = cr.Jobs.connect(storage=storage_url, options=options, namespace=namespace)
    manager = jobs.manager(scope, "reconcile")
    log = tmp_path / "runs.log"
    job = manager.start(LoggedJob, LoggedRequest(log=str(log), steps=12, sleep=0.2))
    actor = ray.get_actor(f"job/{job.job_id}", namespace=namespace)
    ray.kill(actor, no_restart=True)
    assert manager.get(job.job_id).status is cr.JobStatus.RUNNING
    state = manager.wait(job.job_id, timeout=60)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 12
