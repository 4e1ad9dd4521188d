"""The job actor `job/{job_id}`: a thin Ray shell over `core.job.JobCore`.

It builds the core with its storage and the Ray hosts, feeds it the calls it gets, and exits
once its job is terminal, stopped for good or removed (its record stays, but for a removal).

Its metrics are relayed to its jobs manager (`runtime.metrics.RelayedMetrics`), every
`RELAY_SECONDS` and once more before it exits: Ray labels every series with the recording
process's `WorkerId`, and a job actor is a process of one job, so recording here would make
series per job, kept by the metrics agent after the process is gone.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import ray

from choreography_ray.core.job import JobCore
from choreography_ray.core.messages import OutcomeWire, outcomes_from_wire
from choreography_ray.core.metrics import NO_METRICS, Metrics
from choreography_ray.core.mode import Exit
from choreography_ray.core.retries import STANDARD
from choreography_ray.core.spares import SPARE_SECONDS
from choreography_ray.errors import StartJobError
from choreography_ray.logs import configure_actor, get_logger
from choreography_ray.model import JobState, PoolState
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.hosts import RayHosts
from choreography_ray.runtime.metrics import MetricsBatch, RelayedMetrics
from choreography_ray.runtime.names import manager_name
from choreography_ray.runtime.pools import list_pools
from choreography_ray.runtime.process import tune_gc
from choreography_ray.runtime.shared_storage import open_shared_storage

log = get_logger(__name__)

#: Seconds between an exit being asked for and the actor exiting: the call that finished the job
#: answers first, and an operation a caller waits on (a resume, a stop) runs before the exit.
EXIT_GRACE = 1.0
#: Seconds between two relays of the job's metrics to its manager.
RELAY_SECONDS = 1.0
#: Seconds the last relay may take before the actor exits without it.
LAST_RELAY_SECONDS = 5.0


@ray.remote
class JobActor:
    def __init__(
        self, job_id: str, storage_url: str, options_json: str, namespace: str, spare: bool = False
    ) -> None:
        configure_actor(job_id)  # this process serves one job: its records are that job's
        tune_gc()
        options = JobsOptions.model_validate_json(options_json)
        storage = open_shared_storage(storage_url, namespace)
        hosts = RayHosts(storage_url, options, namespace)
        hosts.reply_to = ray.get_runtime_context().current_actor
        self.hosts = hosts
        self.namespace = namespace
        self.relay: RelayedMetrics | None = None
        self._manager: Any = None
        metrics: Metrics = NO_METRICS
        if options.metrics:
            self.relay = RelayedMetrics(self._send_metrics)
            metrics = self.relay
        self.core = JobCore(
            job_id, storage, hosts, options, on_exit=self._exit_soon, metrics=metrics
        )
        if self.relay is not None:
            self.core.tasks.repeat(
                "metrics relay", lambda: asyncio.sleep(RELAY_SECONDS), self.relay.flush, STANDARD
            )
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        if spare and not reconstructed:
            # Created ahead of its job (`spare_job_actors`): it activates at its first call, or
            # after SPARE_SECONDS, when a spare nobody took finds no record and exits.
            asyncio.get_running_loop().call_later(SPARE_SECONDS, self.core.begin)
        else:
            self.core.begin(reconstructed)

    def _exit_soon(self) -> None:
        asyncio.get_running_loop().call_later(
            EXIT_GRACE, lambda: self.core.tasks.spawn("exit", self._exit())
        )

    async def _send_metrics(self, batch: MetricsBatch) -> None:
        """One relay to the job's manager, found by name once (the lookup runs off the loop)."""
        labels = self.core.labels
        if labels is None:
            raise RuntimeError("the job is not loaded: no manager to relay metrics to")
        if self._manager is None:
            name = manager_name(labels.scope, labels.namespace)
            self._manager = await asyncio.to_thread(ray.get_actor, name, namespace=self.namespace)
        try:
            await self._manager.record_metrics.remote(*batch)
        except Exception:
            self._manager = None  # found again on the next relay (the manager may have moved)
            raise

    async def _last_relay(self) -> None:
        if self.relay is None:
            return
        try:
            await asyncio.wait_for(self.relay.flush(), LAST_RELAY_SECONDS)
        except Exception as error:  # metrics never keep a job actor from exiting
            log.warning("job %s: the last metrics relay failed: %s", self.core.job_id, error)

    async def _exit(self) -> None:
        async with self.core.turns.turn("exit"):
            if self.core.exit is None:
                return  # the job was reopened meanwhile
            if self.core.exit is Exit.AT_REST:
                try:
                    await self.hosts.release_job(self.core.job_id)
                except Exception:
                    log.exception(
                        "job %s: releasing its dedicated step actors failed", self.core.job_id
                    )
            await self._last_relay()
            if self.core.caller_waiting:
                # An operation came meanwhile (a retry-failed, a resume, a stop): it runs and
                # answers, and the exit is asked for again (it may have reopened the job).
                self._exit_soon()
                return
            self.core.close()
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def start(self) -> StartJobError | None:
        return await self.core.start()

    async def report_outcomes(self, outcomes: bytes | list[OutcomeWire]) -> None:
        await self.core.report_outcomes(outcomes_from_wire(outcomes))

    async def stop(self) -> None:
        await self.core.stop()

    async def resume(self) -> None:
        await self.core.resume(explicit=True)

    async def recover(self) -> None:
        await self.core.recover()

    async def remove(self) -> None:
        await self.core.remove()

    async def retry_failed_steps(
        self, signature: str | None = None, step_ids: list[str] | None = None
    ) -> int:
        return await self.core.retry_failed_steps(signature, step_ids)

    async def state(self) -> JobState:
        return await self.core.ready()

    async def pools(self) -> list[PoolState]:
        """The pools this activation placed steps on, as their hosts answer now."""
        return await asyncio.to_thread(list_pools, self.namespace, self.hosts.pool_shapes())

    async def warm(self, job_types: list[str]) -> None:
        """A spare, ahead of its job: `JobCore.warm`."""
        await self.core.warm(job_types)

    async def watchdog_ticks(self) -> int:
        return self.core.ticks

    async def tick(self) -> None:
        """Runs one watchdog tick now (tests, and the recovery reconciliation)."""
        await self.core.watchdog_tick()

    async def active_steps(self) -> int:
        return self.core.window.in_flight()

    async def unsaved(self) -> bool:
        """Whether the job counted anything its record does not show yet (tests wait for it)."""
        return self.core.unsaved

    async def tasks(self) -> list[str]:
        """The names of the background tasks running now (the pump, saves, the watchdog...)."""
        return self.core.tasks.names()

    async def task_failures(self) -> dict[str, str]:
        """The background tasks that failed, by name, with their last error."""
        return dict(self.core.tasks.failures)
