"""Bad input, tried for real: each case gets a clear error, the process that met it stays up, and
nothing is half written.

The CLI's own input (a request file, a job type path, a storage URL) is tried on the CLI as a
subprocess; the rest on the Python API against a real local Ray of this module's own, on real
SQLite files (hand-edited with sqlite3, made read-only, put on a full tmpfs), real sockets (a
closed port) and real processes (a step that calls `os._exit`). A `ray job submit` without the
cluster's token is tried in test_cli.py, next to the other `ray job submit` tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from tests.acceptance.bad_input_jobs import BigJob, OrderedJob
from tests.acceptance.test_cli import (
    REFUSE_SECONDS,
    cli,
    explain,
    stored_jobs,
    write_request,
)
from tests.support import eventually, free_port, left_behind, read_trace, seed_job

RAY_NAMESPACE = "choreography-bad-input"
GREET = "tests.acceptance.acceptance_jobs:Greet"
#: Watchdog and delivery intervals short enough to watch in seconds.
FAST: dict[str, Any] = {
    "job_watchdog_interval": 0.5,
    "step_delivery_retry_delay": 0.1,
    "max_step_delivery_retry_delay": 0.5,
    "reconciliation_interval": 0,
}
NOBODY = 65534
#: Where `tests.acceptance.import_sentinel` records each import of it (not imported here).
SENTINEL_LOG = Path(tempfile.gettempdir()) / "choreography-import-sentinel.log"


# -- the CLI's input ------------------------------------------------------------------------------

#: One xdist worker runs the whole module: its module's local Ray.
pytestmark = pytest.mark.xdist_group("bad-input")


def test_cli_run__malformed_request_json__exits_2_and_stores_nothing(
    tmp_path: Path, storage_url: str
) -> None:
    request = tmp_path / "bad.json"
    request.write_text('{"names": ["ada", ', encoding="utf-8")

    done = cli("run", GREET, "--request", str(request), "--storage", storage_url,
               timeout=REFUSE_SECONDS)  # fmt: skip

    assert done.returncode == 2, explain(done)
    assert "not JSON" in done.stderr or "JSON" in done.stderr, explain(done)
    assert str(request) in done.stderr, explain(done)
    assert done.stdout == ""
    assert not Path(storage_url.removeprefix("sqlite:///")).exists()


def test_cli_run__wrong_typed_fields__exits_2_naming_each_field(
    tmp_path: Path, storage_url: str
) -> None:
    request = write_request(tmp_path, {"names": "ada", "fail": 3})

    done = cli("run", GREET, "--request", str(request), "--storage", storage_url,
               timeout=REFUSE_SECONDS)  # fmt: skip

    assert done.returncode == 2, explain(done)
    assert "invalid request" in done.stderr, explain(done)
    assert "names" in done.stderr and "fail" in done.stderr, explain(done)
    assert "valid list" in done.stderr, explain(done)
    assert not Path(storage_url.removeprefix("sqlite:///")).exists()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("tests.acceptance.no_such_module:Job", "No module named"),
        ("tests.acceptance.acceptance_jobs:NoSuchJob", "has no attribute"),
        ("tests.acceptance.acceptance_jobs:GreetRequest", "not a"),
        ("os:sep", "not a class"),
        ("no-colon", "pkg.module:ClassName"),
    ],
)
def test_cli_run__job_type_path_missing_or_not_a_job__exits_2(
    path: str, reason: str, storage_url: str
) -> None:
    done = cli("run", path, "--storage", storage_url, timeout=REFUSE_SECONDS)

    assert done.returncode == 2, explain(done)
    assert reason in done.stderr, explain(done)
    assert not Path(storage_url.removeprefix("sqlite:///")).exists()


def closed_port_url(password: str = "secret") -> str:
    """A MongoDB URL with credentials on a loopback port nothing listens on."""
    return f"mongodb://user:{password}@127.0.0.1:{free_port()}/db?serverSelectionTimeoutMS=1500"


def test_cli__unreachable_mongodb__clear_error_without_the_password() -> None:
    url = closed_port_url()

    for args in (["list", "--storage", url], ["status", "abc", "--storage", url]):
        done = cli(*args, timeout=REFUSE_SECONDS)

        assert done.returncode != 0, explain(done)
        assert "Traceback" not in done.stderr, explain(done)
        assert "unavailable" in done.stderr.lower(), explain(done)
        assert "user:***@127.0.0.1" in done.stderr, explain(done)
        assert "secret" not in done.stdout + done.stderr, explain(done)


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# -- the Python API on real Ray -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray, unless this worker joined one already: the runtime tests' shared cluster,
    which stays up for them (a Ray shut down under them would have each `Jobs.connect` start a
    local Ray of its own); then the actors of this module's namespace end with the module."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, namespace=RAY_NAMESPACE, include_dashboard=False,
                 logging_level=logging.WARNING)  # fmt: skip
    yield
    if started:
        ray.shutdown()
        return
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == RAY_NAMESPACE:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(actor["name"], namespace=RAY_NAMESPACE), no_restart=True)


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def scope() -> str:
    return f"bad-{uuid.uuid4().hex[:8]}"


def connect(url: str, **options: Any) -> cr.Jobs:
    return cr.Jobs.connect(storage=url, options=cr.JobsOptions(**{**FAST, **options}),
                           namespace=RAY_NAMESPACE)  # fmt: skip


@pytest.mark.timeout(180)
def test_start__50_mb_request__refused_with_the_stated_limit_and_nothing_stored(
    ray_local: None, storage_url: str, scope: str
) -> None:
    with connect(storage_url) as jobs:
        manager = jobs.manager(scope, "big")
        with pytest.raises(cr.JobOperationError) as refused:
            manager.start(BigJob, {"blob": "x" * (50 * 1024 * 1024)})

        assert refused.value.error is cr.StartJobError.INVALID_REQUEST
        assert "52,428,811 bytes" in str(refused.value), refused.value
        assert "the limit is max_request_bytes = 1,048,576" in str(refused.value)
        assert manager.list() == []
        # The manager is still up and starts a request under the limit.
        started = manager.start(BigJob, {"blob": "x" * 1000})
        assert manager.wait(started.job_id, 60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    assert [j.id for j in stored_jobs(storage_url, scope, "big")] == [started.job_id]


@pytest.mark.timeout(180)
def test_stored_record_with_missing_or_wrong_typed_fields__get_and_list_say_which(
    ray_local: None, storage_url: str, scope: str
) -> None:
    good = seed_job(storage_url, *left_behind(
        scope=scope, namespace="edit", status=cr.JobStatus.COMPLETED_SUCCESSFULLY, job_type=GREET,
        step_type="x:y", steps=[], created=_now()))  # fmt: skip
    edits = {
        # A stage without its `stage` number: a missing field inside the progress JSON.
        "missing": 'UPDATE jobs SET progress = \'{"stages": [{"total_steps": 1}]}\' WHERE id = ?',
        # Text in an integer column (SQLite keeps what it is given).
        "wrong-type": "UPDATE jobs SET stage = 'ten' WHERE id = ?",
        "bad-status": "UPDATE jobs SET status = 'Paused' WHERE id = ?",
    }
    ids = {}
    for name, sql in edits.items():
        state, _ = left_behind(
            scope=scope,
            namespace="edit",
            status=cr.JobStatus.RUNNING,
            job_type=GREET,
            step_type="x:y",
            steps=[],
            created=_now(),
        )
        ids[name] = seed_job(storage_url, state)
        with sqlite3.connect(storage_url.removeprefix("sqlite:///")) as connection:
            connection.execute(sql, (ids[name],))
    connection.close()

    with connect(storage_url) as jobs:
        manager = jobs.manager(scope, "edit")
        reasons = {"missing": "stages.0.stage: Field required",
                   "wrong-type": "stage: Input should be a valid integer",
                   "bad-status": "status: Input should be"}  # fmt: skip
        for name, job_id in ids.items():
            with pytest.raises(cr.CorruptRecordError) as corrupt:
                manager.get(job_id)
            assert (corrupt.value.collection, corrupt.value.record_id) == ("jobs", job_id)
            assert reasons[name] in str(corrupt.value), corrupt.value
        with pytest.raises(cr.CorruptRecordError):
            manager.list()
        # The manager is still up: the good record reads; the edited ones are left as they are.
        assert manager.get(good).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    with sqlite3.connect(storage_url.removeprefix("sqlite:///")) as connection:
        rows = dict(connection.execute("SELECT id, stage FROM jobs"))
    connection.close()
    assert rows[ids["wrong-type"]] == "ten"


@pytest.mark.timeout(180)
def test_stored_type_outside_allowed_prefixes__never_imported_and_the_job_failed(
    ray_local: None, storage_url: str, scope: str
) -> None:
    SENTINEL_LOG.unlink(missing_ok=True)
    outside = "tests.acceptance.import_sentinel:SentinelJob"
    job_id = seed_job(storage_url, *left_behind(
        scope=scope, namespace="prefixes", status=cr.JobStatus.RUNNING, job_type=outside,
        step_type="tests.acceptance.import_sentinel:Nothing", steps=[(0, cr.StepStatus.SCHEDULED)],
        created=_now()))  # fmt: skip

    with connect(storage_url, allowed_type_prefixes=("tests.acceptance.acceptance_jobs:",)) as jobs:
        manager = jobs.manager(scope, "prefixes")
        assert manager.rehydrate() == [job_id]
        failed = eventually(
            lambda: (lambda j: j if j.status is cr.JobStatus.FAILED else None)(manager.get(job_id)),
            60, "the job of a type outside the prefixes to fail",
        )  # fmt: skip
        assert "is not under the allowed prefixes" in (failed.error or ""), failed
        assert outside in (failed.error or "")
        # Starting one is refused too, before anything is stored.
        from tests.acceptance.bad_input_jobs import OrderedJob as Outside

        with pytest.raises(cr.TypeImportError, match="not under the allowed prefixes"):
            manager.start(Outside, {"log": "/dev/null", "modes": []})
        assert [j.id for j in manager.list()] == [job_id]
        # The manager is still up.
        assert manager.get(job_id).id == job_id
    # No process imported the module (its import-time code never ran).
    assert not SENTINEL_LOG.exists() or SENTINEL_LOG.read_text() == ""


@pytest.mark.timeout(180)
def test_unreachable_mongodb__api_raises_storage_unavailable(ray_local: None, scope: str) -> None:
    url = closed_port_url()
    began = time.monotonic()
    with connect(url) as jobs:
        manager = jobs.manager(scope, "mongo")
        with pytest.raises(cr.StorageError) as unavailable:
            manager.list()
        assert isinstance(unavailable.value, cr.StorageUnavailableError), unavailable.value
        assert "user:***@127.0.0.1" in str(unavailable.value)
        assert "secret" not in str(unavailable.value)
        # start records the manager's key first: that write meets the unreachable server.
        with pytest.raises(cr.StorageUnavailableError) as start_error:
            manager.start(OrderedJob, {"log": "/dev/null", "modes": ["ok"]})
        assert "secret" not in str(start_error.value)
    assert time.monotonic() - began < 120


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs of this test's own (root only), unmounted at the end."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.timeout(240)
def test_read_only_sqlite_file__clear_errors_the_file_unchanged_and_the_manager_up(
    ray_local: None, tmpfs: Path, scope: str, storage_url: str
) -> None:
    # chmod 0444 of the file and 0555 of its directory, as asked; but every process here runs
    # as root, which writes whatever the mode says, so the file system is remounted read-only
    # too: that is what refuses the writes.
    url = f"sqlite:///{tmpfs / 'jobs.db'}"
    seed_job(
        url,
        *left_behind(
            scope=scope,
            namespace="ro",
            status=cr.JobStatus.COMPLETED_SUCCESSFULLY,
            job_type=GREET,
            step_type="x:y",
            steps=[],
            created=_now(),
        ),
    )
    path = tmpfs / "jobs.db"
    before = path.read_bytes()
    os.chmod(path, 0o444)
    os.chmod(tmpfs, 0o555)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)

    done = cli("list", "--storage", url, timeout=REFUSE_SECONDS)

    assert done.returncode != 0, explain(done)
    assert "Traceback" not in done.stderr, explain(done)
    assert "cannot open SQLite database" in done.stderr, explain(done)
    assert str(path) in done.stderr and "unable to open database file" in done.stderr
    with connect(url) as jobs:
        manager = jobs.manager(scope, "ro")
        with pytest.raises(cr.StorageUnavailableError, match="cannot open SQLite database"):
            manager.list()
        # start records the manager's key first: that write meets the read-only file.
        with pytest.raises(cr.StorageUnavailableError, match="cannot open SQLite database"):
            manager.start(OrderedJob, {"log": "/dev/null", "modes": ["ok"]})
    assert path.read_bytes() == before
    # Still up: the same manager serves a writable file of another manager's key.
    with connect(storage_url) as jobs:
        started = jobs.manager(scope, "rw").start(OrderedJob, {"log": "/dev/null", "modes": ["ok"]})
        assert jobs.manager(scope, "rw").wait(started.job_id, 60).status.is_terminal


@pytest.mark.timeout(240)
def test_full_disk__the_plan_is_not_written_and_the_manager_stays_up(
    ray_local: None, tmpfs: Path, scope: str
) -> None:
    url = f"sqlite:///{tmpfs / 'jobs.db'}"
    log = str(tmpfs.parent / "steps.jsonl")
    with connect(url) as jobs:
        manager = jobs.manager(scope, "full")
        small = manager.start(OrderedJob, {"log": log, "modes": ["ok"]})
        assert manager.wait(small.job_id, 60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        # A plan of 40,000 steps (about 6 MB of rows) cannot fit in 3 MiB.
        started = manager.start(OrderedJob, {"log": log, "modes": ["ok"] * 40_000})

        assert started.error is cr.StartJobError.COULD_NOT_PERSIST, started
        failed = manager.get(started.job_id)
        assert failed.status is cr.JobStatus.FAILED, failed
        assert "database or disk is full" in (failed.error or ""), failed
        # All or nothing: no step of the refused plan is stored.
        assert manager.steps(started.job_id) == []
        # Still up: the first job reads, and a job that fits in what is left runs.
        assert manager.get(small.job_id).status is cr.JobStatus.COMPLETED_SUCCESSFULLY


@pytest.mark.timeout(240)
def test_step_that_never_returns_until_told__watchdog_ticks_and_stop_ends_the_job_stopped(
    ray_local: None, storage_url: str, scope: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.jsonl")
    with connect(storage_url) as jobs:
        manager = jobs.manager(scope, "hang")
        modes = ["until-stopped", "until-stopped", "ok"]
        started = manager.start(OrderedJob, {"log": log, "modes": modes})
        eventually(lambda: manager.get(started.job_id).progress.successful_steps == 1, 60,
                   "the quick step to succeed")  # fmt: skip
        actor: Any = ray.get_actor(f"job/{started.job_id}", namespace=RAY_NAMESPACE)
        ticks = ray.get(actor.watchdog_ticks.remote())
        eventually(lambda: ray.get(actor.watchdog_ticks.remote()) >= ticks + 2, 30,
                   "the watchdog to tick while the steps hang")  # fmt: skip
        assert manager.get(started.job_id).status is cr.JobStatus.RUNNING

        manager.stop(started.job_id)  # returns: the stop is persisted before the steps report

        state = manager.wait(started.job_id, 60)  # the stop is final: both steps reported it
        assert state.status is cr.JobStatus.STOPPED and state.stop_finalized
        assert (state.progress.successful_steps, state.progress.stopped_steps) == (1, 2)
        assert len([r for r in read_trace(log) if r["event"] == "told"]) == 2


@pytest.mark.timeout(240)
def test_step_that_ignores_its_stop__stopped_but_never_final_while_it_runs(
    ray_local: None, storage_url: str, scope: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.jsonl")
    with connect(storage_url) as jobs:
        manager = jobs.manager(scope, "ignore")
        started = manager.start(OrderedJob, {"log": log, "modes": ["hang", "ignore", "ok"]})
        eventually(lambda: manager.get(started.job_id).progress.successful_steps == 1, 60,
                   "the quick step to succeed")  # fmt: skip

        began = time.monotonic()
        manager.stop(started.job_id)
        assert time.monotonic() - began < 30  # stop returns: it does not wait for the steps

        # What a user gets: STOPPED at once, but the stop is never final while the steps run
        # on (on_stopped has not run, progress.stopped_steps is not complete), so `wait` times
        # out naming that; the watchdog keeps ticking. Ending the steps' host process (its
        # steps then count as stopped) or a step that checks `context.is_cancelled` ends it.
        with pytest.raises(cr.JobTimeoutError, match="its stop not final yet"):
            manager.wait(started.job_id, 5)
        later = manager.get(started.job_id)
        assert later.status is cr.JobStatus.STOPPED and not later.stop_finalized, later
        assert {s.status for s in manager.steps(started.job_id)} == {cr.StepStatus.RUNNING}
        actor: Any = ray.get_actor(f"job/{started.job_id}", namespace=RAY_NAMESPACE)
        ticks = ray.get(actor.watchdog_ticks.remote())
        eventually(lambda: ray.get(actor.watchdog_ticks.remote()) > ticks, 30,
                   "the watchdog to tick")  # fmt: skip


@pytest.mark.timeout(300)
def test_step_that_calls_os_exit__its_host_dies_and_the_job_still_reaches_an_outcome(
    ray_local: None, storage_url: str, scope: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "steps.jsonl")
    with connect(storage_url, step_lease_timeout=2) as jobs:
        manager = jobs.manager(scope, "exit")
        started = manager.start(OrderedJob, {"log": log, "modes": ["exit", "ok", "ok"]})

        state = manager.wait(started.job_id, 180)

        assert state.status.is_terminal, state
        done = state.progress.successful_steps + state.progress.failed_steps
        assert done + state.progress.unreachable_steps == 3, state
        starts = [r for r in read_trace(log) if r["event"] == "start"]
        exited = int(Path(f"{log}.exited").read_text())
        assert exited in {r["pid"] for r in starts}
        # Here the host restarts in place and the steps it held are started again on it.
        exiting = [r for r in starts if r["mode"] == "exit"]
        assert exiting[0]["pid"] == exited and len(exiting) >= 2, starts
        # The host process that ran it is gone; the cluster and manager are still up.
        assert manager.get(started.job_id).id == started.job_id
