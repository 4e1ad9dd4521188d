"""The acting commands' bulk form in process, on an SQLite file and without Ray: `--older-than`
with `--dry-run`, and `retry-failed --signature/--step` reaching the jobs manager (a recording
stand-in of it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.cli.jobs import acting
from choreography_ray.storage import open_storage
from tests.unit.test_bulk import JOBS

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> None:
        storage = open_storage(url)
        try:
            for state in JOBS:
                await storage.create_job(state)
        finally:
            await storage.close()

    asyncio.run(seed())
    return url


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["jobs", *args], terminal_width=200)


def test_older_than__dry_run_lists_the_jobs_in_their_status_that_long(url: str) -> None:
    done = run("remove", "--older-than", "4h", "--storage", url, "--dry-run", "--json")
    assert done.exit_code == 0, done.output
    assert [(j["job_id"], j["status"]) for j in json.loads(done.output)] == [
        ("failed-5h", "Failed"),
        ("done-2d", "CompletedSuccessfully"),
    ]  # newest first

    narrowed = run("stop", "--older-than", "1h", "--status", "completed-successfully",
                   "--scope", "lab", "--storage", url, "--dry-run")  # fmt: skip
    assert narrowed.exit_code == 0, narrowed.output
    assert "Would stop 1 job(s)" in narrowed.output and "done-2d" in narrowed.output


@pytest.mark.parametrize("wrong", ["soon", "2999-01-01"])
def test_older_than__a_bad_duration_is_a_usage_error(url: str, wrong: str) -> None:
    done = run("resume", "--older-than", wrong, "--storage", url, "--dry-run")
    assert done.exit_code == 2 and "--older-than" in done.output, done.output


def test_older_than__not_with_a_job_id(url: str) -> None:
    done = run("stop", "done-2d", "--older-than", "1h", "--storage", url, "--dry-run")
    assert done.exit_code == 2 and "not both" in done.output, done.output


class Manager:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, list[str] | None]] = []

    async def retry_failed_steps(
        self, job_id: str, signature: str | None = None, step_ids: list[str] | None = None
    ) -> int:
        self.calls.append((job_id, signature, step_ids))
        return len(step_ids or ()) or 7


def test_retry_failed__signature_and_steps_reach_the_manager(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = Manager()

    async def get(self: acting.Managers, scope: str, namespace: str) -> Manager:
        return manager

    monkeypatch.setattr(acting.Managers, "get", get)
    monkeypatch.setattr(acting, "joined", lambda *_: contextlib.nullcontext())
    common = ["--storage", url, "--address", "127.0.0.1:1", "--json"]

    one = run("retry-failed", "done-2d", "--signature", "ValueError: shard <n>", "--step", "s1",
              "--step", "s2", *common)  # fmt: skip
    assert one.exit_code == 0, one.output
    assert json.loads(one.output)["retried_steps"] == 2
    many = run("retry-failed", "--status", "completed-successfully", "--older-than", "1h",
               "--signature", "Timeout", "--yes", *common)  # fmt: skip
    assert many.exit_code == 0, many.output
    assert manager.calls == [("done-2d", "ValueError: shard <n>", ["s1", "s2"]),
                             ("done-2d", "Timeout", None)]  # fmt: skip
