"""Who goes next where steps wait for capacity (a step host's room, its threads, a lane, the
permits of a limit): the highest priority first (1 before 5); among equal priorities, the
fairness keys with waiting items share by weight; first come within a key. Nothing running is
preempted: this only orders what waits.

The share between keys is start-time fair queuing (Goyal et al., 1996), deficit round robin's
exact twin for items of any cost: each key's head item carries a virtual start time; the item
with the smallest goes next, and its key's next item starts `cost / weight` later. A key that
had nothing waiting joins at the level's virtual time (the start of the item served last), so
it goes next at once and an idle key saves no credit. A key with nothing waiting is
remembered only while its next start is ahead of the virtual time: the state grows with what
waits and was just served, never with history. No Ray here.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")

#: Priorities, most urgent first.
PRIORITIES = range(1, 6)
#: A job's priority when neither its start nor its type says one.
DEFAULT_PRIORITY = 3


class Share(NamedTuple):
    """What a job's waiting steps are ordered by: its `priority` (1 first ... 5), its fairness
    `key` (default: its manager's namespace) and the key's `weight` (default 1.0)."""

    priority: int = DEFAULT_PRIORITY
    key: str = ""
    weight: float = 1.0


#: The share of a job that says none (a job actor of an earlier release).
NO_SHARE = Share()


def check_priority(priority: object) -> int:
    """`priority` when it is an int from 1 to 5; else `ValueError` saying so."""
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise ValueError(f"priority must be an int from 1 (first) to 5, not {priority!r}")
    return priority


@dataclass
class _Key(Generic[T]):
    #: (item, cost, arrival number) in arrival order.
    items: deque[tuple[T, float, int]]
    #: The virtual start of the head item.
    start: float
    weight: float


@dataclass
class _Level(Generic[T]):
    keys: dict[str, _Key[T]] = field(default_factory=dict)
    #: Virtual time: the start of the item served last.
    clock: float = 0.0
    #: Keys served lately that have nothing waiting, with when their next item may start: a
    #: key that comes back at once does not jump its turn. Kept while ahead of `clock`.
    rested: dict[str, float] = field(default_factory=dict)


class FairQueue(Generic[T]):
    """Items waiting, each with its `Share` and a cost (steps, for a batch)."""

    def __init__(self) -> None:
        #: Per priority (five at most, kept once used), its keys.
        self._levels: dict[int, _Level[T]] = {}
        self._arrivals = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: T, share: Share, cost: float = 1.0, front: bool = False) -> None:
        """Queues `item`; `front` puts it before its key's others (an item taken and put
        back: it keeps its turn)."""
        level = self._levels.setdefault(share.priority, _Level())
        key = level.keys.get(share.key)
        weight = share.weight if share.weight > 0 else 1.0
        if key is None:
            start = max(level.clock, level.rested.pop(share.key, level.clock))
            key = level.keys[share.key] = _Key(deque(), start, weight)
        key.weight = weight
        entry = (item, float(cost), next(self._arrivals))
        if front:
            key.items.appendleft(entry)
        else:
            key.items.append(entry)
        self._size += 1

    def peek(self) -> T | None:
        """The item that goes next, left queued (None: nothing waits)."""
        found = self._next()
        return None if found is None else found[1].items[0][0]

    def pop(self) -> T:
        """Serves the item that goes next: its key's next item starts `cost / weight` later."""
        found = self._next()
        if found is None:
            raise IndexError("nothing waits")
        level, key, name = found
        item, cost, _ = key.items.popleft()
        level.clock = key.start
        key.start += cost / key.weight
        self._size -= 1
        if not key.items:
            del level.keys[name]
            level.rested = {k: t for k, t in level.rested.items() if t > level.clock}
            level.rested[name] = key.start
        return item

    def remove_if(self, drop: Callable[[T], bool]) -> list[T]:
        """Takes every item `drop` says out (a stopped job's), in arrival order."""
        dropped: list[tuple[int, T]] = []
        for level in self._levels.values():
            for name, key in list(level.keys.items()):
                kept = deque(entry for entry in key.items if not drop(entry[0]))
                dropped.extend((n, item) for item, _, n in key.items if drop(item))
                key.items = kept
                if not kept:
                    del level.keys[name]
        self._size -= len(dropped)
        return [item for _, item in sorted(dropped, key=lambda pair: pair[0])]

    def waiting(self) -> dict[str, float]:
        """The cost waiting per fairness key, over every priority (steps, where an item's
        cost is its steps)."""
        counts: dict[str, float] = {}
        for level in self._levels.values():
            for name, key in level.keys.items():
                counts[name] = counts.get(name, 0) + sum(cost for _, cost, _ in key.items)
        return counts

    def __iter__(self) -> Iterator[T]:
        """Every item waiting, in no particular order."""
        for level in self._levels.values():
            for key in level.keys.values():
                for item, _, _ in key.items:
                    yield item

    def _next(self) -> tuple[_Level[T], _Key[T], str] | None:
        priority = min((p for p, level in self._levels.items() if level.keys), default=None)
        if priority is None:
            return None
        level = self._levels[priority]
        name, key = min(level.keys.items(), key=lambda kv: (kv[1].start, kv[1].items[0][2]))
        return level, key, name
