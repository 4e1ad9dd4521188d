"""A benchmark report as rich tables, as a JSON file, and as a plot of time per step."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from rich.console import Console
from rich.table import Table

from choreography_ray.bench.results import BenchReport, Memory

MIB = 1024 * 1024


class _Measured(Protocol):
    @property
    def steps(self) -> int: ...
    @property
    def repeat(self) -> int: ...


_R = TypeVar("_R", bound=_Measured)


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"


def _rate(steps: int, seconds: float | None) -> str:
    return f"{steps / seconds:,.0f}" if seconds else ""


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _memory(record: Memory) -> tuple[str, str]:
    return (
        f"{record.peak_rss_workers_bytes / MIB:,.0f}",
        f"{record.peak_rss_all_bytes / MIB:,.0f}",
    )


#: How the table shows a job's final status.
_STATUS = {"CompletedSuccessfully": "succeeded", "CompletedWithFailures": "with failures"}


def label(url: str) -> str:
    """A short name for a storage URL: its scheme and its file or database name."""
    scheme, _, rest = url.partition(":")
    name = rest.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    return f"{scheme} {name}" if name else scheme


def comparison_table(report: BenchReport) -> Table:
    """One section per number of steps: the durable job on each storage with its ratios, then
    the baselines of the same round. The round column shows only when there are several."""
    actors = {a.repeat: a for a in report.actors}
    rounds = sorted({r.repeat for r in report.durable} | {r.repeat for r in report.bare_tasks})
    several = len(rounds) > 1
    table = Table(title="durable job against bare Ray, in one run")
    names = ["steps", "system", "status", *(["round"] if several else []), "seconds", "steps/s"]
    names += ["durable / bare tasks", "durable / storage ceiling"]
    names += ["peak RSS workers MiB", "peak RSS all MiB"]
    for name in names:
        table.add_column(name, justify="left" if name in ("system", "status") else "right")

    def row(steps: int, repeat: int, system: str, status: str, seconds: float,
            ratios: tuple[str, str], memory: Memory) -> None:  # fmt: skip
        table.add_row(
            f"{steps:,}", system, status, *([str(repeat + 1)] if several else []),
            _seconds(seconds), _rate(steps, seconds), *ratios, *_memory(memory),
        )  # fmt: skip

    def of(items: Iterable[_R], steps: int, repeat: int) -> list[_R]:
        return [r for r in items if (r.steps, r.repeat) == (steps, repeat)]

    for steps in sorted({r.steps for r in report.durable} | {r.steps for r in report.bare_tasks}):
        for repeat in rounds:
            for d in of(report.durable, steps, repeat):
                ratios = (_ratio(d.ratio_vs_bare_tasks), _ratio(d.ratio_vs_storage_ceiling))
                status = _STATUS.get(d.status, d.status)
                row(steps, repeat, f"durable job, {label(d.storage)}", status, d.seconds, ratios, d)
            for b in of(report.bare_tasks, steps, repeat):
                row(steps, repeat, "bare Ray tasks", "", b.seconds, ("", ""), b)
            sample = actors.get(repeat)
            if sample is not None:
                system = f"1 actor per step, extrapolated ({sample.sample} measured)"
                row(steps, repeat, system, "", sample.seconds_for(steps), ("", ""), sample)
            for c in of(report.storage_ceiling, steps, repeat):
                row(steps, repeat, f"storage ceiling, {label(c.storage)}", "", c.seconds,
                    ("", ""), c)  # fmt: skip
        table.add_section()
    return table


def resume_table(report: BenchReport) -> Table:
    table = Table(title="job actor killed halfway, resumed on the counted-records path")
    for name in ("steps", "storage", "status", "seconds", "after the kill", "killed at"):
        table.add_column(name, justify="left" if name in ("storage", "status") else "right")
    table.add_column("counted records", justify="right")
    table.add_column("bytes per counted record", justify="right")
    table.add_column("peak RSS all MiB", justify="right")
    for r in report.resume_halfway:
        table.add_row(
            f"{r.steps:,}", label(r.storage), _STATUS.get(r.status, r.status),
            _seconds(r.seconds),
            _seconds(r.seconds_after_kill),
            "ended first" if r.progress_at_kill is None else f"{r.progress_at_kill:.0%}",
            f"{r.counted_records:,}",
            "" if r.bytes_per_counted_record is None else f"{r.bytes_per_counted_record:.1f}",
            _memory(r)[1],
        )  # fmt: skip
    return table


def latency_table(report: BenchReport) -> Table:
    table = Table(title="start-to-completed latency of a 1-step job, warm")
    names = ("storage", "runs", "p50 s", "p90 s", "p99 s", "min s", "max s", "p50 via wait() s")
    for name in names:
        table.add_column(name, justify="left" if name == "storage" else "right")
    for r in report.latency:
        table.add_row(
            label(r.storage), str(r.runs), f"{r.p50_seconds:.3f}", f"{r.p90_seconds:.3f}",
            f"{r.p99_seconds:.3f}", f"{r.min_seconds:.3f}", f"{r.max_seconds:.3f}",
            f"{r.wait_p50_seconds:.3f}",
        )  # fmt: skip
    return table


def breakdown_table(report: BenchReport) -> Table:
    """Each `--breakdown` mark of a 1-step job: its median time from the `start` call, and from
    the mark before it."""
    table = Table(title="where a 1-step job's time goes (median of the runs through wait())")
    for name in ("storage", "mark", "ms from start", "ms from the mark before"):
        table.add_column(name, justify="left" if name in ("storage", "mark") else "right")
    for r in report.latency:
        before = 0.0
        for mark, seconds in r.breakdown.items():
            delta = (seconds - before) * 1000
            table.add_row(label(r.storage), mark, f"{seconds * 1000:.1f}", f"{delta:+.1f}")
            before = seconds
    return table


def metrics_table(report: BenchReport) -> Table:
    """Each round's job with metrics on and off, and every round's total on over total off."""
    table = Table(title="the durable job with metrics on and off, in one run")
    for name in ("steps", "storage", "round", "on s", "off s", "on / off"):
        table.add_column(name, justify="left" if name == "storage" else "right")
    groups = sorted({(r.steps, r.storage) for r in report.metrics_overhead})
    for steps, storage in groups:
        for r in report.metrics_overhead:
            if (r.steps, r.storage) == (steps, storage):
                table.add_row(
                    f"{steps:,}", label(storage), str(r.repeat + 1), _seconds(r.seconds_on),
                    _seconds(r.seconds_off), _ratio(r.ratio_on_vs_off),
                )  # fmt: skip
        total = report.metrics_ratio(steps, storage)
        table.add_row(f"{steps:,}", label(storage), "all", "", "", _ratio(total))
        table.add_section()
    return table


def print_report(report: BenchReport, console: Console) -> None:
    if report.durable or report.bare_tasks:
        console.print(comparison_table(report))
    if report.resume_halfway:
        console.print(resume_table(report))
    if report.latency:
        console.print(latency_table(report))
    if any(r.breakdown for r in report.latency):
        console.print(breakdown_table(report))
    if report.metrics_overhead:
        console.print(metrics_table(report))
    storages = report.config.get("storages", [])
    console.print("storage: " + ", ".join(storages), highlight=False, markup=False, soft_wrap=True)
    machine = report.machine
    console.print(
        f"{machine['cpus']} CPUs, {machine['memory_bytes'] / 2**30:.1f} GiB, "
        f"{machine['platform']}, Python {machine['python']}, Ray {machine['ray']}; "
        "load average at start " + " ".join(f"{v:.2f}" for v in machine["load_average_at_start"]),
        highlight=False,
    )


def write_json(report: BenchReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")


def can_plot() -> bool:
    """Whether matplotlib (the `bench` extra) can be imported."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def series(report: BenchReport) -> dict[str, dict[int, float]]:
    """Seconds per step by number of steps for each system, the median over rounds."""
    times: defaultdict[str, defaultdict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for d in report.durable:
        times[f"durable job, {label(d.storage)}"][d.steps].append(d.seconds / d.steps)
    for b in report.bare_tasks:
        times["bare Ray tasks"][b.steps].append(b.seconds / b.steps)
    for c in report.storage_ceiling:
        times[f"storage ceiling, {label(c.storage)}"][c.steps].append(c.seconds / c.steps)
    steps = sorted({b.steps for b in report.bare_tasks} | {d.steps for d in report.durable})
    for a in report.actors:
        for n in steps:
            times["1 actor per step (extrapolated)"][n].append(a.seconds_per_step)
    return {
        name: {n: statistics.median(values) for n, values in sorted(by_steps.items())}
        for name, by_steps in times.items()
    }


def plot(report: BenchReport, path: Path) -> None:
    """Time per step against the number of steps, log-log, one line per system. Needs
    matplotlib (the `bench` extra)."""
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    from matplotlib import pyplot  # type: ignore[import-not-found,unused-ignore]

    figure, axes = pyplot.subplots(figsize=(8, 5))
    for name, points in series(report).items():
        style = "--" if "extrapolated" in name else "-"
        axes.plot(list(points), [s * 1e6 for s in points.values()], style, marker="o", label=name)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("steps")
    axes.set_ylabel("time per step (µs)")
    machine = report.machine
    axes.set_title(f"choreography-ray bench, {machine['cpus']} CPUs, Ray {machine['ray']}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
