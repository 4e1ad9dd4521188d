"""The `jobs` commands (and the `status`/`list` aliases) as a user runs them, without Ray: a real
subprocess against a real SQLite file whose jobs are written through the storage API. Exit
codes, `--json` parsed, one clear line on an error (a traceback only with `--debug`), log
records as JSON lines, and no file created by a read-only command.

The acting commands' work through a jobs manager is tried on real Ray in
tests/runtime/test_cli_jobs.py; here they are refused before any Ray starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import choreography_ray as cr
from choreography_ray.storage import Storage
from tests.acceptance.test_cli import REFUSE_SECONDS, REPO, cli, cli_env, explain
from tests.support import eventually, free_port, in_storage, left_behind, seed_job

#: The slow tier: each test runs the CLI as a subprocess several times (about 5 s a test). In
#: the default tier, tests/unit/test_cli_jobs.py checks the commands' rules in-process and
#: tests/runtime/test_cli_jobs.py runs the acting commands as subprocesses.
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

JOB_TYPE = "pkg.pipelines:Reindex"
STEP_TYPE = "pkg.pipelines:Shard"
NOW = datetime.now(UTC)


def step_failed(job_id: str, step_id: str, message: str, attempt: int = 2) -> cr.StepState:
    return cr.StepState(
        job_id=job_id, step_id=step_id, type=STEP_TYPE, status=cr.StepStatus.FAILED,
        attempt=attempt, status_changes=(cr.StatusChange(status=cr.StepStatus.RUNNING),
        cr.StatusChange(status=cr.StepStatus.FAILED, exception_messages=(message,))),
    )  # fmt: skip


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An SQLite file with three jobs in two managers: one completed with two failed steps
    (three days old), one running with a second stage waiting, one that succeeded."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    failed, _ = left_behind(scope="ops", namespace="a", status=cr.JobStatus.RUNNING,
                            job_type=JOB_TYPE, step_type=STEP_TYPE, steps=[],
                            created=NOW - timedelta(days=3), job_id="job-failed")  # fmt: skip
    counts = {"total_steps": 4, "successful_steps": 2, "failed_steps": 2}
    stage = cr.StageProgress(stage=0, is_started=True, **counts)
    failed = failed.model_copy(update={"progress": cr.JobProgress(**counts, stages=(stage,))})
    failed = failed.with_status(cr.JobStatus.COMPLETED_WITH_FAILURES, "2 steps failed")
    steps = [step_failed("job-failed", f"s{i}", f"shard {i} is corrupt") for i in (1, 2)]
    stored = [(0, cr.StepStatus.RUNNING), (10, cr.StepStatus.SCHEDULED)]
    running, scheduled = left_behind(scope="ops", namespace="b", status=cr.JobStatus.RUNNING,
                                     job_type="pkg.pipelines:Embed", step_type=STEP_TYPE,
                                     steps=stored, created=NOW - timedelta(hours=1),
                                     succeeded=2, job_id="job-running")  # fmt: skip
    done, _ = left_behind(scope="ops", namespace="a", status=cr.JobStatus.COMPLETED_SUCCESSFULLY,
                          job_type=JOB_TYPE, step_type=STEP_TYPE, steps=[], succeeded=1,
                          created=NOW - timedelta(minutes=5), job_id="job-done")  # fmt: skip

    async def keys(storage: Storage) -> None:
        for key in ("a", "b"):
            await storage.add_manager_key(cr.JobsManagerKey(scope="ops", namespace=key))

    in_storage(url, keys)
    seed_job(url, failed, steps)
    seed_job(url, running, scheduled)
    seed_job(url, done)
    return url


def listed(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, explain(done)
    return [job["id"] for job in json.loads(done.stdout)]


def one_clear_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    """The command failed with `code` and said why in one line on stderr."""
    assert done.returncode == code, explain(done)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), explain(done)
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], explain(done)


# -- list, show, steps ----------------------------------------------------------------------


def test_list__newest_first_filtered_by_status_type_since_and_limited(url: str) -> None:
    assert listed(cli("jobs", "list", "--storage", url, "--json")) == [
        "job-done", "job-running", "job-failed"]  # fmt: skip
    two = cli("jobs", "list", "--storage", url, "--json", "--status", "running",
              "--status", "CompletedWithFailures")  # fmt: skip
    assert listed(two) == ["job-running", "job-failed"]
    assert listed(cli("jobs", "list", "--storage", url, "--json", "--type", "Reindex")) == [
        "job-done", "job-failed"]  # fmt: skip
    assert listed(cli("jobs", "list", "--storage", url, "--json", "--type", JOB_TYPE,
                      "--since", "1d")) == ["job-done"]  # fmt: skip
    since = (NOW - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    assert listed(cli("jobs", "list", "--storage", url, "--json", "--since", since,
                      "--namespace", "b")) == ["job-running"]  # fmt: skip

    limited = cli("jobs", "list", "--storage", url, "--limit", "1")
    assert limited.returncode == 0, explain(limited)
    assert "job-done" in limited.stdout and "job-failed" not in limited.stdout
    assert "showing the newest 1 of 3 jobs" in limited.stderr

    # `list`, the command of earlier releases, is the same command.
    table = cli("list", "--storage", url, "--scope", "ops", "--status", "RUNNING")
    assert table.returncode == 0, explain(table)
    assert "job-running" in table.stdout and "job-done" not in table.stdout
    assert "RUNNING" in table.stdout and "2/4" in table.stdout

    bad = cli("jobs", "list", "--storage", url, "--since", "yesterday")
    assert bad.returncode == 2 and "neither a duration" in bad.stderr, explain(bad)


def test_show__stages_history_error_and_failed_steps(url: str) -> None:
    done = cli("jobs", "show", "job-failed", "--storage", url)

    assert done.returncode == 0, explain(done)
    shown = ["COMPLETED_WITH_FAILURES", "pkg.pipelines:Reindex", "ops/a", "Status history",
             "PREPARING_JOB", "2 steps failed", "shard 1 is corrupt",
             "shard 2 is corrupt"]  # fmt: skip
    for text in shown:
        assert text in done.stdout, (text, explain(done))

    as_json = cli("jobs", "show", "job-running", "--storage", url, "--json")
    assert as_json.returncode == 0, explain(as_json)
    state = cr.JobState.model_validate(json.loads(as_json.stdout))
    assert state.id == "job-running" and state.status is cr.JobStatus.RUNNING
    assert [s.total_steps for s in state.progress.stages] == [3, 1]

    # `status`, the command of earlier releases, is `jobs show`.
    alias = cli("status", "job-running", "--storage", url, "--json")
    assert json.loads(alias.stdout) == json.loads(as_json.stdout)


def test_steps__failed_ones_by_default_with_attempts_and_messages(url: str) -> None:
    done = cli("jobs", "steps", "job-failed", "--storage", url, "--json")

    assert done.returncode == 0, explain(done)
    steps = json.loads(done.stdout)
    assert [(s["step_id"], s["attempt"], s["status"]) for s in steps] == [
        ("s1", 2, "Failed"), ("s2", 2, "Failed")]  # fmt: skip
    assert steps[0]["status_changes"][-1]["exception_messages"] == ["shard 1 is corrupt"]

    table = cli("jobs", "steps", "job-failed", "--storage", url, "--limit", "1")
    assert table.returncode == 0, explain(table)
    assert "shard 1 is corrupt" in table.stdout and "shard 2" not in table.stdout
    assert "--after s1" in table.stdout
    after = cli("jobs", "steps", "job-failed", "--storage", url, "--after", "s1", "--json")
    assert [s["step_id"] for s in json.loads(after.stdout)] == ["s2"]

    running = cli("jobs", "steps", "job-running", "--storage", url, "--json")
    assert json.loads(running.stdout) == []  # nothing failed
    stored = cli("jobs", "steps", "job-running", "--storage", url, "--status", "all", "--json")
    assert [s["status"] for s in json.loads(stored.stdout)] == ["Running", "Scheduled"]
    waiting = cli("jobs", "steps", "job-running", "--storage", url, "--status", "scheduled",
                  "--json")  # fmt: skip
    assert [s["stage"] for s in json.loads(waiting.stdout)] == [10]


# -- watch ----------------------------------------------------------------------------------


def test_watch__a_settled_job_returns_at_once_with_its_exit_code(url: str) -> None:
    done = cli("jobs", "watch", "job-done", "--storage", url)
    assert done.returncode == 0, explain(done)
    assert "COMPLETED_SUCCESSFULLY" in done.stdout

    failed = cli("jobs", "watch", "job-failed", "--storage", url)
    assert failed.returncode == 1, explain(failed)
    assert "COMPLETED_WITH_FAILURES" in failed.stdout


def has_open(pid: int, path: str) -> bool:
    """The process holds `path` open (Linux: its /proc fd links)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == os.path.realpath(path) for fd in fds.iterdir())
    except OSError:  # it exited meanwhile, or an fd closed while read
        return False


