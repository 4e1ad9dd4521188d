"""Rich renderings of job, step and pool state, shared by `demo`, `run`, `pools` and the `jobs`
commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from choreography_ray.core.stopping import settled
from choreography_ray.model import JobState, PoolState, StepState, utcnow
from choreography_ray.status import JobStageFailureBehavior, JobStatus, StepStatus

#: How many failed steps' messages a command shows.
FAILED_STEPS_SHOWN = 5

_STATUS_STYLE = {
    JobStatus.COMPLETED_SUCCESSFULLY: "bold green",
    JobStatus.COMPLETED_WITH_FAILURES: "bold yellow",
    JobStatus.FAILED: "bold red",
    JobStatus.STOPPED: "bold magenta",
}


def status_text(status: JobStatus) -> Text:
    return Text(status.name, style=_STATUS_STYLE.get(status, "bold"))


def status_name(stored: str) -> str:
    """A stored status value by its member name (`Running` -> RUNNING); as stored otherwise."""
    for kind in (JobStatus, StepStatus):
        try:
            return kind(stored).name
        except ValueError:
            continue
    return stored


def when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def summary(state: JobState) -> Table:
    """The job's identity and state, one field a row: what `jobs show` begins with."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    duration = job_duration(state)
    rows: list[tuple[str, str | Text]] = [
        ("Job", state.id),
        ("Type", state.type),
        ("Scope/namespace", f"{state.scope}/{state.namespace}"),
        ("Priority, fairness key", f"{state.priority}, {state.share_key}"),
        ("Status", status_text(state.status)),
        ("Created (UTC)", when(state.created)),
        ("Duration", "-" if duration is None else f"{duration.total_seconds():,.1f} s"),
        ("Stage", str(state.stage)),
    ]
    if state.status is JobStatus.STOPPED:
        rows.append(("Stop final", "yes" if state.stop_finalized else "no, steps still stop"))
    if state.resume_after is not None:
        rows.append(("Resumed after", f"stage {state.resume_after.stage} of run "
                                      f"{state.resume_after.source}"))  # fmt: skip
    if state.error:
        rows.append(("Error", Text(state.error, style="red")))
    for name, value in rows:
        table.add_row(name, value)
    return table


