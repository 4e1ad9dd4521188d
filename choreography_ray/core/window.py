"""The active window and the start throttle: which steps start, on which host, and when.

The job hands steps of the running stage to step hosts in batches (one start operation = one
RPC of at most `step_batch_size` steps). Never more than the window (`max_active_steps_per_job`
or the job type's `max_active_steps`; below 1 is 1) run at once, and never more than
`max_concurrent_step_starts` steps are being started at once: the throttle counts steps, not
RPCs, so it bounds the load a burst of starts puts on storage and hosts whatever the batch size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from choreography_ray.core.messages import StepStart
from choreography_ray.options import JobsOptions, window_size


@dataclass(slots=True)
class Window:
    options: JobsOptions
    size: float = math.inf
    #: Steps of the running stage waiting to start, in order.
    pending: deque[StepStart] = field(default_factory=deque)
    #: Steps started (or being started) in this activation: step id -> (start, host).
    active: dict[str, tuple[StepStart, str]] = field(default_factory=dict)
    #: Steps whose start operation threw: they start again after a delay or on the next tick.
    start_failed: list[StepStart] = field(default_factory=list)
    #: Steps in start operations not yet answered.
    starting: set[str] = field(default_factory=set)
    #: Steps whose next attempt is a retry not yet taken by a host: pending, in an unanswered
    #: start operation, or whose start threw (a stop counts those that never ran as failed).
    retrying: set[str] = field(default_factory=set)

    def configure(self, configured: int | None) -> None:
        """The job type's `max_active_steps`, else the option; None is no window."""
        if configured is None:
            configured = self.options.max_active_steps_per_job
        size = window_size(configured)
        self.size = math.inf if size is None else size

    def next_batch(self) -> list[StepStart]:
        """The next steps to start, as the window and the throttle allow (empty: none now)."""
        room = min(
            self.size - len(self.active),
            self.options.effective_max_concurrent_step_starts - len(self.starting),
            self.options.step_batch_size,
        )
        batch: list[StepStart] = []
        while self.pending and len(batch) < room:
            batch.append(self.pending.popleft())
        return batch

    def started(self, batch: Iterable[StepStart], host: str) -> None:
        """The batch is active on `host` and counts against the throttle until answered."""
        for start in batch:
            self.active[start.step_id] = (start, host)
            self.starting.add(start.step_id)

    def answered(self, batch: list[StepStart], ok: bool) -> list[StepStart]:
        """A start operation came back; when it threw, its steps still active at the same
        attempt wait to start again. Returns those."""
        self.starting.difference_update(s.step_id for s in batch)
        if ok:
            # A host took the retry: from now on the attempt reports its own outcome.
            self.retrying.difference_update(s.step_id for s in batch)
            return []
        failed = [s for s in batch if self.active.get(s.step_id, (None,))[0] == s]
        for start in failed:
            del self.active[start.step_id]
        self.start_failed.extend(failed)
        return failed

    def take(self, step_id: str, attempt: int) -> tuple[StepStart, str] | None:
        """The active step at that attempt, no longer active; None when it is not."""
        entry = self.active.get(step_id)
        if entry is None or entry[0].attempt != attempt:
            return None
        return self.active.pop(step_id)

    def requeue(self, starts: Iterable[StepStart], front: bool = True) -> None:
        starts = list(starts)
        for start in starts:
            self.active.pop(start.step_id, None)
        if front:
            self.pending.extendleft(reversed(starts))
        else:
            self.pending.extend(starts)

    def retry(self, due: list[StepStart]) -> None:
        """Due retries wait first in line."""
        self.retrying.update(start.step_id for start in due)
        self.requeue(due)

    def on_host(self, host: str) -> list[StepStart]:
        return [start for start, h in self.active.values() if h == host]

    def hosts(self) -> set[str]:
        return {host for _, host in self.active.values()}

    def never_started(self) -> list[StepStart]:
        """Pending and failed-to-start steps, removed (a stop counts them as stopped)."""
        steps = [*self.pending, *self.start_failed]
        self.pending.clear()
        self.start_failed.clear()
        self.retrying.clear()
        return steps

    def clear(self) -> None:
        self.retrying.clear()
        self.pending.clear()
        self.active.clear()
        self.start_failed.clear()
