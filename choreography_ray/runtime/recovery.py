"""The recovery participant: the singleton named actor `recovery` of a Ray namespace.

It asks every known jobs manager to rehydrate when a connection first registers its storage
(the cluster coming up), when Ray reports a node dead, and when the actor itself is restarted.
Keys come from the durable key catalog (every (scope, namespace) a manager was started for)
plus the scheduler's provider (`scheduler.keys.ScheduledKeys`: every (scope, namespace) a
manifest runs in) plus every provider named in `JobsOptions.keys_providers`, built again on
each pass, combined and de-duplicated. Each pass also brings up the scheduler actor of every
scope that has manifests, so schedules carry on after a whole-cluster restart. A provider, a
manager or a catalog read that fails is logged by name and retried alone after 1 s, doubling
to 60 s (`core.retries.STANDARD`), without waiting for another membership change.

Registered storages outlive the actor: each registration (storage URL and options JSON) is
written to Ray's internal KV, namespace `choreography_ray`, key
`recovery/{ray_namespace}/{sha256 of URL and options}`, value `{"storage_url", "options_json"}`.
A restarted actor reads them back in its constructor and runs a pass for them. The KV lives in
Ray's GCS: it lasts as long as the cluster (or longer, with GCS fault tolerance); after a full
restart every connection registers its storage again.

Node deaths are read from Ray's node table, which keeps dead nodes: a node that is dead and was
not dead at the last look is a death, even if no look saw it alive (a look can fail, or come
late on a busy machine).

Beyond the spec (its known limitation): every `reconciliation_interval` it looks for jobs stored
as running whose job actor does not exist, and has their manager rehydrate them, so a lost
acknowledgement cannot leave a job idle. A pass reads each key's unsettled jobs (one indexed
query) and lists Ray's named actors once, so its cost follows the jobs that can need it, not
every job ever stored nor one lookup per job.

Every background task is named (`core.turns.Supervisor`); every blocking Ray call (the node
table, the named actors, the KV) runs in a thread, never on the actor's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import ray
from ray.experimental import internal_kv

from choreography_ray.core.retries import STANDARD
from choreography_ray.core.turns import Supervisor
from choreography_ray.logs import configure_actor, get_logger
from choreography_ray.model import JobsManagerKey
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import actors
from choreography_ray.runtime.membership import named_actors, node_table
from choreography_ray.runtime.names import RECOVERY, job_name
from choreography_ray.runtime.shared_storage import open_shared_storage, shared_scheduler_storage
from choreography_ray.scheduler.keys import ScheduledKeys
from choreography_ray.storage import redact_url
from choreography_ray.types import import_type

log = get_logger(__name__)

#: How often node membership is read from Ray, in seconds.
MEMBERSHIP_POLL = 1.0
#: How often the reconciliation loop looks again when no storage asks for it, in seconds.
RECONCILIATION_IDLE = 5.0
#: The internal-KV namespace of every key this package writes.
KV_NAMESPACE = "choreography_ray"

Retry = Callable[[str, Callable[[], Awaitable[Any]]], None]


class Registrations:
    """The storages registered with one Ray namespace's recovery actor, in Ray's internal KV.
    Each call blocks on the GCS: call them through `asyncio.to_thread`."""

    def __init__(self, ray_namespace: str) -> None:
        self.prefix = f"recovery/{ray_namespace}/"

    def key(self, storage_url: str, options_json: str) -> str:
        digest = hashlib.sha256(f"{storage_url}\n{options_json}".encode()).hexdigest()
        return self.prefix + digest

    def save(self, storage_url: str, options_json: str) -> None:
        value = json.dumps({"storage_url": storage_url, "options_json": options_json})
        internal_kv._internal_kv_put(
            self.key(storage_url, options_json), value, overwrite=True, namespace=KV_NAMESPACE
        )

    def load(self) -> list[tuple[str, str]]:
        """Every registration, as (storage URL, options JSON)."""
        found: list[tuple[str, str]] = []
        for key in internal_kv._internal_kv_list(self.prefix, namespace=KV_NAMESPACE):
            value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
            if value is None:  # deleted between the listing and the read
                continue
            record = json.loads(value)
            found.append((record["storage_url"], record["options_json"]))
        return found


class Tenant:
    """One storage and its options, as registered by a connection."""

    def __init__(self, storage_url: str, options_json: str, namespace: str) -> None:
        self.storage_url = storage_url
        self.options_json = options_json
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, namespace)
        self.scheduled = ScheduledKeys(shared_scheduler_storage(self.storage))
        self.namespace = namespace
        self.name = redact_url(storage_url)

    async def manager(self, key: JobsManagerKey) -> Any:
        return await asyncio.to_thread(
            actors.manager_actor,
            key.scope,
            key.namespace,
            self.storage_url,
            self.options_json,
            self.namespace,
        )

    async def rehydrate(self, key: JobsManagerKey) -> None:
        await (await self.manager(key)).rehydrate.remote()

    async def schedulers(self) -> None:
        """Brings up the scheduler of every scope with manifests (get-if-exists)."""
        for scope in await self.scheduled.scopes():
            await asyncio.to_thread(actors.scheduler_actor, scope, self.storage_url,
                                    self.options_json, self.namespace)  # fmt: skip

    async def keys(self, retry: Retry) -> set[JobsManagerKey]:
        """The catalog's keys, the scheduler's and every provider's; a failing provider is
        retried alone. A catalog that cannot be read raises, and so do the scheduler's keys
        (they are in the same storage)."""
        keys = set(await self.storage.list_manager_keys())
        keys |= set(await self.scheduled.get_keys())
        for path in self.options.keys_providers:
            try:
                keys |= await provider_keys(path, self.options)
            except Exception as error:
                log.warning("recovery key provider %s failed: %s", path, error)
                retry(f"provider {path}", functools.partial(self._retry_provider, path))
        return keys

    async def _retry_provider(self, path: str) -> None:
        for key in await provider_keys(path, self.options):
            await self.rehydrate(key)


async def provider_keys(path: str, options: JobsOptions) -> set[JobsManagerKey]:
    provider = import_type(path, options.allowed_type_prefixes)()
    keys: Iterable[JobsManagerKey] = await provider.get_keys()
    return {JobsManagerKey(scope=k.scope, namespace=k.namespace) for k in keys}


class Membership:
    """What the watch knows of Ray's nodes: a look returns the nodes that died since the last
    one. The first look takes the dead nodes it finds as known, unless an earlier look failed
    (then a node may have died unseen, so they count as deaths)."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.dead: set[str] | None = None
        self.missed = False

    def failed(self) -> None:
        if self.dead is None:
            self.missed = True

    def look(self, table: dict[str, bool]) -> set[str]:
        alive = {node for node, is_alive in table.items() if is_alive}
        dead = {node for node, is_alive in table.items() if not is_alive}
        dead |= self.alive - set(table)  # gone from the table altogether
        if self.dead is None:
            new = dead if self.missed else set()
            self.dead = set()
        else:
            new = dead - self.dead
        self.dead |= dead
        self.alive = alive
        return new


