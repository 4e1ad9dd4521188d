"""`jobs failures`, `jobs steps --signature` and the failures of `jobs show` as a user runs them,
without Ray: a subprocess against a real SQLite file whose job and failed steps (with their
failure signatures) are written through the storage API."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import choreography_ray as cr
from choreography_ray.failures import failure_signature
from tests.acceptance.test_cli import cli, explain
from tests.acceptance.test_cli_jobs import JOB_TYPE, STEP_TYPE, one_clear_line, step_failed
from tests.support import left_behind, seed_job

#: The slow tier, as tests/acceptance/test_cli_jobs.py: each test runs the CLI several times.
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

NOW = datetime.now(UTC)
KEY_ERROR = "KeyError: '<v>'"
TIMEOUT = "TimeoutError: fetch of <url> took <n> s; retried <n> times"
LONG = "TimeoutError: fetch of https://cdn.example/a/b took 30.5 s; retried 3 times"
#: step id: (message, code, hours ago): 3 KeyErrors, 2 timeouts, 1 disk full, 1 with a code.
FAILURES = {
    "s1": ("KeyError: 'doc-1'", None, 3),
    "s2": ("KeyError: 'doc-2'", None, 1),
    "s3": ("KeyError: 'doc-3'", None, 2),
    "s4": (LONG, None, 5),
    "s5": (LONG.replace("30.5", "31"), None, 4),
    "s6": ("disk full", None, 1),
    "s7": ("the quota of tenant-a is spent", "quota", 1),
}


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An SQLite file with a job that completed with 7 failed steps of 4 signatures, and one
    that succeeded."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    failed, _ = left_behind(scope="ops", namespace="a", status=cr.JobStatus.RUNNING,
                            job_type=JOB_TYPE, step_type=STEP_TYPE, steps=[],
                            created=NOW - timedelta(days=1), job_id="job-failed")  # fmt: skip
    counts = {"total_steps": 10, "successful_steps": 3, "failed_steps": 7}
    stage = cr.StageProgress(stage=0, is_started=True, **counts)
    failed = failed.model_copy(update={"progress": cr.JobProgress(**counts, stages=(stage,))})
    failed = failed.with_status(cr.JobStatus.COMPLETED_WITH_FAILURES, "7 steps failed")
    steps = [
        step_failed("job-failed", step_id, message).model_copy(update={
            "failure_signature": failure_signature(message, code),
            "updated": NOW - timedelta(hours=hours),
        })
        for step_id, (message, code, hours) in FAILURES.items()
    ]  # fmt: skip
    done, _ = left_behind(scope="ops", namespace="a", status=cr.JobStatus.COMPLETED_SUCCESSFULLY,
                          job_type=JOB_TYPE, step_type=STEP_TYPE, steps=[], succeeded=1,
                          created=NOW - timedelta(minutes=5), job_id="job-done")  # fmt: skip
    seed_job(url, failed, steps)
    seed_job(url, done)
    return url


def test_failures__clusters_most_frequent_first_with_an_example_and_when_seen(url: str) -> None:
    as_json = cli("jobs", "failures", "job-failed", "--storage", url, "--json")

    assert as_json.returncode == 0, explain(as_json)
    clusters = [cr.FailureCluster.model_validate(c) for c in json.loads(as_json.stdout)]
    assert [(c.signature, c.count, c.example_step_id) for c in clusters] == [
        (KEY_ERROR, 3, "s1"), (TIMEOUT, 2, "s4"), ("disk full", 1, "s6"),
        ("quota", 1, "s7")]  # fmt: skip
    assert clusters[1].example_message == LONG
    hour = timedelta(hours=1)
    assert clusters[0].first_seen == NOW - 3 * hour and clusters[0].last_seen == NOW - hour

    table = cli("jobs", "failures", "job-failed", "--storage", url)
    assert table.returncode == 0, explain(table)
    for text in ("4 failure signature(s)", KEY_ERROR, "KeyError: 'doc-1'", "quota",
                 "the quota of tenant-a is spent", "cdn.example",
                 (NOW - 5 * hour).strftime("%Y-%m-%d %H:%M:%S"),
                 "jobs steps job-failed --signature SIGNATURE"):  # fmt: skip
        assert text in table.stdout, (text, explain(table))


def test_failures__none_stored_and_an_unknown_job(url: str) -> None:
    done = cli("jobs", "failures", "job-done", "--storage", url)
    assert done.returncode == 0 and "No stored failed step of job job-done" in done.stdout
    assert json.loads(cli("jobs", "failures", "job-done", "--storage", url, "--json").stdout) == []

    one_clear_line(cli("jobs", "failures", "no-such-job", "--storage", url), 2,
                   "no job no-such-job")  # fmt: skip
    one_clear_line(cli("jobs", "failures", "job-failed", "--storage", url, "--scope", "other"),
                   2, "no job job-failed in", "(other)")  # fmt: skip


def test_steps__signature_lists_only_its_failed_steps_page_by_page(url: str) -> None:
    def ids(*options: str) -> list[str]:
        done = cli("jobs", "steps", "job-failed", "--storage", url, "--json", *options)
        assert done.returncode == 0, explain(done)
        return [s["step_id"] for s in json.loads(done.stdout)]

    assert ids("--signature", KEY_ERROR) == ["s1", "s2", "s3"]
    assert ids("--signature", "quota") == ["s7"]
    assert ids("--signature", "no such signature") == []
    assert ids("--signature", KEY_ERROR, "--limit", "2", "--after", "s1") == ["s2", "s3"]

    table = cli("jobs", "steps", "job-failed", "--storage", url, "--signature", KEY_ERROR,
                "--limit", "2")  # fmt: skip
    assert table.returncode == 0, explain(table)
    assert f"(failed with signature {KEY_ERROR})" in table.stdout
    assert "KeyError: 'doc-2'" in table.stdout and "doc-3" not in table.stdout
    assert "--after s2" in table.stdout

    both = cli("jobs", "steps", "job-failed", "--storage", url, "--signature", KEY_ERROR,
               "--status", "all")  # fmt: skip
    assert both.returncode == 2 and "--signature lists failed steps" in both.stderr, explain(both)


def test_show__the_most_frequent_failure_signatures_after_the_failed_steps(url: str) -> None:
    done = cli("jobs", "show", "job-failed", "--storage", url)

    assert done.returncode == 0, explain(done)
    failures = done.stdout.partition("Failures by signature (3 of 4)")[2]
    assert failures, explain(done)
    assert failures.index(KEY_ERROR) < failures.index(TIMEOUT) < failures.index("disk full")
    assert "quota" not in failures  # the fourth
    assert "All of them: choreography-ray jobs failures job-failed" in failures

    succeeded = cli("jobs", "show", "job-done", "--storage", url)
    assert succeeded.returncode == 0 and "Failures by signature" not in succeeded.stdout
    as_json = cli("jobs", "show", "job-failed", "--storage", url, "--json")
    assert cr.JobState.model_validate_json(as_json.stdout).progress.failed_steps == 7
