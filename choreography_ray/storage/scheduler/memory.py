"""The scheduler's records in process memory: the reference for the contract.

Dicts of immutable records. Each method runs without an await between its reads and writes, so
on one event loop it is atomic: two claims of one entry cannot both win, and the unique keys of
queued entries are checked and taken in one step. `clock` is the database's clock (injectable,
so tests can move time).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any, cast

from choreography_ray.model import utcnow
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    SchedulerLease,
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, WorkStatus
from choreography_ray.storage.scheduler import (
    FENCED_WRITES,
    Enqueued,
    QueueKey,
    SchedulerStorage,
    entry_keys,
    fence_error,
    given_up_keys,
    holds,
    in_play,
    kept_resolutions,
    lease_for,
    merge_manifest,
    settle_keys,
)


class _Fenced:
    """A memory storage whose writes check the lease first. A memory method does not await
    between its reads and writes, so the check and the write are one step."""

    def __init__(self, storage: MemorySchedulerStorage, name: str, holder: str) -> None:
        self._storage, self._name, self._holder = storage, name, holder

    def __getattr__(self, method: str) -> Any:
        found = getattr(self._storage, method)
        if method not in FENCED_WRITES:
            return found

        async def write(*args: Any, **kwargs: Any) -> Any:
            storage = self._storage
            if not holds(storage.leases.get(self._name), self._holder, storage.clock()):
                raise fence_error(self._name, self._holder, method)
            return await found(*args, **kwargs)

        return write


class MemorySchedulerStorage:
    def __init__(self, clock: Callable[[], datetime] = utcnow) -> None:
        self.clock = clock
        self.manifests: dict[tuple[str, str], Manifest] = {}
        self.entries: dict[str, WorkEntry] = {}
        self.runs: dict[str, ManifestRun] = {}
        self.dead_letters: dict[str, DeadLetter] = {}
        self.decisions: dict[tuple[str, str], Decision] = {}
        self.checkpoints: dict[tuple[str, int], Checkpoint] = {}
        self.leases: dict[str, SchedulerLease] = {}

    async def now(self) -> datetime:
        return self.clock()

    async def upsert_manifest(self, manifest: Manifest, stated: Collection[str]) -> Manifest:
        key = (manifest.scope, manifest.name)
        stored = self.manifests[key] = merge_manifest(self.manifests.get(key), manifest, stated)
        return stored

    async def get_manifest(self, scope: str, name: str) -> Manifest | None:
        return self.manifests.get((scope, name))

    async def list_manifests(self, scope: str) -> list[Manifest]:
        return sorted((m for m in self.manifests.values() if m.scope == scope),
                      key=lambda m: m.name)  # fmt: skip

    async def manifest_keys(self) -> list[tuple[str, str]]:
        return sorted({(m.scope, m.namespace) for m in self.manifests.values()})

    async def set_replay_decisions_on_retry(
        self, scope: str, names: Collection[str], value: bool
    ) -> int:
        for name in names:
            if (manifest := self.manifests.get((scope, name))) is not None:
                update = {"replay_decisions_on_retry": value}
                self.manifests[scope, name] = manifest.model_copy(update=update)
        if value:
            return 0
        cleared = [e for e in self.entries.values() if e.status is WorkStatus.QUEUED
                   and e.scope == scope and e.manifest in names and e.holds_manifest_key
                   and e.replays is not None]  # fmt: skip
        for entry in cleared:
            self._unlink(entry)
        return len(cleared)

    def _unlink(self, entry: WorkEntry) -> WorkEntry:
        entry = self.entries[entry.id] = entry.model_copy(update={"replays": None})
        if (run := self.runs.get(entry.run_id)) is not None:
            self.runs[run.id] = run.model_copy(update={"replays": None})
        return entry

    async def enqueue(
        self,
        entry: WorkEntry,
        run: ManifestRun,
        delay: timedelta = timedelta(0),
        *,
        refuse_resume: bool = False,
    ) -> Enqueued:
        taken = self._taken(entry)
        result = settle_keys(entry, run, taken, refuse_resume)
        if result.entry is None or result.run is None:
            return result
        now = self.clock()
        scheduled = now + delay if delay > timedelta(0) else None
        queued = result.entry.model_copy(update={
            "status": WorkStatus.QUEUED, "created_at": now, "scheduled_at": scheduled,
            "run_id": result.run.id,
        })  # fmt: skip
        self.entries[queued.id] = queued
        self.runs[result.run.id] = result.run
        return Enqueued(queued, result.run, None, result.replay_dropped, result.resume_dropped)

    def _taken(self, entry: WorkEntry, besides: str = "") -> set[QueueKey]:
        wanted = entry_keys(entry)
        held = {
            (kind, value)
            for other in self.entries.values()
            if other.status is WorkStatus.QUEUED and other.id != besides
            for kind, value in entry_keys(other).items()
        }
        return {kind for kind, value in wanted.items() if (kind, value) in held}

    async def claim_due(self, scope: str, limit: int = 100) -> list[WorkEntry]:
        now = self.clock()
        due = [e for e in self.entries.values() if e.scope == scope
               and e.status is WorkStatus.QUEUED
               and (e.scheduled_at is None or e.scheduled_at <= now)]  # fmt: skip
        due.sort(key=lambda e: (e.scheduled_at or e.created_at, e.created_at))
        claimed = []
        for entry in due[:limit]:
            claimed.append(entry.model_copy(update={
                "status": WorkStatus.DISPATCHED, "dispatched_at": now,
                "dispatch_attempts": entry.dispatch_attempts + 1,
            }))  # fmt: skip
            self.entries[entry.id] = claimed[-1]
        return claimed

    async def release(self, entry_id: str, *, clear_link: bool = False) -> WorkEntry | None:
        entry = self.entries.get(entry_id)
        if entry is None or entry.status is not WorkStatus.QUEUED:
            return None
        if clear_link and entry.replays is not None:
            entry = self._unlink(entry)
        entry = self.entries[entry_id] = entry.model_copy(update={"scheduled_at": None})
        return entry

    async def requeue_dispatch(
        self, entry_id: str, delay: timedelta, *, count_attempt: bool = True
    ) -> WorkEntry | None:
        entry = self.entries.get(entry_id)
        if entry is None or entry.status is not WorkStatus.DISPATCHED:
            return None
        taken = self._taken(entry, besides=entry_id)
        update: dict[str, object] = {
            "status": WorkStatus.QUEUED,
            "scheduled_at": self.clock() + delay if delay > timedelta(0) else None,
            "dispatch_attempts": entry.dispatch_attempts - (0 if count_attempt else 1),
        }
        update.update(given_up_keys(taken))
        entry = self.entries[entry_id] = entry.model_copy(update=update)
        return entry

    async def cancel_entry(
        self, entry_id: str, run: ManifestRun | None = None, *, claimed: bool = False
    ) -> bool:
        entry = self.entries.get(entry_id)
        wanted = WorkStatus.DISPATCHED if claimed else WorkStatus.QUEUED
        if entry is None or entry.status is not wanted:
            return False
        self.entries[entry_id] = entry.model_copy(update={"status": WorkStatus.CANCELLED})
        if run is not None:
            self.runs[run.id] = run
        return True

    async def get_entry(self, entry_id: str) -> WorkEntry | None:
        return self.entries.get(entry_id)

    async def queued_entries(self, scope: str, manifest: str | None = None) -> list[WorkEntry]:
        found = [e for e in self.entries.values() if e.scope == scope
                 and e.status is WorkStatus.QUEUED
                 and (manifest is None or e.manifest == manifest)]  # fmt: skip
        return sorted(found, key=lambda e: e.created_at)

    async def save_run(self, run: ManifestRun) -> None:
        self.runs[run.id] = run

    async def get_run(self, run_id: str) -> ManifestRun | None:
        return self.runs.get(run_id)

    async def list_runs(
        self, scope: str, manifest: str | None = None, limit: int = 100
    ) -> list[ManifestRun]:
        found = [r for r in self.runs.values()
                 if r.scope == scope and (manifest is None or r.manifest == manifest)]  # fmt: skip
        return sorted(found, key=lambda r: r.queued_at, reverse=True)[:limit]

    async def runs_in_play(
        self, scope: str, manifest: str, failed_since: datetime
    ) -> list[ManifestRun]:
        found = [r for r in self.runs.values() if (r.scope, r.manifest) == (scope, manifest)
                 and in_play(r, failed_since)]  # fmt: skip
        return sorted(found, key=lambda r: r.queued_at, reverse=True)

    async def delete_runs(self, run_ids: Collection[str]) -> int:
        doomed = [self.runs[i] for i in run_ids if i in self.runs]
        ids = {r.id for r in doomed}
        entries = {r.entry_id for r in doomed}
        for entry_id in entries:
            entry = self.entries.get(entry_id or "")
            if entry is not None and entry.status is not WorkStatus.QUEUED:
                del self.entries[entry.id]
        self.decisions = {k: d for k, d in self.decisions.items() if k[0] not in ids}
        self.checkpoints = {k: c for k, c in self.checkpoints.items() if k[0] not in ids}
        for run in doomed:
            del self.runs[run.id]
        return len(doomed)

    async def runs_replaying(self, run_id: str) -> list[ManifestRun]:
        return [r for r in self.runs.values() if r.replays == run_id]

    async def run_for_job(self, job_id: str) -> ManifestRun | None:
        # A scan: the reference holds few runs, and a step host asks once per job.
        return next((r for r in self.runs.values() if r.job_id == job_id), None)

    async def add_dead_letter(self, dead_letter: DeadLetter) -> bool:
        awaiting = DeadLetterStatus.AWAITING_INTERVENTION
        key = (dead_letter.scope, dead_letter.manifest, awaiting)
        rivals = [d for d in self.dead_letters.values() if (d.scope, d.manifest, d.status) == key]
        if dead_letter.status is awaiting and rivals:
            return False
        self.dead_letters[dead_letter.id] = dead_letter
        return True

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        return self.dead_letters.get(dead_letter_id)

    async def list_dead_letters(
        self, scope: str, manifest: str | None = None, status: DeadLetterStatus | None = None
    ) -> list[DeadLetter]:
        found = [d for d in self.dead_letters.values() if d.scope == scope
                 and (manifest is None or d.manifest == manifest)
                 and (status is None or d.status is status)]  # fmt: skip
        return sorted(found, key=lambda d: d.dead_lettered_at, reverse=True)

    async def resolve_dead_letter(
        self, dead_letter_id: str, status: DeadLetterStatus, note: str | None = None
    ) -> DeadLetter | None:
        letter = self.dead_letters.get(dead_letter_id)
        if letter is None or letter.status.is_resolved:
            return None
        update = {"status": status, "resolved_at": self.clock(), "note": note}
        letter = self.dead_letters[dead_letter_id] = letter.model_copy(update=update)
        return letter

    async def remove_resolved_dead_letters(self, before: datetime) -> int:
        kept = kept_resolutions(self.dead_letters.values())
        old = [
            d.id
            for d in self.dead_letters.values()
            if d.resolved_at is not None and d.resolved_at < before and d.id not in kept
        ]
        for letter_id in old:
            del self.dead_letters[letter_id]
        return len(old)

    async def record_decision(self, decision: Decision) -> Decision:
        return self.decisions.setdefault((decision.run_id, decision.key), decision)

    async def list_decisions(self, run_id: str) -> list[Decision]:
        return [d for (r, _), d in self.decisions.items() if r == run_id]

    async def count_decisions(self, run_id: str) -> int:
        return len(await self.list_decisions(run_id))

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.checkpoints[checkpoint.run_id, checkpoint.stage] = checkpoint

    async def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        return sorted((c for (r, _), c in self.checkpoints.items() if r == run_id),
                      key=lambda c: c.stage)  # fmt: skip

    async def acquire_lease(self, name: str, holder: str, ttl: timedelta) -> SchedulerLease | None:
        lease = lease_for(self.leases.get(name), name, holder, ttl, self.clock())
        if lease is not None:
            self.leases[name] = lease
        return lease

    async def release_lease(self, name: str, holder: str) -> bool:
        lease = self.leases.get(name)
        if lease is None or lease.holder != holder:
            return False
        del self.leases[name]
        return True

    async def get_lease(self, name: str) -> SchedulerLease | None:
        return self.leases.get(name)

    def fenced(self, name: str, holder: str) -> SchedulerStorage:
        return cast(SchedulerStorage, _Fenced(self, name, holder))
