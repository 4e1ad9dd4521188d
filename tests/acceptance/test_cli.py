"""The `choreography-ray` command line as a user runs it: a real subprocess, its exit code and
its output, on an SQLite file of the test's own.

A command that runs a job starts its own local Ray (`--address local`, about 5-10 s), so those
runs are few; bad input is refused before Ray starts, so those runs are cheap. The last test
submits a run to a `ray start --head` cluster with `ray job submit`, as DESIGN.md §7 asks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from choreography_ray.model import JobState
from tests.support import free_port, in_storage

REPO = Path(__file__).resolve().parents[2]
JOB_TYPE = "tests.acceptance.acceptance_jobs:Greet"
#: How long one command that starts Ray and runs a small job may take, in seconds.
RUN_SECONDS = 180
#: How long a command that is refused before Ray starts may take, in seconds.
REFUSE_SECONDS = 60
#: How long `ray start --head` may take until its job server answers, in seconds.
HEAD_START_SECONDS = 120
#: How long the head may take to exit once interrupted, in seconds.
HEAD_STOP_SECONDS = 30


def cli_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH (Ray workers import the job
    types by path) and without RAY_ADDRESS, so each run starts a Ray of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def cli(
    *args: str, timeout: float = RUN_SECONDS, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", *args],
        cwd=REPO,
        env=cli_env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'x.db'}"


def stored_jobs(url: str, scope: str = "default", namespace: str = "default") -> list[JobState]:
    return in_storage(url, lambda storage: storage.list_jobs(scope, namespace))


def write_request(tmp_path: Path, request: object) -> Path:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    return path


# -- demo, status, list ---------------------------------------------------------------------


@pytest.mark.timeout(RUN_SECONDS + 2 * REFUSE_SECONDS + 30)
def test_demo__completes_with_failures_and_shows_them(storage_url: str) -> None:
    done = cli("demo", "--steps", "200", "--storage", storage_url, "--address", "local")

    assert done.returncode == 0, explain(done)
    assert "COMPLETED_WITH_FAILURES" in done.stdout, explain(done)
    # 198 documents in the fan-out, every 100th fails: one failed step, shown with its message.
    assert "document 100 of 'demo-corpus': simulated parse error" in done.stdout, explain(done)
    assert "ContinueWithNextStage" in done.stdout  # the stage failure behaviour is shown
    match = re.search(r"Started job ([0-9a-f]{32})", done.stdout)
    assert match, explain(done)
    job_id = match.group(1)

    # status and list read the same storage without starting Ray.
    status = cli("status", job_id, "--storage", storage_url, timeout=REFUSE_SECONDS)
    assert status.returncode == 0, explain(status)
    assert "COMPLETED_WITH_FAILURES" in status.stdout
    assert "simulated parse error" in status.stdout
    listed = cli("list", "--storage", storage_url, "--scope", "demo", timeout=REFUSE_SECONDS)
    assert listed.returncode == 0, explain(listed)
    assert job_id in listed.stdout


# -- run ------------------------------------------------------------------------------------


def test_run__valid_request_prints_the_final_state_as_json(
    tmp_path: Path, storage_url: str
) -> None:
    request = write_request(tmp_path, {"names": ["ada", "grace", "linus"]})

    done = cli("run", JOB_TYPE, "--request", str(request), "--storage", storage_url,
               "--address", "local", "--timeout", "120")  # fmt: skip

    assert done.returncode == 0, explain(done)
    state = json.loads(done.stdout)
    assert state["status"] == "CompletedSuccessfully"
    assert state["type"] == JOB_TYPE
    assert state["progress"]["total_steps"] == 3
    assert state["progress"]["successful_steps"] == 3
    assert [job.id for job in stored_jobs(storage_url)] == [state["id"]]


def test_run__job_with_failed_steps_exits_1(storage_url: str) -> None:
    request = json.dumps({"names": ["ada", "grace"], "fail": ["grace"]})

    done = cli("run", JOB_TYPE, "--request", "-", "--storage", storage_url,
               "--address", "local", "--timeout", "120", stdin=request)  # fmt: skip

    assert done.returncode == 1, explain(done)
    state = json.loads(done.stdout)
    assert state["status"] == "CompletedWithFailures"
    assert state["progress"]["failed_steps"] == 1


def test_run__invalid_request_exits_2_and_stores_nothing(tmp_path: Path, storage_url: str) -> None:
    request = write_request(tmp_path, {"names": []})

    done = cli("run", JOB_TYPE, "--request", str(request), "--storage", storage_url,
               timeout=REFUSE_SECONDS)  # fmt: skip

    assert done.returncode == 2, explain(done)
    assert "invalid request" in done.stderr
    assert "names" in done.stderr and "at least 1 item" in done.stderr, explain(done)
    assert done.stdout == ""
    assert stored_jobs(storage_url) == []


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tests.acceptance.acceptance_jobs:NoSuchJob", "has no attribute 'NoSuchJob'"),
        ("no_such_package.jobs:Job", "No module named 'no_such_package'"),
        ("tests.acceptance.acceptance_jobs:SayHello", "not a choreography_ray.Job"),
        ("tests.acceptance.acceptance_jobs", "not of the form 'pkg.module:ClassName'"),
    ],
)
def test_run__unknown_job_type_exits_2(path: str, reason: str, storage_url: str) -> None:
    done = cli("run", path, "--storage", storage_url, timeout=REFUSE_SECONDS)

    assert done.returncode == 2, explain(done)
    assert reason in done.stderr, explain(done)
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read the request"),
        ('{"names": ["ada",', "is not valid JSON"),
    ],
)
def test_run__unreadable_request_exits_2(
    content: str | None, reason: str, tmp_path: Path, storage_url: str
) -> None:
    path = tmp_path / "request.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")

    done = cli("run", JOB_TYPE, "--request", str(path), "--storage", storage_url,
               timeout=REFUSE_SECONDS)  # fmt: skip

    assert done.returncode == 2, explain(done)
    assert reason in done.stderr, explain(done)


def test_status__unknown_job_exits_2(storage_url: str) -> None:
    stored_jobs(storage_url)  # the file exists (a missing one: tests/acceptance/test_cli_jobs.py)
    done = cli("status", "no-such-job", "--storage", storage_url, timeout=REFUSE_SECONDS)

    assert done.returncode == 2, explain(done)
    assert "no job no-such-job" in done.stderr


# -- ray job submit -------------------------------------------------------------------------


def ray_command(name: str) -> str:
    """The `ray` script of this interpreter's environment."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


