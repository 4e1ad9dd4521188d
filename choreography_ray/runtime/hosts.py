"""Step hosts as a job activation sees them (`core.hosts.Hosts`): `step-host/{node_id}/{n}`
pinned to each alive node, one per CPU slot by default (`JobsOptions.step_hosts_per_node`), and
dedicated step actors. Every Ray call a job activation makes to a host is made here."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from choreography_ray.core.messages import StepStart, starts_to_wire
from choreography_ray.core.metrics import Labels
from choreography_ray.core.placement import Placement, actor_resources, hosts_fit
from choreography_ray.errors import StepHostUnknownError
from choreography_ray.logs import get_logger
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.membership import alive_node_resources
from choreography_ray.runtime.names import (
    PENDING,
    actor_options,
    pool_host_name,
    pool_prefix,
    step_actor_name,
    step_host_name,
)
from choreography_ray.runtime.step_host import StepHost
from choreography_ray.types import import_type

log = get_logger(__name__)


@dataclass
class Pool:
    """The hosts of one resource shape, as this activation knows them."""

    resources: tuple[tuple[str, float], ...]
    hosts: list[str] = field(default_factory=list)
    turn: int = 0
    #: When this activation last placed steps on it (monotonic seconds).
    placed: float = field(default_factory=time.monotonic)


class RayHosts:
    def __init__(self, storage_url: str, options: JobsOptions, namespace: str) -> None:
        self.context = (storage_url, options.model_dump_json())
        self._args = (namespace, options.step_host_capacity)
        self._options = options
        self._namespace = namespace
        self.handles: dict[str, Any] = {}
        self._shared: list[str] = []
        self._turn = 0  # the rotation survives refreshes, so batches keep spreading over nodes
        #: The pools this activation placed steps on, by shape.
        self.pools: dict[str, Pool] = {}
        #: The alive nodes' resources (Ray's names), as the last refresh read them.
        self._nodes: dict[str, dict[str, float]] = {}
        #: Kills of released dedicated step actors in flight.
        self._releasing: set[asyncio.Task[None]] = set()

    async def refresh(self) -> None:
        """Creates (or finds) the hosts of every alive node; forgets those of dead nodes."""
        self._build(await asyncio.to_thread(alive_node_resources))

    def _build(self, nodes: dict[str, dict[str, float]]) -> None:
        self._nodes = nodes
        idle = self._options.pool_idle_timeout
        if idle is not None:
            # A pool this activation has not used for that long is not built again: its hosts
            # leave when idle, and the next step of its shape builds it anew.
            since = time.monotonic() - idle.total_seconds()
            self.pools = {shape: p for shape, p in self.pools.items() if p.placed >= since}
        built: dict[str, Any] = {}
        for node_id, resources in nodes.items():
            for index in range(self._options.step_hosts_per_node or hosts_fit((), resources)):
                name = step_host_name(node_id, index)
                built[name] = self._host(name, node_id)
        self._shared = list(built)
        for shape, pool in self.pools.items():
            pool.hosts = []
            for node_id, resources in nodes.items():
                for index in range(hosts_fit(pool.resources, resources)):
                    name = pool_host_name(shape, node_id, index)
                    built[name] = self._host(name, node_id, pool.resources)
                    pool.hosts.append(name)
            if not pool.hosts:
                # No alive node fits the shape: one host Ray places where it can, pending
                # until a node that fits joins, which an autoscaler sees as demand.
                name = pool_host_name(shape, PENDING, 0)
                built[name] = self._host(name, None, pool.resources)
                pool.hosts.append(name)
        rebuilt = ("step-host/", *map(pool_prefix, self.pools))
        others = {n: h for n, h in self.handles.items() if not n.startswith(rebuilt)}
        self.handles = {**others, **built}

    def _host(
        self, name: str, node_id: str | None, resources: tuple[tuple[str, float], ...] | None = None
    ) -> Any:
        """The handle of a shared host (`resources` None) or a pool's, created when missing."""
        if (handle := self.handles.get(name)) is not None:
            return handle
        extra: dict[str, Any] = {}
        if node_id is not None:
            extra["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        idle_timeout = shape = None
        if resources is not None:
            extra.update(actor_resources(resources))
            timeout = self._options.pool_idle_timeout
            idle_timeout = None if timeout is None else timeout.total_seconds()
            shape = name.split("/")[1]
        return StepHost.options(  # type: ignore[attr-defined]
            **actor_options(name, self._namespace, **extra)
        ).remote(*self._args, idle_timeout, shape)

    def place(
        self, job_id: str, starts: list[StepStart], placement: Placement
    ) -> list[tuple[str, list[StepStart]]]:
        if placement.dedicated:
            return [(self._dedicated(job_id, start), [start]) for start in starts]
        if placement.shape is not None:
            return self._place_in_pool(placement, starts)
        if not self._shared:
            # The first placement of an activation: one read of the node table.
            self._build(alive_node_resources())
            if not self._shared:
                raise RuntimeError("no alive Ray node to host steps")
        name = self._shared[self._turn % len(self._shared)]
        self._turn += 1
        return [(name, starts)]

    def _dedicated(self, job_id: str, start: StepStart) -> str:
        step_type = import_type(start.type, self._options.allowed_type_prefixes)
        name = step_actor_name(job_id, start.step_id)
        self.handles[name] = StepHost.options(  # type: ignore[attr-defined]
            **actor_options(name, self._namespace, **getattr(step_type, "actor_options", {}))
        ).remote(*self._args)
        return name

    def _place_in_pool(
        self, placement: Placement, starts: list[StepStart]
    ) -> list[tuple[str, list[StepStart]]]:
        """An even share of `starts` to each host of the pool, from the next one on."""
        assert placement.shape is not None
        pool = self.pools.get(placement.shape)
        if pool is None:
            # The activation's first step of the shape: its hosts on every node they fit.
            pool = self.pools[placement.shape] = Pool(placement.resources)
            self._build(self._nodes or alive_node_resources())
        pool.placed = time.monotonic()
        hosts = len(pool.hosts)
        share = -(-len(starts) // hosts)
        placed = []
        for begin in range(0, len(starts), share):
            placed.append((pool.hosts[pool.turn % hosts], starts[begin : begin + share]))
            pool.turn += 1
        return placed

    async def start(
        self, host: str, job_id: str, batch: Sequence[StepStart], labels: Labels, epoch: int = 0
    ) -> str:
        wire = starts_to_wire(batch)
        handle = self.handles[host]
        try:
            _started, incarnation = await handle.start_steps.remote(
                job_id, self.context, wire, tuple(labels), epoch
            )
        except ray.exceptions.ActorDiedError:
            self._forget_pool_host(host)
            raise
        return str(incarnation)

    def _forget_pool_host(self, host: str) -> None:
        """A pool's host that is gone (it left when idle, or its node did) gets no more steps
        until a refresh finds it again; a pool left without hosts is built anew."""
        for shape, pool in list(self.pools.items()):
            if host in pool.hosts:
                pool.hosts.remove(host)
                self.handles.pop(host, None)
                if not pool.hosts:
                    del self.pools[shape]

    async def cancel(self, hosts: Collection[str], job_id: str, removing: bool) -> None:
        handles = [self.handles[h] for h in hosts if h in self.handles]
        answers = await asyncio.gather(
            *(h.cancel_steps.remote(job_id, removing) for h in handles), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                log.warning("job %s: telling a host to stop its steps failed: %s", job_id, answer)

    async def running(self, job_id: str, fence: bool = False, epoch: int = 0) -> dict[str, str]:
        """Asks every host of the job: those of alive nodes and its dedicated step actors,
        also those an earlier activation created. A dead host runs nothing; a live one that
        does not answer raises `StepHostUnknownError`."""
        await self.refresh()
        await self._find_hosts(job_id)
        names = list(self.handles)
        answers = await asyncio.gather(
            *(self.handles[n].running_steps.remote(job_id, fence, epoch) for n in names),
            return_exceptions=True,
        )
        running: dict[str, str] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, ray.exceptions.ActorDiedError):
                continue
            if isinstance(answer, BaseException):
                raise StepHostUnknownError(
                    f"step host {name} did not answer which steps of job {job_id} it runs: {answer}"
                )
            running.update(dict.fromkeys(answer, name))
        return running

    async def _find_hosts(self, job_id: str) -> None:
        """Handles of the job's dedicated step actors and of the pools' hosts this activation
        did not create (an earlier one did)."""
        prefixes = (step_actor_name(job_id, ""), pool_prefix())
        for name in await asyncio.to_thread(self._named, *prefixes):
            if name not in self.handles:
                with contextlib.suppress(ValueError):  # gone since it was listed
                    self.handles[name] = ray.get_actor(name, namespace=self._namespace)

    def _named(self, *prefixes: str) -> list[str]:
        """The names of this namespace's actors that start with one of `prefixes`."""
        return [
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == self._namespace and actor["name"].startswith(prefixes)
        ]

    async def lift_fence(self, job_id: str) -> None:
        answers = await asyncio.gather(
            *(h.lift_fence.remote(job_id) for h in list(self.handles.values())),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                log.warning("job %s: lifting a host's fence failed (it lifts itself): %s",
                            job_id, answer)  # fmt: skip

    async def watch(self, host: str, incarnation: str | None) -> None:
        handle = self.handles.get(host)
        if handle is None:
            return  # released: this activation is done with it
        try:
            await handle.watch.remote(incarnation)
        except ray.exceptions.ActorUnavailableError:
            raise  # it may be back soon: the job asks again, and a new incarnation answers
        except ray.exceptions.RayError:
            return  # dead, or never to run again (its node is gone): this incarnation is gone

    def release(self, host: str) -> None:
        """Kills a dedicated step's actor in a named task: `ray.kill` is a call to the GCS,
        which a turn does not wait for."""
        handle = self.handles.pop(host, None)
        if handle is None:
            return
        kill = asyncio.to_thread(ray.kill, handle, no_restart=True)
        task = asyncio.get_running_loop().create_task(kill, name=f"release {host}")
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("%s failed (its job releases it again as it ends): %s",
                        task.get_name(), error)  # fmt: skip

    async def release_job(self, job_id: str) -> None:
        """Every dedicated step actor of the job, also those a lost activation left behind."""
        for name in await asyncio.to_thread(self._named, step_actor_name(job_id, "")):
            with contextlib.suppress(Exception):
                ray.kill(ray.get_actor(name, namespace=self._namespace), no_restart=True)

    async def activation_gone(self, activation: str) -> bool:
        return await asyncio.to_thread(activation_gone, activation)


def activation_gone(activation: str) -> bool:
    """The hosting actor is dead, or alive in another process (a restart lost its steps).

    Read from this cluster's GCS record of the actor: the public state API needs the dashboard,
    and without an address it may reach another Ray instance on the machine."""
    from ray._private import state

    actor_id, _, pid = activation.partition(":")
    try:
        info = state.actors(actor_id)
    except Exception:  # the GCS cannot be read: do not declare anybody gone
        return False
    if not info:
        return True
    alive_elsewhere = bool(pid) and str(info.get("Pid")) != pid
    return info.get("State") == "DEAD" or (info.get("State") == "ALIVE" and alive_elsewhere)
