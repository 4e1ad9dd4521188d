"""The invariants a chaos run is checked against, once every job has settled.

1. every job settles within the bound: a terminal status, `STOPPED` with its stop final when
   a stop was the last operator word, or gone when it was removed (`expectations`);
2. per step, the counted outcome matches its last attempt: a step missing from storage ended
   `ok` at its highest attempt, a stored failure is that attempt's failure, an `UNREACHABLE`
   step never ran;
3. no outcome counted twice: the job's progress (totals and per stage) equals what its stored
   steps say, and the counts add up to its steps;
4. a step whose outcome was stored runs again at the same attempt only if it was in flight at
   a fault that can lose a step or a write (`faults.LOSSY`); such re-runs are counted;
5. `on_completed` ran at most once per completion (a successful retry-failed reopens the job);
6. nothing is left behind: after a remove no job record, steps, counted records or actors;
   after a job settles, no job actor and no dedicated step actor;
7. a job whose pool no node can place (`unplaceable_pool`) holds up nothing: every other job
   settled within the bound beside it (1.), its start and its stop each answered within
   `UNPLACEABLE_BOUND`, it ended STOPPED with every step counted stopped (stored STOPPED, or
   SCHEDULED as a step that never started), none of its steps ran, and no pool host of its
   shape ever existed (a storage fault at its start may fail it first, FAILED with no plan:
   the harness's stop then finds it not running);
8. in a run with pools, no pool host is left that Ray has not placed;
9. step outputs: a settled job's stored outputs, read in pages (`output_pages`), are exactly
   one per succeeded step (a step whose record is gone, as 2. counts it) and none of a step
   stored failed, stopped, unreachable or never started; each was written by an attempt of
   its step that ended `ok`, at that step's stage; a removed job has none left (6.).
"""

from __future__ import annotations

import functools
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chaos.faults import LOSSY, MONGODB_FAULTS, STOPS, STORAGE_FAULTS, ChaosCluster
from tests.chaos.jobs import UNPLACEABLE_SHAPE, ChaosOutput
from tests.support import in_storage, read_trace

#: Seconds after a step's perform ended within which its outcome may still be unwritten (the
#: group commit, a busy 2-core machine): a lossy fault then may still make it run again.
WRITE_GRACE = 3.0

#: Seconds a removal, or an actor's exit after its job settled, may take.
CLEANUP_TIMEOUT = 30.0

#: Seconds the start of an unplaceable job, and its stop, may take to answer (the defect of
#: issue 34: neither answered until a node that fits joined).
UNPLACEABLE_BOUND = 30.0

#: Outputs read per page by `check_outputs`: small, so that a chaos job's are several pages.
OUTPUT_PAGE = 100

#: Ray's states of an actor that is placed, or gone.
PLACED_OR_GONE = ("ALIVE", "DEAD")

TERMINAL = ("CompletedSuccessfully", "CompletedWithFailures", "Failed")
FAILED_STATUSES = ("CompletedWithFailure", "Failed")


@dataclass
class Expectation:
    may_stop: bool = False
    removed: bool = False
    #: A remove answered UNKNOWN: the job is removed unless the remove never stored REMOVING
    #: (storage refused it), which leaves the job as it was (`untouched_by_remove`).
    remove_unsure: bool = False

    def satisfied_by(self, status: str) -> bool:
        if self.removed:
            return status == "removed"
        return status in TERMINAL or (self.may_stop and status == "stopped")

    def describe(self) -> str:
        if self.removed:
            return "removed"
        return "terminal" + (" or stopped" if self.may_stop else "")


