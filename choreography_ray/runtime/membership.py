"""Live nodes and live hosting actors, as Ray reports them."""

from __future__ import annotations

import ray


def alive_nodes() -> set[str]:
    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}  # type: ignore[no-untyped-call]


def alive_cpu_nodes() -> dict[str, int]:
    """Alive node ids with their CPU count (at least 1)."""
    return {
        node["NodeID"]: max(1, int(node.get("Resources", {}).get("CPU", 1)))
        for node in ray.nodes()  # type: ignore[no-untyped-call]
        if node.get("Alive")
    }


def actor_is_dead(actor_id: str) -> bool:
    """Whether Ray's state says the actor is dead for good (or unknown)."""
    from ray.util.state import get_actor

    try:
        info = get_actor(actor_id)
    except Exception:  # the state API is unavailable: do not declare anybody dead
        return False
    return info is None or info.state == "DEAD"
