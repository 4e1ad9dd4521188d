"""The documents, unique-key markers and conversions of `mongodb.py` (which documents the
collections): each runs on the database inside one call of the provider's thread."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pymongo import errors as mongo
from pymongo.collection import Collection as Coll
from pymongo.database import Database

from choreography_ray.errors import CorruptRecordError
from choreography_ray.model import check_schema_version, utcnow
from choreography_ray.scheduler.records import (
    WorkEntry,
)
from choreography_ray.scheduler.status import DeadLetterStatus, WorkStatus
from choreography_ray.storage.scheduler import (
    QueueKey,
    entry_keys,
    fence_error,
)

_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)
Doc = dict[str, Any]

#: A marker whose entry was never written is taken over after this many seconds.
STALE_MARKER_SECONDS = 60.0
_INDEXES = {
    "manifests": ["scope name"],
    "work_queue": ["scope status scheduled_at", "scope manifest"],
    "runs": [
        "scope manifest queued_at",
        "scope queued_at",
        "replays",
        "job_id",
        "scope manifest status",
    ],
    "dead_letters": ["scope manifest status", "status resolved_at"],
    "decisions": ["run_id"],
    "checkpoints": ["run_id stage"],
}
_QUEUED = WorkStatus.QUEUED.value
_AWAITING = DeadLetterStatus.AWAITING_INTERVENTION.value


@dataclass(frozen=True)
class Fence:
    """The lease's token a fenced storage's write carries (`mongodb.py`, "The lease fences"):
    each document it writes is stamped `fence`, and each write of a stored one is conditional
    on the stored stamp not being above the token. No token (an unfenced storage): neither."""

    token: int | None = None
    name: str = ""
    holder: str = ""

    def only(self, query: Doc) -> Doc:
        """`query`, narrowed to documents no higher token has written."""
        if self.token is None:
            return query
        # `$not` is not implemented on nx-27017, and there a top-level `$or` beside the other
        # fields of an update's filter matches other documents: the `$or` goes in an `$and`.
        unfenced = [{"fence": {"$lte": self.token}}, {"fence": None}]
        return {**query, "$and": [{"$or": unfenced}]}

    def mark(self, doc: Doc) -> Doc:
        """`doc` (a document, or the fields of a `$set`) stamped with the token."""
        return doc if self.token is None else {**doc, "fence": self.token}

    def check(self, collection: Coll[Doc], query: Doc) -> None:
        """After a conditional write of `query` that missed: refused when a higher token wrote
        a document of it (else the condition it changes did not hold)."""
        if self.token is None:
            return
        if collection.find_one({**query, "fence": {"$gt": self.token}}, {"_id": 1}) is not None:
            raise fence_error(self.name, self.holder, f"the write of {collection.name}")

    def replace(self, collection: Coll[Doc], key: str, doc: Doc) -> None:
        """Upserts `doc` (a document, or an update with `$set`) by `_id`: a document a higher
        token wrote misses the filter, and the insert the upsert then tries fails on `_id`."""
        try:
            if "$set" in doc:
                change = {**doc, "$set": self.mark(doc["$set"])}
                collection.update_one(self.only({"_id": key}), change, upsert=True)
            else:
                collection.replace_one(self.only({"_id": key}), self.mark(doc), upsert=True)
        except mongo.DuplicateKeyError:
            self.check(collection, {"_id": key})
            raise


UNFENCED = Fence()


def _iso(at: datetime) -> str:
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="microseconds")


def _doc(record: BaseModel, key: str) -> Doc:
    doc: Doc = record.model_dump(mode="json")
    for name in type(record).model_fields:
        if isinstance(value := getattr(record, name), datetime):
            doc[name] = _iso(value)
    doc["_id"] = key
    return doc


def _parse(model: type[_M], collection: str, doc: Doc | None) -> _M | None:
    if doc is None:
        return None
    key = str(doc.pop("_id", "?"))
    check_schema_version(collection, key, doc.get("schema_version"))
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise CorruptRecordError(collection, key, str(exc)) from exc


def _parse_all(model: type[_M], collection: str, docs: list[Doc]) -> list[_M]:
    return [r for d in docs if (r := _parse(model, collection, d)) is not None]


def _manifest_id(scope: str, name: str) -> str:
    return json.dumps([scope, name])


def _server_now(db: Database[Doc]) -> datetime:
    local = db.command("hello").get("localTime")
    if not isinstance(local, datetime):
        return utcnow()
    return local if local.tzinfo is not None else local.replace(tzinfo=UTC)


def _released_token(db: Database[Doc], name: str) -> int:
    """The token of the lease `name` last released (0: none), for the next one to go on from."""
    return int((db.scheduler_fences.find_one({"_id": name}) or {}).get("token", 0))


def _release_lease(db: Database[Doc], name: str, holder: str) -> bool:
    found = db.scheduler_locks.find_one({"_id": name, "holder": holder})
    if found is None:
        return False
    # Its token before the lease goes: the next lease inserted goes on from it.
    kept = {"$max": {"token": int(found.get("token", 0))}}
    db.scheduler_fences.update_one({"_id": name}, kept, upsert=True)
    return int(db.scheduler_locks.delete_one({"_id": name, "holder": holder}).deleted_count) == 1


def _marker_id(kind: QueueKey, value: str) -> str:
    return f"{kind.value}/{value}"


def _take_key(
    db: Database[Doc], marker: str, entry_id: str, now: datetime, fence: Fence = UNFENCED
) -> bool:
    """Inserts the key's marker for `entry_id`; a stale marker is taken over. False when a
    queued entry holds the key."""
    for _ in range(2):
        try:
            db.work_queue_keys.insert_one(fence.mark({"_id": marker, "entry_id": entry_id,
                                                      "created": _iso(now)}))  # fmt: skip
            return True
        except mongo.DuplicateKeyError:
            held = db.work_queue_keys.find_one({"_id": marker}) or {}
            holder = db.work_queue.find_one({"_id": held.get("entry_id")}, {"status": 1})
            if holder is not None and holder.get("status") == _QUEUED:
                return False
            if holder is None and held.get("entry_id") == entry_id:
                return True  # its own, from a write whose reply was lost
            created = datetime.fromisoformat(str(held.get("created", _iso(now))))
            if holder is None and (now - created).total_seconds() < STALE_MARKER_SECONDS:
                return False
            stale = {"_id": marker, "entry_id": held.get("entry_id")}
            db.work_queue_keys.delete_one(fence.only(stale))
    return False


def _take_keys(
    db: Database[Doc], entry: WorkEntry, now: datetime, fence: Fence = UNFENCED
) -> tuple[set[QueueKey], list[str]]:
    """The keys of `entry` others hold, and the markers taken for it."""
    taken: set[QueueKey] = set()
    markers: list[str] = []
    for kind, value in entry_keys(entry).items():
        marker = _marker_id(kind, value)
        if _take_key(db, marker, entry.id, now, fence):
            markers.append(marker)
        else:
            taken.add(kind)
    return taken, markers


def _drop_keys(
    db: Database[Doc],
    entry_id: str,
    markers: Collection[str] | None = None,
    fence: Fence = UNFENCED,
) -> None:
    query: Doc = {"entry_id": entry_id}
    if markers is not None:
        query["_id"] = {"$in": list(markers)}
    db.work_queue_keys.delete_many(fence.only(query))


def _unlink(db: Database[Doc], entry: Doc, cleared: bool, fence: Fence = UNFENCED) -> None:
    """After the replay link of the queued `entry` (as read before) is `cleared`: its run asks
    afresh too, and the entry gives up its replay key. Also when the link was cleared already
    by a write whose reply was lost, which did neither: its replay marker shows it."""
    prefix = _marker_id(QueueKey.REPLAY, "")
    markers = [m["_id"] for m in db.work_queue_keys.find({"entry_id": entry["_id"]})
               if str(m["_id"]).startswith(prefix)]  # fmt: skip
    if cleared or markers:
        only = fence.only({"_id": entry["run_id"]})
        db.runs.update_one(only, {"$set": fence.mark({"replays": None})})
        _drop_keys(db, entry["_id"], markers, fence)
