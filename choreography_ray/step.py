"""The user's step type: `JobStep`, its outcome (`StepResult`) and what it sees (`StepContext`)."""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from pydantic import BaseModel, ConfigDict, SerializeAsAny

if TYPE_CHECKING:
    from choreography_ray.model import StepOutput
    from choreography_ray.outputs import OutputReader
    from choreography_ray.scheduler.deciding import JobDecisions

RequestT = TypeVar("RequestT", bound=BaseModel)
T = TypeVar("T")
A = TypeVar("A")


class StepResult(BaseModel):
    """What `perform` returns: `StepResult.succeeded()` or `StepResult.failed("why")`.

    A failure's `code`, when given, is its signature: the failed steps of a job group by it
    (`manager.failures`), else by the message with its numbers, ids, paths and quoted values
    masked."""

    model_config = ConfigDict(frozen=True)

    success: bool
    message: str | None = None
    code: str | None = None
    #: A succeeded step's output: any pydantic model, stored as its JSON (docs/outputs.md).
    output: SerializeAsAny[BaseModel] | None = None

    @classmethod
    def succeeded(cls, output: BaseModel | None = None) -> StepResult:
        """Success; `output`, when given, is stored as the step's output (at most
        `JobsOptions.max_output_bytes` of JSON), read back with `manager.outputs`,
        `jobs.outputs_dataset` or a later stage's `context.outputs`."""
        if output is None:
            return _SUCCEEDED
        if not isinstance(output, BaseModel):
            raise TypeError(
                f"StepResult.succeeded(output=...) takes a pydantic model, not "
                f"{type(output).__name__}"
            )
        return cls(success=True, output=output)

    @classmethod
    def failed(cls, message: str, code: str | None = None) -> StepResult:
        return cls(success=False, message=message, code=code)


_SUCCEEDED = StepResult(success=True)


class StepContext:
    """What a running step knows about itself, and its cancellation signal.

    A stop or removal of the job sets the signal; a step may check `is_cancelled` (also from a
    worker thread) or `await context.cancelled()`. A step that ignores it is counted when it ends.

    `await context.decide(question, state, ask)` records `ask()`'s answer for the job's
    scheduler run and replays a failed run's answers into its retry (docs/scheduler.md,
    "Decisions of a run"); a sync `perform` calls `context.decide_sync(...)`.

    `async for out in context.outputs(stage=10)` reads the job's outputs (`StepOutput`) of an
    earlier stage, a page at a time (docs/outputs.md, "Fan-in"); a sync `perform` iterates
    `context.outputs_sync(stage=10)`.
    """

    __slots__ = (
        "_cancelled",
        "_decisions",
        "_event",
        "_outputs",
        "attempt",
        "job_id",
        "stage",
        "step_id",
    )

    def __init__(
        self,
        job_id: str,
        step_id: str,
        stage: int,
        attempt: int,
        decisions: JobDecisions | None = None,
        outputs: OutputReader | None = None,
    ) -> None:
        self.job_id = job_id
        self.step_id = step_id
        self.stage = stage
        self.attempt = attempt
        # The step host's, shared by its steps: nothing is read unless `decide` is called.
        self._decisions = decisions
        self._outputs = outputs
        # A plain flag (read from any thread) and an event made only for a step that awaits
        # it: a context is made per step on the hot path.
        self._cancelled = False
        self._event: asyncio.Event | None = None

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    async def cancelled(self) -> None:
        """Returns once the step is told to stop."""
        if self._event is None:
            self._event = asyncio.Event()
            if self._cancelled:
                self._event.set()
        await self._event.wait()

    def cancel(self) -> None:
        """Called on the step host's event loop."""
        self._cancelled = True
        if self._event is not None:
            self._event.set()

    @overload
    async def decide(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], Awaitable[T] | T],
    ) -> T: ...

    @overload
    async def decide(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], Any],
        *,
        answer_type: type[A],
    ) -> A: ...

    async def decide(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], Any],
        *,
        answer_type: Any = None,
    ) -> Any:
        """The answer to `question` about `state`: recorded for this job's scheduler run, and
        in a retry the failed run's answer when it was asked the same way about a state that
        hashes the same, younger than `replay_answers_for`; else `ask()`'s (awaited when it is
        awaitable), recorded. In a scheduler run the answer is returned as stored, as JSON (a
        model as `model_dump(mode="json")`), or validated into `answer_type`; in a job that is
        no scheduler run, `ask()`'s answer as it is, recorded nowhere."""
        if self._decisions is None:
            answer = ask()
            return await answer if inspect.isawaitable(answer) else answer
        return await self._decisions.decide(self.job_id, question, state, ask, answer_type)

    @overload
    def decide_sync(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], T],
    ) -> T: ...

    @overload
    def decide_sync(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], Any],
        *,
        answer_type: type[A],
    ) -> A: ...

    def decide_sync(
        self,
        question: str,
        state: BaseModel | Mapping[str, Any],
        ask: Callable[[], Any],
        *,
        answer_type: Any = None,
    ) -> Any:
        """`decide` for a sync `perform` (in its worker thread): the storage calls run on the
        step host's event loop, `ask` in this thread. Raises `RuntimeError` on the loop itself."""
        if self._decisions is None:
            answer = ask()
            if inspect.isawaitable(answer):
                raise TypeError("decide_sync outside a step host: ask must answer at once")
            return answer
        return self._decisions.decide_sync(self.job_id, question, state, ask, answer_type)

    def outputs(self, stage: int | None = None, *, page: int = 1000) -> AsyncIterator[StepOutput]:
        """The job's outputs (of `stage`, or every stage's) by step id, read `page` at a time:
        a reduce step reads what a map stage returned, however many, in bounded memory."""
        return self._reader().read(self.job_id, stage, page)

    def outputs_sync(self, stage: int | None = None, *, page: int = 1000) -> Iterator[StepOutput]:
        """`outputs` for a sync `perform` (in its worker thread)."""
        return self._reader().read_sync(self.job_id, stage, page)

    def _reader(self) -> OutputReader:
        if self._outputs is None:
            raise RuntimeError("a step reads its job's outputs only when run by a step host")
        return self._outputs


