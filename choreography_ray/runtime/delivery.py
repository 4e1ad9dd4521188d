"""Outcome delivery from a step host to its job, with the spec's retry.

Deliveries to one job go in batches. A failed delivery waits `step_delivery_retry_delay`,
doubling up to `max_step_delivery_retry_delay`, for at most `step_delivery_max_attempts`
deliveries; then the outcome, already persisted, is left to the job's watchdog. A removal's stop
report has no attempt limit: it goes on until the job answers or no longer exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import ray

from choreography_ray.core.messages import Outcome, outcomes_to_wire
from choreography_ray.core.metrics import NO_METRICS, UNKNOWN, Counter, Labels, Metrics
from choreography_ray.core.retries import Backoff
from choreography_ray.logs import get_logger, ids
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.names import job_name

log = get_logger(__name__)

#: Job actor handles a host keeps: those of the jobs it delivered to most recently.
HANDLES_KEPT = 1024

#: Injected in tests to drop deliveries on purpose: returns True to drop a batch.
DropFilter = Callable[[str, Sequence[Outcome]], bool]


class Delivery:
    def __init__(
        self,
        options: JobsOptions,
        namespace: str,
        job_exists: Callable[[str], Awaitable[bool]],
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._options = options
        self._metrics = metrics
        self._namespace = namespace
        self._job_exists = job_exists
        self._handles: dict[str, Any] = {}
        self.drop: DropFilter | None = None

    async def deliver(
        self,
        job_id: str,
        outcomes: Sequence[Outcome],
        *,
        unlimited: bool = False,
        labels: Labels = UNKNOWN,
    ) -> bool:
        """Delivers until acknowledged; False when it gave up (or the job is gone). Each retry
        counts the batch's outcomes in `choreography_outcome_deliveries_retried`."""
        backoff = Backoff.of(
            self._options.step_delivery_retry_delay, self._options.max_step_delivery_retry_delay
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                if self.drop is not None and self.drop(job_id, outcomes):
                    raise ConnectionError("delivery dropped on purpose")
                handle = await self._handle(job_id)
                await handle.report_outcomes.remote(outcomes_to_wire(outcomes))
                return True
            except Exception as error:
                self._handles.pop(job_id, None)
                if not await self._job_exists(job_id):
                    return False
                if not unlimited and attempt >= self._options.step_delivery_max_attempts:
                    log.warning(
                        "gave up delivering %d outcomes to job %s after %d attempts (%s); "
                        "the watchdog settles them",
                        len(outcomes),
                        job_id,
                        attempt,
                        error,
                        extra=ids(job_id),
                    )
                    return False
            await asyncio.sleep(backoff.delay(attempt))
            self._metrics.count(Counter.OUTCOME_DELIVERIES_RETRIED, len(outcomes), labels)

    def know(self, job_id: str, handle: Any) -> None:
        """The job actor's handle, as its start brought it: no lookup by name."""
        self._handles.pop(job_id, None)
        self._keep(job_id, handle)

    async def _handle(self, job_id: str) -> Any:
        handle = self._handles.pop(job_id, None)
        if handle is None:  # looked up off the loop: the GCS call blocks
            name = job_name(job_id)
            handle = await asyncio.to_thread(ray.get_actor, name, namespace=self._namespace)
        self._keep(job_id, handle)
        return handle

    def _keep(self, job_id: str, handle: Any) -> None:
        # The most recently used jobs' handles, so the cache does not grow with every job.
        self._handles[job_id] = handle
        if len(self._handles) > HANDLES_KEPT:
            del self._handles[next(iter(self._handles))]
