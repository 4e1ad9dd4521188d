"""`SchedulerCore` on the memory storage with a fake jobs port: the spec's examples, dispatch
failures, dependents, triggers, requeues and the scope's lock, on a clock the test moves."""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import timedelta

import pytest

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import Decision
from choreography_ray.scheduler.schedules import After, Cron, Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run

FAILS = JobView(JobStatus.FAILED)
STOPPED = JobView(JobStatus.STOPPED, stop_finalized=True)


def always_failing(**options: object) -> Harness:
    h = Harness(**{"default_retry_delay": 2, **options})
    h.jobs.ends_as = FAILS
    return h


def test_spec_example__max_retries_2_runs_three_times_2s_and_4s_apart_then_dead_letters() -> None:
    async def scenario() -> None:
        h = always_failing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=2)
        await h.run_for(30)
        starts = h.starts()
        assert len(starts) == 3, starts
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        # Each retry waits its delay plus at most one cycle (the failure is settled by the
        # next cycle) and one dispatch interval.
        assert all(e <= g <= e + 1.5 for g, e in zip(gaps, (2, 4), strict=True)), gaps
        assert starts[-1] - starts[0] < 10
        (letter,) = await core.dead_letters("m")
        assert letter.status is DeadLetterStatus.AWAITING_INTERVENTION
        assert letter.retry_count_at_dead_letter == 3
        dead_lettered = (letter.dead_lettered_at - h.clock.now).total_seconds() + 30
        assert dead_lettered - starts[-1] <= 1.5  # on the next cycle after the last failure
        runs = await core.runs("m")
        assert [r.status for r in runs] == [RunStatus.FAILED] * 3
        assert [r.is_retry for r in runs] == [True, True, False]
        assert letter.run_id == runs[0].id

    run(scenario)


def test_failures_outside_the_window_never_add_up(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        h = always_failing(default_retry_delay=20)
        core = await h.start()
        with caplog.at_level(logging.WARNING):
            await core.schedule("m", JOB, {}, Every.seconds(1), max_retries=1,
                                failure_window=timedelta(seconds=10))  # fmt: skip
        assert "would never be dead-lettered" in caplog.text
        await h.run_for(120)
        assert len(h.starts()) >= 5
        assert await core.dead_letters("m") == []

    run(scenario)


def test_a_requeued_manifest_starts_fresh_and_runs_at_once() -> None:
    async def scenario() -> None:
        h = always_failing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=2)
        await h.run_for(15)
        (letter,) = await core.dead_letters("m")
        run_id = await core.requeue(letter.id)
        await h.run_for(0.5)
        assert len(h.starts()) == 4  # at once, no backoff
        (requeued,) = [r for r in await core.runs("m") if r.id == run_id]
        assert requeued.status is RunStatus.RUNNING and requeued.is_retry
        (resolved,) = await core.dead_letters("m")
        assert resolved.status is DeadLetterStatus.RETRIED and resolved.resolved_at is not None
        # The count starts afresh: its failure is the first counted one, so it is not
        # dead-lettered. The failures the dead letter set aside settled nothing: the manifest
        # is still due, so its retries follow after their backoff (2 s, 4 s), not an interval.
        await h.run_for(1.5)
        assert len(h.starts()) == 4
        assert [d.status for d in await core.dead_letters("m")] == [DeadLetterStatus.RETRIED]
        await h.run_for(10)
        starts = h.starts()
        assert len(starts) == 6, starts  # the requeue and its two retries
        gaps = [b - a for a, b in itertools.pairwise(starts[3:])]
        assert all(e <= g <= e + 1.5 for g, e in zip(gaps, (2, 4), strict=True)), gaps
        assert [d.status for d in await core.dead_letters("m")] == [
            DeadLetterStatus.AWAITING_INTERVENTION,
            DeadLetterStatus.RETRIED,
        ]
        with pytest.raises(SchedulerOperationError) as refused:
            await core.requeue(letter.id)
        assert refused.value.error is SchedulerError.DEAD_LETTER_ALREADY_RESOLVED

    run(scenario)


def test_a_cancelled_run_is_not_retried_the_next_occurrence_runs_on_time() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=2)
        h.jobs.ends_as = STOPPED
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.seconds(10))
        await h.run_for(25)
        assert h.starts() == [0.0, 10.0, 20.0]
        runs = await core.runs("m")
        assert {r.status for r in runs[1:]} == {RunStatus.CANCELLED}
        assert not any(r.is_retry for r in runs)
        assert await core.dead_letters("m") == []

    run(scenario)


