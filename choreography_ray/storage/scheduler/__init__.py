"""The scheduler's storage: a small protocol of its own beside `Storage`, kept by companions of
the three providers that share their connection (`scheduler_storage(storage)`).

Stored layout (MongoDB collections; SQLite tables of the same names; each record is the JSON of
its model in `choreography_ray.scheduler.records`, the fields below are also keys or indexed):

    manifests       key (scope, name). An upsert writes the definition (job_type, request,
                    schedule, namespace) always, and of the settings (max_retries,
                    failure_window, replay_decisions_on_retry, enabled, timeout) only those
                    stated in code; an unstated one keeps its stored value (new: its
                    default).
    work_queue      key id. scope, manifest, status, holds_manifest_key, replays, resume_from,
                    scheduled_at, created_at. While QUEUED, at most one entry per manifest that
                    holds the manifest key, one per replayed run and one per resumed run:
                    unique partial indexes in SQLite, keyed marker documents in MongoDB
                    (`work_queue_keys`). Index (scope, status, scheduled_at) for the claim.
    runs            key id. scope, manifest, status, replays, queued_at, job_id. Indexes
                    (scope, manifest, queued_at), (scope, queued_at), (replays), (job_id),
                    (scope, manifest, status) for `runs_in_play`.
    dead_letters    key id. scope, manifest, status, resolved_at. Indexes (scope, manifest,
                    status), (status, resolved_at). At most one AWAITING_INTERVENTION per
                    manifest: a unique partial index in SQLite, a keyed marker document in
                    MongoDB (`dead_letter_keys`).
    decisions       key (run_id, decision key): the first answer recorded for a key stays.
    checkpoints     key (run_id, stage).
    scheduler_locks key name ("scheduler/{scope}"): holder, acquired_at, expires_at (the
                    database's clock), token (the fencing token). One holder at a time: the
                    durable lock of a scope.

`scheduled_at` is the database's time plus the delay (`now()` is the database's clock); a zero
delay stores none, and an entry without one is due at once. `claim_due` is atomic: of two
dispatchers claiming at once, each entry goes to one.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, cast, runtime_checkable

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.scheduler.records import (
    DEFINITION,
    SETTINGS,
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    SchedulerLease,
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.storage import Storage


class QueueKey(enum.StrEnum):
    """A unique key a queued entry holds."""

    #: One queued entry per manifest (entries whose kind holds it: the cycle's and triggers).
    MANIFEST = "manifest"
    #: One queued entry per replayed run.
    REPLAY = "replay"
    #: One queued entry per resumed run.
    RESUME = "resume"


class Refusal(enum.StrEnum):
    """Why `enqueue` queued nothing."""

    #: Another entry of the manifest is queued (the manifest key is taken).
    MANIFEST_ALREADY_QUEUED = "ManifestAlreadyQueued"
    #: Another entry resumes the same run, and the caller refuses rather than run from the top.
    RESUME_ALREADY_QUEUED = "ResumeAlreadyQueued"


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What `enqueue` did. A replay link another queued entry holds is dropped (the entry asks
    afresh); so is a resume link, unless the caller refuses."""

    entry: WorkEntry | None
    run: ManifestRun | None
    refused: Refusal | None = None
    replay_dropped: bool = False
    resume_dropped: bool = False


def entry_keys(entry: WorkEntry) -> dict[QueueKey, str]:
    """The unique keys `entry` holds while queued, each as one string."""
    keys: dict[QueueKey, str] = {}
    if entry.holds_manifest_key:
        keys[QueueKey.MANIFEST] = f"{entry.scope}/{entry.manifest}"
    if entry.replays is not None:
        keys[QueueKey.REPLAY] = entry.replays
    if entry.resume_from is not None:
        keys[QueueKey.RESUME] = entry.resume_from
    return keys


def settle_keys(
    entry: WorkEntry, run: ManifestRun, taken: Collection[QueueKey], refuse_resume: bool
) -> Enqueued:
    """What to queue when other queued entries hold the keys in `taken`."""
    if QueueKey.MANIFEST in taken:
        return Enqueued(None, None, Refusal.MANIFEST_ALREADY_QUEUED)
    if QueueKey.RESUME in taken and refuse_resume:
        return Enqueued(None, None, Refusal.RESUME_ALREADY_QUEUED)
    drop_replay, drop_resume = QueueKey.REPLAY in taken, QueueKey.RESUME in taken
    replays = None if drop_replay else entry.replays
    resume_from = None if drop_resume else entry.resume_from
    # The run carries the links its entry keeps.
    return Enqueued(
        entry.model_copy(update={"replays": replays, "resume_from": resume_from}),
        run.model_copy(update={"replays": replays, "resumed_from": resume_from}),
        replay_dropped=drop_replay,
        resume_dropped=drop_resume,
    )


