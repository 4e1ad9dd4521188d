"""`choreography-ray bench --outputs` as a subprocess, at a small size: it runs bare tasks, the job
without and with outputs, the Dataset reads and the seeded read, and writes the JSON report.

No timing is asserted (the figures depend on the machine and its load): only that each
measurement is there, that every output was stored and read back, and the fields
docs/benchmarks.md documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

STEPS = 200
READ_ROWS = 2_000


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_outputs__writes_every_measurement_to_json(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "bench", "--outputs", "--steps",
         str(STEPS), "--outputs-read-rows", str(READ_ROWS), "--json", "out.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=550, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "outputs / no output" in completed.stdout

    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert {"machine", "config", "rounds", "summary", "read_scale"} <= set(report)
    (row,) = report["rounds"]
    assert row["steps"] == STEPS and row["storage"].startswith("sqlite:///")
    assert row["without_status"] == row["with_status"] == "CompletedSuccessfully"
    assert row["counted"] == row["read_rows"] == STEPS and row["read_sum_ok"] is True
    for field in ("bare_seconds", "without_seconds", "with_seconds", "count_seconds",
                  "read_seconds", "ratio_with_vs_without", "ratio_with_vs_bare_tasks",
                  "count_rows_per_second", "read_rows_per_second"):  # fmt: skip
        assert _number(row[field]), field
    (summary,) = report["summary"]
    assert summary["ratio_with_vs_without"] == pytest.approx(row["ratio_with_vs_without"])

    (scale,) = report["read_scale"]
    assert scale["rows"] == scale["read_rows"] == READ_ROWS and scale["read_sum_ok"] is True
    assert scale["data_bytes"] == scale["output_bytes"] * READ_ROWS
    assert _number(scale["read_rows_per_second"]) and _number(scale["driver_rss_peak_bytes"])
