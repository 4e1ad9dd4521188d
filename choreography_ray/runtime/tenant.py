"""What the steps of one (storage, options) see on a step host: its storage, group commit,
delivery, metrics and decisions, and the leases of its running steps, renewed by a timer in one
conditional bulk write (`Storage.renew_leases`) until each step's outcome is known. Hosts are
shared by every connection: a host keeps one tenant per (storage URL, options)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence

from choreography_ray.core.messages import StepStart
from choreography_ray.core.metrics import Histogram, Labels, WriteOperation
from choreography_ray.core.retries import Backoff
from choreography_ray.logs import get_logger, ids
from choreography_ray.model import Lease, StatusChange, utcnow
from choreography_ray.options import JobsOptions
from choreography_ray.outputs import OutputReader
from choreography_ray.runtime.delivery import Delivery
from choreography_ray.runtime.group_commit import GroupCommit
from choreography_ray.runtime.lanes import Spawn
from choreography_ray.runtime.metrics import metrics_for
from choreography_ray.runtime.shared_storage import open_shared_storage, shared_scheduler_storage
from choreography_ray.scheduler.deciding import JobDecisions
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import LeaseRenewal, StepUpdate, redact_url

log = get_logger(__name__)

#: Seconds between two tries to persist a batch of outcomes, or RUNNING again: 1 s, doubling up
#: to 30 s.
PERSIST_RETRY = Backoff(1.0, 30.0)


class Tenant:
    """What the steps of one (storage, options) see: hosts are shared by every connection.
    `silo` and `activation` are the host's node and incarnation (what a lease names), and
    `labels_of` a job's metric tags."""

    def __init__(
        self,
        storage_url: str,
        options_json: str,
        namespace: str,
        *,
        silo: str,
        activation: str,
        labels_of: Callable[[str], Labels],
        spawn: Spawn,
    ) -> None:
        self.options = JobsOptions.model_validate_json(options_json)
        self.storage = open_shared_storage(storage_url, namespace)
        self.metrics = metrics_for(self.options)
        self.commit = GroupCommit(
            self.storage, self.options.group_commit_delay.total_seconds(), self.metrics
        )
        #: `StepContext.decide` of this tenant's steps: each job's scheduler run, found once.
        self.decisions = JobDecisions(
            lambda: shared_scheduler_storage(self.storage),
            self.options.scheduler.replay_answers_for,
            asyncio.get_running_loop(),
        )
        #: `StepContext.outputs` of this tenant's steps.
        self.outputs = OutputReader(self.storage, asyncio.get_running_loop())
        self.delivery = Delivery(self.options, namespace, self.job_exists, self.metrics)
        #: The steps whose lease the host renews, (job_id, step_id) -> attempt. A step leaves
        #: as soon as its outcome is known, before the outcome is written.
        self.leased: dict[tuple[str, str], int] = {}
        self._silo = silo
        self._activation = activation
        self._labels_of = labels_of
        lease = self.options.lease_seconds
        if lease is not None:
            spawn(self.renew_leases(lease / 3), f"renew-leases {redact_url(storage_url)}", None)

    async def job_exists(self, job_id: str) -> bool:
        job = await self.storage.get_job(job_id)
        return (
            job is not None
            and not job.status.is_terminal
            and not (job.status is JobStatus.STOPPED and job.stop_finalized)
        )

    def lease(self) -> Lease | None:
        """A lease of this host, renewed now; None when the tenant's steps hold none."""
        if self.options.lease_seconds is None:
            return None
        return Lease(silo=self._silo, activation=self._activation, heartbeat=utcnow())

    def running_updates(self, job_id: str, steps: Sequence[StepStart]) -> list[StepUpdate]:
        """RUNNING (+ lease) of those of `steps` still running here without an outcome."""
        change = StatusChange(status=StepStatus.RUNNING)
        lease = self.lease()
        return [
            StepUpdate(job_id, s.step_id, StepStatus.RUNNING, s.attempt, lease, change)
            for s in steps
            if self.leased.get((job_id, s.step_id)) == s.attempt
        ]

    async def write_running(self, job_id: str, steps: Sequence[StepStart], labels: Labels) -> None:
        """Writes RUNNING again, with backoff, until it is stored or every step has an outcome
        (a later round then holds the outcome; RUNNING must not follow it)."""
        for tries in itertools.count(1):
            await asyncio.sleep(PERSIST_RETRY.delay(tries))
            updates = self.running_updates(job_id, steps)
            if not updates:
                return
            try:
                await self.commit.write(updates, labels=labels)
                return
            except Exception as error:
                log.warning("job %s: writing RUNNING of %d steps again failed: %s", job_id,
                            len(updates), error, extra=ids(job_id))  # fmt: skip

    async def renew_leases(self, every: float) -> None:
        """Every `every` s, renews the leases of this tenant's running steps in one conditional
        bulk write: a step whose outcome was stored meanwhile is left as it is. A failed write
        is logged, and the next tick tries again."""
        while True:
            await asyncio.sleep(every)
            lease = self.lease()
            if lease is None or not self.leased:
                continue
            renewals = [
                LeaseRenewal(job_id, step_id, attempt, lease)
                for (job_id, step_id), attempt in self.leased.items()
            ]
            began = time.perf_counter()
            try:
                await self.storage.renew_leases(renewals)
            except Exception as error:
                log.warning("could not renew %d leases (%s); retrying", len(renewals), error)
                continue
            if self.metrics.enabled:
                # Once per job type that had a lease in the round, never once per step.
                seconds = time.perf_counter() - began
                jobs = {renewal.job_id for renewal in renewals}
                for labels in {self._labels_of(job_id) for job_id in jobs}:
                    self.metrics.observe(
                        Histogram.STORAGE_WRITE_SECONDS,
                        seconds,
                        labels,
                        WriteOperation.RENEW_LEASES,
                    )