def in_play(run: ManifestRun, failed_since: datetime) -> bool:
    """`run` is one `runs_in_play` returns (the reference for the providers' queries)."""
    if not run.status.is_finished:
        return True
    return run.status is RunStatus.FAILED and run.counted_from >= failed_since


def given_up_keys(taken: Collection[QueueKey]) -> dict[str, object]:
    """The fields of an entry queued again that give up the keys another entry took."""
    fields = {QueueKey.MANIFEST: ("holds_manifest_key", False), QueueKey.REPLAY: ("replays", None),
              QueueKey.RESUME: ("resume_from", None)}  # fmt: skip
    return dict(fields[k] for k in taken)


def kept_resolutions(letters: Iterable[DeadLetter]) -> set[str]:
    """The ids of each manifest's latest resolved dead letter of each status (RETRIED,
    ACKNOWLEDGED): what `remove_resolved_dead_letters` never deletes (the reference)."""
    latest: dict[tuple[str, str, DeadLetterStatus], DeadLetter] = {}
    for letter in letters:
        if letter.resolved_at is None:
            continue
        key = (letter.scope, letter.manifest, letter.status)
        held = latest.get(key)
        if held is None or (letter.resolved_at, letter.id) > (held.resolved_at, held.id):
            latest[key] = letter
    return {letter.id for letter in latest.values()}


def succeeds(holder: str, earlier: str) -> bool:
    """`holder` is a later incarnation of `earlier`'s lineage. A holder is "{lineage}/
    {incarnation}" (the scheduler actor's id, and a token of one activation that sorts by its
    start); a holder without "/" has no incarnations."""
    lineage, _, incarnation = holder.rpartition("/")
    before, _, earlier_incarnation = earlier.rpartition("/")
    return bool(lineage) and lineage == before and incarnation > earlier_incarnation


def lease_for(
    stored: SchedulerLease | None,
    name: str,
    holder: str,
    ttl: timedelta,
    now: datetime,
    *,
    floor: int = 0,
) -> SchedulerLease | None:
    """The lease `acquire_lease` writes: a new one when none is stored, the stored one has
    expired, or its holder is an earlier incarnation of `holder`'s lineage (a restarted actor:
    Ray runs one incarnation of an actor at a time, so its predecessor is gone, and it need not
    wait `lock_ttl` for its lease); the stored one extended when `holder` holds it; None when
    another holds it (an earlier incarnation never takes it back before it expires). A new
    holder's token is one more than the stored lease's, or than `floor` when none is stored
    (the highest token a provider issued before, if it keeps it); a renewal keeps it."""
    held = stored is not None and stored.holder != holder and stored.expires_at > now
    if held and stored is not None and not succeeds(holder, stored.holder):
        return None
    if stored is not None and stored.holder == holder:
        acquired, token = stored.acquired_at, stored.token
    else:
        acquired, token = now, (stored.token if stored is not None else floor) + 1
    return SchedulerLease(
        name=name, holder=holder, acquired_at=acquired, expires_at=now + ttl, token=token
    )


#: The scheduler's writes the scope's lease fences (`SchedulerStorage.fenced`): every write of
#: its loops and operations. A step host's `record_decision` and the lease's own are not.
FENCED_WRITES = frozenset({
    "upsert_manifest", "set_replay_decisions_on_retry", "enqueue", "claim_due", "release",
    "requeue_dispatch", "cancel_entry", "save_run", "add_dead_letter", "resolve_dead_letter",
    "remove_resolved_dead_letters", "save_checkpoint", "delete_runs",
})  # fmt: skip


def holds(lease: SchedulerLease | None, holder: str, now: datetime) -> bool:
    """`holder` holds `lease` at `now` (the database's clock)."""
    return lease is not None and lease.holder == holder and lease.expires_at > now


def fence_error(name: str, holder: str, method: str) -> SchedulerOperationError:
    return SchedulerOperationError(
        SchedulerError.NOT_LOCK_HOLDER,
        f"{name}: {holder} no longer holds the lease; {method} is not written",
    )


def merge_manifest(
    stored: Manifest | None, manifest: Manifest, stated: Collection[str]
) -> Manifest:
    """The manifest an upsert stores: `manifest` when new; else the stored one with the
    definition, `updated` and the stated settings of `manifest` (the spec's seeding rule)."""
    if stored is None:
        return manifest
    fields = DEFINITION | (SETTINGS & set(stated)) | {"updated"}
    return stored.model_copy(update={f: getattr(manifest, f) for f in fields})