def expectations(faults: Sequence[Any], job_ids: Sequence[str]) -> dict[str, Expectation]:
    """What each job must end as, from the operator actions that were answered."""
    out = {j: Expectation() for j in job_ids}
    for fault in faults:
        expectation = out[fault.job]
        if fault.kind == "op_remove" and fault.answer in ("ok", "JobIsAlreadyBeingRemoved"):
            expectation.removed = True
        elif fault.kind == "op_remove" and fault.answer is not None:
            # UNKNOWN: the finish is retried on a timer, or REMOVING was never stored.
            expectation.removed = expectation.remove_unsure = True
        elif fault.kind in STOPS and fault.answer == "ok":
            expectation.may_stop = True
        elif fault.kind in ("op_resume", "op_double_resume", "op_retry_failed") and (
            fault.answer == "ok"
        ):
            expectation.may_stop = False
    return out


def untouched_by_remove(state: Any) -> bool:
    """The job's record never had the status REMOVING: a remove that raised did not take."""
    return state is not None and all(str(c.status) != "Removing" for c in state.status_changes)


def progress_again(
    progress: dict[str, list[tuple[float, int]]],
    running: Sequence[str],
    began: float,
    ended: float,
) -> float | None:
    """Seconds from the fault's start until every job it found running counted a further
    outcome after the fault's effect ended (None when it found no job running, or a job never
    counted one again: it was stopped, removed, or had nothing left to do)."""
    latest: float | None = None
    for job_id in running:
        series = progress.get(job_id, [])
        before = [done for at, done in series if at <= began]
        base = before[-1] if before else 0
        after = [at for at, done in series if at > ended and done > base]
        if after:
            latest = max(latest or 0.0, after[0] - began)
    return None if latest is None else round(latest, 2)


