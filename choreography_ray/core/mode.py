"""The activation's mode: one value, with the table of which mode may follow which.

An activation loads its job's record, then, when its actor was restarted, recovers (carries on
from storage as rehydration would) before it serves anything: as Orleans delivers no request
before `OnActivateAsync` completes, every call and every background turn waits until the mode
is SERVING. An activation whose record is missing or cannot be loaded serves nothing: its
calls get the error, and its actor exits.

This is the first part of the state machine of issue 23; what an activation does while it
serves (starting, running, a hook owed, stopping, removing) still lives in `JobCore`'s flags.
"""

from __future__ import annotations

import enum

from choreography_ray.errors import IllegalTransitionError


class Mode(enum.StrEnum):
    #: Reading its record: calls wait.
    LOADING = "Loading"
    #: A restarted actor carrying on from storage: calls wait until it has.
    RECOVERING = "Recovering"
    #: Calls and background turns are served, one turn at a time.
    SERVING = "Serving"
    #: No job to serve (no record, or one that cannot be loaded): calls get the error.
    UNLOADED = "Unloaded"


#: Where each mode may go.
TRANSITIONS: dict[Mode, frozenset[Mode]] = {
    Mode.LOADING: frozenset({Mode.RECOVERING, Mode.SERVING, Mode.UNLOADED}),
    Mode.RECOVERING: frozenset({Mode.SERVING}),
    Mode.SERVING: frozenset(),
    Mode.UNLOADED: frozenset(),
}


class Exit(enum.StrEnum):
    """Why an activation asks its actor to exit: what becomes of the job's dedicated step
    actors."""

    #: The job is at rest (ended, stopped for good, removed, or not stored): its dedicated step
    #: actors go with it.
    AT_REST = "AtRest"
    #: Its record could not be loaded: its steps run on, for the next activation to adopt.
    UNLOADED = "Unloaded"


def check_mode(job_id: str, old: Mode, new: Mode) -> Mode:
    """`new`, when the table allows it after `old`; else IllegalTransitionError."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(f"job {job_id}'s activation cannot go from {old} to {new}")
    return new
