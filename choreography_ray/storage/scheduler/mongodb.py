"""The scheduler's collections in the MongoDB provider's database, on its client and threads.

Collections (each document is the record's JSON with `_id`; top-level times are fixed-width
UTC ISO-8601 strings, which sort as the instants do, as in the provider):

    manifests         `_id` '["{scope}", "{name}"]'. Index (scope, name).
    work_queue        `_id` entry id. Indexes (scope, status, scheduled_at), (scope, manifest).
    work_queue_keys   one marker per unique key a QUEUED entry holds: `_id` "manifest/{scope}/
                      {name}", "replay/{run_id}" or "resume/{run_id}"; entry_id, created. The
                      unique `_id` is the one-queued-entry rule (nx-27017 has no partial index).
    runs              `_id` run id. Indexes (scope, manifest, queued_at), (scope, queued_at),
                      (replays), (job_id), (scope, manifest, status).
    dead_letters      `_id` id. Indexes (scope, manifest, status), (status, resolved_at).
    dead_letter_keys  one marker per manifest with a dead letter AWAITING_INTERVENTION: `_id`
                      '["{scope}", "{manifest}"]', dead_letter_id. Inserted before the dead
                      letter, deleted when it is resolved; a marker whose dead letter is not
                      awaiting (or was never written) is taken over.
    decisions         `_id` "{run_id}/{key}". Index (run_id).
    checkpoints       `_id` "{run_id}/{stage}". Index (run_id, stage).
    scheduler_locks   `_id` lease name ("scheduler/{scope}"). Taken by an insert (a second
                      insert fails on `_id`), renewed or taken over by a `replace_one` filtered
                      on the holder and expiry read just before: a compare-and-swap. `token`:
                      one more on each new holder (`lease_for`).
    scheduler_fences  `_id` lease name; token: a released lease's, written before it is
                      deleted, so the next lease inserted goes on from it.

A marker is inserted before its entry and deleted after the entry leaves QUEUED (claimed,
cancelled, or its link cleared), or at once when the entry's write fails. An enqueue writes the
entry, then its run: a failure between leaves an entry with no run, which the scheduler's next
cycle cancels. A process that dies in between leaves a stale marker: one whose
entry is no longer queued, or (after `mongodb_docs.STALE_MARKER_SECONDS`) was never written,
is taken over by the next writer of that key. A claim is a `find_one_and_update` filtered on
status QUEUED, so of two dispatchers one wins each entry, in due order (an entry without
`scheduled_at` due from `created_at`: two sorted reads merged). The database's clock is the
server's `hello.localTime` (no `$$NOW`: nx rejects update pipelines); a server without it falls
back to this process's clock. The lease fences a fenced storage's writes: a read of
`scheduler_locks` on the server's clock just before each write refuses it when the lease is
lost, and each document the write makes is stamped `fence` with the lease's token, each write
of a stored one conditional on a stamp no higher (`mongodb_docs.Fence`; NOT_LOCK_HOLDER when
it misses for that). So a holder whose read passed just before a takeover cannot overwrite what
its successor wrote; a document the successor has not written yet it still can, within that
round trip. Unfenced writes neither stamp nor check. Without transactions, the opt-out clears
each queued link with its own conditional write; the dispatcher checks the flag again when it
claims an entry.

A lost acknowledgement (the write applied, its reply lost: nx-27017 and a standalone `mongod`
do not retry writes) reaches the caller as unavailable, and the caller writes again; every
write is idempotent or conditional (tests/storage/test_scheduler_mongodb_faults.py). Upserts and
`replace_one` by `_id` (manifests, runs, checkpoints), a decision's insert, a lease's insert or
compare-and-swap are idempotent; a claim, a requeue, a cancel, a release and a resolve are
conditional on the status they change, so a second one finds it changed and is refused. A
key's marker whose entry was never written is the entry's own when that entry is queued again;
an entry written with its reply lost keeps its markers (the next cycle cancels it for the run
it lacks), so the next cycle's entry is refused rather than queued beside it. A release or an
opt-out that clears a link finishes, written again, what a lost one left: the run's link and
the replay marker (`_unlink`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from pymongo import ReturnDocument
from pymongo import errors as mongo
from pymongo.database import Database

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
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.storage.mongodb import MongoStorage
from choreography_ray.storage.scheduler import (
    Enqueued,
    SchedulerStorage,
    fence_error,
    given_up_keys,
    holds,
    in_play,
    kept_resolutions,
    lease_for,
    settle_keys,
)
from choreography_ray.storage.scheduler.mongodb_docs import (
    _AWAITING,
    _INDEXES,
    _QUEUED,
    _T,
    UNFENCED,
    Doc,
    Fence,
    _doc,
    _drop_keys,
    _iso,
    _manifest_id,
    _parse,
    _parse_all,
    _release_lease,
    _released_token,
    _server_now,
    _take_keys,
    _unlink,
)


class MongoSchedulerStorage:
    def __init__(self, storage: MongoStorage) -> None:
        self.storage = storage
        self._indexed = False
        #: (lease name, holder) whose lease every write checks just before it, or None.
        self._fence: tuple[str, str] | None = None

    async def _run(self, operation: Callable[[Database[Doc]], _T]) -> _T:
        def run(db: Database[Doc]) -> _T:
            if not self._indexed:
                for name, indexes in () if self.storage.read_only else _INDEXES.items():
                    for fields in indexes:
                        db[name].create_index([(f, 1) for f in fields.split()])
                self._indexed = True
            return operation(db)

        return await self.storage._run(run)

    async def _write(self, operation: Callable[[Database[Doc], Fence], _T]) -> _T:
        """`operation`, a write of the scheduler's; a fenced storage reads its lease on the
        database's clock just before it, refuses the write when it no longer holds it, and
        writes with the lease's token (`Fence`)."""
        fence = self._fence
        if fence is None:
            return await self._run(lambda db: operation(db, UNFENCED))

        def fenced(db: Database[Doc]) -> _T:
            name, holder = fence
            found = db.scheduler_locks.find_one({"_id": name})
            lease = _parse(SchedulerLease, "scheduler_locks", dict(found) if found else None)
            if lease is None or not holds(lease, holder, _server_now(db)):
                raise fence_error(name, holder, "the write")
            return operation(db, Fence(lease.token, name, holder))

        return await self._run(fenced)

    def fenced(self, name: str, holder: str) -> SchedulerStorage:
        twin = copy.copy(self)
        twin._fence = (name, holder)
        return twin

    async def now(self) -> datetime:
        return await self._run(_server_now)

    # manifests
    async def upsert_manifest(self, manifest: Manifest, stated: Collection[str]) -> Manifest:
        key = _manifest_id(manifest.scope, manifest.name)
        doc = _doc(manifest, key)
        written = DEFINITION | (SETTINGS & set(stated)) | {"updated"}
        change = {
            "$set": {f: doc[f] for f in written},
            "$setOnInsert": {f: v for f, v in doc.items() if f not in written and f != "_id"},
        }

        def upsert(db: Database[Doc], fence: Fence) -> Doc | None:
            fence.replace(db.manifests, key, change)
            return db.manifests.find_one({"_id": key})

        stored = _parse(Manifest, "manifests", await self._write(upsert))
        assert stored is not None
        return stored

    async def get_manifest(self, scope: str, name: str) -> Manifest | None:
        key = _manifest_id(scope, name)
        return _parse(
            Manifest, "manifests", await self._run(lambda db: db.manifests.find_one({"_id": key}))
        )

    async def list_manifests(self, scope: str) -> list[Manifest]:
        docs = await self._run(lambda db: list(db.manifests.find({"scope": scope}).sort("name", 1)))
        return _parse_all(Manifest, "manifests", docs)

    async def manifest_keys(self) -> list[tuple[str, str]]:
        # nx-27017 has no compound `$group` keys: the (few) manifests' two fields are read.
        projection = {"scope": 1, "namespace": 1, "_id": 0}
        docs = await self._run(lambda db: list(db.manifests.find({}, projection)))
        return sorted({(str(d["scope"]), str(d.get("namespace", "default"))) for d in docs})

    async def set_replay_decisions_on_retry(
        self, scope: str, names: Collection[str], value: bool
    ) -> int:
        def write(db: Database[Doc], fence: Fence) -> int:
            ids = [_manifest_id(scope, n) for n in names]
            change = {"$set": fence.mark({"replay_decisions_on_retry": value})}
            db.manifests.update_many(fence.only({"_id": {"$in": ids}}), change)
            fence.check(db.manifests, {"_id": {"$in": ids}})
            if value:
                return 0
            query = {"scope": scope, "status": _QUEUED, "holds_manifest_key": True,
                     "manifest": {"$in": list(names)}}  # fmt: skip
            cleared = 0
            for doc in list(db.work_queue.find(query)):
                only = {"_id": doc["_id"], "status": _QUEUED, "replays": doc.get("replays")}
                change = {"$set": fence.mark({"replays": None})}
                done = doc.get("replays") is not None and bool(
                    db.work_queue.update_one(fence.only(only), change).modified_count
                )
                if doc.get("replays") is not None and not done:
                    fence.check(db.work_queue, {"_id": doc["_id"]})
                cleared += done
                if done or doc.get("replays") is None:  # not when it left the queue meanwhile
                    _unlink(db, doc, done, fence)
            return cleared

        return await self._write(write)

    # work queue
    async def enqueue(
        self,
        entry: WorkEntry,
        run: ManifestRun,
        delay: timedelta = timedelta(0),
        *,
        refuse_resume: bool = False,
    ) -> Enqueued:
        def write(db: Database[Doc], fence: Fence) -> Enqueued:
            now = _server_now(db)
            taken, markers = _take_keys(db, entry, now, fence)
            result = settle_keys(entry, run, taken, refuse_resume)
            if result.entry is None or result.run is None:
                _drop_keys(db, entry.id, markers, fence)
                return result
            queued = result.entry.model_copy(update={
                "status": WorkStatus.QUEUED, "created_at": now, "run_id": result.run.id,
                "scheduled_at": now + delay if delay > timedelta(0) else None,
            })  # fmt: skip
            # The entry first, then its run: a failure between leaves an entry whose run was
            # never written, which the next cycle cancels (a run with no entry would block its
            # manifest). An entry that was not written gives its keys back at once.
            try:
                db.work_queue.insert_one(fence.mark(_doc(queued, queued.id)))
            except Exception:
                # Unless it was written and only its reply lost: then it holds its keys until
                # the next cycle cancels it for the run it names and lacks.
                with contextlib.suppress(Exception):
                    if db.work_queue.find_one({"_id": queued.id}, {"_id": 1}) is None:
                        _drop_keys(db, entry.id, markers, fence)
                raise
            fence.replace(db.runs, run.id, _doc(result.run, run.id))
            return Enqueued(queued, result.run, None, result.replay_dropped, result.resume_dropped)

        return await self._write(write)

    async def claim_due(self, scope: str, limit: int = 100) -> list[WorkEntry]:
        def claim(db: Database[Doc], fence: Fence) -> list[Doc]:
            now = _iso(_server_now(db))
            # In due order, as the other providers: an entry with no `scheduled_at` is due from
            # its `created_at`. Two sorted reads merged (nx-27017 has no `$ifNull` sort key).
            fields = {"_id": 1, "scheduled_at": 1, "created_at": 1}
            queued = {"scope": scope, "status": _QUEUED}
            at_once = db.work_queue.find({**queued, "scheduled_at": None}, fields)
            delayed = db.work_queue.find({**queued, "scheduled_at": {"$ne": None, "$lte": now}},
                                         fields)  # fmt: skip
            found = [*at_once.sort("created_at", 1).limit(limit),
                     *delayed.sort("scheduled_at", 1).limit(limit)]  # fmt: skip
            found.sort(key=lambda d: (d.get("scheduled_at") or d["created_at"], d["created_at"]))
            candidates = found[:limit]
            claimed = []
            for candidate in candidates:
                doc = db.work_queue.find_one_and_update(
                    fence.only({"_id": candidate["_id"], "status": _QUEUED}),
                    {"$set": fence.mark({"status": WorkStatus.DISPATCHED.value,
                                         "dispatched_at": now}),
                     "$inc": {"dispatch_attempts": 1}},
                    return_document=ReturnDocument.AFTER,
                )  # fmt: skip
                if doc is None:
                    fence.check(db.work_queue, {"_id": candidate["_id"]})
                else:
                    _drop_keys(db, candidate["_id"], fence=fence)
                    claimed.append(doc)
            return claimed

        return _parse_all(WorkEntry, "work_queue", await self._write(claim))

    async def release(self, entry_id: str, *, clear_link: bool = False) -> WorkEntry | None:
        def write(db: Database[Doc], fence: Fence) -> Doc | None:
            change: Doc = {"scheduled_at": None}
            if clear_link:
                change["replays"] = None
            before = db.work_queue.find_one_and_update(
                fence.only({"_id": entry_id, "status": _QUEUED}), {"$set": fence.mark(change)}
            )
            if before is None:
                fence.check(db.work_queue, {"_id": entry_id})
                return None
            if clear_link:
                _unlink(db, before, before.get("replays") is not None, fence)
            return db.work_queue.find_one({"_id": entry_id})

        return _parse(WorkEntry, "work_queue", await self._write(write))

    async def requeue_dispatch(
        self, entry_id: str, delay: timedelta, *, count_attempt: bool = True
    ) -> WorkEntry | None:
        def write(db: Database[Doc], fence: Fence) -> Doc | None:
            entry = _parse(WorkEntry, "work_queue", db.work_queue.find_one({"_id": entry_id}))
            if entry is None or entry.status is not WorkStatus.DISPATCHED:
                return None
            now = _server_now(db)
            taken, markers = _take_keys(db, entry, now, fence)
            scheduled = _iso(now + delay) if delay > timedelta(0) else None
            change = {**given_up_keys(taken), "status": _QUEUED, "scheduled_at": scheduled}
            if not count_attempt:  # as read: the claim is the write before this one
                change["dispatch_attempts"] = entry.dispatch_attempts - 1
            only = fence.only({"_id": entry_id, "status": WorkStatus.DISPATCHED.value})
            if not db.work_queue.update_one(only, {"$set": fence.mark(change)}).matched_count:
                _drop_keys(db, entry_id, markers, fence)
                fence.check(db.work_queue, {"_id": entry_id})
                return None
            return db.work_queue.find_one({"_id": entry_id})

        return _parse(WorkEntry, "work_queue", await self._write(write))

    async def cancel_entry(
        self, entry_id: str, run: ManifestRun | None = None, *, claimed: bool = False
    ) -> bool:
        def write(db: Database[Doc], fence: Fence) -> bool:
            only = {"_id": entry_id, "status": WorkStatus.DISPATCHED.value if claimed else _QUEUED}
            change = {"$set": fence.mark({"status": WorkStatus.CANCELLED.value})}
            done = db.work_queue.update_one(fence.only(only), change)
            if not done.matched_count:
                fence.check(db.work_queue, {"_id": entry_id})
                return False
            _drop_keys(db, entry_id, fence=fence)
            if run is not None:  # after the entry: the cycle settles a run left waiting
                fence.replace(db.runs, run.id, _doc(run, run.id))
            return True

        return await self._write(write)

    async def get_entry(self, entry_id: str) -> WorkEntry | None:
        doc = await self._run(lambda db: db.work_queue.find_one({"_id": entry_id}))
        return _parse(WorkEntry, "work_queue", doc)

    async def queued_entries(self, scope: str, manifest: str | None = None) -> list[WorkEntry]:
        query: Doc = {"scope": scope, "status": _QUEUED}
        if manifest is not None:
            query["manifest"] = manifest
        order = [("created_at", 1), ("_id", 1)]
        docs = await self._run(lambda db: list(db.work_queue.find(query).sort(order)))
        return _parse_all(WorkEntry, "work_queue", docs)

    # runs
    async def save_run(self, run: ManifestRun) -> None:
        doc = _doc(run, run.id)
        await self._write(lambda db, fence: fence.replace(db.runs, run.id, doc))

    async def get_run(self, run_id: str) -> ManifestRun | None:
        return _parse(
            ManifestRun, "runs", await self._run(lambda db: db.runs.find_one({"_id": run_id}))
        )

    async def list_runs(
        self, scope: str, manifest: str | None = None, limit: int = 100
    ) -> list[ManifestRun]:
        query: Doc = {"scope": scope}
        if manifest is not None:
            query["manifest"] = manifest
        order = [("queued_at", -1), ("_id", -1)]
        docs = await self._run(lambda db: list(db.runs.find(query).sort(order).limit(limit)))
        return _parse_all(ManifestRun, "runs", docs)

    async def runs_in_play(
        self, scope: str, manifest: str, failed_since: datetime
    ) -> list[ManifestRun]:
        # A superset (a run starts after it is queued), narrowed by `in_play`: on nx-27017 the
        # exact query missed a FAILED run with no `started_at` queued since.
        since = _iso(failed_since)
        unfinished = [s.value for s in RunStatus if not s.is_finished]
        query: Doc = {"scope": scope, "manifest": manifest, "$or": [
            {"status": {"$in": unfinished}}, {"started_at": {"$gte": since}},
            {"queued_at": {"$gte": since}},
        ]}  # fmt: skip
        order = [("queued_at", -1), ("_id", -1)]
        docs = await self._run(lambda db: list(db.runs.find(query).sort(order)))
        return [r for r in _parse_all(ManifestRun, "runs", docs) if in_play(r, failed_since)]

    async def delete_runs(self, run_ids: Collection[str]) -> int:
        ids = list(dict.fromkeys(run_ids))

        def delete(db: Database[Doc], fence: Fence) -> int:
            found = {"_id": {"$in": ids}}
            entries = [d.get("entry_id") for d in db.runs.find(found, {"entry_id": 1})]
            done = {"_id": {"$in": entries}, "status": {"$ne": _QUEUED}}
            db.work_queue.delete_many(fence.only(done))
            db.decisions.delete_many({"run_id": {"$in": ids}})
            db.checkpoints.delete_many(fence.only({"run_id": {"$in": ids}}))
            return int(db.runs.delete_many(fence.only(found)).deleted_count)  # last: cut short

        return await self._write(delete) if ids else 0

    async def runs_replaying(self, run_id: str) -> list[ManifestRun]:
        docs = await self._run(lambda db: list(db.runs.find({"replays": run_id})))
        return _parse_all(ManifestRun, "runs", docs)

    async def run_for_job(self, job_id: str) -> ManifestRun | None:
        doc = await self._run(lambda db: db.runs.find_one({"job_id": job_id}))
        return _parse(ManifestRun, "runs", doc)

    # dead letters
    async def add_dead_letter(self, dead_letter: DeadLetter) -> bool:
        doc = _doc(dead_letter, dead_letter.id)
        key = {"_id": _manifest_id(dead_letter.scope, dead_letter.manifest)}

        def write(db: Database[Doc], fence: Fence) -> bool:
            # The marker first: one awaiting dead letter per manifest. A marker whose dead
            # letter was resolved, or never written, is stale and taken over.
            if dead_letter.status.value != _AWAITING:
                db.dead_letters.insert_one(fence.mark(doc))
                return True
            try:
                db.dead_letter_keys.insert_one(
                    fence.mark({**key, "dead_letter_id": dead_letter.id})
                )
            except mongo.DuplicateKeyError:
                held = db.dead_letter_keys.find_one(key) or {}
                holder = db.dead_letters.find_one({"_id": held.get("dead_letter_id")})
                if holder is not None and holder.get("status") == _AWAITING:
                    return False
                swapped = db.dead_letter_keys.replace_one(
                    fence.only({**key, "dead_letter_id": held.get("dead_letter_id")}),
                    fence.mark({**key, "dead_letter_id": dead_letter.id}),
                )
                if not swapped.matched_count:
                    fence.check(db.dead_letter_keys, key)
                    return False  # another took it over first
            db.dead_letters.insert_one(fence.mark(doc))
            return True

        return await self._write(write)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        doc = await self._run(lambda db: db.dead_letters.find_one({"_id": dead_letter_id}))
        return _parse(DeadLetter, "dead_letters", doc)

    async def list_dead_letters(
        self, scope: str, manifest: str | None = None, status: DeadLetterStatus | None = None
    ) -> list[DeadLetter]:
        query: Doc = {"scope": scope}
        if manifest is not None:
            query["manifest"] = manifest
        if status is not None:
            query["status"] = status.value
        order = [("dead_lettered_at", -1), ("_id", 1)]
        docs = await self._run(lambda db: list(db.dead_letters.find(query).sort(order)))
        return _parse_all(DeadLetter, "dead_letters", docs)

    async def resolve_dead_letter(
        self, dead_letter_id: str, status: DeadLetterStatus, note: str | None = None
    ) -> DeadLetter | None:
        def write(db: Database[Doc], fence: Fence) -> Doc | None:
            change = {"status": status.value, "resolved_at": _iso(_server_now(db)), "note": note}
            resolved = db.dead_letters.find_one_and_update(
                fence.only({"_id": dead_letter_id, "status": _AWAITING}),
                {"$set": fence.mark(change)},
                return_document=ReturnDocument.AFTER,
            )
            if resolved is None:
                fence.check(db.dead_letters, {"_id": dead_letter_id})
            else:
                db.dead_letter_keys.delete_one(fence.only({"dead_letter_id": dead_letter_id}))
            return resolved

        return _parse(DeadLetter, "dead_letters", await self._write(write))

    async def remove_resolved_dead_letters(self, before: datetime) -> int:
        query = {"resolved_at": {"$ne": None, "$lt": _iso(before)}}

        def delete(db: Database[Doc], fence: Fence) -> int:
            # Each manifest's latest resolution of each status stays: read per manifest with
            # an old one (nx-27017 has no compound `$group` keys), then the rest deleted.
            old = _parse_all(DeadLetter, "dead_letters", list(db.dead_letters.find(query)))
            manifests = {(d.scope, d.manifest) for d in old}
            resolved: list[DeadLetter] = []
            for scope, name in manifests:
                found = {"scope": scope, "manifest": name, "resolved_at": {"$ne": None}}
                docs = list(db.dead_letters.find(found))
                resolved += _parse_all(DeadLetter, "dead_letters", docs)
            kept = kept_resolutions(resolved)
            doomed = [d.id for d in old if d.id not in kept]
            if not doomed:
                return 0
            gone = db.dead_letters.delete_many(fence.only({"_id": {"$in": doomed}}))
            return int(gone.deleted_count)

        return await self._write(delete)

    # decisions and checkpoints
    async def record_decision(self, decision: Decision) -> Decision:
        key = f"{decision.run_id}/{decision.key}"

        def write(db: Database[Doc]) -> Doc | None:
            # The first answer for the key stays.
            with contextlib.suppress(mongo.DuplicateKeyError):
                db.decisions.insert_one(_doc(decision, key))
            return db.decisions.find_one({"_id": key})

        stored = _parse(Decision, "decisions", await self._run(write))
        assert stored is not None
        return stored

    async def list_decisions(self, run_id: str) -> list[Decision]:
        docs = await self._run(
            lambda db: list(db.decisions.find({"run_id": run_id}).sort("_id", 1))
        )
        return _parse_all(Decision, "decisions", docs)

    async def count_decisions(self, run_id: str) -> int:
        return int(await self._run(lambda db: db.decisions.count_documents({"run_id": run_id})))

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        key = f"{checkpoint.run_id}/{checkpoint.stage}"
        doc = _doc(checkpoint, key)
        await self._write(lambda db, fence: fence.replace(db.checkpoints, key, doc))

    async def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        docs = await self._run(
            lambda db: list(db.checkpoints.find({"run_id": run_id}).sort("stage", 1))
        )
        return _parse_all(Checkpoint, "checkpoints", docs)

    # the scope's lock
    async def acquire_lease(self, name: str, holder: str, ttl: timedelta) -> SchedulerLease | None:
        def write(db: Database[Doc]) -> Doc | None:
            found = db.scheduler_locks.find_one({"_id": name})
            stored = _parse(SchedulerLease, "scheduler_locks", dict(found) if found else None)
            floor = 0 if found else _released_token(db, name)
            lease = lease_for(stored, name, holder, ttl, _server_now(db), floor=floor)
            if lease is None:
                return None
            doc = _doc(lease, name)
            if found is None:
                try:
                    db.scheduler_locks.insert_one(doc)
                except mongo.DuplicateKeyError:
                    return None  # another holder took it first
                return doc
            swapped = db.scheduler_locks.replace_one(
                {"_id": name, "holder": found["holder"], "expires_at": found["expires_at"]}, doc
            )
            return doc if swapped.matched_count == 1 else None

        return _parse(SchedulerLease, "scheduler_locks", await self._run(write))

    async def release_lease(self, name: str, holder: str) -> bool:
        return await self._run(lambda db: _release_lease(db, name, holder))

    async def get_lease(self, name: str) -> SchedulerLease | None:
        doc = await self._run(lambda db: db.scheduler_locks.find_one({"_id": name}))
        return _parse(SchedulerLease, "scheduler_locks", doc)
