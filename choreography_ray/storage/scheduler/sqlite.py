"""The scheduler's tables in the SQLite provider's file, on its connection and thread.

Each table holds the record's JSON (`doc`, the truth) beside the columns it is found by::

    manifests       WITHOUT ROWID. PRIMARY KEY (scope, name), doc.
    work_queue      id TEXT PRIMARY KEY, scope, manifest, status, holds_manifest_key,
                    replays, resume_from, scheduled_at, created_at, doc. Unique partial
                    indexes, WHERE status = 'Queued': (scope, manifest) AND holds_manifest_key
                    = 1; (replays) AND replays IS NOT NULL; (resume_from) AND resume_from IS
                    NOT NULL. Index (scope, status, scheduled_at).
    runs            id TEXT PRIMARY KEY, scope, manifest, status, replays, queued_at, doc.
                    Indexes (scope, manifest, queued_at), (scope, queued_at), (replays),
                    (scope, manifest, status) (`runs_in_play`), and on the expression
                    `json_extract(doc, '$.job_id')` (`run_for_job`: an expression index, so
                    a file laid out before it needs no new column).
    dead_letters    id TEXT PRIMARY KEY, scope, manifest, status, dead_lettered_at,
                    resolved_at, doc. Indexes (scope, manifest, status), (status, resolved_at);
                    unique partial index (scope, manifest) WHERE status is
                    'AwaitingIntervention': one awaiting dead letter per manifest.
    decisions       WITHOUT ROWID. PRIMARY KEY (run_id, key), doc.
    checkpoints     WITHOUT ROWID. PRIMARY KEY (run_id, stage), doc.
    scheduler_locks WITHOUT ROWID. name TEXT PRIMARY KEY, doc: read and written in one
                    BEGIN IMMEDIATE transaction, so two holders cannot both take it.

The tables are created on first use with `CREATE ... IF NOT EXISTS`, so a file of an older
release (without them) opens as before and gains them; a storage opened read-only creates none,
and reads a missing table as empty. Times in columns are UTC ISO-8601 with
microseconds, which sort as the instants do. The database's clock is SQLite's own `'now'` read
in the statement's transaction (`scheduled_at` = `strftime(..., 'now', '+N seconds')`). Every
write is one `BEGIN IMMEDIATE` transaction: it holds the file's write lock from its first read,
so the checks of the unique keys and a claim's read-then-update cannot interleave with another
connection's; the unique indexes are the backstop.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta

from choreography_ray.logs import get_logger
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    SchedulerLease,
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.storage.scheduler import (
    Enqueued,
    SchedulerStorage,
    given_up_keys,
    lease_for,
    merge_manifest,
    settle_keys,
)
from choreography_ray.storage.scheduler.sqlite_rows import (
    _AWAITING,
    _BATCH,
    _LAYOUT,
    _M,
    _QUEUED,
    _RUN_JOB,
    _T,
    _UNFINISHED,
    _check_fence,
    _db_now,
    _insert_entry,
    _iso,
    _lay_out,
    _parse,
    _save_dead_letter,
    _save_run,
    _taken,
    _unlink,
    _update_entry,
)
from choreography_ray.storage.sqlite import SqliteStorage
from choreography_ray.storage.sqlite_schema import shadow_missing

log = get_logger(__name__)


class SqliteSchedulerStorage:
    def __init__(self, storage: SqliteStorage) -> None:
        self.storage = storage
        self._laid_out = False
        #: (lease name, holder) whose lease every write checks in its transaction, or None.
        self._fence: tuple[str, str] | None = None

    def fenced(self, name: str, holder: str) -> SchedulerStorage:
        twin = copy.copy(self)
        twin._fence = (name, holder)
        return twin

    async def _ready(self) -> None:
        if not self._laid_out:
            if self.storage.read_only:
                # Nothing is created: missing tables read as empty (see `shadow_missing`).
                await self.storage._run(lambda c: shadow_missing(c, _LAYOUT))
            else:
                await self.storage._write(_lay_out)
            self._laid_out = True

    async def _transact(
        self, work: Callable[[sqlite3.Connection], _T], *, fence: bool = True
    ) -> _T:
        """`work` in one BEGIN IMMEDIATE transaction; its result. A fenced storage checks its
        lease first in the same transaction (`fence`: the lease's own writes do not)."""
        await self._ready()
        out: list[_T] = []
        fenced = self._fence if fence else None

        def transaction(c: sqlite3.Connection) -> None:
            if fenced is not None:
                _check_fence(c, *fenced)
            out.append(work(c))

        await self.storage._write(transaction)
        return out[0]

    async def _docs(self, sql: str, *args: object) -> list[tuple[str, str]]:
        """(key, doc) rows."""
        await self._ready()
        return [(str(k), str(d)) for k, d in await self.storage._query(sql, *args)]

    async def _find(
        self, model: type[_M], table: str, order: str = "id", limit: int = -1, **equal: object
    ) -> list[_M]:
        """The records whose columns equal `equal` (None values are left out of the filter)."""
        given = {column: value for column, value in equal.items() if value is not None}
        where = " AND ".join(f"{column} = ?" for column in given) or "1"
        sql = f"SELECT id, doc FROM {table} WHERE {where} ORDER BY {order} LIMIT ?"
        return self._parsed(model, table, await self._docs(sql, *given.values(), limit))

    async def now(self) -> datetime:
        # A read outside any write transaction: reading the clock takes no write lock.
        await self._ready()
        return await self.storage._run(_db_now)

    # manifests
    async def upsert_manifest(self, manifest: Manifest, stated: Collection[str]) -> Manifest:
        def upsert(c: sqlite3.Connection) -> Manifest:
            row = c.execute("SELECT doc FROM manifests WHERE scope = ? AND name = ?",
                            (manifest.scope, manifest.name)).fetchone()  # fmt: skip
            old = None if row is None else _parse(Manifest, "manifests", manifest.name, row[0])
            stored = merge_manifest(old, manifest, stated)
            c.execute("INSERT OR REPLACE INTO manifests (scope, name, doc) VALUES (?, ?, ?)",
                      (stored.scope, stored.name, stored.model_dump_json()))  # fmt: skip
            return stored

        return await self._transact(upsert)

    async def get_manifest(self, scope: str, name: str) -> Manifest | None:
        sql = "SELECT name, doc FROM manifests WHERE scope = ? AND name = ?"
        return next(
            iter(self._parsed(Manifest, "manifests", await self._docs(sql, scope, name))), None
        )

    async def list_manifests(self, scope: str) -> list[Manifest]:
        sql = "SELECT name, doc FROM manifests WHERE scope = ? ORDER BY name"
        return self._parsed(Manifest, "manifests", await self._docs(sql, scope))

    async def manifest_keys(self) -> list[tuple[str, str]]:
        await self._ready()
        rows = await self.storage._query(
            "SELECT DISTINCT scope, json_extract(doc, '$.namespace') FROM manifests ORDER BY 1, 2"
        )
        return [(str(scope), str(namespace)) for scope, namespace in rows]

    @staticmethod
    def _parsed(model: type[_M], table: str, rows: Sequence[tuple[str, str]]) -> list[_M]:
        return [_parse(model, table, key, doc) for key, doc in rows]

    async def set_replay_decisions_on_retry(
        self, scope: str, names: Collection[str], value: bool
    ) -> int:
        def write(c: sqlite3.Connection) -> int:
            for name in names:
                c.execute(
                    """UPDATE manifests SET doc = json_set(doc, '$.replay_decisions_on_retry',
                    json(?)) WHERE scope = ? AND name = ?""",
                    ("true" if value else "false", scope, name),
                )
            if value:
                return 0
            marks = ", ".join("?" * len(names))
            rows = c.execute(
                f"""SELECT id, doc FROM work_queue WHERE status = ? AND scope = ?
                AND holds_manifest_key = 1 AND replays IS NOT NULL AND manifest IN ({marks})""",
                (_QUEUED, scope, *names),
            ).fetchall()
            for key, doc in rows:
                _unlink(c, _parse(WorkEntry, "work_queue", key, doc))
            return len(rows)

        return await self._transact(write)

    # work queue
    async def enqueue(
        self,
        entry: WorkEntry,
        run: ManifestRun,
        delay: timedelta = timedelta(0),
        *,
        refuse_resume: bool = False,
    ) -> Enqueued:
        def write(c: sqlite3.Connection) -> Enqueued:
            result = settle_keys(entry, run, _taken(c, entry), refuse_resume)
            if result.entry is None or result.run is None:
                return result
            scheduled = _db_now(c, delay) if delay > timedelta(0) else None
            queued = result.entry.model_copy(update={
                "status": WorkStatus.QUEUED, "created_at": _db_now(c), "scheduled_at": scheduled,
                "run_id": result.run.id,
            })  # fmt: skip
            _insert_entry(c, queued)
            _save_run(c, result.run)
            return Enqueued(queued, result.run, None, result.replay_dropped, result.resume_dropped)

        return await self._transact(write)

    async def claim_due(self, scope: str, limit: int = 100) -> list[WorkEntry]:
        def claim(c: sqlite3.Connection) -> list[WorkEntry]:
            now = _db_now(c)
            rows = c.execute(
                """SELECT id, doc FROM work_queue WHERE scope = ? AND status = ?
                AND (scheduled_at IS NULL OR scheduled_at <= ?)
                ORDER BY COALESCE(scheduled_at, created_at), created_at LIMIT ?""",
                (scope, _QUEUED, _iso(now), limit),
            ).fetchall()
            claimed = []
            for key, doc in rows:
                entry = _parse(WorkEntry, "work_queue", key, doc)
                claimed.append(entry.model_copy(update={
                    "status": WorkStatus.DISPATCHED, "dispatched_at": now,
                    "dispatch_attempts": entry.dispatch_attempts + 1,
                }))  # fmt: skip
                _update_entry(c, claimed[-1])
            return claimed

        return await self._transact(claim)

    def _change(
        self,
        entry_id: str,
        status: WorkStatus,
        change: Callable[[sqlite3.Connection, WorkEntry], WorkEntry],
    ) -> Callable[[sqlite3.Connection], WorkEntry | None]:
        """A write that changes the entry with `change` while it has `status`."""

        def write(c: sqlite3.Connection) -> WorkEntry | None:
            row = c.execute("SELECT doc FROM work_queue WHERE id = ?", (entry_id,)).fetchone()
            entry = None if row is None else _parse(WorkEntry, "work_queue", entry_id, row[0])
            if entry is None or entry.status is not status:
                return None
            changed = change(c, entry)
            _update_entry(c, changed)
            return changed

        return write

    async def release(self, entry_id: str, *, clear_link: bool = False) -> WorkEntry | None:
        def change(c: sqlite3.Connection, entry: WorkEntry) -> WorkEntry:
            if clear_link and entry.replays is not None:
                entry = _unlink(c, entry)
            return entry.model_copy(update={"scheduled_at": None})

        return await self._transact(self._change(entry_id, WorkStatus.QUEUED, change))

    async def requeue_dispatch(
        self, entry_id: str, delay: timedelta, *, count_attempt: bool = True
    ) -> WorkEntry | None:
        def change(c: sqlite3.Connection, entry: WorkEntry) -> WorkEntry:
            update = given_up_keys(_taken(c, entry, besides=entry_id))
            scheduled = _db_now(c, delay) if delay > timedelta(0) else None
            attempts = entry.dispatch_attempts - (0 if count_attempt else 1)
            return entry.model_copy(update={**update, "status": WorkStatus.QUEUED,
                                            "scheduled_at": scheduled,
                                            "dispatch_attempts": attempts})  # fmt: skip

        return await self._transact(self._change(entry_id, WorkStatus.DISPATCHED, change))

    async def cancel_entry(
        self, entry_id: str, run: ManifestRun | None = None, *, claimed: bool = False
    ) -> bool:
        def change(c: sqlite3.Connection, entry: WorkEntry) -> WorkEntry:
            if run is not None:
                _save_run(c, run)
            return entry.model_copy(update={"status": WorkStatus.CANCELLED})

        wanted = WorkStatus.DISPATCHED if claimed else WorkStatus.QUEUED
        return await self._transact(self._change(entry_id, wanted, change)) is not None

    async def get_entry(self, entry_id: str) -> WorkEntry | None:
        return next(iter(await self._find(WorkEntry, "work_queue", id=entry_id)), None)

    async def queued_entries(self, scope: str, manifest: str | None = None) -> list[WorkEntry]:
        return await self._find(WorkEntry, "work_queue", "created_at, id", scope=scope,
                                status=_QUEUED, manifest=manifest)  # fmt: skip

    # runs
    async def save_run(self, run: ManifestRun) -> None:
        await self._transact(lambda c: _save_run(c, run))

    async def get_run(self, run_id: str) -> ManifestRun | None:
        return next(iter(await self._find(ManifestRun, "runs", id=run_id)), None)

    async def list_runs(
        self, scope: str, manifest: str | None = None, limit: int = 100
    ) -> list[ManifestRun]:
        order = "queued_at DESC, id DESC"
        return await self._find(ManifestRun, "runs", order, limit, scope=scope, manifest=manifest)

    async def runs_in_play(
        self, scope: str, manifest: str, failed_since: datetime
    ) -> list[ManifestRun]:
        # A run counts from its start, or (never started) from when it was queued.
        sql = f"""SELECT id, doc FROM runs WHERE scope = ? AND manifest = ? AND (status IN
            ({_UNFINISHED}) OR (status = ? AND julianday(COALESCE(json_extract(doc,
            '$.started_at'), queued_at)) >= julianday(?))) ORDER BY queued_at DESC, id DESC"""
        rows = await self._docs(sql, scope, manifest, RunStatus.FAILED.value, _iso(failed_since))
        return self._parsed(ManifestRun, "runs", rows)

    async def delete_runs(self, run_ids: Collection[str]) -> int:
        ids = list(dict.fromkeys(run_ids))

        def delete(c: sqlite3.Connection) -> int:
            deleted = 0
            for at in range(0, len(ids), _BATCH):
                batch = ids[at : at + _BATCH]
                marks = ", ".join("?" * len(batch))
                c.execute(f"""DELETE FROM work_queue WHERE status != ? AND id IN (SELECT
                    json_extract(doc, '$.entry_id') FROM runs WHERE id IN ({marks}))""",
                          (_QUEUED, *batch))  # fmt: skip
                for table in ("decisions", "checkpoints"):
                    c.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", batch)
                deleted += c.execute(f"DELETE FROM runs WHERE id IN ({marks})", batch).rowcount
            return deleted

        return await self._transact(delete)

    async def runs_replaying(self, run_id: str) -> list[ManifestRun]:
        return await self._find(ManifestRun, "runs", replays=run_id)

    async def run_for_job(self, job_id: str) -> ManifestRun | None:
        sql = f"SELECT id, doc FROM runs WHERE {_RUN_JOB} = ? LIMIT 1"
        return next(iter(self._parsed(ManifestRun, "runs", await self._docs(sql, job_id))), None)

    # dead letters
    async def add_dead_letter(self, dead_letter: DeadLetter) -> bool:
        def add(c: sqlite3.Connection) -> bool:
            # Checked in the write's transaction; the unique index is the backstop.
            awaiting = c.execute(
                "SELECT 1 FROM dead_letters WHERE scope = ? AND manifest = ? AND status = ?",
                (dead_letter.scope, dead_letter.manifest, _AWAITING),
            ).fetchone()
            if awaiting is not None and dead_letter.status.value == _AWAITING:
                return False
            _save_dead_letter(c, dead_letter)
            return True

        return await self._transact(add)

    async def get_dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        return next(iter(await self._find(DeadLetter, "dead_letters", id=dead_letter_id)), None)

    async def list_dead_letters(
        self, scope: str, manifest: str | None = None, status: DeadLetterStatus | None = None
    ) -> list[DeadLetter]:
        return await self._find(DeadLetter, "dead_letters", "dead_lettered_at DESC, id",
                                scope=scope, manifest=manifest,
                                status=None if status is None else status.value)  # fmt: skip

    async def resolve_dead_letter(
        self, dead_letter_id: str, status: DeadLetterStatus, note: str | None = None
    ) -> DeadLetter | None:
        def write(c: sqlite3.Connection) -> DeadLetter | None:
            row = c.execute("SELECT doc FROM dead_letters WHERE id = ?", (dead_letter_id,))
            found = row.fetchone()
            if found is None:
                return None
            letter = _parse(DeadLetter, "dead_letters", dead_letter_id, found[0])
            if letter.status.is_resolved:
                return None
            update = {"status": status, "resolved_at": _db_now(c), "note": note}
            letter = letter.model_copy(update=update)
            _save_dead_letter(c, letter)
            return letter

        return await self._transact(write)

    async def remove_resolved_dead_letters(self, before: datetime) -> int:
        def delete(c: sqlite3.Connection) -> int:
            # Each manifest's latest resolution of each status stays (`kept_resolutions`).
            sql = """DELETE FROM dead_letters WHERE resolved_at IS NOT NULL AND resolved_at < ?
                AND id NOT IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY
                scope, manifest, status ORDER BY resolved_at DESC, id DESC) AS n FROM
                dead_letters WHERE resolved_at IS NOT NULL) WHERE n = 1)"""
            return int(c.execute(sql, (_iso(before),)).rowcount)

        return await self._transact(delete)

    # decisions and checkpoints
    async def record_decision(self, decision: Decision) -> Decision:
        def write(c: sqlite3.Connection) -> str:
            c.execute("INSERT OR IGNORE INTO decisions (run_id, key, doc) VALUES (?, ?, ?)",
                      (decision.run_id, decision.key, decision.model_dump_json()))  # fmt: skip
            sql = "SELECT doc FROM decisions WHERE run_id = ? AND key = ?"
            return str(c.execute(sql, (decision.run_id, decision.key)).fetchone()[0])

        record = await self._transact(write, fence=False)  # a step host's, not the scheduler's
        return _parse(Decision, "decisions", decision.key, record)

    async def list_decisions(self, run_id: str) -> list[Decision]:
        rows = await self._docs(
            "SELECT key, doc FROM decisions WHERE run_id = ? ORDER BY key", run_id
        )
        return self._parsed(Decision, "decisions", rows)

    async def count_decisions(self, run_id: str) -> int:
        await self._ready()
        rows = await self.storage._query("SELECT COUNT(*) FROM decisions WHERE run_id = ?", run_id)
        return int(rows[0][0])

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        sql = "INSERT OR REPLACE INTO checkpoints (run_id, stage, doc) VALUES (?, ?, ?)"
        row = (checkpoint.run_id, checkpoint.stage, checkpoint.model_dump_json())
        await self._transact(lambda c: c.execute(sql, row) and None)

    async def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        sql = "SELECT run_id || '/' || stage, doc FROM checkpoints WHERE run_id = ? ORDER BY stage"
        return self._parsed(Checkpoint, "checkpoints", await self._docs(sql, run_id))

    # the scope's lock
    async def acquire_lease(self, name: str, holder: str, ttl: timedelta) -> SchedulerLease | None:
        def write(c: sqlite3.Connection) -> SchedulerLease | None:
            row = c.execute("SELECT doc FROM scheduler_locks WHERE name = ?", (name,)).fetchone()
            stored = None if row is None else _parse(SchedulerLease, "scheduler_locks", name,
                                                     row[0])  # fmt: skip
            lease = lease_for(stored, name, holder, ttl, _db_now(c))
            if lease is not None:
                c.execute("INSERT OR REPLACE INTO scheduler_locks (name, doc) VALUES (?, ?)",
                          (name, lease.model_dump_json()))  # fmt: skip
            return lease

        return await self._transact(write, fence=False)

    async def release_lease(self, name: str, holder: str) -> bool:
        def delete(c: sqlite3.Connection) -> bool:
            sql = "DELETE FROM scheduler_locks WHERE name = ? AND json_extract(doc, '$.holder') = ?"
            return int(c.execute(sql, (name, holder)).rowcount) == 1

        return await self._transact(delete, fence=False)

    async def get_lease(self, name: str) -> SchedulerLease | None:
        rows = await self._docs("SELECT name, doc FROM scheduler_locks WHERE name = ?", name)
        return next(iter(self._parsed(SchedulerLease, "scheduler_locks", rows)), None)
