"""Where a step type's steps run, read from its class attributes and checked once per type: the
shared hosts, an actor each (`dedicated`), or a pool of hosts of the type's resource shape; and
how many hosts of a shape a node fits. No Ray here: the job and the step host both read it."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from choreography_ray.step import JobStep

#: The `resources` keys Ray's actor options name otherwise, with the node resource they take.
RAY_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
#: The smallest amount of a resource Ray tells apart from 0.
SMALLEST = 0.0001


#: A pool's host holds this many rounds of its type's work for each job (`Placement.credit`):
#: enough that it never idles while the job refills it (a round trip of outcome write, report,
#: start and RUNNING write, tens of milliseconds) even when a round takes a few milliseconds.
ROUNDS_PER_HOST = 8
#: ... and at least this many steps, so short unbatched steps do not wait for the refill.
MIN_CREDIT = 32


class Placement(NamedTuple):
    """`shape` names the pool (None: the shared hosts); `resources` are what one of its hosts
    reserves, sorted, as `JobStep.resources` says them, without zero amounts. `credit` is how
    many steps of one job a pool's host holds at once (running or queued there); `min_hosts`
    and `max_hosts` bound the pool's hosts (`JobStep.min_hosts`, `JobStep.max_hosts`)."""

    dedicated: bool = False
    shape: str | None = None
    resources: tuple[tuple[str, float], ...] = ()
    credit: int = 0
    min_hosts: int = 0
    max_hosts: int | None = None


SHARED = Placement()


def placement_of(step_type: type[Any]) -> Placement:
    """The placement of a step type; `TypeError` naming the attribute when one is wrong."""
    if not (isinstance(step_type, type) and issubclass(step_type, JobStep)) or (
        step_type is JobStep
    ):
        raise TypeError(f"{getattr(step_type, '__qualname__', step_type)} is not a JobStep")
    check_lane(step_type)
    resources = step_type.resources
    if resources is None:
        return Placement(dedicated=bool(step_type.dedicated))
    name = step_type.__qualname__
    if step_type.dedicated:
        raise TypeError(f"{name}: set `resources` (a pool) or `dedicated`, not both")
    if not isinstance(resources, Mapping):
        raise TypeError(f"{name}.resources must be a dict of resource name -> amount")
    shape: list[tuple[str, float]] = []
    for key, amount in sorted(resources.items()):
        if not isinstance(key, str) or not key or any(c in key for c in "/=,"):
            raise TypeError(f"{name}.resources: {key!r} is not a resource name")
        if key in ("CPU", "GPU"):
            raise TypeError(f"{name}.resources: say num_cpus, num_gpus or memory, not {key!r}")
        if not _number(amount) or not (amount == 0 or amount >= SMALLEST):
            raise TypeError(
                f"{name}.resources[{key!r}] must be 0 or a number >= {SMALLEST:g}, not {amount!r}"
            )
        if amount != int(amount) and (amount > 1 or key == "memory"):
            # Ray's own rule: a GPU (or any resource whose units are devices) is shared only in
            # fractions of one; memory is bytes.
            raise TypeError(
                f"{name}.resources[{key!r}] = {amount!r}: Ray takes a whole number "
                + ("of bytes" if key == "memory" else "above 1 (a fraction only below 1)")
            )
        if amount:  # a zero amount asks for nothing: {"num_gpus": 1, "num_cpus": 0} is one shape
            shape.append((key, float(amount)))
    min_hosts, max_hosts = _host_bounds(step_type)
    per_round = step_type.concurrency * (step_type.batch_size if is_batched(step_type) else 1)
    credit = max(MIN_CREDIT, ROUNDS_PER_HOST * per_round)
    return Placement(
        shape=shape_name(tuple(shape)),
        resources=tuple(shape),
        credit=credit,
        min_hosts=min_hosts,
        max_hosts=max_hosts,
    )


def _host_bounds(step_type: type[JobStep[Any]]) -> tuple[int, int | None]:
    name = step_type.__qualname__
    low, high = step_type.min_hosts, step_type.max_hosts
    if isinstance(low, bool) or not isinstance(low, int) or low < 0:
        raise TypeError(f"{name}.min_hosts must be an int >= 0, not {low!r}")
    if high is not None and (isinstance(high, bool) or not isinstance(high, int) or high < 1):
        raise TypeError(f"{name}.max_hosts must be None or an int >= 1, not {high!r}")
    if high is not None and low > high:
        raise TypeError(f"{name}.min_hosts ({low}) is above max_hosts ({high})")
    return low, high


