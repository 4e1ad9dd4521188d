"""A step host's outbox: the outcomes of its ended steps, persisted per job in one group commit
(a success deletes its record) and only then delivered to the job, in batches.

The outcomes that end in one turn of the event loop go out together: one task per job, whose
writes the group commit makes one bulk write. A write waits while the job's fence is up
(`runtime.fences`); a failed one is tried again with backoff, and an outcome that is not stored
is not reported. A step leaves the host's running steps once its outcome is stored, under the
host's condition, so a fence's answer sees both at once. A removed job's delivered steps delete
their own records.

No Ray here: the host gives the outbox its condition, fences, task runner and what it knows of
each job.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

from choreography_ray.core.messages import Outcome
from choreography_ray.core.metrics import Labels
from choreography_ray.logs import get_logger, ids
from choreography_ray.model import StatusChange
from choreography_ray.runtime.fences import Fences
from choreography_ray.runtime.lanes import Spawn
from choreography_ray.runtime.tenant import PERSIST_RETRY, Tenant
from choreography_ray.status import StepStatus
from choreography_ray.storage import StepUpdate, StoredOutput

log = get_logger(__name__)


class Outbox:
    """`tenant_of` and `labels_of` a job, whether it is `removing`, and `stored`: a step's
    outcome is stored (called under `room`)."""

    def __init__(
        self,
        room: asyncio.Condition,
        fences: Fences,
        spawn: Spawn,
        *,
        tenant_of: Callable[[str], Tenant],
        labels_of: Callable[[str], Labels],
        removing: Callable[[str], bool],
        stored: Callable[[tuple[str, str]], None],
    ) -> None:
        self._room = room
        self._fences = fences
        self._spawn = spawn
        self._tenant_of = tenant_of
        self._labels_of = labels_of
        self._removing = removing
        self._stored = stored
        self._outcomes: defaultdict[str, list[Outcome]] = defaultdict(list)
        self._scheduled = False

    def add(self, job_id: str, outcome: Outcome) -> None:
        self._outcomes[job_id].append(outcome)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        outbox, self._outcomes = self._outcomes, defaultdict(list)
        # One task per job; the group commit still makes their writes one bulk write.
        for job_id, outcomes in outbox.items():
            task = self._persist_and_deliver(self._tenant_of(job_id), job_id, outcomes)
            self._spawn(task, f"persist-and-deliver {job_id}", job_id)

    async def _persist_and_deliver(
        self, tenant: Tenant, job_id: str, outcomes: list[Outcome]
    ) -> None:
        updates: list[StepUpdate] = []
        deletes: list[tuple[str, str]] = []
        outputs: list[StoredOutput] = []
        for o in outcomes:
            if o.status is StepStatus.COMPLETED_SUCCESSFULLY:
                deletes.append((job_id, o.step_id))
                if o.output is not None:
                    stage, text = o.output
                    outputs.append(StoredOutput(job_id, o.step_id, stage, o.attempt, text))
            else:
                messages = () if o.message is None else (o.message,)
                change = StatusChange(status=o.status, exception_messages=messages)
                updates.append(
                    StepUpdate(job_id, o.step_id, o.status, o.attempt, None, change, o.signature)
                )
        labels = self._labels_of(job_id)
        tries = 0
        while True:
            await self._fences.begin_write(job_id)
            try:
                await tenant.commit.write(updates, deletes, labels, outputs)
            except Exception:
                # Persist, then deliver: an outcome that is not stored is not reported.
                async with self._room:
                    self._fences.written(job_id)
                tries += 1
                log.exception(
                    "job %s: could not persist %d outcomes; retrying",
                    job_id,
                    len(outcomes),
                    extra=ids(job_id),
                )
                await asyncio.sleep(PERSIST_RETRY.delay(tries))
                continue
            async with self._room:
                # Not running here once stored: a fence's answer sees both at once.
                for o in outcomes:
                    self._stored((job_id, o.step_id))
                self._fences.written(job_id)
            break
        await self._deliver(tenant, job_id, outcomes, labels)

    async def _deliver(
        self, tenant: Tenant, job_id: str, outcomes: list[Outcome], labels: Labels
    ) -> None:
        removing = self._removing(job_id)
        delivered = await tenant.delivery.deliver(
            job_id, outcomes, unlimited=removing, labels=labels
        )
        if removing and delivered:
            # The job has stored its stop: a removed step deletes its own record.
            deletes = [(job_id, o.step_id) for o in outcomes]
            await tenant.commit.write(deletes=deletes, labels=labels)
