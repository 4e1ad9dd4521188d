"""How the MongoDB provider keeps its records: the collections, their indexes, a record as a
document, and the queries that count records (`storage/mongodb.py` is the provider; its
docstring says what nx-27017 implements and why the queries are spelled as they are).

In the URL's database, else `choreography` (fields as in `choreography_ray.storage`):

    jobs                `_id` job id. Indexes (scope, namespace, status) for
                        `list_unsettled_jobs` (one find per status, merged), (status,
                        stop_finalized), (created) for `find_jobs`' newest-first pages (nx
                        refuses `_id` in a compound index; ties on `created` are few and
                        sorted by `_id`).
                        (scope, namespace, status, status_since). `status_since` (when the
                        job reached its status) is derived and written with every save, for the
                        cleanup query: one indexed, sorted and limited find per status, merged.
                        A document written before the field existed gets it from its status
                        history on the first cleanup query of its key by each instance.
    job_steps           `_id` "{job_id}/{step_id}". Indexes (job_id, status, step_id),
                        (job_id, stage, status, step_id), (job_id, step_id), (job_id,
                        failure_signature, step_id) for the failures. The (job_id,
                        status) and (job_id, stage, status) indexes of earlier releases are
                        dropped where found.
    job_counted_steps   `_id` "{job_id}/{kind}/{step_id}"; job_id, kind, step_id. Index (job_id,
                        kind, step_id): list, count and remove-all are queries; an add is inserts.
    job_outputs         `_id` "{job_id}/{step_id}"; job_id, step_id, stage, attempt, output
                        (JSON text). Index (job_id, step_id): `list_outputs`' pages and ranges,
                        `output_span`'s ends. Written and read by `mongodb_outputs.py`;
                        `remove_job_outputs` is a query.
    jobs_manager_keys   `_id` '["{scope}", "{namespace}"]', a JSON pair no separator can break.
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pymongo import UpdateOne
from pymongo import errors as mongo
from pymongo.database import Database

from choreography_ray.errors import CorruptRecordError
from choreography_ray.failures import FailureCluster
from choreography_ray.model import (
    SCHEMA_VERSION,
    JobState,
    StepState,
    check_schema_version,
    step_key,
)
from choreography_ray.status import StepStatus
from choreography_ray.storage import StatusCounts, chunks

M = TypeVar("M", bound=BaseModel)
Doc = dict[str, Any]

#: Ids per `$in` delete or update: nx-27017 deletes 16x faster this way than with one
#: `DeleteOne` per id.
IDS_PER_WRITE = 1_000

#: Each collection's indexes, as their ascending fields.
INDEXES = {
    "jobs": [
        "scope namespace status",
        "status stop_finalized",
        "scope namespace status status_since",
        "created",
    ],
    # The status indexes end in step_id, so a page of one status is read in step-id order from
    # the index (nx's SQLite planner otherwise walks (job_id, step_id) for the order, and reads
    # every step of the job for a status few have).
    "job_steps": [
        "job_id status step_id",
        "job_id stage status step_id",
        "job_id step_id",
        "job_id failure_signature step_id",
    ],
    "job_counted_steps": ["job_id kind step_id"],
    "job_outputs": ["job_id step_id"],
}
#: Indexes of earlier releases that one above replaces: dropped where found, so that writes do
#: not keep both up to date.
SUPERSEDED = {"job_steps": ["job_id status", "job_id stage status"]}
COUNTED = ("completed_steps_counted", "stopped_steps_counted")


def encode(value: Any) -> Any:
    """A model dump as BSON both servers store exactly (see the module docstring)."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def document(record: JobState | StepState, key: str) -> Doc:
    doc: Doc = encode(record.model_dump(exclude={"id", "status_changes", *COUNTED}))
    doc["_id"] = key
    doc["schema_version"] = SCHEMA_VERSION
    doc["status_changes"] = [change.model_dump_json() for change in record.status_changes]
    return doc


def job_document(job: JobState) -> Doc:
    doc = document(job, job.id)
    doc["status_since"] = encode(job.status_since)
    return doc


def parse(model: type[M], collection: str, doc: Mapping[str, Any]) -> M:
    check_schema_version(collection, str(doc.get("_id")), doc.get("schema_version"))
    try:
        changes = [json.loads(c) for c in doc.get("status_changes", ())]
        return model.model_validate({**doc, "id": doc.get("_id"), "status_changes": changes})
    except (ValidationError, ValueError, TypeError) as exc:
        raise CorruptRecordError(collection, str(doc.get("_id")), str(exc)) from exc


def lay_out_indexes(db: Database[Doc]) -> None:
    for name, indexes in INDEXES.items():
        for fields in indexes:
            db[name].create_index([(field, 1) for field in fields.split()])
    for name, old in SUPERSEDED.items():
        superseded = {tuple(fields.split()) for fields in old}
        for index in db[name].list_indexes():
            if tuple(index["key"]) in superseded:
                # Dropped by another instance meanwhile, or a user without the right to drop
                # indexes: the old index only costs its upkeep, so it stays.
                with contextlib.suppress(mongo.OperationFailure):
                    db[name].drop_index(index["name"])


