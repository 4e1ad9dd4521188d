"""Run retention: which of a manifest's runs the cleanup deletes, with their decisions,
checkpoints and work entries (docs/retention.md, "Scheduler metadata").

Per manifest, a run is kept while any of these holds, and deleted otherwise:

- it is one of the manifest's newest `runs_kept` runs, or it ended (never ended: was queued)
  less than `run_retention` ago, or it has not finished;
- a retry still needs it: a failure inside the manifest's failure window (it counts), the
  latest finished run (the next retry follows it), and the latest success and cancellation of
  the manifest's own runs (the points its schedule counts from; a dependent's parent's too);
- a dead letter names it (`run_id`: what its requeue replays and resumes);
- a queued entry names it (its run, the run it replays, resumes or requeues);
- a kept run resumed from it (the checkpoints a second resume follows back);
- it replays a kept run (the spec's "it never deletes a run that replays another while it
  keeps the run replayed"; both expired, they go in the same write).

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from choreography_ray.scheduler import cycle, failures
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun, WorkEntry
from choreography_ray.scheduler.status import RunStatus

#: Runs past the newest `runs_kept` a cleanup pass reads per manifest (the rest wait).
CLEANUP_BATCH = 1000


def needed(
    manifest: Manifest,
    runs: Sequence[ManifestRun],
    dead_letters: Iterable[DeadLetter],
    entries: Iterable[WorkEntry],
    options: SchedulerOptions,
    now: datetime,
) -> set[str]:
    """The ids of `runs` (the manifest's, newest first) that are kept."""
    kept = {r.id for r in runs[: options.runs_kept]}
    counted_since = now - failures.failure_window(manifest, options)
    expired = now - options.run_retention
    for run in runs:
        ended = run.ended_at or run.queued_at
        if (
            not run.status.is_finished
            or ended >= expired
            or (run.status is RunStatus.FAILED and run.counted_from >= counted_since)
        ):
            kept.add(run.id)
    own = cycle.own_runs(runs)
    for latest in (
        cycle.latest_finished(own),
        cycle.latest_success(own),
        max((r for r in own if r.status is RunStatus.CANCELLED),
            key=lambda r: r.ended_at or r.queued_at, default=None),
    ):  # fmt: skip
        if latest is not None:
            kept.add(latest.id)
    kept |= {d.run_id for d in dead_letters if d.run_id is not None}
    for entry in entries:
        kept |= {i for i in (entry.run_id, entry.replays, entry.resume_from, entry.requeues) if i}
    return _closed(kept, runs)


def _closed(kept: set[str], runs: Sequence[ManifestRun]) -> set[str]:
    """`kept` with the runs a kept run resumed from and the runs that replay a kept run,
    until nothing changes."""
    while True:
        more = {r.resumed_from for r in runs if r.id in kept and r.resumed_from is not None}
        more |= {r.id for r in runs if r.replays is not None and r.replays in kept}
        if more <= kept:
            return kept
        kept |= more


def doomed(
    manifest: Manifest,
    runs: Sequence[ManifestRun],
    dead_letters: Iterable[DeadLetter],
    entries: Iterable[WorkEntry],
    options: SchedulerOptions,
    now: datetime,
) -> list[str]:
    """The ids of `runs` the cleanup deletes, oldest first."""
    kept = needed(manifest, runs, dead_letters, entries, options, now)
    return [r.id for r in reversed(runs) if r.id not in kept]
