"""docs/examples/embed.py run as a user runs it (`python docs/examples/embed.py`): documents
embedded in batches on a pool of declared GPUs, every vector written once, the pool listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "embed.py"
#: How long the example may take: a local Ray starting, a pool of two hosts, in seconds.
RUN_SECONDS = 180


@pytest.mark.slow  # a local Ray of its own and a pool of two hosts: about 15 s
@pytest.mark.timeout(RUN_SECONDS + 30)
def test_embed_example__embeds_every_document_on_a_gpu_pool(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_ADDRESS": "local"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    storage = f"sqlite:///{tmp_path / 'embed.db'}"

    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--documents", "500", "--storage", storage],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )  # fmt: skip

    explain = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, explain
    lines = done.stdout.splitlines()
    assert "job CompletedSuccessfully: 500 documents embedded" in lines, explain
    assert any(line.startswith("500 vectors of 32 dimensions in ") for line in lines), explain
    # As many hosts as the backlog wants (one or both GPUs).
    assert any(line in ("pools: num_gpus=1 (1 hosts)", "pools: num_gpus=1 (2 hosts)")
               for line in lines), explain  # fmt: skip
    assert "traceback" not in (done.stdout + done.stderr).lower(), explain