def test_dispatch_failures_are_requeued_with_their_own_backoff_and_do_not_count() -> None:
    async def scenario() -> None:
        h = Harness(dispatch_retry_delay=1, max_dispatch_retry_delay=10)
        h.jobs.unreachable = 2
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=0)
        await h.run_for(1)
        (waiting,) = await core.runs("m")
        assert waiting.status is RunStatus.DISPATCH_REQUEUED and waiting.dispatch_attempts == 1
        await h.run_for(5)
        attempts = [(a - h.jobs.attempts[0]).total_seconds() for a in h.jobs.attempts]
        assert attempts == [0.0, 1.0, 3.0]  # 1 s, then 2 s
        (done,) = await core.runs("m")
        assert done.status is RunStatus.SUCCEEDED and done.dispatch_attempts == 3
        assert await core.dead_letters("m") == []

    run(scenario)


def test_a_dispatch_counts_as_one_failed_run_after_max_dispatch_attempts() -> None:
    async def scenario() -> None:
        h = Harness(dispatch_retry_delay=0.5, max_dispatch_attempts=3, default_retry_delay=60)
        h.jobs.unreachable = 10**6
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=1)
        await h.run_for(5)
        assert len(h.jobs.attempts) == 3
        retry, failed = await core.runs("m")
        assert failed.status is RunStatus.FAILED and failed.dispatch_attempts == 3
        assert "dispatch failed 3 time(s)" in (failed.error or "")
        # One counted failure: retried after the retry delay, not dead-lettered.
        assert retry.is_retry and retry.status is RunStatus.QUEUED
        assert await core.dead_letters("m") == []

    run(scenario)


def test_a_job_the_manager_refuses_is_a_failed_run_at_once() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.refuse = True
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await h.run_for(1)
        (refused,) = await core.runs("m")
        assert refused.status is RunStatus.FAILED and refused.error == "not a Job"
        assert len(h.jobs.attempts) == 1

    run(scenario)


def test_a_dependent_runs_after_each_new_success_of_its_parent() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("parent", "pkg.jobs:Parent", {}, Every.seconds(10))
        await core.schedule("child", JOB, {}, After(parent="parent"))
        await h.run_for(25)
        parents = sorted(await core.runs("parent"), key=lambda r: r.queued_at)
        children = sorted(await core.runs("child"), key=lambda r: r.queued_at)
        assert len(parents) == 3 and len(children) == 3
        for parent, child in zip(parents, children, strict=True):
            assert child.parent_run == parent.id
            assert child.started_at and parent.ended_at and child.started_at >= parent.ended_at

    run(scenario)


def test_trigger__never_a_second_queued_entry() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {"x": 1}, Cron(expression="0 3 * * *"))
        first = await core.trigger("m")
        second = await core.trigger("m")
        assert first.run_id is not None and second.run_id == first.run_id
        assert not second.already_dispatched
        assert len(await h.storage.queued_entries("s", "m")) == 1
        await h.run_for(1)
        assert [s.manifest_request for s in h.jobs.started] == [{"x": 1}]
        with pytest.raises(SchedulerOperationError) as unknown:
            await core.trigger("nope")
        assert unknown.value.error is SchedulerError.MANIFEST_NOT_FOUND

    run(scenario)


def test_two_requeues_of_the_same_run_race_and_exactly_one_carries_the_replay_link() -> None:
    async def scenario() -> None:
        h = always_failing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"), max_retries=5)
        await core.trigger("m")
        await h.run_for(2)
        (failed,) = await core.runs("m")
        assert failed.status is RunStatus.FAILED
        decision = Decision(run_id=failed.id, scope="s", manifest="m", question="q",
                            state_hash="h", answer=1)  # fmt: skip
        await h.storage.record_decision(decision)
        results = await asyncio.gather(
            core.requeue_execution(failed.id), core.requeue_execution(failed.id)
        )
        runs = {r.id: r for r in await core.runs("m")}
        links = [runs[r.run_id].replays for r in results]
        assert links.count(failed.id) == 1 and links.count(None) == 1
        afresh = next(r for r in results if runs[r.run_id].replays is None)
        assert afresh.message.endswith("are already replayed by another run or queued entry, "
                                       "and are replayed once.")  # fmt: skip

    run(scenario)


def test_resume_execution__one_queued_resume_per_run() -> None:
    async def scenario() -> None:
        h = always_failing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"))
        await core.trigger("m")
        await h.run_for(1.5)
        (failed,) = await core.runs("m")
        resumed = await core.resume_execution(failed.id)
        with pytest.raises(SchedulerOperationError) as refused:
            await core.resume_execution(failed.id)
        assert refused.value.error is SchedulerError.RESUME_ALREADY_QUEUED
        assert (await h.storage.get_run(resumed)).resumed_from == failed.id  # type: ignore[union-attr]

    run(scenario)