def _runs(events: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every run of every step: its start, and its end when one was logged."""
    runs: dict[str, dict[str, Any]] = {}
    for event in events:
        run = runs.setdefault(event["run"], {"run": event["run"], "end": None, "result": None})
        if event["event"] == "start":
            run.update(job=event["job"], step=event["step"], attempt=event["attempt"])
            run.update(start=event["at"], node=event["node"], pid=event["pid"])
        else:
            run.update(end=event["at"], result=event["result"])
    by_step: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in runs.values():
        if "start" in run:
            by_step[(run["job"], run["step"])].append(run)
    for step_runs in by_step.values():
        step_runs.sort(key=lambda r: r["start"])
    return by_step


def _lossy_between(windows: list[tuple[str, float, float]], a: float, b: float) -> str | None:
    for kind, began, ended in windows:
        if began <= b and ended >= a:
            return kind
    return None


def check_reruns(
    result: Any, job_id: str, runs: dict[tuple[str, str], list[dict[str, Any]]], windows: Any
) -> None:
    for (job, step), step_runs in runs.items():
        if job != job_id:
            continue
        for i, run in enumerate(step_runs):
            earlier = [r for r in step_runs[:i] if r["attempt"] >= run["attempt"]]
            if not earlier:
                continue
            ended = [r for r in earlier if r["result"] in ("ok", "fail", "raise")]
            if ended:
                # Its outcome was written (unless a lossy fault hit it in flight).
                first = ended[0]
                until = min(run["start"], first["end"] + WRITE_GRACE)
                why = _lossy_between(windows, first["start"], until)
                if why is None:
                    result.violate(
                        "outcome_rerun",
                        job_id,
                        f"step {step} ended {first['result']!r} at attempt {first['attempt']} "
                        f"(run {first['run']}, pid {first['pid']}, ended {first['end']:.3f}) and "
                        f"ran again at attempt {run['attempt']} (run {run['run']}, pid "
                        f"{run['pid']}, started {run['start']:.3f}) with no lossy fault between",
                    )
                    continue
                key = f"after_outcome:{why}"
                result.reruns[key] = result.reruns.get(key, 0) + 1
                continue
            last = earlier[-1]
            if last["result"] == "stopped":
                why = "after_stop"
            else:
                why = _lossy_between(windows, last["start"], run["start"]) or "no_lossy_fault"
            result.reruns[f"in_flight:{why}"] = result.reruns.get(f"in_flight:{why}", 0) + 1


def check_steps(
    result: Any,
    job_id: str,
    total: int,
    state: Any,
    records: dict[str, Any],
    runs: dict[tuple[str, str], list[dict[str, Any]]],
    terminal: bool,
) -> None:
    width = max(6, len(str(total)))
    for n in range(total):
        step = f"{n:0{width}d}"
        step_runs = runs.get((job_id, step), [])
        record = records.get(step)
        if record is not None and record.status.value == "Unreachable":
            if step_runs:
                result.violate("outcome_mismatch", job_id, f"step {step} is UNREACHABLE but ran")
            continue
        if record is not None and record.status.value in ("Scheduled", "Stopped") and not terminal:
            continue  # a stopped job's step that never ran or was stopped
        if record is not None and record.status.value in ("Running", "Scheduled", "Stopped"):
            result.violate(
                "unfinished_step",
                job_id,
                f"step {step} is stored {record.status.value} (attempt {record.attempt}) in a "
                f"job that is {state.status.value}; its runs: {_brief(step_runs)}",
            )
            continue
        ended = [r for r in step_runs if r["result"] in ("ok", "fail", "raise")]
        if not ended:
            if record is None:
                result.violate(
                    "outcome_mismatch",
                    job_id,
                    f"step {step} is counted succeeded (no record) but no run of it ended; "
                    f"its runs: {_brief(step_runs)}",
                )
            else:
                result.violate(
                    "outcome_mismatch",
                    job_id,
                    f"step {step} is stored {record.status.value} but no run of it ended; "
                    f"its runs: {_brief(step_runs)}",
                )
            continue
        top = max(r["attempt"] for r in ended)
        last = {r["result"] for r in ended if r["attempt"] == top}
        if record is None:
            if last != {"ok"}:
                result.violate(
                    "outcome_mismatch",
                    job_id,
                    f"step {step} is counted succeeded but its attempt {top} ended {sorted(last)}",
                )
            continue
        wanted = "fail" if record.status.value == "CompletedWithFailure" else "raise"
        if record.attempt != top or last != {wanted}:
            result.violate(
                "outcome_mismatch",
                job_id,
                f"step {step} is stored {record.status.value} at attempt {record.attempt}, "
                f"but its last ended attempt {top} ended {sorted(last)}; runs {_brief(step_runs)}",
            )


def _brief(step_runs: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"a{r['attempt']}:{r['result'] or 'no end'}@{r['start']:.2f}/pid{r['pid']}"
        for r in step_runs
    )


def check_progress(
    result: Any, job_id: str, total: int, state: Any, records: dict[str, Any], terminal: bool
) -> None:
    statuses = Counter(r.status.value for r in records.values())
    p = state.progress
    failed = sum(statuses[s] for s in FAILED_STATUSES)
    successful = total - len(records)
    observed = {
        "total_steps": (p.total_steps, total),
        "successful_steps": (p.successful_steps, successful),
        "failed_steps": (p.failed_steps, failed),
    }
    if terminal:
        observed["unreachable_steps"] = (p.unreachable_steps, statuses["Unreachable"])
        counted = p.successful_steps + p.failed_steps + p.unreachable_steps + p.stopped_steps
        observed["counted outcomes"] = (counted, total)
    else:
        counted = p.successful_steps + p.failed_steps + p.unreachable_steps + p.stopped_steps
        if counted > total:
            result.violate("counted_twice", job_id, f"{counted} outcomes counted of {total} steps")
    for name, (got, want) in observed.items():
        if got != want:
            kind = "counted_twice" if got > want else "lost_outcome"
            result.violate(
                kind,
                job_id,
                f"{name}: the job says {got}, its stored steps say {want} "
                f"(status {state.status.value}, progress {p.model_dump()}, "
                f"stored {dict(statuses)})",
            )
    by_stage: dict[int, Counter[str]] = defaultdict(Counter)
    for record in records.values():
        by_stage[record.stage][record.status.value] += 1
    for stage in p.stages:
        stored = by_stage.get(stage.stage, Counter())
        stage_failed = sum(stored[s] for s in FAILED_STATUSES)
        stage_successful = stage.total_steps - sum(stored.values())
        if stage.successful_steps != stage_successful or stage.failed_steps != stage_failed:
            result.violate(
                "counted_twice" if stage.successful_steps > stage_successful else "lost_outcome",
                job_id,
                f"stage {stage.stage}: the job counts {stage.successful_steps} successful and "
                f"{stage.failed_steps} failed, its stored steps say {stage_successful} and "
                f"{stage_failed}",
            )


def check_hooks(
    result: Any, job_id: str, hooks: list[dict[str, Any]], faults: Sequence[Any]
) -> None:
    completed = sum(1 for h in hooks if h["job"] == job_id and h["event"] == "completed")
    reopened = sum(
        1
        for f in faults
        if f.job == job_id
        and f.kind == "op_retry_failed"
        and f.answer == "ok"
        and not f.detail.endswith("answered 0")
    )
    if completed > 1 + reopened:
        result.violate(
            "on_completed_twice",
            job_id,
            f"on_completed ran {completed} times ({reopened} reopenings by retry-failed)",
        )


def _eventually(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def check_left_behind(world: ChaosCluster, result: Any, job_id: str, removed: bool) -> None:
    def actors() -> list[str]:
        return sorted(
            a["Name"]
            for prefix in (f"job/{job_id}", f"step/{job_id}/")
            for a in world.alive(prefix)
        )

    left = _eventually(actors, CLEANUP_TIMEOUT)
    if left:
        result.violate("left_behind", job_id, f"actors still alive: {left}")
    if not removed:
        return

    async def stored(storage: Any) -> list[str]:
        from choreography_ray.storage import CountedKind

        found = []
        if await storage.get_job(job_id) is not None:
            found.append("job record")
        steps = await storage.list_steps(job_id, limit=5)
        if steps:
            found.append(f"step records ({len(steps)}+)")
        for kind in CountedKind:
            n = await storage.count_counted(job_id, kind)
            if n:
                found.append(f"{n} counted {kind} records")
        outputs = await storage.count_outputs(job_id)
        if outputs:
            found.append(f"{outputs} step outputs")
        return found

    leftovers = _eventually(lambda: in_storage(world.storage_url, stored), CLEANUP_TIMEOUT)
    if leftovers:
        result.violate("left_behind", job_id, f"after the remove, storage still holds {leftovers}")


def check(
    world: ChaosCluster,
    plan: Any,
    result: Any,
    job_ids: Sequence[str],
    states: dict[str, str],
    expected: dict[str, Expectation],
    step_log: Path,
    run_dir: Path,
) -> None:
    runs = _runs(read_trace(step_log))
    hooks = read_trace(run_dir / "hooks.jsonl")
    windows = [
        (f.kind, f.began, f.ended + 0.5) for f in result.faults if f.injected and f.kind in LOSSY
    ]
    for index, job_id in enumerate(job_ids):
        total = plan.jobs[index].total
        check_reruns(result, job_id, runs, windows)
        check_hooks(result, job_id, hooks, result.faults)
        status = states[job_id]
        if status == "removed":
            check_left_behind(world, result, job_id, removed=True)
            continue
        if not expected[job_id].satisfied_by(status):
            continue  # reported as not settled; its steps may still change
        state = world.call(functools.partial(world.manager.get, job_id))
        steps = world.call(functools.partial(world.manager.steps, job_id))
        records = {s.step_id: s for s in steps}
        terminal = status in TERMINAL
        check_progress(result, job_id, total, state, records, terminal)
        check_steps(result, job_id, total, state, records, runs, terminal)
        stages = [s["stage"] for s in plan.jobs[index].steps]
        check_outputs(world, result, job_id, total, state, records, runs, stages)
        check_left_behind(world, result, job_id, removed=False)


# -- step outputs -----------------------------------------------------------------------------


def stored_outputs(world: ChaosCluster, job_id: str) -> tuple[list[Any], int]:
    """Every output stored for the job, read `OUTPUT_PAGE` at a time (`output_pages`), and what
    `count_outputs` says."""

    async def read(storage: Any) -> tuple[list[Any], int]:
        from choreography_ray.storage import output_pages

        found: list[Any] = []
        async for page in output_pages(storage, job_id, page=OUTPUT_PAGE):
            found.extend(page)
        return found, await storage.count_outputs(job_id)

    # Read-only: a reader lays nothing out, so a storage fault's lock still held (a second
    # process's BEGIN EXCLUSIVE for up to 34 s) does not make it wait for a write lock.
    found, counted = in_storage(world.storage_url, read, read_only=True)
    return found, counted


def check_outputs(
    world: ChaosCluster,
    result: Any,
    job_id: str,
    total: int,
    state: Any,
    records: dict[str, Any],
    runs: dict[tuple[str, str], list[dict[str, Any]]],
    stages: Sequence[int] | None,
) -> None:
    """9. above, for a settled (terminal or finally stopped) job: the steps with an output are
    the steps that succeeded, as `check_steps` knows them (no record left: a host deletes a
    succeeded step's record in the group commit that stores its output, after the output; the
    watchdog counts a step whose record is gone as succeeded, so it too has its host's output).
    A job that stored no plan ran nothing and has none. `stages`: each step's stage, as
    planned (None: not checked)."""
    found, counted = stored_outputs(world, job_id)
    width = max(6, len(str(total)))
    planned = [f"{n:0{width}d}" for n in range(total)]
    succeeded = {s for s in planned if s not in records} if state.has_plan else set()
    by_step: dict[str, Any] = {}
    for stored in found:
        if stored.step_id in by_step:
            result.violate(
                "output_twice",
                job_id,
                f"step {stored.step_id} has two outputs in the pages read: "
                f"{by_step[stored.step_id]} and {stored}",
            )
        by_step[stored.step_id] = stored
    if counted != len(found):
        result.violate(
            "output_pages",
            job_id,
            f"count_outputs says {counted}, the pages held {len(found)}",
        )
    missing = sorted(succeeded - set(by_step))
    if missing:
        result.violate(
            "output_missing",
            job_id,
            f"{len(missing)} succeeded steps have no output (of {len(succeeded)} succeeded), "
            f"e.g. {missing[:5]}; their runs: "
            + "; ".join(f"{s}: {_brief(runs.get((job_id, s), []))}" for s in missing[:3]),
        )
    extra = sorted(set(by_step) - succeeded)
    if extra:
        described = [
            f"{s} ({records[s].status.value} at attempt {records[s].attempt}; output of attempt "
            f"{by_step[s].attempt})"
            if s in records
            else f"{s} (not a step of the job's plan)"
            for s in extra[:5]
        ]
        result.violate(
            "output_orphan",
            job_id,
            f"{len(extra)} outputs of steps that did not succeed, e.g. {', '.join(described)}",
        )
    for step in sorted(succeeded & set(by_step)):
        stored = by_step[step]
        problems = []
        try:
            output = ChaosOutput.model_validate_json(stored.output)
        except ValueError as error:
            problems.append(f"its JSON is not a ChaosOutput ({error})")
        else:
            if output.step != step or output.attempt != stored.attempt:
                problems.append(
                    f"stored for attempt {stored.attempt}, it says step {output.step} attempt "
                    f"{output.attempt}"
                )
        if stages is not None and stored.stage != stages[int(step)]:
            problems.append(f"stored at stage {stored.stage}, planned at {stages[int(step)]}")
        step_runs = runs.get((job_id, step), [])
        ok = {r["attempt"] for r in step_runs if r["result"] == "ok"}
        if stored.attempt not in ok:
            problems.append(
                f"attempt {stored.attempt} never ended ok (ok at {sorted(ok)}; runs "
                f"{_brief(step_runs)})"
            )
        if problems:
            detail = "; ".join(problems)
            result.violate("output_mismatch", job_id, f"step {step}'s output: {detail}")


# -- pools ------------------------------------------------------------------------------------


def unplaceable_hosts(world: ChaosCluster) -> set[str]:
    """The pool hosts of the unplaceable shape in Ray's actor table, in any state (the table
    keeps dead actors); none while the cluster restarts."""
    prefix = f"pool/{UNPLACEABLE_SHAPE}/"
    try:
        return {str(a["Name"]) for a in world.actors() if str(a.get("Name", "")).startswith(prefix)}
    except Exception:
        return set()


def check_unplaceable(
    world: ChaosCluster,
    result: Any,
    record: Any,
    stop: dict[str, Any],
    step_log: Path,
    seen_hosts: set[str],
) -> None:
    """The unplaceable job `record` started, stopped by the harness (`stop`): see 7. above."""
    job_id, total = record.started, record.started_steps
    if record.start_seconds is not None and record.start_seconds > UNPLACEABLE_BOUND:
        result.violate(
            "unplaceable_slow", job_id, f"its start answered after {record.start_seconds} s"
        )
    if stop["stop_seconds"] > UNPLACEABLE_BOUND:
        took = stop["stop_seconds"]
        result.violate("unplaceable_slow", job_id, f"its stop answered after {took} s")
    ran = [e for e in read_trace(step_log) if e["job"] == job_id]
    if ran:
        result.violate(
            "unplaceable_ran",
            job_id,
            f"{len(ran)} step log events of its steps, the first {ran[0]}",
        )
    hosts = seen_hosts | unplaceable_hosts(world)
    if hosts:
        result.violate("unplaceable_host", job_id, f"pool hosts of its shape: {sorted(hosts)}")
    if stop["status"] == "Failed" and _failed_unplanned(world, result, record):
        result.notes.append(f"the unplaceable job {job_id} failed to store its plan (a storage "
                            "fault at its start): it never ran")  # fmt: skip
        return
    if stop["status"] != "stopped":
        result.violate(
            "unplaceable_not_stopped",
            job_id,
            f"{stop['status'] or 'unknown'} {stop['final']} s after the harness's stop "
            f"(which answered {stop['answer']} in {stop['stop_seconds']} s)",
        )
        return
    state = world.call(functools.partial(world.manager.get, job_id))
    steps = world.call(functools.partial(world.manager.steps, job_id))
    records = {s.step_id: s for s in steps}
    p = state.progress
    stored = Counter(r.status.value for r in records.values())
    # A step that never started stays stored SCHEDULED in a stopped job, counted stopped.
    if p.stopped_steps != total or stored["Stopped"] + stored["Scheduled"] != total:
        result.violate(
            "unplaceable_not_stopped",
            job_id,
            f"not every one of its {total} steps counted stopped, stored stopped or never "
            f"started: progress {p.model_dump()}, stored {dict(stored)}",
        )
    check_progress(result, job_id, total, state, records, terminal=False)
    check_outputs(world, result, job_id, total, state, records, {}, stages=None)
    check_left_behind(world, result, job_id, removed=False)


def check_pool_hosts(world: ChaosCluster, result: Any) -> None:
    """No pool host is left that Ray has not placed (pending, or restarting for good)."""

    def unplaced() -> list[str]:
        return sorted(
            f"{a['Name']} ({a.get('State')})"
            for a in world.actors()
            if str(a.get("Name", "")).startswith("pool/") and a.get("State") not in PLACED_OR_GONE
        )

    left = _eventually(unplaced, CLEANUP_TIMEOUT)
    if left:
        result.violate("pool_host_unplaced", "", f"pool hosts not placed at the end: {left}")


def _failed_unplanned(world: ChaosCluster, result: Any, record: Any) -> bool:
    """The unplaceable job `record` started failed while it stored its plan (it holds none), a
    storage fault on at its start: a job that never began, not one a stop left unfinished."""
    state = world.call(functools.partial(world.manager.get, record.started))
    at_start = any(
        f.injected
        and f.kind in (*STORAGE_FAULTS, *MONGODB_FAULTS)
        and f.began <= record.ended + WRITE_GRACE
        and f.ended >= record.began
        for f in result.faults
    )
    return at_start and not state.has_plan and state.progress.total_steps == 0
