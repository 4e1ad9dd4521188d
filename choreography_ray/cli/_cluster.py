"""Joining the Ray cluster, and finding the running actors the acting commands (and the pools
readings) go through.

`ray.init` on an address nobody answers at retries for minutes, so an explicit `host:port` (or
`ray://host:port`) address is tried with a plain TCP connection first: an unreachable cluster
is one line and exit 4 within `CONNECT_SECONDS`.

The acting commands use the jobs manager (or scheduler) that runs in the cluster; they never
create one: a manager keeps the storage and options of the connection that created it, and
this command knows neither the application's options nor whether it should run there. They
refuse a manager that runs on another storage than `--storage`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from choreography_ray.cli._command import actor_log_env
from choreography_ray.cli._common import ExitCode, fail, flags, log
from choreography_ray.client import AsyncJobsManager
from choreography_ray.model import PoolState
from choreography_ray.runtime.names import job_name, manager_name
from choreography_ray.storage import redact_url

#: How long an explicit address may take to accept a TCP connection, in seconds.
CONNECT_SECONDS = 5.0
#: Seconds a job actor has to say which pools it uses.
ANSWER_SECONDS = 10.0


def required_address(address: str | None, what: str) -> str:
    """`address`, else `$RAY_ADDRESS`; exits 2 when neither is given."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        fail(f"{what}: give --address (or set $RAY_ADDRESS) of the Ray cluster it runs in")
    return address


def host_port(address: str) -> tuple[str, int] | None:
    """The (host, port) of a `host:port` or `ray://host:port` address; None for the forms
    `ray.init` resolves itself (`auto`, `local`, ...)."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in rest:
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str) -> None:
    """Exits 4 when an explicit address accepts no TCP connection within `CONNECT_SECONDS`."""
    target = host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=CONNECT_SECONDS).close()
    except OSError as error:
        fail(f"cannot reach the Ray cluster at {address}: {error}; check --address (or "
             "$RAY_ADDRESS) and that the cluster runs", ExitCode.UNAVAILABLE)  # fmt: skip


def init_ray(address: str | None, ray_namespace: str) -> None:
    """`ray.init` at `address` (None: `$RAY_ADDRESS`, a running local cluster, else a new
    one), quiet unless `-v`; with `--log-json` the actors' output is not forwarded, so stderr
    holds JSON lines only (the actors log to their own files)."""
    import ray

    target = address or os.environ.get("RAY_ADDRESS")
    if target:
        check_reachable(target)
    env = actor_log_env()
    options: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
    log.info("joining Ray at %s (namespace %s)", target or "a local cluster", ray_namespace)
    try:
        ray.init(
            address=address,
            namespace=ray_namespace,
            logging_level=logging.INFO if flags.verbosity >= 2 else logging.WARNING,
            log_to_driver=not flags.log_json,
            **options,
        )
    except (ConnectionError, RuntimeError, ValueError) as error:
        fail(f"cannot join the Ray cluster at {target or 'a local cluster'}: {error}",
             ExitCode.UNAVAILABLE)  # fmt: skip


@contextmanager
def joined(address: str, ray_namespace: str) -> Iterator[None]:
    """In the cluster at `address` for the block's time."""
    import ray

    init_ray(address, ray_namespace)
    try:
        yield
    finally:
        ray.shutdown()


class NoManagerError(Exception):
    """No jobs manager of that (scope, namespace) runs in the cluster."""


async def running_manager(
    scope: str, namespace: str, ray_namespace: str, storage_url: str
) -> AsyncJobsManager:
    """The client of the jobs manager that runs for (scope, namespace); `NoManagerError` when
    none runs; exits 2 when it runs on another storage than `storage_url`."""
    import ray

    name = manager_name(scope, namespace)
    try:
        handle = ray.get_actor(name, namespace=ray_namespace)
    except ValueError:
        raise NoManagerError(
            f"no jobs manager {name} runs in this cluster (Ray namespace {ray_namespace}): "
            "it runs once an application (or `choreography-ray run`) connects with "
            f"jobs.manager({scope!r}, {namespace!r})"
        ) from None
    manager = AsyncJobsManager(handle, scope, namespace)
    running: dict[str, str] = await manager._call("config")
    if running["storage"] != storage_url:
        fail(f"the jobs manager {name} runs on {redact_url(running['storage'])}, not on "
             f"{redact_url(storage_url)}: give its --storage")  # fmt: skip
    return manager


def job_pools(job_id: str, address: str, ray_namespace: str) -> list[PoolState] | None:
    """The pools a running job's activation placed steps on; None when its actor is gone."""
    import ray

    with joined(address, ray_namespace):
        try:
            actor = ray.get_actor(job_name(job_id), namespace=ray_namespace)
            found: list[PoolState] = ray.get(actor.pools.remote(), timeout=ANSWER_SECONDS)
        except (ValueError, ray.exceptions.RayError):
            return None
    return found
