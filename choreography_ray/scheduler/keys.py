"""The scheduler's recovery key provider: every (scope, namespace) a manifest runs in.

Recovery builds it on each registered storage and asks it on every pass, beside the
providers of `JobsOptions.keys_providers`, so the jobs managers of scheduled runs are
rehydrated after a whole-cluster restart with no host provider (as the spec's workflow engine
registers its own). Their managers record their keys in the durable catalog as well when they
start a job; this provider also covers a namespace whose manager has not started one yet.
"""

from __future__ import annotations

from choreography_ray.model import JobsManagerKey
from choreography_ray.storage.scheduler import SchedulerStorage


class ScheduledKeys:
    def __init__(self, storage: SchedulerStorage) -> None:
        self.storage = storage

    async def get_keys(self) -> list[JobsManagerKey]:
        return [
            JobsManagerKey(scope=scope, namespace=namespace)
            for scope, namespace in await self.storage.manifest_keys()
        ]

    async def scopes(self) -> list[str]:
        """The scopes with manifests: each has a scheduler to bring back."""
        return sorted({scope for scope, _ in await self.storage.manifest_keys()})
