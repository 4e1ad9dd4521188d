"""Start's first turn: the request is validated, `prepare_steps` is read and stored a piece at a
time (ids as wide as the plan's known length), per-stage totals counted, checkpointed stages
skipped; the record says `has_plan` only once every piece is stored. A plan that fails while it
is written leaves no step behind.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

from choreography_ray.core import job_record, stage_flow
from choreography_ray.core.mode import OPERATIONS, Act, Mode, Op
from choreography_ray.core.planning import (
    PLAN_WRITE,
    Feed,
    PlanError,
    PlanReader,
    id_width,
    plan_records,
    plan_source,
)
from choreography_ray.core.stages import Stages
from choreography_ray.errors import StartJobError
from choreography_ray.logs import get_logger
from choreography_ray.model import ResumeAfter
from choreography_ray.status import JobStatus
from choreography_ray.storage import PlannedStep

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)

#: The epoch of a job's first activation: the version its first save of the record (created at
#: version 1) writes. Every activation takes its epoch before it writes a plan.
FIRST_EPOCH = 2
#: Plan pieces being written at once: one in the storage's hands, the next waiting behind it.
WRITES_IN_FLIGHT = 2


async def prepare(a: Activation) -> StartJobError | None:
    state = a.job_state
    refused = OPERATIONS[Op.START][a.mode] is not Act.RUN
    if refused or state.status is not JobStatus.PREPARING_JOB or state.has_plan:
        return StartJobError.JOB_ALREADY_EXISTS
    job = a.loaded_job
    a.enter(Mode.PREPARING)
    try:
        request = job.request_type().model_validate(state.request)
        source = await plan_source(job.prepare_steps(request))
    except Exception as error:
        await stage_flow.fail(a, error)
        return StartJobError.COULD_NOT_PREPARE_STEPS
    try:
        await persist_plan(a, source)
    except PlanError as error:  # the plan's own code, while it was read
        await fail_preparing(a, error.__cause__ or error)
        return StartJobError.COULD_NOT_PREPARE_STEPS
    except Exception as error:
        log.exception("job %s: could not persist its plan", a.job_id)
        await fail_preparing(a, error)
        return StartJobError.COULD_NOT_PERSIST
    return None


async def fail_preparing(a: Activation, error: BaseException) -> None:
    """The job fails before its plan is stored: a partial plan's records go first."""
    await clear_partial_plan(a)
    await stage_flow.fail(a, error)


async def clear_partial_plan(a: Activation) -> None:
    try:
        await a.storage.remove_job_steps(a.job_id)
    except Exception as error:  # a job without a plan never runs them; retention clears
        log.warning("job %s: removing its partial plan failed: %s", a.job_id, error)


async def persist_plan(a: Activation, source: Iterable[Any] | AsyncIterable[Any]) -> None:
    """Reads, checks and writes the plan a chunk at a time, counting per-stage totals; the
    job record says `has_plan` only once every chunk is stored. Errors of the plan's own
    code are `PlanError`s."""
    # An earlier activation's plan, never finished (no has_plan): its records go first. The
    # first activation of a job (the record's first save after its creation, at version 1,
    # was its epoch) has none to look for.
    if a.epoch > FIRST_EPOCH and await a.storage.list_starts(a.job_id, limit=1):
        await a.storage.remove_job_steps(a.job_id)
    size = a.options.plan_chunk_size
    piece = min(PLAN_WRITE, size)
    reader = PlanReader(source)
    read = await reader.read(size)
    # One step past the first chunk says whether the plan ends within it, and so how wide
    # its step ids are when its length is not known.
    read += await reader.read(1)
    width = id_width(source, min(len(read), size), len(read) > size)
    totals: dict[int, int] = {}
    # The first run keeps the first two chunks' records (the second was begun to size the
    # ids): a plan of up to two chunks is never read back.
    kept: list[PlannedStep] = []
    offset = 0
    writes: deque[asyncio.Task[None]] = deque()
    try:
        # Written a piece at a time, each while the next is read and built (SQLite writes it
        # without holding the GIL), in order. Two writes at most are in flight: the second
        # waits in the storage's queue and begins as the first ends. After the first chunk the
        # plan is read a piece at a time too. Only the last pieces' writes are left when the
        # plan ends.
        while True:
            if len(read) < piece:  # the steps read ahead are less than a piece: read on
                read += await reader.read(piece - len(read))
            if not read:
                break
            records = plan_records(read[:piece], offset, width)
            del read[:piece]  # let them go as they are written
            while len(writes) >= WRITES_IN_FLIGHT:
                await writes.popleft()
            writes.append(
                asyncio.get_running_loop().create_task(
                    a.storage.insert_plan(a.job_id, records),
                    name=f"insert plan of job {a.job_id} at step {offset}",
                )
            )
            # The write begins now (reading a plan that is not async never yields).
            await asyncio.sleep(0)
            for record in records:
                totals[record.stage] = totals.get(record.stage, 0) + 1
            kept += records[: max(0, 2 * size - offset)]
            offset += len(records)
            del records
        while writes:
            await writes.popleft()
    except BaseException:
        if writes:
            # The writes land (or fail) before the job clears its partial plan; the error
            # raised here is the one to report, not a write's.
            await asyncio.wait(writes)
            for write in writes:
                if not write.cancelled():
                    write.exception()
        raise
    stages = Stages.from_totals(totals)
    resume = a.job_state.resume_after
    if resume is not None:
        resume = await skip_checkpointed(a, stages, resume)
    stage = stages.first()
    # The record says has_plan with the plan's totals (the progress a save writes is the
    # stages'); when the save fails, the activation keeps the stages it had.
    before, a.stages = a.stages, stages
    try:
        await job_record.set_status(
            a, JobStatus.PREPARING_STEPS, has_plan=True, stage=stage, resume_after=resume
        )
    except BaseException:
        a.stages = before
        raise
    # A plan that ended within the kept chunks is whole in memory: nothing to read.
    a.feed = Feed.first_run(stage, kept, done=offset == len(kept))


async def skip_checkpointed(
    a: Activation, stages: Stages, resume: ResumeAfter
) -> ResumeAfter | None:
    """A start after a checkpoint: the checkpointed stages' steps are counted as succeeded
    and their records (written with the plan) deleted again, so they never run. The resume
    as kept (its `stage` the last one skipped), or None when the layout changed and the
    job runs from the top."""
    skipped = stages.skip_through(resume)
    if not skipped:
        log.warning("job %s runs from the top: its plan's stage layout is not the one of run "
                    "%s's checkpoint", a.job_id, resume.source)  # fmt: skip
        return None
    for stage in skipped:
        while page := await a.storage.list_starts(a.job_id, stage=stage, limit=a.page):
            await a.storage.delete_steps(a.job_id, [row.step_id for row in page])
    log.info("job %s resumes after stage %d of run %s: stage(s) %s are not run again",
             a.job_id, skipped[-1], resume.source, skipped)  # fmt: skip
    return resume.model_copy(update={"stage": skipped[-1]})
