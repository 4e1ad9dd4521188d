"""The documents, unique-key markers and conversions of `mongodb.py` (which documents the
collections): each runs on the database inside one call of the provider's thread."""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pymongo import errors as mongo
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


def _marker_id(kind: QueueKey, value: str) -> str:
    return f"{kind.value}/{value}"


def _take_key(db: Database[Doc], marker: str, entry_id: str, now: datetime) -> bool:
    """Inserts the key's marker for `entry_id`; a stale marker is taken over. False when a
    queued entry holds the key."""
    for _ in range(2):
        try:
            db.work_queue_keys.insert_one({"_id": marker, "entry_id": entry_id,
                                           "created": _iso(now)})  # fmt: skip
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
            db.work_queue_keys.delete_one({"_id": marker, "entry_id": held.get("entry_id")})
    return False


def _take_keys(
    db: Database[Doc], entry: WorkEntry, now: datetime
) -> tuple[set[QueueKey], list[str]]:
    """The keys of `entry` others hold, and the markers taken for it."""
    taken: set[QueueKey] = set()
    markers: list[str] = []
    for kind, value in entry_keys(entry).items():
        marker = _marker_id(kind, value)
        if _take_key(db, marker, entry.id, now):
            markers.append(marker)
        else:
            taken.add(kind)
    return taken, markers


def _drop_keys(db: Database[Doc], entry_id: str, markers: Collection[str] | None = None) -> None:
    query: Doc = {"entry_id": entry_id}
    if markers is not None:
        query["_id"] = {"$in": list(markers)}
    db.work_queue_keys.delete_many(query)


def _unlink(db: Database[Doc], entry: Doc, cleared: bool) -> None:
    """After the replay link of the queued `entry` (as read before) is `cleared`: its run asks
    afresh too, and the entry gives up its replay key. Also when the link was cleared already
    by a write whose reply was lost, which did neither: its replay marker shows it."""
    prefix = _marker_id(QueueKey.REPLAY, "")
    markers = [m["_id"] for m in db.work_queue_keys.find({"entry_id": entry["_id"]})
               if str(m["_id"]).startswith(prefix)]  # fmt: skip
    if cleared or markers:
        db.runs.update_one({"_id": entry["run_id"]}, {"$set": {"replays": None}})
        _drop_keys(db, entry["_id"], markers)
