"""A job's priority and fairness key through a real jobs manager: stored at start (the start's
priority, else the type's; the type's key, else the namespace), and a start they refuse stores
nothing."""

from __future__ import annotations

import pytest

import choreography_ray as cr
from tests.runtime.sharing_jobs import BrokenKeyJob, PlainJob, TenantJob, TenantRequest

#: Seconds a one-step job gets to finish.
WAIT = 60.0


def test_start__priority_and_fairness_key_stored(connect, scope) -> None:
    manager = connect().manager(scope, "tenants")
    urgent = manager.start(PlainJob, TenantRequest(), priority=1)
    plain = manager.start(PlainJob, TenantRequest())
    keyed = manager.start(TenantJob, TenantRequest(tenant="tenant-a"))

    shares = {}
    for started in (urgent, plain, keyed):
        state = manager.wait(started.job_id, timeout=WAIT)
        assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        state = manager.get(started.job_id)
        shares[started.job_id] = (state.priority, state.fairness_key)
    assert shares == {
        urgent.job_id: (1, "tenants"),
        plain.job_id: (3, "tenants"),
        keyed.job_id: (2, "tenant-a"),
    }


def test_start__a_bad_priority_or_fairness_key_is_refused_and_nothing_stored(
    connect, scope
) -> None:
    manager = connect().manager(scope, "refused")

    with pytest.raises(cr.JobOperationError) as bad_priority:
        manager.start(PlainJob, TenantRequest(), priority=0)
    assert bad_priority.value.error is cr.StartJobError.INVALID_REQUEST
    assert "priority must be an int from 1 (first) to 5, not 0" in bad_priority.value.message

    with pytest.raises(cr.JobOperationError) as bad_key:
        manager.start(BrokenKeyJob, TenantRequest(tenant="x"))
    assert bad_key.value.error is cr.StartJobError.INVALID_REQUEST
    assert "BrokenKeyJob.fairness_key raised LookupError" in bad_key.value.message

    assert manager.list() == []
