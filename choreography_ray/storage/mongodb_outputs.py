"""The MongoDB provider's step outputs: the `job_outputs` collection (`storage/mongodb.py` is
the provider; its indexes are laid out with the others', `mongodb_records.INDEXES`).

A document: `_id` "{job_id}/{step_id}"; job_id, step_id, stage, attempt and output, the JSON
text as the step host wrote it (a string: both servers
store it exactly).

`put` is one unordered `bulk_write` of upserts filtered on `_id` and `attempt $lte` the new one:
a document of that attempt or an earlier one is overwritten, a new one inserted. Where a later
attempt is stored the filter matches nothing and the upsert's insert meets the `_id`: a
duplicate-key error (11000) for that operation, which is the later attempt kept. Each duplicate
is written once more before it is taken so (two writers inserting one new output at once: the
loser's attempt may be the later), and any other error is raised. Written again after a lost
acknowledgement, an output matches its own document and stays one. `delete` is one `DeleteMany`
per attempt and `IDS_PER_WRITE` ids, filtered on `_id $in` and `attempt $lte`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pymongo import DeleteMany, UpdateOne
from pymongo import errors as mongo
from pymongo.database import Database

from choreography_ray.errors import CorruptRecordError
from choreography_ray.model import step_key
from choreography_ray.storage import StoredOutput, chunks
from choreography_ray.storage import mongodb_records as records
from choreography_ray.storage.mongodb_records import IDS_PER_WRITE, Doc

COLLECTION = "job_outputs"
_T = TypeVar("_T")
_DUPLICATE_KEY = 11000


def put(db: Database[Doc], outputs: Sequence[StoredOutput]) -> None:
    # One write per step: the latest attempt of the batch, the last written of equal ones, as
    # the outputs written one after another would leave it.
    latest: dict[str, StoredOutput] = {}
    for o in outputs:
        key = step_key(o.job_id, o.step_id)
        if key not in latest or latest[key].attempt <= o.attempt:
            latest[key] = o
    writes = [_upsert(key, o) for key, o in latest.items()]
    for last_try in (False, True):
        duplicates = _write(db, writes)
        if not duplicates or last_try:
            return
        writes = [writes[index] for index in duplicates]


def _upsert(key: str, o: StoredOutput) -> UpdateOne:
    fields = {"job_id": o.job_id, "step_id": o.step_id, "stage": o.stage, "attempt": o.attempt,
              "output": o.output}  # fmt: skip
    return UpdateOne({"_id": key, "attempt": {"$lte": o.attempt}}, {"$set": fields}, upsert=True)


def _write(db: Database[Doc], writes: list[UpdateOne]) -> list[int]:
    """The indexes of the writes refused as duplicates; any other error is raised."""
    try:
        db[COLLECTION].bulk_write(writes, ordered=False)
    except mongo.BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if {error.get("code") for error in errors} - {_DUPLICATE_KEY}:
            raise
        if exc.details.get("writeConcernErrors"):
            raise
        return sorted(int(error["index"]) for error in errors)
    return []


def delete(db: Database[Doc], job_id: str, steps: Sequence[tuple[str, int]]) -> None:
    by_attempt: dict[int, list[str]] = {}
    for step_id, attempt in steps:
        by_attempt.setdefault(attempt, []).append(step_key(job_id, step_id))
    writes = [
        DeleteMany({"_id": {"$in": chunk}, "attempt": {"$lte": attempt}})
        for attempt, keys in by_attempt.items()
        for chunk in chunks(keys, IDS_PER_WRITE)
    ]
    if writes:
        db[COLLECTION].bulk_write(writes, ordered=False)


def delete_ended(db: Database[Doc], ended: Mapping[str, Sequence[tuple[str, int]]]) -> None:
    """`update_steps`' delete of the outputs of steps it ended failed or stopped, of those whose
    record exists (read by key first: a step whose record is gone succeeded)."""
    for job_id, steps in ended.items():
        keys = [step_key(job_id, step_id) for step_id, _ in steps]
        existing = {
            doc["_id"]
            for chunk in chunks(keys, IDS_PER_WRITE)
            for doc in db.job_steps.find({"_id": {"$in": chunk}}, {"_id": 1})
        }
        delete(db, job_id, [s for s, key in zip(steps, keys, strict=True) if key in existing])


def query(job_id: str, stage: int | None = None) -> Doc:
    """Plain equalities (`records.equal`), which an index serves on both servers."""
    fields: dict[str, Any] = {"job_id": job_id}
    if stage is not None:
        fields["stage"] = stage
    return records.equal(**fields)


def count(db: Database[Doc], job_id: str, stage: int | None, read_only: bool) -> int:
    """The `count` command (`records.count`). nx creates a missing collection when it counts
    it (a find does not), so a reader that creates nothing looks for one output first."""
    where = query(job_id, stage)
    if read_only and db[COLLECTION].find_one(where, {"_id": 1}) is None:
        return 0
    return records.count(db, where, COLLECTION)


def page(
    db: Database[Doc],
    job_id: str,
    stage: int | None,
    after: str | None,
    until: str | None,
    limit: int,
) -> list[StoredOutput]:
    where = query(job_id, stage)
    bounds = {op: value for op, value in (("$gt", after), ("$lte", until)) if value is not None}
    if bounds:
        where["step_id"] = bounds
    return [stored(doc) for doc in db[COLLECTION].find(where).sort("step_id").limit(limit)]


def span(db: Database[Doc], job_id: str, stage: int | None) -> tuple[str, str] | None:
    """The first and last step ids with an output: one look-up at each end of the index."""
    where = query(job_id, stage)
    ends = [
        db[COLLECTION].find_one(where, {"step_id": 1}, sort=[("step_id", order)])
        for order in (1, -1)
    ]
    if ends[0] is None or ends[1] is None:
        return None
    return _field(ends[0], "step_id", str), _field(ends[1], "step_id", str)


def stored(doc: Mapping[str, Any]) -> StoredOutput:
    return StoredOutput(
        _field(doc, "job_id", str),
        _field(doc, "step_id", str),
        _field(doc, "stage", int),
        _field(doc, "attempt", int),
        _field(doc, "output", str),
    )


def _field(doc: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorruptRecordError(COLLECTION, str(doc.get("_id")), f"bad {name} {value!r:.80}")
    return value
