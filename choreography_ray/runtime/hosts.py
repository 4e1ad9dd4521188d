"""Step hosts as a job activation sees them (`core.hosts.Hosts`): `step-host/{node_id}/{n}`
pinned to each alive node, one per CPU slot by default (`JobsOptions.step_hosts_per_node`), the
pools' hosts the pools' owner names (`runtime/pool_owner.py`), and dedicated step actors.
Every Ray call a job activation makes to a host is made here, and each has a deadline but the
watch (a call that returns when its host is gone, awaited outside the job's turns)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from choreography_ray.core.messages import StepStart, starts_to_wire
from choreography_ray.core.metrics import Labels
from choreography_ray.core.placement import Placement, hosts_fit
from choreography_ray.core.pool_rules import PoolDemand
from choreography_ray.core.sharing import NO_SHARE, Share
from choreography_ray.errors import StepHostUnknownError
from choreography_ray.logs import get_logger
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.actors import pool_owner_actor
from choreography_ray.runtime.membership import alive_node_resources
from choreography_ray.runtime.names import (
    actor_options,
    pool_prefix,
    step_actor_name,
    step_host_name,
)
from choreography_ray.runtime.step_host import StepHost
from choreography_ray.types import import_type

log = get_logger(__name__)

#: The names of the shared hosts start with it.
SHARED = step_host_name("", 0).split("/")[0] + "/"

#: Seconds a host (or the pools' owner) has to answer a control call: which steps of a job it
#: runs, a stop, a fence lifted. A host that misses it is not known yet, and asked again.
CONTROL_SECONDS = 10.0
#: Shared hosts a spare job actor reaches ahead of its job (`warm`): the first ones its
#: placements take.
WARM_HOSTS = 2
#: Seconds a host has to answer a start: it answers once the steps' RUNNING is stored, and a
#: shared host at capacity first waits for room, which throttles the job's starts.
START_SECONDS = 300.0


class RayHosts:
    def __init__(self, storage_url: str, options: JobsOptions, namespace: str) -> None:
        self.context = (storage_url, options.model_dump_json())
        self._args = (namespace, options.step_host_capacity)
        self._options = options
        self._namespace = namespace
        self.handles: dict[str, Any] = {}
        #: The shared hosts of the alive nodes: name -> node id.
        self._shared: dict[str, str] = {}
        self._turn = 0  # the rotation survives refreshes, so batches keep spreading over nodes
        #: Per shape, the placed hosts of its pool as the pools' owner last named them.
        self._pools: dict[str, list[str]] = {}
        #: Per shape, how many hosts the owner has created and Ray not placed yet.
        self._coming: dict[str, int] = {}
        self._owner: Any = None
        #: Per host, the incarnation that last answered a start or listed the job's steps.
        self._incarnations: dict[str, str] = {}
        #: Per job, the hosts its last fenced `running` asked: they lift the fence.
        self._fenced: dict[str, list[str]] = {}
        #: Kills of released dedicated step actors in flight.
        self._releasing: set[asyncio.Task[None]] = set()
        #: The job actor's own handle, sent with each start: its hosts deliver to it.
        self.reply_to: Any = None

    async def refresh(self) -> None:
        """Learns the shared hosts of every alive node (their names: a host is created when a
        step is first placed on it); forgets those of dead nodes."""
        self._build(await asyncio.to_thread(alive_node_resources))

    async def warm(self) -> None:
        """The node table, and the first shared hosts a placement takes found and called
        once (a host that is not there yet is created when a step is first placed on it)."""
        await self.refresh()
        names = [n for n in list(self._shared)[:WARM_HOSTS] if n not in self.handles]
        self.handles.update(await asyncio.to_thread(self._existing, names))
        await self._ask([n for n in names if n in self.handles], "ping")

    def _existing(self, names: list[str]) -> dict[str, Any]:
        found = {}
        for name in names:
            with contextlib.suppress(ValueError):
                found[name] = ray.get_actor(name, namespace=self._namespace)
        return found

    def _build(self, nodes: dict[str, dict[str, float]]) -> None:
        self._shared = {
            step_host_name(node_id, index): node_id
            for node_id, resources in nodes.items()
            for index in range(self._options.step_hosts_per_node or hosts_fit((), resources))
        }
        for name in [n for n in self.handles if n.startswith(SHARED) and n not in self._shared]:
            del self.handles[name]

    def _shared_host(self, name: str) -> str:
        """The shared host `name`, created (or found) on its node when it has no handle yet:
        a node that no plain step was placed on has none (a live actor keeps a node from an
        autoscaler's scale-down, even one reserving nothing)."""
        if name not in self.handles:
            strategy = NodeAffinitySchedulingStrategy(self._shared[name], soft=False)
            self.handles[name] = StepHost.options(  # type: ignore[attr-defined]
                **actor_options(name, self._namespace, scheduling_strategy=strategy)
            ).remote(*self._args)
        return name

    def place(
        self, job_id: str, starts: list[StepStart], placement: Placement
    ) -> list[tuple[str, list[StepStart]]]:
        if placement.dedicated:
            return [(self._dedicated(job_id, start), [start]) for start in starts]
        if placement.shape is not None:
            raise ValueError("a pool's steps go to the hosts `pool_hosts` names")
        if not self._shared:
            # The first placement of an activation: one read of the node table.
            self._build(alive_node_resources())
            if not self._shared:
                raise RuntimeError("no alive Ray node to host steps")
        names = list(self._shared)
        name = self._shared_host(names[self._turn % len(names)])
        self._turn += 1
        return [(name, starts)]

    def _dedicated(self, job_id: str, start: StepStart) -> str:
        step_type = import_type(start.type, self._options.allowed_type_prefixes)
        name = step_actor_name(job_id, start.step_id)
        self.handles[name] = StepHost.options(  # type: ignore[attr-defined]
            **actor_options(name, self._namespace, **getattr(step_type, "actor_options", {}))
        ).remote(*self._args)
        return name

    def pool_hosts(self, shape: str) -> list[str] | None:
        return self._pools.get(shape)

    def pool_growing(self, shape: str) -> bool:
        return self._coming.get(shape, 0) > 0

    def pool_shapes(self) -> list[str]:
        """The pools this activation has steps of (or had)."""
        return list(self._pools)

    async def sync_pools(self, job_id: str, demands: list[PoolDemand]) -> None:
        """Tells the pools' owner what the job holds of each pool and learns their placed
        hosts; an owner that does not answer in time leaves what was known (asked again)."""
        try:
            if self._owner is None:
                capacity = self._options.step_host_capacity
                self._owner = await asyncio.to_thread(pool_owner_actor, self._namespace, capacity)
            async with asyncio.timeout(CONTROL_SECONDS):
                answer = await self._owner.sync.remote(job_id, demands)
        except (TimeoutError, ray.exceptions.RayError) as error:
            log.warning("job %s: the pools' owner did not answer (%s); asked again soon",
                        job_id, error)  # fmt: skip
            return
        for shape, (hosts, coming) in answer.items():
            self._pools[shape] = [name for name, _handle in hosts]
            self._coming[shape] = coming
            self.handles.update(hosts)

    async def start(
        self,
        host: str,
        job_id: str,
        batch: Sequence[StepStart],
        labels: Labels,
        epoch: int = 0,
        share: Share = NO_SHARE,
    ) -> str:
        wire = starts_to_wire(batch)
        handle = self.handles[host]
        try:
            async with asyncio.timeout(START_SECONDS):
                _started, incarnation = await handle.start_steps.remote(
                    job_id, self.context, wire, tuple(labels), epoch, tuple(share), self.reply_to
                )
        except ray.exceptions.ActorDiedError:
            self._forget(host)
            raise
        except TimeoutError:
            raise StepHostUnknownError(
                f"step host {host} did not answer a start of job {job_id} in {START_SECONDS:g} s"
            ) from None
        self._incarnations[host] = str(incarnation)
        return str(incarnation)

    def known_incarnation(self, host: str) -> str | None:
        return self._incarnations.get(host)

    def _forget(self, host: str) -> None:
        """A host that is gone (it left when idle, or its node did): a pool's gets no more
        steps until the pools' owner names it again; a shared one is created again when a
        step is next placed on it."""
        self.handles.pop(host, None)
        self._incarnations.pop(host, None)
        for hosts in self._pools.values():
            if host in hosts:
                hosts.remove(host)

    async def cancel(self, hosts: Collection[str], job_id: str, removing: bool) -> None:
        names = [h for h in hosts if h in self.handles]
        answers = await self._ask(names, "cancel_steps", job_id, removing)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("job %s: telling host %s to stop its steps failed: %r", job_id,
                            name, answer)  # fmt: skip

    async def _ask(self, names: list[str], method: str, *args: Any) -> list[Any]:
        """Calls `method` of each host at once, each answer (or its error) within
        CONTROL_SECONDS: a host that misses it answers `TimeoutError`."""

        async def ask(name: str) -> Any:
            async with asyncio.timeout(CONTROL_SECONDS):
                return await getattr(self.handles[name], method).remote(*args)

        return await asyncio.gather(*(ask(name) for name in names), return_exceptions=True)

    async def running(self, job_id: str, fence: bool = False, epoch: int = 0) -> dict[str, str]:
        """Asks every host Ray has placed that can hold the job's steps: the shared hosts of
        alive nodes, the pools' hosts and the job's dedicated step actors, also those an
        earlier activation created. A host Ray has not placed (pending, restarting, dead)
        runs nothing and is not asked; a placed one that does not answer within
        CONTROL_SECONDS raises `StepHostUnknownError` (not known yet: asked again)."""
        await self.refresh()
        names = await self._placed(job_id)
        if fence:
            self._fenced[job_id] = names
        answers = await self._ask(names, "running_steps", job_id, fence, epoch)
        running: dict[str, str] = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, ray.exceptions.ActorDiedError):
                continue
            if isinstance(answer, BaseException):
                raise StepHostUnknownError(
                    f"step host {name} did not answer which steps of job {job_id} it runs: "
                    f"{answer!r}"
                )
            steps, self._incarnations[name] = answer
            running.update(dict.fromkeys(steps, name))
        return running

    async def _placed(self, job_id: str) -> list[str]:
        """The hosts that can hold the job's steps and that Ray has placed (alive)."""
        listed, alive = await asyncio.to_thread(
            self._named_and_alive, SHARED, step_actor_name(job_id, ""), pool_prefix()
        )
        for name in listed:
            if name not in self.handles:
                with contextlib.suppress(ValueError):  # gone since it was listed
                    self.handles[name] = ray.get_actor(name, namespace=self._namespace)
        return [n for n in listed if n in self.handles and self.handles[n]._actor_id.hex() in alive]

    def _named_and_alive(self, *prefixes: str) -> tuple[list[str], set[str]]:
        from ray._private import state

        return self._named(*prefixes), set(state.actors(actor_state_name="ALIVE"))

    def _named(self, *prefixes: str) -> list[str]:
        """The names of this namespace's actors that start with one of `prefixes`."""
        return [
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == self._namespace and actor["name"].startswith(prefixes)
        ]

    async def lift_fence(self, job_id: str) -> None:
        names = [n for n in self._fenced.pop(job_id, []) if n in self.handles]
        answers = await self._ask(names, "lift_fence", job_id)
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("job %s: lifting the fence of host %s failed (it lifts itself): %r",
                            job_id, name, answer)  # fmt: skip

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
        """Every dedicated step actor of the job, also those a lost activation left behind;
        the job's demand on the pools is withdrawn."""
        if self._pools:
            await self.sync_pools(job_id, [])
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
