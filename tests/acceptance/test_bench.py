"""`choreography-ray bench` as a subprocess: it runs every system once and writes the JSON report.

No timing is asserted (the figures depend on the machine and its load): only that each
measurement is there, with the fields docs/benchmarks.md documents.
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

#: The fields each durable run carries (the issue's contract).
DURABLE_FIELDS = {"steps", "storage", "seconds", "bare_tasks_seconds", "ratio_vs_bare_tasks"}
#: Durable-run fields that hold a positive number after a run of every system.
NUMERIC_DURABLE_FIELDS = (
    "seconds",
    "steps_per_second",
    "bare_tasks_seconds",
    "ratio_vs_bare_tasks",
    "storage_ceiling_seconds",
    "ratio_vs_storage_ceiling",
    "actors_seconds_extrapolated",
    "peak_rss_workers_bytes",
    "peak_rss_all_bytes",
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench__writes_every_measurement_to_json(tmp_path: Path) -> None:
    # From a directory outside the checkout, with this checkout's package on PYTHONPATH (the
    # environment may have another one installed): the harness gives the Ray workers the same.
    # tests/acceptance/test_installed_bench.py runs an installed wheel instead.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "bench", "--steps", "200",
         "--actor-sample", "20", "--json", "out.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=850, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "durable / bare tasks" in completed.stdout

    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert {"machine", "config", "durable", "bare_tasks", "actors", "storage_ceiling"} <= set(
        report
    )
    assert report["machine"]["cpus"] >= 1

    (durable,) = report["durable"]
    assert set(durable) >= DURABLE_FIELDS
    assert durable["steps"] == 200
    assert durable["storage"].startswith("sqlite:///")
    assert durable["status"] == "CompletedSuccessfully"
    assert durable["successful_steps"] == 200
    for field in NUMERIC_DURABLE_FIELDS:
        assert _number(durable[field]), field
    assert durable["ratio_vs_bare_tasks"] == pytest.approx(
        durable["seconds"] / durable["bare_tasks_seconds"]
    )

    (bare,) = report["bare_tasks"]
    assert bare["steps"] == 200 and _number(bare["seconds"])
    (actors,) = report["actors"]
    assert actors["sample"] == 20 and actors["window"] == 16 and _number(actors["seconds"])
    (ceiling,) = report["storage_ceiling"]
    assert ceiling["steps"] == 200 and ceiling["storage"] == durable["storage"]
    for field in ("insert_seconds", "update_seconds", "delete_seconds", "seconds"):
        assert _number(ceiling[field]), field
