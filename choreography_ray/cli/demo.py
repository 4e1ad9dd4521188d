"""`choreography-ray demo`: run the built-in demo job and show how it went.

It starts `choreography_ray.examples.demo:DemoJob` (set-up, a fan-out in which 1 % of the steps
fail, a final step), shows a progress bar while it runs, then the outcome per stage and the
messages of a few failed steps.
"""

from __future__ import annotations

import time
from typing import Annotated

import ray
import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

import choreography_ray as cr
from choreography_ray.cli._cluster import init_ray
from choreography_ray.cli._common import (
    ExitCode,
    check_storage,
    console,
    err_console,
    fail,
    resolve_storage,
)
from choreography_ray.cli._options import AddressOption, StorageOption
from choreography_ray.cli._render import failed_steps_table, outcome
from choreography_ray.core.stopping import settled
from choreography_ray.examples.demo import DemoJob, DemoRequest
from choreography_ray.runtime.names import DEFAULT_NAMESPACE
from choreography_ray.status import StepStatus

#: The jobs manager the demo runs under: `choreography-ray list --scope demo` finds its jobs.
DEMO_SCOPE = "demo"
DEMO_NAMESPACE = "default"
#: How often the progress bar reads the job, in seconds.
POLL_SECONDS = 0.25


def demo(
    steps: Annotated[
        int,
        typer.Option("--steps", min=3, max=1_000_000, help="Steps in the job, all stages."),
    ] = 3_000,
    storage: StorageOption = None,
    address: AddressOption = None,
) -> None:
    """Run the built-in demo job: 3 stages, 1 % of the fan-out fails; show progress and outcome."""
    url = resolve_storage(storage)
    check_storage(url)
    console.print(f"Connecting to Ray (storage {url}) ...", highlight=False, soft_wrap=True)
    init_ray(address, DEFAULT_NAMESPACE)
    try:
        _run_demo(steps, url, address)
    finally:
        ray.shutdown()


def _run_demo(steps: int, url: str, address: str | None) -> None:
    with cr.Jobs.connect(storage=url, address=address) as jobs:
        manager = jobs.manager(DEMO_SCOPE, DEMO_NAMESPACE)
        began = time.monotonic()
        try:
            started = manager.start(DemoJob, DemoRequest(steps=steps))
        except cr.ChoreographyError as error:
            fail(f"the demo job did not start: {error}", ExitCode.JOB_NOT_SUCCESSFUL)
        console.print(f"Started job {started.job_id} ({steps:,} steps)", highlight=False)
        if started.error is not None:
            err_console.print(f"warning: {started.error.name} when starting the first stage")
        try:
            with Progress(
                TextColumn("{task.description:<21}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("[red]{task.fields[failed]:,} failed"),
                TimeElapsedColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("PreparingJob", total=steps, failed=0)
                while True:
                    state = manager.get(started.job_id)
                    counts = state.progress
                    failed = counts.failed_steps + counts.unreachable_steps
                    bar.update(
                        task,
                        description=state.status.value,
                        total=counts.total_steps or steps,
                        completed=counts.successful_steps + failed,
                        failed=failed,
                    )
                    if settled(state):
                        break
                    time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            console.print(f"Interrupted: stopping job {started.job_id}")
            manager.stop(started.job_id)
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        elapsed = time.monotonic() - began
        failed_steps = [
            s
            for s in manager.steps(started.job_id)
            if s.status.is_failure or s.status is StepStatus.UNREACHABLE
        ]

    console.print()
    console.print(outcome(state, elapsed, DemoJob().get_failure_behavior_for))
    if failed_steps:
        console.print()
        console.print(failed_steps_table(failed_steps, len(failed_steps)))
    console.print()
    console.print(
        f"Inspect it again: choreography-ray jobs show {state.id} --storage {url}",
        highlight=False,
        soft_wrap=True,
    )
    # The demo is meant to end with failures: any terminal status is a demo that ran through.
    # A job stopped by someone else (`manager.stop`) did not.
    if not state.status.is_terminal:
        raise typer.Exit(ExitCode.JOB_NOT_SUCCESSFUL)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