class RecoveryCore:
    def __init__(self, namespace: str, registrations: Registrations | None = None) -> None:
        self.namespace = namespace
        self.registrations = registrations or Registrations(namespace)
        self.tenants: dict[tuple[str, str], Tenant] = {}
        self.passes = 0
        self.restored = 0
        self.node_deaths: list[str] = []
        self.retrying: dict[str, int] = {}
        self.membership = Membership()
        self.tasks = Supervisor(RECOVERY)
        self.tasks.spawn("restore registrations", self._restore_or_retry())
        self.tasks.repeat(
            "membership watch", self._wait_membership, self._look_at_membership, STANDARD
        )
        self.tasks.repeat("reconciliation", self._wait_reconciliation, self._reconcile, STANDARD)

    # -- registrations ------------------------------------------------------------------------

    async def register(self, storage_url: str, options_json: str) -> None:
        """A connection's storage: recovered now (the cluster came up), and on every pass."""
        key = (storage_url, options_json)
        if key in self.tenants:
            return
        tenant = self.tenants[key] = Tenant(storage_url, options_json, self.namespace)
        try:
            await asyncio.to_thread(self.registrations.save, storage_url, options_json)
        except Exception as error:
            log.warning("recording the registration of %s failed: %s", tenant.name, error)
            self._retry(
                f"registration of {tenant.name}",
                functools.partial(
                    asyncio.to_thread, self.registrations.save, storage_url, options_json
                ),
            )
        await self.recover(tenant)

    async def _restore_or_retry(self) -> None:
        try:
            await self._restore()
        except Exception as error:
            log.warning("reading the registered storages failed: %s", error)
            self._retry("restore registrations", self._restore)

    async def _restore(self) -> None:
        """The storages registered with an earlier incarnation of this actor, and a pass."""
        restored: list[Tenant] = []
        for storage_url, options_json in await asyncio.to_thread(self.registrations.load):
            if (storage_url, options_json) in self.tenants:
                continue  # registered again meanwhile, and recovered then
            try:
                tenant = Tenant(storage_url, options_json, self.namespace)
            except Exception as error:
                log.error("a registered storage cannot be opened again, skipped: %s", error)
                continue
            self.tenants[(storage_url, options_json)] = tenant
            restored.append(tenant)
        if restored:
            self.restored += len(restored)
            log.warning("recovery restarted: %d registered storages, recovering", len(restored))
            self.passes += 1
            await asyncio.gather(*(self.recover(t) for t in restored))

    # -- passes -------------------------------------------------------------------------------

    async def recover_all(self) -> None:
        self.passes += 1
        await asyncio.gather(*(self.recover(t) for t in list(self.tenants.values())))

    async def recover(self, tenant: Tenant) -> None:
        """Rehydrates every key of the tenant; what fails is retried alone, never raised."""
        try:
            await self._recover_keys(tenant)
        except Exception as error:
            log.warning("recovery of %s could not read its keys: %s", tenant.name, error)
            self._retry(f"keys of {tenant.name}", functools.partial(self._recover_keys, tenant))
        try:
            await tenant.schedulers()
        except Exception as error:
            log.warning("bringing up the schedulers of %s failed: %s", tenant.name, error)
            self._retry(f"schedulers of {tenant.name}", tenant.schedulers)

    async def _recover_keys(self, tenant: Tenant) -> None:
        for key in await tenant.keys(self._retry):
            try:
                await tenant.rehydrate(key)
            except Exception as error:
                log.warning("rehydrating %s failed: %s", key, error)
                self._retry(f"manager {key}", functools.partial(tenant.rehydrate, key))

    def _retry(self, what: str, attempt: Callable[[], Awaitable[Any]]) -> None:
        """Retries one failed attempt alone, after 1 s doubling to 60 s, until it works."""
        if what in self.retrying:
            return
        self.retrying[what] = 0

        async def again() -> None:
            while True:
                self.retrying[what] += 1
                await asyncio.sleep(STANDARD.delay(self.retrying[what]))
                try:
                    await attempt()
                except Exception as error:
                    log.warning(
                        "recovery retry %d of %s failed: %s", self.retrying[what], what, error
                    )
                else:
                    del self.retrying[what]
                    return

        self.tasks.spawn(f"retry {what}", again())

    # -- membership ---------------------------------------------------------------------------

    async def _wait_membership(self) -> None:
        if self.membership.dead is not None:  # the first look is at once
            await asyncio.sleep(MEMBERSHIP_POLL)

    async def _look_at_membership(self) -> None:
        try:
            table = await asyncio.to_thread(node_table)
        except Exception:
            self.membership.failed()
            raise
        dead = self.membership.look(table)
        if dead:
            log.warning("nodes %s are dead; recovering jobs", sorted(dead))
            self.node_deaths.extend(sorted(dead))
            self.tasks.spawn(f"pass for dead nodes {sorted(dead)}", self.recover_all())

    # -- reconciliation -----------------------------------------------------------------------

    def _reconciliation_every(self) -> float | None:
        intervals = [t.options.reconciliation_seconds for t in self.tenants.values()]
        return min((i for i in intervals if i is not None), default=None)

    async def _wait_reconciliation(self) -> None:
        await asyncio.sleep(self._reconciliation_every() or RECONCILIATION_IDLE)

    async def _reconcile(self) -> None:
        if self._reconciliation_every() is not None:
            await self.reconcile()

    async def reconcile(self) -> int:
        """Rehydrates the keys that have a job stored as live, or with an unfinished stop or
        removal, whose job actor is gone. The jobs are read first, then Ray is asked once which
        named actors exist, not once per job. A listing that fails raises (the task is logged
        by name and run again): no job is taken for orphaned without a listing."""
        unsettled = [
            (tenant, key, names)
            for tenant in list(self.tenants.values())
            if tenant.options.reconciliation_seconds is not None
            for key, names in await self._unsettled(tenant)
        ]
        if not unsettled:
            return 0
        existing = await asyncio.to_thread(named_actors, self.namespace)
        orphaned = 0
        for tenant, key, names in unsettled:
            if missing := names - existing:
                orphaned += len(missing)
                try:
                    await tenant.rehydrate(key)
                except Exception as error:
                    log.warning("reconciling %s failed: %s", key, error)
                    self._retry(f"manager {key}", functools.partial(tenant.rehydrate, key))
        return orphaned

    async def _unsettled(self, tenant: Tenant) -> list[tuple[JobsManagerKey, set[str]]]:
        """The actor names of each key's unsettled jobs (one indexed query per key), for the
        keys that have some. A storage that fails is logged, and yields the keys read before."""
        found: list[tuple[JobsManagerKey, set[str]]] = []
        try:
            for key in await tenant.keys(self._retry):
                jobs = await tenant.storage.list_unsettled_jobs(key.scope, key.namespace)
                if jobs:
                    found.append((key, {job_name(j.id) for j in jobs}))
        except Exception as error:
            # One storage that cannot be read (gone, unreachable) holds up no other.
            log.warning("reconciling storage %s failed: %s", tenant.name, error)
        return found

    def stats(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "restored": self.restored,
            "node_deaths": list(self.node_deaths),
            "storages": len(self.tenants),
            "retrying": dict(self.retrying),
            "failures": dict(self.tasks.failures),
        }


