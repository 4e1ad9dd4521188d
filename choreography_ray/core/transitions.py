"""The job status table: which status may follow which. Anything else is a bug, and raises."""

from __future__ import annotations

from choreography_ray.errors import IllegalTransitionError
from choreography_ray.status import JobStatus as S

#: Where a job with steps running may go: an outcome, a stop, a removal, or a failed hook.
_FROM_RUNNING = frozenset(
    {S.COMPLETED_SUCCESSFULLY, S.COMPLETED_WITH_FAILURES, S.FAILED, S.STOPPED, S.REMOVING}
)

#: Where each status may go. A resume re-enters RUNNING (also from RUNNING: a reactivation).
TRANSITIONS: dict[S, frozenset[S]] = {
    S.NONE: frozenset({S.PREPARING_JOB}),
    S.PREPARING_JOB: frozenset({S.PREPARING_STEPS, S.FAILED, S.STOPPED, S.REMOVING}),
    S.PREPARING_STEPS: frozenset({S.STARTING_STEPS, S.RUNNING, S.FAILED, S.STOPPED, S.REMOVING}),
    S.STARTING_STEPS: _FROM_RUNNING | {S.RUNNING},
    S.RUNNING: _FROM_RUNNING | {S.RUNNING},
    S.STOPPED: frozenset({S.RUNNING, S.FAILED, S.REMOVING}),
    S.COMPLETED_WITH_FAILURES: frozenset({S.RUNNING, S.REMOVING}),
    S.COMPLETED_SUCCESSFULLY: frozenset({S.REMOVING}),
    S.FAILED: frozenset({S.RUNNING, S.REMOVING}),
    S.REMOVING: frozenset(),
}


def check_transition(job_id: str, old: S, new: S) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(f"job {job_id} cannot go from {old} to {new}")
