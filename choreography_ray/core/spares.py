"""Spare job actors: each jobs manager keeps `spare_job_actors` job actors created ahead, for
the ids of the next jobs it starts, so that a start does not wait for an actor to be created
(about a third of a second, most of a small job's latency).

A spare is `job/{id}` for an id no record has yet; it activates at its first call. A spare
nobody took within `SPARE_SECONDS` activates on its own, finds no record and exits, so a manager
that is gone leaves none behind; its manager takes a spare only while it is younger than half
that. A new spare warms up before it is taken (`JobCore.warm`): it reaches storage and the first
step hosts, and imports the job types its manager started last (`recent_types`), so its job's
first turns do not pay for them. `Spares` is the manager's bookkeeping; it imports no Ray (a
spare's actor handle, kept so that a start need not look it up, is opaque here).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

#: Seconds a spare job actor waits for its job before it exits.
SPARE_SECONDS = 600.0
#: The job types a new spare imports ahead: its manager's latest ones.
RECENT_TYPES = 4


class Spare(NamedTuple):
    job_id: str
    #: The spare's actor handle, as its creation returned it.
    handle: Any


class Spares:
    def __init__(self, size: int, max_age: float) -> None:
        self.size = max(0, size)
        self.max_age = max_age
        #: (the spare, monotonic time it was created), oldest first.
        self._ready: deque[tuple[Spare, float]] = deque()
        self.creating = 0
        self._types: deque[str] = deque(maxlen=RECENT_TYPES)

    def take(self, now: float) -> Spare | None:
        """The oldest spare young enough to take, else None; older ones are forgotten (they
        exit on their own)."""
        while self._ready:
            spare, created = self._ready.popleft()
            if now - created < self.max_age:
                return spare
        return None

    def ready(self) -> list[str]:
        """The ids of the spares ready to take, oldest first."""
        return [spare.job_id for spare, _created in self._ready]

    def missing(self) -> int:
        """How many spares to create now."""
        return self.size - len(self._ready) - self.creating

    def add(self, job_id: str, created: float, handle: Any) -> None:
        self._ready.append((Spare(job_id, handle), created))

    def started(self, job_type: str) -> None:
        """A job of `job_type` started: the next spares import it ahead."""
        if job_type in self._types:
            self._types.remove(job_type)
        self._types.append(job_type)

    def recent_types(self) -> list[str]:
        """The latest job types started, the latest last."""
        return list(self._types)
