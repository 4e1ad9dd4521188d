"""The bench's `--breakdown`: a 1-step job's marks as the report shows them, in order of their
medians, each with its time from `start` and from the mark before; and the option's check."""

from __future__ import annotations

from rich.console import Console
from typer.testing import CliRunner

from choreography_ray.bench.report import breakdown_table
from choreography_ray.bench.results import BenchReport, LatencyResult
from choreography_ray.cli import app


def test_breakdown_table__marks_from_start_and_from_the_mark_before() -> None:
    report = BenchReport(machine={}, config={})
    report.latency.append(
        LatencyResult(
            storage="sqlite:///b.db", runs=2, p50_seconds=0.05, p90_seconds=0.06,
            p99_seconds=0.06, min_seconds=0.04, max_seconds=0.06, wait_p50_seconds=0.06,
            samples=[0.04, 0.06], wait_samples=[0.05, 0.07],
            breakdown={"PreparingJob stored": 0.002, "perform began": 0.030, "wait returned": 0.05},
        )
    )  # fmt: skip
    console = Console(record=True, width=200)

    console.print(breakdown_table(report))

    lines = [line for line in console.export_text().splitlines() if "sqlite" in line]
    assert [line.split("│")[2].strip() for line in lines] == [
        "PreparingJob stored", "perform began", "wait returned",
    ]  # fmt: skip
    assert [[cell.strip() for cell in line.split("│")[3:5]] for line in lines] == [
        ["2.0", "+2.0"], ["30.0", "+28.0"], ["50.0", "+20.0"],
    ]  # fmt: skip


def test_breakdown__needs_latency() -> None:
    result = CliRunner().invoke(app, ["bench", "--breakdown"])

    assert result.exit_code == 2
    assert "--breakdown needs --latency N" in result.output