def test_watch__follows_a_running_job_until_it_completes(url: str) -> None:
    watcher = subprocess.Popen(
        [sys.executable, "-m", "choreography_ray.cli", "jobs", "watch", "job-running",
         "--storage", url, "--interval", "0.2"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        db = url.removeprefix("sqlite:///")
        # It opens the storage to read the job (its first read follows at once).
        eventually(lambda: watcher.poll() is not None or has_open(watcher.pid, db), 30,
                   "the watcher to open the job's storage")  # fmt: skip
        assert watcher.poll() is None, watcher.communicate()

        async def complete(storage: Storage) -> None:
            state = await storage.get_job("job-running")
            assert state is not None
            stages = tuple(s.model_copy(update={"is_started": True,
                                                "successful_steps": s.total_steps})
                           for s in state.progress.stages)  # fmt: skip
            progress = state.progress.model_copy(update={"successful_steps": 4, "stages": stages})
            finished = state.model_copy(update={"progress": progress})
            await storage.save_job(finished.with_status(cr.JobStatus.COMPLETED_SUCCESSFULLY))

        in_storage(url, complete)
        out, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        watcher.wait()
    assert watcher.returncode == 0, (out, err)
    assert "COMPLETED_SUCCESSFULLY" in out and "Traceback" not in err, (out, err)


# -- what users get wrong -------------------------------------------------------------------


def test_unknown_job__one_clear_line_and_exit_2(url: str) -> None:
    for command in ("show", "steps", "watch", "stop", "retry-failed"):
        done = cli("jobs", command, "no-such-job", "--storage", url, timeout=REFUSE_SECONDS)
        one_clear_line(done, 2, "no job no-such-job")
    one_clear_line(cli("status", "no-such-job", "--storage", url), 2, "no job no-such-job")
    # Another scope's job is not found there.
    one_clear_line(cli("jobs", "show", "job-failed", "--storage", url, "--scope", "elsewhere"),
                   2, "no job job-failed in", "(elsewhere)")  # fmt: skip
    assert cli("jobs", "steps", "job-failed", "--storage", url, "--scope", "ops",
               "--namespace", "a").returncode == 0  # fmt: skip


def test_read_only_commands__a_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "missing.db"
    url = f"sqlite:///{missing}"

    for args in (["status", "abc"], ["list"], ["jobs", "show", "abc"], ["jobs", "steps", "abc"],
                 ["jobs", "watch", "abc"], ["jobs", "stop", "abc"],
                 ["jobs", "remove", "--status", "failed", "--dry-run"],
                 ["scheduler", "manifests"]):  # fmt: skip
        done = cli(*args, "--storage", url, timeout=REFUSE_SECONDS)
        one_clear_line(done, 2, "no SQLite database at", str(missing))
    assert list(tmp_path.iterdir()) == []


def test_bad_storage_urls__one_clear_line_and_exit_2() -> None:
    one_clear_line(cli("jobs", "list", "--storage", "postgres://db/jobs"), 2,
                   "unknown storage URL")  # fmt: skip
    one_clear_line(cli("jobs", "show", "x", "--storage", "memory://"), 2,
                   "memory:// storage lives inside a running Ray cluster")  # fmt: skip


def test_unreachable_storage__one_clear_line_and_exit_4() -> None:
    url = f"mongodb://127.0.0.1:{free_port()}/db?serverSelectionTimeoutMS=300"
    for args in (["jobs", "list"], ["jobs", "show", "abc"], ["jobs", "stop", "abc"]):
        done = cli(*args, "--storage", url, timeout=REFUSE_SECONDS)
        one_clear_line(done, 4, "is unavailable", "check that the database can be reached")


def test_unreachable_ray_address__one_clear_line_and_exit_4(tmp_path: Path, url: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    acting = cli("jobs", "stop", "job-running", "--storage", url, "--address", address)
    one_clear_line(acting, 4, f"cannot reach the Ray cluster at {address}")
    rehydrate = cli("jobs", "rehydrate", "--storage", url, "--address", address)
    one_clear_line(rehydrate, 4, "cannot reach the Ray cluster")
    request = tmp_path / "request.json"
    request.write_text('{"names": ["ada"]}', encoding="utf-8")
    run = cli("run", "tests.acceptance.acceptance_jobs:Greet", "--request", str(request),
              "--storage", f"sqlite:///{tmp_path / 'run.db'}", "--address", address)  # fmt: skip
    one_clear_line(run, 4, "cannot reach the Ray cluster")
    assert not (tmp_path / "run.db").exists()
    trigger = cli("scheduler", "trigger", "nightly", "--storage", url, "--address", address)
    one_clear_line(trigger, 4, "cannot reach the Ray cluster")
    assert time.monotonic() - began < 60  # no `ray.init` retrying for minutes


def test_bad_request_and_bad_job_type__one_clear_line_and_exit_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    request = tmp_path / "request.json"
    request.write_text('{"names": ', encoding="utf-8")
    one_clear_line(cli("run", "tests.acceptance.acceptance_jobs:Greet", "--request",
                       str(request), "--storage", url), 2, "is not valid JSON")  # fmt: skip
    one_clear_line(cli("run", "no_such_package.jobs:Job", "--storage", url), 2,
                   "unknown job type", "no_such_package")  # fmt: skip
    assert not (tmp_path / "jobs.db").exists()


def test_acting_commands__refused_before_ray_without_an_address_or_a_selection(url: str) -> None:
    one_clear_line(cli("jobs", "stop", "job-running", "--storage", url), 2,
                   "give --address (or set $RAY_ADDRESS)")  # fmt: skip
    one_clear_line(cli("jobs", "remove", "--status", "completed-successfully", "--storage", url),
                   2, "needs --yes when stdin is not a terminal")  # fmt: skip
    usage = cli("jobs", "resume", "--storage", url)
    assert usage.returncode == 2 and "give a JOB_ID, or --status" in usage.stderr, explain(usage)
    both = cli("jobs", "stop", "job-running", "--status", "running", "--storage", url)
    assert both.returncode == 2 and "not both" in both.stderr, explain(both)


def test_dry_run__lists_what_would_be_touched_without_ray(url: str) -> None:
    done = cli("jobs", "remove", "--type", "Reindex", "--storage", url, "--dry-run", "--json")

    assert done.returncode == 0, explain(done)
    assert [(j["job_id"], j["scope"], j["namespace"], j["status"])
            for j in json.loads(done.stdout)] == [
        ("job-done", "ops", "a", "CompletedSuccessfully"),
        ("job-failed", "ops", "a", "CompletedWithFailures"),
    ]  # fmt: skip
    table = cli("jobs", "stop", "--status", "running", "--storage", url, "--dry-run")
    assert table.returncode == 0, explain(table)
    assert "Would stop 1 job(s)" in table.stdout and "job-running" in table.stdout
    # Nothing was touched.
    assert listed(cli("jobs", "list", "--storage", url, "--json")) == [
        "job-done", "job-running", "job-failed"]  # fmt: skip


# -- logging and --debug --------------------------------------------------------------------


def test_log_json__every_stderr_line_is_a_json_record(url: str, tmp_path: Path) -> None:
    done = cli("jobs", "list", "--storage", url, "-vv", "--log-json", "--json")
    assert done.returncode == 0, explain(done)
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert records, explain(done)
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["level"] == "DEBUG" and "read-only" in r["message"] for r in records)
    assert json.loads(done.stdout)  # stdout is still the data

    missing = cli("jobs", "show", "abc", "--storage", f"sqlite:///{tmp_path / 'no.db'}",
                  "--log-json")  # fmt: skip
    assert missing.returncode == 2, explain(missing)
    (record,) = [json.loads(line) for line in missing.stderr.splitlines()]
    assert record["level"] == "ERROR" and "no SQLite database" in record["message"]
    datetime.fromisoformat(record["time"])


def test_debug__the_traceback_comes_with_the_line() -> None:
    url = f"mongodb://127.0.0.1:{free_port()}/db?serverSelectionTimeoutMS=300"
    plain = cli("jobs", "list", "--storage", url)
    assert "Traceback" not in plain.stderr
    debug = cli("jobs", "list", "--storage", url, "--debug")
    assert debug.returncode == 4, explain(debug)
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("error: ")
    # The global options go before the command too.
    root = cli("--debug", "jobs", "list", "--storage", url)
    assert root.returncode == 4 and "Traceback" in root.stderr, explain(root)