def fill_status_since(db: Database[Doc], scope: str, namespace: str) -> None:
    """Gives the key's documents written before `status_since` existed the field, from their
    status history (else `created`), so the cleanup query sees them."""
    query = {"scope": scope, "namespace": namespace, "status_since": {"$exists": False}}
    writes = []
    for doc in db.jobs.find(query, {"status_changes": 1, "created": 1}):
        try:
            changes = doc.get("status_changes") or ()
            when = json.loads(changes[-1])["occurred"] if changes else doc["created"]
            since = encode(datetime.fromisoformat(str(when)))
        except (ValueError, TypeError, KeyError):
            continue  # a document that does not parse is reported when it is read
        writes.append(UpdateOne({"_id": doc["_id"]}, {"$set": {"status_since": since}}))
    if writes:
        db.jobs.bulk_write(writes, ordered=False)


def equal(**fields: Any) -> Doc:
    """A filter of plain equalities spelled `$eq`: nx translates `{"f": v}` to an equality or
    an array-membership test, which no index serves, and `{"f": {"$eq": v}}` to the equality
    alone, which its (expression) index on the field serves; to mongod both mean the same."""
    return {field: {"$eq": value} for field, value in fields.items()}


def count(db: Database[Doc], query: Doc, collection: str = "job_steps") -> int:
    """The `count` command: answered from the query's index by both servers, where
    `count_documents` is an aggregation (`$match`, `$group`) that nx evaluates in Python."""
    return int(db.command("count", collection, query=query)["n"])


def stored_stages(db: Database[Doc], job_id: str) -> list[int]:
    """The stages the job has records of: one indexed find per stage, each the first record
    of a later stage along the (job_id, stage, status) index."""
    stages: list[int] = []
    while True:
        query = equal(job_id=job_id)
        if stages:
            query["stage"] = {"$gt": stages[-1]}
        doc = db.job_steps.find_one(query, {"stage": 1}, sort=[("stage", 1)])
        if doc is None:
            return stages
        stage = doc.get("stage")
        if not isinstance(stage, int) or isinstance(stage, bool):
            raise CorruptRecordError("job_steps", str(doc.get("_id")), f"bad stage {stage!r}")
        stages.append(stage)


def count_by_status(db: Database[Doc], job_id: str) -> StatusCounts:
    """Counted per status through the (job_id, status) index, then per stage and status
    through the (job_id, stage, status) index for the statuses some record has: no `$group`,
    which nx evaluates in Python over every record of the job. Records the counts miss have a
    status this release does not know; as the counts are not one snapshot, a step that changed
    status between two of them may be missed too, so a shortfall is counted once more before
    it is reported."""
    for _ in range(2):
        stages = stored_stages(db, job_id)
        counts: StatusCounts = {}
        for status in StepStatus if stages else ():
            total = count(db, equal(job_id=job_id, status=status.value))
            if total and len(stages) == 1:
                counts[(stages[0], status)] = total
            elif total:
                for stage in stages:
                    if n := count(db, equal(job_id=job_id, stage=stage, status=status.value)):
                        counts[(stage, status)] = n
        missed = count(db, equal(job_id=job_id)) - sum(counts.values())
        if missed <= 0:
            return counts
    reason = f"{missed} records of an unknown status"
    raise CorruptRecordError("job_steps", f"{job_id}/*", reason)


def failure_clusters(db: Database[Doc], job_id: str) -> list[FailureCluster]:
    """One `$group` over the job's failed steps, then each cluster's example by key. mongod
    reads the steps along the (job_id, failure_signature) index; nx groups in Python (module
    docstring)."""
    match = {"job_id": {"$eq": job_id}, "failure_signature": {"$type": "string"}}
    group = {
        "_id": "$failure_signature",
        "count": {"$sum": 1},
        "first_seen": {"$min": "$updated"},
        "last_seen": {"$max": "$updated"},
        "example": {"$min": "$step_id"},
    }
    rows = list(db.job_steps.aggregate([{"$match": match}, {"$group": group}]))
    keys = [step_key(job_id, str(row["example"])) for row in rows]
    examples = {
        str(doc["_id"]): parse(StepState, "job_steps", doc)
        for chunk in chunks(keys, IDS_PER_WRITE)
        for doc in db.job_steps.find({"_id": {"$in": chunk}})
    }
    clusters = []
    for row, key in zip(rows, keys, strict=True):
        example = examples.get(key)
        changes = () if example is None else example.status_changes
        messages = changes[-1].exception_messages if changes else ()
        try:
            clusters.append(
                FailureCluster(
                    signature=row["_id"],
                    count=row["count"],
                    first_seen=row["first_seen"],
                    last_seen=row["last_seen"],
                    example_step_id=str(row["example"]),
                    example_message=messages[0] if messages else None,
                )
            )
        except ValidationError as exc:
            raise CorruptRecordError("job_steps", f"{job_id}/*", str(exc)) from exc
    return sorted(clusters, key=lambda c: (-c.count, c.signature))
