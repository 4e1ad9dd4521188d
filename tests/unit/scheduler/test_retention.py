"""Issue 36, items 1 and 11: the scheduler's metadata cleanup. Resolved dead letters past
their retention go, but each manifest's latest resolution stays (before, an acknowledged
one-off ran again once its dead letter was cleaned up); runs past `runs_kept` and
`run_retention` go with their decisions, checkpoints and entries, unless something still
needs them (`retention.needed`, test_retention_rules.py)."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.records import Decision
from choreography_ray.scheduler.schedules import Every, OnceAt
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.factory import T0, run
from tests.unit.scheduler.harness import JOB, Harness
from tests.unit.scheduler.harness import run as scenario_run

DAY = timedelta(days=1)


async def cycles(h: Harness, n: int = 3) -> None:
    for _ in range(n):
        await h.core.lock.keep()
        await h.core.run_cycle()
        await h.core.dispatch_due()
        h.clock.advance(1)


def test_an_acknowledged_one_off_stays_settled_after_its_dead_letter_is_cleaned_up() -> None:
    async def scenario() -> None:
        h = Harness(dead_letter_retention=3600, run_cleanup_interval=1, run_retention=60)
        h.jobs.ends_as = JobView(JobStatus.FAILED)
        core = await h.start()
        await core.schedule("once", JOB, {}, OnceAt(at=T0), max_retries=0)
        await cycles(h)
        (letter,) = await core.dead_letters("once")
        await core.acknowledge(letter.id, "done by hand")
        started = len(h.jobs.started)

        h.clock.advance(30 * 86400)
        await cycles(h)

        assert len(h.jobs.started) == started, "the one-off did not run again"
        assert [d.id for d in await core.dead_letters("once")] == [letter.id]

    scenario_run(scenario)


def test_a_requeued_manifests_set_aside_failures_stay_set_aside_after_the_cleanup() -> None:
    """A failure window longer than the dead letters' retention: the failures the requeue
    set aside must not count again once the resolved dead letter is cleaned up."""

    async def scenario() -> None:
        h = Harness(dead_letter_retention=60, run_cleanup_interval=1, default_retry_delay=0,
                    failure_count_window=30 * 86400)  # fmt: skip
        h.jobs.ends_as = JobView(JobStatus.FAILED)
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), max_retries=1)
        await cycles(h, 6)
        (letter,) = await core.dead_letters("m")
        h.jobs.ends_as = JobView(JobStatus.COMPLETED_SUCCESSFULLY)
        await core.requeue(letter.id)
        await cycles(h)
        h.clock.advance(120)
        await cycles(h)

        assert [d.status for d in await core.dead_letters("m")] == [DeadLetterStatus.RETRIED]

    scenario_run(scenario)


def test_runs_past_their_retention_are_deleted_with_their_decisions() -> None:
    async def scenario() -> None:
        h = Harness(runs_kept=5, run_retention=600, run_cleanup_interval=60,
                    manifest_cycle=1, dispatch_interval=1)  # fmt: skip
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(1))
        await h.run_for(120)
        first = (await core.runs("m"))[-1]
        await h.storage.record_decision(Decision(run_id=first.id, scope="s", manifest="m",
                                                 question="q", state_hash="h"))  # fmt: skip
        await h.run_for(3600)

        runs = await core.runs("m", limit=1000)
        # The newest 5, and those that ended in the last 10 minutes (one a minute), at most.
        assert 5 <= len(runs) <= 13
        assert await h.storage.get_run(first.id) is None
        assert await h.storage.list_decisions(first.id) == []
        assert len(h.storage.entries) == len(runs)

    scenario_run(scenario)


def test_with_the_defaults_runs_past_the_newest_100_and_30_days_are_deleted() -> None:
    """Before, runs were never deleted: 150 runs of two months ago stayed for good."""

    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        old = [
            run(RunStatus.SUCCEEDED, T0 - timedelta(days=60, hours=i), minutes=1)
            for i in range(150)
        ]
        for each in old:
            await h.storage.save_run(each)
        await h.storage.record_decision(Decision(run_id=old[-1].id, scope="s", manifest="m",
                                                 question="q", state_hash="h"))  # fmt: skip
        await cycles(h, 1)

        kept = await core.runs("m", limit=1000)
        assert [r.id for r in kept] == [r.id for r in old[:100]]  # the newest 100
        assert await h.storage.list_decisions(old[-1].id) == []

    scenario_run(scenario)
