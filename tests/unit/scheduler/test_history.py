"""What a cycle reads of a manifest's history: every failure inside its window and every run
in flight, however many newer runs it has (not only the newest `HISTORY_RUNS`)."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.scheduler.manifest_manager import HISTORY_RUNS
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from tests.unit.scheduler.factory import failed, run, succeeded
from tests.unit.scheduler.harness import JOB, SUCCEEDS, Harness
from tests.unit.scheduler.harness import run as scenario_run

MINUTE = timedelta(minutes=1)


async def every_minute_with(h: Harness, *runs_oldest_first: object) -> None:
    """A manifest run every minute, whose history is `runs_oldest_first` then more successes
    than a cycle reads of its newest runs."""
    core = await h.start()
    await core.schedule("m", JOB, {"index": "docs"}, Every.minutes(1), max_retries=3)
    now = h.clock.now
    count = HISTORY_RUNS + 5
    for n in range(count):
        started = now - (count - n) * MINUTE
        await h.storage.save_run(succeeded(started, minutes=0.5, request={"index": "docs"}))
    for r in runs_oldest_first:
        await h.storage.save_run(r)  # type: ignore[arg-type]


def test_failures_in_the_window_behind_the_newest_runs_still_count() -> None:
    async def scenario() -> None:
        h = Harness()
        start = h.clock.now - 3 * (HISTORY_RUNS + 10) * MINUTE
        failures = [failed(start + n * MINUTE) for n in range(4)]  # inside the 24 h window
        await every_minute_with(h, *failures)
        await h.core.run_cycle()
        (letter,) = await h.core.dead_letters("m")
        assert letter.status is DeadLetterStatus.AWAITING_INTERVENTION
        assert letter.retry_count_at_dead_letter == 4

    scenario_run(scenario)


def test_a_running_run_behind_the_newest_runs_is_still_settled() -> None:
    async def scenario() -> None:
        h = Harness()
        old = h.clock.now - 3 * (HISTORY_RUNS + 10) * MINUTE
        running = run(RunStatus.RUNNING, old, job_id="j-old")
        h.jobs.jobs["j-old"] = SUCCEEDS
        await every_minute_with(h, running)
        await h.core.run_cycle()
        settled = await h.storage.get_run(running.id)
        assert settled is not None and settled.status is RunStatus.SUCCEEDED

    scenario_run(scenario)
