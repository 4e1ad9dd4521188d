"""`decide`'s logic without Ray: `RunDecisions` and `JobDecisions` on the memory storage, and a
retry that replays a failed run's answers once through `SchedulerCore` with a fake jobs port."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from choreography_ray.scheduler.deciding import JobDecisions, RunDecisions
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import ManifestRun
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import RunStatus
from choreography_ray.status import JobStatus
from choreography_ray.step import StepContext
from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage
from tests.unit.scheduler.harness import JOB, Clock, Harness, run

DAY = timedelta(hours=24)


class Lead(BaseModel):
    name: str
    score: float


class Verdict(BaseModel):
    pick: str


class Asker:
    """An `ask` that counts its calls and answers `answer` (awaitably when `awaitable`)."""

    def __init__(self, answer: Any, awaitable: bool = False) -> None:
        self.answer = answer
        self.awaitable = awaitable
        self.calls = 0
        self.threads: list[str] = []

    def __call__(self) -> Any:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        if self.awaitable:
            return self._later()
        return self.answer

    async def _later(self) -> Any:
        await asyncio.sleep(0)
        return self.answer


def a_run(**fields: Any) -> ManifestRun:
    return ManifestRun.model_validate({"scope": "s", "manifest": "m", "job_type": JOB, **fields})


async def stored(clock: Clock | None = None) -> MemorySchedulerStorage:
    return MemorySchedulerStorage(clock or Clock())


async def decisions_of(
    storage: MemorySchedulerStorage, run: ManifestRun, clock: Clock | None = None
) -> RunDecisions:
    await storage.save_run(run)
    return await RunDecisions.load(storage, run, DAY, clock or storage.clock)


# --- one run ---------------------------------------------------------------------------------


def test_a_run_that_asks_itself__records_the_answer_once_and_keeps_the_first() -> None:
    async def scenario() -> None:
        storage = await stored()
        first = a_run()
        decider = await decisions_of(storage, first)
        ask = Asker(Verdict(pick="a"), awaitable=True)
        lead = Lead(name="ada", score=0.5)
        assert await decider.decide("which?", lead, ask) == {"pick": "a"}
        # Asked the same way about the same state (a dict that hashes the same): recorded.
        again = Asker("other")
        assert await decider.decide("which?", {"score": 0.5, "name": "ada"}, again) == {"pick": "a"}
        assert again.calls == 0 and ask.calls == 1
        (decision,) = await storage.list_decisions(first.id)
        assert decision.answer == {"pick": "a"} and not decision.replayed
        assert (decision.scope, decision.manifest) == ("s", "m")
        # Another state or another question asks.
        assert await decider.decide("which?", Lead(name="bob", score=0.5), Asker(1)) == 1
        assert await decider.decide("why?", lead, Asker([1, 2])) == [1, 2]
        assert await storage.count_decisions(first.id) == 3
        # A run looked up again (another step host) sees the recorded answers.
        reloaded = await RunDecisions.load(storage, first, DAY, storage.clock)
        assert await reloaded.decide("which?", lead, again, Verdict) == Verdict(pick="a")
        assert again.calls == 0

    run(scenario)


def test_an_answer_is_stored_as_json_and_validated_into_answer_type() -> None:
    async def scenario() -> None:
        storage = await stored()
        decider = await decisions_of(storage, a_run())
        lead = {"n": 1}
        answer = await decider.decide("when?", lead, Asker(timedelta(seconds=90)))
        assert answer == "PT1M30S"  # pydantic's JSON form
        assert await decider.decide("when?", lead, Asker(0), timedelta) == timedelta(seconds=90)
        assert await decider.decide("v?", lead, Asker(Verdict(pick="x")), Verdict) == Verdict(
            pick="x"
        )
        with pytest.raises(Exception, match="Unable to serialize"):
            await decider.decide("bad?", lead, Asker(object()))
        assert await storage.count_decisions(decider.run.id) == 2  # nothing for the bad one

    run(scenario)


# --- a retry ---------------------------------------------------------------------------------


def test_a_retry_replays_each_answer_asked_the_same_way_about_the_same_state() -> None:
    async def scenario() -> None:
        clock = Clock()
        storage = await stored(clock)
        failed = a_run(status=RunStatus.FAILED)
        source = await decisions_of(storage, failed)
        lead = Lead(name="ada", score=0.5)
        await source.decide("which?", lead, Asker("a"))
        await source.decide("score?", lead, Asker(0.9))
        clock.now += timedelta(hours=1)
        retry = await decisions_of(storage, a_run(is_retry=True, replays=failed.id))
        ask = Asker("fresh")
        assert await retry.decide("which?", lead, ask) == "a"
        assert ask.calls == 0
        # Each answer is checked one by one: another state, another question asks afresh.
        assert await retry.decide("which?", Lead(name="ada", score=0.6), ask) == "fresh"
        assert await retry.decide("other?", lead, ask) == "fresh"
        assert ask.calls == 2
        recorded = {
            d.question + str(d.answer): d for d in await storage.list_decisions(retry.run.id)
        }
        assert recorded["which?a"].replayed
        assert not recorded["which?fresh"].replayed
        # A replayed answer is this run's now: asked again, it is not replayed again.
        assert await retry.decide("which?", lead, ask) == "a" and ask.calls == 2
        # The failed run's answers are unchanged.
        assert await storage.count_decisions(failed.id) == 2

    run(scenario)


def test_an_answer_older_than_replay_answers_for_is_asked_afresh() -> None:
    async def scenario() -> None:
        clock = Clock()
        storage = await stored(clock)
        failed = a_run(status=RunStatus.FAILED)
        await (await decisions_of(storage, failed)).decide("q", {}, Asker("old"))
        clock.now += DAY
        retry = await decisions_of(storage, a_run(replays=failed.id))
        assert await retry.decide("q", {}, Asker("new")) == "new"

    run(scenario)


def test_a_run_whose_replay_was_abandoned_or_that_names_no_run_asks_afresh() -> None:
    async def scenario() -> None:
        storage = await stored()
        failed = a_run(status=RunStatus.FAILED)
        await (await decisions_of(storage, failed)).decide("q", {}, Asker("old"))
        abandoned = await decisions_of(storage, a_run(replays=failed.id, replay_abandoned=True))
        assert await abandoned.decide("q", {}, Asker("new")) == "new"
        gone = await decisions_of(storage, a_run(replays="a-deleted-run"))
        assert await gone.decide("q", {}, Asker("new")) == "new"

    run(scenario)


# --- a step host's JobDecisions ----------------------------------------------------------------


class CountingStorage(MemorySchedulerStorage):
    def __init__(self) -> None:
        super().__init__(Clock())
        self.lookups = 0
        self.fail_lookups = 0

    async def run_for_job(self, job_id: str) -> ManifestRun | None:
        self.lookups += 1
        if self.fail_lookups:
            self.fail_lookups -= 1
            raise ConnectionError("storage is down")
        return await super().run_for_job(job_id)


def job_decisions(storage: MemorySchedulerStorage) -> JobDecisions:
    return JobDecisions(lambda: storage, DAY, asyncio.get_running_loop())


def test_a_job_that_is_no_scheduler_run__decide_returns_asks_answer_and_records_nothing() -> None:
    async def scenario() -> None:
        storage = CountingStorage()
        jobs = job_decisions(storage)
        context = StepContext("job-1", "step-1", 0, 1, jobs)
        answer = Verdict(pick="a")
        assert await context.decide("q", {}, Asker(answer, awaitable=True)) is answer
        assert await context.decide("q", {}, Asker("b")) == "b"
        assert storage.decisions == {}
        assert storage.lookups == 1  # found once per job

    run(scenario)


def test_a_jobs_run_is_found_once_shared_by_its_steps_and_forgotten_with_the_job() -> None:
    async def scenario() -> None:
        storage = CountingStorage()
        started = a_run(job_id="job-1", status=RunStatus.RUNNING)
        await storage.save_run(started)
        jobs = job_decisions(storage)
        steps = [StepContext("job-1", f"step-{n}", 0, 1, jobs) for n in range(3)]
        ask = Asker("a")
        answers = await asyncio.gather(*(s.decide("q", {"x": 1}, ask) for s in steps))
        assert answers == ["a"] * 3
        assert storage.lookups == 1
        assert ask.calls == 1  # one step asked; the others found its answer
        jobs.forget("job-1")
        assert await steps[0].decide("q", {"x": 1}, ask) == "a"
        assert storage.lookups == 2 and ask.calls == 1

    run(scenario)


def test_a_lookup_that_fails_asks_without_recording_and_the_next_looks_again() -> None:
    async def scenario() -> None:
        storage = CountingStorage()
        await storage.save_run(a_run(job_id="job-1", status=RunStatus.RUNNING))
        storage.fail_lookups = 1
        context = StepContext("job-1", "s", 0, 1, job_decisions(storage))
        assert await context.decide("q", {}, Asker("a")) == "a"
        assert storage.decisions == {}
        assert await context.decide("q", {}, Asker("b")) == "b"
        assert storage.lookups == 2 and len(storage.decisions) == 1

    run(scenario)


def test_decide_sync__asks_in_the_worker_thread_and_stores_on_the_hosts_loop() -> None:
    async def scenario() -> None:
        storage = await stored()
        failed = a_run(job_id="job-0", status=RunStatus.FAILED)
        await storage.save_run(failed)
        jobs = job_decisions(storage)
        first = StepContext("job-0", "s", 0, 1, jobs)
        ask = Asker(Verdict(pick="a"))
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(
            None, lambda: first.decide_sync("q", {}, ask, answer_type=Verdict)
        )
        assert answer == Verdict(pick="a")
        assert ask.calls == 1 and ask.threads[0] != threading.current_thread().name
        await storage.save_run(a_run(job_id="job-1", replays=failed.id, is_retry=True))
        retry = StepContext("job-1", "s", 0, 1, jobs)
        assert await loop.run_in_executor(None, retry.decide_sync, "q", {}, ask) == {"pick": "a"}
        awaitable = Asker("x", awaitable=True)
        assert await loop.run_in_executor(None, retry.decide_sync, "r", {}, awaitable) == "x"
        assert ask.calls == 1 and awaitable.calls == 1
        with pytest.raises(RuntimeError, match="await decide"):
            retry.decide_sync("q", {}, ask)

    run(scenario)


def test_a_context_outside_a_step_host__decide_returns_asks_answer() -> None:
    context = StepContext("job", "step", 0, 1)
    assert context.decide_sync("q", {}, Asker(3)) == 3
    assert asyncio.run(context.decide("q", {}, Asker(4, awaitable=True))) == 4


# --- through the scheduler ---------------------------------------------------------------------


def test_a_retry_of_a_failed_run_replays_its_answers_once_and_the_next_asks_afresh() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=2)
        h.jobs.ends_as = JobView(JobStatus.FAILED)
        jobs = JobDecisions(lambda: h.storage, DAY, asyncio.get_running_loop())
        ask = Asker("answer")
        answers: list[Any] = []

        async def step(job_id: str) -> None:  # the job's step, while its job starts
            context = StepContext(job_id, "step", 0, 1, jobs)
            answers.append(await context.decide("which?", {"lead": "ada"}, ask))

        h.jobs.on_start = step
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=3)
        await h.run_for(12)
        runs = list(reversed(await core.runs("m")))
        assert len(runs) >= 3, runs
        first, retry, after = runs[:3]
        assert first.replays is None
        assert retry.is_retry and retry.replays == first.id
        assert after.is_retry and after.replays is None  # replayed into a failure: afresh
        started = [r for r in runs if r.job_id is not None and r.status is not RunStatus.QUEUED]
        assert len(answers) == len(started) and answers == ["answer"] * len(started)
        # Every started run asked but those that replayed.
        assert ask.calls == sum(r.replays is None for r in started)
        (replayed,) = await h.storage.list_decisions(retry.id)
        assert replayed.replayed
        if len(runs) > 3:  # the run after asked itself: its answers replay once again
            assert runs[3].replays == after.id

    run(scenario)


def test_a_run_is_linked_to_its_job_before_it_starts_and_keeps_the_id_if_it_never_does() -> None:
    async def scenario() -> None:
        h = Harness()
        seen: list[ManifestRun | None] = []

        async def step(job_id: str) -> None:
            seen.append(await h.storage.run_for_job(job_id))

        h.jobs.on_start = step
        h.jobs.unreachable = 1
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await h.run_for(1)
        (requeued,) = await core.runs("m")
        # It keeps the id it chose: the next attempt starts that id (a late start is found).
        assert requeued.status is RunStatus.DISPATCH_REQUEUED and requeued.job_id is not None
        await h.run_for(10)
        (started,) = await core.runs("m")
        assert started.job_id == requeued.job_id and [r and r.id for r in seen] == [started.id]

    run(scenario)


def test_a_run_an_activation_claimed_and_linked_but_never_started_is_handed_back() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await core.run_cycle()
        # An activation claims the entry and links the run to a job id, then dies.
        (entry,) = await h.storage.claim_due("s")
        run_ = await h.storage.get_run(entry.run_id)
        assert run_ is not None
        await h.storage.save_run(run_.model_copy(update={"job_id": "never-started"}))
        await core.run_cycle()
        handed_back = await h.storage.get_run(entry.run_id)
        assert handed_back is not None and handed_back.status is RunStatus.DISPATCH_REQUEUED
        await h.run_for(10)  # dispatched again, with the id it chose
        (started,) = await core.runs("m")
        assert started.status is RunStatus.SUCCEEDED and started.job_id == "never-started"
        assert [s.job_id for s in h.jobs.started] == ["never-started"]

    run(scenario)


def test_a_run_whose_job_an_activation_started_before_it_died_is_that_jobs_run() -> None:
    """The activation started the job and died before it saved the run RUNNING: the next
    cycle finds the job it chose and settles the run with it, never starting a second."""

    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await core.run_cycle()
        (entry,) = await h.storage.claim_due("s")
        run_ = await h.storage.get_run(entry.run_id)
        assert run_ is not None
        await h.storage.save_run(run_.model_copy(update={"job_id": "started"}))
        h.jobs.jobs["started"] = JobView(JobStatus.RUNNING)
        await h.run_for(5)
        adopted = await h.storage.get_run(entry.run_id)
        assert adopted is not None and adopted.status is RunStatus.RUNNING
        assert adopted.job_id == "started" and h.jobs.started == []
        h.jobs.jobs["started"] = JobView(JobStatus.COMPLETED_SUCCESSFULLY)
        await core.run_cycle()
        assert (await h.storage.get_run(entry.run_id)).status is RunStatus.SUCCEEDED  # type: ignore[union-attr]

    run(scenario)
