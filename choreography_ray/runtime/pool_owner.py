"""`pools`: the one actor of a Ray namespace that makes the pools' hosts (`core/pool_rules.py`
has its rules). Jobs tell it what they hold of each pool (`sync`, about once a second while they
have such steps) and learn the hosts Ray has placed; a tick reads what Ray can place, creates
hosts where they fit, kills those never placed, asks surplus idle hosts to leave for a shape
that waits, and asks the autoscaler for a bundle per wanted host
(`ray.autoscaler.sdk.request_resources`, replacing the whole request: docs/pools.md).

Its state changes in turns (`_turn`): a tick reads Ray first, then decides and acts in one turn;
a `sync` is one short turn. Every Ray call it makes to a host is bounded or in a named task.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from choreography_ray.core.placement import actor_resources
from choreography_ray.core.pool_rules import Create, PoolDemand, PoolRules
from choreography_ray.logs import configure_actor, get_logger
from choreography_ray.runtime.membership import alive_node_resources
from choreography_ray.runtime.names import actor_options, pool_prefix

log = get_logger(__name__)

#: Seconds between two ticks while any pool is in use (has demand or hosts) ...
TICK_SECONDS = 1.0
#: ... and while a host it created is not placed yet.
TICK_SOON_SECONDS = 0.2
#: Seconds a host has to answer `leave_if_idle`.
ASK_SECONDS = 5.0


@ray.remote
class PoolOwner:
    def __init__(self, namespace: str, capacity: int) -> None:
        configure_actor()
        self._namespace = namespace
        self._capacity = capacity
        self.rules = PoolRules()
        self._handles: dict[str, Any] = {}
        self._turn = asyncio.Lock()
        #: Held while a request goes to the autoscaler: each sends the latest one.
        self._requesting = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._spawn(self._ticks(), "pool ticks")

    # -- what jobs and readers ask ------------------------------------------------------------

    async def sync(
        self, job_id: str, demands: list[PoolDemand]
    ) -> dict[str, tuple[list[tuple[str, Any]], int]]:
        """The job's demand per shape; for each shape it named, the placed hosts (name,
        handle) and how many more are on their way."""
        async with self._turn:
            now = time.monotonic()
            said = self.rules.say(job_id, demands, now)
            if self.rules.untried(now):
                self._wake.set()  # hosts wanted that no plan tried yet: tick now
            return {shape: (self._named(names), coming) for shape, (names, coming) in said.items()}

    async def describe(self) -> dict[str, dict[str, int]]:
        """Per shape: `waiting` steps the jobs hold back, `wanted` hosts, `unplaced` hosts."""
        now = time.monotonic()
        shapes: dict[str, dict[str, int]] = {}
        for shape, steps in self.rules.waiting(now).items():
            shapes.setdefault(shape, {})["waiting"] = steps
        for shape, (want, _d) in self.rules.wanted(now).items():
            shapes.setdefault(shape, {})["wanted"] = want
        for row in self.rules.hosts.values():
            entry = shapes.setdefault(row.shape, {})
            placed = row.state.value == "Placed"
            entry["unplaced"] = entry.get("unplaced", 0) + (not placed)
        return shapes

    def _named(self, names: list[str]) -> list[tuple[str, Any]]:
        return [(name, self._handles[name]) for name in names if name in self._handles]

    # -- the tick -----------------------------------------------------------------------------

    async def _ticks(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:
                log.exception("the pools' tick failed; again in %g s", TICK_SECONDS)
            busy = bool(self.rules.demand or self.rules.hosts)
            every = TICK_SOON_SECONDS if self.rules.unplaced() else TICK_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every if busy else 30 * TICK_SECONDS):
                    await self._wake.wait()
            self._wake.clear()

    async def _tick(self) -> None:
        listed_at = time.monotonic()
        names, alive, total, available = await asyncio.to_thread(self._read_ray)
        async with self._turn:
            now = time.monotonic()
            for name, handle in names.items():
                self._handles.setdefault(name, handle)
            for name in [n for n in self._handles if n not in names]:
                if name not in self.rules.hosts:
                    del self._handles[name]
            self.rules.seen(
                {name: self._handles[name]._actor_id.hex() in alive for name in names},
                now,
                listed_at,
            )
            plan = self.rules.plan(total, available, now)
            for create in plan.create:
                try:
                    self._handles[create.name] = self._create(create)
                except Exception as error:  # its name still taken by one just killed, say
                    del self.rules.hosts[create.name]  # not on its way: made again next tick
                    log.warning("creating pool host %s failed (again next tick): %s",
                                create.name, error)  # fmt: skip
                    continue
                log.info("pool host %s created", create.name)
            for name in plan.kill:
                log.warning("pool host %s was not placed in time: killed (its node's resources "
                            "went to another actor)", name)  # fmt: skip
                if (handle := self._handles.pop(name, None)) is not None:
                    kill = asyncio.to_thread(ray.kill, handle, no_restart=True)
                    self._spawn(kill, f"kill {name}")
            for name in plan.reclaim:
                if (handle := self._handles.get(name)) is not None:
                    self._spawn(self._reclaim(name, handle), f"reclaim {name}")
            request = self.rules.request(now)
            if request != self.rules.requested:
                self.rules.requested = request
                self._spawn(self._request(), "request resources")

    def _read_ray(
        self,
    ) -> tuple[dict[str, Any], set[str], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
        """The pool hosts of the namespace by name, the ids of alive actors, each alive node's
        total and available resources (blocking calls to the GCS)."""
        from ray._private import state

        names: dict[str, Any] = {}
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = actor["name"]
            if actor["namespace"] != self._namespace or not name.startswith(pool_prefix()):
                continue
            handle = self._handles.get(name)
            if handle is None:
                with contextlib.suppress(ValueError):  # gone since it was listed
                    handle = ray.get_actor(name, namespace=self._namespace)
            if handle is not None:
                names[name] = handle
        alive = set(state.actors(actor_state_name="ALIVE"))
        total = alive_node_resources()
        available = {
            node: resources
            for node, resources in state.available_resources_per_node().items()  # type: ignore[no-untyped-call]
            if node in total
        }
        return names, alive, total, available

    def _create(self, create: Create) -> Any:
        from choreography_ray.runtime.step_host import StepHost

        extra = {
            # Not another's: a name still held by a host just killed (a dying actor that
            # would never be placed) fails here, and the host is made again next tick.
            "get_if_exists": False,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(create.node, soft=False),
            **actor_resources(create.resources),
        }
        return StepHost.options(  # type: ignore[attr-defined]
            **actor_options(create.name, self._namespace, **extra)
        ).remote(self._namespace, self._capacity, create.idle_timeout, create.shape)

    async def _reclaim(self, name: str, handle: Any) -> None:
        async with asyncio.timeout(ASK_SECONDS):
            if await handle.leave_if_idle.remote():
                log.info("pool host %s left for a pool that waits", name)

    async def _request(self) -> None:
        """Sends the latest request (one at a time, so an older one never lands last)."""
        from ray.autoscaler.sdk import request_resources

        async with self._requesting:
            bundles = self.rules.requested
            await asyncio.to_thread(request_resources, bundles=bundles)
        log.info("asked the autoscaler for %d pool host bundles", len(bundles))

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("pools task %r failed: %r", task.get_name(), error)
