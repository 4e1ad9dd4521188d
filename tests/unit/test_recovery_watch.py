"""The recovery actor's rules without Ray (issue 9, items 10 and 15): how node deaths are read
from Ray's node table, that the membership watch survives a failing read, and that a restarted
actor restores its registrations and runs a pass; what a reconciliation pass asks of storage
and Ray (issue 35).

Ray's node table and internal KV are replaced by fakes here: a GCS that fails on demand is a
fault these tests cannot cause on a real cluster. `tests/runtime/test_recovery_restart.py` and
`tests/runtime/test_recovery_cluster.py` run the same code on real Ray.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import choreography_ray as cr
from choreography_ray.client import manager_conflict
from choreography_ray.core.retries import Backoff
from choreography_ray.model import JobsManagerKey, JobState
from choreography_ray.runtime import recovery
from choreography_ray.runtime.names import job_name
from choreography_ray.runtime.recovery import Membership, RecoveryCore, Tenant
from choreography_ray.status import JobStatus

pytestmark = pytest.mark.timeout(30)

#: Fast enough for a unit test, slow enough to show the backoff.
FAST_BACKOFF = Backoff(0.01, 0.05)


# -- Membership: deaths from the node table --------------------------------------------------------


def test_membership__first_look_takes_dead_nodes_as_known() -> None:
    membership = Membership()
    assert membership.look({"head": True, "old": False}) == set()
    assert membership.look({"head": True, "old": False}) == set()


def test_membership__a_node_that_dies_is_a_death_once() -> None:
    membership = Membership()
    membership.look({"head": True, "worker": True})
    assert membership.look({"head": True, "worker": False}) == {"worker"}
    assert membership.look({"head": True, "worker": False}) == set()


def test_membership__a_node_never_seen_alive_is_a_death_when_seen_dead() -> None:
    """A node that joined and died between two looks (or while looks failed)."""
    membership = Membership()
    membership.look({"head": True})
    assert membership.look({"head": True, "brief": False}) == {"brief"}


def test_membership__a_node_gone_from_the_table_is_a_death() -> None:
    membership = Membership()
    membership.look({"head": True, "worker": True})
    assert membership.look({"head": True}) == {"worker"}


def test_membership__after_failed_first_looks__dead_nodes_count_as_deaths() -> None:
    membership = Membership()
    membership.failed()
    membership.failed()
    assert membership.look({"head": True, "worker": False}) == {"worker"}
    assert membership.look({"head": True, "worker": False}) == set()


# -- RecoveryCore: the watch, the restore ----------------------------------------------------------


class FakeRegistrations:
    """Ray's internal KV, as `Registrations` uses it; `load` fails the first `failures` times."""

    def __init__(self, stored: list[tuple[str, str]], failures: int = 0) -> None:
        self.stored = list(stored)
        self.failures = failures
        self.loads = 0

    def save(self, storage_url: str, options_json: str) -> None:
        self.stored.append((storage_url, options_json))

    def load(self) -> list[tuple[str, str]]:
        self.loads += 1
        if self.loads <= self.failures:
            raise ConnectionError("GCS unavailable (fake)")
        return list(self.stored)


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery, "STANDARD", FAST_BACKOFF)
    monkeypatch.setattr(recovery, "MEMBERSHIP_POLL", 0.01)
    monkeypatch.setattr(recovery, "RECONCILIATION_IDLE", 0.01)


def run_core(
    registrations: FakeRegistrations,
    until: Callable[[RecoveryCore], bool],
    timeout: float = 10.0,
) -> RecoveryCore:
    """Runs a recovery core on an event loop until `until(core)` holds."""

    async def main() -> RecoveryCore:
        core = RecoveryCore("unit", registrations)  # type: ignore[arg-type]
        deadline = asyncio.get_running_loop().time() + timeout
        while not until(core):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out; stats {core.stats()}")
            await asyncio.sleep(0.01)
        core.tasks.cancel_all()
        return core

    return asyncio.run(main())