@pytest.fixture
def ray_head() -> Iterator[tuple[str, dict[str, str]]]:
    """A `ray start --head --block` of this test's own: its own temp dir (so no other `ray.init`
    finds it) and ports, stopped by a signal to its pid, which stops the processes it started.
    Yields the job server's address and the environment for `ray job submit`."""
    if shutil.which(ray_command("ray")) is None:
        pytest.skip("no `ray` command")
    # A short path: Ray's Unix sockets live under it.
    temp_dir = tempfile.mkdtemp(prefix="cra-", dir="/tmp")
    dashboard = free_port()
    env = cli_env()
    # The job's entrypoint inherits the head's environment: choreography-ray on PATH, the
    # repository on PYTHONPATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [
        ray_command("ray"), "start", "--head", "--block", "--temp-dir", temp_dir,
        "--port", str(free_port()), "--dashboard-port", str(dashboard),
        "--dashboard-host", "127.0.0.1", "--include-dashboard", "true",
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(free_port()),
        "--ray-client-server-port", str(free_port()),
        "--num-cpus", "2", "--disable-usage-stats",
    ]  # fmt: skip
    log = open(Path(temp_dir) / "ray-start.log", "w+b")  # noqa: SIM115 - closed below
    head = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    address = f"http://127.0.0.1:{dashboard}"
    submit_env = {**env, "RAY_AUTH_MODE": "token"}
    try:
        deadline = time.monotonic() + HEAD_START_SECONDS
        while True:
            if head.poll() is not None:
                log.seek(0)
                pytest.skip(f"`ray start --head` failed here: {log.read().decode()[-2000:]}")
            listed = subprocess.run(
                [ray_command("ray"), "job", "list", "--address", address],
                env=submit_env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if listed.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.skip(f"the job server of `ray start --head` did not answer: "
                            f"{listed.stderr[-2000:]}")  # fmt: skip
            time.sleep(1)
        yield address, submit_env
    finally:
        if head.poll() is None:
            # SIGINT, not SIGTERM: SIGTERM first drains the node, which here takes half a
            # minute; an interrupted `ray start --block` kills its processes at exit.
            head.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(HEAD_STOP_SECONDS)
        # Whatever of the process group this fixture created is left (the head's children).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(HEAD_STOP_SECONDS)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(HEAD_START_SECONDS + RUN_SECONDS + 2 * HEAD_STOP_SECONDS + 30)
def test_ray_job_submit__runs_the_job_on_the_cluster(
    ray_head: tuple[str, dict[str, str]], tmp_path: Path, storage_url: str
) -> None:
    address, env = ray_head
    request = write_request(tmp_path, {"names": ["ada", "grace", "linus", "margaret"]})
    submission = f"cr-acceptance-{uuid.uuid4().hex[:8]}"

    done = subprocess.run(
        [ray_command("ray"), "job", "submit", "--address", address,
         "--submission-id", submission, "--",
         "choreography-ray", "run", JOB_TYPE, "--request", str(request),
         "--storage", storage_url, "--scope", "pipelines", "--timeout", "120"],
        env=env, capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )  # fmt: skip

    assert done.returncode == 0, explain(done)
    assert '"status": "CompletedSuccessfully"' in done.stdout, explain(done)
    (job,) = stored_jobs(storage_url, "pipelines", "default")
    assert job.progress.successful_steps == 4
