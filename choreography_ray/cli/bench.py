"""`choreography-ray bench`: the durable job against bare Ray tasks, in one run.

The measuring lives in `choreography_ray.bench` (`harness.py`), so an installed wheel runs it as
a checkout does; this command only parses options and prints. docs/benchmarks.md explains the
columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from choreography_ray.cli._common import (
    check_storage,
    console,
    err_console,
    resolve_storage,
)


def bench(
    steps: Annotated[
        list[int] | None,
        typer.Option(
            "--steps",
            min=1,
            metavar="N",
            help="Steps per job; repeat for several sizes.",
            show_default="10000",
        ),
    ] = None,
    stages: Annotated[int, typer.Option(min=1, help="Stages the steps are spread over.")] = 1,
    storage: Annotated[
        list[str] | None,
        typer.Option(
            "--storage",
            metavar="URL",
            help="Storage URL (sqlite:///path.db, mongodb://host/db, memory://); repeatable.",
            show_default="an SQLite file in a temporary directory",
        ),
    ] = None,
    leases: Annotated[
        bool, typer.Option("--leases/--no-leases", help="Step leases on (a 30 s timeout) or off.")
    ] = True,
    window: Annotated[
        int | None,
        typer.Option(min=1, metavar="N", help="At most N steps running at once per job."),
    ] = None,
    step_ms: Annotated[
        float, typer.Option(min=0, help="Simulated work per step, in milliseconds.")
    ] = 0.0,
    fail_rate: Annotated[
        float, typer.Option(min=0, max=1, help="Share of steps that fail, e.g. 0.01.")
    ] = 0.0,
    repeat: Annotated[
        int, typer.Option(min=1, help="Rounds; odd rounds run in the reverse order.")
    ] = 1,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare/--no-compare",
            help="Run the comparison rounds (durable, bare tasks, actors, storage ceiling).",
        ),
    ] = True,
    bare: Annotated[
        bool,
        typer.Option(
            "--bare/--no-bare",
            help="In the rounds, also run as many bare Ray tasks (--no-bare: the durable job "
            "without them, for 10,000,000 steps).",
        ),
    ] = True,
    ceiling: Annotated[
        bool,
        typer.Option(
            "--ceiling/--no-ceiling", help="In the rounds, also measure the storage ceiling."
        ),
    ] = True,
    actor_sample: Annotated[
        int, typer.Option(min=0, help="Actors in the one-actor-per-step sample; 0 skips it.")
    ] = 200,
    resume_halfway: Annotated[
        bool,
        typer.Option(
            "--resume-halfway",
            help="Also run each job with its job actor killed halfway, and resumed.",
        ),
    ] = False,
    latency: Annotated[
        int,
        typer.Option("--latency", min=0, metavar="N", help="Also time N 1-step jobs (p50, warm)."),
    ] = 0,
    metrics_overhead: Annotated[
        bool,
        typer.Option(
            "--metrics-overhead",
            help="Also run each job with metrics on and off (JobsOptions.metrics), per round.",
        ),
    ] = False,
    stall_seconds: Annotated[
        float,
        typer.Option(
            min=1,
            help="Seconds without a change of a job's status or progress after which it counts "
            "as stalled (a 10,000,000-step plan is written for minutes in PREPARING_JOB).",
        ),
    ] = 300.0,
    json_file: Annotated[
        Path | None,
        typer.Option("--json", metavar="FILE", help="Write every measurement to FILE as JSON."),
    ] = None,
    plot_file: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE.png",
            help="Draw time per step against steps (needs the `bench` extra: matplotlib).",
        ),
    ] = None,
) -> None:
    """Benchmark the durable job against bare Ray tasks, actors and the storage, in one run.

    It starts its own local Ray. See docs/benchmarks.md for what each column means.
    """
    # Imported here: they import Ray, which the CLI's other commands need not wait for.
    from choreography_ray.bench import harness
    from choreography_ray.bench import report as report_module

    if plot_file is not None and not report_module.can_plot():
        err_console.print(
            f"matplotlib is not installed, so --plot {plot_file} will be skipped: "
            "pip install 'choreography-ray[bench]'",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        plot_file = None
    storages = tuple(resolve_storage(url) for url in storage or ())
    for url in storages:
        check_storage(url)
    config = harness.BenchConfig(
        steps=tuple(steps or (10_000,)),
        storages=storages,
        stages=stages,
        leases=leases,
        window=window,
        step_ms=step_ms,
        fail_rate=fail_rate,
        repeat=repeat,
        compare=compare,
        bare_tasks=bare,
        storage_ceiling=ceiling,
        actor_sample=actor_sample,
        resume_halfway=resume_halfway,
        latency_runs=latency,
        metrics_overhead=metrics_overhead,
        stall_seconds=stall_seconds,
    )

    def log(message: str) -> None:
        err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    report = harness.run(config, log=log)
    report_module.print_report(report, console)
    if json_file is not None:
        report_module.write_json(report, json_file)
        err_console.print(f"wrote {json_file}", highlight=False, markup=False)
    if plot_file is not None:
        report_module.plot(report, plot_file)
        err_console.print(f"wrote {plot_file}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
