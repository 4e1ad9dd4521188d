"""The SQLite provider's layout: its tables and indexes, what opening a file creates, and how a
read-only connection reads a file of an older release (`storage/sqlite.py` is the provider).

Layout (JSON columns hold pydantic's JSON of the field)::

    jobs                rowid table. id TEXT PRIMARY KEY, scope, namespace, type, status, stage,
                        progress JSON, request JSON, status_changes JSON, has_plan,
                        stop_finalized, records_counted_steps, error, created (ISO-8601, UTC),
                        version, schema_version, resume_after JSON or NULL, held, priority,
                        fairness_key ('' on a row of an older release: the namespace),
                        status_since (fixed-width UTC ISO-8601: written with every save, never
                        read back).
                        Indexes: (scope, namespace, status): `list_unsettled_jobs` reads
                        one range per status; (status, stop_finalized),
                        (scope, namespace, status, status_since, id) for the cleanup query,
                        which reads one index range per status, each in age order, merged;
                        (created, id): `find_jobs` reads a page newest first along it.
    job_steps           WITHOUT ROWID. PRIMARY KEY (job_id, step_id); type, stage, status,
                        attempt, lease JSON {silo, activation, heartbeat} or NULL, is_prepared,
                        request JSON, status_changes JSON array, updated (ISO-8601),
                        schema_version, failure_signature (a failed step's, else NULL).
                        Indexes: (job_id, status), (job_id, stage, status); both end in step_id
                        (the key), so a page of one status is read in step-id order. (job_id,
                        failure_signature), partial (the failed steps): the failures' grouping
                        and a cluster's pages.
    job_numbers         job_no INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE: the small
                        number that stands for a job id in job_counted_steps. AUTOINCREMENT never
                        reuses a number, so a later job cannot inherit a removed job's records.
    job_counted_steps   WITHOUT ROWID. PRIMARY KEY (job_no, kind, step_id), kind 0 = completed,
                        1 = stopped: about 10 bytes plus the step id per record (22 for a
                        12-character id), and one B-tree insert per record whatever the job's
                        size. `remove_job_counted` and `remove_job_outputs` delete the job's
                        job_numbers row once neither table has rows of it.
    job_outputs         WITHOUT ROWID. PRIMARY KEY (job_no, step_id) (job_no: the job's
                        `job_numbers` row, as for the counted steps); stage, attempt, output
                        (the JSON text as the step host wrote it). Rows are stored in step-id
                        order: a page, or a Dataset read task's range, is read in sequence.
                        `remove_job_outputs` deletes the job's rows (`sqlite_outputs.py` has
                        the statements).
    jobs_manager_keys   WITHOUT ROWID. PRIMARY KEY (scope, namespace).

Opening a file creates what is missing, in one transaction: the tables (a file of a release before
`job_outputs` gets it, empty), then the columns a file of an older release lacks (`has_plan`,
`stop_finalized`, `records_counted_steps`, `error`, `version`, `schema_version`, `resume_after`,
`held`, `status_since`, `priority` and `fairness_key` of `jobs`; `attempt`, `lease`, `is_prepared`,
`schema_version` and `failure_signature` of `job_steps`), each with the default its field reads as
(`schema_version` 1; `priority` 3; `fairness_key` '', read as the namespace; `has_plan` 1 for a job
whose progress has totals, which are written with the plan; `status_since` from each row's status
history), then the indexes. A row an older release writes into a newer file has no `status_since`
(NULL) and is no cleanup candidate until this release saves it; it gets the same `priority` and
`fairness_key` defaults. Every row is written with this release's `SCHEMA_VERSION`; a row of a newer
one is refused with `UnsupportedSchemaError` before it is parsed.

A storage opened with `read_only` (`open_storage(url, read_only=True)`: the CLI's read-only
commands) creates nothing: a missing file is `StorageUnavailableError` (no file or directory is
made), an existing one is opened with SQLite's `mode=ro`, and what its layout lacks (a table, or
a column of an older release) is shadowed in the connection's in-memory `temp` schema, which
SQLite searches before the file's: an empty temp table for a missing table, a temp view that
adds a missing column with its default. So it reads a file of any release as the upgrade would,
without the upgrade. SQLite itself may create the `-wal` and `-shm` files beside a WAL database,
as every reader of one does; they belong to the database and hold nothing of their own.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import datetime

from choreography_ray.core.sharing import DEFAULT_PRIORITY
from choreography_ray.model import FIRST_SCHEMA_VERSION
from choreography_ray.storage import utc_text

TABLES = f"""
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, namespace TEXT NOT NULL, type TEXT NOT NULL,
    status TEXT NOT NULL, stage INTEGER NOT NULL, progress TEXT NOT NULL, request TEXT NOT NULL,
    status_changes TEXT NOT NULL, has_plan INTEGER NOT NULL, stop_finalized INTEGER NOT NULL,
    records_counted_steps INTEGER NOT NULL, error TEXT, created TEXT NOT NULL,
    version INTEGER NOT NULL, schema_version INTEGER NOT NULL, resume_after TEXT,
    held INTEGER NOT NULL DEFAULT 0, status_since TEXT,
    priority INTEGER NOT NULL DEFAULT {DEFAULT_PRIORITY}, fairness_key TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS job_steps (
    job_id TEXT NOT NULL, step_id TEXT NOT NULL, type TEXT NOT NULL, stage INTEGER NOT NULL,
    status TEXT NOT NULL, attempt INTEGER NOT NULL, lease TEXT, is_prepared INTEGER NOT NULL,
    request TEXT NOT NULL, status_changes TEXT NOT NULL, updated TEXT NOT NULL,
    schema_version INTEGER NOT NULL, failure_signature TEXT,
    PRIMARY KEY (job_id, step_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_numbers (
    job_no INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS job_counted_steps (
    job_no INTEGER NOT NULL, kind INTEGER NOT NULL, step_id TEXT NOT NULL,
    PRIMARY KEY (job_no, kind, step_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_outputs (
    job_no INTEGER NOT NULL, step_id TEXT NOT NULL, stage INTEGER NOT NULL,
    attempt INTEGER NOT NULL, output TEXT NOT NULL,
    PRIMARY KEY (job_no, step_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jobs_manager_keys (
    scope TEXT NOT NULL, namespace TEXT NOT NULL, PRIMARY KEY (scope, namespace)) WITHOUT ROWID;
"""
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_scope_namespace_status ON jobs (scope, namespace, status);
CREATE INDEX IF NOT EXISTS jobs_status_stop_finalized ON jobs (status, stop_finalized);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created, id);
CREATE INDEX IF NOT EXISTS jobs_cleanup ON jobs (scope, namespace, status, status_since, id);
CREATE INDEX IF NOT EXISTS job_steps_job_stage_status ON job_steps (job_id, stage, status);
CREATE INDEX IF NOT EXISTS job_steps_job_signature ON job_steps (job_id, failure_signature)
    WHERE failure_signature IS NOT NULL;
"""
#: The columns a file of an older release may lack, with what they read as on its rows: the
#: field's default in `JobState` / `StepState` (a record without a version is version 1).
ADDED_COLUMNS = {
    "jobs": {
        "has_plan": "INTEGER NOT NULL DEFAULT 0",
        "stop_finalized": "INTEGER NOT NULL DEFAULT 0",
        "records_counted_steps": "INTEGER NOT NULL DEFAULT 0",
        "error": "TEXT",
        "version": "INTEGER NOT NULL DEFAULT 0",
        "schema_version": f"INTEGER NOT NULL DEFAULT {FIRST_SCHEMA_VERSION}",
        "resume_after": "TEXT",
        "held": "INTEGER NOT NULL DEFAULT 0",
        "status_since": "TEXT",
        "priority": f"INTEGER NOT NULL DEFAULT {DEFAULT_PRIORITY}",
        "fairness_key": "TEXT NOT NULL DEFAULT ''",
    },
    "job_steps": {
        "attempt": "INTEGER NOT NULL DEFAULT 0",
        "lease": "TEXT",
        "is_prepared": "INTEGER NOT NULL DEFAULT 1",
        "schema_version": f"INTEGER NOT NULL DEFAULT {FIRST_SCHEMA_VERSION}",
        "failure_signature": "TEXT",
    },
}


_HAS_PLAN_FROM_TOTALS = (
    "UPDATE jobs SET has_plan = 1 WHERE json_extract(progress, '$.total_steps') > 0"
)


def lay_out(connection: sqlite3.Connection) -> None:
    """Creates what is missing: the tables, the columns an older release did not write (see
    `ADDED_COLUMNS`), then the indexes, some of which are on added columns."""
    for statement in filter(str.strip, TABLES.split(";")):
        connection.execute(statement)
    for table, added in ADDED_COLUMNS.items():
        present = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
        for column, declaration in added.items():
            if column not in present:
                connection.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                if (table, column) == ("jobs", "has_plan"):
                    # The plan's totals are written with the plan: a job with totals has one.
                    connection.execute(_HAS_PLAN_FROM_TOTALS)
                elif (table, column) == ("jobs", "status_since"):
                    _fill_status_since(connection)
    for statement in filter(str.strip, INDEXES.split(";")):
        connection.execute(statement)


def _fill_status_since(connection: sqlite3.Connection) -> None:
    """Each row's `status_since` from its status history (else `created`), as a save of this
    release writes it: the history's texts are not of a fixed width, so they are parsed here."""
    rows = connection.execute("SELECT id, status_changes, created FROM jobs").fetchall()
    filled = []
    for job_id, changes, created in rows:
        try:
            history = json.loads(changes)
            when = history[-1]["occurred"] if history else created
            filled.append((utc_text(datetime.fromisoformat(when)), job_id))
        except (ValueError, TypeError, KeyError, IndexError):
            continue  # a row that does not parse is reported when it is read
    connection.executemany("UPDATE jobs SET status_since = ? WHERE id = ?", filled)


_CREATE_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
#: A column declaration's default, as `ADDED_COLUMNS` writes it (none: NULL).
_DEFAULT = re.compile(r"DEFAULT (\S+)")


def shadow_missing(
    connection: sqlite3.Connection,
    tables: str,
    added_columns: dict[str, dict[str, str]] | None = None,
) -> None:
    """For a read-only connection: each table of `tables` (a script of `CREATE TABLE IF NOT
    EXISTS` statements) that the file lacks is created empty in the in-memory `temp` schema,
    and each of `added_columns` a table lacks is added by a `temp` view over it, with its
    default. SQLite resolves an unqualified name in `temp` first, so the queries stay as they
    are; nothing is written to the file."""
    connection.execute("PRAGMA temp_store = MEMORY")
    present = {name for (name,) in connection.execute(
        "SELECT name FROM main.sqlite_master WHERE type = 'table'")}  # fmt: skip
    for statement in filter(str.strip, tables.split(";")):
        match = _CREATE_TABLE.search(statement)
        if match is None:
            continue
        if match.group(1) not in present:
            connection.execute(statement.replace(match.group(0), f"CREATE TEMP TABLE {match[1]}"))
    for table, added in (added_columns or {}).items():
        if table not in present:
            continue
        columns = {row[1] for row in connection.execute(f"PRAGMA main.table_info({table})")}
        missing = [
            f"{_missing_default(table, column, declaration)} AS {column}"
            for column, declaration in added.items()
            if column not in columns
        ]
        if missing:
            # A view has no rowid of its own: the table's is kept, for the queries ordered by it.
            rowid = "rowid AS rowid, " if _has_rowid(connection, table) else ""
            connection.execute(f"CREATE TEMP VIEW {table} AS SELECT {rowid}*, "
                               f"{', '.join(missing)} FROM main.{table}")  # fmt: skip


def _has_rowid(connection: sqlite3.Connection, table: str) -> bool:
    try:
        connection.execute(f"SELECT rowid FROM main.{table} LIMIT 0")
    except sqlite3.OperationalError:  # WITHOUT ROWID
        return False
    return True


def _missing_default(table: str, column: str, declaration: str) -> str:
    if (table, column) == ("jobs", "has_plan"):
        # As the upgrade sets it: the plan's totals are written with the plan.
        return "(json_extract(progress, '$.total_steps') > 0)"
    default = _DEFAULT.search(declaration)
    return default.group(1) if default else "NULL"