def test_acknowledge__resolves_the_dead_letter_with_its_note_once() -> None:
    async def scenario() -> None:
        h = always_failing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=0)
        await h.run_for(2)
        (letter,) = await core.dead_letters("m")
        await core.acknowledge(letter.id, "known outage")
        (done,) = await core.dead_letters("m", DeadLetterStatus.ACKNOWLEDGED)
        assert done.note == "known outage"
        with pytest.raises(SchedulerOperationError) as again:
            await core.acknowledge(letter.id, "twice")
        assert again.value.error is SchedulerError.DEAD_LETTER_ALREADY_RESOLVED

    run(scenario)


def test_schedule__a_stated_setting_is_written_an_unstated_one_keeps_its_value() -> None:
    async def scenario() -> None:
        h = Harness(default_max_retries=4)
        core = await h.start()
        new = await core.schedule("m", JOB, {}, Every.hours(1))
        assert new.max_retries == 4 and new.replay_decisions_on_retry and new.enabled
        await core.schedule("m", JOB, {}, Every.hours(1), max_retries=7,
                            replay_decisions_on_retry=False)  # fmt: skip
        kept = await core.schedule("m", JOB, {"v": 2}, Every.hours(2))
        assert kept.max_retries == 7 and not kept.replay_decisions_on_retry
        assert kept.request == {"v": 2} and kept.schedule == Every.hours(2)
        message = await core.set_replay_decisions_on_retry(["m"], True)
        assert message == "1 manifest(s) replay a failed run's decisions on retry."
        assert (await core.manifest("m")).replay_decisions_on_retry

    run(scenario)


def test_a_disabled_manifest_runs_no_more_and_its_queued_entry_is_cancelled() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"))
        queued = await core.trigger("m")
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"), enabled=False)
        await h.run_for(2)
        assert h.jobs.started == []
        (cancelled,) = await core.runs("m")
        assert cancelled.id == queued.run_id and cancelled.status is RunStatus.CANCELLED

    run(scenario)


def test_lock__a_second_scheduler_runs_nothing_and_refuses_changes_until_it_is_free() -> None:
    async def scenario() -> None:
        h = Harness()
        first = await h.start()
        second = h.new_core("holder-2")
        await second.start(loops=False)
        assert first.lock.held and not second.lock.held
        with pytest.raises(SchedulerOperationError) as refused:
            await second.schedule("m", JOB, {}, Every.hours(1))
        assert refused.value.error is SchedulerError.NOT_LOCK_HOLDER
        assert "holder-1" in str(refused.value)
        assert not await second.run_cycle() and await second.dispatch_due() == 0
        assert await second.manifests() == []  # reads are answered
        await first.close()
        assert await second.lock.keep()
        await second.schedule("m", JOB, {}, Every.hours(1))
        assert [m.name for m in await second.manifests()] == ["m"]

    run(scenario)


def test_lock__a_restarted_actor_takes_its_predecessors_lease_over_at_once() -> None:
    async def scenario() -> None:
        h = Harness()
        before = h.new_core("actor-1/0001")
        await before.start(loops=False)
        restarted = h.new_core("actor-1/0002")  # the same actor's next incarnation
        await restarted.start(loops=False)
        assert restarted.lock.held
        await restarted.schedule("m", JOB, {}, Every.hours(1))  # not NOT_LOCK_HOLDER
        assert not await before.lock.keep()  # an earlier incarnation never takes it back
        other = h.new_core("actor-2/0003")  # another actor waits for the lease to expire
        await other.start(loops=False)
        assert not other.lock.held

    run(scenario)


def test_loops__run_on_their_own_and_stop_at_close() -> None:
    async def scenario() -> None:
        h = Harness(manifest_cycle=0.02, dispatch_interval=0.01)
        core = h.core
        await core.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        for _ in range(500):
            runs = await core.runs("m")
            if runs and runs[0].status is RunStatus.SUCCEEDED:
                break
            await asyncio.sleep(0.01)
        assert runs[0].status is RunStatus.SUCCEEDED
        assert {"lock", "manifest manager", "dispatcher"} <= {
            t.get_name().split(": ")[-1] for t in core.tasks.tasks
        }
        await core.close()
        assert core.tasks.failures == {}
        assert await h.storage.get_lease("scheduler/s") is None

    run(scenario)


def test_start__warns_when_the_backoff_of_max_retries_reaches_the_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=3600, failure_count_window=7200)
        with caplog.at_level(logging.WARNING):
            await h.start()
        assert "would never be dead-lettered" in caplog.text

    run(scenario)
