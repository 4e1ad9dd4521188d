"""Progress as the job page draws it: bar segments, and the rate and ETA of a running job.

The rate is measured, not averaged over the job's life: each time the page or its live fragment
reads a running job, `RateTracker` keeps (time, steps done) and reports the slope over the last
`RATE_WINDOW` seconds. With a single sample (the first look at a job) it falls back to the average
since the job last entered RUNNING; that is the rate a freshly opened page shows, and a resumed
job's average includes the steps of its earlier executions, so it reads high until a second sample.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from choreography_ray.model import JobProgress, JobState, StageProgress, utcnow
from choreography_ray.status import JobStatus

#: Seconds of samples the measured rate spans.
RATE_WINDOW = 30.0
#: Jobs whose samples are kept; the least recently read is forgotten first.
TRACKED_JOBS = 1_000
#: Statuses in which steps run, so a rate and an ETA mean something.
RUNNING = frozenset({JobStatus.STARTING_STEPS, JobStatus.RUNNING})


@dataclass(frozen=True, slots=True)
class Bar:
    """One progress bar: each count and its share of `total` in percent (the rest is to do)."""

    total: int
    successful: int
    failed: int
    unreachable: int
    stopped: int

    @classmethod
    def of(cls, progress: JobProgress | StageProgress) -> Bar:
        return cls(progress.total_steps, progress.successful_steps, progress.failed_steps,
                   progress.unreachable_steps, progress.stopped_steps)  # fmt: skip

    @property
    def done(self) -> int:
        """Steps with an outcome: what counts toward completion."""
        return self.successful + self.failed + self.unreachable

    def share(self, count: int) -> float:
        """`count` in percent of the total, rounded to a hundredth."""
        return round(100.0 * count / self.total, 2) if self.total else 0.0

    def segments(self) -> list[tuple[str, int, float, float]]:
        """(kind, count, x, width) of each non-empty segment, x and width in percent: the
        successful steps first, then failed, unreachable and stopped."""
        found: list[tuple[str, int, float, float]] = []
        x = 0.0
        counts = (("successful", self.successful), ("failed", self.failed),
                  ("unreachable", self.unreachable), ("stopped", self.stopped))  # fmt: skip
        for kind, count in counts:
            if count:
                width = self.share(count)
                found.append((kind, count, x, width))
                x += width
        return found


@dataclass(frozen=True, slots=True)
class Pace:
    """Steps per second and the seconds left at that rate (None when unknown)."""

    rate: float | None
    eta: float | None
    #: "measured" over recent samples, or "average" since the job entered RUNNING.
    basis: str


def running_since(state: JobState) -> float | None:
    """Seconds since the job last entered RUNNING (or STARTING_STEPS), by its status history."""
    for change in reversed(state.status_changes):
        if change.status in RUNNING:
            return max((utcnow() - change.occurred).total_seconds(), 0.0)
    return None


class RateTracker:
    """Recent (time, steps done) samples per job; bounded in jobs and in time."""

    def __init__(self, window: float = RATE_WINDOW, jobs: int = TRACKED_JOBS) -> None:
        self.window = window
        self.jobs = jobs
        self._samples: OrderedDict[str, deque[tuple[float, int]]] = OrderedDict()

    def pace(self, state: JobState, now: float | None = None) -> Pace | None:
        """The job's pace while it runs, after recording this look at it; None otherwise."""
        if state.status not in RUNNING:
            self._samples.pop(state.id, None)
            return None
        now = time.monotonic() if now is None else now
        bar = Bar.of(state.progress)
        samples = self._record(state.id, now, bar.done)
        left = max(bar.total - bar.done - bar.stopped, 0)
        (t0, done0), (t1, done1) = samples[0], samples[-1]
        rate: float | None
        if t1 - t0 >= 1.0:
            rate, basis = max(done1 - done0, 0) / (t1 - t0), "measured"
        else:
            elapsed = running_since(state)
            rate = bar.done / elapsed if elapsed else None
            basis = "average"
        eta = left / rate if rate else (0.0 if left == 0 else None)
        return Pace(rate, eta, basis)

    def _record(self, job_id: str, now: float, done: int) -> deque[tuple[float, int]]:
        samples = self._samples.pop(job_id, None) or deque()
        self._samples[job_id] = samples
        while len(self._samples) > self.jobs:
            self._samples.popitem(last=False)
        if samples and done < samples[-1][1]:
            samples.clear()  # counted again from storage (a recount): start over
        samples.append((now, done))
        while len(samples) > 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        return samples
