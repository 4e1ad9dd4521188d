"""The activation's mode: one value, with the table of which mode may follow which.

An activation loads its job's record, then, when its actor was restarted, recovers (carries on
from storage as rehydration would) before it serves anything: as Orleans delivers no request
before `OnActivateAsync` completes, every call and every background turn waits until the
activation has left LOADING and RECOVERING. What it does while it serves is its mode too: it
drives nothing (IDLE), prepares, runs (or waits for a stage's admission, or for its resume hook),
winds a stop down, owes a terminal status's save, or is at rest. docs/decisions.md has the table.
"""

from __future__ import annotations

import enum

from choreography_ray.errors import IllegalTransitionError


class Mode(enum.StrEnum):
    #: Reading its record: calls wait.
    LOADING = "Loading"
    #: A restarted actor carrying on from storage: calls wait until it has.
    RECOVERING = "Recovering"
    #: Its record cannot be read or loaded: calls get the error, and the actor exits; its steps
    #: run on for the next activation to adopt.
    UNLOADED = "Unloaded"
    #: Serves calls, drives nothing: the job has not been started, resumed or recovered here
    #: (or its startup was cut short: the watchdog finishes it through a resume).
    IDLE = "Idle"
    #: `start` reads and stores the plan.
    PREPARING = "Preparing"
    #: Drives the running stage's steps: starts them, counts their outcomes, moves on.
    RUNNING = "Running"
    #: Running, with the next stage waiting for `admit_stage` (asked again on a timer).
    AWAITING_ADMISSION = "AwaitingAdmission"
    #: Resumed, with `on_before_resuming_job_steps` failed: asked again with backoff by the
    #: watchdog; steps adopted from the hosts report meanwhile.
    HOOK_OWED = "HookOwed"
    #: A stop or removal waits for its steps' stops, then runs `on_stopped`.
    STOPPING = "Stopping"
    #: `on_stopped` ran: the final save (or, for a removal, the records' removal) is owed,
    #: retried on the finish timer without running the hook again.
    FINISHING_STOP = "FinishingStop"
    #: A terminal status is decided (its hooks ran) and its save is owed: saved before anything
    #: else, by the pump.
    OWES_STATUS = "OwesStatus"
    #: Ended, or stopped for good: the actor is asked to exit (an operation may reopen the job).
    AT_REST = "AtRest"
    #: The job's records are gone (removed, or dropped by a type that does not keep them).
    REMOVED = "Removed"


#: The modes in which the activation drives its job (it may start steps).
DRIVING = frozenset({Mode.PREPARING, Mode.RUNNING, Mode.AWAITING_ADMISSION, Mode.HOOK_OWED})
#: The modes in which the activation starts steps now (not while it prepares or owes its
#: resume hook).
STEPPING = frozenset({Mode.RUNNING, Mode.AWAITING_ADMISSION})
#: The modes of a stop or removal not final yet.
STOPPING = frozenset({Mode.STOPPING, Mode.FINISHING_STOP})
#: The modes in which calls and background turns are served.
SERVING = frozenset(Mode) - {Mode.LOADING, Mode.RECOVERING, Mode.UNLOADED}
#: What a resume (or RetryFailedSteps) goes to: running, unless its hook failed or the stage
#: waits for admission.
_RESUMED = frozenset({Mode.RUNNING, Mode.AWAITING_ADMISSION, Mode.HOOK_OWED})
#: A job's outcome may be decided (a hook threw, the last stage ended, a plan was missing).
_ENDS = frozenset({Mode.OWES_STATUS, Mode.AT_REST, Mode.REMOVED})

#: Where each mode may go.
TRANSITIONS: dict[Mode, frozenset[Mode]] = {
    Mode.LOADING: frozenset({Mode.RECOVERING, Mode.IDLE, Mode.AT_REST, Mode.UNLOADED}),
    # Recovery resumes the job or finishes its stop; a job it finds nothing to do for is idle.
    Mode.RECOVERING: SERVING - {Mode.PREPARING},
    Mode.UNLOADED: frozenset(),
    Mode.IDLE: frozenset({Mode.PREPARING, Mode.STOPPING, *_RESUMED, *_ENDS}),
    # A first stage that could not begin leaves startup to the watchdog (IDLE).
    Mode.PREPARING: frozenset({Mode.IDLE, Mode.STOPPING, *_RESUMED, *_ENDS}),
    # A first stage that could not begin once RUNNING was entered leaves startup to the
    # watchdog (IDLE); a RUNNING save that failed in start's last turn stays, the save owed.
    Mode.RUNNING: frozenset({Mode.IDLE, Mode.STOPPING, *_RESUMED, *_ENDS}),
    Mode.AWAITING_ADMISSION: frozenset({Mode.IDLE, Mode.STOPPING, *_RESUMED, *_ENDS}),
    Mode.HOOK_OWED: frozenset({Mode.IDLE, Mode.STOPPING, *_RESUMED, *_ENDS}),
    Mode.STOPPING: frozenset({*STOPPING, *_RESUMED, *_ENDS}),
    Mode.FINISHING_STOP: frozenset({*STOPPING, *_RESUMED, *_ENDS}),
    Mode.OWES_STATUS: frozenset({Mode.AT_REST, Mode.REMOVED}),
    # A removal, a resume of a stopped job, RetryFailedSteps reopen a job at rest.
    Mode.AT_REST: frozenset({Mode.STOPPING, *_RESUMED, *_ENDS}),
    Mode.REMOVED: frozenset(),
}


class Exit(enum.StrEnum):
    """Why an activation asks its actor to exit: what becomes of the job's dedicated step
    actors."""

    #: The job is at rest (ended, stopped for good, removed, or not stored): its dedicated step
    #: actors go with it.
    AT_REST = "AtRest"
    #: Its record could not be loaded: its steps run on, for the next activation to adopt.
    UNLOADED = "Unloaded"


#: The modes in which the actor is asked to exit, and why.
EXITS = {Mode.AT_REST: Exit.AT_REST, Mode.REMOVED: Exit.AT_REST, Mode.UNLOADED: Exit.UNLOADED}


def check_mode(job_id: str, old: Mode, new: Mode) -> Mode:
    """`new`, when the table allows it after `old` (or it is `old`); else
    IllegalTransitionError."""
    if new is not old and new not in TRANSITIONS[old]:
        raise IllegalTransitionError(f"job {job_id}'s activation cannot go from {old} to {new}")
    return new
