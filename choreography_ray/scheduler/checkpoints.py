"""Checkpoints: a retry of a job type that opts in (`checkpoint_stages = True`) resumes after the
failed run's latest completed stage instead of running every stage again.

A checkpoint is a stage whose every step succeeded, as did every stage before it. The failed
run's checkpoints are followed
back through `resumed_from` (a run that was itself a resume skipped the stages before its
source's checkpoint), so a second failure after a resume resumes from the same checkpoint, or a
later one the resumed run completed. A checkpoint is used only while the plan's stage layout
(every stage and its step count) matches the one the checkpoint was taken in; otherwise, or when
there is none, the retry runs from the top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from choreography_ray.model import StageProgress, StageShape
from choreography_ray.scheduler.records import Checkpoint, ManifestRun

#: Runs followed back through `resumed_from` at most (a cycle in stored links ends there).
MAX_CHAIN = 1_000


def is_checkpoint(stage: StageProgress) -> bool:
    """The stage completed: every one of its steps succeeded."""
    done = stage.successful_steps >= stage.total_steps
    return stage.is_started and stage.total_steps > 0 and done


def layout_of(stages: Sequence[StageProgress]) -> tuple[StageShape, ...]:
    return tuple(StageShape(stage=s.stage, steps=s.total_steps) for s in stages)


def latest_checkpoint(stages: Sequence[StageProgress]) -> int | None:
    """The last stage of the run's unbroken run of completed stages from its first, or None.
    A completed stage after one with failures (a stage that continues on failure) is none:
    resuming after it would skip the failed one."""
    latest = None
    for stage in sorted(stages, key=lambda s: s.stage):
        if not is_checkpoint(stage):
            break
        latest = stage.stage
    return latest


def resume_chain(failed: ManifestRun, runs: Mapping[str, ManifestRun]) -> list[str]:
    """`failed` and the runs it resumed from, back to the one that ran from the top."""
    chain = [failed.id]
    current: ManifestRun | None = failed
    while current is not None and current.resumed_from and len(chain) < MAX_CHAIN:
        if current.resumed_from in chain:
            break
        chain.append(current.resumed_from)
        current = runs.get(current.resumed_from)
    return chain


def resume_point(
    failed: ManifestRun,
    runs: Mapping[str, ManifestRun],
    checkpoints: Mapping[str, Sequence[Checkpoint]],
    layout: Sequence[StageShape] | None = None,
) -> Checkpoint | None:
    """The checkpoint a retry of `failed` resumes after, or None to run from the top. With
    `layout` (the new plan's), a checkpoint of another layout is not used."""
    found = [c for run_id in resume_chain(failed, runs) for c in checkpoints.get(run_id, ())]
    if not found:
        return None
    latest = max(found, key=lambda c: (c.stage, c.completed_at))
    if layout is not None and tuple(layout) != latest.layout:
        return None
    return latest


def stages_to_skip(checkpoint: Checkpoint) -> list[int]:
    """The stages a resumed run skips: the checkpoint's and every one before it."""
    return [s.stage for s in checkpoint.layout if s.stage <= checkpoint.stage]
