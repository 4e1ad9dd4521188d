"""Sharing the step hosts (docs/sharing.md), on real Ray: a small job of another tenant, or of
a higher priority, does not wait behind a backlog, and two backlogged tenants share by weight.
The jobs are the bench's (`choreography-ray bench --sharing`): sync steps that sleep, keyed by
the request's tenant.

Nothing here is timed: each check counts the backlog's steps that completed meanwhile. Without
the shares a step of the small job waits behind every step the backlog handed the hosts before
it (thousands: the hosts hold 4,096 each, their threads run 32 at once)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

import choreography_ray as cr
from choreography_ray.bench.sharing import Naps, NapsRequest
from tests.support import eventually, in_storage

pytestmark = pytest.mark.slow

#: The backlog's steps, and what each sleeps: far more than the hosts hold or the test waits
#: for (it is removed at the end).
BACKLOG = NapsRequest(steps=30_000, seconds=0.05)
#: A step of the small job waits behind fewer of the backlog's than this with the shares, and
#: behind about 8,000 without (those the hosts hold already).
PASSED_BY_AT_MOST = 3_000


def successes(manager: cr.JobsManager, job_id: str) -> int:
    return manager.get(job_id).progress.successful_steps


@contextlib.contextmanager
def backlogged(
    manager: cr.JobsManager, storage_url: str, request: NapsRequest = BACKLOG, **start: int
) -> Iterator[str]:
    """A backlog whose steps run (the hosts hold thousands), removed at the end."""
    job_id = manager.start(Naps, request, **start).job_id
    try:
        eventually(lambda: successes(manager, job_id) >= 200, 60, "the backlog to get going")
        yield job_id
    finally:
        manager.remove(job_id)
        gone = lambda: in_storage(storage_url, lambda s: s.get_job(job_id)) is None  # noqa: E731
        eventually(gone, 120, "the backlog's removal")


def passed_by(manager: cr.JobsManager, backlog: str, small: cr.JobsManager, **start: int) -> int:
    """How many of the backlog's steps completed while a job of 10 short steps ran."""
    before = successes(manager, backlog)
    small_id = small.start(Naps, NapsRequest(steps=10, seconds=0.05), **start).job_id
    state = small.wait(small_id, timeout=120)
    assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    return successes(manager, backlog) - before


def test_a_small_job_of_another_tenant_passes_the_backlog(
    connect, scope: str, storage_url: str
) -> None:
    with connect() as jobs:
        big = jobs.manager(scope, "tenant-a")
        with backlogged(big, storage_url) as backlog:
            small = jobs.manager(scope, "tenant-b")
            assert passed_by(big, backlog, small) < PASSED_BY_AT_MOST


def test_a_higher_priority_job_of_the_same_tenant_passes_the_backlog(
    connect, scope: str, storage_url: str
) -> None:
    with connect() as jobs:
        manager = jobs.manager(scope, "tenant")
        with backlogged(manager, storage_url, priority=5) as backlog:
            assert passed_by(manager, backlog, manager, priority=1) < PASSED_BY_AT_MOST


def test_two_backlogged_tenants_share_the_hosts_by_weight(
    connect, scope: str, storage_url: str
) -> None:
    """Both backlogs start at once: a start answers once its first wave of steps is on the
    hosts, and a second backlog's first wave waits for its share of room."""
    with connect(fairness_weights={"heavy": 3.0}) as jobs:
        manager = jobs.manager(scope, "tenants")
        request = BACKLOG.model_copy(update={"steps": 60_000})
        starts = [
            threading.Thread(
                target=manager.start, args=(Naps, request.model_copy(update={"tenant": key}))
            )
            for key in ("heavy", "light")
        ]
        for thread in starts:
            thread.start()
        try:
            done = lambda: {j.fairness_key: j.progress.successful_steps for j in manager.list()}  # noqa: E731
            eventually(
                lambda: len(done()) == 2 and min(done().values()) >= 200, 90, "both backlogs"
            )
            time.sleep(3)  # both hold steps on every host
            before = done()
            time.sleep(8)
            after = done()
            steps = {key: after[key] - before[key] for key in after}
            assert 3 * 0.8 <= steps["heavy"] / max(1, steps["light"]) <= 3 * 1.2, steps
        finally:
            for thread in starts:
                thread.join()
            for job in manager.list():
                manager.remove(job.id)
            gone = lambda: not in_storage(storage_url, lambda s: s.list_jobs(scope, "tenants"))  # noqa: E731
            eventually(gone, 120, "the backlogs' removal")
