"""Operators' operations through `SchedulerCore` on the memory storage: what a requeue, a
trigger and a resume run, and how their runs count, to the letter of the spec."""

from __future__ import annotations

from datetime import timedelta

import pytest

from choreography_ray.errors import InvalidRequestError, SchedulerError, SchedulerOperationError
from choreography_ray.model import StageProgress
from choreography_ray.scheduler.core import SchedulerCore
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import Decision
from choreography_ray.scheduler.schedules import Cron, Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run

FAILS = JobView(JobStatus.FAILED)
#: Stage 0 completed (a checkpoint), stage 1 failed.
FAILS_AFTER_A_CHECKPOINT = JobView(
    JobStatus.COMPLETED_WITH_FAILURES,
    stages=(
        StageProgress(stage=0, is_started=True, total_steps=1, successful_steps=1),
        StageProgress(stage=1, is_started=True, total_steps=1, failed_steps=1),
    ),
)


async def dead_lettered_with_decisions_and_a_checkpoint(h: Harness) -> tuple[SchedulerCore, str]:
    """A manifest whose only run failed after a checkpoint, having recorded a decision, and was
    dead-lettered: the core and the dead letter's id."""
    h.jobs.ends_as = FAILS_AFTER_A_CHECKPOINT
    h.jobs.checkpointing = {JOB}
    core = await h.start()
    await core.schedule("m", JOB, {"v": 1}, Every.hours(1), max_retries=0)
    await h.run_for(0.5)
    (failed,) = await core.runs("m")
    decision = Decision(run_id=failed.id, scope="s", manifest="m", question="q",
                        state_hash="h", answer=1)  # fmt: skip
    await h.storage.record_decision(decision)
    await h.run_for(1)
    (letter,) = await core.dead_letters("m")
    assert letter.run_id == failed.id
    return core, letter.id


def test_requeue_execution__its_failure_counts_toward_no_manifests_retries() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=2)
        h.jobs.ends_as = FAILS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=0)
        await h.run_for(2)
        (letter,) = await core.dead_letters("m")
        await core.acknowledge(letter.id, "known outage")
        assert letter.run_id is not None
        again = await core.requeue_execution(letter.run_id)
        await h.run_for(3)
        requeued = await h.storage.get_run(again.run_id)
        assert requeued is not None and requeued.status is RunStatus.FAILED
        # Not the manifest's failure: no second dead letter, and no retry of it.
        assert [d.status for d in await core.dead_letters("m")] == [DeadLetterStatus.ACKNOWLEDGED]
        assert len(h.starts()) == 2

    run(scenario)


def test_trigger__a_run_in_flight_answers_and_no_second_run_starts() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = JobView(JobStatus.RUNNING)
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        await h.run_for(1)
        (running,) = await core.runs("m")
        assert running.status is RunStatus.RUNNING
        answer = await core.trigger("m")
        assert answer.run_id == running.id and answer.already_dispatched
        await h.run_for(1)
        assert len(h.starts()) == 1

    run(scenario)


def test_trigger__an_operators_queued_requeue_is_the_run_in_flight() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = FAILS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), max_retries=0)
        await h.run_for(1.5)  # it failed and is dead-lettered: nothing else is queued
        (failed,) = await core.runs("m")
        assert failed.status is RunStatus.FAILED
        again = await core.requeue_execution(failed.id)  # queued: holds no manifest key
        (letter,) = await core.dead_letters("m")
        await core.acknowledge(letter.id, "seen")  # a dead-lettered manifest is not triggered
        answer = await core.trigger("m")
        assert answer.run_id == again.run_id and answer.already_dispatched
        assert [e.run_id for e in await h.storage.queued_entries("s", "m")] == [again.run_id]

    run(scenario)


def test_requeue__replays_and_resumes_the_failed_run_when_a_retry_would() -> None:
    async def scenario() -> None:
        h = Harness()
        core, letter = await dead_lettered_with_decisions_and_a_checkpoint(h)
        requeued = await h.storage.get_run(await core.requeue(letter))
        assert requeued is not None and requeued.replays is not None
        assert requeued.resumed_from == requeued.replays

    run(scenario)


def test_requeue__an_edited_manifest_runs_its_new_input_from_the_top_asking_afresh() -> None:
    async def scenario() -> None:
        h = Harness()
        core, letter = await dead_lettered_with_decisions_and_a_checkpoint(h)
        await core.schedule("m", JOB, {"v": 2}, Every.hours(1))
        run_id = await core.requeue(letter)
        requeued = await h.storage.get_run(run_id)
        assert requeued is not None and requeued.request == {"v": 2}
        assert requeued.replays is None and requeued.resumed_from is None
        await h.run_for(0.5)
        assert h.jobs.started[-1].resume_after is None

    run(scenario)


