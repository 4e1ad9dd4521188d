"""The bench's step-output scenarios (`bench --outputs`, `bench/outputs.py`) without Ray: the
step's output and its size, the full read's sum, the ratios and rates the report derives and
prints. The CLI run itself is `tests/acceptance/test_bench_outputs.py`'s; no timing asserted."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pyarrow
import pytest
from rich.console import Console

import choreography_ray as cr
from choreography_ray.bench import outputs
from choreography_ray.bench.outputs import (
    OutputItem,
    OutputsReport,
    OutputsRound,
    OutputStep,
    ReadScale,
)


def _round(repeat: int, bare: float, without: float, with_: float) -> OutputsRound:
    return OutputsRound(
        repeat=repeat, steps=1_000, storage="sqlite:///b.db", bare_seconds=bare,
        without_seconds=without, without_status="CompletedSuccessfully", with_seconds=with_,
        with_status="CompletedSuccessfully", counted=1_000, count_seconds=0.5, read_rows=1_000,
        read_seconds=0.25, read_sum_ok=True,
    )  # fmt: skip


def _perform(output: bool, step_id: str = "000042") -> cr.StepResult:
    context = cr.StepContext("job", step_id, 0, 1)
    return asyncio.run(OutputStep().perform(OutputItem(output=output), context))


def test_step__returns_a_record_of_about_100_bytes_or_nothing() -> None:
    result = _perform(output=True, step_id="099999")

    assert result.success and result.output is not None
    assert result.output.model_dump() == {"step": "099999", "n": 99_999, "pad": outputs.PAD}
    assert 90 <= len(result.output.model_dump_json()) <= 110
    assert _perform(output=False).output is None


def test_full_read__counts_rows_and_sums_output_n_over_batches() -> None:
    class Batches:
        def iter_batches(self, **kwargs: Any) -> Any:
            assert kwargs["batch_format"] == "pyarrow"
            for ns in (range(3), range(3, 5)):
                yield pyarrow.Table.from_pylist(
                    [{"output": {"step": str(n), "n": n, "pad": ""}} for n in ns]
                )

    assert outputs.full_read(Batches()) == (5, outputs.expected_sum(5))
    assert outputs.expected_sum(5) == 0 + 1 + 2 + 3 + 4


def test_report__ratios_per_round_and_of_the_totals_in_the_json() -> None:
    report = OutputsReport(machine={}, config={})
    report.rounds += [_round(0, 2.0, 4.0, 5.0), _round(1, 2.0, 4.0, 4.4)]

    data = report.as_json()

    assert [r["ratio_with_vs_without"] for r in data["rounds"]] == pytest.approx([1.25, 1.1])
    assert data["rounds"][0]["ratio_without_vs_bare_tasks"] == pytest.approx(2.0)
    assert data["rounds"][0]["count_rows_per_second"] == pytest.approx(2_000)
    assert data["rounds"][0]["read_rows_per_second"] == pytest.approx(4_000)
    (summary,) = data["summary"]
    assert summary["rounds"] == 2
    assert summary["ratio_with_vs_without"] == pytest.approx(9.4 / 8.0)
    assert summary["ratio_with_vs_bare_tasks"] == pytest.approx(9.4 / 4.0)
    assert data["read_scale"] == []


def test_read_scale__the_drivers_growth_against_the_data_read() -> None:
    scale = ReadScale(
        rows=200_000, storage="sqlite:///b.db", output_bytes=100, data_bytes=20_000_000,
        seed_seconds=2.0, read_rows=200_000, read_seconds=4.0, read_sum_ok=True,
        driver_rss_before_bytes=300_000_000, driver_rss_peak_bytes=305_000_000,
    )  # fmt: skip

    data = scale.as_json()

    assert data["driver_rss_growth_bytes"] == 5_000_000
    assert data["driver_rss_growth_vs_data"] == pytest.approx(0.25)
    assert data["read_rows_per_second"] == pytest.approx(50_000)


def test_print_report__says_whether_the_goal_was_met() -> None:
    report = OutputsReport(machine={}, config={})
    report.rounds += [_round(0, 2.0, 4.0, 5.0), _round(1, 2.0, 4.0, 6.0)]
    wrong = ReadScale(
        rows=1_000, storage="sqlite:///b.db", output_bytes=100, data_bytes=100_000,
        seed_seconds=0.1, read_rows=999, read_seconds=0.1, read_sum_ok=False,
        driver_rss_before_bytes=0, driver_rss_peak_bytes=0,
    )  # fmt: skip
    report.read_scale.append(wrong)
    out = io.StringIO()

    outputs.print_report(report, Console(file=out, width=250))

    text = out.getvalue()
    assert "1.25 met" in text and "1.50 MISSED" in text
    assert "took 1.38 times the job without" in text  # 11 / 8, over both rounds
    assert "WRONG ROWS" in text
