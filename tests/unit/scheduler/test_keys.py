"""The scheduler's recovery key provider: the (scope, namespace) of every manifest."""

from __future__ import annotations

import asyncio

from choreography_ray.model import JobsManagerKey
from choreography_ray.scheduler.keys import ScheduledKeys
from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage
from tests.unit.scheduler.factory import manifest


def test_scheduled_keys__every_scope_and_namespace_a_manifest_runs_in() -> None:
    async def scenario() -> tuple[list[JobsManagerKey], list[str]]:
        storage = MemorySchedulerStorage()
        for m in (manifest("a", namespace="n1"), manifest("b", namespace="n1"),
                  manifest("c", scope="t")):  # fmt: skip
            await storage.upsert_manifest(m, stated=())
        keys = ScheduledKeys(storage)
        return await keys.get_keys(), await keys.scopes()

    keys, scopes = asyncio.run(scenario())
    assert keys == [JobsManagerKey(scope="s", namespace="n1"),
                    JobsManagerKey(scope="t", namespace="default")]  # fmt: skip
    assert scopes == ["s", "t"]
