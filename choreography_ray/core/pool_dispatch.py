"""A job's steps of a pool go to hosts that have room for them: work follows capacity.

A pool's host holds at most `Placement.credit` steps of one job at once (running or queued
there); the job hands it more as its outcomes come back. So the steps of a pool wait in the
job's window (QUEUED) until a placed host has room: a host that joins takes part of the
backlog, a slow host takes less, and a host Ray has not placed gets nothing. What the job holds
of each pool (waiting and on its hosts) is its demand: the pump tells the pools' owner about
once a second (`sync`), and learns the placed hosts.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from choreography_ray.core.messages import StepStart
from choreography_ray.core.placement import ROUNDS_PER_HOST, Placement
from choreography_ray.core.pool_rules import PoolDemand

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

#: Seconds between two syncs with the pools' owner while the job holds steps of a pool ...
SYNC_SECONDS = 1.0
#: ... and while steps wait for a pool that has no placed host yet, or hosts on their way.
SYNC_SOON_SECONDS = 0.2


def room_for(a: Activation, placement_of: Callable[[str], Placement]) -> Callable[[str], float]:
    """Step type -> how many of its steps may start now: any number off the pools; for a
    pool's type, the room its placed hosts have, shared by the types of the same shape in one
    call (`Window.next_batch` asks each type once)."""
    left: dict[str, float] = {}

    def room(step_type: str) -> float:
        try:
            where = placement_of(step_type)
        except Exception:
            return math.inf  # taken, and fails to start
        if where.shape is None:
            return math.inf
        if where.shape not in left:
            hosts = a.hosts.pool_hosts(where.shape)
            if hosts is None and not a.timers.armed("pools"):
                a.timers.arm("pools", 0.0)  # not asked yet
            left[where.shape] = sum(free(a, where, hosts or ()).values())
        room, left[where.shape] = left[where.shape], 0
        return room

    return room


def free(a: Activation, where: Placement, hosts: tuple[str, ...] | list[str]) -> dict[str, int]:
    """Each host's room for the job's steps of the pool: its credit, or one round while more
    hosts of the pool are on their way (they get their share once placed)."""
    assert where.shape is not None
    growing = a.hosts.pool_growing(where.shape)
    holds = _round(where) if growing else where.credit
    return {host: max(0, holds - a.window.load(host)) for host in hosts}


def _round(where: Placement) -> int:
    """What one host of the pool runs at once: `concurrency * batch_size`."""
    return max(1, where.credit // ROUNDS_PER_HOST)


def share_out(
    a: Activation, where: Placement, starts: list[StepStart]
) -> tuple[list[tuple[str, list[StepStart]]], list[StepStart]]:
    """The pool's steps per host, a round (`credit / ROUNDS_PER_HOST` steps) at a time to the
    host with the most room left, so a small job spreads over the hosts and a host that joins
    fills first; and the steps no host has room for."""
    assert where.shape is not None
    room = free(a, where, a.hosts.pool_hosts(where.shape) or ())
    chunk = _round(where)
    shares: dict[str, list[StepStart]] = {}
    begin = 0
    while begin < len(starts):
        host = max(room, key=lambda h: (room[h], h), default=None)
        if host is None or room[host] <= 0:
            break
        n = min(chunk, room[host], len(starts) - begin)
        shares.setdefault(host, []).extend(starts[begin : begin + n])
        room[host] -= n
        begin += n
    return list(shares.items()), starts[begin:]


def demands(a: Activation) -> list[PoolDemand]:
    """What the job holds of each pool it uses: its steps waiting, and on the pool's hosts."""
    steps: defaultdict[str, int] = defaultdict(int)
    spec: dict[str, Placement] = {}
    for step_type, where in a.placements.items():
        if where.shape is None:
            continue
        steps[where.shape] += a.window.queued(step_type)
        spec.setdefault(where.shape, where)
    idle = a.options.pool_idle_timeout
    out: list[PoolDemand] = []
    for shape, where in spec.items():
        held = steps[shape] + sum(a.window.load(h) for h in a.hosts.pool_hosts(shape) or ())
        out.append(
            PoolDemand(
                shape,
                where.resources,
                where.credit,
                held,
                where.min_hosts,
                where.max_hosts,
                None if idle is None else idle.total_seconds(),
                waiting=steps[shape],
            )
        )
    return out


async def sync(a: Activation) -> None:
    """Tells the pools' owner the job's demand and learns the placed hosts; again in
    SYNC_SECONDS while the job holds steps of a pool."""
    said = demands(a)
    if not said:
        return
    await a.hosts.sync_pools(a.job_id, said)
    if any(d.steps for d in said):
        soon = any(
            d.waiting and (not a.hosts.pool_hosts(d.shape) or a.hosts.pool_growing(d.shape))
            for d in said
        )
        a.timers.arm("pools", SYNC_SOON_SECONDS if soon else SYNC_SECONDS)