def test_requeue__a_manifest_that_opted_out_asks_afresh() -> None:
    async def scenario() -> None:
        h = Harness()
        core, letter = await dead_lettered_with_decisions_and_a_checkpoint(h)
        await core.set_replay_decisions_on_retry(["m"], False)
        requeued = await h.storage.get_run(await core.requeue(letter))
        assert requeued is not None and requeued.replays is None
        assert requeued.resumed_from is not None  # a resume does not depend on the opt-out

    run(scenario)


async def failed_run_with_a_decision(h: Harness) -> tuple[SchedulerCore, str]:
    """A triggered run of a manifest not due again today, failed after recording a decision."""
    h.jobs.ends_as = FAILS
    core = await h.start()
    await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"), max_retries=5)
    await core.trigger("m")
    await h.run_for(1.5)
    (failed,) = await core.runs("m")
    assert failed.status is RunStatus.FAILED
    decision = Decision(run_id=failed.id, scope="s", manifest="m", question="q",
                        state_hash="h", answer=1)  # fmt: skip
    await h.storage.record_decision(decision)
    return core, failed.id


def test_requeue_execution__of_a_replay_that_never_ran_replays_the_answers_it_kept() -> None:
    async def scenario() -> None:
        h = Harness(max_dispatch_attempts=1)
        core, source = await failed_run_with_a_decision(h)
        h.jobs.unreachable = 1
        lost = await core.requeue_execution(source)
        await h.run_for(0.5)  # its only dispatch attempt never reaches the jobs manager
        never_ran = await h.storage.get_run(lost.run_id)
        assert never_ran is not None and never_ran.status is RunStatus.FAILED
        assert never_ran.started_at is None and never_ran.replays == source
        again = await core.requeue_execution(never_ran.id)
        assert again.message.endswith(f"It replays the decisions of execution {source}.")
        await h.run_for(0.5)
        started = await h.storage.get_run(again.run_id)
        assert started is not None and started.status is RunStatus.RUNNING
        assert started.replays == source and not started.replay_abandoned

    run(scenario)


def test_dispatch__a_link_to_decisions_gone_since_is_kept_as_an_abandoned_replay() -> None:
    async def scenario() -> None:
        h = Harness()
        core, source = await failed_run_with_a_decision(h)
        requeued = await core.requeue_execution(source)
        h.storage.decisions.clear()  # deleted before the requeue is dispatched
        await h.run_for(0.5)
        started = await h.storage.get_run(requeued.run_id)
        assert started is not None and started.status is RunStatus.RUNNING
        assert started.replays == source and started.replay_abandoned
        assert started.asked_itself

    run(scenario)


def test_resume_execution__refuses_a_run_that_succeeded_or_has_not_ended() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"))
        await core.trigger("m")
        await h.run_for(0.5)
        (running,) = await core.runs("m")
        await h.run_for(1)
        succeeded = await h.storage.get_run(running.id)
        assert running.status is RunStatus.RUNNING
        assert succeeded is not None and succeeded.status is RunStatus.SUCCEEDED
        for target in (running, succeeded):
            await h.storage.save_run(target)
            with pytest.raises(SchedulerOperationError) as refused:
                await core.resume_execution(target.id)
            assert refused.value.error is SchedulerError.RUN_NOT_RESUMABLE
        assert await h.storage.queued_entries("s") == []

    run(scenario)


def test_a_checkpoint_lookup_that_fails_reruns_the_retry_from_the_top() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=0)
        h.jobs.ends_as = FAILS_AFTER_A_CHECKPOINT
        h.jobs.checkpointing = {JOB}

        async def unreadable(run_id: str) -> list[object]:
            raise OSError("the checkpoints cannot be read")

        h.storage.list_checkpoints = unreadable  # type: ignore[method-assign,assignment]
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        await h.run_for(1.5)  # the first run fails; the cycle plans its retry
        retry, first = await core.runs("m")
        assert first.status is RunStatus.FAILED
        assert retry.is_retry and retry.resumed_from is None

    run(scenario)


@pytest.mark.parametrize("answer", ["lost", "past the deadline"])
def test_dispatch__a_start_whose_answer_never_came_is_that_job_never_a_second(answer: str) -> None:
    async def scenario() -> None:
        h = Harness(dispatch_timeout=0.05)
        h.jobs.ends_as = JobView(JobStatus.RUNNING)
        if answer == "lost":
            h.jobs.lost_answers = 1
        else:
            h.jobs.slow = {"default"}
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        await h.run_for(30)
        (only,) = await core.runs("m")
        assert only.status is RunStatus.RUNNING
        assert [s.job_id for s in h.jobs.started] == [only.job_id]

    run(scenario)


