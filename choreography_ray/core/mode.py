"""The activation's mode: one value, with the table of which mode may follow which, and the
table of what each operation does in each mode (`OPERATIONS`), the one guard of the flows.

An activation loads its job's record, then, when its actor was restarted, recovers (carries on
from storage as rehydration would) before it serves anything: as Orleans delivers no request
before `OnActivateAsync` completes, every call and every background turn waits until the
activation has left LOADING and RECOVERING. What it does while it serves is its mode too: it
drives nothing (IDLE), prepares, runs (or waits for a stage's admission, or for its resume hook),
winds a stop down, owes a terminal status's save, or is at rest. docs/decisions.md has the table.
"""

from __future__ import annotations

import enum

from choreography_ray.errors import (
    IllegalTransitionError,
    JobOperationError,
    OperationErrorCode,
    RemoveJobError,
    ResumeJobError,
    RetryFailedStepsError,
    StartJobError,
    StopJobError,
)


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


class Op(enum.StrEnum):
    """What is asked of an activation: a caller's operation, or one of its own turns."""

    START = "start"
    STOP = "stop"
    REMOVE = "remove"
    RESUME = "resume"
    RECOVER = "recover"
    RETRY_FAILED = "retry failed steps"
    REPORT = "report"
    #: A pass of the reconciler (`tick.reconcile`): a kick of the pump, or a watchdog tick.
    RECONCILE = "reconcile"
    EXIT = "exit"


class Act(enum.StrEnum):
    """What an operation does in a mode."""

    #: Carried out; its own rules read the job's status (a stop of a job whose stop an earlier
    #: activation left is refused by its status, not its mode).
    RUN = "run"
    #: Answered with nothing done: the job runs here already, or there is nothing to do.
    NOTHING = "nothing"
    #: Refused with the operation's error (`REFUSALS`).
    REFUSE = "refuse"
    #: Waits until the activation serves (the calls get the load's error when it cannot).
    WAIT = "wait"
    #: A removal of a job whose outcome is decided: that outcome is saved first, then the job
    #: is removed as one at rest.
    SAVE_OWED_FIRST = "save owed first"
    #: A recover of a stop whose `on_stopped` ran: its final save is finished, the hook not
    #: run again.
    FINISH_STOP = "finish stop"
    #: A stop or removal of a job this activation does not drive (its recover failed, or has
    #: not come): carried on from storage, as one an earlier activation left.
    FROM_STORAGE = "from storage"


_RUN, _NOTHING, _REFUSE, _STORED = Act.RUN, Act.NOTHING, Act.REFUSE, Act.FROM_STORAGE


def _row(
    idle: Act,
    preparing: Act,
    driving: Act,
    stopping: Act,
    finishing: Act,
    owes: Act,
    at_rest: Act,
    removed: Act,
) -> dict[Mode, Act]:
    """One operation's row over the serving modes (`driving`: RUNNING, AWAITING_ADMISSION and
    HOOK_OWED alike); before the activation serves, every operation waits."""
    return {
        Mode.LOADING: Act.WAIT,
        Mode.RECOVERING: Act.WAIT,
        Mode.UNLOADED: Act.WAIT,
        Mode.IDLE: idle,
        Mode.PREPARING: preparing,
        Mode.RUNNING: driving,
        Mode.AWAITING_ADMISSION: driving,
        Mode.HOOK_OWED: driving,
        Mode.STOPPING: stopping,
        Mode.FINISHING_STOP: finishing,
        Mode.OWES_STATUS: owes,
        Mode.AT_REST: at_rest,
        Mode.REMOVED: removed,
    }


#: What each operation does in each mode. docs/decisions.md has it as a table.
OPERATIONS: dict[Op, dict[Mode, Act]] = {
    #              idle    preparing driving  stopping finishing owes    at rest  removed
    Op.START: _row(_RUN, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE),
    Op.STOP: _row(_STORED, _RUN, _RUN, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE),
    Op.REMOVE: _row(_STORED, _RUN, _RUN, _RUN, _RUN, Act.SAVE_OWED_FIRST, _RUN, _REFUSE),
    Op.RESUME: _row(_RUN, _NOTHING, _NOTHING, _RUN, _RUN, _NOTHING, _RUN, _REFUSE),
    Op.RECOVER: _row(_RUN, _NOTHING, _NOTHING, _RUN, Act.FINISH_STOP, _NOTHING, _NOTHING, _NOTHING),
    Op.RETRY_FAILED: _row(_REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _REFUSE, _RUN, _REFUSE),
    Op.REPORT: _row(_RUN, _RUN, _RUN, _RUN, _RUN, _RUN, _RUN, _RUN),
    Op.RECONCILE: _row(_RUN, _NOTHING, _RUN, _RUN, _RUN, _RUN, _NOTHING, _NOTHING),
    Op.EXIT: _row(_NOTHING, _NOTHING, _NOTHING, _NOTHING, _NOTHING, _NOTHING, _RUN, _RUN),
}
# The recovery on reactivation is the one operation RECOVERING serves; an activation that
# could not load exits.
OPERATIONS[Op.RECOVER][Mode.RECOVERING] = Act.RUN
OPERATIONS[Op.EXIT][Mode.UNLOADED] = Act.RUN

#: The spec's error of each operation that can be refused.
REFUSALS: dict[Op, OperationErrorCode] = {
    Op.START: StartJobError.JOB_ALREADY_EXISTS,
    Op.STOP: StopJobError.JOB_IS_NOT_RUNNING,
    Op.REMOVE: RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED,
    Op.RESUME: ResumeJobError.JOB_IS_BEING_REMOVED,
    Op.RETRY_FAILED: RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES,
}

#: How a refusal names the mode that refused.
_SAYS = {
    Mode.STOPPING: "is stopping",
    Mode.FINISHING_STOP: "is stopping",
    Mode.OWES_STATUS: "has ended; its status is being saved",
    Mode.REMOVED: "is removed",
}


def act(op: Op, mode: Mode, job_id: str, status: str) -> Act:
    """What `op` does in `mode`: the one guard of every flow. A refused operation raises
    JobOperationError with the spec's error, naming the job and why."""
    action = OPERATIONS[op][mode]
    if action is Act.REFUSE:
        says = _SAYS.get(mode, f"is {status}")
        raise JobOperationError(REFUSALS[op], f"job {job_id} {says}: {op} is refused")
    return action
