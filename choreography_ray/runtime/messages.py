"""What crosses between the job actor and step hosts.

In the code they are named tuples; on the wire they are plain tuples with the status as its
string value, because Ray pickles a named tuple or an enum member at many times the cost of a
plain tuple of strings and numbers, and one RPC carries hundreds of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from choreography_ray.status import StepStatus

#: A `StepStart` on the wire: (step_id, type, stage, attempt, request as JSON text).
StartWire = tuple[str, str, int, int, str]
#: An `Outcome` on the wire: (step_id, attempt, status value, message).
OutcomeWire = tuple[str, int, str, str | None]

_STATUSES = {status.value: status for status in StepStatus}


class StepStart(NamedTuple):
    step_id: str
    type: str
    stage: int
    attempt: int
    #: The request as JSON text: serialized once for storage, the wire and the step host.
    request_json: str


class Outcome(NamedTuple):
    step_id: str
    attempt: int
    status: StepStatus
    message: str | None = None


def starts_to_wire(starts: Iterable[StepStart]) -> list[StartWire]:
    return [tuple(s) for s in starts]  # type: ignore[misc]


def starts_from_wire(wire: Iterable[StartWire]) -> list[StepStart]:
    return [StepStart._make(s) for s in wire]


def outcomes_to_wire(outcomes: Iterable[Outcome]) -> list[OutcomeWire]:
    return [(o.step_id, o.attempt, o.status.value, o.message) for o in outcomes]


def outcomes_from_wire(wire: Iterable[OutcomeWire]) -> list[Outcome]:
    return [
        Outcome(step_id, attempt, _STATUSES[status], message)
        for step_id, attempt, status, message in wire
    ]
