"""What crosses between the job actor and step hosts. Plain tuples: one RPC carries many."""

from __future__ import annotations

from typing import Any, NamedTuple

from choreography_ray.status import StepStatus


class StepStart(NamedTuple):
    step_id: str
    type: str
    stage: int
    attempt: int
    request: dict[str, Any]


class Outcome(NamedTuple):
    step_id: str
    attempt: int
    status: StepStatus
    message: str | None = None
