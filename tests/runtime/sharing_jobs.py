"""Job types with priorities and fairness keys (importable by path in Ray workers): each plans
one `Noop` step."""

from __future__ import annotations

from pydantic import BaseModel

import choreography_ray as cr
from tests.runtime.sample_jobs import Item, Noop


class TenantRequest(BaseModel):
    tenant: str = ""


class PlainJob(cr.Job[TenantRequest]):
    """The type's defaults: priority 3, the namespace as its fairness key."""

    def prepare_steps(self, request: TenantRequest) -> list[cr.StepSpec]:
        return [self.create_step(Noop, Item(n=0))]


class TenantJob(PlainJob):
    """Priority 2; keyed by the request's tenant (none: the namespace)."""

    priority = 2

    def fairness_key(self, request: TenantRequest) -> str | None:
        return request.tenant or None


class ScopedKeyJob(PlainJob):
    """Keyed by the manager's scope and the tenant: the hook sees the job's scope."""

    def fairness_key(self, request: TenantRequest) -> str | None:
        return f"{self.scope}/{request.tenant}"


class BrokenKeyJob(PlainJob):
    """A `fairness_key` that returns an int for tenant "int" and raises for any other."""

    def fairness_key(self, request: TenantRequest) -> str | None:
        if request.tenant == "int":
            return 7  # type: ignore[return-value]
        raise LookupError(f"no tenant {request.tenant!r}")


class BadPriorityJob(PlainJob):
    """A type whose priority is out of range: each start is refused."""

    priority = 0
