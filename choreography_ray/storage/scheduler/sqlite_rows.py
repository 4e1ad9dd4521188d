"""The SQLite scheduler tables' layout and the row helpers of `sqlite.py` (which documents
the layout): each runs on the connection inside the caller's transaction."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from choreography_ray.errors import CorruptRecordError
from choreography_ray.logs import get_logger
from choreography_ray.model import check_schema_version
from choreography_ray.scheduler.records import (
    DeadLetter,
    ManifestRun,
    SchedulerLease,
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.storage.scheduler import (
    QueueKey,
    entry_keys,
    fence_error,
    holds,
)

log = get_logger(__name__)

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

_LAYOUT = """
CREATE TABLE IF NOT EXISTS manifests (
    scope TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (scope, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS work_queue (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, manifest TEXT NOT NULL, status TEXT NOT NULL,
    holds_manifest_key INTEGER NOT NULL, replays TEXT, resume_from TEXT, scheduled_at TEXT,
    created_at TEXT NOT NULL, doc TEXT NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS work_queue_unique_queued_manifest ON work_queue (scope, manifest)
    WHERE status = 'Queued' AND holds_manifest_key = 1;
CREATE UNIQUE INDEX IF NOT EXISTS work_queue_unique_queued_replay ON work_queue (replays)
    WHERE status = 'Queued' AND replays IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS work_queue_unique_queued_resume ON work_queue (resume_from)
    WHERE status = 'Queued' AND resume_from IS NOT NULL;
CREATE INDEX IF NOT EXISTS work_queue_due ON work_queue (scope, status, scheduled_at);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, manifest TEXT NOT NULL, status TEXT NOT NULL,
    replays TEXT, queued_at TEXT NOT NULL, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_manifest ON runs (scope, manifest, queued_at);
CREATE INDEX IF NOT EXISTS runs_scope ON runs (scope, queued_at);
CREATE INDEX IF NOT EXISTS runs_replays ON runs (replays);
CREATE INDEX IF NOT EXISTS runs_status ON runs (scope, manifest, status);
CREATE INDEX IF NOT EXISTS runs_job ON runs (json_extract(doc, '$.job_id'));
CREATE TABLE IF NOT EXISTS dead_letters (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, manifest TEXT NOT NULL, status TEXT NOT NULL,
    dead_lettered_at TEXT NOT NULL, resolved_at TEXT, doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS dead_letters_manifest ON dead_letters (scope, manifest, status);
CREATE INDEX IF NOT EXISTS dead_letters_resolved ON dead_letters (status, resolved_at);
CREATE TABLE IF NOT EXISTS decisions (
    run_id TEXT NOT NULL, key TEXT NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (run_id, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, stage INTEGER NOT NULL, doc TEXT NOT NULL,
    PRIMARY KEY (run_id, stage)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scheduler_locks (
    name TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
"""
#: The database's clock plus a delay (`?`: an SQLite modifier such as '+2.5 seconds').
_NOW = "SELECT strftime('%Y-%m-%dT%H:%M:%f', 'now', ?) || '000+00:00'"
_QUEUED = WorkStatus.QUEUED.value
#: Ids per statement of a delete (SQLite's default limit of bound parameters is 999).
_BATCH = 500
_AWAITING = DeadLetterStatus.AWAITING_INTERVENTION.value
#: One dead letter per manifest awaits intervention (created apart: an older file may hold two).
_ONE_AWAITING = f"""CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_unique_awaiting ON
    dead_letters (scope, manifest) WHERE status = '{_AWAITING}'"""
_UNFINISHED = ", ".join(f"'{s.value}'" for s in RunStatus if not s.is_finished)
#: The expression the `runs_job` index is on: a query must name it exactly to use the index.
_RUN_JOB = "json_extract(doc, '$.job_id')"
_ENTRY_COLUMNS = "id, scope, manifest, status, holds_manifest_key, replays, resume_from, " \
    "scheduled_at, created_at, doc"  # fmt: skip
#: Whether another queued entry holds a key, per key.
_HELD = {
    QueueKey.MANIFEST: "holds_manifest_key = 1 AND scope || '/' || manifest = ?",
    QueueKey.REPLAY: "replays = ?",
    QueueKey.RESUME: "resume_from = ?",
}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat(timespec="microseconds")


def _db_now(c: sqlite3.Connection, delay: timedelta = timedelta(0)) -> datetime:
    (text,) = c.execute(_NOW, (f"+{delay.total_seconds():.6f} seconds",)).fetchone()
    return datetime.fromisoformat(text)


def _parse(model: type[_M], table: str, key: str, doc: str) -> _M:
    try:
        record = model.model_validate_json(doc)
    except ValidationError as exc:
        raise CorruptRecordError(table, key, str(exc)) from exc
    check_schema_version(table, key, getattr(record, "schema_version", None))
    return record


def _entry_row(e: WorkEntry) -> tuple[Any, ...]:
    return (e.id, e.scope, e.manifest, e.status.value, int(e.holds_manifest_key), e.replays,
            e.resume_from, _iso(e.scheduled_at), _iso(e.created_at),
            e.model_dump_json())  # fmt: skip


def _insert_entry(c: sqlite3.Connection, e: WorkEntry) -> None:
    c.execute(f"INSERT INTO work_queue ({_ENTRY_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
              _entry_row(e))  # fmt: skip


def _update_entry(c: sqlite3.Connection, e: WorkEntry) -> None:
    columns = _ENTRY_COLUMNS.split(", ")[1:]
    sql = f"UPDATE work_queue SET {', '.join(f'{n} = ?' for n in columns)} WHERE id = ?"
    c.execute(sql, (*_entry_row(e)[1:], e.id))


def _save_run(c: sqlite3.Connection, r: ManifestRun) -> None:
    c.execute(
        """INSERT INTO runs (id, scope, manifest, status, replays, queued_at, doc)
        VALUES (?,?,?,?,?,?,?) ON CONFLICT (id) DO UPDATE SET status = excluded.status,
        replays = excluded.replays, queued_at = excluded.queued_at, doc = excluded.doc""",
        (r.id, r.scope, r.manifest, r.status.value, r.replays, _iso(r.queued_at),
         r.model_dump_json()),
    )  # fmt: skip


def _taken(c: sqlite3.Connection, entry: WorkEntry, besides: str = "") -> set[QueueKey]:
    taken = set()
    for kind, value in entry_keys(entry).items():
        sql = f"SELECT 1 FROM work_queue WHERE status = ? AND id != ? AND {_HELD[kind]}"
        if c.execute(sql, (_QUEUED, besides, value)).fetchone():
            taken.add(kind)
    return taken


def _check_fence(c: sqlite3.Connection, name: str, holder: str) -> None:
    row = c.execute("SELECT doc FROM scheduler_locks WHERE name = ?", (name,)).fetchone()
    lease = None if row is None else _parse(SchedulerLease, "scheduler_locks", name, row[0])
    if not holds(lease, holder, _db_now(c)):
        raise fence_error(name, holder, "the write")


def _lay_out(c: sqlite3.Connection) -> None:
    for statement in filter(str.strip, _LAYOUT.split(";")):
        c.execute(statement)
    try:
        c.execute(_ONE_AWAITING)
    except sqlite3.IntegrityError:  # a file written before it, with two awaiting: checked anyway
        log.warning("dead_letters: two dead letters of one manifest await intervention; the "
                    "unique index waits until one is resolved")  # fmt: skip


def _unlink(c: sqlite3.Connection, entry: WorkEntry) -> WorkEntry:
    """The entry and its run without their replay link (the entry row is written by the caller
    or here)."""
    entry = entry.model_copy(update={"replays": None})
    _update_entry(c, entry)
    row = c.execute("SELECT doc FROM runs WHERE id = ?", (entry.run_id,)).fetchone()
    if row is not None:
        run = _parse(ManifestRun, "runs", entry.run_id, row[0])
        _save_run(c, run.model_copy(update={"replays": None}))
    return entry


def _save_dead_letter(c: sqlite3.Connection, d: DeadLetter) -> None:
    c.execute(
        """INSERT OR REPLACE INTO dead_letters
        (id, scope, manifest, status, dead_lettered_at, resolved_at, doc) VALUES (?,?,?,?,?,?,?)""",
        (d.id, d.scope, d.manifest, d.status.value, _iso(d.dead_lettered_at),
         _iso(d.resolved_at), d.model_dump_json()),
    )  # fmt: skip
