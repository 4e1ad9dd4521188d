"""`choreography-ray pools`: the pools of step hosts in a running cluster, by resource shape
(docs/pools.md); and the pools table `jobs show` prints for a running job."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.table import Table

from choreography_ray.cli._cluster import joined, required_address
from choreography_ray.cli._common import JsonOption, console
from choreography_ray.cli.jobs.acting import RayNamespaceOption
from choreography_ray.model import PoolState
from choreography_ray.runtime.names import DEFAULT_NAMESPACE

#: Seconds a job actor has to say which pools it uses.
ANSWER_SECONDS = 10.0


PoolsAddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The Ray cluster the pools run in (host:port, ray://host:port, auto).",
        show_default="$RAY_ADDRESS; one of them is needed",
    ),
]


def pools(
    address: PoolsAddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """List the pools of step hosts (one per resource shape of a step type): hosts, hosts
    pending (waiting for resources), steps busy in a perform or batch, steps queued on the hosts,
    steps waiting in their jobs for room on the pool (the demand),
    and the nodes they run on."""
    from choreography_ray.runtime.pools import list_pools

    address = required_address(address, "pools asks the pools' hosts")
    with joined(address, ray_namespace):
        found = list_pools(ray_namespace)
    if as_json:
        console.print_json(json.dumps([pool.model_dump(mode="json") for pool in found]))
    elif not found:
        console.print(f"no pool in Ray namespace {ray_namespace}", highlight=False)
    else:
        console.print(pools_table(found))


def pools_table(found: Sequence[PoolState]) -> Table:
    table = Table(title="Pools")
    for column in ("shape", "hosts", "pending", "busy", "queued", "waiting", "nodes"):
        table.add_column(column, justify="left" if column in ("shape", "nodes") else "right")
    for pool in found:
        nodes = ", ".join(node[:8] for node in pool.nodes)
        counts = (pool.hosts, pool.pending, pool.busy, pool.queued, pool.waiting)
        table.add_row(pool.shape, *map(str, counts), nodes)
    return table


def job_pools(job_id: str, address: str, ray_namespace: str) -> list[PoolState] | None:
    """The pools a running job's activation placed steps on; None when its actor is gone."""
    import ray

    from choreography_ray.runtime.names import job_name

    with joined(address, ray_namespace):
        try:
            actor = ray.get_actor(job_name(job_id), namespace=ray_namespace)
            found: list[PoolState] = ray.get(actor.pools.remote(), timeout=ANSWER_SECONDS)
        except (ValueError, ray.exceptions.RayError):
            return None
    return found


def register(app: typer.Typer) -> None:
    app.command("pools")(pools)
