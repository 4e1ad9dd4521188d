"""docs/examples/ray_app.py run as a user runs it (`python docs/examples/ray_app.py`): an async
actor of the user's own Ray application connects with `Jobs.connect_async`, starts jobs through
`jobs.async_manager(...)`, awaits them and reacts to their outcome, and nothing on its event
loop blocks (Ray warns "Using blocking ray.get inside async actor" the first time one does, in
the actor's log, which Ray prints on the driver's output).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "ray_app.py"
PAGE = REPO / "docs" / "ray-apps.md"
#: How long the example may take: a local Ray starting, two small jobs, in seconds.
RUN_SECONDS = 180
#: What Ray logs once per process at the first blocking `ray.get` inside an async actor.
BLOCKING_WARNING = "blocking ray.get inside async actor"


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


@pytest.mark.slow  # a local Ray of its own, as the docs' other scripts: about 20 s
@pytest.mark.timeout(RUN_SECONDS + 30)
def test_ray_app_example__async_actor_starts_awaits_and_reacts_without_blocking(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"}
    # A Ray of its own ("local": never a cluster someone else started on this machine), and
    # this checkout's package for the driver and the workers.
    env["RAY_ADDRESS"] = "local"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))

    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--storage", f"sqlite:///{tmp_path / 'gallery.db'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )  # fmt: skip

    assert done.returncode == 0, explain(done)
    lines = done.stdout.splitlines()
    assert "holiday: published, 3 thumbnails" in lines, explain(done)
    assert (
        "studio: held back, 1 of 3 thumbnails failed "
        "(portrait.raw: raw files are not supported)" in lines
    ), explain(done)
    output = (done.stdout + done.stderr).lower()
    assert BLOCKING_WARNING not in output, explain(done)
    assert "traceback" not in output, explain(done)


def test_ray_apps_page__shows_the_example_as_it_is() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.M | re.S)
    assert blocks == [EXAMPLE.read_text(encoding="utf-8")]
