"""A lane's waiting steps and the order they start in (`LaneQueue`, `runtime.lanes.Lane`).

A step that may start (an unlimited type's, or one whose permit is in hand) waits in its job's
queue, and a turn per step waits in a `core.sharing.FairQueue`: jobs of the highest priority
first, then fairness keys by weight, then first come (the job whose oldest step came first). A
batch takes one turn and its job's first steps; the turns of the others it took are passed when
they come (`_ahead`), so the shares count steps. A limited type's step first waits for a permit,
grouped by `Want` (priority, fairness key, weight, concurrency key), apart from the others: a
key at its limit holds up no other key's steps. No Ray here.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel

from choreography_ray.core.gate import Gate
from choreography_ray.core.limits import Want
from choreography_ray.core.messages import StepStart
from choreography_ray.core.sharing import FairQueue, Share
from choreography_ray.step import StepContext

#: Batches' worth of steps a lane looks past, at most, for a job whose batch may start: the
#: others' wait for `batch_wait` holds up no full batch behind them.
LOOK_PAST = 4


class Item(NamedTuple):
    """A step waiting in a lane, since `arrived` (monotonic seconds), and the concurrency key
    it takes a per-key permit of (None: none)."""

    job_id: str
    start: StepStart
    request: BaseModel
    context: StepContext
    arrived: float
    key: str | None = None


class LaneQueue:
    """`size`: a batch's steps at most (1 unbatched); `wait`: the seconds a batch that is not
    full waits, from its oldest step; `share_of`: a job's `Share`."""

    def __init__(self, size: int, wait: float, share_of: Callable[[str], Share]) -> None:
        self.size = size
        self.wait = wait
        self._share_of = share_of
        #: Per job, its steps that may start, in arrival order, and a turn per step.
        self.queued: dict[str, deque[Item]] = {}
        self._turns: FairQueue[str] = FairQueue()
        #: Per job, its steps started ahead of their turns: as many turns are passed.
        self._ahead: Counter[str] = Counter()
        self.staged = 0
        #: A limited type's steps waiting for a permit, per want, in arrival order.
        self.held_back: dict[Want, deque[Item]] = {}
        self.held = 0

    def __len__(self) -> int:
        return self.staged + self.held

    def waiting_by_key(self) -> Counter[str]:
        """Steps waiting per fairness key: for their turn, and for a permit."""
        counts: Counter[str] = Counter()
        for job_id, items in self.queued.items():
            counts[self._share_of(job_id).key] += len(items)
        for want, items in self.held_back.items():
            counts[want[1]] += len(items)
        return counts

    def stage(self, item: Item) -> None:
        """The step may start: it waits for its turn."""
        self.queued.setdefault(item.job_id, deque()).append(item)
        self._turns.push(item.job_id, self._share_of(item.job_id))
        self.staged += 1

    def hold_back(self, item: Item) -> None:
        """The step waits for a permit first."""
        share = self._share_of(item.job_id)
        want = (share.priority, share.key, share.weight, item.key)
        self.held_back.setdefault(want, deque()).append(item)
        self.held += 1

    def admit(self, gate: Gate) -> None:
        """The steps the permits granted are for may start."""
        for want in list(gate.granted):
            items = self.held_back.get(want)
            if not items:
                continue
            for _ in range(gate.take(want, len(items))):
                self.stage(items.popleft())
                self.held -= 1
            if not items:
                del self.held_back[want]

    def wants(self, room: int) -> dict[Want, int]:
        """The steps waiting for a permit that could start in `room`: a batch's worth of each
        want in turn, highest priority first, then first come."""
        if self.held <= room:
            return {want: len(items) for want, items in self.held_back.items()}
        wants: Counter[Want] = Counter()
        order = sorted(self.held_back.items(), key=lambda wi: (wi[0][0], wi[1][0].arrived))
        while room > 0 and order:
            for want, items in order:
                more = min(self.size, len(items) - wants[want], room)
                wants[want] += more
                room -= more
            order = [(want, items) for want, items in order if wants[want] < len(items)]
        return dict(wants)

    def next_job(self, now: float) -> str | None:
        """The job whose turn it is, of those whose batch is full or waited long enough; the
        turns of the others keep their place (`LOOK_PAST` batches' worth at most)."""
        passed: list[str] = []
        try:
            while len(passed) < LOOK_PAST * self.size and (job_id := self._turn()) is not None:
                queue = self.queued[job_id]
                if len(queue) >= self.size or queue[0].arrived + self.wait <= now:
                    return job_id
                passed.append(job_id)
            return None
        finally:
            for job_id in reversed(passed):  # charged once already (`FairQueue`): cost 0
                self._turns.push(job_id, self._share_of(job_id), cost=0, front=True)

    def take(self, job_id: str, most: int, turns: int = 1) -> list[Item]:
        """Up to `most` of the job's steps that may start, `turns` of its turns taken."""
        queue = self.queued[job_id]
        items = [queue.popleft() for _ in range(min(most, len(queue)))]
        if not queue:
            del self.queued[job_id]
        self._ahead[job_id] += len(items) - turns
        self.staged -= len(items)
        return items

    def take_next(self, now: float) -> tuple[list[Item], list[Item]]:
        """Takes the steps the lane would run next, a batch's worth of one job: (those that
        may start, those that wait for a permit); of the oldest that waits for a permit when
        none may start."""
        if self.queued:
            job_id = self.next_job(now)
            if job_id is None:  # no batch may start yet: the first job's, out of turn
                return self.take(next(iter(self.queued)), self.size, turns=0), []
            return self.take(job_id, self.size), []
        if not self.held_back:
            return [], []
        want, queue = min(self.held_back.items(), key=lambda wi: wi[1][0].arrived)
        items = [queue.popleft() for _ in range(min(self.size, len(queue)))]
        self.held -= len(items)
        if not queue:
            del self.held_back[want]
        return [], items

    def next_waiting(self) -> str | None:
        """The job of a step the lane would run next."""
        if self.queued:
            return next(iter(self.queued))
        heads = [items[0] for items in self.held_back.values()]
        return min(heads, key=lambda item: item.arrived).job_id if heads else None

    def due(self) -> float | None:
        """When the oldest batch that may start has waited long enough (None: none waits)."""
        if not self.queued:
            return None
        return min(queue[0].arrived for queue in self.queued.values()) + self.wait

    def cancel(self, job_id: str) -> tuple[list[Item], list[Item]]:
        """Takes out every step of the job: (those that may start, those held back)."""
        staged = list(self.queued.pop(job_id, ()))
        if staged:
            self._turns.remove_if(lambda turn: turn == job_id)
            self._ahead.pop(job_id, None)
            self.staged -= len(staged)
        held: list[Item] = []
        for want, queue in list(self.held_back.items()):
            kept = deque(item for item in queue if item.job_id != job_id)
            held += [item for item in queue if item.job_id == job_id]
            self.held -= len(queue) - len(kept)
            if kept:
                self.held_back[want] = kept
            else:
                del self.held_back[want]
        return staged, held

    def _turn(self) -> str | None:
        while self._turns:
            job_id = self._turns.pop()
            if self._ahead[job_id] <= 0:
                self._ahead.pop(job_id, None)
                return job_id
            self._ahead[job_id] -= 1
        return None