def check_lane(step_type: type[JobStep[Any]]) -> None:
    """The host-side attributes: concurrency, batches, limits."""
    name = step_type.__qualname__
    for attribute, low in (("concurrency", 1), ("batch_size", 1)):
        value = getattr(step_type, attribute)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TypeError(f"{name}.{attribute} must be an int >= {low}, not {value!r}")
    if not _number(step_type.batch_wait) or step_type.batch_wait < 0:
        raise TypeError(f"{name}.batch_wait must be seconds >= 0, not {step_type.batch_wait!r}")
    limit = step_type.max_concurrent
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TypeError(f"{name}.max_concurrent must be None or an int >= 1, not {limit!r}")
    rate = step_type.max_per_second
    if rate is not None and (not _number(rate) or not rate > 0):
        raise TypeError(f"{name}.max_per_second must be None or a number > 0, not {rate!r}")
    per_key = step_type.max_concurrent_per_key
    if per_key is not None and (
        isinstance(per_key, bool) or not isinstance(per_key, int) or per_key < 1
    ):
        raise TypeError(
            f"{name}.max_concurrent_per_key must be None or an int >= 1, not {per_key!r}"
        )
    names = step_type.limits
    if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{name}.limits must be a tuple of limit names, not {names!r}")


def check_limits(step_type: type[JobStep[Any]], configured: Collection[str]) -> None:
    """`TypeError` when the type names a limit the options do not configure
    (`JobsOptions.limits`): its steps would wait for a permit nobody can grant."""
    missing = [name for name in step_type.limits if name not in configured]
    if missing:
        raise TypeError(
            f"{step_type.__qualname__}.limits names {', '.join(map(repr, missing))}, which "
            "JobsOptions.limits does not configure"
        )


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def is_limited(step_type: type[JobStep[Any]]) -> bool:
    """Whether the type's steps take permits of a cluster-wide limit (`core.limits`)."""
    return (
        step_type.max_concurrent is not None
        or step_type.max_per_second is not None
        or step_type.max_concurrent_per_key is not None
        or bool(step_type.limits)
    )


def uses_lane(step_type: type[JobStep[Any]]) -> bool:
    """Whether a host runs the type through one instance of it (`runtime.lanes.Lane`): a pool's
    type, a limited one, or one that sets itself up or performs batches."""
    shaped = step_type.resources is not None
    return (
        shaped or is_limited(step_type) or is_batched(step_type) or _overrides(step_type, "setup")
    )


def is_batched(step_type: type[JobStep[Any]]) -> bool:
    return _overrides(step_type, "perform_batch")


def _overrides(step_type: type[JobStep[Any]], method: str) -> bool:
    return getattr(step_type, method) is not getattr(JobStep, method)


def shape_name(resources: tuple[tuple[str, float], ...]) -> str:
    """`num_gpus=1`, `accelerator_type:A10G=0.001,num_cpus=2`; `none` for no resource at all."""
    return ",".join(f"{key}={amount:.15g}" for key, amount in resources) or "none"


def pool_host_name(shape: str, node_id: str, index: int) -> str:
    """`pool/{shape}/{node_id}/{index}`: a pool's host (its owner names it, without Ray)."""
    return f"pool/{shape}/{node_id}/{index}"


def hosts_fit(resources: tuple[tuple[str, float], ...], node: Mapping[str, float]) -> int:
    """How many hosts of the shape the resources `node` has (Ray's names: CPU, GPU, memory,
    custom) hold: limited by each resource the shape needs. A custom resource counts for at
    most `node_cap` hosts, so a tiny amount used as a label (`{"accelerator_type:A10G":
    0.001}`) does not make hundreds of hosts; a shape that needs nothing gets one host per CPU."""
    fits = [
        min(fit, node_cap(node)) if key not in RAY_NAMES else fit
        for key, amount in resources
        if amount > 0
        for fit in [int(node.get(RAY_NAMES.get(key, key), 0.0) / amount + 1e-9)]
    ]
    return min(fits) if fits else node_cap(node)


def node_cap(node: Mapping[str, float]) -> int:
    """The most hosts of one shape a node of these resources gets where only custom resources
    or none bound them: its CPUs, or its GPUs when it has more."""
    return max(1, int(node.get("CPU", 0)), int(node.get("GPU", 0)))


def actor_resources(resources: tuple[tuple[str, float], ...]) -> dict[str, Any]:
    """Ray actor options reserving the shape: a host reserves no CPU unless the shape says so."""
    options: dict[str, Any] = {"num_cpus": 0}
    custom: dict[str, float] = {}
    for key, amount in resources:
        if key in RAY_NAMES:
            options[key] = amount
        else:
            custom[key] = amount
    if custom:
        options["resources"] = custom
    return options