class BatchContext(StepContext):
    """The context of one `perform_batch` call: the batch's steps (`steps`, in the order of the
    requests), all of one job. Cancelled when the job stops; `step_id` and `attempt` are the
    first step's."""

    __slots__ = ("steps",)

    def __init__(self, steps: list[StepContext]) -> None:
        first = steps[0]
        super().__init__(
            first.job_id,
            first.step_id,
            first.stage,
            first.attempt,
            first._decisions,
            first._outputs,
        )
        self.steps = steps


class JobStep(Generic[RequestT]):
    """A unit of work of a job. Override `perform` (async, or sync to run in a worker thread),
    or `perform_batch` to get many steps' requests in one call.

    `dedicated = True` runs each step of this type in its own named actor
    `step/{job_id}/{step_id}`, created with `actor_options` (e.g. `{"num_gpus": 1}`).

    `resources` (`num_cpus`, `num_gpus`, `memory` in bytes, custom resources) runs the type's
    steps on a pool of hosts of that shape, `pool/{shape}/{node}/{n}`, each reserving them:
    as many as the cluster can place beside everything else and the jobs' waiting steps need,
    at least `min_hosts` while the pool is in use and at most `max_hosts` (None: as many as
    fit, and per node at most its CPUs or GPUs, whichever is more, for a custom resource).
    A host makes one instance of the type, calls `setup` once before its first step (again on
    the next steps when it raised), and runs at most `concurrency` performs (or batches) of
    the type at once. A type without `resources` that overrides `setup` or `perform_batch` gets
    the same on the shared hosts.
    `max_concurrent` and `max_per_second` limit the type's steps over every job and host of
    the cluster; `max_concurrent_per_key` limits them per `concurrency_key`, and `limits` names
    the `JobsOptions.limits` they take a permit of too (docs/pools.md).
    """

    dedicated: ClassVar[bool] = False
    actor_options: ClassVar[dict[str, Any]] = {}
    resources: ClassVar[dict[str, float] | None] = None
    concurrency: ClassVar[int] = 1
    batch_size: ClassVar[int] = 64
    batch_wait: ClassVar[float] = 0.05
    max_concurrent: ClassVar[int | None] = None
    max_per_second: ClassVar[float | None] = None
    max_concurrent_per_key: ClassVar[int | None] = None
    limits: ClassVar[tuple[str, ...]] = ()
    min_hosts: ClassVar[int] = 0
    max_hosts: ClassVar[int | None] = None

    def setup(self) -> Any:
        """Once per host before the type's first step there (async, or sync in a worker
        thread): load a model, open a client. Raising fails the steps it was called for."""

    def perform(self, request: RequestT, context: StepContext) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__} does not implement perform")

    def perform_batch(self, requests: list[RequestT], context: BatchContext) -> Any:
        """One `StepResult` per request, in order (async, or sync in a worker thread). Raising
        fails every step of the batch. Gets up to `batch_size` steps of one job, waiting at
        most `batch_wait` seconds for a batch to fill."""
        raise NotImplementedError(f"{type(self).__qualname__} does not implement perform_batch")

    def concurrency_key(self, request: RequestT) -> str | None:
        """The key `max_concurrent_per_key` counts this step under (a customer, a tenant);
        None: the step takes no per-key permit. Raising fails the step."""
        return None

    @classmethod
    def request_type(cls) -> type[BaseModel]:
        return request_type_of(cls, JobStep)


def request_type_of(cls: type, generic_base: type) -> type[BaseModel]:
    """The pydantic model a `Job[...]` or `JobStep[...]` subclass was parametrized with."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is generic_base:
                (arg,) = typing.get_args(base)
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    return arg
    raise TypeError(
        f"{cls.__qualname__} must subclass {generic_base.__name__}[SomeRequest] with a pydantic "
        "model as the request type"
    )
