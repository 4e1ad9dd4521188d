"""Issue 36, items 4, 7 and 9: what the dispatcher checks of a claimed entry before it starts
its run. An entry of a disabled manifest is cancelled; an entry whose run has started, or is
another entry's, is cancelled and never started; a replay lookup that fails asks afresh rather
than hold up the retry."""

from __future__ import annotations

import pytest

from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import ManifestRun, WorkEntry
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import EntryKind, RunStatus, WorkStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run


def test_a_disabled_manifests_entry_is_cancelled_at_dispatch_when_the_disable_left_it() -> None:
    """The disable is two writes (the manifest, then its queued entries): a failure between
    leaves the entry queued, and the dispatcher cancels it rather than run it once more."""

    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        await core.run_cycle()  # queued
        (entry,) = await h.storage.queued_entries("s", "m")

        async def fails(*args: object) -> None:
            raise RuntimeError("storage went away")

        core.ops._cancel_queued = fails  # type: ignore[method-assign,assignment]
        with pytest.raises(RuntimeError):
            await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        await core.dispatch_due()

        assert h.jobs.started == []
        assert (await h.storage.get_entry(entry.id)).status is WorkStatus.CANCELLED  # type: ignore[union-attr]
        (cancelled,) = await core.runs("m")
        assert cancelled.status is RunStatus.CANCELLED and "disabled" in (cancelled.error or "")

    run(scenario)


def test_two_entries_of_one_run_start_it_once_and_the_other_entry_is_cancelled() -> None:
    """A half-written requeue written again (MongoDB: its entry written, its run not) leaves
    two entries naming one run; the run names the second."""

    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        the_run = ManifestRun(scope="s", manifest="m", job_type=JOB, replays="r0",
                              kind=EntryKind.DEAD_LETTER_REQUEUE)  # fmt: skip
        entries = []
        for _ in range(2):
            entry = WorkEntry(scope="s", manifest="m", run_id=the_run.id, holds_manifest_key=False,
                              kind=EntryKind.DEAD_LETTER_REQUEUE)  # fmt: skip
            await h.storage.enqueue(entry, the_run.model_copy(update={"entry_id": entry.id}))
            entries.append(entry)
        await core.dispatch_due()

        assert len(h.jobs.attempts) == 1
        first, second = [await h.storage.get_entry(e.id) for e in entries]
        assert first is not None and first.status is WorkStatus.CANCELLED
        assert second is not None and second.status is WorkStatus.DISPATCHED
        started = await h.storage.get_run(the_run.id)
        assert started is not None and started.status is RunStatus.RUNNING

    run(scenario)


def test_an_entry_whose_run_is_running_is_cancelled_and_leaves_the_run_alone() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = JobView(JobStatus.RUNNING)
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        running = ManifestRun(scope="s", manifest="m", job_type=JOB, status=RunStatus.RUNNING,
                              job_id="j1")  # fmt: skip
        entry = WorkEntry(scope="s", manifest="m", run_id=running.id, holds_manifest_key=False,
                          kind=EntryKind.REQUEUE_EXECUTION, replays="r0")  # fmt: skip
        await h.storage.enqueue(entry, running.model_copy(update={"entry_id": entry.id}))
        await h.storage.save_run(running.model_copy(update={"entry_id": entry.id}))
        await core.dispatch_due()

        assert h.jobs.attempts == []
        after = await h.storage.get_run(running.id)
        assert after is not None and after.replays is None and after.job_id == "j1"
        assert (await h.storage.get_entry(entry.id)).status is WorkStatus.CANCELLED  # type: ignore[union-attr]

    run(scenario)


def test_a_failed_replay_lookup_at_dispatch_asks_afresh_and_starts_the_run() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        queued = ManifestRun(scope="s", manifest="m", job_type=JOB, replays="r0",
                             kind=EntryKind.DEAD_LETTER_REQUEUE)  # fmt: skip
        entry = WorkEntry(scope="s", manifest="m", run_id=queued.id, holds_manifest_key=False,
                          kind=EntryKind.DEAD_LETTER_REQUEUE, replays="r0")  # fmt: skip
        await h.storage.enqueue(entry, queued.model_copy(update={"entry_id": entry.id}))

        async def down(run_id: str) -> list[ManifestRun]:
            raise ConnectionError("storage down")

        h.storage.runs_replaying = down  # type: ignore[method-assign]
        await core.dispatch_due()

        assert len(h.jobs.started) == 1
        started = await h.storage.get_run(queued.id)
        assert started is not None and started.status is RunStatus.RUNNING
        assert started.replays is None and started.dispatch_attempts == 1

    run(scenario)
