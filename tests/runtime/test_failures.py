"""Failures at scale on real Ray: a 10,000-step job with three kinds of failure groups them in
three clusters, a retry of one cluster runs exactly its steps and counts them once, and a stage
with a success threshold goes on at 98 % and stops at 96 %."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import choreography_ray as cr
from tests.runtime.conftest import FAST
from tests.runtime.failure_jobs import Batch, GoesOnAt98, ThreeKinds

pytestmark = pytest.mark.timeout(120)

S = cr.JobStatus
STEPS = 10_000


def starts(fixed: Path) -> Counter[int]:
    return Counter(int(line) for line in Path(f"{fixed}.starts").read_text().split())


def test_failures__three_kinds_three_clusters_and_a_retry_of_one_runs_exactly_it(
    connect: Any, scope: str, tmp_path: Path
) -> None:
    manager = connect(**FAST).manager(scope, "failures")
    fixed = tmp_path / "fixed"
    job_id = manager.start(ThreeKinds, Batch(steps=STEPS, fixed=str(fixed))).job_id
    state = manager.wait(job_id, timeout=90)
    assert state.status is S.COMPLETED_WITH_FAILURES
    assert state.progress.failed_steps == 300

    clusters = manager.failures(job_id)

    assert [(c.signature, c.count) for c in clusters] == [
        ("KeyError: '<v>'", 100),
        ("QUOTA", 100),
        ("TimeoutError: GET <url> after <n> s", 100),
    ]
    timeouts = clusters[2]
    assert timeouts.example_step_id == min(
        s.step_id for s in manager.steps(job_id) if s.failure_signature == timeouts.signature
    )
    assert timeouts.example_message is not None and "api.example.com" in timeouts.example_message

    fixed.touch()
    before = starts(fixed)
    assert manager.retry_failed_steps(job_id, signature=timeouts.signature) == 100
    state = manager.wait(job_id, timeout=60)

    ran = starts(fixed) - before
    assert sorted(ran) == [n for n in range(STEPS) if n % 100 == 2]
    assert set(ran.values()) == {1}
    assert state.status is S.COMPLETED_WITH_FAILURES
    assert (state.progress.successful_steps, state.progress.failed_steps) == (STEPS - 200, 200)
    assert [(c.signature, c.count) for c in manager.failures(job_id)] == [
        ("KeyError: '<v>'", 100),
        ("QUOTA", 100),
    ]


@pytest.mark.parametrize(("fail_below", "goes_on"), [(2, True), (4, False)])
def test_min_success_ratio__a_stage_goes_on_at_98_percent_and_stops_at_96(
    connect: Any, scope: str, tmp_path: Path, fail_below: int, goes_on: bool
) -> None:
    manager = connect(**FAST).manager(scope, "thresholds")
    request = Batch(steps=STEPS, fixed=str(tmp_path / "unused"), fail_below=fail_below)
    state = manager.wait(manager.start(GoesOnAt98, request).job_id, timeout=90)

    assert state.status is S.COMPLETED_WITH_FAILURES
    first, second = state.progress.stages
    assert first.failed_steps == STEPS * fail_below // 100
    assert (second.successful_steps, second.unreachable_steps) == ((1, 0) if goes_on else (0, 1))