def history_table(state: JobState) -> Table:
    """The job's status changes, oldest first, with their messages."""
    table = Table(title="Status history", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("Time (UTC)", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Messages", overflow="fold")
    for change in state.status_changes:
        table.add_row(
            when(change.occurred), status_name(change.status),
            "\n".join(change.exception_messages) or "-",
        )  # fmt: skip
    return table


def steps_table(steps: Sequence[StepState], title: str) -> Table:
    """Steps with their attempt, type and last status change's messages (`jobs steps`)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("Step", "Stage", "Status", "Attempt", "Type", "Updated (UTC)"):
        table.add_column(column, no_wrap=column != "Type",
                         justify="right" if column in ("Stage", "Attempt") else "left")  # fmt: skip
    table.add_column("Message", overflow="fold")
    for step in steps:
        messages = step.status_changes[-1].exception_messages if step.status_changes else ()
        table.add_row(step.step_id, str(step.stage), step.status.name, str(step.attempt),
                      step.type.rpartition(":")[2], when(step.updated),
                      "\n".join(messages) or "-")  # fmt: skip
    return table


def job_duration(state: JobState) -> timedelta | None:
    """From the job's first status change to its last as stored, or to now while it runs."""
    changes = state.status_changes
    if not changes:
        return None
    at_rest = settled(state)
    return (changes[-1].occurred if at_rest else utcnow()) - changes[0].occurred


def outcome(
    state: JobState,
    elapsed: float | None = None,
    failure_behavior: Callable[[int], JobStageFailureBehavior] | None = None,
) -> Group:
    """The job's counts, one row per stage, then its status, duration and throughput.
    `elapsed` is in seconds; without it the stored status history gives the duration."""
    progress = state.progress
    if elapsed is None:
        duration = job_duration(state)
        elapsed = duration.total_seconds() if duration is not None else None
    # The stopped column only when something was stopped: a completed job has none.
    stopped = progress.stopped_steps > 0 or any(s.stopped_steps for s in progress.stages)
    table = Table(title=f"Job {state.id}", title_justify="left")
    table.add_column("Stage", justify="right")
    if failure_behavior is not None:
        table.add_column("On failure")
    for column in ("Total", "Successful", "Failed", "Unreachable", "Stopped")[
        : 5 if stopped else 4
    ]:
        table.add_column(column, justify="right")
    for stage in progress.stages:
        behavior = [failure_behavior(stage.stage).value] if failure_behavior is not None else []
        counts = (stage.total_steps, stage.successful_steps, stage.failed_steps,
                  stage.unreachable_steps, stage.stopped_steps)  # fmt: skip
        table.add_row(str(stage.stage), *behavior, *_counts(counts, stopped))
    table.add_section()
    counts = (progress.total_steps, progress.successful_steps, progress.failed_steps,
              progress.unreachable_steps, progress.stopped_steps)  # fmt: skip
    blank = [""] if failure_behavior is not None else []
    table.add_row("all", *blank, *_counts(counts, stopped), style="bold")
    summary = Text.assemble("Status ", status_text(state.status), f"   type {state.type}")
    if elapsed is not None and elapsed > 0:
        done = progress.successful_steps + progress.failed_steps + progress.unreachable_steps
        rate = done / elapsed
        summary.append(f"\nElapsed {elapsed:.2f} s   {rate:,.0f} steps/s")
    if state.error:
        summary.append(f"\nError: {state.error}", style="red")
    return Group(table, summary)


def _counts(counts: tuple[int, ...], stopped: bool) -> list[str]:
    return [f"{n:,}" for n in counts[: len(counts) if stopped else len(counts) - 1]]


def failed_steps_table(steps: Sequence[StepState], failed_total: int) -> Table:
    """The first failed (or unreachable) steps with their last status change's messages."""
    shown = list(steps)[:FAILED_STEPS_SHOWN]
    table = Table(
        title=f"Failed steps ({len(shown)} of {failed_total:,})",
        title_justify="left",
    )
    table.add_column("Step")
    table.add_column("Stage", justify="right")
    table.add_column("Status")
    table.add_column("Message", overflow="fold")
    for step in shown:
        messages = step.status_changes[-1].exception_messages if step.status_changes else ()
        table.add_row(step.step_id, str(step.stage), step.status.name, "\n".join(messages) or "-")
    return table


def jobs_table(states: Sequence[JobState]) -> Table:
    """One row per job: what `jobs list` prints. The job id is never cut: commands take it."""
    table = Table(title=f"{len(states)} job(s)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("Job", no_wrap=True, min_width=32)
    table.add_column("Status", no_wrap=True)
    table.add_column("Done", justify="right", no_wrap=True)
    table.add_column("Failed", justify="right")
    table.add_column("Type", overflow="fold")
    table.add_column("Scope/namespace", no_wrap=True)
    table.add_column("Created (UTC)", no_wrap=True)
    for state in states:
        progress = state.progress
        done = progress.successful_steps + progress.failed_steps + progress.unreachable_steps
        table.add_row(
            state.id,
            status_text(state.status),
            f"{done:,}/{progress.total_steps:,}",
            f"{progress.failed_steps + progress.unreachable_steps:,}",
            state.type.rpartition(":")[2],
            f"{state.scope}/{state.namespace}",
            state.created.strftime("%Y-%m-%d %H:%M"),
        )
    return table


def pools_table(found: Sequence[PoolState]) -> Table:
    """The pools of step hosts, one row per resource shape (`pools`, and `jobs show` for a
    running job)."""
    table = Table(title="Pools")
    for column in ("shape", "hosts", "pending", "busy", "queued", "waiting", "nodes"):
        table.add_column(column, justify="left" if column in ("shape", "nodes") else "right")
    for pool in found:
        nodes = ", ".join(node[:8] for node in pool.nodes)
        counts = (pool.hosts, pool.pending, pool.busy, pool.queued, pool.waiting)
        table.add_row(pool.shape, *map(str, counts), nodes)
    return table
