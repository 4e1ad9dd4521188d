"""Credentials in storage URLs are never logged or printed: the CLI and a Python-API connection
meet a MongoDB URL with a password on a closed port, and neither their output nor any log of
their Ray session holds the password (see docs/security.md).

Each run gets a Ray temp dir of its own (`RAY_TMPDIR`), so its session's logs are the ones read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.test_cli import REPO, RUN_SECONDS, cli_env, explain
from tests.support import free_port

GREET = "tests.acceptance.acceptance_jobs:Greet"
#: Unlikely anywhere else in a log.
PASSWORD = "s3cr3t-Pa55word-7f1c"

_API_RUN = """
import sys
import choreography_ray as cr

url = sys.argv[1]
with cr.Jobs.connect(storage=url, address="local", namespace="security-test") as jobs:
    manager = jobs.manager("security", "default")
    for call in (manager.list, lambda: manager.get("abc")):
        try:
            call()
        except cr.StorageError as error:
            unavailable = isinstance(error, cr.StorageUnavailableError)
            print("refused:", "unavailable" if unavailable else "other", error)
"""


def storage_url() -> str:
    port = free_port()
    return f"mongodb://user:{PASSWORD}@127.0.0.1:{port}/db?serverSelectionTimeoutMS=1500"


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    # A short path: Ray's Unix sockets live under it.
    path = Path(tempfile.mkdtemp(prefix="crs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def leaks(ray_tmp: Path) -> tuple[list[Path], list[str]]:
    """The log files of every session under `ray_tmp`, and those that hold the password."""
    logs = [p for p in ray_tmp.glob("ray/session_*/logs/**/*") if p.is_file()]
    found = [str(p) for p in logs if PASSWORD.encode() in p.read_bytes()]
    return logs, found


def run(args: list[str], ray_tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**cli_env(), "RAY_TMPDIR": str(ray_tmp)}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=RUN_SECONDS, check=False)  # fmt: skip


@pytest.mark.slow  # a CLI run on a Ray of its own, its logs read (25 s)
@pytest.mark.timeout(RUN_SECONDS + 30)
def test_cli_run__password_of_the_storage_url_in_no_output_and_no_ray_log(
    ray_tmp: Path, tmp_path: Path
) -> None:
    request = tmp_path / "request.json"
    request.write_text('{"names": ["ada"]}', encoding="utf-8")

    command = [sys.executable, "-m", "choreography_ray.cli", "run", GREET,
               "--request", str(request), "--storage", storage_url(),
               "--address", "local", "--timeout", "60"]  # fmt: skip
    done = run(command, ray_tmp)

    assert done.returncode != 0, explain(done)
    assert "user:***@127.0.0.1" in done.stdout + done.stderr, explain(done)
    assert PASSWORD not in done.stdout + done.stderr, explain(done)
    logs, found = leaks(ray_tmp)
    assert logs, f"no Ray session logs under {ray_tmp}"
    assert found == []


@pytest.mark.slow  # a Ray of its own, its logs read (20 s)
@pytest.mark.timeout(RUN_SECONDS + 30)
def test_api_connect__password_of_the_storage_url_in_no_output_and_no_ray_log(
    ray_tmp: Path,
) -> None:
    done = run([sys.executable, "-c", _API_RUN, storage_url()], ray_tmp)

    assert done.returncode == 0, explain(done)
    assert done.stdout.count("refused: unavailable") == 2, explain(done)
    assert "user:***@127.0.0.1" in done.stdout, explain(done)
    assert PASSWORD not in done.stdout + done.stderr, explain(done)
    logs, found = leaks(ray_tmp)
    assert logs, f"no Ray session logs under {ray_tmp}"
    assert found == []
