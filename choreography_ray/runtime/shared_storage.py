"""Storage as the actors see it: `memory://` is held by one named actor so every process
sees the same data (the scheduler's records too); every other URL is opened by each process
itself."""

from __future__ import annotations

from typing import Any

import ray

from choreography_ray.runtime.names import actor_options, memory_storage_name
from choreography_ray.storage import Storage, open_storage
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.storage.scheduler import SchedulerStorage, scheduler_storage


@ray.remote
class MemoryStorageActor:
    def __init__(self) -> None:
        self.storage = MemoryStorage()

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.storage, method)(*args, **kwargs)

    async def call_scheduler(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(scheduler_storage(self.storage), method)(*args, **kwargs)


class _RemoteStorage:
    """Forwards every protocol call to the memory actor."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self._actor = MemoryStorageActor.options(  # type: ignore[attr-defined]
            **actor_options(memory_storage_name(url), namespace, max_restarts=0)
        ).remote()

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._actor.call.remote(method, *args, **kwargs)

        return call

    async def close(self) -> None:
        return None


class _RemoteSchedulerStorage:
    """Forwards every scheduler storage call to the memory actor."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._actor.call_scheduler.remote(method, *args, **kwargs)

        return call


def shared_scheduler_storage(storage: Storage) -> SchedulerStorage:
    """The scheduler's storage beside `storage` (from `open_shared_storage`)."""
    if isinstance(storage, _RemoteStorage):
        remote: SchedulerStorage = _RemoteSchedulerStorage(storage._actor)
        return remote
    return scheduler_storage(storage)


def open_shared_storage(url: str, namespace: str) -> Storage:
    if url.lower().startswith("memory:"):
        return _RemoteStorage(url, namespace)
    return open_storage(url)
