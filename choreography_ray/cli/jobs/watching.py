"""`jobs watch ID`: a job's progress per stage, live, until it settles.

It polls the job's record in storage (opened read-only, no Ray), every `--interval` seconds: a
bar for the whole job and one per stage as the plan names them, each with its count, failures,
rate (steps with an outcome per second, over the last 30 s) and the time left at that rate.
It returns when the job is terminal or its stop is final, prints the outcome table, and exits
as `run` does: 0 for COMPLETED_SUCCESSFULLY, 1 for any other end.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from choreography_ray.cli._common import (
    ExitCode,
    console,
    exit_code_for,
    fail,
    note,
    open_stored,
    read_job,
    where,
)
from choreography_ray.cli._options import (
    JobIdArgument,
    JobNamespaceCheck,
    JobScopeCheck,
    StorageOption,
)
from choreography_ray.cli._render import outcome
from choreography_ray.core.stopping import settled
from choreography_ray.model import JobState
from choreography_ray.storage import Storage

#: Seconds between two reads of the job unless `--interval` says otherwise.
DEFAULT_INTERVAL = 1.0


class RateColumn(ProgressColumn):
    """Steps with an outcome per second, as rich estimates it from the recent updates."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.0f}/s", style="cyan")


def _done(total: int, successful: int, failed: int, unreachable: int) -> int:
    return min(total, successful + failed + unreachable)


class Bars:
    """The bars of one job: the whole job first, then a bar per stage, added as they appear."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.job = progress.add_task("PreparingJob", total=None, failed=0)
        self.stages: dict[int, TaskID] = {}

    def update(self, state: JobState) -> None:
        counts = state.progress
        failed = counts.failed_steps + counts.unreachable_steps
        self.progress.update(
            self.job,
            description=f"{state.status.value}",
            total=counts.total_steps or None,
            completed=_done(counts.total_steps, counts.successful_steps, counts.failed_steps,
                            counts.unreachable_steps),
            failed=failed,
        )  # fmt: skip
        for stage in counts.stages:
            task = self.stages.get(stage.stage)
            if task is None:
                task = self.stages[stage.stage] = self.progress.add_task("", failed=0)
            waiting = "" if stage.is_started else " (waiting)"
            self.progress.update(
                task,
                description=f"  stage {stage.stage}{waiting}",
                total=stage.total_steps,
                completed=_done(stage.total_steps, stage.successful_steps, stage.failed_steps,
                                stage.unreachable_steps),
                failed=stage.failed_steps + stage.unreachable_steps,
            )  # fmt: skip


async def follow(store: Storage, state: JobState, interval: float) -> JobState | None:
    """Reads the job every `interval` s and redraws its bars; returns it once settled, or None
    when it is gone (removed)."""
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("[red]{task.fields[failed]:,} failed"),
        RateColumn(),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        bars = Bars(progress)
        while True:
            bars.update(state)
            if settled(state):
                return state
            await asyncio.sleep(interval)
            next_state = await store.get_job(state.id)
            if next_state is None:
                return None
            state = next_state


def watch(
    job_id: JobIdArgument,
    storage: StorageOption = None,
    scope: JobScopeCheck = None,
    namespace: JobNamespaceCheck = None,
    interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between two reads of the job.")
    ] = DEFAULT_INTERVAL,
) -> None:
    """Follow a job live: progress per stage, failures, rate and time left, until it ends.

    Exit codes: 0 the job completed successfully; 1 it ended otherwise (or was removed);
    2 no such job; 130 interrupted (the job runs on)."""
    store = open_stored(storage, "jobs watch")

    async def run() -> tuple[bool, JobState | None]:
        try:
            first = await read_job(store, job_id, scope, namespace)
            if first is None:
                return False, None
            return True, await follow(store, first, interval)
        finally:
            await store.close()

    try:
        found, state = asyncio.run(run())
    except KeyboardInterrupt:
        note(f"stopped watching; job {job_id} runs on")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if not found:
        fail(f"no job {job_id} in {where(store, scope, namespace)}")
    if state is None:
        fail(f"job {job_id} was removed", ExitCode.JOB_NOT_SUCCESSFUL)
    console.print()
    console.print(outcome(state))
    raise typer.Exit(exit_code_for(state.status))
