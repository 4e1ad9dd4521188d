"""`choreography-ray scheduler ...` in process: the read-only commands on an SQLite file seeded
with scheduler records, and the acting commands' refusals before any Ray starts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.schedules import After, Cron, Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.storage import open_storage
from choreography_ray.storage.scheduler import scheduler_storage

runner = CliRunner()


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> None:
        storage = open_storage(url)
        sched = scheduler_storage(storage)
        nightly = Cron(expression="0 3 * * *", tz="Europe/Berlin")
        schedules = {"hourly": Every.hours(1), "nightly": nightly, "after": After(parent="hourly")}
        for name, schedule in schedules.items():
            await sched.upsert_manifest(
                Manifest(scope="ops", name=name, job_type="pkg.jobs:J", schedule=schedule), ()
            )
        await sched.save_run(ManifestRun(scope="ops", manifest="hourly", job_type="pkg.jobs:J",
                                         status=RunStatus.FAILED, job_id="j1"))  # fmt: skip
        await sched.add_dead_letter(DeadLetter(scope="ops", manifest="hourly", reason="out",
                                               retry_count_at_dead_letter=4))  # fmt: skip
        await storage.close()

    asyncio.run(seed())
    return url


def test_manifests__a_table_by_name_and_json(url: str) -> None:
    table = runner.invoke(app, ["scheduler", "manifests", "--storage", url, "--scope", "ops"])
    assert table.exit_code == 0, table.output
    assert "3 manifest(s) in scope ops" in table.stdout
    assert "every 1:00:00" in table.stdout and "after hourly" in table.stdout
    assert "Europe/Berlin" in table.stdout
    as_json = runner.invoke(app, ["scheduler", "manifests", "--storage", url, "--scope", "ops",
                                  "--json"])  # fmt: skip
    assert [m["name"] for m in json.loads(as_json.stdout)] == ["after", "hourly", "nightly"]


def test_runs_and_dead_letters__read_from_storage(url: str) -> None:
    runs = runner.invoke(app, ["scheduler", "runs", "hourly", "--storage", url, "--scope", "ops",
                               "--json"])  # fmt: skip
    assert runs.exit_code == 0, runs.output
    ((run,),) = [json.loads(runs.stdout)]
    assert run["status"] == "Failed" and run["job_id"] == "j1"
    letters = runner.invoke(app, ["scheduler", "dead-letters", "--storage", url, "--scope", "ops",
                                  "--status", "awaiting_intervention"])  # fmt: skip
    assert letters.exit_code == 0, letters.output
    assert "1 dead letter(s) in scope ops" in letters.stdout and "AWAITING_INTERVENTION" in (
        letters.stdout
    )
    none = runner.invoke(app, ["scheduler", "dead-letters", "--storage", url, "--scope", "ops",
                               "--status", "Acknowledged", "--json"])  # fmt: skip
    assert json.loads(none.stdout) == []
    assert DeadLetterStatus.ACKNOWLEDGED.value == "Acknowledged"


def test_a_bad_status_is_a_usage_error(url: str) -> None:
    done = runner.invoke(app, ["scheduler", "dead-letters", "--storage", url, "--status", "x"])
    assert done.exit_code == 2 and "not a dead letter status" in done.output


def test_memory_storage_cannot_be_read_without_a_cluster() -> None:
    done = runner.invoke(app, ["scheduler", "manifests", "--storage", "memory://"])
    assert done.exit_code == 2 and "memory:// storage lives inside" in done.output


@pytest.mark.parametrize(
    "args",
    [
        ["trigger", "m"],
        ["requeue", "dl"],
        ["acknowledge", "dl", "--note", "n"],
        ["requeue-all"],
        ["acknowledge-all", "hourly", "--note", "n"],
    ],
    ids=lambda a: a[0],
)
def test_acting_commands_need_an_address(
    url: str, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    done = runner.invoke(app, ["scheduler", *args, "--storage", url])
    assert done.exit_code == 2
    assert "give --address" in done.output
