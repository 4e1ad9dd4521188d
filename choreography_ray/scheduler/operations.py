"""The scheduler's operations: upserting manifests, triggers, dead letters and requeues.

Each is carried out against storage by the core inside a turn of its own (the reads run beside
turns). The rules are the pure modules': `cycle.trigger`, `replay.requeue_link` and the unique
keys of the work queue (`SchedulerStorage.enqueue`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import ValidationError

from choreography_ray.errors import InvalidRequestError, SchedulerError, SchedulerOperationError
from choreography_ray.logs import get_logger
from choreography_ray.scheduler import cycle, failures, replay
from choreography_ray.scheduler.cycle import InFlight, Release
from choreography_ray.scheduler.manifest_manager import ManifestManager, cancelled, gather, new_run
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import (
    DeadLetter,
    Manifest,
    ManifestRun,
    RequeueResult,
    TriggerResult,
)
from choreography_ray.scheduler.schedules import Schedule
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus
from choreography_ray.storage.scheduler import Refusal, SchedulerStorage

log = get_logger(__name__)

R = TypeVar("R", Manifest, ManifestRun, DeadLetter)


class Operations:
    def __init__(
        self,
        scope: str,
        storage: SchedulerStorage,
        options: SchedulerOptions,
        manager: ManifestManager,
    ) -> None:
        self.scope = scope
        self.storage = storage
        self.options = options
        self.manager = manager

    # -- reads ------------------------------------------------------------------------------

    def _owned(self, record: R | None, error: SchedulerError, what: str) -> R:
        """`record` when it exists in this scope; else the refusal `error` naming `what`."""
        if record is None or record.scope != self.scope:
            raise SchedulerOperationError(error, f"no {what} in scope {self.scope!r}")
        return record

    async def manifest(self, name: str) -> Manifest:
        found = await self.storage.get_manifest(self.scope, name)
        return self._owned(found, SchedulerError.MANIFEST_NOT_FOUND, f"manifest {name!r}")

    async def run(self, run_id: str) -> ManifestRun:
        found = await self.storage.get_run(run_id)
        return self._owned(found, SchedulerError.RUN_NOT_FOUND, f"run {run_id}")

    async def dead_letter(self, dead_letter_id: str) -> DeadLetter:
        found = await self.storage.get_dead_letter(dead_letter_id)
        return self._owned(found, SchedulerError.DEAD_LETTER_NOT_FOUND,
                           f"dead letter {dead_letter_id}")  # fmt: skip

    # -- manifests --------------------------------------------------------------------------

    async def schedule(
        self,
        name: str,
        job_type: str,
        request: dict[str, Any],
        schedule: Schedule,
        *,
        namespace: str = "default",
        max_retries: int | None = None,
        failure_window: timedelta | None = None,
        replay_decisions_on_retry: bool | None = None,
        enabled: bool | None = None,
        timeout: timedelta | None = None,  # noqa: ASYNC109 (a manifest's setting, not a deadline)
    ) -> Manifest:
        """Upserts a manifest: its definition always, and of its settings those stated (not
        None); an unstated one keeps its stored value (a new manifest: its default). A setting
        out of range (`max_retries` below 0, a `failure_window` of zero or less, which would
        never dead-letter) is refused with `InvalidRequestError`, as Trax refuses it."""
        for setting, value in (("failure_window", failure_window), ("timeout", timeout)):
            if value is not None and value <= timedelta(0):
                raise InvalidRequestError(f"manifest {name!r}: {setting} must be positive, "
                                          f"not {value}")  # fmt: skip
        settings = {"max_retries": max_retries, "failure_window": failure_window,
                    "replay_decisions_on_retry": replay_decisions_on_retry,
                    "enabled": enabled, "timeout": timeout}  # fmt: skip
        stated = {k for k, v in settings.items() if v is not None}
        defaults = {"max_retries": self.options.default_max_retries}
        now = await self.storage.now()
        try:
            manifest = Manifest.model_validate({
                "scope": self.scope, "name": name, "job_type": job_type, "request": request,
                "schedule": schedule, "namespace": namespace, "created": now, "updated": now,
                **defaults, **{k: settings[k] for k in stated},
            })  # fmt: skip
        except ValidationError as error:  # a setting out of range: the caller's error
            raise InvalidRequestError(f"manifest {name!r}: {error}") from None
        stored = await self.storage.upsert_manifest(manifest, stated)
        window = failures.failure_window(stored, self.options)
        warning = failures.backoff_warning(self.options, stored.max_retries, window)
        if warning:
            log.warning("scheduler/%s: manifest %r: %s", self.scope, name, warning)
        if not stored.enabled:
            await self._cancel_queued(stored)
        return stored

    async def _cancel_queued(self, manifest: Manifest) -> None:
        """A disabled manifest's queued entries (its cycle's and triggers) are taken off, each
        with its run in one write."""
        for entry in await self.storage.queued_entries(self.scope, manifest.name):
            if not entry.holds_manifest_key:
                continue
            run = await self.storage.get_run(entry.run_id)
            now = await self.storage.now()
            why = "its manifest was disabled"
            await self.storage.cancel_entry(entry.id, run and cancelled(run, now, why))

    async def set_replay_decisions_on_retry(self, names: Collection[str], value: bool) -> str:
        names = list(dict.fromkeys(names))
        cleared = await self.storage.set_replay_decisions_on_retry(self.scope, names, value)
        return replay.opt_in_message(len(names)) if value else replay.opt_out_message(cleared)

    # -- runs -------------------------------------------------------------------------------

    async def trigger(self, name: str, ask_afresh: bool = False) -> TriggerResult:
        """A run now (`cycle.trigger`). Refused for a disabled manifest (`MANIFEST_DISABLED`)
        and for one whose dead letter awaits intervention (`MANIFEST_DEAD_LETTERED`): its
        requeue is the run an operator asks for, and resolves it (issue 36, item 12)."""
        manifest = await self.manifest(name)
        if not manifest.enabled:
            raise SchedulerOperationError(
                SchedulerError.MANIFEST_DISABLED,
                f"manifest {name!r} is disabled: enable it to trigger it",
            )
        opts_in = self.manager.jobs.checkpoint_stages(manifest.job_type)
        now = await self.storage.now()
        history = await gather(self.storage, manifest, self.options, now,
                               checkpoint_stages=opts_in)  # fmt: skip
        if (letter := failures.awaiting_intervention(history.dead_letters)) is not None:
            raise SchedulerOperationError(
                SchedulerError.MANIFEST_DEAD_LETTERED,
                f"manifest {name!r} is dead-lettered ({letter.id}): requeue or acknowledge "
                "its dead letter",
            )
        decided = cycle.trigger(manifest, history, self.options, now, ask_afresh=ask_afresh,
                                checkpoint_stages=opts_in)  # fmt: skip
        if isinstance(decided, Release):
            released = await self.storage.release(decided.entry.id, clear_link=decided.clear_link)
            if released is None:  # the dispatcher claimed it first: it runs as it was queued
                claimed = await self.storage.get_entry(decided.entry.id)
                replays = claimed.replays if claimed is not None else decided.entry.replays
                if replays is not None and ask_afresh:
                    log.warning("scheduler/%s: trigger of %r came too late to ask afresh: its "
                                "run replays %s", self.scope, name, replays)  # fmt: skip
                return TriggerResult(run_id=decided.entry.run_id, already_dispatched=True,
                                     replay_decisions_of=replays)  # fmt: skip
            return TriggerResult(run_id=released.run_id, replay_decisions_of=released.replays)
        if isinstance(decided, InFlight):  # one run at a time: the one in flight answers
            flying = decided.run
            return TriggerResult(run_id=flying.id, already_dispatched=True,
                                 replay_decisions_of=flying.replays)  # fmt: skip
        done = await self.manager.queue(manifest, decided, EntryKind.TRIGGER, now)
        if done.run is None:  # queued meanwhile by someone else: never a second entry
            return TriggerResult()
        return TriggerResult(run_id=done.run.id, replay_decisions_of=done.run.replays)

    async def requeue(self, dead_letter_id: str, ask_afresh: bool = False) -> str:
        """Resolves the dead letter (RETRIED) and queues a run of the manifest's current job
        type and request at once, no backoff; the failure count starts afresh from the
        resolution. It replays and resumes the failed run only as a retry would: not when the
        manifest opted out of replay, nor when its input changed since.

        The run is queued first, then the dead letter resolved: its run has the dead letter's
        id, so a requeue whose resolution failed is resolved by the next cycle, or by this
        requeue again, with its one run (never a second)."""
        letter = await self.dead_letter(dead_letter_id)
        if letter.status.is_resolved:
            raise _already_resolved(letter)
        if await self.storage.get_run(letter.id) is None:
            await self._queue_requeue(letter, ask_afresh)
        if await self.storage.resolve_dead_letter(letter.id, DeadLetterStatus.RETRIED) is None:
            raise _already_resolved(letter)
        return letter.id

    async def _queue_requeue(self, letter: DeadLetter, ask_afresh: bool) -> None:
        manifest = await self.manifest(letter.manifest)
        target = await self.storage.get_run(letter.run_id) if letter.run_id else None
        link = replay.Link(None, replay.AskAfresh.NOT_A_RETRY)
        if target is not None:
            link = await self._requeue_link(target, ask_afresh, manifest)
        # It resumes after the failed run's checkpoint, if it has one (the dispatcher looks).
        resume_from = None
        if target is not None and target.status is RunStatus.FAILED:
            resumable = replay.same_input(manifest, target)
            opts_in = resumable and self.manager.jobs.checkpoint_stages(target.job_type)
            resume_from = target.id if opts_in else None
        now = await self.storage.now()
        entry, run = new_run(manifest, EntryKind.DEAD_LETTER_REQUEUE, now, run_id=letter.id,
                             is_retry=True, replays=link.replays, resume_from=resume_from,
                             requeues=letter.run_id)  # fmt: skip
        # An entry that holds no manifest key is never refused.
        await self.storage.enqueue(entry, run)

    async def requeue_all(self, name: str | None = None, ask_afresh: bool = False) -> list[str]:
        """Requeues every dead letter awaiting intervention, of manifest `name` or of the whole
        scope, oldest first, each as `requeue` does; the new runs' ids."""
        return [await self.requeue(d.id, ask_afresh) for d in await self._awaiting(name)]

    async def acknowledge_all(self, name: str | None = None, *, note: str) -> int:
        """Acknowledges every dead letter awaiting intervention, of manifest `name` or of the
        whole scope, with `note`; how many."""
        letters = await self._awaiting(name)
        for letter in letters:
            await self.acknowledge(letter.id, note)
        return len(letters)

    async def _awaiting(self, name: str | None) -> list[DeadLetter]:
        if name is not None:
            await self.manifest(name)  # an unknown manifest is refused, not "none awaiting"
        awaiting = DeadLetterStatus.AWAITING_INTERVENTION
        return list(reversed(await self.storage.list_dead_letters(self.scope, name, awaiting)))

    async def acknowledge(self, dead_letter_id: str, note: str) -> None:
        letter = await self.dead_letter(dead_letter_id)
        resolved = await self.storage.resolve_dead_letter(
            letter.id, DeadLetterStatus.ACKNOWLEDGED, note
        )
        if resolved is None:
            raise _already_resolved(letter)

    async def requeue_execution(self, run_id: str, ask_afresh: bool = False) -> RequeueResult:
        """Queues the run again, from the top, with its own job type and request."""
        target = await self.run(run_id)
        manifest = await self.manifest(target.manifest)
        link = await self._requeue_link(target, ask_afresh)
        now = await self.storage.now()
        entry, run = new_run(manifest, EntryKind.REQUEUE_EXECUTION, now, source=target,
                             is_retry=True, replays=link.replays)  # fmt: skip
        done = await self.storage.enqueue(entry, run)
        assert done.run is not None
        message = f"Execution {target.id} is queued again as {done.run.id}."
        source = replay.requeue_source(target) or target.id
        if done.run.replays is not None:
            message += f" It replays the decisions of execution {done.run.replays}."
        elif done.replay_dropped or link.afresh is replay.AskAfresh.ALREADY_REPLAYED:
            message += " " + replay.already_replayed_message(source)
        elif link.afresh is replay.AskAfresh.NO_DECISIONS:
            message += f" It asks its deciders afresh: execution {source} recorded no decisions."
        elif link.afresh is replay.AskAfresh.REPLAYED_ANOTHER_RUN:
            message += (
                f" It asks its deciders afresh: execution {target.id} replayed the "
                f"decisions of execution {target.replays}, which are replayed once."
            )
        else:
            message += " It asks its deciders afresh."
        return RequeueResult(run_id=done.run.id, message=message)

    async def resume_execution(self, run_id: str) -> str:
        """Queues a run that resumes after `run_id`'s latest checkpoint; refused for a run that
        is not FAILED or CANCELLED (as Trax), and while another queued entry resumes it."""
        target = await self.run(run_id)
        if target.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise SchedulerOperationError(
                SchedulerError.RUN_NOT_RESUMABLE,
                f"run {run_id} is {target.status.value}: only a failed or cancelled run resumes",
            )
        manifest = await self.manifest(target.manifest)
        now = await self.storage.now()
        entry, run = new_run(manifest, EntryKind.RESUME_EXECUTION, now, source=target,
                             is_retry=True, resume_from=target.id)  # fmt: skip
        done = await self.storage.enqueue(entry, run, refuse_resume=True)
        if done.refused is Refusal.RESUME_ALREADY_QUEUED or done.run is None:
            raise SchedulerOperationError(
                SchedulerError.RESUME_ALREADY_QUEUED, f"a queued entry resumes run {run_id} already"
            )
        return done.run.id

    async def _requeue_link(
        self, target: ManifestRun, ask_afresh: bool, manifest: Manifest | None = None
    ) -> replay.Link:
        source = replay.requeue_source(target) or target.id
        return replay.requeue_link(
            target,
            runs=await self.storage.runs_replaying(source),
            queued=await self.storage.queued_entries(self.scope),
            recorded_decisions=await self.storage.count_decisions(source),
            ask_afresh=ask_afresh,
            manifest=manifest,
        )


def _already_resolved(letter: DeadLetter) -> SchedulerOperationError:
    return SchedulerOperationError(
        SchedulerError.DEAD_LETTER_ALREADY_RESOLVED, f"dead letter {letter.id} is resolved already"
    )
