"""The scheduler: manifests run as jobs on schedules, failed runs retried with backoff and
dead-lettered, decisions replayed once, retries resumed from checkpoints (spec 003).

The rules are pure modules that import no `ray` and do no I/O, each named for its rule:
`due.py` (when a schedule is due), `failures.py` (counting, backoff, dead letters),
`dispatching.py` (dispatch retries), `replay.py` (which run a retry replays, once),
`decisions.py` (decision keys and their age), `checkpoints.py` (where a retry resumes) and
`cycle.py` (one manifest's turn of the manifest manager, and a trigger). The records are in
`records.py`, the statuses in `status.py`, the options in `options.py`; storage is
`choreography_ray.storage.scheduler`.
"""

from choreography_ray.model import StageShape
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    RequeueResult,
    TriggerResult,
    WorkEntry,
)
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt, Schedule
from choreography_ray.scheduler.status import DeadLetterStatus, EntryKind, RunStatus, WorkStatus

__all__ = [
    "After",
    "Checkpoint",
    "Cron",
    "DeadLetter",
    "DeadLetterStatus",
    "Decision",
    "EntryKind",
    "Every",
    "Manifest",
    "ManifestRun",
    "OnceAt",
    "RequeueResult",
    "RunStatus",
    "Schedule",
    "SchedulerOptions",
    "StageShape",
    "TriggerResult",
    "WorkEntry",
    "WorkStatus",
]
