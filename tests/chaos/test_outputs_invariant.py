"""The chaos checker's step-output invariant (`invariants.check_outputs`, docs/chaos.md 9.) on
outputs stored in an SQLite file, without Ray: exactly one output per succeeded step, none of a
step that did not succeed, each written by an attempt of its step that ended `ok`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import choreography_ray as cr
from choreography_ray.storage import Storage, StoredOutput
from tests.chaos import invariants
from tests.chaos.harness import RunResult
from tests.chaos.jobs import ChaosOutput
from tests.support import in_storage

JOB = "j"
#: Three steps of stages 0, 10, 10; the page read is smaller than the job's outputs.
STAGES = [0, 10, 10]


def _output(step: str, attempt: int, stage: int | None = None, says: int | None = None) -> Any:
    text = ChaosOutput(step=step, n=int(step), attempt=says or attempt).model_dump_json()
    stage = STAGES[int(step)] if stage is None else stage
    return StoredOutput(JOB, step, stage, attempt, text)


def _ok(step: str, attempt: int) -> dict[str, Any]:
    return {"run": f"{step}-{attempt}", "step": step, "attempt": attempt, "result": "ok",
            "start": 1.0, "pid": 1}  # fmt: skip


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(invariants, "OUTPUT_PAGE", 2)
    return SimpleNamespace(storage_url=f"sqlite:///{tmp_path / 'jobs.db'}")


def _check(world: Any, outputs: list[Any], records: dict[str, Any], runs: Any) -> list[str]:
    async def put(storage: Storage) -> None:
        await storage.put_outputs(outputs)

    in_storage(world.storage_url, put)
    result = RunResult(seed=1, profile="ci", plan={})
    state = SimpleNamespace(has_plan=True)
    total = len(STAGES)
    invariants.check_outputs(world, result, JOB, total, state, records, runs, STAGES)
    return [v["kind"] for v in result.violations]


def _runs(*ok: tuple[str, int]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {(JOB, step): [_ok(step, attempt)] for step, attempt in ok}


def _record(status: cr.StepStatus, attempt: int = 1) -> Any:
    return SimpleNamespace(status=status, attempt=attempt)


def test_check_outputs__one_per_succeeded_step_and_none_for_the_others_holds(world: Any) -> None:
    # 000000 and 000002 succeeded (no record; 000002 at its second attempt); 000001 stopped.
    outputs = [_output("000000", 1), _output("000002", 2)]
    records = {"000001": _record(cr.StepStatus.STOPPED)}

    assert _check(world, outputs, records, _runs(("000000", 1), ("000002", 2))) == []


def test_check_outputs__a_succeeded_step_without_output_is_missing(world: Any) -> None:
    records = {"000001": _record(cr.StepStatus.COMPLETED_WITH_FAILURE)}

    kinds = _check(world, [_output("000000", 1)], records, _runs(("000000", 1), ("000002", 1)))

    assert kinds == ["output_missing"]


def test_check_outputs__an_output_of_a_failed_or_stopped_step_is_an_orphan(world: Any) -> None:
    records = {
        "000001": _record(cr.StepStatus.FAILED),
        "000002": _record(cr.StepStatus.STOPPED),
    }
    outputs = [_output("000000", 1), _output("000001", 1), _output("000002", 1)]

    assert _check(world, outputs, records, _runs(("000000", 1))) == ["output_orphan"]


@pytest.mark.parametrize(
    "wrong",
    [
        _output("000000", 2),  # attempt 2 never ended ok
        _output("000000", 1, stage=10),  # not its stage
        _output("000000", 1, says=3),  # the JSON is another attempt's
    ],
)
def test_check_outputs__an_output_no_ok_attempt_of_its_step_wrote_is_a_mismatch(
    world: Any, wrong: Any
) -> None:
    outputs = [wrong, _output("000001", 1), _output("000002", 1)]
    runs = _runs(("000000", 1), ("000001", 1), ("000002", 1))

    assert _check(world, outputs, {}, runs) == ["output_mismatch"]