def test_dispatch__a_stuck_jobs_manager_holds_up_no_other_namespace() -> None:
    async def scenario() -> None:
        h = Harness(dispatch_timeout=0.05)
        h.jobs.ends_as = JobView(JobStatus.RUNNING)
        h.jobs.stuck = {"stuck"}
        core = await h.start()
        for name, namespace in (("a1", "stuck"), ("a2", "stuck"), ("b", "default")):
            await core.schedule(name, JOB, {}, Every.hours(1), namespace=namespace)
        await h.run_for(0.5)  # one cycle, one dispatch: a1 times out, a2 waits, b starts
        status = {r.manifest: r.status for r in await core.runs()}
        assert status == {"a1": RunStatus.DISPATCH_REQUEUED, "a2": RunStatus.QUEUED,
                          "b": RunStatus.RUNNING}  # fmt: skip
        assert len(h.jobs.attempts) == 2  # a2's start was not tried behind a1's
        # ... and used up no dispatch attempt (issue 36, item 9): it is due at the next one.
        (a2,) = await h.storage.queued_entries("s", "a2")
        assert a2.dispatch_attempts == 0 and a2.scheduled_at is None
        assert (await core.trigger("b")).already_dispatched  # operations move too

    run(scenario)


@pytest.mark.parametrize(
    "settings",
    [{"failure_window": timedelta(0)}, {"failure_window": timedelta(hours=-1)},
     {"max_retries": -1}],
)  # fmt: skip
def test_schedule__a_setting_out_of_range_is_the_callers_error(settings: dict[str, object]) -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        with pytest.raises(InvalidRequestError):
            await core.schedule("m", JOB, {}, Every.hours(1), **settings)
        assert await core.manifests() == []

    run(scenario)


async def dead_lettered_manifests(h: Harness, *names: str) -> SchedulerCore:
    """Manifests dead-lettered on their first failure."""
    h.jobs.ends_as = FAILS
    core = await h.start()
    for name in names:
        await core.schedule(name, JOB, {}, Every.hours(1), max_retries=0)
    await h.run_for(1.5)
    assert len(await core.dead_letters(status=DeadLetterStatus.AWAITING_INTERVENTION)) == len(names)
    return core


def test_requeue_all__every_awaiting_dead_letter_of_the_scope_or_of_a_manifest() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await dead_lettered_manifests(h, "a", "b", "c")
        assert len(await core.requeue_all("a")) == 1
        run_ids = await core.requeue_all()
        assert len(run_ids) == 2
        assert {r.manifest for r in await core.runs() if r.id in run_ids} == {"b", "c"}
        assert {d.status for d in await core.dead_letters()} == {DeadLetterStatus.RETRIED}
        assert await core.requeue_all() == []
        with pytest.raises(SchedulerOperationError) as unknown:
            await core.requeue_all("nope")
        assert unknown.value.error is SchedulerError.MANIFEST_NOT_FOUND

    run(scenario)


def test_acknowledge_all__every_awaiting_dead_letter_with_the_note() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await dead_lettered_manifests(h, "a", "b")
        assert await core.acknowledge_all("a", note="known outage") == 1
        assert await core.acknowledge_all(note="all seen") == 1
        notes = {d.manifest: (d.status, d.note) for d in await core.dead_letters()}
        assert notes == {"a": (DeadLetterStatus.ACKNOWLEDGED, "known outage"),
                         "b": (DeadLetterStatus.ACKNOWLEDGED, "all seen")}  # fmt: skip
        assert await core.acknowledge_all(note="again") == 0

    run(scenario)


@pytest.mark.parametrize("stated", ["on the manifest", "by default"])
def test_timeout__a_run_past_it_is_stopped_and_settled_cancelled(stated: str) -> None:
    async def scenario() -> None:
        h = Harness(**({} if stated == "on the manifest" else {"default_run_timeout": 10}))
        h.jobs.ends_as = JobView(JobStatus.RUNNING)  # it never ends on its own
        core = await h.start()
        limit = {"timeout": timedelta(seconds=10)} if stated == "on the manifest" else {}
        await core.schedule("m", JOB, {}, Every.hours(1), **limit)  # type: ignore[arg-type]
        await h.run_for(9)
        (running,) = await core.runs("m")
        assert running.status is RunStatus.RUNNING and h.jobs.stopped == []
        await h.run_for(3)
        (cancelled,) = await core.runs("m")
        assert h.jobs.stopped == [running.job_id]
        assert cancelled.status is RunStatus.CANCELLED and cancelled.timed_out_at is not None
        assert not cancelled.is_retry and await core.dead_letters() == []  # no failure

    run(scenario)
