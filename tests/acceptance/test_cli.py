"""The `choreography-ray` command line as a user runs it: a real subprocess, its exit code and
its output, on an SQLite file of the test's own.

The demo starts its own local Ray (`--address local`, about 5-10 s), as a user's first command
does; bad input is refused before Ray starts, so those runs are cheap. The other runs join one
`ray start --head` cluster for the module, with token authentication, which must come up in CI
(`CI=true`): `run --address` and, as DESIGN.md §7 asks, `ray job submit`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.model import JobState
from tests.support import eventually, free_port, in_storage, missing_service, with_default_sigint

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

#: One xdist worker runs the whole module: its module's Ray head.
pytestmark = pytest.mark.xdist_group("cli-head")


def cli_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH (Ray workers import the job
    types by path) and without RAY_ADDRESS, so each run starts a Ray of its own."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def cli(
    *args: str,
    timeout: float = RUN_SECONDS,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", *args],
        cwd=REPO,
        env=cli_env() if env is None else env,
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

#: A test's time when it is the first of the module to run a job on `ray_head`, which starts then.
HEAD_RUN_SECONDS = HEAD_START_SECONDS + 2 * HEAD_STOP_SECONDS + RUN_SECONDS


@pytest.mark.timeout(HEAD_RUN_SECONDS)
def test_run__valid_request_prints_the_final_state_as_json(
    ray_head: RayHead, tmp_path: Path, storage_url: str
) -> None:
    request = write_request(tmp_path, {"names": ["ada", "grace", "linus"]})
    scope = fresh_scope()

    done = cli("run", JOB_TYPE, "--request", str(request), "--storage", storage_url,
               "--scope", scope, "--address", ray_head.gcs, "--timeout", "120",
               env=ray_head.env)  # fmt: skip

    assert done.returncode == 0, explain(done)
    state = json.loads(done.stdout)
    assert state["status"] == "CompletedSuccessfully"
    assert state["type"] == JOB_TYPE
    assert state["progress"]["total_steps"] == 3
    assert state["progress"]["successful_steps"] == 3
    assert [job.id for job in stored_jobs(storage_url, scope)] == [state["id"]]


@pytest.mark.timeout(HEAD_RUN_SECONDS)
def test_run__job_with_failed_steps_exits_1(ray_head: RayHead, storage_url: str) -> None:
    request = json.dumps({"names": ["ada", "grace"], "fail": ["grace"]})

    done = cli("run", JOB_TYPE, "--request", "-", "--storage", storage_url,
               "--scope", fresh_scope(), "--address", ray_head.gcs, "--timeout", "120",
               stdin=request, env=ray_head.env)  # fmt: skip

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


#: How long `ray job submit` (or `ray job logs`, `ray job status`) may take, in seconds.
SUBMIT_SECONDS = 60
#: How long a submitted job may take to reach what a test waits for, in seconds.
SUBMITTED_JOB_SECONDS = 120


def ray_command(name: str) -> str:
    """The `ray` script of this interpreter's environment."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


