"""The pools' owner's rules (no Ray): how many hosts each resource shape gets, on which nodes,
and what the cluster is asked to grow to. One owner decides for every shape and job of a Ray
namespace (`runtime/pool_owner.py`), so two shapes over the same GPUs never both count them.

Each job with steps of a pool tells the owner, about once a second, how many of them it holds
(queued for room or on the pool's hosts: `PoolDemand`). A shape *wants*
`ceil(steps / credit)` hosts, at least `min_hosts` while any job uses it and at most
`max_hosts`. Every tick the owner reads what Ray can place now (each alive node's available
resources, less what its own hosts created but not placed yet reserve) and creates the hosts
that are wanted and fit, one shape after another in turn, pinned to their node. A host Ray has
not placed gets no steps; one still unplaced after `PLACE_GRACE` (something else took what it
was created for) is killed. What is wanted and does not fit is the demand an autoscaler reads:
the owner asks for a bundle per wanted host of every shape (`request`), replacing the request as
a whole. A shape that waits while another shape has more hosts than it wants takes their place:
those hosts are asked to leave if idle.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from choreography_ray.core.placement import RAY_NAMES, hosts_fit, node_cap, pool_host_name

#: Seconds a job's demand counts without being said again (a job says it every second; one
#: whose actor died stops saying it).
DEMAND_SECONDS = 5.0
#: Seconds a host may stay unplaced before the owner kills it: Ray could not place it where it
#: was pinned (another actor took what the node had free when it was created).
PLACE_GRACE = 15.0
#: Seconds after a host is placed during which the node's available resources, as Ray reports
#: them, may not show it yet: its reservation is still taken off what is free.
RESOURCE_LAG = 2.0

Resources = tuple[tuple[str, float], ...]


class PoolDemand(NamedTuple):
    """What one job holds of one pool: `steps` waiting in the job for room or on its hosts,
    `waiting` of them in the job."""

    shape: str
    resources: Resources
    credit: int
    steps: int
    min_hosts: int = 0
    max_hosts: int | None = None
    #: Seconds a host of the pool may idle before it leaves (None: it stays).
    idle_timeout: float | None = None
    waiting: int = 0


class HostState(enum.StrEnum):
    CREATED = "Created"  #: created, not placed by Ray yet: gets no steps
    PLACED = "Placed"  #: alive on its node: takes steps
    #: Placed once, not alive now (restarting, or its node is gone): gets no steps; gone as
    #: soon as Ray no longer lists it (killed), killed if not back within PLACE_GRACE.
    RESTARTING = "Restarting"


@dataclass(slots=True)
class HostRow:
    name: str
    shape: str
    node: str
    resources: Resources
    state: HostState
    #: When it entered its state (seconds, the owner's clock).
    since: float


class Create(NamedTuple):
    name: str
    shape: str
    node: str
    resources: Resources
    idle_timeout: float | None


@dataclass(slots=True)
class Plan:
    """What a tick does: hosts to create, to kill (never placed), to ask to leave if idle."""

    create: list[Create] = field(default_factory=list)
    kill: list[str] = field(default_factory=list)
    reclaim: list[str] = field(default_factory=list)


@dataclass
class PoolRules:
    #: Per (shape, job), the job's latest demand and when it said it.
    demand: dict[tuple[str, str], tuple[PoolDemand, float]] = field(default_factory=dict)
    hosts: dict[str, HostRow] = field(default_factory=dict)
    #: The bundles last asked of the autoscaler.
    requested: list[dict[str, float]] = field(default_factory=list)
    #: Plans made: the shape that creates first turns with it.
    turn: int = 0
    #: Per shape, the wanted hosts the last plan could not create and would not have created
    #: were Ray's view up to date (nothing fits).
    blocked: Counter[str] = field(default_factory=Counter)

    # -- what jobs say ------------------------------------------------------------------------

    def say(
        self, job_id: str, demands: list[PoolDemand], now: float
    ) -> dict[str, tuple[list[str], int]]:
        """A job's demand per shape (a shape it no longer names is dropped); returns, for each
        shape it named, the placed hosts and how many more are on their way: created and not
        placed yet, or wanted and not tried yet (the next plan creates them where they fit;
        until then, the job gives the placed ones a round at a time)."""
        named = {d.shape for d in demands}
        for key in [k for k in self.demand if k[1] == job_id and k[0] not in named]:
            del self.demand[key]
        for d in demands:
            self.demand[(d.shape, job_id)] = (d, now)
        coming = self.untried(now)
        coming.update(r.shape for r in self.hosts.values() if r.state is not HostState.PLACED)
        return {shape: (self.placed(shape), coming[shape]) for shape in named}

    def untried(self, now: float) -> Counter[str]:
        """Per shape, the wanted hosts not created yet that the last plan did not find short
        of room: the next plan tries them."""
        have = Counter(row.shape for row in self.hosts.values())
        untried: Counter[str] = Counter()
        for shape, (want, _d) in self.wanted(now).items():
            untried[shape] = max(0, want - have[shape] - self.blocked[shape])
        return +untried

    def placed(self, shape: str | None = None) -> list[str]:
        return sorted(
            row.name
            for row in self.hosts.values()
            if row.state is HostState.PLACED and shape in (None, row.shape)
        )

    def unplaced(self) -> bool:
        """Whether a host created here is not placed yet."""
        return any(row.state is not HostState.PLACED for row in self.hosts.values())

    def waiting(self, now: float) -> Counter[str]:
        """Per shape, the steps waiting in the jobs for room on its hosts."""
        steps: Counter[str] = Counter()
        for (shape, _job), (d, _at) in self._current(now).items():
            steps[shape] += d.waiting
        return steps

    def _current(self, now: float) -> dict[tuple[str, str], tuple[PoolDemand, float]]:
        expired = [k for k, (_d, at) in self.demand.items() if now - at > DEMAND_SECONDS]
        for key in expired:
            del self.demand[key]
        return self.demand

    def wanted(self, now: float) -> dict[str, tuple[int, PoolDemand]]:
        """Per shape in use, the hosts it wants and one of its demands (its resources, and the
        bounds the most generous job asked for)."""
        steps: Counter[str] = Counter()
        spec: dict[str, PoolDemand] = {}
        for (shape, _job), (d, _at) in self._current(now).items():
            if not d.steps:
                # A job that holds none of the shape's steps (between stages, or done) asks for
                # no host, `min_hosts` included: its hosts leave once idle.
                continue
            steps[shape] += d.steps
            known = spec.get(shape)
            spec[shape] = d if known is None else _wider(known, d)
        out: dict[str, tuple[int, PoolDemand]] = {}
        for shape, d in spec.items():
            want = max(d.min_hosts, math.ceil(steps[shape] / max(d.credit, 1)))
            if d.max_hosts is not None:
                want = min(want, d.max_hosts)
            out[shape] = (want, d)
        return out

    # -- what Ray says ------------------------------------------------------------------------

    def seen(self, alive: Mapping[str, bool], now: float, listed_at: float | None = None) -> None:
        """The owner's hosts as Ray has them, listed from `listed_at` on (default `now`): name
        -> placed (alive) or not yet; a host not named is gone."""
        listed_at = now if listed_at is None else listed_at
        for row in [r for r in self.hosts.values() if r.name not in alive]:
            # Ray lists a named actor from its creation on (its name is taken as it is
            # created): one created before the listing began and not in it is gone (killed
            # before Ray placed it, or while restarting), and is made again at once if wanted.
            # Only one created since may not be in it yet.
            if row.state is not HostState.CREATED or row.since < listed_at:
                del self.hosts[row.name]
        for name, is_alive in alive.items():
            if name not in self.hosts:
                found = _row_of(name, now)
                if found is None:
                    continue  # not a name the owner makes
                self.hosts[name] = found
            row = self.hosts[name]
            if is_alive and row.state is not HostState.PLACED:
                row.state, row.since = HostState.PLACED, now
            elif not is_alive and row.state is HostState.PLACED:
                # Restarting, or its node is gone: no steps until it is back, and killed if it
                # is not back within PLACE_GRACE.
                row.state, row.since = HostState.RESTARTING, now

    def plan(
        self,
        total: Mapping[str, Mapping[str, float]],
        available: Mapping[str, Mapping[str, float]],
        now: float,
    ) -> Plan:
        """Given each alive node's total and available resources (Ray's names), what to do."""
        plan = Plan()
        self.turn += 1
        for row in list(self.hosts.values()):
            if row.state is not HostState.PLACED and now - row.since > PLACE_GRACE:
                plan.kill.append(row.name)
                del self.hosts[row.name]
        free = {node: dict(resources) for node, resources in available.items()}
        # As Ray shows it: a host placed within RESOURCE_LAG may be in it already. A host short
        # that fits there is not blocked: it is made once the lag has passed.
        shown = {node: dict(resources) for node, resources in available.items()}
        for row in self.hosts.values():
            if row.node not in free:
                continue
            if row.state is not HostState.PLACED:
                _take(shown[row.node], row.resources)
            if row.state is not HostState.PLACED or now - row.since < RESOURCE_LAG:
                _take(free[row.node], row.resources)
        wanted = self.wanted(now)
        have = Counter(row.shape for row in self.hosts.values())
        on_node = Counter((row.shape, row.node) for row in self.hosts.values())
        short = {shape: want - have[shape] for shape, (want, _d) in wanted.items()}
        # One host per shape in turn, from a shape that changes each tick, so shapes over the
        # same resources share what is free.
        order = sorted(short)
        order = order[self.turn % len(order) :] + order[: self.turn % len(order)] if order else []
        while True:
            made = False
            for shape in order:
                if short[shape] <= 0:
                    continue
                d = wanted[shape][1]
                node = _roomiest(d.resources, free, total, on_node, shape)
                if node is None:
                    continue
                name = self._name(shape, node, set(plan.kill))
                self.hosts[name] = HostRow(name, shape, node, d.resources, HostState.CREATED, now)
                plan.create.append(Create(name, shape, node, d.resources, d.idle_timeout))
                _take(free[node], d.resources)
                _take(shown[node], d.resources)
                on_node[(shape, node)] += 1
                short[shape] -= 1
                made = True
            if not made:
                break
        self.blocked = Counter(
            {
                shape: n
                for shape, n in short.items()
                if n > 0
                and _roomiest(wanted[shape][1].resources, shown, total, on_node, shape) is None
            }
        )
        waiting = [wanted[shape][1].resources for shape, n in short.items() if n > 0]
        if waiting:
            # A shape that waits takes the place of hosts another shape has beyond its wants,
            # on a node where it would fit once they are gone.
            surplus = {
                shape: have[shape] - wanted.get(shape, (0, None))[0]
                for shape in have
                if short.get(shape, 0) <= 0
            }
            for row in sorted(self.hosts.values(), key=lambda r: r.name):
                if (
                    row.state is HostState.PLACED
                    and surplus.get(row.shape, 0) > 0
                    and row.node in free
                    and _would_fit(waiting, free[row.node], row.resources)
                ):
                    plan.reclaim.append(row.name)
                    surplus[row.shape] -= 1
        return plan

    def request(self, now: float) -> list[dict[str, float]]:
        """The bundles the autoscaler is asked for: one per wanted host of every shape."""
        bundles: list[dict[str, float]] = []
        for _shape, (want, d) in sorted(self.wanted(now).items()):
            bundle = {RAY_NAMES.get(key, key): amount for key, amount in d.resources}
            if bundle:
                bundles.extend(dict(bundle) for _ in range(want))
        return bundles

    def _name(self, shape: str, node: str, killed: set[str]) -> str:
        """The first free name; a host killed in the same plan may still be there."""
        taken = {row.name for row in self.hosts.values()} | killed
        index = 0
        while pool_host_name(shape, node, index) in taken:
            index += 1
        return pool_host_name(shape, node, index)


def _wider(a: PoolDemand, b: PoolDemand) -> PoolDemand:
    """Two jobs' demands of one shape: the widest bounds, the smaller credit, and the shorter
    idle timeout (None: hosts stay)."""
    high = None if a.max_hosts is None or b.max_hosts is None else max(a.max_hosts, b.max_hosts)
    idle = [t for t in (a.idle_timeout, b.idle_timeout) if t is not None]
    return a._replace(
        min_hosts=max(a.min_hosts, b.min_hosts),
        max_hosts=high,
        credit=min(a.credit, b.credit),
        idle_timeout=min(idle, default=None),
    )


def _row_of(name: str, now: float) -> HostRow | None:
    """A host found by name (an earlier owner made it): its shape and node from the name;
    None for a name that is not `pool/{shape}/{node}/{n}`."""
    try:
        _, shape, node, _ = name.split("/")
        resources = (
            []
            if shape == "none"
            else [
                (key, float(amount))
                for key, _, amount in (p.partition("=") for p in shape.split(","))
            ]
        )
    except ValueError:
        return None
    return HostRow(name, shape, node, tuple(resources), HostState.CREATED, now)


def _take(free: dict[str, float], resources: Resources) -> None:
    for key, amount in resources:
        name = RAY_NAMES.get(key, key)
        free[name] = free.get(name, 0.0) - amount


def _would_fit(waiting: list[Resources], free: Mapping[str, float], freed: Resources) -> bool:
    """Whether a host of one of the `waiting` shapes fits in `free` once `freed` is given back."""
    after = dict(free)
    for key, amount in freed:
        name = RAY_NAMES.get(key, key)
        after[name] = after.get(name, 0.0) + amount
    return any(hosts_fit(resources, after) >= 1 for resources in waiting)


def _roomiest(
    resources: Resources,
    free: Mapping[str, Mapping[str, float]],
    total: Mapping[str, Mapping[str, float]],
    on_node: Counter[tuple[str, str]],
    shape: str,
) -> str | None:
    """The node where one more host of the shape fits and that has the fewest of them."""
    fits = [
        node
        for node, left in free.items()
        if node in total
        and hosts_fit(resources, left) >= 1
        and on_node[(shape, node)] < node_cap(total[node])
    ]
    return min(fits, key=lambda node: (on_node[(shape, node)], node), default=None)