@ray.remote
class RecoveryActor:
    """A thin shell over `RecoveryCore`; created by `actors.recovery_actor`."""

    def __init__(self, namespace: str) -> None:
        configure_actor()
        self.core = RecoveryCore(namespace)

    async def register(self, storage_url: str, options_json: str) -> None:
        await self.core.register(storage_url, options_json)

    async def recover_all(self) -> None:
        await self.core.recover_all()

    async def reconcile(self) -> int:
        return await self.core.reconcile()

    async def stats(self) -> dict[str, Any]:
        """Passes run, storages restored after a restart, node deaths seen, retries running
        and background tasks that failed (name: last error)."""
        return self.core.stats()


def ensure_recovery(storage_url: str, options: JobsOptions, namespace: str) -> Any:
    """Creates (or finds) the recovery actor and registers this connection's storage with it."""
    actor = actors.recovery_actor(namespace)
    ray.get(actor.register.remote(storage_url, options.model_dump_json()))
    return actor


async def ensure_recovery_async(storage_url: str, options: JobsOptions, namespace: str) -> Any:
    """`ensure_recovery` without blocking the event loop: the actor is looked up (or created) in
    a worker thread, and its answer awaited, never `ray.get` (which Ray refuses to see inside
    an async actor, even from a thread)."""
    actor = await asyncio.to_thread(actors.recovery_actor, namespace)
    await actor.register.remote(storage_url, options.model_dump_json())
    return actor
