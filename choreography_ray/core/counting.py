"""Counted outcomes: each step's outcome counts once per execution, and across activations.

After a resume or RetryFailedSteps reopens an execution, the job records the identities of the
steps whose outcome it counted (`CompletedStepsCounted`) and, always, those whose stop it counted
(`StoppedStepsCounted`). A stop from an earlier execution is taken back when the step's outcome
then counts. New records and take-backs are buffered and written with the next save, before the
job record, so a saved count never runs ahead of its records.
"""

from __future__ import annotations

from choreography_ray.logs import get_logger
from choreography_ray.storage import CountedKind, Storage

log = get_logger(__name__)

#: Counted-step records past which the job warns (and keeps recording), as the spec does.
COUNTED_WARNING_THRESHOLD = 100_000


class Counting:
    def __init__(self) -> None:
        #: Whether outcomes are recorded (the job resumed or reopened at least once).
        self.records = False
        self.counted: set[str] = set()
        self.stopped: set[str] = set()
        #: Buffered until the next save: new records (ordered) and take-backs, by kind.
        self._new: dict[CountedKind, dict[str, None]] = {kind: {} for kind in CountedKind}
        self._removed: dict[CountedKind, set[str]] = {kind: set() for kind in CountedKind}

    @property
    def unsaved(self) -> bool:
        return any(self._new.values()) or any(self._removed.values())

    async def load(self, storage: Storage, job_id: str, records: bool) -> None:
        self.records = records
        if records:
            self.counted = set(await storage.list_counted(job_id, CountedKind.COMPLETED))
        self.stopped = set(await storage.list_counted(job_id, CountedKind.STOPPED))

    def count_stop(self, step_id: str) -> bool:
        """Records a stop; False when this step's stop is counted already."""
        if step_id in self.stopped:
            return False
        self.stopped.add(step_id)
        self._add(CountedKind.STOPPED, step_id)
        return True

    def take_back_stop(self, step_id: str) -> bool:
        """Takes back the stop of an earlier execution; False when there was none."""
        if step_id not in self.stopped:
            return False
        self.stopped.discard(step_id)
        self._remove(CountedKind.STOPPED, step_id)
        return True

    def is_counted(self, step_id: str) -> bool:
        return step_id in self.counted

    def count_outcome(self, step_id: str) -> None:
        if not self.records:
            return
        self.counted.add(step_id)
        self._add(CountedKind.COMPLETED, step_id)
        if len(self.counted) == COUNTED_WARNING_THRESHOLD:
            log.warning(
                "a job has %d counted-step records; recording goes on", COUNTED_WARNING_THRESHOLD
            )

    def uncount_outcome(self, step_id: str) -> None:
        """A counted failure runs again (RetryFailedSteps): its record goes."""
        self.counted.discard(step_id)
        self._remove(CountedKind.COMPLETED, step_id)

    def _add(self, kind: CountedKind, step_id: str) -> None:
        self._removed[kind].discard(step_id)
        self._new[kind][step_id] = None

    def _remove(self, kind: CountedKind, step_id: str) -> None:
        self._new[kind].pop(step_id, None)
        self._removed[kind].add(step_id)

    async def flush(self, storage: Storage, job_id: str) -> None:
        """Writes the buffered take-backs of every kind, then the new records, so no step is
        stored as counted both ways (a stop taken back for its outcome); what was not written
        stays buffered (adding a record is idempotent)."""
        for kind in CountedKind:
            removed = self._removed[kind]
            for step_id in sorted(removed):
                await storage.remove_counted(job_id, kind, step_id)
                removed.discard(step_id)
        for kind in CountedKind:
            new = self._new[kind]
            if new:
                await storage.add_counted(job_id, kind, list(new))
                new.clear()
