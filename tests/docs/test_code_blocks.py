"""Every ```python block of README.md and docs/ runs as a user would run it: saved as a script
in an empty directory and run with `python script.py`, on a local Ray of its own.

A block whose first line is a comment naming a file (`# myapp_recovery.py`) is saved under that
name (it refers to itself by import path); any other as `<page>_<n>.py`. Blocks run from the
empty directory, so `sqlite:///jobs.db` is a fresh file there; the checkout is on PYTHONPATH,
as it is for a user working in a source checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
NAMED = re.compile(r"# (\w+\.py)\n")


def blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for n, match in enumerate(BLOCK.finditer(page.read_text()), start=1):
            code = match.group(1)
            named = NAMED.match(code)
            stem = page.stem.lower().replace("-", "_")
            found.append((named.group(1) if named else f"{stem}_{n}.py", code))
    return found


def test_the_pages_have_python_blocks() -> None:
    assert len(blocks()) >= 5


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("name", "code"), blocks(), ids=[name for name, _ in blocks()])
def test_block_runs_as_a_script(name: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / name
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "local"}
    env.pop("CHOREOGRAPHY_STORAGE", None)
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=200,
    )  # fmt: skip
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
