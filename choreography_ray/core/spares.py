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

A new spare is a new process: most of a core for half a second here. A start replaces the spare
it took a moment in (`REFILL_SECONDS` in the manager), once it has answered. A start still
preparing then has a large plan (`large_start`): alone, its job would share the machine with the
new process while it writes its plan, so the next spare waits until the job settles. When large
jobs follow one another (another runs; or a start found no spare ready while one was being
made, and each came within `FOLLOW_SECONDS` of the one before settling), the next start is
near, and finds a spare ready only if it is made now.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

#: Seconds a spare job actor waits for its job before it exits.
SPARE_SECONDS = 600.0
#: The job types a new spare imports ahead: its manager's latest ones.
RECENT_TYPES = 4
#: Seconds after a large job settles within which the next large start still follows it: about
#: what a new spare takes to be made and warmed here.
FOLLOW_SECONDS = 2.0


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
        #: The large jobs not seen settled yet, each True when the next spare waits for it.
        self.large: dict[str, bool] = {}
        #: When a large job was last seen settled (monotonic), None before the first.
        self.large_settled_at: float | None = None
        #: Starts outpace the spares: one found none ready while one was being made or waited
        #: for a large job, and no large start came FOLLOW_SECONDS after one settled since.
        self.following = False
        self._types: deque[str] = deque(maxlen=RECENT_TYPES)

    def take(self, now: float) -> Spare | None:
        """The oldest spare young enough to take, else None; older ones are forgotten (they
        exit on their own). None while one is being made, or waits for a large job: starts
        outpace the spares (`following`)."""
        while self._ready:
            spare, created = self._ready.popleft()
            if now - created < self.max_age:
                return spare
        if self.creating or any(self.large.values()):
            self.following = True
        return None

    def ready(self) -> list[str]:
        """The ids of the spares ready to take, oldest first."""
        return [spare.job_id for spare, _created in self._ready]

    def missing(self) -> int:
        """How many spares to create now."""
        return self.size - len(self._ready) - self.creating

    def add(self, job_id: str, created: float, handle: Any) -> None:
        self._ready.append((Spare(job_id, handle), created))

    def large_start(self, job_id: str, now: float, took_spare: bool) -> bool:
        """A start still preparing when its spare is to be replaced (a large plan): True when
        the next spare waits until its job settles (`settled`), which it does when the job
        runs alone (it took a spare, and large jobs do not follow one another). A start that
        took none while none follows (a manager's first, which made its own actor) is not
        kept."""
        settled = self.large_settled_at
        if not self.large and settled is not None and now - settled >= FOLLOW_SECONDS:
            self.following = False
        following = self.following or bool(self.large)
        if not took_spare and not following:
            return False
        waits = took_spare and not following
        self.large[job_id] = waits
        return waits

    def settled(self, job_id: str, now: float) -> bool:
        """The job is seen settled (or has run long enough): True when the next spare waited
        for it, and is made now."""
        waits = self.large.pop(job_id, None)
        if waits is None:
            return False
        self.large_settled_at = now
        return waits

    def started(self, job_type: str) -> None:
        """A job of `job_type` started: the next spares import it ahead."""
        if job_type in self._types:
            self._types.remove(job_type)
        self._types.append(job_type)

    def recent_types(self) -> list[str]:
        """The latest job types started, the latest last."""
        return list(self._types)
