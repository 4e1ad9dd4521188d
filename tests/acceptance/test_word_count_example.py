"""docs/examples/word_count.py run as a user runs it (`python docs/examples/word_count.py`):
a map stage returns outputs, a reduce stage reads them, the driver reads them back
(docs/outputs.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "word_count.py"
#: How long the example may take: a local Ray starting, 200 steps and a Dataset read, in seconds.
RUN_SECONDS = 180


@pytest.mark.slow  # a local Ray of its own and a Ray Data read: about 20 s
@pytest.mark.timeout(RUN_SECONDS + 30)
def test_word_count_example__the_reduce_stage_sums_the_map_stage_outputs(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": "local"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    storage = f"sqlite:///{tmp_path / 'words.db'}"

    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--documents", "200", "--storage", storage],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )  # fmt: skip

    explain = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, explain
    lines = done.stdout.splitlines()
    total = next(line for line in lines if line.startswith("documents=")), explain
    assert total[0].startswith("documents=200 words={"), explain
    assert "200 outputs of stage 0 read back as a Dataset" in lines, explain
    assert "traceback" not in (done.stdout + done.stderr).lower(), explain
