"""Upgrade safety on real Ray: jobs a cluster of an older release left in an SQLite file of the
oldest form (tests/fixtures/oldest_sqlite.sql) are rehydrated and run to completion; a job a
newer release wrote is refused, reported, never resumed and never written over.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.model import SCHEMA_VERSION
from choreography_ray.runtime import actors
from choreography_ray.types import type_path
from tests.fixtures import build_oldest_sqlite, set_column
from tests.runtime.conftest import FAST
from tests.runtime.rehydration_jobs import RecordedJob, RecordedStep, events_file
from tests.runtime.test_rehydration import EPOCH, events, get_job, ran, seed_recorded_job
from tests.support import RAY_NAMESPACE, eventually, read_trace

__all__ = ["events"]  # the fixture, used by name

NEWER = SCHEMA_VERSION + 1


def sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


@pytest.mark.timeout(120)
def test_oldest_form_sqlite_file__jobs_load_with_defaults_and_run_to_completion(
    connect, scope, storage_url, tmp_path, events
) -> None:
    log = str(tmp_path / "steps.jsonl")
    build_oldest_sqlite(
        sqlite_path(storage_url),
        scope=scope,
        namespace="old",
        log=log,
        job_type=type_path(RecordedJob),
        step_type=type_path(RecordedStep),
    )
    jobs = connect(reconciliation_interval=0)
    manager = jobs.manager(scope, "old")

    # Oldest first; the finished job is not resumed.
    assert manager.rehydrate() == ["old-running", "old-stopped"]

    done = manager.wait("old-running", timeout=60)
    assert done.status is cr.JobStatus.COMPLETED_SUCCESSFULLY, done
    assert (done.progress.total_steps, done.progress.successful_steps) == (5, 5)
    assert done.progress.failed_steps == 0
    # The running step (no attempt stored: attempt 0) ran again; each ran once, in stage order.
    assert ran(log, "old-running") == dict.fromkeys(["000001", "000002", "000003", "000004"], 1)
    order = [
        r["step"] for r in read_trace(log) if r["job"] == "old-running" and r["event"] == "end"
    ]
    assert order[-1] == "000004"

    # The stop (no stop_finalized stored: not finalized) is finalized, not resumed.
    stopped = eventually(
        lambda: (lambda j: j if j is not None and j.stop_finalized else None)(
            get_job(storage_url, "old-stopped")
        ),
        60,
        "the stop of the old job to be finalized",
    )
    assert stopped.status is cr.JobStatus.STOPPED
    assert ran(log, "old-stopped") == Counter()
    assert Counter(e["job"] for e in read_trace(events_file(scope, "stopped"))) == {
        "old-stopped": 1
    }

    old = manager.get("old-done")
    assert old.status is cr.JobStatus.COMPLETED_SUCCESSFULLY and old.stop_finalized is False
    # Every record the job system wrote back carries this release's schema version.
    with sqlite3.connect(sqlite_path(storage_url)) as connection:
        versions = dict(connection.execute("SELECT id, schema_version FROM jobs"))
    assert versions == dict.fromkeys(["old-running", "old-stopped", "old-done"], SCHEMA_VERSION)


@pytest.mark.timeout(120)
def test_newer_schema_version__job_not_resumed_but_reported_and_left_as_it_is(
    connect, scope, storage_url, tmp_path, events
) -> None:
    log = str(tmp_path / "steps.jsonl")
    newer = seed_recorded_job(
        storage_url,
        scope=scope,
        namespace="new",
        log=log,
        status=cr.JobStatus.RUNNING,
        steps=[(0, cr.StepStatus.SCHEDULED)] * 2,
    )
    set_column(
        sqlite_path(storage_url), "UPDATE jobs SET schema_version = ? WHERE id = ?", NEWER, newer
    )
    with sqlite3.connect(sqlite_path(storage_url)) as connection:
        before = connection.execute("SELECT * FROM jobs WHERE id = ?", (newer,)).fetchall()
    jobs = connect(reconciliation_interval=0)
    manager = jobs.manager(scope, "new")

    expected = f"record {newer!r} in 'jobs' has schema_version {NEWER}"
    # Reported to whoever asks: rehydration, get, list and an explicit resume.
    for ask in (
        manager.rehydrate,
        lambda: manager.get(newer),
        manager.list,
        lambda: manager.resume(newer),
    ):
        with pytest.raises(cr.UnsupportedSchemaError) as refused:
            ask()
        assert expected in str(refused.value)
        assert (refused.value.version, refused.value.supported) == (NEWER, SCHEMA_VERSION)

    # The job's own actor, activated on it, refuses to load it and writes nothing.
    options = cr.JobsOptions(**{**FAST, "reconciliation_interval": 0}).model_dump_json()
    actor: Any = actors.job_actor(newer, storage_url, options, RAY_NAMESPACE)
    with pytest.raises(cr.UnsupportedSchemaError):
        ray.get(actor.state.remote(), timeout=30)

    with sqlite3.connect(sqlite_path(storage_url)) as connection:
        after = connection.execute("SELECT * FROM jobs WHERE id = ?", (newer,)).fetchall()
        steps = connection.execute(
            "SELECT status, COUNT(*) FROM job_steps WHERE job_id = ? GROUP BY 1", (newer,)
        ).fetchall()
    assert after == before
    assert steps == [("Scheduled", 2)]
    assert read_trace(log) == []
    assert EPOCH  # the seeded job is an hour old, as a dead cluster left it
