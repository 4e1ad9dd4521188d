"""Decision keys and their age limit; where a retry resumes (checkpoints)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from choreography_ray.model import StageProgress, StageShape
from choreography_ray.scheduler import checkpoints, decisions
from choreography_ray.scheduler.records import Checkpoint, Decision
from tests.unit.scheduler.factory import T0, failed

DAY = timedelta(hours=24)


class State(BaseModel):
    lead: str
    score: float


def test_state_hash__stable_across_key_order_and_model_or_dict() -> None:
    as_model = decisions.state_hash(State(lead="a", score=0.5))
    assert as_model == decisions.state_hash({"score": 0.5, "lead": "a"})
    assert as_model != decisions.state_hash({"score": 0.6, "lead": "a"})
    # A known value: the hash is part of what is stored, so it must not change between releases.
    assert decisions.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


def test_decision_key__question_and_state() -> None:
    h = decisions.state_hash({"x": 1})
    assert decisions.decision_key("q", h) != decisions.decision_key("q2", h)
    assert decisions.decision_key("q", h).endswith(h)


def test_replayed_answer__same_question_same_state_younger_than_the_limit() -> None:
    h = decisions.state_hash({"x": 1})
    d = Decision(run_id="r", scope="s", manifest="m", question="q", state_hash=h, answer="yes",
                 recorded_at=T0)  # fmt: skip
    assert decisions.replayed_answer([d], "q", h, T0 + timedelta(hours=23), DAY) == d
    assert decisions.replayed_answer([d], "q", h, T0 + DAY, DAY) is None
    assert decisions.replayed_answer([d], "other", h, T0, DAY) is None
    assert decisions.replayed_answer([d], "q", decisions.state_hash({"x": 2}), T0, DAY) is None


LAYOUT = tuple(StageShape(stage=s, steps=n) for s, n in ((0, 1), (10, 3), (20, 1)))


def point(run_id: str, stage: int, layout: tuple[StageShape, ...] = LAYOUT) -> Checkpoint:
    return Checkpoint(run_id=run_id, scope="s", manifest="m", stage=stage, layout=layout)


def test_resume_point__after_the_failed_runs_latest_completed_stage() -> None:
    bad = failed(T0)
    found = checkpoints.resume_point(bad, {}, {bad.id: [point(bad.id, 0), point(bad.id, 10)]})
    assert found is not None and found.stage == 10
    assert checkpoints.stages_to_skip(found) == [0, 10]


def test_resume_point__none_without_checkpoints_or_when_the_layout_changed() -> None:
    bad = failed(T0)
    assert checkpoints.resume_point(bad, {}, {}) is None
    other = (StageShape(stage=0, steps=1), StageShape(stage=10, steps=4))
    assert checkpoints.resume_point(bad, {}, {bad.id: [point(bad.id, 0)]}, other) is None
    assert checkpoints.resume_point(bad, {}, {bad.id: [point(bad.id, 0)]}, LAYOUT) is not None


def test_resume_point__a_second_failure_after_a_resume_resumes_from_the_same_checkpoint() -> None:
    first = failed(T0)
    second = failed(T0 + DAY, resumed_from=first.id)
    runs = {first.id: first, second.id: second}
    found = checkpoints.resume_point(second, runs, {first.id: [point(first.id, 10)]})
    assert found is not None and found.run_id == first.id and found.stage == 10


def test_resume_chain__a_cycle_in_stored_links_ends() -> None:
    a = failed(T0, id="a", resumed_from="b")
    b = failed(T0, id="b", resumed_from="a")
    assert checkpoints.resume_chain(a, {"a": a, "b": b}) == ["a", "b"]


def test_is_checkpoint__a_started_stage_whose_every_step_succeeded() -> None:
    done = StageProgress(stage=0, is_started=True, total_steps=2, successful_steps=2)
    assert checkpoints.is_checkpoint(done)
    one_failed = done.model_copy(update={"successful_steps": 1, "failed_steps": 1})
    assert not checkpoints.is_checkpoint(one_failed)
    assert not checkpoints.is_checkpoint(StageProgress(stage=0, total_steps=0))


def test_latest_checkpoint__the_last_of_the_completed_stages_from_the_first() -> None:
    def stage(n: int, failed: int = 0, started: bool = True) -> StageProgress:
        return StageProgress(stage=n, is_started=started, total_steps=2,
                             successful_steps=2 - failed, failed_steps=failed)  # fmt: skip

    assert checkpoints.latest_checkpoint([stage(0), stage(10), stage(20, failed=1)]) == 10
    # A completed stage after one with failures (it continued on failure) is no checkpoint.
    assert checkpoints.latest_checkpoint([stage(0), stage(10, failed=1), stage(20)]) == 0
    assert checkpoints.latest_checkpoint([stage(0, failed=2), stage(10)]) is None
    assert checkpoints.latest_checkpoint([stage(0), stage(10, started=False)]) == 0