@dataclass(frozen=True)
class RayHead:
    """A `ray start --head` with token authentication, and how to reach its job server."""

    #: The job server (dashboard) address, for `ray job --address`.
    address: str
    #: The GCS address, for `choreography-ray run --address`.
    gcs: str
    #: The environment of a user who has the cluster's token (`RAY_AUTH_MODE=token` and
    #: `RAY_AUTH_TOKEN_PATH`), with choreography-ray on PATH.
    env: dict[str, str]

    def ray_job(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = SUBMIT_SECONDS
    ) -> subprocess.CompletedProcess[str]:
        """`ray job ARGS --address ...` (the address before any `--` entrypoint)."""
        head, sep, entrypoint = _split_entrypoint(args)
        return subprocess.run(
            [ray_command("ray"), "job", *head, "--address", self.address, *sep, *entrypoint],
            env=self.env if env is None else env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip


def _split_entrypoint(args: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    if "--" not in args:
        return list(args), [], []
    at = args.index("--")
    return list(args[:at]), ["--"], list(args[at + 1 :])


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    """A `ray start --head --block` of this module's own: its own temp dir (so no other
    `ray.init` finds it), ports and token (a file of its own, `RAY_AUTH_TOKEN_PATH`, so that it
    needs no `~/.ray/auth_token` and ignores one), stopped by a signal to its pid, which stops
    the processes it started; never by `ray stop`, which would stop every cluster here. A head
    that does not come up skips locally and fails in CI."""
    if shutil.which(ray_command("ray")) is None:
        missing_service("no `ray` command")
    # A short path: Ray's Unix sockets live under it.
    temp_dir = tempfile.mkdtemp(prefix="cra-", dir="/tmp")
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32), encoding="utf-8")
    dashboard, gcs = free_port(), free_port()
    env = {k: v for k, v in cli_env().items() if not k.startswith("RAY_AUTH_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    # The job's entrypoint inherits the head's environment: choreography-ray on PATH, the
    # repository on PYTHONPATH, the token for `ray.init` to join the cluster.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [
        ray_command("ray"), "start", "--head", "--block", "--temp-dir", temp_dir,
        "--node-ip-address", "127.0.0.1", "--port", str(gcs),
        "--dashboard-port", str(dashboard),
        "--dashboard-host", "127.0.0.1", "--include-dashboard", "true",
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(free_port()),
        "--ray-client-server-port", str(free_port()),
        "--num-cpus", "2", "--disable-usage-stats",
    ]  # fmt: skip
    log = open(Path(temp_dir) / "ray-start.log", "w+b")  # noqa: SIM115 - closed below
    process = subprocess.Popen(with_default_sigint(command), cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    head = RayHead(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", env)
    try:
        deadline = time.monotonic() + HEAD_START_SECONDS
        while True:
            if process.poll() is not None:
                log.seek(0)
                missing_service(f"`ray start --head` failed here: {log.read().decode()[-2000:]}")
            listed = head.ray_job("list")
            if listed.returncode == 0:
                break
            if time.monotonic() > deadline:
                missing_service(f"the job server of `ray start --head` did not answer: "
                                f"{listed.stderr[-2000:]}")  # fmt: skip
            time.sleep(1)
        yield head
        if process.poll() is not None:  # its tests failed on a head that was gone: say why
            log.seek(0)
            pytest.fail(f"`ray start --head` exited during the module ({process.returncode}): "
                        f"{log.read().decode()[-4000:]}")  # fmt: skip
    finally:
        if process.poll() is None:
            # SIGINT, not SIGTERM: SIGTERM first drains the node, which here takes half a
            # minute; an interrupted `ray start --block` kills its processes at exit.
            process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(HEAD_STOP_SECONDS)
        # Whatever of the process group this fixture created is left (the head's children).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(HEAD_STOP_SECONDS)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


#: A test's time when it is the first of the module to use `ray_head`, which starts then.
SUBMIT_TEST_SECONDS = HEAD_START_SECONDS + 2 * HEAD_STOP_SECONDS + 4 * SUBMITTED_JOB_SECONDS


#: The stored values of the terminal job statuses, and of a stop.
TERMINAL = {"CompletedSuccessfully", "CompletedWithFailures", "Failed", "Stopped"}


def fresh_scope() -> str:
    """A scope of the test's own: the head, and so its jobs managers, outlive a test, and a
    manager keeps the storage of the connection that created it."""
    return f"pipelines-{uuid.uuid4().hex[:8]}"


def submitted_json(output: str) -> dict[str, Any]:
    """The JSON object an entrypoint printed (`run`, `status --json`), from the output of
    `ray job submit`, which wraps the entrypoint's logs in lines of its own."""
    match = re.search(r"^\{$.*?^\}$", output, re.MULTILINE | re.DOTALL)
    assert match, output
    data: dict[str, Any] = json.loads(match.group(0))
    return data


@pytest.mark.timeout(SUBMIT_TEST_SECONDS)
def test_ray_job_submit__runs_the_job_on_the_cluster(
    ray_head: RayHead, tmp_path: Path, storage_url: str
) -> None:
    request = write_request(tmp_path, {"names": ["ada", "grace", "linus", "margaret"]})
    submission = f"cr-acceptance-{uuid.uuid4().hex[:8]}"
    scope = fresh_scope()

    done = ray_head.ray_job(
        "submit", "--submission-id", submission, "--",
        "choreography-ray", "run", JOB_TYPE, "--request", str(request),
        "--storage", storage_url, "--scope", scope, "--timeout", "120",
        timeout=RUN_SECONDS,
    )  # fmt: skip

    assert done.returncode == 0, explain(done)
    assert submitted_json(done.stdout)["status"] == "CompletedSuccessfully", explain(done)
    (job,) = stored_jobs(storage_url, scope, "default")
    assert job.progress.successful_steps == 4


@pytest.mark.slow  # two submissions and their logs (20 s); one submission is in the default tier
@pytest.mark.timeout(SUBMIT_TEST_SECONDS)
def test_ray_job_submit__no_wait_then_a_second_submission_sees_the_job_finish(
    ray_head: RayHead, tmp_path: Path, storage_url: str
) -> None:
    request = write_request(tmp_path, {"names": ["ada", "grace", "linus"]})
    submission = f"cr-acceptance-{uuid.uuid4().hex[:8]}"

    submitted = ray_head.ray_job(
        "submit", "--submission-id", submission, "--no-wait", "--",
        "choreography-ray", "run", JOB_TYPE, "--request", str(request),
        "--storage", storage_url, "--scope", fresh_scope(), "--timeout", "120",
    )  # fmt: skip
    assert submitted.returncode == 0, explain(submitted)
    assert submission in submitted.stdout + submitted.stderr, explain(submitted)

    # The entrypoint says which job it started, in the Ray job's logs.
    logs: list[subprocess.CompletedProcess[str]] = []

    def started_job() -> str | None:
        logs[:] = [ray_head.ray_job("logs", submission)]
        match = re.search(r"started job ([0-9a-f]{32})", logs[0].stdout + logs[0].stderr)
        return match.group(1) if match else None

    try:
        job_id = eventually(started_job, SUBMITTED_JOB_SECONDS, "the job id in the logs", 1.0)
    finally:  # pytest shows what a failed test printed: here, the last logs read
        print(explain(logs[0]) if logs else "no `ray job logs`")

    # A second submission, of a command that reads the stored job, until the job has finished.
    def finished() -> dict[str, Any] | None:
        shown = ray_head.ray_job(
            "submit", "--",
            # becomes jobs show ID
            "choreography-ray", "status", job_id, "--storage", storage_url, "--json",
        )  # fmt: skip
        assert shown.returncode == 0, explain(shown)
        state = submitted_json(shown.stdout)
        return state if state["status"] in TERMINAL else None

    state = eventually(finished, SUBMITTED_JOB_SECONDS, "a submission that sees the job end", 1.0)
    assert state["status"] == "CompletedSuccessfully", state
    assert state["id"] == job_id
    assert state["progress"]["successful_steps"] == 3

    # The first submission's Ray job ended with its entrypoint, which waited for the job.
    def first_ended() -> str | None:
        asked = ray_head.ray_job("status", submission)
        ended = re.search(rf"Job '{submission}' (succeeded|failed|was stopped)", asked.stdout)
        return ended.group(1) if ended else None

    ended = eventually(first_ended, SUBMITTED_JOB_SECONDS, "the first Ray job to end", 1.0)
    assert ended == "succeeded"


#: Users without the cluster's token, and what `ray job submit` shows them on stderr (the last
#: line of a traceback, `ray.exceptions.AuthenticationError: ...`): the variables each sets on
#: top of a home without `~/.ray/auth_token` and none of the head's RAY_AUTH_* variables.
WITHOUT_THE_TOKEN = {
    "no-auth-mode": (
        {},
        ["Authentication required: Unauthorized: Missing authentication token",
         "Note: RAY_AUTH_MODE is currently 'disabled' (not 'token')"],
    ),
    "auth-mode-token-no-token-file": (
        {"RAY_AUTH_MODE": "token"},
        ["Token authentication is enabled but Ray couldn't find an authentication token",
         "set RAY_AUTH_TOKEN_PATH to point to it"],
    ),
    "wrong-token": (
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
        ["Authentication failed: Forbidden: Invalid authentication token",
         "the authentication token is invalid or incorrect"],
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    "case",  # 6 s each: the first in the default tier, the others in the slow tier
    [
        pytest.param(c, marks=() if i == 0 else pytest.mark.slow)
        for i, c in enumerate(WITHOUT_THE_TOKEN)
    ],
)
@pytest.mark.timeout(SUBMIT_TEST_SECONDS)
def test_ray_job_submit__without_the_token_fails_clearly_and_nothing_runs(
    case: str, ray_head: RayHead, tmp_path: Path, storage_url: str
) -> None:
    variables, expected = WITHOUT_THE_TOKEN[case]
    env = {k: v for k, v in ray_head.env.items() if not k.startswith("RAY_AUTH_")}
    env["HOME"] = str(tmp_path / "home")
    env.update(variables)
    request = write_request(tmp_path, {"names": ["ada"]})
    submission = f"cr-acceptance-{uuid.uuid4().hex[:8]}"

    done = ray_head.ray_job(
        "submit", "--submission-id", submission, "--",
        "choreography-ray", "run", JOB_TYPE, "--request", str(request),
        "--storage", storage_url,
        env=env,
    )  # fmt: skip

    assert done.returncode == 1, explain(done)
    for line in expected:
        assert line in done.stderr, explain(done)
    # Nothing ran: the cluster has no such submission, and the storage was never opened.
    listed = ray_head.ray_job("list")
    assert listed.returncode == 0, explain(listed)
    assert submission not in listed.stdout
    assert not Path(storage_url.removeprefix("sqlite:///")).exists()
