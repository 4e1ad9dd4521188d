"""The job's step runs, the active window and the start throttle: which steps start, on which
host, and when.

Every step the activation holds is one row of one table (`Window.runs`, keyed by step id), in
exactly one state:

    HELD          read before its stage begins (the steps a resume found running nowhere while
                  its hook is owed): queued when the stage begins
    QUEUED        waits for the window and the throttle, in order
    STARTING      taken for a start operation not answered yet (it counts against both)
    ACTIVE        its host took it, or it was found running there: it reports its outcome
    OWNER_LOST    ACTIVE on a host whose process the job saw go (leases on: the lease decides)
    START_FAILED  its start operation threw: it starts again after a delay, or a stop counts it
    RETRY_WAIT    its next attempt waits for the retry delay (a stop counts it failed)

A step leaves the table when its outcome counts (`take`), when a stop counts it as never started
(`never_started`), when its stage is skipped (`release`), or when the activation forgets its
runs for a resume (`clear`). A run whose
attempt is a retry no host has taken yet carries `retry` (a stop counts it failed, not stopped).

The job hands steps of the running stage to step hosts in batches (one start operation = one
RPC of at most `step_batch_size` steps). Never more than the window (`max_active_steps_per_job`
or the job type's `max_active_steps`; below 1 is 1) run at once, and never more than
`max_concurrent_step_starts` steps are being started at once: the throttle counts steps, not
RPCs, so it bounds the load a burst of starts puts on storage and hosts whatever the batch size.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from choreography_ray.core.messages import StepStart
from choreography_ray.options import JobsOptions, window_size


class RunState(enum.StrEnum):
    HELD = "Held"
    QUEUED = "Queued"
    STARTING = "Starting"
    ACTIVE = "Active"
    OWNER_LOST = "OwnerLost"
    START_FAILED = "StartFailed"
    RETRY_WAIT = "RetryWait"


#: The states in which a step occupies the window (it runs, or is being started).
IN_FLIGHT = (RunState.STARTING, RunState.ACTIVE, RunState.OWNER_LOST)
#: The states in which a step runs on its host as far as the job knows: its outcome may be
#: stored (a step being started has nothing stored yet).
RUNNING = (RunState.ACTIVE, RunState.OWNER_LOST)
#: The states a stop counts (as stopped, or failed for a retry): the step never started.
WAITING = (RunState.HELD, RunState.QUEUED, RunState.START_FAILED, RunState.RETRY_WAIT)


@dataclass(slots=True)
class StepRun:
    start: StepStart
    state: RunState
    #: The host it was handed to (STARTING, ACTIVE; "" when not known).
    host: str = ""
    #: Its attempt is a retry no host has taken yet.
    retry: bool = False
    #: RETRY_WAIT: the monotonic time its attempt is due.
    due: float = 0.0


@dataclass(slots=True)
class Window:
    options: JobsOptions
    size: float = math.inf
    #: The step runs, by step id.
    runs: dict[str, StepRun] = field(default_factory=dict)
    #: QUEUED runs in start order, a line per step type (the pools' types wait for room on
    #: their hosts, the others do not wait behind them); a run that left QUEUED since is
    #: skipped when reached.
    _queues: dict[str, deque[StepRun]] = field(default_factory=dict)
    #: QUEUED runs per step type.
    _queued: Counter[str] = field(default_factory=Counter)
    #: In-flight runs per host (those handed to a host).
    _load: Counter[str] = field(default_factory=Counter)
    #: RETRY_WAIT runs by due time; a run that left RETRY_WAIT since is skipped when reached.
    _due: list[tuple[float, int, StepRun]] = field(default_factory=list)
    _count: Counter[RunState] = field(default_factory=Counter)
    #: The HELD runs of each stage read ahead (its beginning reads no more of them); a run that
    #: left HELD since is skipped.
    _held: dict[int, list[StepRun]] = field(default_factory=dict)
    _ticket: Iterator[int] = field(default_factory=itertools.count)

    def configure(self, configured: int | None) -> None:
        """The job type's `max_active_steps`, else the option; None is no window."""
        if configured is None:
            configured = self.options.max_active_steps_per_job
        size = window_size(configured)
        self.size = math.inf if size is None else size

    # -- the table ----------------------------------------------------------------------------

    def _put(
        self, start: StepStart, state: RunState, host: str = "", retry: bool = False
    ) -> StepRun:
        self._drop(start.step_id)
        run = self.runs[start.step_id] = StepRun(start, state)
        self._enter(run, state)
        run.host, run.retry = host, retry
        self._tally(run, 1)
        if state is RunState.QUEUED:
            self._queues.setdefault(start.type, deque()).append(run)
        return run

    def _drop(self, step_id: str) -> StepRun | None:
        run = self.runs.pop(step_id, None)
        if run is not None:
            self._tally(run, -1)
            self._count[run.state] -= 1
            if run.state is RunState.QUEUED:
                self._queued[run.start.type] -= 1
        return run

    def _enter(self, run: StepRun, state: RunState) -> None:
        self._count[state] += 1
        if state is RunState.QUEUED:
            self._queued[run.start.type] += 1

    def _move(self, run: StepRun, state: RunState) -> None:
        self._tally(run, -1)
        self._count[run.state] -= 1
        if run.state is RunState.QUEUED:
            self._queued[run.start.type] -= 1
        run.state = state
        self._enter(run, state)
        self._tally(run, 1)

    def _tally(self, run: StepRun, sign: int) -> None:
        """Keeps `_load` (in-flight runs per host) as a run enters or leaves it."""
        if run.host and run.state in IN_FLIGHT:
            self._load[run.host] += sign
            if not self._load[run.host]:
                del self._load[run.host]

    def load(self, host: str) -> int:
        """The steps in flight on `host`."""
        return self._load[host]

    def queued(self, step_type: str) -> int:
        """The steps of `step_type` waiting to start."""
        return self._queued[step_type]

    def queued_types(self) -> list[str]:
        """The step types with steps waiting to start."""
        return [t for t, n in self._queued.items() if n > 0]

    def state_of(self, step_id: str) -> RunState | None:
        run = self.runs.get(step_id)
        return None if run is None else run.state

    def count(self, *states: RunState) -> int:
        return sum(self._count[state] for state in states)

    def in_flight(self) -> int:
        """Steps running or being started: what the window holds."""
        return self.count(*IN_FLIGHT)

    def is_in_flight(self, step_id: str) -> bool:
        return self.state_of(step_id) in IN_FLIGHT

    def active(self, *states: RunState) -> dict[str, tuple[StepStart, str]]:
        """Step id -> (start, host) of the runs in `states` (default: in flight)."""
        states = states or IN_FLIGHT
        return {i: (run.start, run.host) for i, run in self.runs.items() if run.state in states}

    def on_host(self, host: str) -> list[StepStart]:
        if not self._load[host]:
            return []
        return [run.start for run in self.runs.values()
                if run.state in IN_FLIGHT and run.host == host]  # fmt: skip

    def hosts(self) -> set[str]:
        """The hosts that hold steps of the job in flight."""
        return {host for host, n in self._load.items() if n > 0}

    def failed_starts(self) -> list[StepStart]:
        return [run.start for run in self.runs.values() if run.state is RunState.START_FAILED]

    def next_due_in(self) -> float | None:
        """Seconds until the next retry is due (None: none waits)."""
        self._skip_stale_due()
        return max(0.0, self._due[0][0] - time.monotonic()) if self._due else None

    def _skip_stale_due(self) -> None:
        while self._due and not self._is_current(self._due[0][2], RunState.RETRY_WAIT):
            heapq.heappop(self._due)

    def _is_current(self, run: StepRun, state: RunState) -> bool:
        return self.runs.get(run.start.step_id) is run and run.state is state

    # -- transitions --------------------------------------------------------------------------

    def hold(self, stage: int, starts: Iterable[StepStart]) -> None:
        """The stage's steps read before it begins: HELD until `release`."""
        runs, held, fresh = self.runs, list[StepRun](), 0
        for start in starts:
            if start.step_id in runs:
                held.append(self._put(start, RunState.HELD))
            else:
                # Not in the table: counted below. A HELD run is on no host and in no line.
                run = runs[start.step_id] = StepRun(start, RunState.HELD)
                held.append(run)
                fresh += 1
        self._count[RunState.HELD] += fresh
        self._held[stage] = held

    def release(self, stage: int) -> list[StepStart] | None:
        """The stage's HELD steps, still HELD (`queue` takes them on; a skipped stage's are
        forgotten); None when none were read ahead for it."""
        held = self._held.pop(stage, None)
        if held is None:
            return None
        return [run.start for run in held if self._is_current(run, RunState.HELD)]

    def queue(self, starts: Iterable[StepStart], front: bool = False) -> None:
        """The steps wait to start (at the front of the line: before those waiting already).
        A step already in the table keeps its `retry`."""
        starts = list(starts)
        runs, queues, queued = self.runs, self._queues, self._queued
        fresh = released = 0
        for start in starts:
            old = runs.get(start.step_id)
            # The hot paths, counted below: a step not in the table (the feed's pages), and
            # a held stage beginning (HELD and QUEUED: on no host).
            if old is None:
                run = runs[start.step_id] = StepRun(start, RunState.QUEUED)
                fresh += 1
            elif old.start is start and old.state is RunState.HELD:
                run = old
                run.state = RunState.QUEUED
                released += 1
            else:
                self._put(start, RunState.QUEUED, retry=old.retry)
                continue
            line = queues.get(start.type)
            if line is None:
                line = queues[start.type] = deque()
            line.append(run)
            queued[start.type] += 1
        self._count[RunState.HELD] -= released
        self._count[RunState.QUEUED] += fresh + released
        if front:
            # The new rows are the last of their lines: move them to the fronts.
            moved: dict[str, int] = Counter(start.type for start in starts)
            for step_type, n in moved.items():
                line = self._queues[step_type]
                line.extendleft([line.pop() for _ in range(n)])

    def wait_retry(self, failed: StepStart, delay: float) -> None:
        """The failed step's next attempt, due in `delay` seconds: RETRY_WAIT."""
        run = self._put(failed._replace(attempt=failed.attempt + 1), RunState.RETRY_WAIT,
                        retry=True)  # fmt: skip
        run.due = time.monotonic() + delay
        heapq.heappush(self._due, (run.due, next(self._ticket), run))

    def retry_due(self) -> None:
        """Retries whose delay is over wait first in line (QUEUED at the front)."""
        now = time.monotonic()
        due: list[StepStart] = []
        while True:
            self._skip_stale_due()
            if not self._due or self._due[0][0] > now:
                break
            due.append(heapq.heappop(self._due)[2].start)
        self.queue(due, front=True)

    def lose_owner(self, step_ids: Iterable[str]) -> None:
        """ACTIVE steps whose host's process is gone (leases on): OWNER_LOST."""
        for step_id in step_ids:
            run = self.runs.get(step_id)
            if run is not None and run.state is RunState.ACTIVE:
                self._move(run, RunState.OWNER_LOST)

    def next_batch(
        self, room_for: Callable[[str], float] = lambda _type: math.inf
    ) -> list[StepStart]:
        """The next steps to start, as the window, the throttle and `room_for` (step type ->
        how many of its steps the hosts take now) allow (empty: none now): STARTING from now
        on, on no host yet (`started` names it). The types' lines take turns in order."""
        room = min(
            self.size - self.in_flight(),
            self.options.effective_max_concurrent_step_starts - self.count(RunState.STARTING),
            self.options.step_batch_size,
        )
        batch: list[StepStart] = []
        runs, queued, starting = self.runs, RunState.QUEUED, RunState.STARTING
        for step_type, line in list(self._queues.items()):
            if len(batch) >= room:
                break
            take = min(room - len(batch), room_for(step_type))
            taken = 0
            while line and taken < take:
                run = line.popleft()
                if runs.get(run.start.step_id) is run and run.state is queued:
                    # QUEUED and STARTING on no host yet (`started` names it): no host's load
                    # changes; the states are counted below, for the whole batch.
                    run.state = starting
                    batch.append(run.start)
                    taken += 1
            self._queued[step_type] -= taken
            if not line:
                del self._queues[step_type]
        self._count[queued] -= len(batch)
        self._count[starting] += len(batch)
        return batch

    def started(self, batch: Iterable[StepStart], host: str) -> None:
        """The batch is STARTING on `host` and counts against the throttle until answered."""
        taken = 0
        for start in batch:
            run = self.runs.get(start.step_id)
            if run is not None and run.start is start and run.state is RunState.STARTING:
                run.host = host  # taken by `next_batch` (on no host): the hot path
                taken += 1
            else:
                self._put(start, RunState.STARTING, host, run is not None and run.retry)
        if taken and host:
            self._load[host] += taken

    def answered(self, batch: list[StepStart], ok: bool) -> None:
        """A start operation came back: its steps still STARTING at the same attempt are
        ACTIVE (a host took a retry: the attempt reports its own outcome from now on), or,
        when it threw, START_FAILED."""
        runs, starting, active = self.runs, RunState.STARTING, RunState.ACTIVE
        moved = 0
        for start in batch:
            run = runs.get(start.step_id)
            if run is None or run.state is not starting or run.start != start:
                continue
            if ok:
                # STARTING and ACTIVE on the same host: its load is the same (counted below).
                run.state = active
                run.retry = False
                moved += 1
            else:
                self._move(run, RunState.START_FAILED)
        self._count[starting] -= moved
        self._count[active] += moved

    def adopt(self, start: StepStart, host: str) -> None:
        """The step runs on `host` (found there, or its outcome is stored): ACTIVE."""
        self._put(start, RunState.ACTIVE, host)

    def take(self, step_id: str, attempt: int) -> tuple[StepStart, str] | None:
        """The step in flight at that attempt, out of the table; None when it is not."""
        run = self.runs.get(step_id)
        if run is None or run.state not in IN_FLIGHT or run.start.attempt != attempt:
            return None
        self._drop(step_id)
        return run.start, run.host

    def forget(self, step_ids: Iterable[str]) -> None:
        for step_id in step_ids:
            self._drop(step_id)

    def never_started(self) -> list[StepRun]:
        """HELD, QUEUED, START_FAILED and RETRY_WAIT runs, out of the table (a stop counts
        them)."""
        left = [run for run in self.runs.values() if run.state in WAITING]
        self.forget(run.start.step_id for run in left)
        self._queues.clear()
        self._due.clear()
        self._held.clear()
        return left

    def clear(self) -> None:
        self.runs.clear()
        self._queues.clear()
        self._due.clear()
        self._count.clear()
        self._queued.clear()
        self._load.clear()
        self._held.clear()
