"""The scheduler storage contract: the same suite on memory, SQLite and MongoDB."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.model import StageShape
from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    WorkEntry,
)
from choreography_ray.scheduler.schedules import Cron, Every
from choreography_ray.scheduler.status import (
    DeadLetterStatus,
    EntryKind,
    RunStatus,
    WorkStatus,
)
from choreography_ray.storage import Storage, open_storage
from choreography_ray.storage.scheduler import (
    Refusal,
    SchedulerStorage,
    scheduler_storage,
)
from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage
from choreography_ray.storage.scheduler.mongodb import MongoSchedulerStorage
from tests.fixtures import OLDEST_JOBS, build_oldest_sqlite
from tests.unit.scheduler.harness import Clock, FakeJobs

SCOPE = "s"
T0 = datetime(2025, 6, 1, 12, tzinfo=UTC)


@pytest.fixture
def sched(storage: Storage) -> SchedulerStorage:
    return scheduler_storage(storage)


def manifest(name: str = "m", **fields: object) -> Manifest:
    values = {"scope": SCOPE, "name": name, "job_type": "pkg.jobs:J", "schedule": Every.hours(1)}
    return Manifest.model_validate({**values, **fields})


def queued(manifest_name: str = "m", **fields: object) -> tuple[WorkEntry, ManifestRun]:
    run = ManifestRun(scope=SCOPE, manifest=manifest_name, job_type="pkg.jobs:J")
    kind = fields.pop("kind", EntryKind.SCHEDULED)
    assert isinstance(kind, EntryKind)
    entry = WorkEntry.model_validate({
        "scope": SCOPE, "manifest": manifest_name, "run_id": run.id, "kind": kind,
        "holds_manifest_key": kind.holds_manifest_key, **fields,
    })  # fmt: skip
    return entry, run


# --- manifests -------------------------------------------------------------------------------


async def test_manifest__inserted_and_read_back_equal(sched: SchedulerStorage) -> None:
    new = manifest(schedule=Cron(expression="0 3 * * *", tz="Europe/Berlin"),
                   request={"a": [1, {"b": "c"}]}, failure_window=timedelta(hours=2))  # fmt: skip
    stored = await sched.upsert_manifest(new, stated=())
    assert stored == new
    assert await sched.get_manifest(SCOPE, "m") == new
    assert await sched.get_manifest(SCOPE, "other") is None
    await sched.upsert_manifest(manifest("a"), stated=())
    assert [m.name for m in await sched.list_manifests(SCOPE)] == ["a", "m"]
    assert await sched.list_manifests("other-scope") == []


async def test_manifest__a_stated_setting_is_written_an_unstated_one_kept(
    sched: SchedulerStorage,
) -> None:
    await sched.upsert_manifest(manifest(max_retries=7), stated={"max_retries"})
    await sched.set_replay_decisions_on_retry(SCOPE, ["m"], False)  # an operator's opt-out
    reseeded = manifest(max_retries=3, request={"new": True}, schedule=Every.minutes(5))
    stored = await sched.upsert_manifest(reseeded, stated=())
    assert stored.max_retries == 7 and not stored.replay_decisions_on_retry
    assert stored.request == {"new": True} and stored.schedule == Every.minutes(5)
    stated = await sched.upsert_manifest(
        manifest(replay_decisions_on_retry=True), stated={"replay_decisions_on_retry"}
    )
    assert stated.replay_decisions_on_retry and stated.max_retries == 7
    assert await sched.get_manifest(SCOPE, "m") == stated


# --- the work queue --------------------------------------------------------------------------


async def test_enqueue__a_zero_delay_stores_no_scheduled_at(sched: SchedulerStorage) -> None:
    entry, run = queued()
    done = await sched.enqueue(entry, run)
    assert done.entry is not None and done.entry.scheduled_at is None
    assert done.refused is None and not done.replay_dropped
    assert await sched.get_run(run.id) == run
    assert await sched.queued_entries(SCOPE) == [done.entry]


async def test_enqueue__scheduled_at_is_the_databases_clock_plus_the_delay(
    sched: SchedulerStorage,
) -> None:
    before = await sched.now()
    entry, run = queued()
    done = await sched.enqueue(entry, run, timedelta(seconds=30))
    after = await sched.now()
    assert done.entry is not None and done.entry.scheduled_at is not None
    assert before + timedelta(seconds=30) <= done.entry.scheduled_at
    assert done.entry.scheduled_at <= after + timedelta(seconds=30)
    assert await sched.claim_due(SCOPE) == []  # not due yet


async def test_enqueue__one_queued_entry_per_manifest(sched: SchedulerStorage) -> None:
    first, second = queued(), queued()
    assert (await sched.enqueue(*first)).entry is not None
    lost = await sched.enqueue(*second)
    assert lost.refused is Refusal.MANIFEST_ALREADY_QUEUED and lost.entry is None
    assert await sched.get_run(second[1].id) is None
    # A requeue of an execution does not hold the manifest's key.
    assert (await sched.enqueue(*queued(kind=EntryKind.REQUEUE_EXECUTION))).entry is not None
    # Once the first is claimed, the manifest may be queued again.
    assert first[0].id in {e.id for e in await sched.claim_due(SCOPE)}
    assert (await sched.enqueue(*queued())).entry is not None


async def test_enqueue__two_requeues_of_one_run_race_and_exactly_one_carries_the_link(
    sched: SchedulerStorage,
) -> None:
    kind = EntryKind.REQUEUE_EXECUTION
    results = await asyncio.gather(
        *(sched.enqueue(*queued(kind=kind, replays="failed-run")) for _ in range(2))
    )
    assert all(r.entry is not None for r in results)
    assert sorted(r.replay_dropped for r in results) == [False, True]
    links = sorted(str(r.entry.replays) for r in results if r.entry is not None)
    assert links == ["None", "failed-run"]
    runs = [await sched.get_run(r.run.id) for r in results if r.run is not None]
    assert sorted(str(r.replays) for r in runs if r is not None) == ["None", "failed-run"]


async def test_enqueue__a_resume_that_loses_is_refused_or_queued_without_it(
    sched: SchedulerStorage,
) -> None:
    kind = EntryKind.RESUME_EXECUTION
    assert (await sched.enqueue(*queued(kind=kind, resume_from="r1"))).entry is not None
    refused = await sched.enqueue(*queued(kind=kind, resume_from="r1"), refuse_resume=True)
    assert refused.refused is Refusal.RESUME_ALREADY_QUEUED
    retry = await sched.enqueue(*queued(resume_from="r1"))
    assert retry.resume_dropped and retry.entry is not None and retry.entry.resume_from is None


async def test_claim__two_claimers_race_and_exactly_one_wins(
    sched: SchedulerStorage, storage_url: str, provider: str
) -> None:
    await sched.enqueue(*queued())
    other = open_storage(storage_url) if provider != "memory" else None
    rival = sched if other is None else scheduler_storage(other)
    try:
        claims = await asyncio.gather(sched.claim_due(SCOPE), rival.claim_due(SCOPE))
    finally:
        if other is not None:
            await other.close()
    assert sorted(len(c) for c in claims) == [0, 1]
    (won,) = next(c for c in claims if c)
    assert won.status is WorkStatus.DISPATCHED and won.dispatch_attempts == 1
    assert won.dispatched_at is not None
    assert await sched.queued_entries(SCOPE) == []


async def test_release__due_at_once_and_cleared_only_while_still_queued(
    sched: SchedulerStorage,
) -> None:
    entry, run = queued(replays="failed-run")
    await sched.enqueue(entry, run, timedelta(hours=1))
    released = await sched.release(entry.id, clear_link=True)
    assert released is not None and released.scheduled_at is None and released.replays is None
    assert (await sched.get_run(run.id)).replays is None  # type: ignore[union-attr]
    (claimed,) = await sched.claim_due(SCOPE)
    assert await sched.release(claimed.id) is None  # the dispatcher was first


async def test_requeue_dispatch__queued_again_after_the_delay(sched: SchedulerStorage) -> None:
    entry, run = queued()
    await sched.enqueue(entry, run)
    await sched.claim_due(SCOPE)
    back = await sched.requeue_dispatch(entry.id, timedelta(seconds=5))
    assert back is not None and back.status is WorkStatus.QUEUED and back.scheduled_at
    assert back.dispatch_attempts == 1 and back.holds_manifest_key
    assert await sched.requeue_dispatch(entry.id, timedelta(0)) is None  # not dispatched now
    assert await sched.cancel_entry(entry.id)
    assert (await sched.get_entry(entry.id)).status is WorkStatus.CANCELLED  # type: ignore[union-attr]


async def test_cancel_entry__saves_its_run_with_it_and_frees_the_manifest_key(
    sched: SchedulerStorage,
) -> None:
    entry, run = queued()
    await sched.enqueue(entry, run)
    cancelled = run.model_copy(update={"status": RunStatus.CANCELLED, "ended_at": T0})
    assert await sched.cancel_entry(entry.id, cancelled)
    assert await sched.get_run(run.id) == cancelled
    assert not await sched.cancel_entry(entry.id, run)  # no longer queued: nothing written
    assert await sched.get_run(run.id) == cancelled
    again, second = queued()
    assert (await sched.enqueue(again, second)).entry is not None


async def test_opt_out__clears_the_link_of_queued_retries_and_counts_them(
    sched: SchedulerStorage,
) -> None:
    await sched.upsert_manifest(manifest(), stated=())
    entry, run = queued(replays="failed-run")
    await sched.enqueue(entry, run)
    await sched.enqueue(*queued(kind=EntryKind.REQUEUE_EXECUTION, replays="other"))
    assert await sched.set_replay_decisions_on_retry(SCOPE, ["m"], False) == 1
    assert (await sched.get_entry(entry.id)).replays is None  # type: ignore[union-attr]
    assert (await sched.get_run(run.id)).replays is None  # type: ignore[union-attr]
    assert not (await sched.get_manifest(SCOPE, "m")).replay_decisions_on_retry  # type: ignore[union-attr]
    assert await sched.set_replay_decisions_on_retry(SCOPE, ["m"], True) == 0


# --- runs, dead letters, decisions, checkpoints ----------------------------------------------


async def test_runs__newest_first_by_manifest_and_by_replayed_run(sched: SchedulerStorage) -> None:
    runs = [
        ManifestRun(scope=SCOPE, manifest="m" if n % 2 else "n", job_type="J",
                    queued_at=T0 + timedelta(minutes=n), replays="x" if n == 3 else None)
        for n in range(5)
    ]  # fmt: skip
    for r in runs:
        await sched.save_run(r)
    assert [r.id for r in await sched.list_runs(SCOPE, limit=3)] == [r.id for r in runs[:1:-1]]
    assert [r.id for r in await sched.list_runs(SCOPE, "m")] == [runs[3].id, runs[1].id]
    assert [r.id for r in await sched.runs_replaying("x")] == [runs[3].id]
    finished = runs[3].model_copy(update={"status": RunStatus.FAILED, "ended_at": T0})
    await sched.save_run(finished)
    assert await sched.get_run(finished.id) == finished


async def test_runs_in_play__unfinished_of_any_age_and_failures_counted_since(
    sched: SchedulerStorage,
) -> None:
    def at(minutes: float, status: RunStatus, **fields: object) -> ManifestRun:
        queued_at = T0 + timedelta(minutes=minutes)
        return ManifestRun.model_validate({"scope": SCOPE, "manifest": "m", "job_type": "J",
                                           "queued_at": queued_at, "status": status,
                                           **fields})  # fmt: skip

    since = T0 + timedelta(minutes=10)
    old_running = at(-600, RunStatus.RUNNING, started_at=T0 - timedelta(hours=10))
    old_queued = at(-500, RunStatus.DISPATCH_REQUEUED)
    old_failure = at(5, RunStatus.FAILED, started_at=T0 + timedelta(minutes=6))
    # Queued before `since` but started after it: counted from its start.
    started_late = at(8, RunStatus.FAILED, started_at=T0 + timedelta(minutes=10, seconds=1))
    never_started = at(12, RunStatus.FAILED)
    success = at(20, RunStatus.SUCCEEDED, started_at=T0 + timedelta(minutes=20))
    other = ManifestRun(scope=SCOPE, manifest="n", job_type="J", status=RunStatus.RUNNING)
    for r in (old_running, old_queued, old_failure, started_late, never_started, success, other):
        await sched.save_run(r)
    found = await sched.runs_in_play(SCOPE, "m", since)
    expected = [never_started, started_late, old_queued, old_running]
    assert [r.id for r in found] == [r.id for r in expected]


async def test_run_for_job__the_run_whose_job_it_is(sched: SchedulerStorage) -> None:
    queued_run = ManifestRun(scope=SCOPE, manifest="m", job_type="J")
    started = ManifestRun(scope=SCOPE, manifest="m", job_type="J", job_id="job-1",
                          status=RunStatus.RUNNING)  # fmt: skip
    other = ManifestRun(scope="other-scope", manifest="n", job_type="J", job_id="job-2")
    for r in (queued_run, started, other):
        await sched.save_run(r)
    assert await sched.run_for_job("job-1") == started
    assert await sched.run_for_job("job-2") == other
    assert await sched.run_for_job("no-such-job") is None
    # A run saved again with its job (the dispatcher's start) is found by it.
    await sched.save_run(queued_run.model_copy(update={"job_id": "job-3"}))
    found = await sched.run_for_job("job-3")
    assert found is not None and found.id == queued_run.id


async def test_dead_letters__resolved_once_then_cleaned_up(sched: SchedulerStorage) -> None:
    letter = DeadLetter(scope=SCOPE, manifest="m", retry_count_at_dead_letter=4, reason="r")
    await sched.add_dead_letter(letter)
    awaiting = DeadLetterStatus.AWAITING_INTERVENTION
    assert await sched.list_dead_letters(SCOPE, "m", awaiting) == [letter]
    resolved = await sched.resolve_dead_letter(letter.id, DeadLetterStatus.ACKNOWLEDGED, "seen")
    assert resolved is not None and resolved.note == "seen" and resolved.resolved_at
    assert await sched.resolve_dead_letter(letter.id, DeadLetterStatus.RETRIED) is None
    assert await sched.get_dead_letter(letter.id) == resolved
    assert await sched.list_dead_letters(SCOPE, status=awaiting) == []
    assert await sched.remove_resolved_dead_letters(resolved.resolved_at) == 0
    # The manifest's latest resolution stays however old (tests/storage/
    # test_scheduler_contract_upkeep.py has the cleanup of the older ones).
    later = resolved.resolved_at + timedelta(seconds=1)
    assert await sched.remove_resolved_dead_letters(later) == 0
    assert await sched.get_dead_letter(letter.id) == resolved


async def test_dead_letters__one_awaiting_per_manifest(sched: SchedulerStorage) -> None:
    def letter(name: str = "m") -> DeadLetter:
        return DeadLetter(scope=SCOPE, manifest=name, retry_count_at_dead_letter=1, reason="r")

    first = letter()
    assert await sched.add_dead_letter(first)
    assert not await sched.add_dead_letter(letter())  # two schedulers' cycles, say
    assert await sched.add_dead_letter(letter("other"))
    settled = letter().model_copy(update={"status": DeadLetterStatus.RETRIED, "resolved_at": T0})
    assert await sched.add_dead_letter(settled)  # a resolved one is no rival
    awaiting = DeadLetterStatus.AWAITING_INTERVENTION
    assert [d.id for d in await sched.list_dead_letters(SCOPE, "m", awaiting)] == [first.id]
    await sched.resolve_dead_letter(first.id, DeadLetterStatus.ACKNOWLEDGED, "seen")
    assert await sched.add_dead_letter(letter())


async def test_decisions__the_first_answer_for_a_key_stays(sched: SchedulerStorage) -> None:
    first = Decision(run_id="r", scope=SCOPE, manifest="m", question="q", state_hash="h",
                     answer={"pick": "a"})  # fmt: skip
    assert await sched.record_decision(first) == first
    again = first.model_copy(update={"answer": {"pick": "b"}})
    assert await sched.record_decision(again) == first
    other = first.model_copy(update={"question": "q2"})
    await sched.record_decision(other)
    assert await sched.count_decisions("r") == 2
    assert {d.question for d in await sched.list_decisions("r")} == {"q", "q2"}
    assert await sched.count_decisions("nobody") == 0


async def test_checkpoints__by_stage(sched: SchedulerStorage) -> None:
    layout = (StageShape(stage=0, steps=1), StageShape(stage=10, steps=2))
    for stage in (10, 0):
        await sched.save_checkpoint(
            Checkpoint(run_id="r", scope=SCOPE, manifest="m", stage=stage, layout=layout)
        )
    assert [c.stage for c in await sched.list_checkpoints("r")] == [0, 10]
    assert (await sched.list_checkpoints("r"))[0].layout == layout


async def test_manifest_keys__every_scope_and_namespace_once_sorted(
    sched: SchedulerStorage,
) -> None:
    assert await sched.manifest_keys() == []
    await sched.upsert_manifest(manifest("a", namespace="n2"), stated=())
    await sched.upsert_manifest(manifest("b", namespace="n1"), stated=())
    await sched.upsert_manifest(manifest("c", namespace="n1"), stated=())
    await sched.upsert_manifest(manifest("d", scope="other"), stated=())
    assert await sched.manifest_keys() == [("other", "default"), ("s", "n1"), ("s", "n2")]


# --- the scope's lock ------------------------------------------------------------------------


async def test_lease__a_later_incarnation_of_its_holder_takes_it_over_at_once(
    sched: SchedulerStorage,
) -> None:
    ttl = timedelta(seconds=30)
    assert await sched.acquire_lease("scheduler/s", "actor/0001", ttl) is not None
    taken = await sched.acquire_lease("scheduler/s", "actor/0002", ttl)
    assert taken is not None and taken.holder == "actor/0002"
    assert await sched.acquire_lease("scheduler/s", "actor/0001", ttl) is None
    assert await sched.acquire_lease("scheduler/s", "other/0003", ttl) is None


async def test_lease__its_token_goes_up_when_the_holder_changes_and_stays_on_a_renewal(
    sched: SchedulerStorage,
) -> None:
    ttl = timedelta(seconds=30)
    first = await sched.acquire_lease("scheduler/s", "actor/0001", ttl)
    renewed = await sched.acquire_lease("scheduler/s", "actor/0001", ttl)
    taken = await sched.acquire_lease("scheduler/s", "actor/0002", ttl)
    assert first is not None and renewed is not None and taken is not None
    assert (first.token, renewed.token, taken.token) == (1, 1, 2)
    stored = await sched.get_lease("scheduler/s")
    assert stored is not None and stored.token == 2


async def test_lease__one_holder_until_it_expires_then_another_takes_it(
    sched: SchedulerStorage,
) -> None:
    first = await sched.acquire_lease("scheduler/s", "a", timedelta(seconds=0.3))
    assert first is not None and first.holder == "a" and first.expires_at > first.acquired_at
    assert await sched.acquire_lease("scheduler/s", "b", timedelta(seconds=30)) is None
    assert await sched.acquire_lease("scheduler/t", "b", timedelta(seconds=30)) is not None
    await asyncio.sleep(0.4)
    taken = await sched.acquire_lease("scheduler/s", "b", timedelta(seconds=30))
    assert taken is not None and taken.holder == "b"
    assert await sched.acquire_lease("scheduler/s", "a", timedelta(seconds=30)) is None
    stored = await sched.get_lease("scheduler/s")
    assert stored is not None and stored.holder == "b"


async def test_lease__renewed_by_its_holder_and_released_only_by_it(
    sched: SchedulerStorage,
) -> None:
    first = await sched.acquire_lease("scheduler/s", "a", timedelta(seconds=5))
    renewed = await sched.acquire_lease("scheduler/s", "a", timedelta(seconds=60))
    assert first is not None and renewed is not None
    assert renewed.acquired_at == first.acquired_at and renewed.expires_at > first.expires_at
    assert not await sched.release_lease("scheduler/s", "b")
    assert await sched.release_lease("scheduler/s", "a")
    assert await sched.get_lease("scheduler/s") is None
    assert not await sched.release_lease("scheduler/s", "a")
    assert await sched.acquire_lease("scheduler/s", "b", timedelta(seconds=5)) is not None


async def test_lease__of_two_holders_acquiring_at_once_one_wins(sched: SchedulerStorage) -> None:
    won = await asyncio.gather(
        *(sched.acquire_lease("scheduler/s", f"h{i}", timedelta(seconds=30)) for i in range(4))
    )
    assert len([lease for lease in won if lease is not None]) == 1


# --- upgrade --------------------------------------------------------------------------------


async def test_sqlite_file_of_the_oldest_release_gains_the_scheduler_tables(
    tmp_path: Path,
) -> None:
    url = build_oldest_sqlite(tmp_path / "old.db", scope="s", namespace="n", log="",
                              job_type="pkg.jobs:J", step_type="pkg.jobs:S")  # fmt: skip
    storage = open_storage(url)
    try:
        sched = scheduler_storage(storage)
        await sched.upsert_manifest(manifest(), stated=())
        assert [m.name for m in await sched.list_manifests(SCOPE)] == ["m"]
        assert {j.id for j in await storage.list_jobs("s", "n")} == set(OLDEST_JOBS)
    finally:
        await storage.close()
    reopened = open_storage(url)
    try:
        found = await scheduler_storage(reopened).get_manifest(SCOPE, "m")
        assert found is not None and found.job_type == "pkg.jobs:J"
        run = ManifestRun(scope=SCOPE, manifest="m", job_type="J", job_id="job-1")
        await scheduler_storage(reopened).save_run(run)
        assert await scheduler_storage(reopened).run_for_job("job-1") == run
    finally:
        await reopened.close()


async def test_sqlite_run_for_job__uses_the_job_id_index(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    storage = open_storage(url)
    try:
        sched = scheduler_storage(storage)
        await sched.save_run(ManifestRun(scope=SCOPE, manifest="m", job_type="J", job_id="j"))
    finally:
        await storage.close()
    from choreography_ray.storage.scheduler.sqlite_rows import _RUN_JOB

    with sqlite3.connect(tmp_path / "runs.db") as c:
        plan = c.execute(f"EXPLAIN QUERY PLAN SELECT id, doc FROM runs WHERE {_RUN_JOB} = ?",
                         ("j",)).fetchall()  # fmt: skip
    assert any("runs_job" in str(row) for row in plan), plan


# --- a write that fails between two writes ---------------------------------------------------


async def test_enqueue__a_failing_entry_write_blocks_nothing_the_next_cycle_queues(
    sched: SchedulerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MongoDB writes an enqueue's entry, then its run; SQLite both in one transaction. The
    entry's write fails once: nothing is left that holds the manifest up."""
    if isinstance(sched, MemorySchedulerStorage):
        pytest.skip("the memory storage enqueues in one step: nothing to fail between")
    module = sys.modules[type(sched).__module__]
    mongo = isinstance(sched, MongoSchedulerStorage)
    name = "_doc" if mongo else "_insert_entry"  # (record, key) or (connection, entry)
    real = getattr(module, name)
    failed: list[str] = []

    def once(*args: Any) -> Any:
        if not failed and any(isinstance(a, WorkEntry) for a in args):
            failed.append(name)
            raise OSError("the entry's write failed")
        return real(*args)

    monkeypatch.setattr(module, name, once)
    core = SchedulerCore(SCOPE, sched, FakeJobs(Clock()), SchedulerOptions(), holder="h")
    await core.start(loops=False)
    await core.schedule("m", "pkg.jobs:J", {}, Every.hours(1))
    await core.run_cycle()  # its enqueue fails: logged, the manifest's turn ends
    assert failed
    await core.run_cycle()
    (entry,) = await sched.queued_entries(SCOPE, "m")
    waiting = [r for r in await sched.list_runs(SCOPE, "m") if not r.status.is_finished]
    assert [r.id for r in waiting] == [entry.run_id]
