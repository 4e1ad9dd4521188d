"""The plan as `prepare_steps` returns it, consumed in chunks, and the window's feed.

`prepare_steps` may return a list, any iterable (a generator), an async iterable, or an
awaitable of one of those. The first `JobsOptions.plan_chunk_size` steps (50,000) are read
before anything is written (they size the step ids, below); then the plan is written in pieces
of `PLAN_WRITE` (at most a chunk), each while the next is read and built: every step checked
(a `StepSpec`), given its id, counted into per-stage totals, and let go; nothing holds the whole
plan. The first two chunks' records are kept for the first run's first stage: its feed hands
them out before it reads storage, which it reads only after them.

A step id is the step's position in the plan, zero-padded: to `max(6, digits of the length)`
when the length is known before the plan is read (a list, any sized collection, or a plan that
ends within its first chunk), else to `UNSIZED_WIDTH` digits, so that ids sort as positions do.

Once the plan is stored, the window is fed (`Feed`): the running stage's unfinished steps in
step-id order, a page at a time (`feed_page`: at most `FEED_PAGE`), the next page taken once fewer
than a page of steps wait to start; the steps kept in memory first, then storage's.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import AsyncIterable, Iterable, Sized
from dataclasses import dataclass, field
from typing import Any

from choreography_ray.core.messages import StepStart
from choreography_ray.job import StepSpec
from choreography_ray.status import UNFINISHED_STEP, StepStatus
from choreography_ray.storage import PlannedStep, StoredStart

#: Digits of a step id when the plan's length is not known before it is read.
UNSIZED_WIDTH = 10
#: Steps the feed reads per page, at most.
FEED_PAGE = 5_000
#: Steps of a chunk written per `insert_plan` call, each while the next is built.
PLAN_WRITE = 10_000


class PlanError(Exception):
    """`prepare_steps` (or the plan it returned, while it was read) failed: the job's error."""


async def plan_source(returned: object) -> Iterable[Any] | AsyncIterable[Any]:
    """What `prepare_steps` returned, awaited when it is an awaitable."""
    if inspect.isawaitable(returned) and not isinstance(returned, AsyncIterable):
        returned = await returned
    if isinstance(returned, AsyncIterable | Iterable) and not isinstance(returned, str | bytes):
        return returned
    raise TypeError(
        "prepare_steps must return steps made by create_step: a list, an iterable, an async "
        f"iterable, or an awaitable of one; got {type(returned).__name__}"
    )


def feed_page(chunk: int) -> int:
    """Steps the feed reads per page for a plan chunk of `chunk` steps."""
    return min(FEED_PAGE, chunk)


class PlanReader:
    """Reads the plan a given number of steps at a time, each checked. Anything the plan's own
    code raises while it is read is a `PlanError`."""

    def __init__(self, source: Iterable[Any] | AsyncIterable[Any]) -> None:
        self._is_async = isinstance(source, AsyncIterable)
        self._iterator: Any = aiter(source) if self._is_async else iter(source)  # type: ignore[arg-type]
        self._position = 0

    async def read(self, n: int) -> list[StepSpec]:
        """The next `n` steps; fewer once the plan ends."""
        chunk: list[StepSpec] = []
        iterator, is_async = self._iterator, self._is_async
        while len(chunk) < n:
            try:
                spec = await anext(iterator) if is_async else next(iterator)
            except (StopIteration, StopAsyncIteration):
                break
            except Exception as error:
                raise PlanError(str(error)) from error
            if not isinstance(spec, StepSpec):
                message = (
                    "prepare_steps must return steps made by create_step; "
                    f"item {self._position + len(chunk)} of the plan is a {type(spec).__name__}"
                )
                raise PlanError(message) from TypeError(message)
            chunk.append(spec)
        self._position += len(chunk)
        return chunk


def id_width(source: object, first: int, more: bool) -> int:
    """Step-id digits: from the plan's length when known (sized, or ended in its first
    chunk), else `UNSIZED_WIDTH`."""
    if isinstance(source, Sized):
        return max(6, len(str(len(source))))
    return UNSIZED_WIDTH if more else max(6, len(str(first)))


def plan_records(specs: list[StepSpec], offset: int, width: int) -> list[PlannedStep]:
    """A chunk's records: each step's id is its position in the plan."""
    if offset + len(specs) > 10**width:
        raise PlanError(f"a plan of unknown length may have at most {10**width - 1:,} steps")
    # `tuple.__new__` and `zfill`: a named tuple's own `__new__` and a nested format spec cost
    # a quarter of this loop (the plan is built before any step runs).
    new = tuple.__new__
    # A request object shared by many steps is serialized once: the chunk was read whole
    # before this, so each object's JSON is the same for every step that holds it.
    texts: dict[int, str] = {}
    records = []
    for i, s in enumerate(specs):
        text = texts.get(id(s.request))
        if text is None:
            text = texts[id(s.request)] = s.request.model_dump_json()
        records.append(new(PlannedStep, (str(offset + i).zfill(width), s.step_type, s.stage, text)))
    return records


@dataclass(slots=True)
class Feed:
    """The running stage's unfinished steps not yet handed to the window, each once: those kept
    in memory (`ahead`), then storage's from `after` (the last id read) in step-id order, a page
    at a time until `done`. `skip`: steps of the stage this activation holds already (adopted,
    or queued to run first)."""

    stage: int
    after: str | None = None
    done: bool = False
    skip: set[str] = field(default_factory=set)
    #: The stage's records of a first run's kept chunks, each step's first attempt: handed out
    #: a page at a time (a plan of 100,000 steps is not all put in the window before it runs).
    ahead: deque[PlannedStep] = field(default_factory=deque)

    @classmethod
    def first_run(cls, stage: int, kept: list[PlannedStep], done: bool) -> Feed:
        """The first stage's feed after a plan is written: `kept` first, then storage after
        them (`done`: the plan is all kept)."""
        ahead = deque(r for r in kept if r.stage == stage)
        return cls(stage, after=kept[-1].step_id if kept else None, done=done, ahead=ahead)

    @property
    def empty(self) -> bool:
        """Every step is handed out: nothing ahead, nothing left in storage."""
        return self.done and not self.ahead

    def take_ahead(self, limit: int) -> list[StepStart]:
        """The next `limit` steps kept in memory, out of `ahead`."""
        new, pop = tuple.__new__, self.ahead.popleft
        return [
            new(StepStart, (r.step_id, r.type, r.stage, 1, r.request_json))
            for r in (pop() for _ in range(min(limit, len(self.ahead))))
        ]

    def take(self, page: list[StoredStart], limit: int) -> list[StepStart]:
        """A page read at `after`: the steps to start, each at its stored attempt (a stopped
        step as its next one, so a stop report of the run it replaces, delivered again,
        cannot pass for the new run's outcome)."""
        if page:
            self.after = page[-1].step_id
        self.done = len(page) < limit
        return [to_start(row) for row in page if row.step_id not in self.skip]


def to_start(row: StoredStart) -> StepStart:
    attempt = max(1, row.attempt) + (row.status is StepStatus.STOPPED)
    return StepStart(row.step_id, row.type, row.stage, attempt, row.request_json)


#: The statuses the feed reads: steps without an outcome.
FEED_STATUSES = UNFINISHED_STEP
