"""The records the dashboard's tests read, written through the storage API."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.model import (
    JobProgress,
    JobsManagerKey,
    JobState,
    StageProgress,
    StatusChange,
    utcnow,
)
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.schedules import After, Cron, Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import PlannedStep, StepUpdate, Storage
from choreography_ray.storage.scheduler import scheduler_storage

REBUILD = "tests.jobs:RebuildIndex"
EMBED = "tests.jobs:EmbedDocuments"
RUNNING_JOB = "job-running"
#: Failed steps of the running job, more than one page of them (25).
FAILED_STEPS = 30
#: Jobs beside the named ones, older, to have more than one page (50).
FILLERS = 60
SCOPE = "pipelines"
DEAD_LETTER = "dl-awaiting"


def _job(job_id: str, status: JobStatus, *, minutes_ago: float, **fields: object) -> JobState:
    job = JobState.model_validate({
        "id": job_id, "scope": "studio", "namespace": "tenant-a", "type": REBUILD,
        "created": utcnow() - timedelta(minutes=minutes_ago), **fields,
    })  # fmt: skip
    for step in (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS, JobStatus.RUNNING):
        job = job.with_status(step)
    if status is JobStatus.FAILED:
        return job.with_status(status, "on_completed raised RuntimeError: the index is gone")
    return job if status is JobStatus.RUNNING else job.with_status(status)


async def seed(storage: Storage) -> None:
    for scope, namespace in (("studio", "tenant-a"), ("studio", "tenant-b"), ("lab", "tenant-a")):
        await storage.add_manager_key(JobsManagerKey(scope=scope, namespace=namespace))
    stages = (
        StageProgress(stage=0, is_started=True, total_steps=100, successful_steps=68,
                      failed_steps=FAILED_STEPS + 2),
        StageProgress(stage=10, is_started=True, total_steps=200, successful_steps=50),
    )  # fmt: skip
    progress = JobProgress(total_steps=300, successful_steps=118, failed_steps=FAILED_STEPS + 2,
                           stages=stages)  # fmt: skip
    running = _job(RUNNING_JOB, JobStatus.RUNNING, minutes_ago=5, progress=progress, stage=10,
                   has_plan=True, request={"index": "docs", "shards": ["a", "b"],
                                           "note": "<script>alert(1)</script>"})  # fmt: skip
    await storage.create_job(running)
    await storage.insert_plan(RUNNING_JOB, [
        PlannedStep(f"step-{n:03d}", "tests.jobs:Shard", 0 if n < 100 else 10, "{}")
        for n in range(300)
    ])  # fmt: skip
    failures = [
        StepUpdate(RUNNING_JOB, f"step-{n:03d}", StepStatus.FAILED, 2, change=StatusChange(
            status=StepStatus.FAILED, exception_messages=(f"shard {n} refused: disk full",)))
        for n in range(FAILED_STEPS)
    ] + [
        StepUpdate(RUNNING_JOB, f"step-{n:03d}", StepStatus.COMPLETED_WITH_FAILURE, 1,
                   change=StatusChange(status=StepStatus.COMPLETED_WITH_FAILURE,
                                       exception_messages=("no such shard",)))
        for n in (40, 41)
    ]  # fmt: skip
    await storage.update_steps(failures)
    done = JobProgress(total_steps=10, successful_steps=10,
                       stages=(StageProgress(stage=0, is_started=True, total_steps=10,
                                             successful_steps=10),))  # fmt: skip
    with_failure = done.model_copy(update={"successful_steps": 9, "failed_steps": 1})
    for job in (
        _job("job-done", JobStatus.COMPLETED_SUCCESSFULLY, minutes_ago=30, progress=done,
             namespace="tenant-b", type=EMBED),
        _job("job-with-failures", JobStatus.COMPLETED_WITH_FAILURES, minutes_ago=20,
             scope="lab", progress=with_failure),
        _job("job-stopped", JobStatus.STOPPED, minutes_ago=15, stop_finalized=True),
        _job("job-failed", JobStatus.FAILED, minutes_ago=10,
             error="on_completed raised RuntimeError: the index is gone"),
        _job("job-big-request", JobStatus.COMPLETED_SUCCESSFULLY, minutes_ago=25,
             request={"shards": [f"shard-{n:06d}" for n in range(10_000)]}),
    ):  # fmt: skip
        await storage.create_job(job)
    for n in range(FILLERS):
        await storage.create_job(_job(f"filler-{n:03d}", JobStatus.COMPLETED_SUCCESSFULLY,
                                      minutes_ago=10 * 24 * 60 + n, progress=done))  # fmt: skip
    await seed_schedules(storage)


async def seed_schedules(storage: Storage) -> None:
    sched = scheduler_storage(storage)
    now = utcnow()
    for manifest in (
        Manifest(scope=SCOPE, name="hourly", job_type=REBUILD, schedule=Every.hours(1),
                 created=now - timedelta(days=2)),
        Manifest(scope=SCOPE, name="nightly", job_type=EMBED,
                 schedule=Cron(expression="0 3 * * *", tz="Europe/Berlin")),
        Manifest(scope=SCOPE, name="after-nightly", job_type=REBUILD,
                 schedule=After(parent="nightly"), enabled=False),
    ):  # fmt: skip
        await sched.upsert_manifest(manifest, stated=())
    hour = timedelta(hours=1)
    for n, (status, job_id) in enumerate([(RunStatus.SUCCEEDED, "job-done"),
                                          (RunStatus.FAILED, "job-with-failures"),
                                          (RunStatus.FAILED, None)]):  # fmt: skip
        started = now - (5 - n) * hour
        await sched.save_run(ManifestRun(
            id=f"run-{n}", scope=SCOPE, manifest="hourly", job_type=REBUILD, status=status,
            job_id=job_id, queued_at=started, started_at=started, ended_at=started + hour / 6,
            is_retry=n == 2, replays="run-1" if n == 2 else None,
        ))  # fmt: skip
    await sched.add_dead_letter(DeadLetter(
        id=DEAD_LETTER, scope=SCOPE, manifest="hourly", retry_count_at_dead_letter=2,
        reason="2 failures in 24 h: out of retries", run_id="run-2", dead_lettered_at=now,
    ))  # fmt: skip
    await sched.add_dead_letter(DeadLetter(
        id="dl-acknowledged", scope=SCOPE, manifest="nightly", retry_count_at_dead_letter=4,
        reason="4 failures", status=DeadLetterStatus.ACKNOWLEDGED,
        dead_lettered_at=now - 3 * hour, resolved_at=now - 2 * hour, note="upstream outage",
    ))  # fmt: skip
