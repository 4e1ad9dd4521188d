"""The bench's metrics-overhead scenario as the report holds it: each round's ratio, and every
round's total with metrics on over the total with metrics off, in the JSON."""

from __future__ import annotations

import pytest

from choreography_ray.bench.report import metrics_table
from choreography_ray.bench.results import BenchReport, MetricsRun


def run(repeat: int, on: float, off: float) -> MetricsRun:
    return MetricsRun(
        repeat=repeat, steps=100_000, storage="sqlite:///b.db", seconds_on=on, seconds_off=off,
        status_on="CompletedSuccessfully", status_off="CompletedSuccessfully",
    )  # fmt: skip


def test_metrics_overhead__ratio_per_round_and_over_all_rounds_in_the_json() -> None:
    report = BenchReport(machine={}, config={})
    report.metrics_overhead += [run(0, 4.2, 4.0), run(1, 3.9, 4.0)]

    data = report.to_json()

    assert [r["ratio_on_vs_off"] for r in data["metrics_overhead"]] == pytest.approx([1.05, 0.975])
    (summary,) = data["metrics_overhead_summary"]
    assert summary["rounds"] == 2
    assert summary["ratio_on_vs_off"] == pytest.approx(8.1 / 8.0)
    assert metrics_table(report).row_count == 3  # two rounds and the total
