"""The wire format between job actors and step hosts: a batch crosses as one `bytes`, and a
list of plain tuples (an earlier release's form, or a test's) is read as well."""

from __future__ import annotations

import pickle
from typing import Any

from choreography_ray.core.messages import (
    Outcome,
    StepStart,
    outcomes_from_wire,
    outcomes_to_wire,
    starts_from_wire,
    starts_to_wire,
)
from choreography_ray.status import StepStatus

STARTS = [
    StepStart("000001", "pkg.mod:Step", 2, 3, '{"n": 1}'),
    StepStart("000002", "t", 0, 1, "{}"),
]
OUTCOMES = [
    Outcome("000001", 3, StepStatus.COMPLETED_SUCCESSFULLY),
    Outcome("000002", 1, StepStatus.FAILED, "ValueError: no", "ValueError: no"),
]


def test_starts__cross_as_bytes_of_plain_tuples_and_come_back_equal() -> None:
    wire = starts_to_wire(STARTS)
    assert isinstance(wire, bytes)
    assert [type(s) for s in pickle.loads(wire)] == [tuple, tuple]  # no named tuple pickled
    assert starts_from_wire(wire) == STARTS
    assert all(type(s) is StepStart for s in starts_from_wire(wire))


def test_outcomes__cross_as_bytes_with_the_status_as_its_value() -> None:
    wire = outcomes_to_wire(OUTCOMES)
    assert isinstance(wire, bytes)
    failure = ("000002", 1, StepStatus.FAILED.value, "ValueError: no", "ValueError: no")
    assert pickle.loads(wire)[1] == failure
    back = outcomes_from_wire(wire)
    assert back == OUTCOMES
    assert back[1].status is StepStatus.FAILED


def test_lists_of_tuples__an_earlier_releases_form__are_read_too() -> None:
    assert starts_from_wire([tuple(s) for s in STARTS]) == STARTS  # type: ignore[misc]
    four: Any = ("000002", 1, "Failed", "ValueError: no")  # no signature: an earlier release's
    earlier = outcomes_from_wire([four])
    assert earlier == [OUTCOMES[1]._replace(signature=None)]


def test_starts__equal_types_and_requests_cross_once_per_batch() -> None:
    """Steps read back from storage hold a string each: a batch of 1,024 of one type and
    request stays under Ray's 100 KiB for an argument passed inline."""
    step_type, request = "choreography_ray.bench.workloads:BenchStep", '{"fail":false,"ms":0.0}'
    batch = [StepStart(f"{i:06d}", "".join(step_type), 0, 1, "".join(request)) for i in range(1024)]
    assert len({id(s.type) for s in batch}) == 1024  # distinct objects, as storage's rows
    wire = starts_to_wire(batch)
    assert len(wire) < 30_000 < len(pickle.dumps([tuple(s) for s in batch]))
    back = starts_from_wire(wire)
    assert back == batch and len({id(s.type) for s in back}) == 1
