"""`choreography-ray limits`: every limit of a running cluster as its limiter counts it, and
`choreography-ray limits set NAME ...`, which changes a named limit live
(docs/pools.md#limits-across-the-cluster)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from choreography_ray.cli._cluster import joined, required_address
from choreography_ray.cli._common import console, fail
from choreography_ray.cli._options import JsonOption, RayNamespaceOption
from choreography_ray.limit import Limit, LimitState
from choreography_ray.runtime.names import DEFAULT_NAMESPACE

LimitsAddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The Ray cluster the limits hold in (host:port, ray://host:port, auto).",
        show_default="$RAY_ADDRESS; one of them is needed",
    ),
]

app = typer.Typer(
    name="limits",
    help="The limits of a running cluster (held, waiting, top keys); set a named one live.",
)


@app.callback(invoke_without_command=True)
def limits(
    ctx: typer.Context,
    address: LimitsAddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """List every limit the cluster's limiter counts: named limits, each step type's own
    (max_concurrent, max_per_second) and per key, with the permits held, the steps waiting for
    one, and the concurrency keys holding or waiting most."""
    if ctx.invoked_subcommand is not None:
        return
    from choreography_ray.runtime.limits import limit_states

    address = required_address(address, "limits asks the cluster's limiter")
    with joined(address, ray_namespace):
        found = limit_states(ray_namespace)
    if as_json:
        console.print_json(json.dumps([state.model_dump(mode="json") for state in found]))
    elif not found:
        console.print(f"no limit in Ray namespace {ray_namespace}", highlight=False)
    else:
        console.print(limits_table(found))


@app.command("set", short_help="Change a named limit on the running cluster.")
def set_limit(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The named limit.")],
    max_concurrent: Annotated[
        int | None, typer.Option(help="Steps running at once (0 holds new starts back).")
    ] = None,
    rate: Annotated[float | None, typer.Option(help="Starts per --per.")] = None,
    per: Annotated[float, typer.Option(help="Seconds the --rate is counted over.")] = 1.0,
    burst: Annotated[
        int | None, typer.Option(help="Starts at once at most.", show_default="--rate, >= 1")
    ] = None,
    address: LimitsAddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
) -> None:
    """Change a named limit on the running cluster, in effect within a second, kept over the
    limiter's restarts; it replaces the limit the options configure (an option left out bounds
    nothing)."""
    from choreography_ray.runtime.limits import set_limit as set_live

    try:
        limit = Limit(max_concurrent=max_concurrent, rate=rate, per=per, burst=burst)
    except ValidationError as error:
        fail(f"limit {name}: {'; '.join(e['msg'] for e in error.errors())}")
    address = required_address(address, "limits set asks the cluster's limiter")
    with joined(address, ray_namespace):
        set_live(ray_namespace, name, limit)
    console.print(f"limit {name}: {limit.describe()}", highlight=False)


def limits_table(found: Sequence[LimitState]) -> Table:
    table = Table(title="Limits")
    for column in ("name", "kind", "limit", "held", "waiting", "top keys"):
        table.add_column(column, justify="right" if column in ("held", "waiting") else "left")
    for state in found:
        keys = ", ".join(f"{k.key} {k.held}/{k.waiting}" for k in state.top_keys)
        limit = state.limit.describe() + (" (set live)" if state.live else "")
        table.add_row(state.name, state.kind, limit, str(state.held), str(state.waiting), keys)
    return table


def register(root: typer.Typer) -> None:
    root.add_typer(app)