def test_watch__node_table_fails_at_start_and_between__still_sees_the_death_and_logs(
    fast: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The old watch died on a failing first read and skipped failing reads silently: a node
    that lived only while reads failed was never a death, and no pass ran."""
    tables: list[Any] = [
        ConnectionError("GCS unavailable (fake)"),
        {"head": True},
        ConnectionError("GCS unavailable (fake)"),  # while the worker lives
        ConnectionError("GCS unavailable (fake)"),
        {"head": True, "worker": False},
    ]

    def node_table() -> dict[str, bool]:
        answer = tables.pop(0) if len(tables) > 1 else tables[0]
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    monkeypatch.setattr(recovery, "node_table", node_table)
    with caplog.at_level(logging.ERROR):
        # The pass is a task the death spawns: it may start a loop turn after the death.
        core = run_core(FakeRegistrations([]), lambda c: bool(c.node_deaths and c.passes))
    assert core.node_deaths == ["worker"]
    assert core.passes == 1
    assert "membership watch" in core.tasks.failures
    assert any("membership watch failed" in r.getMessage() for r in caplog.records)


def test_restart__registrations_read_back__a_pass_runs_for_them(
    fast: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(recovery, "node_table", lambda: {"head": True})
    options = cr.JobsOptions(reconciliation_interval=0).model_dump_json()
    stored = [
        (f"sqlite:///{tmp_path / 'a.db'}", options),
        (f"sqlite:///{tmp_path / 'b.db'}", options),
    ]
    # The KV fails twice: the restore is retried with the backoff, not given up.
    registrations = FakeRegistrations(stored, failures=2)
    core = run_core(registrations, lambda c: c.restored == 2)
    assert registrations.loads == 3
    assert sorted(core.tenants) == sorted(stored)
    assert core.passes == 1


def test_register__saves_the_registration_once(
    fast: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(recovery, "node_table", lambda: {"head": True})
    registrations = FakeRegistrations([])
    url = f"sqlite:///{tmp_path / 'a.db'}"
    options = cr.JobsOptions(reconciliation_interval=0).model_dump_json()

    async def main() -> None:
        core = RecoveryCore("unit", registrations)  # type: ignore[arg-type]
        await core.register(url, options)
        await core.register(url, options)
        core.tasks.cancel_all()

    asyncio.run(main())
    assert registrations.stored == [(url, options)]


# -- RecoveryCore: reconciliation (issue 35) -------------------------------------------------------


@pytest.fixture
def rehydrated(monkeypatch: pytest.MonkeyPatch) -> list[JobsManagerKey]:
    """The keys whose manager is asked to rehydrate, recorded instead of asked."""
    monkeypatch.setattr(recovery, "node_table", lambda: {"head": True})
    keys: list[JobsManagerKey] = []

    async def rehydrate(self: Tenant, key: JobsManagerKey) -> None:
        keys.append(key)

    monkeypatch.setattr(Tenant, "rehydrate", rehydrate)
    return keys


def reconcile(tmp_path: Path, jobs: dict[str, dict[str, JobStatus]]) -> int:
    """One reconciliation pass over an SQLite storage holding `jobs` (scope: id: status)."""
    options = cr.JobsOptions(reconciliation_interval=60).model_dump_json()
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def main() -> int:
        core = RecoveryCore("unit", FakeRegistrations([]))  # type: ignore[arg-type]
        tenant = core.tenants[url, options] = Tenant(url, options, "unit")
        try:
            for scope, statuses in jobs.items():
                await tenant.storage.add_manager_key(JobsManagerKey(scope=scope, namespace="n"))
                for job_id, status in statuses.items():
                    state = JobState(id=job_id, scope=scope, namespace="n", type="pkg.mod:Job")
                    await tenant.storage.create_job(state.with_status(status))
            return await core.reconcile()
        finally:
            core.tasks.cancel_all()
            await tenant.storage.close()

    return asyncio.run(main())


def test_reconcile__one_listing_of_named_actors__keys_with_a_job_not_listed_rehydrate(
    rehydrated: list[JobsManagerKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each key's unsettled jobs are read, then Ray lists its named actors once for the pass:
    no lookup per job. A finished job never counts, whether or not its actor is listed."""
    listings: list[str] = []

    def named_actors(namespace: str) -> set[str]:
        listings.append(namespace)
        return {job_name("alive"), job_name("other-alive")}

    monkeypatch.setattr(recovery, "named_actors", named_actors)
    orphaned = reconcile(tmp_path, {
        "a": {"alive": JobStatus.RUNNING, "orphan": JobStatus.STOPPED,
              "done": JobStatus.COMPLETED_SUCCESSFULLY},
        "b": {"other-alive": JobStatus.PREPARING_JOB},
    })  # fmt: skip
    assert orphaned == 1
    assert listings == ["unit"]
    assert rehydrated == [JobsManagerKey(scope="a", namespace="n")]


def test_reconcile__listing_fails__raises_and_rehydrates_nothing(
    rehydrated: list[JobsManagerKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GCS that cannot list its actors leaves the pass to the task's retry: taking every job
    for orphaned would rehydrate every key of every storage."""

    def named_actors(namespace: str) -> set[str]:
        raise ConnectionError("GCS unavailable (fake)")

    monkeypatch.setattr(recovery, "named_actors", named_actors)
    with pytest.raises(ConnectionError):
        reconcile(tmp_path, {"a": {"running": JobStatus.RUNNING}})
    assert rehydrated == []


def test_reconcile__no_unsettled_job__asks_ray_nothing(
    rehydrated: list[JobsManagerKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def named_actors(namespace: str) -> set[str]:
        raise AssertionError("listed with no job to look for")

    monkeypatch.setattr(recovery, "named_actors", named_actors)
    finished = {"done": JobStatus.FAILED, "gone": JobStatus.COMPLETED_WITH_FAILURES}
    assert reconcile(tmp_path, {"a": finished}) == 0
    assert rehydrated == []


# -- the manager's settings ----------------------------------------------------------------------


def test_manager_conflict__names_each_differing_field_and_hides_the_password() -> None:
    running = {
        "storage": "mongodb://app:secret@db:27017/jobs",
        "options": cr.JobsOptions().model_dump_json(),
    }
    asked = cr.JobsOptions(max_step_attempts=3)
    conflict = manager_conflict("jobs-manager/s/n", running, "mongodb://app:secret@db2/jobs", asked)
    assert conflict is not None
    assert conflict.fields == ["storage", "max_step_attempts"]
    assert "secret" not in str(conflict)
    assert "max_step_attempts: running 1, asked 3" in str(conflict)
    same = manager_conflict("jobs-manager/s/n", running, running["storage"], cr.JobsOptions())
    assert same is None
