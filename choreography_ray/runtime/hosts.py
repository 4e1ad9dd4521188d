"""Step-host placement: `step-host/{node_id}/{n}` pinned to each alive node, one per CPU slot
by default (`JobsOptions.step_hosts_per_node`), and dedicated step actors."""

from __future__ import annotations

import contextlib
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from choreography_ray.options import JobsOptions
from choreography_ray.runtime.membership import alive_cpu_nodes
from choreography_ray.runtime.names import actor_options, step_actor_name, step_host_name
from choreography_ray.runtime.step_host import StepHost


class HostPool:
    def __init__(self, storage_url: str, options: JobsOptions, namespace: str) -> None:
        self.context = (storage_url, options.model_dump_json())
        self._args = (namespace, options.step_host_capacity)
        self._options = options
        self._namespace = namespace
        self.hosts: dict[str, Any] = {}
        self._names: list[str] = []
        self._turn = 0  # the rotation survives refreshes, so batches keep spreading over nodes

    def refresh(self) -> None:
        """Creates (or finds) the hosts of every alive node; forgets those of dead nodes."""
        hosts: dict[str, Any] = {}
        for node_id, cpus in alive_cpu_nodes().items():
            for index in range(self._options.step_hosts_per_node or cpus):
                name = step_host_name(node_id, index)
                hosts[name] = self.hosts.get(name) or StepHost.options(  # type: ignore[attr-defined]
                    **actor_options(
                        name,
                        self._namespace,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    )
                ).remote(*self._args)
        self.hosts = hosts
        self._names = list(hosts)

    def next(self) -> tuple[str, Any]:
        if not self._names:
            self.refresh()
        name = self._names[self._turn % len(self._names)]
        self._turn += 1
        return name, self.hosts[name]

    def dedicated(self, job_id: str, step_id: str, options: dict[str, Any]) -> tuple[str, Any]:
        name = step_actor_name(job_id, step_id)
        handle = StepHost.options(  # type: ignore[attr-defined]
            **actor_options(name, self._namespace, **options)
        ).remote(*self._args)
        return name, handle

    def kill_dedicated(self, job_id: str, step_id: str) -> None:
        with contextlib.suppress(ValueError):
            name = step_actor_name(job_id, step_id)
            ray.kill(ray.get_actor(name, namespace=self._namespace), no_restart=True)
