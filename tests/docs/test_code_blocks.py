"""Every ```python block of README.md and docs/ runs as a user would run it: saved as a script
in an empty directory and run with `python script.py`, on a local Ray of its own.

A block whose first line is a comment naming a file (`# myapp_recovery.py`) is saved under that
name (it refers to itself by import path); any other as `<page>_<n>.py`. Blocks run from the
empty directory, so `sqlite:///jobs.db` is a fresh file there; the checkout is on PYTHONPATH,
as it is for a user working in a source checkout.

A block that shows a file as it is (`RUN_AS_FILE`) is run as that file by a test of its own.
The scripts of the other blocks are in the slow tier; those selected run `AT_ONCE` at a time,
started by a module fixture as the first test asks for them (each script's Ray start is mostly
waiting for its processes to come up); each test then waits for its own script and checks its
exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
NAMED = re.compile(r"# (\w+\.py)\n")
#: How many block scripts run at the same time.
AT_ONCE = 2
#: How long one script may take, in seconds.
SCRIPT_SECONDS = 200
#: Blocks that show a file as it is, which a test of its own runs as a script (checking more
#: than its exit): block name -> the file. Here the block is checked to be that file.
RUN_AS_FILE = {
    # tests/acceptance/test_ray_app_example.py runs it (`python docs/examples/ray_app.py`).
    "ray_apps_1.py": ROOT / "docs" / "examples" / "ray_app.py",
    # tests/acceptance/test_embed_example.py runs it (`python docs/examples/embed.py`).
    "pools_1.py": ROOT / "docs" / "examples" / "embed.py",
    # tests/acceptance/test_word_count_example.py runs it.
    "outputs_1.py": ROOT / "docs" / "examples" / "word_count.py",
}

#: One xdist worker runs the whole module: its scripts run from a pool the module starts.
pytestmark = pytest.mark.xdist_group("docs-blocks")


def blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for n, match in enumerate(BLOCK.finditer(page.read_text()), start=1):
            code = match.group(1)
            named = NAMED.match(code)
            stem = page.stem.lower().replace("-", "_")
            found.append((named.group(1) if named else f"{stem}_{n}.py", code))
    return found


def run_script(name: str, code: str, directory: Path) -> subprocess.CompletedProcess[str]:
    script = directory / name
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "local"}
    env.pop("CHOREOGRAPHY_STORAGE", None)
    return subprocess.run(
        [sys.executable, script.name], cwd=directory, env=env, capture_output=True, text=True,
        timeout=SCRIPT_SECONDS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def scripts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The selected blocks' scripts, each started in an empty directory of its own, by name."""
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and hasattr(item, "callspec")
    }
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {
            name: pool.submit(run_script, name, code, tmp_path_factory.mktemp("block"))
            for name, code in blocks()
            if name in selected and name not in RUN_AS_FILE
        }


def test_the_pages_have_python_blocks() -> None:
    assert len(blocks()) >= 5


def cases() -> list[Any]:
    """Each block: a script in the slow tier (each starts a Ray of its own: 10-30 s, two at a
    time, about 2.5 minutes of the default tier's 10 in all), or in the default tier the check
    that a `RUN_AS_FILE` block is its file."""
    return [
        pytest.param(name, code, id=name, marks=() if name in RUN_AS_FILE else pytest.mark.slow)
        for name, code in blocks()
    ]


@pytest.mark.timeout(2 * SCRIPT_SECONDS + 40)
@pytest.mark.parametrize(("name", "code"), cases())
def test_block_runs_as_a_script(
    name: str, code: str, scripts: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    if name in RUN_AS_FILE:
        assert code == RUN_AS_FILE[name].read_text(encoding="utf-8")
        return
    done = scripts[name].result()
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
