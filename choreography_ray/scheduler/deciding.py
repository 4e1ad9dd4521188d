"""`StepContext.decide`: recording a run's answers and replaying a failed run's into its retry.

`RunDecisions` is the logic for one scheduler run, on the scheduler's storage (no `ray`): a
decision's key is `decision_key(question, state_hash(state))`. The answer this run recorded for
the key stays (a second ask returns it, `ask` is not called); else, when the run replays another
run (`replays` set, not `replay_abandoned`) and that run recorded an answer for the key younger
than `replay_answers_for`, that answer is recorded for this run too (`replayed=True`) and
returned; else `ask()` is called and its answer recorded. Only answers are replayed: the step
itself runs again.

Answers are stored as JSON: a pydantic model as `model_dump(mode="json")`, anything else as
pydantic's JSON-able form (`to_jsonable_python`); an answer that is not JSON-serialisable fails
the call before anything is recorded. `decide` returns the stored JSON, the same on the first
ask and on a replay; with `answer_type` it is validated into that type (a model, a dataclass,
`list[int]`...) both times.

`JobDecisions` is a step host's: per job, it finds the job's run once (`run_for_job`) and
reads the decisions of the run and of the run it replays once, shared by every step of the job
on the host until the job's entries there are dropped (`forget`). A job that is no scheduler
run records nothing: `decide` returns `ask()`'s answer as it is. A lookup that fails is logged
and that call asks without recording (asking afresh is never an error); the next call looks
again. `decide_sync` is for a sync `perform` in a worker thread: the storage calls run on the
host's event loop, `ask` in the calling thread.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from choreography_ray.logs import get_logger, ids
from choreography_ray.model import utcnow
from choreography_ray.scheduler.decisions import decision_key, is_replayable, state_hash
from choreography_ray.scheduler.records import Decision, ManifestRun
from choreography_ray.storage.scheduler import SchedulerStorage

log = get_logger(__name__)

State = BaseModel | Mapping[str, Any]
Ask = Callable[[], Any]


def as_json(answer: Any) -> Any:
    """The answer as it is stored: JSON-able (a model in pydantic's JSON mode)."""
    if isinstance(answer, BaseModel):
        return answer.model_dump(mode="json")
    return to_jsonable_python(answer)


def typed(answer: Any, answer_type: Any | None) -> Any:
    """A stored answer as `decide` returns it: as stored, or validated into `answer_type`."""
    if answer_type is None:
        return answer
    return TypeAdapter(answer_type).validate_python(answer)


async def answer_of(ask: Ask) -> Any:
    """What `ask()` answers, awaited when it is awaitable."""
    answer = ask()
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


class RunDecisions:
    """`decide` for one scheduler run: `own` its recorded answers by key, `source` the answers
    of the run it replays (empty when it asks afresh)."""

    def __init__(
        self,
        storage: SchedulerStorage,
        run: ManifestRun,
        replay_answers_for: timedelta,
        *,
        own: Mapping[str, Decision] = {},
        source: Mapping[str, Decision] = {},
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.storage = storage
        self.run = run
        self.replay_answers_for = replay_answers_for
        self.own = dict(own)
        self.source = dict(source)
        self.clock = clock

    @classmethod
    async def load(
        cls,
        storage: SchedulerStorage,
        run: ManifestRun,
        replay_answers_for: timedelta,
        clock: Callable[[], datetime] = utcnow,
    ) -> RunDecisions:
        """Reads the run's own answers and those of the run it replays."""
        own = {d.key: d for d in await storage.list_decisions(run.id)}
        source: dict[str, Decision] = {}
        if run.replays is not None and not run.replay_abandoned:
            source = {d.key: d for d in await storage.list_decisions(run.replays)}
            if not source:
                log.warning("run %s replays run %s, which recorded no decisions: it asks "
                            "afresh", run.id, run.replays)  # fmt: skip
        return cls(storage, run, replay_answers_for, own=own, source=source, clock=clock)

    async def recall(self, question: str, hashed_state: str) -> Decision | None:
        """The answer this run gives without asking: its own for the key, else the replayed
        run's (recorded for this run first); None when it must ask."""
        key = decision_key(question, hashed_state)
        if (own := self.own.get(key)) is not None:
            return own
        found = self.source.get(key)
        if found is None or found.question != question:
            return None
        if not is_replayable(found, self.clock(), self.replay_answers_for):
            return None
        return await self._record(question, hashed_state, found.answer, replayed=True)

    async def record(self, question: str, hashed_state: str, answer: Any) -> Decision:
        """Records `ask()`'s answer (as JSON); the stored one (the first for the key stays)."""
        return await self._record(question, hashed_state, as_json(answer), replayed=False)

    async def _record(
        self, question: str, hashed_state: str, answer: Any, *, replayed: bool
    ) -> Decision:
        decision = Decision(
            run_id=self.run.id, scope=self.run.scope, manifest=self.run.manifest,
            question=question, state_hash=hashed_state, answer=answer,
            recorded_at=self.clock(), replayed=replayed,
        )  # fmt: skip
        stored = await self.storage.record_decision(decision)
        self.own[stored.key] = stored
        return stored

    async def decide(
        self, question: str, state: State, ask: Ask, answer_type: Any | None = None
    ) -> Any:
        hashed = state_hash(state)
        found = await self.recall(question, hashed)
        if found is None:
            found = await self.record(question, hashed, await answer_of(ask))
        return typed(found.answer, answer_type)


class JobDecisions:
    """A step host's `decide` for the jobs of one storage: each job's run found once.
    `storage` opens the scheduler's storage, at the first `decide`."""

    def __init__(
        self,
        storage: Callable[[], SchedulerStorage],
        replay_answers_for: timedelta,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._open_storage = storage
        self._storage: SchedulerStorage | None = None
        self.replay_answers_for = replay_answers_for
        self.loop = loop
        self._jobs: dict[str, asyncio.Future[RunDecisions | None]] = {}

    async def for_job(self, job_id: str) -> RunDecisions | None:
        """The job's run's decisions, None when the job is no scheduler run. Raises when a
        lookup fails (and forgets it, so the next call looks again)."""
        found = self._jobs.get(job_id)
        if found is None:
            found = self._jobs[job_id] = asyncio.ensure_future(self._load(job_id))
        try:
            return await asyncio.shield(found)
        except Exception:
            if self._jobs.get(job_id) is found:
                del self._jobs[job_id]
            raise

    async def _load(self, job_id: str) -> RunDecisions | None:
        if self._storage is None:  # opened at the first decide: most hosts never need it
            self._storage = self._open_storage()
        storage = self._storage
        run = await storage.run_for_job(job_id)
        if run is None:
            return None
        return await RunDecisions.load(storage, run, self.replay_answers_for)

    async def _run_or_none(self, job_id: str) -> RunDecisions | None:
        try:
            return await self.for_job(job_id)
        except Exception as error:
            log.warning("job %s: could not find its scheduler run (%s); this decision is asked "
                        "and not recorded", job_id, error, extra=ids(job_id))  # fmt: skip
            return None

    def forget(self, job_id: str) -> None:
        """The job left this host: its run is looked up again if it comes back."""
        self._jobs.pop(job_id, None)

    async def decide(
        self, job_id: str, question: str, state: State, ask: Ask, answer_type: Any | None
    ) -> Any:
        run = await self._run_or_none(job_id)
        if run is None:
            return await answer_of(ask)
        return await run.decide(question, state, ask, answer_type)

    def decide_sync(
        self, job_id: str, question: str, state: State, ask: Ask, answer_type: Any | None
    ) -> Any:
        """`decide` from a worker thread: storage on the host's loop, `ask` in this thread
        (an awaitable it returns is awaited on the loop)."""
        if _running_loop() is self.loop:
            raise RuntimeError("decide_sync blocks: from an async perform, await decide")
        hashed = state_hash(state)
        run = self._on_loop(self._run_or_none(job_id))
        if run is not None and (found := self._on_loop(run.recall(question, hashed))):
            return typed(found.answer, answer_type)
        answer = ask()
        if inspect.isawaitable(answer):
            answer = self._on_loop(_awaited(answer))
        if run is None:
            return answer
        return typed(self._on_loop(run.record(question, hashed, answer)).answer, answer_type)

    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
