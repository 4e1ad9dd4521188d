"""What the pools' hosts run now (`Jobs.pools`, `choreography-ray pools`, `jobs show`): each
host of each pool is asked once, all at the same time, and the pools' owner for the steps the
jobs hold back; a host that does not answer within `ANSWER_SECONDS` counts as pending. A
blocking call to Ray."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import ray
from ray.util import metrics as ray_metrics

from choreography_ray.model import PoolState
from choreography_ray.runtime.names import POOLS, pool_prefix

if TYPE_CHECKING:
    from choreography_ray.runtime.step_host import StepHostCore

#: Seconds a pool host has to answer before it counts as pending.
ANSWER_SECONDS = 2.0
#: Seconds between two recordings of a pool host's gauges.
GAUGE_SECONDS = 5.0
#: The pool gauges (docs/metrics.md), each tagged by `shape`; a host records its own (Ray
#: tags each series with the process), so their sum over the series is the pool's.
POOL_GAUGES = {
    "choreography_pool_hosts": "Step hosts of the pool (1 per host).",
    "choreography_pool_busy_steps": "Steps of the pool in a perform or batch.",
    "choreography_pool_queued_steps": "Steps waiting on the pool's hosts.",
}


def list_pools(namespace: str, shapes: Collection[str] | None = None) -> list[PoolState]:
    """The pools of the Ray namespace (only those of `shapes` when given), by shape."""
    names = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == namespace and actor["name"].startswith(pool_prefix())
    ]
    if shapes is not None:
        names = [name for name in names if name.split("/")[1] in shapes]
    asked: dict[str, Any] = {}
    for name in names:
        try:
            asked[name] = ray.get_actor(name, namespace=namespace).describe.remote()
        except ValueError:  # gone since it was listed
            continue
    owner = _owner(namespace)
    done, _ = ray.wait(
        [*asked.values(), *owner], num_returns=len(asked) + len(owner), timeout=ANSWER_SECONDS
    )
    answered = set(done)
    pools: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for ref in owner:
        if ref in answered:
            for shape, said in ray.get(ref).items():
                if shapes is None or shape in shapes:
                    pools[shape]["waiting"] = said.get("waiting", 0)
                    pools[shape]["wanted"] = said.get("wanted", 0)
    nodes: dict[str, set[str]] = defaultdict(set)
    for name, ref in asked.items():
        _, shape, node, _ = name.split("/")
        pool = pools[shape]
        try:
            host = ray.get(ref) if ref in answered else None
        except ray.exceptions.RayError:  # died meanwhile
            continue
        if host is None:
            pool["pending"] += 1
            continue
        pool["hosts"] += 1
        nodes[shape].add(node)
        for lane in host["lanes"].values():
            pool["busy"] += lane["busy"]
            pool["queued"] += lane["queued"]
    return [
        PoolState(shape=shape, nodes=tuple(sorted(nodes[shape])), **counts)
        for shape, counts in sorted(pools.items())
    ]


def _owner(namespace: str) -> list[Any]:
    """The pools' owner's answer to `describe`, when the namespace has an owner."""
    try:
        return [ray.get_actor(POOLS, namespace=namespace).describe.remote()]
    except ValueError:
        return []


async def record_pool_gauges(shape: str, host: StepHostCore) -> None:
    """Every `GAUGE_SECONDS`, while a tenant of the host has metrics on, records the host's
    gauges (`POOL_GAUGES`)."""
    gauges = {name: ray_metrics.Gauge(name, text, ("shape",)) for name, text in POOL_GAUGES.items()}
    tags = {"shape": shape}
    while True:
        if any(tenant.options.metrics for tenant in host.tenants.values()):
            lanes = host.lanes.values()
            gauges["choreography_pool_hosts"].set(1, tags=tags)
            gauges["choreography_pool_busy_steps"].set(
                sum(lane.performing for lane in lanes), tags=tags
            )
            gauges["choreography_pool_queued_steps"].set(
                sum(lane.waiting for lane in lanes), tags=tags
            )
        await asyncio.sleep(GAUGE_SECONDS)
