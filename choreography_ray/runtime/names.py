"""Actor names, and the options every choreography actor is created with."""

from __future__ import annotations

from typing import Any

DEFAULT_NAMESPACE = "choreography"
RECOVERY = "recovery"
#: The pools' owner (`runtime/pool_owner.py`), one per Ray namespace.
POOLS = "pools"
#: The limiter of every limit of the cluster (`runtime/limits.py`), one per Ray namespace.
LIMITER = "limiter"


def manager_name(scope: str, namespace: str) -> str:
    return f"jobs-manager/{scope}/{namespace}"


def scheduler_name(scope: str) -> str:
    return f"scheduler/{scope}"


def job_name(job_id: str) -> str:
    return f"job/{job_id}"


def step_host_name(node_id: str, index: int) -> str:
    return f"step-host/{node_id}/{index}"


def pool_prefix(shape: str = "") -> str:
    """The names of a pool's hosts start with it (of every pool's, without `shape`)."""
    return f"pool/{shape}/" if shape else "pool/"


def step_actor_name(job_id: str, step_id: str) -> str:
    return f"step/{job_id}/{step_id}"


def memory_storage_name(url: str) -> str:
    return f"storage/{url}"


def actor_options(name: str, namespace: str, **extra: Any) -> dict[str, Any]:
    """Named, detached, get-if-exists and restarted forever. Our actors are async and mostly
    wait on I/O, so they reserve no CPU: they never keep a user's tasks from being scheduled."""
    return {
        "name": name,
        "namespace": namespace,
        "lifetime": "detached",
        "get_if_exists": True,
        "max_restarts": -1,
        "max_task_retries": 0,
        "num_cpus": 0,
        "max_concurrency": 10_000,
        **extra,
    }