@runtime_checkable
class SchedulerStorage(Protocol):
    """What the scheduler needs from a database. Every method is a coroutine."""

    async def now(self) -> datetime:
        """The database's clock, in UTC."""

    # manifests
    async def upsert_manifest(self, manifest: Manifest, stated: Collection[str]) -> Manifest:
        """Insert `manifest`, or update the stored one: its definition, `updated`, and of its
        settings only those named in `stated`. Returns the stored manifest."""

    async def get_manifest(self, scope: str, name: str) -> Manifest | None: ...

    async def list_manifests(self, scope: str) -> list[Manifest]:
        """By name."""

    async def manifest_keys(self) -> list[tuple[str, str]]:
        """Every (scope, namespace) a manifest of any scope runs in, sorted: what recovery
        needs to resume scheduled runs, and the scopes whose schedulers it brings back."""

    async def set_replay_decisions_on_retry(
        self, scope: str, names: Collection[str], value: bool
    ) -> int:
        """Sets the flag; turning it off also clears the replay link of the manifests' queued
        entries that hold the manifest key (and of their runs), in the same write. Returns how
        many links it cleared."""

    # work queue
    async def enqueue(
        self,
        entry: WorkEntry,
        run: ManifestRun,
        delay: timedelta = timedelta(0),
        *,
        refuse_resume: bool = False,
    ) -> Enqueued:
        """Queues `entry` and stores `run` (QUEUED) with it, `scheduled_at` the database's time
        plus `delay` (none for a zero delay). The unique keys decide the loser (see `Enqueued`)."""

    async def claim_due(self, scope: str, limit: int = 100) -> list[WorkEntry]:
        """Atomically moves due QUEUED entries of the scope to DISPATCHED (oldest first),
        stamping `dispatched_at` on the database's clock and counting the attempt."""

    async def release(self, entry_id: str, *, clear_link: bool = False) -> WorkEntry | None:
        """A trigger: the QUEUED entry is due at once (and asks afresh with `clear_link`, on its
        run too). None when it is no longer queued (the dispatcher claimed it first)."""

    async def requeue_dispatch(
        self, entry_id: str, delay: timedelta, *, count_attempt: bool = True
    ) -> WorkEntry | None:
        """A DISPATCHED entry whose dispatch failed is QUEUED again after `delay`. Keys another
        entry took meanwhile are given up (the entry stays queued without them). Without
        `count_attempt` the claim's attempt is given back (no start was tried)."""

    async def cancel_entry(
        self, entry_id: str, run: ManifestRun | None = None, *, claimed: bool = False
    ) -> bool:
        """A QUEUED entry (with `claimed`: a DISPATCHED one, which the dispatcher will not
        start) is CANCELLED, and `run` (its run, cancelled) saved in the same write (MongoDB:
        the entry first; a failure between leaves a waiting run whose entry is cancelled,
        which the next cycle settles); False when it was not in that status."""

    async def get_entry(self, entry_id: str) -> WorkEntry | None: ...

    async def queued_entries(self, scope: str, manifest: str | None = None) -> list[WorkEntry]:
        """QUEUED entries, oldest first."""

    # runs
    async def save_run(self, run: ManifestRun) -> None:
        """Insert or replace."""

    async def get_run(self, run_id: str) -> ManifestRun | None: ...

    async def list_runs(
        self, scope: str, manifest: str | None = None, limit: int = 100
    ) -> list[ManifestRun]:
        """Newest (by `queued_at`) first."""

    async def runs_in_play(
        self, scope: str, manifest: str, failed_since: datetime
    ) -> list[ManifestRun]:
        """The manifest's runs that have not finished (of any age), and its FAILED runs that
        started at `failed_since` or later (one that never started: queued then); newest
        first. What settling runs and counting failures read beyond the newest runs."""

    async def delete_runs(self, run_ids: Collection[str]) -> int:
        """Deletes the runs, their decisions and checkpoints, and their work entries unless
        queued, in one write (MongoDB: the runs last, so a delete cut short is done again by
        the next cleanup); how many runs. Run retention decides which (`retention.doomed`)."""

    async def runs_replaying(self, run_id: str) -> list[ManifestRun]:
        """Every run, in any state, whose `replays` is `run_id`."""

    async def run_for_job(self, job_id: str) -> ManifestRun | None:
        """The run whose job is `job_id` (found by an index on `job_id`); None when the job is
        no scheduler run."""

    # dead letters
    async def add_dead_letter(self, dead_letter: DeadLetter) -> bool:
        """Stores an AWAITING_INTERVENTION dead letter; False (nothing stored) when another of
        its manifest awaits already: one per manifest, as a unique key."""

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None: ...

    async def list_dead_letters(
        self, scope: str, manifest: str | None = None, status: DeadLetterStatus | None = None
    ) -> list[DeadLetter]:
        """Newest first."""

    async def resolve_dead_letter(
        self, dead_letter_id: str, status: DeadLetterStatus, note: str | None = None
    ) -> DeadLetter | None:
        """An AWAITING_INTERVENTION dead letter becomes `status`, resolved now (the database's
        clock); None when it is not awaiting (resolved by someone else, or unknown)."""

    async def remove_resolved_dead_letters(self, before: datetime) -> int:
        """Deletes dead letters resolved before `before`, except each manifest's latest
        resolved one of each status (`kept_resolutions`): they hold its resolution (the point
        its failures are set aside from, and the acknowledgement its schedule counts from).
        Returns how many."""

    # decisions and checkpoints
    async def record_decision(self, decision: Decision) -> Decision:
        """Stores the answer unless the run recorded one for the key; returns the stored one."""

    async def list_decisions(self, run_id: str) -> list[Decision]: ...

    async def count_decisions(self, run_id: str) -> int: ...

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Insert or replace (run_id, stage)."""

    async def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        """By stage."""

    # the scope's lock
    async def acquire_lease(self, name: str, holder: str, ttl: timedelta) -> SchedulerLease | None:
        """Takes the lease `name` for `holder` until the database's now plus `ttl` when it is
        free, expired, or held by an earlier incarnation of `holder`'s lineage (`lease_for`),
        or renews it when `holder` holds it; None when another holder holds
        it and it has not expired. Atomic: of two holders acquiring at once, one wins."""

    async def release_lease(self, name: str, holder: str) -> bool:
        """Deletes the lease when `holder` holds it; False otherwise."""

    async def get_lease(self, name: str) -> SchedulerLease | None: ...

    def fenced(self, name: str, holder: str) -> SchedulerStorage:
        """This storage (the same database) whose writes (`FENCED_WRITES`) are refused with
        `NOT_LOCK_HOLDER` unless `holder` holds the lease `name`, unexpired on the database's
        clock, checked in the same write: a scheduler that lost its lease to a successor or
        another cluster writes nothing more (SQLite: in the write's transaction; memory: in
        the same step; MongoDB: read just before the write, and the lease's token stamped on
        each document and checked in the write itself, see its module)."""


class _CheckedFirst:
    """A fence for a storage that has none of its own (a proxy, such as the memory storage
    shared through an actor on Ray): each write reads the lease on the database's clock just
    before it, as MongoDB's fence does first (without its token: a takeover in between is the
    window left)."""

    def __init__(self, storage: SchedulerStorage, name: str, holder: str) -> None:
        self._storage, self._name, self._holder = storage, name, holder

    def __getattr__(self, method: str) -> Any:
        found = getattr(self._storage, method)
        if method not in FENCED_WRITES:
            return found

        async def write(*args: Any, **kwargs: Any) -> Any:
            lease = await self._storage.get_lease(self._name)
            if not holds(lease, self._holder, await self._storage.now()):
                raise fence_error(self._name, self._holder, method)
            return await found(*args, **kwargs)

        return write


def fenced(storage: SchedulerStorage, name: str, holder: str) -> SchedulerStorage:
    """`storage.fenced(name, holder)`, or for a storage whose class has no fence of its own
    (a proxy) one that reads the lease just before each write."""
    if callable(getattr(type(storage), "fenced", None)):
        return storage.fenced(name, holder)
    return cast(SchedulerStorage, _CheckedFirst(storage, name, holder))


def scheduler_storage(storage: Storage) -> SchedulerStorage:
    """The scheduler's storage on `storage`'s database: one companion per provider instance."""
    existing: SchedulerStorage | None = getattr(storage, "_scheduler_storage", None)
    if existing is not None:
        return existing
    from choreography_ray.storage.memory import MemoryStorage
    from choreography_ray.storage.sqlite import SqliteStorage

    companion: SchedulerStorage
    if isinstance(storage, MemoryStorage):
        from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage

        companion = MemorySchedulerStorage()
    elif isinstance(storage, SqliteStorage):
        from choreography_ray.storage.scheduler.sqlite import SqliteSchedulerStorage

        companion = SqliteSchedulerStorage(storage)
    else:
        from choreography_ray.storage.mongodb import MongoStorage
        from choreography_ray.storage.scheduler.mongodb import MongoSchedulerStorage

        if not isinstance(storage, MongoStorage):
            raise TypeError(f"no scheduler storage for {type(storage).__name__}")
        companion = MongoSchedulerStorage(storage)
    setattr(storage, "_scheduler_storage", companion)  # noqa: B010 (not in the protocol)
    return companion
