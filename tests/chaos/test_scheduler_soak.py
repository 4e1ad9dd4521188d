"""The scheduler's soak in the slow tier: two seeds of `scheduler_soak` on a real SQLite file,
each with a restart and a takeover (about 10 s a seed); the 30-seed soak is
`python -m tests.chaos.scheduler_soak --seed N --runs 30` (docs/chaos.md)."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos.scheduler_soak import run_seed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("seed", [3, 4])  # without the fence, each started a run twice
def test_scheduler_soak__no_run_started_twice_across_a_restart_and_a_takeover(seed: int) -> None:
    result = asyncio.run(run_seed(seed))
    assert result["violations"] == []
    assert result["drained"]
    assert result["fenced_writes_refused"] >= 1, "a stale holder tried to write"
    assert result["jobs_started"] > 20
