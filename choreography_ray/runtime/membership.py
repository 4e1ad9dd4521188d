"""Live nodes and live hosting actors, as Ray reports them.

Every function here is a blocking call to Ray's GCS (or, for `actor_is_dead`, to the state API
of the dashboard): an async actor calls them through `asyncio.to_thread`, never on its event
loop.
"""

from __future__ import annotations

import ray


def node_table() -> dict[str, bool]:
    """Every node Ray knows, alive or dead, by id: whether it is alive. Ray keeps dead nodes in
    its table (up to `maximum_gcs_dead_node_cached_count`), so a death can be seen after it."""
    return {node["NodeID"]: bool(node.get("Alive")) for node in ray.nodes()}  # type: ignore[no-untyped-call]


def alive_nodes() -> set[str]:
    return {node_id for node_id, alive in node_table().items() if alive}


def alive_node_resources() -> dict[str, dict[str, float]]:
    """Alive node ids with their total resources (Ray's names: CPU, GPU, memory, custom)."""
    return {
        node["NodeID"]: dict(node.get("Resources", {}))
        for node in ray.nodes()  # type: ignore[no-untyped-call]
        if node.get("Alive")
    }


def actor_exists(name: str, namespace: str) -> bool:
    """Whether a named actor is registered (alive, or restarting) in `namespace`."""
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def named_actors(namespace: str) -> set[str]:
    """The names of the actors registered (alive, or restarting) in `namespace`: one call, where
    `actor_exists` is one per name."""
    listed = ray.util.list_named_actors(all_namespaces=True)
    return {actor["name"] for actor in listed if actor["namespace"] == namespace}


def actor_is_dead(actor_id: str) -> bool:
    """Whether Ray's state says the actor is dead for good (or unknown)."""
    from ray.util.state import get_actor

    try:
        info = get_actor(actor_id)
    except Exception:  # the state API is unavailable: do not declare anybody dead
        return False
    return info is None or info.state == "DEAD"
