"""The test tiers' own machinery: the `xdist_group` marks that keep a module on one worker.

The chaos tier runs one cluster at a time and the docs' scripts run from one pool only because
`--dist loadgroup` sends each group to one worker. pytest 9.2 broke that silently
(pytest-dev/pytest-xdist#1386: every grouped test ran wherever, two chaos clusters at once and
every docs script twice); this fails when grouping stops working, whatever the versions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("one-worker")


@pytest.mark.parametrize("n", range(8))
def test_grouped(n):
    pass
"""


def test_loadgroup__an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    workers = set(re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED", run.stdout))
    assert len(workers) == 1, f"one group ran on {sorted(workers)}:\n{run.stdout}"
