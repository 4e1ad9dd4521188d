"""`choreography-ray bench`: the durable job against bare Ray tasks, in one run.

The measuring lives in `choreography_ray.bench` (`harness.py`), so an installed wheel runs it as
a checkout does; this command only parses options and prints. docs/benchmarks.md explains the
columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NamedTuple

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
    breakdown: Annotated[
        bool,
        typer.Option(
            "--breakdown",
            help="With --latency N: also print where a 1-step job's time goes (its stored "
            "status changes, its perform, start's and wait's answers; medians).",
        ),
    ] = False,
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
    pools: Annotated[
        bool,
        typer.Option(
            "--pools",
            help="Run the pool comparison instead: batched GPU-shaped steps against Ray Data "
            "map_batches and dedicated steps (needs the `bench` extra: pandas, pyarrow).",
        ),
    ] = False,
    sharing: Annotated[
        bool,
        typer.Option(
            "--sharing",
            help="Run the sharing scenarios instead: a small job beside another tenant's "
            "backlog, priorities, weighted shares, a limit never reached (docs/sharing.md).",
        ),
    ] = False,
    outputs: Annotated[
        bool,
        typer.Option(
            "--outputs",
            help="Run the step-output scenarios instead: bare tasks returning a ~100-byte value, "
            "the job without and with a ~100-byte output per step, its outputs read as a Ray "
            "Dataset (--steps: 100000 by default; --storage, --repeat, --leases apply).",
        ),
    ] = False,
    outputs_read_rows: Annotated[
        int,
        typer.Option(
            "--outputs-read-rows",
            min=0,
            metavar="N",
            help="--outputs: also seed N outputs in storage and read them as a Dataset, "
            "reporting rows/s and the driver's peak RSS growth; 0 skips it.",
        ),
    ] = 0,
    pool_items: Annotated[
        int, typer.Option(min=1, metavar="N", help="--pools: items, one step each.")
    ] = 100_000,
    gpus: Annotated[
        int, typer.Option(min=1, help="--pools: GPUs the local Ray declares; hosts or actors.")
    ] = 4,
    batch_size: Annotated[int, typer.Option(min=1, help="--pools: items per batch.")] = 64,
    batch_ms: Annotated[
        float, typer.Option(min=0, help="--pools: simulated cost of a batch, in ms.")
    ] = 5.0,
    item_ms: Annotated[
        float, typer.Option(min=0, help="--pools: simulated cost per item of a batch, in ms.")
    ] = 0.05,
    dedicated_sample: Annotated[
        int,
        typer.Option(min=0, help="--pools: dedicated steps timed and extrapolated; 0 skips."),
    ] = 40,
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
    if breakdown and not latency:
        raise typer.BadParameter("--breakdown needs --latency N", param_hint="--breakdown")
    if sharing:
        _bench_sharing(json_file)
        return
    if outputs:
        _bench_outputs(
            OutputsOptions(
                steps=tuple(steps or ()),
                storages=tuple(storage or ()),
                repeat=repeat,
                leases=leases,
                read_rows=outputs_read_rows,
                stall_seconds=stall_seconds,
            ),
            json_file,
        )
        return
    if pools:
        _bench_pools(
            PoolOptions(pool_items, gpus, batch_size, batch_ms, item_ms, dedicated_sample),
            repeat,
            json_file,
        )
        return
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
        breakdown=breakdown,
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


class PoolOptions(NamedTuple):
    items: int
    gpus: int
    batch_size: int
    batch_ms: float
    item_ms: float
    dedicated_sample: int


def _bench_pools(options: PoolOptions, repeat: int, json_file: Path | None) -> None:
    from choreography_ray.bench import pools

    config = pools.PoolConfig(
        items=options.items,
        gpus=options.gpus,
        batch_size=options.batch_size,
        cost=pools.Cost(batch_ms=options.batch_ms, item_ms=options.item_ms),
        dedicated_sample=min(options.dedicated_sample, options.items),
        repeat=repeat,
    )

    def log(message: str) -> None:
        err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    try:
        report = pools.run(config, log=log)
    except ImportError as error:
        err_console.print(f"{error}: pip install 'choreography-ray[bench]'", markup=False)
        raise typer.Exit(2) from error
    pools.print_report(report, console)
    if json_file is not None:
        json_file.write_text(json.dumps(report.as_json(), indent=2) + "\n")
        err_console.print(f"wrote {json_file}", highlight=False, markup=False)


def _bench_sharing(json_file: Path | None) -> None:
    from dataclasses import asdict

    from choreography_ray.bench import sharing

    def log(message: str) -> None:
        err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    report = sharing.run(sharing.SharingConfig(), log=log)
    sharing.print_report(report, console)
    if json_file is not None:
        json_file.write_text(json.dumps(asdict(report), indent=2) + "\n")
        err_console.print(f"wrote {json_file}", highlight=False, markup=False)


class OutputsOptions(NamedTuple):
    steps: tuple[int, ...]
    storages: tuple[str, ...]
    repeat: int
    leases: bool
    read_rows: int
    stall_seconds: float


def _bench_outputs(options: OutputsOptions, json_file: Path | None) -> None:
    from choreography_ray.bench import outputs

    storages = tuple(resolve_storage(url) for url in options.storages)
    for url in storages:
        check_storage(url)
    config = outputs.OutputsConfig(
        steps=options.steps or (outputs.DEFAULT_STEPS,),
        storages=storages,
        repeat=options.repeat,
        leases=options.leases,
        read_rows=options.read_rows,
        stall_seconds=options.stall_seconds,
    )

    def log(message: str) -> None:
        err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    report = outputs.run(config, log=log)
    outputs.print_report(report, console)
    if json_file is not None:
        json_file.write_text(json.dumps(report.as_json(), indent=2) + "\n")
        err_console.print(f"wrote {json_file}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
