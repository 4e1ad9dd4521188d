"""The MongoDB provider: `mongodb://` and `mongodb+srv://` URLs, for clusters.

The collections, their indexes, a record as a document and the counting queries:
`storage/mongodb_records.py`; the step outputs' writes and reads: `storage/mongodb_outputs.py`.
Indexes are created on first use, once per instance (never by a storage opened `read_only`,
which creates nothing). The code keeps to what both `mongod` and `nx-27017` (the tests' server)
implement, so tests run the production path. Measured on nx 0.8.1:

- Datetimes are fixed-width UTC ISO-8601 strings with microseconds: nx stores a top-level
  datetime given to `$set` (`updated`) as a naive string, and a BSON date drops microseconds.
  The strings sort as the instants do and read back equal.
- `status_changes` holds one JSON string per change: nx's `$push` of a subdocument turns every
  element of the array into a JSON string; its `$push` of a string is exact.
- nx serves an index only for a plain comparison: a filter `{"f": v}` becomes SQL for "equal,
  or an array containing v", which scans the collection, while `{"f": {"$eq": v}}` (the same to
  mongod) is a plain equality its index on `f` serves. `$in` on a field other than `_id` is
  evaluated in Python over the whole collection; on `_id` it is an indexed `IN`. So step and
  counted-step filters are spelled `$eq` (`mongodb_records.equal`), `get_steps` and the bulk
  writes go by `_id $in`, and a query over several statuses is one query per status, merged.
- `count_documents` and `$group` are aggregations nx evaluates in Python (about 5 s for a
  `$group` over 100,000 steps, during which it answers nothing else); the `count` command with
  a plain-equality query is an indexed `SELECT COUNT`. `count_by_status` finds the job's stages
  along the (job_id, stage, status) index (one sorted `find_one` per stage) and counts with
  `count`, per status and, for a job of several stages, per stage and status where some record
  has the status. `count_jobs_by_type_and_status` groups on `$concat` of status, ":" and type
  (nx answers a compound `$group` key with the literal paths; a status has no ":").
- `update_steps` and `renew_leases` write one `UpdateMany` (`_id $in`, at most `IDS_PER_WRITE`
  ids) for the steps that share their change: a start batch's RUNNING writes share one lease
  and one status change, so 1,000 of them are one update statement rather than 1,000. A lease
  renewal is filtered on `_id`, `status` and `attempt`, so it never undoes an outcome stored
  meanwhile; an update on `_id` and `attempt $lte`, so an earlier attempt never overwrites a
  later one.
- No update pipelines (nx rejects them), so no `$$NOW`: `updated` is this process's clock, as in
  the memory provider. No partial indexes (nx makes them full); none is needed. No subdocument
  `_id` (nx rejects an upsert on one).

Every document is written with this release's `schema_version`; one without the field is of
version 1 and reads missing fields as their defaults; one of a newer version is refused with
`UnsupportedSchemaError` before it is parsed.

The driver is pymongo's sync `MongoClient` on a small thread pool (`loop.run_in_executor`):
`AsyncMongoClient` is GA only from pymongo 4.13 (the project allows 4.6) and is bound to the loop
it first ran on, while a storage instance may serve several loops (sync wrappers, Ray actors).
The client is made on first use: constructing a `MongoStorage` does no I/O.

`insert_steps` is an ordered `insert_many`: MongoDB keeps the documents before the first failing
one, so on a failure those are deleted before the error is raised (a connection lost mid-batch can
still leave a prefix; a retry then meets `DuplicateRecordError`). An unreachable server fails
after `serverSelectionTimeoutMS` (5 s unless the URL sets it) with `StorageUnavailableError`
naming the URL without its password; so do credentials the server refuses (code 18) and a
server whose authentication handshake the driver cannot follow (nx-27017 has no authentication:
given credentials, pymongo fails with a KeyError inside its SCRAM conversation).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel
from pymongo import DeleteMany, MongoClient, UpdateMany, UpdateOne
from pymongo import errors as mongo
from pymongo.database import Database

from choreography_ray.errors import (
    ConcurrencyError,
    CorruptRecordError,
    DuplicateRecordError,
    StorageError,
    StorageUnavailableError,
)
from choreography_ray.failures import FailureCluster
from choreography_ray.model import (
    JobsManagerKey,
    JobState,
    StepState,
    step_key,
    utcnow,
)
from choreography_ray.status import REHYDRATED_JOB, JobStatus, StepStatus
from choreography_ray.storage import (
    CountedKind,
    JobCounts,
    JobCursor,
    JobFilter,
    LeaseRenewal,
    PlannedStep,
    StatusCounts,
    StepUpdate,
    StoredOutput,
    StoredStart,
    chunks,
    ended_without_output,
    planned_records,
    redact_url,
    starts_of,
)
from choreography_ray.storage import mongodb_outputs as output_docs
from choreography_ray.storage import mongodb_records as records
from choreography_ray.storage.mongodb_records import IDS_PER_WRITE, Doc

#: Driver options and defaults, in milliseconds. Server selection bounds how long an unreachable
#: database takes to fail. The connect timeout is also the read timeout of the driver's heartbeat
#: to a server without streaming `hello` (nx), and a timed-out heartbeat cancels every operation
#: in flight: nx answers nothing while it runs one operation (about 5 s for a `$group` over
#: 100,000 steps), so this one stays at pymongo's default. The socket timeout bounds one
#: operation's wait for its answer (pymongo's default is none: a half-open connection would
#: hold its call for ever); a minute is far above the longest operation the runtime makes.
DEFAULT_TIMEOUTS_MS = {
    "serverSelectionTimeoutMS": 5_000,
    "connectTimeoutMS": 20_000,
    "socketTimeoutMS": 60_000,
}
#: Threads running the driver's blocking calls, per storage instance.
POOL_THREADS = 4
DEFAULT_DATABASE = "choreography"
_DUPLICATE_KEY = 11000
_AUTHENTICATION_FAILED = 18
_RUNNING = StepStatus.RUNNING.value

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def _client_options(url: str) -> Doc:
    """The default timeouts the URL does not set (a keyword would win over the URL's option)."""
    given = {name.lower() for name, _ in parse_qsl(urlsplit(url).query)}
    return {k: ms for k, ms in DEFAULT_TIMEOUTS_MS.items() if k.lower() not in given}


def _deletes(ids: Sequence[str]) -> list[DeleteMany]:
    return [DeleteMany({"_id": {"$in": chunk}}) for chunk in chunks(ids, IDS_PER_WRITE)]


def _job_query(where: JobFilter) -> Doc:
    query: Doc = {
        field: value
        for field, value in (("scope", where.scope), ("namespace", where.namespace),
                             ("type", where.type))
        if value is not None
    }  # fmt: skip
    if where.statuses is not None:
        query["status"] = {"$in": sorted(s.value for s in where.statuses)}
    if where.created_since is not None:
        query["created"] = {"$gte": records.encode(where.created_since)}
    return query


def _insert_steps(db: Database[Doc], docs: list[Doc]) -> None:
    try:
        db.job_steps.insert_many(docs, ordered=True)
    except mongo.BulkWriteError as exc:
        errors = exc.details.get("writeErrors") or [{}]
        failed = errors[0].get("index", exc.details.get("nInserted", 0))
        # Ordered: the documents before the failing one are written; take them back.
        if failed:
            db.job_steps.bulk_write(_deletes([d["_id"] for d in docs[:failed]]))
        if errors[0].get("code") == _DUPLICATE_KEY:
            key = docs[failed]["_id"]
            raise DuplicateRecordError(f"step {key!r} exists already") from exc
        raise


def _counted_id(job_id: str, kind: CountedKind, step_id: str) -> str:
    return f"{job_id}/{kind.value}/{step_id}"


class MongoStorage:
    def __init__(self, url: str, read_only: bool = False) -> None:
        self.url = url
        #: A reader that creates nothing: no index is made (reads create no collection).
        self.read_only = read_only
        self._lock = threading.Lock()  # guards the client; held while indexes are made
        self._pool_lock = threading.Lock()  # guards the pool; never held over I/O
        self._client: MongoClient[Doc] | None = None
        self._db: Database[Doc] | None = None
        self._pool: ThreadPoolExecutor | None = None
        #: Keys whose documents without `status_since` this instance filled in.
        self._since_filled: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"MongoStorage({redact_url(self.url)!r})"

    # plumbing
    def _database(self) -> Database[Doc]:
        with self._lock:
            if self._db is None:
                if self._client is None:
                    self._client = MongoClient(self.url, **_client_options(self.url))
                db = self._client.get_default_database(DEFAULT_DATABASE)
                if self.read_only:
                    # What the index creation does otherwise: connect (and authenticate) here,
                    # where a failing handshake is told apart from a failing operation.
                    db.command("ping")
                if not self.read_only:
                    records.lay_out_indexes(db)
                self._db = db
            return self._db

    def _call(self, operation: Callable[[Database[Doc]], T]) -> T:
        where = f"MongoDB at {redact_url(self.url)}"
        try:
            try:
                database = self._database()
            except (mongo.PyMongoError, StorageError):
                raise
            except Exception as exc:
                # The driver failing inside its own handshake (seen: a server without
                # authentication answers saslStart without a payload, and pymongo raises
                # KeyError): the database cannot be used, so it is unavailable, not a bug here.
                raise StorageUnavailableError(
                    f"{where} is unavailable: connecting failed with {type(exc).__name__}: {exc} "
                    "(does the server support authentication, if the URL has credentials?)"
                ) from exc
            return operation(database)
        except (mongo.ConnectionFailure, mongo.ConfigurationError) as exc:
            raise StorageUnavailableError(f"{where} is unavailable: {exc}") from exc
        except mongo.OperationFailure as exc:
            if exc.code == _AUTHENTICATION_FAILED:
                raise StorageUnavailableError(f"{where} refused the credentials: {exc}") from exc
            raise StorageError(f"{where}: {exc}") from exc
        except mongo.PyMongoError as exc:
            raise StorageError(f"{where}: {exc}") from exc

    async def _run(self, operation: Callable[[Database[Doc]], T]) -> T:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="mongo-storage")
            pool = self._pool
        return await asyncio.get_running_loop().run_in_executor(pool, self._call, operation)

    # jobs
    async def create_job(self, job: JobState) -> JobState:
        stored = job.model_copy(update={"version": 1, **dict.fromkeys(records.COUNTED, ())})
        doc = records.job_document(stored)

        def insert(db: Database[Doc]) -> None:
            try:
                db.jobs.insert_one(doc)
            except mongo.DuplicateKeyError as exc:
                raise DuplicateRecordError(f"job {job.id!r} exists already") from exc

        await self._run(insert)
        return stored

    async def get_job(self, job_id: str) -> JobState | None:
        doc = await self._run(lambda db: db.jobs.find_one({"_id": job_id}))
        return None if doc is None else records.parse(JobState, "jobs", doc)

    async def save_job(self, job: JobState) -> JobState:
        stored = job.model_copy(
            update={"version": job.version + 1, **dict.fromkeys(records.COUNTED, ())}
        )
        doc = records.job_document(stored)

        def replace(db: Database[Doc]) -> None:
            if db.jobs.replace_one({"_id": job.id, "version": job.version}, doc).matched_count:
                return
            current = db.jobs.find_one({"_id": job.id}, {"version": 1})
            found = "no record" if current is None else f"version {current.get('version')}"
            raise ConcurrencyError(f"job {job.id!r} is at {found}, not {job.version}")

        await self._run(replace)
        return stored

    async def _find_jobs(self, query: Doc) -> list[JobState]:
        order = [("created", 1), ("_id", 1)]
        docs = await self._run(lambda db: list(db.jobs.find(query).sort(order)))
        return [records.parse(JobState, "jobs", doc) for doc in docs]

    async def list_jobs(
        self, scope: str, namespace: str, status: JobStatus | None = None
    ) -> list[JobState]:
        query: Doc = {"scope": scope, "namespace": namespace}
        if status is not None:
            query["status"] = status.value
        return await self._find_jobs(query)

    async def get_jobs_excluding_finalized_stops(
        self, scope: str, namespace: str
    ) -> list[JobState]:
        finalized = {"status": JobStatus.STOPPED.value, "stop_finalized": True}
        return await self._find_jobs({"scope": scope, "namespace": namespace, "$nor": [finalized]})

    async def list_unsettled_jobs(self, scope: str, namespace: str) -> list[JobState]:
        # One indexed query per status, merged: `$in` and `$nor` would be evaluated by nx in
        # Python over every job ever stored (module docstring).
        key = records.equal(scope=scope, namespace=namespace)
        unfinalized = {"stop_finalized": {"$ne": True}}
        queries = [
            {**key, **records.equal(status=status.value),
             **(unfinalized if status is JobStatus.STOPPED else {})}
            for status in sorted(REHYDRATED_JOB)
        ]  # fmt: skip

        def find(db: Database[Doc]) -> list[Doc]:
            docs = [doc for query in queries for doc in db.jobs.find(query)]
            return sorted(docs, key=lambda doc: (str(doc.get("created")), str(doc["_id"])))

        return [records.parse(JobState, "jobs", doc) for doc in await self._run(find)]

    async def find_jobs(
        self,
        where: JobFilter,
        *,
        before: JobCursor | None = None,
        after: JobCursor | None = None,
        limit: int = 50,
    ) -> list[JobState]:
        query = _job_query(where)
        direction = -1
        for cursor, operator in ((before, "$lt"), (after, "$gt")):
            if cursor is not None:
                created = records.encode(cursor.created)
                query = {"$and": [query, {"$or": [
                    {"created": {operator: created}},
                    {"created": created, "_id": {operator: cursor.job_id}},
                ]}]}  # fmt: skip
        if after is not None:
            direction = 1
        order = [("created", direction), ("_id", direction)]
        docs = await self._run(lambda db: list(db.jobs.find(query).sort(order).limit(limit)))
        jobs = [records.parse(JobState, "jobs", doc) for doc in docs]
        return jobs[::-1] if direction == 1 else jobs

    async def count_jobs_by_type_and_status(self, where: JobFilter) -> JobCounts:
        group = {"_id": {"$concat": ["$status", ":", "$type"]}, "n": {"$sum": 1}}
        pipeline: list[Doc] = [{"$match": _job_query(where)}, {"$group": group}]
        rows = await self._run(lambda db: list(db.jobs.aggregate(pipeline)))
        counts: JobCounts = {}
        try:
            for row in rows:
                status, _, job_type = row["_id"].partition(":")
                counts[(job_type, JobStatus(status))] = int(row["n"])
        except (ValueError, AttributeError) as exc:
            raise CorruptRecordError("jobs", "*", f"bad status: {exc}") from exc
        return counts

    async def list_jobs_for_cleanup(
        self,
        scope: str,
        namespace: str,
        statuses: Collection[JobStatus],
        before: datetime,
        limit: int,
    ) -> list[JobState]:
        wanted = sorted({JobStatus(s).value for s in statuses})
        if not wanted or limit < 1:
            return []
        if (scope, namespace) not in self._since_filled:
            await self._run(lambda db: records.fill_status_since(db, scope, namespace))
            self._since_filled.add((scope, namespace))
        cutoff = records.encode(before)
        order = [("status_since", 1), ("_id", 1)]

        def find(db: Database[Doc]) -> list[Doc]:
            docs = []
            for status in wanted:
                query = {"scope": scope, "namespace": namespace, "status": status,
                         "status_since": {"$lt": cutoff}}  # fmt: skip
                docs += list(db.jobs.find(query).sort(order).limit(limit))
            return sorted(docs, key=lambda d: (d["status_since"], d["_id"]))[:limit]

        return [records.parse(JobState, "jobs", doc) for doc in await self._run(find)]

    async def remove_job(self, job_id: str) -> None:
        await self._run(lambda db: db.jobs.delete_one({"_id": job_id}))

    # steps
    async def insert_steps(self, steps: Sequence[StepState]) -> None:
        docs = [records.document(step, step.key) for step in steps]
        if docs:
            await self._run(lambda db: _insert_steps(db, docs))

    async def insert_plan(self, job_id: str, steps: Sequence[PlannedStep]) -> None:
        if not steps:
            return
        # Every planned document is the same but for its step: one record encoded, then copied.
        first = steps[0]
        template = records.document(planned_records(job_id, [first])[0], "")
        docs = [
            {**template, "_id": step_key(job_id, s.step_id), "step_id": s.step_id,
             "type": s.type, "stage": s.stage, "request": json.loads(s.request_json)}
            for s in steps
        ]  # fmt: skip
        await self._run(lambda db: _insert_steps(db, docs))

    async def get_step(self, job_id: str, step_id: str) -> StepState | None:
        doc = await self._run(lambda db: db.job_steps.find_one({"_id": step_key(job_id, step_id)}))
        return None if doc is None else records.parse(StepState, "job_steps", doc)

    async def get_steps(self, job_id: str, step_ids: Collection[str]) -> dict[str, StepState]:
        keys = [step_key(job_id, step_id) for step_id in step_ids]

        def find(db: Database[Doc]) -> list[Doc]:
            return [
                doc for chunk in chunks(keys) for doc in db.job_steps.find({"_id": {"$in": chunk}})
            ]

        steps = [records.parse(StepState, "job_steps", doc) for doc in await self._run(find)]
        return {step.step_id: step for step in steps}

    async def list_steps(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StepState]:
        query = (
            records.equal(job_id=job_id)
            if stage is None
            else records.equal(job_id=job_id, stage=stage)
        )
        if after is not None:
            query["step_id"] = {"$gt": after}
        # One indexed query per status (nx evaluates `$in` on a field other than `_id` in
        # Python, over every document of the collection), merged.
        wanted = [None] if statuses is None else sorted({StepStatus(s).value for s in statuses})

        def find(db: Database[Doc]) -> list[Doc]:
            docs: list[Doc] = []
            for status in wanted:
                where = query if status is None else {**query, **records.equal(status=status)}
                docs += db.job_steps.find(where).sort("step_id").limit(limit)
            return sorted(docs, key=lambda doc: str(doc.get("step_id")))[:limit]

        return [records.parse(StepState, "job_steps", doc) for doc in await self._run(find)]

    async def list_starts(
        self,
        job_id: str,
        *,
        statuses: Collection[StepStatus] | None = None,
        stage: int | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> list[StoredStart]:
        page = await self.list_steps(
            job_id, statuses=statuses, stage=stage, after=after, limit=limit
        )
        return starts_of(page)

    async def list_failed(
        self, job_id: str, signature: str, *, after: str | None = None, limit: int = 1000
    ) -> list[StepState]:
        query = records.equal(job_id=job_id, failure_signature=signature)
        if after is not None:
            query["step_id"] = {"$gt": after}
        docs = await self._run(
            lambda db: list(db.job_steps.find(query).sort("step_id").limit(limit))
        )
        return [records.parse(StepState, "job_steps", doc) for doc in docs]

    async def failure_clusters(self, job_id: str) -> list[FailureCluster]:
        return await self._run(lambda db: records.failure_clusters(db, job_id))

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        now = records.encode(utcnow())
        # A start batch's RUNNING writes share their lease and change objects: such updates
        # are one `UpdateMany` per `IDS_PER_WRITE` ids, encoded once.
        groups: dict[tuple[object, ...], tuple[StepUpdate, list[str]]] = {}
        for u in updates:
            key = step_key(u.job_id, u.step_id)
            shared = (u.status, u.attempt, id(u.lease), id(u.change), u.failure_signature)
            groups.setdefault(shared, (u, []))[1].append(key)
        writes: list[UpdateOne | UpdateMany] = []
        for u, keys in groups.values():
            lease = None if u.lease is None else records.encode(u.lease.model_dump())
            fields = {
                "status": u.status.value,
                "attempt": u.attempt,
                "lease": lease,
                "failure_signature": u.failure_signature,
            }
            change: Doc = {"$set": {**fields, "updated": now}}
            if u.change is not None:
                # A set, not a push: the same change written again (its acknowledgement lost)
                # is recorded once; each change is its own instant, so no other is lost.
                change["$addToSet"] = {"status_changes": u.change.model_dump_json()}
            if len(keys) == 1:
                writes.append(UpdateOne({"_id": keys[0], "attempt": {"$lte": u.attempt}}, change))
                continue
            for chunk in chunks(keys, IDS_PER_WRITE):
                only = {"_id": {"$in": chunk}, "attempt": {"$lte": u.attempt}}
                writes.append(UpdateMany(only, change))
        ended = ended_without_output(updates)

        def write(db: Database[Doc]) -> None:
            if writes:
                db.job_steps.bulk_write(writes, ordered=False)
            output_docs.delete_ended(db, ended)

        if writes or ended:
            await self._run(write)

    async def renew_leases(self, renewals: Sequence[LeaseRenewal]) -> int:
        now = records.encode(utcnow())
        # Renewals of one host share their lease object: those at one attempt are one
        # `UpdateMany` per `IDS_PER_WRITE` ids, the lease encoded once.
        groups: dict[tuple[int, int], tuple[LeaseRenewal, list[str]]] = {}
        for r in renewals:
            group = groups.setdefault((id(r.lease), r.attempt), (r, []))
            group[1].append(step_key(r.job_id, r.step_id))
        writes = []
        for r, keys in groups.values():
            change = {"$set": {"lease": records.encode(r.lease.model_dump()), "updated": now}}
            for chunk in chunks(keys, IDS_PER_WRITE):
                only = {"_id": {"$in": chunk}, "status": _RUNNING, "attempt": r.attempt}
                writes.append(UpdateMany(only, change))
        if not writes:
            return 0
        result = await self._run(lambda db: db.job_steps.bulk_write(writes, ordered=False))
        return result.matched_count

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        deletes = _deletes([step_key(job_id, step_id) for step_id in step_ids])

        def write(db: Database[Doc]) -> None:
            if outputs:  # first: a step whose record is gone has its output
                output_docs.put(db, outputs)
            if deletes:
                db.job_steps.bulk_write(deletes, ordered=False)

        if deletes or outputs:
            await self._run(write)

    async def has_steps(self, job_id: str, stage: int, statuses: Collection[StepStatus]) -> bool:
        wanted = sorted({StepStatus(status).value for status in statuses})

        def find(db: Database[Doc]) -> bool:
            return any(
                db.job_steps.find_one(
                    records.equal(job_id=job_id, stage=stage, status=s), {"_id": 1}
                )
                for s in wanted
            )

        return bool(wanted) and await self._run(find)

    async def count_by_status(self, job_id: str) -> StatusCounts:
        return await self._run(lambda db: records.count_by_status(db, job_id))

    async def remove_job_steps(self, job_id: str) -> None:
        await self._run(lambda db: db.job_steps.delete_many(records.equal(job_id=job_id)))

    # counted steps
    async def add_counted(self, job_id: str, kind: CountedKind, step_ids: Collection[str]) -> None:
        fields = {"job_id": job_id, "kind": kind.value}
        docs = [{"_id": _counted_id(job_id, kind, s), **fields, "step_id": s} for s in step_ids]

        def insert(db: Database[Doc]) -> None:
            try:
                db.job_counted_steps.insert_many(docs, ordered=False)
            except mongo.BulkWriteError as exc:
                # A record that exists already is the idempotent case; anything else is not.
                codes = {error.get("code") for error in exc.details.get("writeErrors", [])}
                if codes - {_DUPLICATE_KEY} or exc.details.get("writeConcernErrors"):
                    raise

        if docs:
            await self._run(insert)

    async def remove_counted(self, job_id: str, kind: CountedKind, step_id: str) -> None:
        key = _counted_id(job_id, kind, step_id)
        await self._run(lambda db: db.job_counted_steps.delete_one({"_id": key}))

    async def list_counted(self, job_id: str, kind: CountedKind) -> list[str]:
        query = records.equal(job_id=job_id, kind=kind.value)
        docs = await self._run(
            lambda db: list(db.job_counted_steps.find(query, {"step_id": 1}).sort("step_id", 1))
        )
        return [str(doc["step_id"]) for doc in docs]

    async def count_counted(self, job_id: str, kind: CountedKind) -> int:
        query = records.equal(job_id=job_id, kind=kind.value)
        return await self._run(lambda db: records.count(db, query, "job_counted_steps"))

    async def remove_job_counted(self, job_id: str) -> None:
        await self._run(lambda db: db.job_counted_steps.delete_many(records.equal(job_id=job_id)))

    # step outputs (`storage/mongodb_outputs.py`)
    async def put_outputs(self, outputs: Sequence[StoredOutput]) -> None:
        if outputs:
            await self._run(lambda db: output_docs.put(db, outputs))

    async def delete_outputs(self, job_id: str, steps: Sequence[tuple[str, int]]) -> None:
        if steps:
            await self._run(lambda db: output_docs.delete(db, job_id, steps))

    async def list_outputs(
        self,
        job_id: str,
        *,
        stage: int | None = None,
        after: str | None = None,
        until: str | None = None,
        limit: int = 1000,
    ) -> list[StoredOutput]:
        return await self._run(lambda db: output_docs.page(db, job_id, stage, after, until, limit))

    async def count_outputs(self, job_id: str, stage: int | None = None) -> int:
        return await self._run(lambda db: output_docs.count(db, job_id, stage, self.read_only))

    async def output_span(self, job_id: str, stage: int | None = None) -> tuple[str, str] | None:
        return await self._run(lambda db: output_docs.span(db, job_id, stage))

    async def remove_job_outputs(self, job_id: str) -> None:
        query = output_docs.query(job_id)
        await self._run(lambda db: db[output_docs.COLLECTION].delete_many(query))

    # recovery key catalog
    async def add_manager_key(self, key: JobsManagerKey) -> None:
        key_id = json.dumps([key.scope, key.namespace])
        doc = {"_id": key_id, **key.model_dump()}
        await self._run(
            lambda db: db.jobs_manager_keys.replace_one({"_id": key_id}, doc, upsert=True)
        )

    async def list_manager_keys(self) -> list[JobsManagerKey]:
        docs = await self._run(lambda db: list(db.jobs_manager_keys.find().sort("_id", 1)))
        return [records.parse(JobsManagerKey, "jobs_manager_keys", doc) for doc in docs]

    async def close(self) -> None:
        """Closes the client; a later call opens a new one."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(pool, self._close_client)
            pool.shutdown(wait=False)

    def _close_client(self) -> None:
        with self._lock:
            client, self._client, self._db = self._client, None, None
        if client is not None:
            client.close()
