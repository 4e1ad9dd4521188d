"""`choreography-ray pools`: the pools of step hosts in a running cluster, by resource shape
(docs/pools.md). `jobs show` prints the same table for a running job (`_render.pools_table`,
`_cluster.job_pools`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from choreography_ray.cli._cluster import joined, required_address
from choreography_ray.cli._common import console
from choreography_ray.cli._options import JsonOption, RayNamespaceOption
from choreography_ray.cli._render import pools_table
from choreography_ray.runtime.names import DEFAULT_NAMESPACE

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


def register(app: typer.Typer) -> None:
    app.command("pools")(pools)
