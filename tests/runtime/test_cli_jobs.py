"""The CLI's acting commands on real Ray: `jobs stop|resume|remove|retry-failed|rehydrate` as
subprocesses that join this session's cluster with `--address` and act through the running
jobs manager (one job and in bulk, refusals and their exit codes), and `run`'s Ctrl-C: a real
SIGINT stops the job when stdin is not a terminal, or detaches with `--on-interrupt detach`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from tests.runtime.cli_jobs import Held, HoldRequest
from tests.support import RAY_NAMESPACE, eventually, in_storage, with_default_sigint

ROOT = Path(__file__).resolve().parents[2]
HELD = "tests.runtime.cli_jobs:Held"
pytestmark = pytest.mark.timeout(300)


def env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": str(ROOT)}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", *args],
        cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def refused(done: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert done.returncode == code, explain(done)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], explain(done)


@pytest.fixture
def address(ray_cluster: None) -> str:
    return str(ray.get_runtime_context().gcs_address)


def stored(url: str, job_id: str) -> cr.JobState | None:
    return in_storage(url, lambda storage: storage.get_job(job_id))


def test_stop_resume_remove__one_job_through_its_manager(
    connect: Any, scope: str, storage_url: str, address: str
) -> None:
    manager = connect().manager(scope, "default")
    job_id = manager.start(Held, HoldRequest(count=2, seconds=120)).job_id
    eventually(lambda: manager.get(job_id).status is cr.JobStatus.RUNNING, 30, "running")
    acting = ["--storage", storage_url, "--address", address, "--ray-namespace", RAY_NAMESPACE]

    stop = cli("jobs", "stop", job_id, *acting, "--json")
    assert stop.returncode == 0, explain(stop)
    answer = json.loads(stop.stdout)
    assert answer["done"] and answer["scope"] == scope and answer["operation"] == "stop"
    assert manager.wait(job_id, timeout=60).status is cr.JobStatus.STOPPED
    refused(cli("jobs", "stop", job_id, *acting), 1, "StopJobError.JOB_IS_NOT_RUNNING")

    resume = cli("jobs", "resume", job_id, *acting)
    assert resume.returncode == 0 and f"job {job_id}: resumed" in resume.stdout, explain(resume)
    eventually(lambda: manager.get(job_id).status is cr.JobStatus.RUNNING, 30, "running again")

    # With --scope and --namespace the job's record is not read first: the manager answers.
    named = ["--scope", scope, "--namespace", "default"]
    remove = cli("jobs", "remove", job_id, *named, *acting)
    assert remove.returncode == 0 and "removed" in remove.stdout, explain(remove)
    eventually(lambda: stored(storage_url, job_id) is None, 60, "the job's record removed")
    refused(cli("jobs", "stop", "no-such-job", *named, *acting), 2, "no-such-job")

    nobody = ["--scope", f"nobody-{scope}", "--namespace", "default"]
    refused(cli("jobs", "stop", "x", *nobody, *acting), 1, "no jobs manager")
    other = ["--storage", f"sqlite:///{Path(storage_url[10:]).with_name('other.db')}",
             "--address", address, "--ray-namespace", RAY_NAMESPACE]  # fmt: skip
    refused(cli("jobs", "stop", "x", *named, *other), 2, "give its --storage")


@pytest.mark.slow  # five CLI subprocesses (17 s); stop, resume and remove run in the default tier
def test_retry_failed_bulk_remove_and_rehydrate(
    connect: Any, scope: str, storage_url: str, address: str
) -> None:
    manager = connect().manager(scope, "default")
    failing = manager.start(Held, HoldRequest(count=2, seconds=0, fail_first=True)).job_id
    succeeded = manager.start(Held, HoldRequest(count=1, seconds=0)).job_id
    assert manager.wait(failing, timeout=60).status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert manager.wait(succeeded, timeout=60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    acting = ["--storage", storage_url, "--address", address, "--ray-namespace", RAY_NAMESPACE]

    # The failed steps as stored, with their first attempt's message (read-only, no Ray).
    steps = cli("jobs", "steps", failing, "--storage", storage_url, "--json")
    assert [(s["attempt"], s["status"]) for s in json.loads(steps.stdout)] == [
        (1, "CompletedWithFailure")] * 2, explain(steps)  # fmt: skip
    assert "fails on purpose" in json.loads(steps.stdout)[0]["status_changes"][-1][
        "exception_messages"][0]  # fmt: skip

    retry = cli("jobs", "retry-failed", failing, *acting, "--json")
    assert retry.returncode == 0, explain(retry)
    assert json.loads(retry.stdout)["retried_steps"] == 2
    assert manager.wait(failing, timeout=60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    refused(cli("jobs", "retry-failed", succeeded, *acting), 1,
            "JOB_IS_NOT_COMPLETED_WITH_FAILURES")  # fmt: skip

    select = ["--status", "completed-successfully", "--scope", scope]
    dry = cli("jobs", "remove", *select, "--dry-run", "--json", "--storage", storage_url)
    assert sorted(j["job_id"] for j in json.loads(dry.stdout)) == sorted([failing, succeeded])
    bulk = cli("jobs", "remove", *select, "--yes", "--json", *acting)
    assert bulk.returncode == 0, explain(bulk)
    assert all(r["done"] for r in json.loads(bulk.stdout)) and len(json.loads(bulk.stdout)) == 2
    eventually(lambda: not in_storage(storage_url, lambda s: s.list_jobs(scope, "default")), 60,
               "both jobs removed")  # fmt: skip

    rehydrate = cli("jobs", "rehydrate", "--scope", scope, *acting, "--json")
    assert rehydrate.returncode == 0, explain(rehydrate)
    assert json.loads(rehydrate.stdout) == [{"scope": scope, "namespace": "default",
                                             "job_ids": []}]  # fmt: skip


class Run:
    """`choreography-ray run` of a `Held` job as a subprocess, its stderr read as it comes."""

    def __init__(self, tmp_path: Path, url: str, scope: str, address: str, *extra: str) -> None:
        request = tmp_path / f"request-{uuid.uuid4().hex[:6]}.json"
        # Steps that hold until stopped: the job cannot finish before the interrupt reaches it.
        request.write_text(json.dumps({"count": 2, "seconds": 3600}), encoding="utf-8")
        self.process = subprocess.Popen(
            with_default_sigint([sys.executable, "-m", "choreography_ray.cli", "run", HELD,
                                 "--request", str(request), "--storage", url, "--scope", scope,
                                 "--address", address, "--ray-namespace", RAY_NAMESPACE, *extra]),
            cwd=ROOT, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.err: list[str] = []
        assert self.process.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stderr,))
        self._reader.start()

    def _read(self, stream: Any) -> None:
        self.err.extend(iter(stream.readline, ""))

    def started(self) -> str:
        """The job id, once `run` said it started the job (it waits for it next)."""

        def said() -> str | None:
            assert self.process.poll() is None, "".join(self.err)
            line = next((line for line in self.err if line.startswith("started job ")), None)
            return None if line is None else line.split()[2]

        return eventually(said, 90, "run to start the job")

    def interrupt(self) -> tuple[int, str, str]:
        """SIGINT, then its exit code, stdout and stderr. `run` takes Ctrl-C as the job's from
        the line that says it started (`started`)."""
        self.process.send_signal(signal.SIGINT)
        # Not `communicate()`: it would read stderr too, taking lines from the reader thread.
        # The JSON on stdout is small, so the pipe cannot fill while the process exits.
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run still running 90 s after SIGINT:\n{''.join(self.err)}")
        finally:
            self.process.kill()
            self._reader.join(10)
        assert self.process.stdout is not None
        return self.process.returncode, self.process.stdout.read(), "".join(self.err)


def test_run__ctrl_c_stops_the_job_without_a_terminal_or_detaches_when_asked(
    tmp_path: Path, address: str
) -> None:
    url = f"sqlite:///{tmp_path / 'run.db'}"
    scope = f"run-{uuid.uuid4().hex[:8]}"

    run = Run(tmp_path, url, scope, address)
    job_id = run.started()
    code, out, err = run.interrupt()
    assert code == 130, (out, err)
    state = json.loads(out)
    assert state["id"] == job_id and state["status"] == "Stopped" and state["stop_finalized"]
    assert f"stopping job {job_id}" in err

    detached = Run(tmp_path, url, scope, address, "--on-interrupt", "detach", "-v")
    second = detached.started()
    code, out, err = detached.interrupt()
    assert code == 130, (out, err)
    assert json.loads(out) == {"job_id": second, "scope": scope, "namespace": "default",
                               "storage": url}  # fmt: skip
    assert "detached" in err and "joining Ray at" in err  # -v: the CLI's info records
    left = stored(url, second)  # its steps hold until stopped: RUNNING unless detach stopped it
    assert left is not None and left.status is cr.JobStatus.RUNNING
    stop = cli("jobs", "stop", second, "--storage", url, "--address", address,
               "--ray-namespace", RAY_NAMESPACE)  # fmt: skip
    assert stop.returncode == 0, explain(stop)
