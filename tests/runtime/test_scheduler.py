"""The scheduler on real Ray: the actor `scheduler/{scope}`, its loops on short intervals, real
jobs through the jobs managers, the CLI's acting commands, and a whole-cluster restart on the
same SQLite file (in subprocesses, each with its own local Ray, as test_recovery.py does)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from tests.runtime.checkpoint_jobs import CheckpointRequest, TwoStages
from tests.runtime.decide_jobs import DecideRequest, DecidesThenFails
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.runtime.test_recovery import _run as run_script
from tests.support import RAY_NAMESPACE, eventually

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)

#: Loops on short intervals; the spec example's retry delay (2 s).
FAST_SCHEDULER = cr.SchedulerOptions(
    manifest_cycle=0.5, dispatch_interval=0.25, default_retry_delay=2, lock_ttl=3
)
FAILS = FanOutRequest(count=1, fail_every=1)
SUCCEEDS = FanOutRequest(count=1)


@pytest.fixture
def sched(connect, scope: str) -> Iterator[cr.Scheduler]:  # type: ignore[no-untyped-def]
    jobs = connect(scheduler=FAST_SCHEDULER)
    yield jobs.scheduler(scope)
    # Detached: it would poll this test's storage for the rest of the session.
    ray.kill(ray.get_actor(f"scheduler/{scope}", namespace=RAY_NAMESPACE), no_restart=True)


def test_spec_example__an_always_failing_manifest_runs_three_times_then_is_dead_lettered(
    sched: cr.Scheduler,
) -> None:
    """max_retries=2, retry delay 2 s, the default multiplier: three runs about 2 s and 4 s
    apart (plus the job's own time, one cycle and one dispatch interval), then a dead letter
    on the next cycle and no fourth run."""
    sched.schedule("always-fails", FanOut, FAILS, every=timedelta(minutes=10), max_retries=2)
    (letter,) = eventually(lambda: sched.dead_letters("always-fails"), 60, "the dead letter")
    runs = sorted(sched.runs("always-fails"), key=lambda r: r.queued_at)
    assert [r.status for r in runs] == [cr.RunStatus.FAILED] * 3
    starts = [r.started_at for r in runs]
    assert all(starts)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]  # type: ignore[operator]
    assert 2 <= gaps[0] <= 2 + 5 and 4 <= gaps[1] <= 4 + 5, gaps
    assert letter.retry_count_at_dead_letter == 3 and letter.run_id == runs[-1].id
    ended = runs[-1].ended_at
    assert ended is not None and (letter.dead_lettered_at - ended).total_seconds() <= 1.5
    eventually(lambda: sched.stats()["cycles"] > 0, 5, "a cycle")
    cycles = sched.stats()["cycles"]
    eventually(lambda: sched.stats()["cycles"] >= cycles + 3, 10, "three more cycles")
    assert len(sched.runs("always-fails")) == 3  # no fourth run


def test_trigger__runs_a_manifest_now_and_never_queues_a_second_entry(
    sched: cr.Scheduler,
) -> None:
    sched.schedule("nightly", FanOut, SUCCEEDS, cron="0 3 * * *", tz="Europe/Berlin")
    first = sched.trigger("nightly")
    second = sched.trigger("nightly")
    assert first.run_id is not None and second.run_id is not None
    runs = {r.id: r for r in sched.runs("nightly")}
    assert len([r for r in runs.values() if r.status is cr.RunStatus.QUEUED]) <= 1
    if second.run_id != first.run_id:  # the dispatcher had claimed the first already
        assert runs[first.run_id].status is not cr.RunStatus.QUEUED
    done = eventually(
        lambda: [r for r in sched.runs("nightly") if r.status is cr.RunStatus.SUCCEEDED],
        60,
        "the triggered run to succeed",
    )
    assert done[0].job_id is not None
    with pytest.raises(cr.SchedulerOperationError) as unknown:
        sched.trigger("no-such-manifest")
    assert unknown.value.error is cr.SchedulerError.MANIFEST_NOT_FOUND


def test_requeue__a_dead_letter_runs_at_once_and_its_count_starts_afresh(
    sched: cr.Scheduler,
) -> None:
    sched.schedule("fails", FanOut, FAILS, every=timedelta(minutes=10), max_retries=0)
    (letter,) = eventually(lambda: sched.dead_letters("fails"), 60, "the dead letter")
    run_id = sched.requeue(letter.id)
    requeued = eventually(
        lambda: next((r for r in sched.runs("fails") if r.id == run_id and r.ended_at), None),
        60,
        "the requeued run to end",
    )
    assert requeued.status is cr.RunStatus.FAILED and requeued.is_retry
    (resolved,) = sched.dead_letters("fails", cr.DeadLetterStatus.RETRIED)
    assert resolved.resolved_at is not None and requeued.started_at is not None
    # No backoff: the retry delay would be minutes (default_retry_delay); a loaded machine can
    # take a few dispatch intervals.
    assert (requeued.started_at - resolved.resolved_at).total_seconds() < 30
    # Its failure is the first counted one since the requeue: max_retries=0 dead-letters it.
    again = eventually(
        lambda: sched.dead_letters("fails", cr.DeadLetterStatus.AWAITING_INTERVENTION),
        30,
        "a second dead letter",
    )
    assert again[0].run_id == run_id and again[0].retry_count_at_dead_letter == 1
    # In bulk, through the actor: the one awaiting is acknowledged, and nothing is left.
    assert sched.acknowledge_all("fails", note="seen") == 1
    assert sched.requeue_all() == []


def test_timeout__a_run_past_it_is_stopped_through_its_jobs_manager_and_cancelled(
    sched: cr.Scheduler,
) -> None:
    slow = FanOutRequest(count=1, sleep=60, stoppable=True)  # it ends once stopped
    sched.schedule("slow", FanOut, slow, every=timedelta(hours=1), timeout=timedelta(seconds=1))
    cancelled = eventually(
        lambda: next((r for r in sched.runs("slow") if r.ended_at), None), 60, "the run to end"
    )
    assert cancelled.status is cr.RunStatus.CANCELLED and cancelled.timed_out_at is not None
    assert sched.dead_letters("slow") == [] and len(sched.runs("slow")) == 1


def test_decide__a_retry_replays_the_failed_runs_answers_once_and_the_next_asks_afresh(
    connect,
    scope: str,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Each run's steps ask `decide` (async and sync perform) and fail: the first run asks,
    its retry replays the answers (ask not called), the next retry asks afresh."""
    options = FAST_SCHEDULER.model_copy(
        update={"default_retry_delay": timedelta(seconds=0.5), "retry_backoff_multiplier": 1.0}
    )
    sched = connect(scheduler=options).scheduler(scope)
    try:
        request = DecideRequest(directory=str(tmp_path))
        sched.schedule("decides", DecidesThenFails, request, every=timedelta(minutes=10),
                       max_retries=2)  # fmt: skip
        eventually(lambda: sched.dead_letters("decides"), 60, "the dead letter")
        runs = sorted(sched.runs("decides"), key=lambda r: r.queued_at)
        assert [r.status for r in runs] == [cr.RunStatus.FAILED] * 3
        assert [r.replays for r in runs] == [None, runs[0].id, None]
        for question in ("async", "sync"):
            asked = (tmp_path / f"asked-{question}").read_text().splitlines()
            answers = (tmp_path / f"answers-{question}").read_text().splitlines()
            assert len(asked) == 2, question  # the first run and the third
            assert answers == ['{"pick": "a"}'] * 3, question
    finally:
        ray.kill(ray.get_actor(f"scheduler/{scope}", namespace=RAY_NAMESPACE), no_restart=True)


def test_checkpoint__a_retry_resumes_after_the_failed_runs_last_completed_stage(
    connect,
    scope: str,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The first run completes stage 0 and fails in stage 1; its retry skips stage 0 (its
    steps do not run again, they are counted as succeeded) and succeeds."""
    options = FAST_SCHEDULER.model_copy(update={"default_retry_delay": timedelta(seconds=0.5)})
    jobs = connect(scheduler=options)
    sched = jobs.scheduler(scope)
    try:
        sched.schedule("staged", TwoStages, CheckpointRequest(directory=str(tmp_path)),
                       every=timedelta(minutes=10), max_retries=2)  # fmt: skip

        def succeeded() -> list[cr.ManifestRun]:
            return [r for r in sched.runs("staged") if r.status is cr.RunStatus.SUCCEEDED]

        (retry,) = eventually(succeeded, 60, "the retry's success")
        (failed,) = [r for r in sched.runs("staged") if r.status is cr.RunStatus.FAILED]
        assert retry.is_retry and retry.resumed_from == failed.id
        assert (tmp_path / "stage-0").read_text().splitlines() == [failed.job_id] * 2
        assert (tmp_path / "stage-1").read_text().splitlines() == [failed.job_id, retry.job_id]
        assert retry.job_id is not None
        state = jobs.manager(scope, "default").get(retry.job_id)
        assert state.resume_after is not None and state.resume_after.stage == 0
        assert state.progress.successful_steps == state.progress.total_steps == 3
    finally:
        ray.kill(ray.get_actor(f"scheduler/{scope}", namespace=RAY_NAMESPACE), no_restart=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "scheduler", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.slow  # CLI subprocesses beside a running scheduler (12 s)
def test_cli__acknowledge_through_the_running_scheduler_and_read_it_back(
    sched: cr.Scheduler, storage_url: str, scope: str
) -> None:
    sched.schedule("fails", FanOut, FAILS, every=timedelta(minutes=10), max_retries=0)
    (letter,) = eventually(lambda: sched.dead_letters("fails"), 60, "the dead letter")
    address = ray.get_runtime_context().gcs_address
    common = ["--storage", storage_url, "--scope", scope]
    acting = [*common, "--address", address, "--ray-namespace", RAY_NAMESPACE]
    done = cli("acknowledge", letter.id, "--note", "known outage", *acting)
    assert done.returncode == 0, done.stderr
    listed = cli("dead-letters", "fails", *common, "--json")
    assert listed.returncode == 0, listed.stderr
    ((stored,),) = [json.loads(listed.stdout)]
    assert stored["status"] == "Acknowledged" and stored["note"] == "known outage"
    unknown = cli("trigger", "no-such-manifest", *acting)
    assert unknown.returncode == 2 and "MANIFEST_NOT_FOUND" in unknown.stderr


# --- a whole-cluster restart on the same SQLite file -------------------------------------------

SETUP = """
import json, sys
from datetime import timedelta
import choreography_ray as cr
from tests.runtime.recovery_jobs import LoggedJob, LoggedRequest
from tests.runtime.decide_jobs import DecideRequest, DecidesThenFails
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.runtime.test_recovery import _run as run_script
OPTIONS = cr.JobsOptions(reconciliation_interval=0, job_watchdog_interval=0.5,
    scheduler=cr.SchedulerOptions(manifest_cycle=0.5, dispatch_interval=0.25, lock_ttl=2,
                                  default_retry_delay=timedelta(seconds=1)))
storage, log = sys.argv[1], sys.argv[2]
"""

FIRST_CLUSTER = (
    SETUP
    + """
import os, time
with cr.Jobs.connect(storage=storage, options=OPTIONS, namespace="sched-restart") as jobs:
    sched = jobs.scheduler("restart")
    sched.schedule("every-4s", FanOut, FanOutRequest(count=1), every=timedelta(seconds=4))
    sched.schedule("slow", LoggedJob, LoggedRequest(log=log, steps=24, sleep=1.0),
                   every=timedelta(hours=1))
    def logged():
        return os.path.exists(log) and len(open(log).read().split()) >= 2
    def succeeded(name):
        return any(r.status is cr.RunStatus.SUCCEEDED for r in sched.runs(name))
    while not (logged() and succeeded("every-4s")):
        time.sleep(0.05)
    (slow,) = sched.runs("slow")
    print(json.dumps({"slow_run": slow.id, "slow_job": slow.job_id, "down_at": time.time()}))
# leaving the block shuts the whole local cluster down, the slow run in flight
"""
)

SECOND_CLUSTER = (
    SETUP
    + """
import time
from datetime import datetime, timezone
with cr.Jobs.connect(storage=storage, options=OPTIONS, namespace="sched-restart") as jobs:
    up = datetime.now(timezone.utc)
    sched = jobs.scheduler("restart")
    deadline = time.time() + 120
    reached = False
    while not reached and time.time() < deadline:
        slow = sched.runs("slow")
        due = [r for r in sched.runs("every-4s") if r.queued_at > up]
        reached = slow[0].status.is_finished and any(r.status.is_finished for r in due)
        time.sleep(0.1)
    time.sleep(1)
    print(json.dumps({
        "reached": reached,
        "slow": [r.model_dump(mode="json") for r in sched.runs("slow")],
        "due": [r.model_dump(mode="json") for r in sched.runs("every-4s")],
        "up": up.isoformat(),
    }))
"""
)


def _run(script: str, *args: str) -> dict[str, Any]:
    """The script's last line of output, as JSON (it runs as test_recovery.py's scripts do)."""
    return json.loads(run_script(script, *args))  # type: ignore[no-any-return]


@pytest.mark.timeout(500)
@pytest.mark.slow  # a whole-cluster restart: about 40 s
def test_cluster_restart__a_missed_manifest_runs_once_and_an_in_flight_run_is_rehydrated(
    tmp_path: Path,
) -> None:
    """The first cluster may go down while a run of "every-4s" is in flight, its job not yet
    past storing its plan: the second cluster fails that job (`MissingStepPlan`) and so its
    run, whose retry is then the run queued since it came back. The retry delay is 1 s here:
    at the default (5 min) the second cluster waited out its 120 s for that retry to end."""
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"
    log = tmp_path / "slow.log"
    before = _run(FIRST_CLUSTER, storage, str(log))
    after = _run(SECOND_CLUSTER, storage, str(log))
    assert after["reached"], after  # the slow run and a run queued since it came back ended

    # In flight when the cluster went down: rehydrated as the same job, never dispatched again.
    (slow,) = after["slow"]
    assert slow["id"] == before["slow_run"] and slow["job_id"] == before["slow_job"]
    assert slow["status"] == "Succeeded" and slow["dispatch_attempts"] == 1
    assert set(log.read_text().split()) == {f"{i:06d}" for i in range(24)}

    # Due (several times) while it was down: one run when it came back, for the latest
    # occurrence; the next runs an interval after that occurrence, not for a missed one.
    up = datetime.fromisoformat(after["up"])
    since = [r for r in after["due"] if datetime.fromisoformat(r["queued_at"]) > up]
    assert since, after["due"]
    first = min(since, key=lambda r: r["queued_at"])
    occurrence = datetime.fromisoformat(first["occurrence"])
    assert occurrence > up - timedelta(seconds=4)  # the latest missed one, not the first
    early = [r for r in since if datetime.fromisoformat(r["occurrence"]) < occurrence
             + timedelta(seconds=4)]  # fmt: skip
    assert len(early) == 1, since
