"""The job's record, written in one place: loading it (and its job type), status changes
checked against the status table, saves with the current progress (counted records first), the
read-back of a save whose answer was lost, and the watchdog's reconciliation of such saves.

A save changes the activation's state only once storage took it. A save that failed without an
answer may have been written: the next one that meets a version moved on by no more than the
activation's own unanswered saves writes over them, and the watchdog carries out a stop or
removal storage holds though its caller got an error.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from choreography_ray.core import stop_flow, stopping
from choreography_ray.core.metrics import Labels, TimedWrites
from choreography_ray.core.mode import Mode
from choreography_ray.core.stages import Stages
from choreography_ray.core.transitions import check_transition
from choreography_ray.errors import ChoreographyError, ConcurrencyError
from choreography_ray.job import Job
from choreography_ray.logs import get_logger
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.types import import_type

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


async def load(a: Activation) -> None:
    """Reads the record and loads its job type (imported by path, within the allowed
    prefixes); a type that cannot be loaded fails the job, and the activation."""
    a.state = await a.storage.get_job(a.job_id)
    if a.state is None:
        return
    resumed = a.state.resume_after
    skipped_through = None if resumed is None else resumed.stage
    a.stages = Stages.from_progress(a.state.progress, skipped_through)
    try:
        job_type = import_type(a.state.type, a.options.allowed_type_prefixes)
        if not issubclass(job_type, Job):  # checked before anything from storage is built
            raise TypeError(f"{a.state.type} is not a choreography_ray.Job")
        job = job_type()
    except Exception as error:
        message = f"cannot load job type {a.state.type!r}: {error}"
        log.error("job %s: %s", a.job_id, message)
        if not a.state.status.is_terminal and a.state.status is not JobStatus.REMOVING:
            await save(a, (JobStatus.FAILED, (message,)), error=message)
        raise ChoreographyError(message) from error
    a.labels = Labels(a.state.scope, a.state.namespace, a.state.type)
    if a.metrics.enabled:
        a.storage = TimedWrites(a.storage, a.metrics, a.labels)
    job.job_id, job.scope, job.namespace, job.options = (
        a.job_id,
        a.state.scope,
        a.state.namespace,
        a.options,
    )
    a.job = job
    a.window.configure(job.max_active_steps)
    await a.counting.load(a.storage, a.job_id, a.state.records_counted_steps)


async def take_epoch(a: Activation) -> None:
    """This activation's epoch: the version of the record it writes first, with a conditional
    write (two activations cannot take the same one, and a later one's is greater). Taken as
    the activation loads a job that is not at rest, else before its first start or fence (an
    operation that reopens the job)."""
    if not a.epoch:
        await save(a)
        a.epoch = a.job_state.version
        log.info("job %s: activation epoch %d", a.job_id, a.epoch)


async def set_status(
    a: Activation,
    status: JobStatus,
    *messages: str,
    error: str | None = None,
    **fields: Any,
) -> None:
    """Saves `status` (checked against the status table) with `messages`, `error` and other
    `fields` of the record; the activation's state changes only once the save succeeded."""
    check_transition(a.job_id, a.job_state.status, status)
    if error is not None:
        fields["error"] = error
    await save(a, (status, messages), **fields)


async def save(
    a: Activation, change: tuple[JobStatus, tuple[str, ...]] | None = None, **update: Any
) -> None:
    """Saves the record with the current progress, counted records first. The in-memory
    state changes only once the save succeeded."""
    state = a.job_state if change is None else a.job_state.with_status(change[0], *change[1])
    await a.counting.flush(a.storage, a.job_id)
    record = state.model_copy(update={"progress": a.stages.progress(), **update})
    try:
        a.state = await save_job(a, record)
    except ConcurrencyError:
        # The record moved on by as many versions as this activation's saves whose answer
        # was lost (they may have been written): those were its own, and its state wins.
        # Any other move is another writer's, and the save fails.
        stored = await a.storage.get_job(a.job_id)
        if stored is None or not 0 < stored.version - record.version <= a.unanswered_saves:
            raise
        log.warning("job %s: saving over its own unacknowledged save", a.job_id)
        a.state = await save_job(a, record.model_copy(update={"version": stored.version}))
    a.dirty = False


async def save_job(a: Activation, record: JobState) -> JobState:
    try:
        saved = await a.storage.save_job(record)
    except ConcurrencyError:
        raise
    except Exception:
        written = await written_anyway(a, record)
        if written is None:
            a.unanswered_saves += 1  # it may have been written all the same
            raise
        saved = written
    a.unanswered_saves = 0
    return saved


async def written_anyway(a: Activation, record: JobState) -> JobState | None:
    """The stored record, when a save that failed without an answer was written after all
    (read back once); None when that cannot be known now."""
    try:
        stored = await a.storage.get_job(a.job_id)
    except Exception as error:
        # The save's own error is raised; the watchdog reconciles once storage answers.
        log.warning("job %s: reading back a save without an answer failed: %s", a.job_id, error)
        return None
    if stored is None or stored.version != record.version + 1 or _gist(stored) != _gist(record):
        return None
    log.warning("job %s: a save whose answer was lost was written", a.job_id)
    return stored


async def reconcile(a: Activation) -> None:
    """After saves whose answer was lost: a stop or removal storage holds though its caller
    got an error (it was this activation's own write) is carried out, as storage says."""
    stored = await a.storage.get_job(a.job_id)
    state = a.job_state
    if stored is None or not 0 < stored.version - state.version <= a.unanswered_saves:
        return
    a.unanswered_saves = 0
    if (
        stored.status is state.status
        or not stopping.stop_owed(stored)
        or a.mode is Mode.OWES_STATUS
    ):
        # The next save writes this activation's state over its own write (an outcome
        # decided is saved over a stop stored after all).
        a.state = state.model_copy(update={"version": stored.version})
        return
    log.warning("job %s: its %s was stored after all", a.job_id, stored.status)
    a.state = stored
    await stop_flow.halt_and_tell(a, removing=stored.status is JobStatus.REMOVING)


def _gist(state: JobState) -> tuple[object, ...]:
    """What a save changes, compared without timestamps (providers round them)."""
    return (state.status, len(state.status_changes), state.stage, state.progress,
            state.stop_finalized, state.error)  # fmt: skip
