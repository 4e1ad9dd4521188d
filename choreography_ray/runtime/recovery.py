"""The recovery participant: the singleton named actor `recovery`.

It asks every known jobs manager to rehydrate when a connection first registers its storage
(the cluster coming up) and whenever Ray reports a node dead. Keys come from the durable key
catalog (every (scope, namespace) a manager was started for) plus every provider named in
`JobsOptions.keys_providers`, built again on each pass, combined and de-duplicated. A provider
or a manager that fails is retried alone after 1 s, doubling to 60 s, without waiting for another
membership change.

Beyond the spec (its known limitation): every `reconciliation_interval` it looks for jobs stored
as running whose job actor does not exist, and has their manager rehydrate them, so a lost
acknowledgement cannot leave a job idle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import ray

from choreography_ray.model import JobsManagerKey
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.membership import alive_nodes
from choreography_ray.runtime.names import RECOVERY, actor_options, job_name, manager_name
from choreography_ray.runtime.shared_storage import open_shared_storage
from choreography_ray.status import JobStatus
from choreography_ray.types import import_type

log = logging.getLogger(__name__)

#: Retry of a failed provider or manager: first delay and longest delay, in seconds.
RETRY_FIRST, RETRY_LONGEST = 1.0, 60.0
#: How often node membership is read from Ray, in seconds.
MEMBERSHIP_POLL = 1.0
#: Statuses of a job that should have a live job actor.
LIVE = (
    JobStatus.RUNNING,
    JobStatus.PREPARING_JOB,
    JobStatus.PREPARING_STEPS,
    JobStatus.STARTING_STEPS,
)


class Tenant:
    """One storage and its options, as registered by a connection."""

    def __init__(self, storage_url: str, options_json: str, namespace: str) -> None:
        self.storage_url = storage_url
        self.options_json = options_json
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, namespace)
        self.namespace = namespace

    def manager(self, key: JobsManagerKey) -> Any:
        from choreography_ray.runtime.manager import JobsManagerActor

        return JobsManagerActor.options(  # type: ignore[attr-defined]
            **actor_options(manager_name(key.scope, key.namespace), self.namespace)
        ).remote(key.scope, key.namespace, self.storage_url, self.options_json, self.namespace)

    async def keys(
        self, retry: Callable[[str, Callable[[], Awaitable[None]]], None]
    ) -> set[JobsManagerKey]:
        """The catalog's keys and every provider's; a failing provider is retried alone."""
        keys = set(await self.storage.list_manager_keys())
        for path in self.options.keys_providers:
            try:
                keys |= await provider_keys(path, self.options)
            except Exception as error:
                log.warning("recovery key provider %s failed: %s", path, error)
                retry(f"provider {path}", functools.partial(self._retry_provider, path))
        return keys

    async def _retry_provider(self, path: str) -> None:
        for key in await provider_keys(path, self.options):
            await self.manager(key).rehydrate.remote()


async def provider_keys(path: str, options: JobsOptions) -> set[JobsManagerKey]:
    provider = import_type(path, options.allowed_type_prefixes)()
    keys: Iterable[JobsManagerKey] = await provider.get_keys()
    return {JobsManagerKey(scope=k.scope, namespace=k.namespace) for k in keys}


class RecoveryCore:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.tenants: dict[tuple[str, str], Tenant] = {}
        self.passes = 0
        self.retrying: dict[str, int] = {}
        self._tasks: set[asyncio.Future[Any]] = set()
        self._spawn(self._watch_membership())
        self._spawn(self._reconcile_loop())

    async def register(self, storage_url: str, options_json: str) -> None:
        """A connection's storage: recovered now (the cluster came up), and on every pass."""
        key = (storage_url, options_json)
        if key not in self.tenants:
            self.tenants[key] = Tenant(storage_url, options_json, self.namespace)
            await self.recover(self.tenants[key])

    async def recover_all(self) -> None:
        self.passes += 1
        await asyncio.gather(*(self.recover(t) for t in self.tenants.values()))

    async def recover(self, tenant: Tenant) -> None:
        for key in await tenant.keys(self._retry):
            try:
                await tenant.manager(key).rehydrate.remote()
            except Exception as error:
                log.warning("rehydrating %s failed: %s", key, error)
                self._retry(f"manager {key}", functools.partial(_rehydrate, tenant, key))

    def _retry(self, what: str, attempt: Callable[[], Awaitable[Any]]) -> None:
        """Retries one failed provider or manager alone: 1 s, doubling to 60 s, until it works."""
        if what in self.retrying:
            return

        async def again() -> None:
            delay = RETRY_FIRST
            while True:
                self.retrying[what] = self.retrying.get(what, 0) + 1
                await asyncio.sleep(delay)
                try:
                    await attempt()
                except Exception as error:
                    log.warning("recovery retry of %s failed: %s", what, error)
                    delay = min(delay * 2, RETRY_LONGEST)
                else:
                    self.retrying.pop(what, None)
                    return

        self.retrying[what] = 0
        self._spawn(again())

    async def _watch_membership(self) -> None:
        known = alive_nodes()
        while True:
            await asyncio.sleep(MEMBERSHIP_POLL)
            try:
                alive = alive_nodes()
            except Exception:
                continue
            if known - alive:
                log.warning("nodes %s are dead; recovering jobs", sorted(known - alive))
                self._spawn(self.recover_all())
            known = alive

    async def _reconcile_loop(self) -> None:
        while True:
            intervals = [t.options.reconciliation_seconds for t in self.tenants.values()]
            every = min((i for i in intervals if i is not None), default=None)
            await asyncio.sleep(every or 5.0)
            if every is not None:
                await self.reconcile()

    async def reconcile(self) -> int:
        """Rehydrates the keys that have a job stored as live, or with an unfinished stop or
        removal, whose job actor is gone."""
        orphaned = 0
        for tenant in list(self.tenants.values()):
            if tenant.options.reconciliation_seconds is None:
                continue
            for key in await tenant.keys(self._retry):
                jobs = [
                    j
                    for status in (*LIVE, JobStatus.STOPPED, JobStatus.REMOVING)
                    for j in await tenant.storage.list_jobs(key.scope, key.namespace, status)
                    if not (j.status is JobStatus.STOPPED and j.stop_finalized)
                ]
                missing = [j for j in jobs if not _actor_exists(job_name(j.id), self.namespace)]
                if missing:
                    orphaned += len(missing)
                    try:
                        await tenant.manager(key).rehydrate.remote()
                    except Exception as error:
                        log.warning("reconciling %s failed: %s", key, error)
        return orphaned

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _rehydrate(tenant: Tenant, key: JobsManagerKey) -> None:
    await tenant.manager(key).rehydrate.remote()


def _actor_exists(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


@ray.remote
class RecoveryActor:
    def __init__(self, namespace: str) -> None:
        self.core = RecoveryCore(namespace)

    async def register(self, storage_url: str, options_json: str) -> None:
        await self.core.register(storage_url, options_json)

    async def recover_all(self) -> None:
        await self.core.recover_all()

    async def reconcile(self) -> int:
        return await self.core.reconcile()

    async def stats(self) -> dict[str, Any]:
        return {"passes": self.core.passes, "retrying": dict(self.core.retrying)}


def ensure_recovery(storage_url: str, options: JobsOptions, namespace: str) -> Any:
    """Creates (or finds) the recovery actor and registers this connection's storage with it."""
    actor = RecoveryActor.options(  # type: ignore[attr-defined]
        **actor_options(RECOVERY, namespace)
    ).remote(namespace)
    ray.get(actor.register.remote(storage_url, options.model_dump_json()))
    return actor
