"""Autoscaler demand in tests: what a `request_resources` call asked for, read back from the
cluster, and a cluster that really autoscales, for the slow tier.

`requested_bundles()` reads the request the way `ray.autoscaler.sdk.request_resources` stored
it (each call replaces the whole request): autoscaler v1 (the default, and a plain
`ray.init` or `ray.cluster_utils.Cluster` with no autoscaler at all) keeps it as JSON in the GCS
internal KV under `AUTOSCALER_RESOURCE_REQUEST_CHANNEL`; autoscaler v2 (`RAY_enable_autoscaler_v2`,
as KubeRay runs it) as the cluster resource constraint of the GCS's resource state, one entry
per distinct bundle with a count.

`autoscaling_cluster()` is Ray's own test set-up (`ray.cluster_utils.AutoscalingCluster`)
without its two faults here: it runs `ray stop --force` on start and stop, which would kill
every other Ray on the machine, and it reads a config (`fake_multi_node/example.yaml`) the
wheel does not ship (autoscaler v2 reads that file for the `fake_multinode` provider's
defaults too, so under v2 the same provider is named as an `external` module, whose defaults
are built in). A `ray start --head --block` of its own (its own temp dir and ports,
as `tests/heads.py`) runs the real autoscaler monitor with the fake multi-node provider,
which starts and stops real raylets on this machine as worker nodes. Every process of it is in
the process group of the `ray start` this starts (the worker raylets too: the monitor starts
them), so a signal to that group ends it all. docs/testing.md "Autoscaling" has its figures.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.heads import (
    _give_up,
    base_env,
    ray_command,
    started_head,
)
from tests.support import free_port

#: Seconds between two rounds of the autoscaler (Ray's default is 5).
AUTOSCALER_UPDATE_SECONDS = 1


def requested_bundles() -> list[dict[str, float]]:
    """The bundles of the cluster's current `request_resources` request, one dict per bundle
    (`[]` when none, or after `request_resources(bundles=[])`). Needs a connected driver."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        return constraint_bundles()
    from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    stored = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    bundles: list[dict[str, float]] = json.loads(stored) if stored else []
    return bundles


def constraint_bundles() -> list[dict[str, float]]:
    """The request as autoscaler v2 keeps it (the GCS's cluster resource constraint), one dict
    per bundle: `request_cluster_resources` groups equal bundles with a count."""
    from ray.autoscaler.v2.sdk import get_cluster_resource_state
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    state = get_cluster_resource_state(internal_kv_get_gcs_client())
    bundles: list[dict[str, float]] = []
    for constraint in state.cluster_resource_constraints:
        for request in constraint.resource_requests:
            bundle = dict(request.request.resources_bundle)
            bundles += [dict(bundle) for _ in range(request.count)]
    return bundles


def alive_gpus() -> float:
    """The GPUs of the alive nodes of the cluster this process joined."""
    import ray

    return float(sum(n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]))


@dataclass(frozen=True)
class AutoscalingHead:
    #: The GCS address, as `ray.init(address=...)` takes it.
    address: str
    #: The environment of a driver that joins this head (token authentication on).
    driver_env: dict[str, str]
    #: The autoscaler's own log (`monitor.log`): what it launched and terminated, and why.
    monitor_log: Path


#: The fake multi-node provider as an `external` module (see the module docstring).
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"


def fake_multinode_config(
    gcs_address: str,
    worker: Mapping[str, float],
    max_workers: int,
    idle_timeout_minutes: float,
    head_cpus: int,
    autoscaler_v2: bool,
) -> dict[str, Any]:
    """An autoscaler config for the fake multi-node provider: a head of `head_cpus` CPUs and
    no GPU, and one worker node type of `worker` resources, 0 to `max_workers` nodes."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    v2 = {"type": "external", "module": FAKE_PROVIDER, "launch_multiple": True,
          "head_node_id": FAKE_HEAD_NODE_ID}  # fmt: skip
    return {
        "cluster_name": "fake_multinode",
        "max_workers": max_workers,
        "provider": {
            "type": "fake_multinode",
            # The provider's worker raylets join the GCS here (its default is port 6379).
            "gcs_address": gcs_address,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            **(v2 if autoscaler_v2 else {}),
        },
        "available_node_types": {
            "ray.head.default": {
                "resources": {"CPU": head_cpus},
                "node_config": {},
                "max_workers": 0,
            },
            "ray.worker.gpu": {
                "resources": dict(worker),
                "node_config": {},
                "min_workers": 0,
                "max_workers": max_workers,
            },
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@contextlib.contextmanager
def autoscaling_cluster(
    max_workers: int = 2,
    worker: Mapping[str, float] | None = None,
    idle_timeout_minutes: float = 0.1,
    head_cpus: int = 1,
    autoscaler_v2: bool = False,
) -> Iterator[AutoscalingHead]:
    """A head without GPU whose real autoscaler (v1, or v2 as KubeRay runs it) adds worker
    nodes of `worker` resources (default one CPU and one GPU), 0 to `max_workers`, as demand
    asks, and removes a node idle for `idle_timeout_minutes`. A head that does not come up
    skips the test (fails it under `CI=true`)."""
    if shutil.which(ray_command("ray")) is None:
        _give_up("no `ray` command")
    temp_dir = tempfile.mkdtemp(prefix="cra-", dir="/tmp")  # short: Ray's sockets live under it
    gcs = free_port()
    config = Path(temp_dir) / "autoscaling.json"
    config.write_text(json.dumps(fake_multinode_config(
        f"127.0.0.1:{gcs}", worker or {"CPU": 1, "GPU": 1}, max_workers,
        idle_timeout_minutes, head_cpus, autoscaler_v2)))  # fmt: skip
    head_env = {
        **base_env(),
        "RAY_FAKE_CLUSTER": "1",  # the fake provider refuses to start without it
        "AUTOSCALER_UPDATE_INTERVAL_S": str(AUTOSCALER_UPDATE_SECONDS),
    }
    if autoscaler_v2:
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        # As `AutoscalingCluster` sets them: the head is the provider's known head node.
        head_env |= {"RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                     "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID}  # fmt: skip
    command = [
        ray_command("ray"), "start", "--head", "--block", "--temp-dir", temp_dir,
        "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--include-dashboard", "false",
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(free_port()),
        "--ray-client-server-port", str(free_port()),
        "--num-cpus", str(head_cpus), "--num-gpus", "0", "--disable-usage-stats",
        f"--autoscaling-config={config}",
    ]  # fmt: skip
    with started_head(command, head_env, temp_dir, gcs):
        yield AutoscalingHead(
            address=f"127.0.0.1:{gcs}",
            driver_env={**head_env, "RAY_AUTH_MODE": "token"},
            monitor_log=Path(temp_dir) / "session_latest" / "logs" / "monitor.log",
        )
