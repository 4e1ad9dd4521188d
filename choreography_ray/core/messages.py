"""What crosses between the job actor and step hosts.

In the code they are named tuples; on the wire a batch is one `bytes`: its plain tuples (the
status as its string value) pickled at once. Ray serializes a named tuple or an enum member at
many times the cost of a plain tuple, and a list of hundreds of plain tuples at about twice the
cost of pickling it here (measured on 512 starts: 0.8-1.0 ms a call against 0.25-0.5 ms); a
`bytes` argument it passes as it is. The bytes go from one of this package's actors to another,
as Ray's own arguments do, and never to storage. A list of tuples (what an earlier release, or
a test, sends) is read as well.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import NamedTuple, TypeVar

from choreography_ray.failures import failure_signature
from choreography_ray.status import StepStatus

#: A `StepStart` on the wire: (step_id, type, stage, attempt, request as JSON text).
StartWire = tuple[str, str, int, int, str]
#: An `Outcome` on the wire: (step_id, attempt, status value, message, signature).
OutcomeWire = tuple[str, int, str, str | None, str | None]

_Wire = TypeVar("_Wire", StartWire, OutcomeWire)

_STATUSES = {status.value: status for status in StepStatus}


class StepStart(NamedTuple):
    step_id: str
    type: str
    stage: int
    attempt: int
    #: The request as JSON text: serialized once for storage, the wire and the step host.
    request_json: str


class Output(NamedTuple):
    """A succeeded step's output, as the host stores it: its stage and its JSON text."""

    stage: int
    json: str


class Outcome(NamedTuple):
    step_id: str
    attempt: int
    status: StepStatus
    message: str | None = None
    #: A failure's signature (`failures.failure_signature`), stored with it.
    signature: str | None = None
    #: A succeeded step's output: stored by its host with the outcome, never delivered.
    output: Output | None = None


def failed(
    step_id: str, attempt: int, status: StepStatus, message: str | None, code: str | None = None
) -> Outcome:
    """A failure (FAILED or COMPLETED_WITH_FAILURE) with its signature."""
    return Outcome(step_id, attempt, status, message, failure_signature(message, code))


def starts_to_wire(starts: Iterable[StepStart]) -> bytes:
    """Equal types and requests go as one string each: pickle writes an object it has written
    once as a reference. Steps read back from storage hold a string each, and a batch of 1,024
    steps of one type and request was 103 KB (above Ray's 100 KiB for an argument passed
    inline: it went through the object store), and 21 KB so."""
    same: dict[str, str] = {}
    one = same.setdefault
    return _pack([(s[0], one(s[1], s[1]), s[2], s[3], one(s[4], s[4])) for s in starts])


def starts_from_wire(wire: bytes | Iterable[StartWire]) -> list[StepStart]:
    new = tuple.__new__  # a named tuple's own `__new__` costs twice as much
    return [new(StepStart, s) for s in _unpack(wire)]


def outcomes_to_wire(outcomes: Iterable[Outcome]) -> bytes:
    return _pack([(o.step_id, o.attempt, o.status.value, o.message, o.signature) for o in outcomes])


def outcomes_from_wire(wire: bytes | Iterable[OutcomeWire]) -> list[Outcome]:
    new, statuses = tuple.__new__, _STATUSES
    # No output: a host stores it, never delivers it. A wire of an earlier release has no
    # signature (4 fields).
    return [
        new(Outcome, (w[0], w[1], statuses[w[2]], w[3], w[4] if len(w) > 4 else None, None))
        for w in _unpack(wire)
    ]


def _pack(tuples: list[tuple[object, ...]]) -> bytes:
    return pickle.dumps(tuples, protocol=pickle.HIGHEST_PROTOCOL)


def _unpack(wire: bytes | Iterable[_Wire]) -> Iterable[_Wire]:
    unpacked: Iterable[_Wire] = pickle.loads(wire) if isinstance(wire, bytes) else wire
    return unpacked


def describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # a failure's message must not fail the step's outcome
        text = "(its message could not be read)"
    return f"{type(error).__name__}: {text}"
