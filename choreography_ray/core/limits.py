"""Limits across the cluster, with no storage round trip per step: one limiter actor per Ray
namespace (`runtime/limits.py`) keeps `LimitCore`, every limit of the cluster in one place, and
each host keeps a `Gate` per limited step type (`core/gate.py`) that asks it for permits.

The limits of a step are its type's own (`max_concurrent`, `max_per_second`), its type's per
key (`max_concurrent_per_key`, counted per (type, `concurrency_key`)) and each named limit its
type names (`JobStep.limits`): a step gets a permit only when every one of them has room, all
at once, so a step never holds one limit's permit while it waits for another's. A named limit
is the one set live (`set_limit`) if any, else the one the asking hosts' options configure.
Rates are token buckets, spent when granted.

A holder (a gate: a host's incarnation and a step type) says on every call what it holds per
concurrency key and what waits per `Want`, so a lost reply or a duplicate call corrects itself
on the next. A holder silent for `HOLDER_SECONDS` is gone (its host or node died): its permits
come back. A limiter that was restarted (its node died) grants nothing for `LEARN_SECONDS`,
until every live holder has told it what it holds.

Where permits are short, the steps that get them are chosen over every holder's latest wants
in `core.sharing` order (highest priority first, then fairness keys by weight, first come within
a key), a queue per step type; a step whose own key is at its limit is passed over. A permit
chosen for a holder other than the one asking is reserved for it and handed over on its next
ask; it comes back if that holder does not ask within `RESERVE_SECONDS`. No Ray here.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from choreography_ray.core.sharing import FairQueue, Share
from choreography_ray.limit import Limit, LimitKey, LimitState

#: Seconds between two reports of a holder that holds permits.
HEARTBEAT_SECONDS = 2.0
#: Seconds after which a silent holder's permits come back.
HOLDER_SECONDS = 5 * HEARTBEAT_SECONDS
#: Seconds a restarted limiter listens before it grants.
LEARN_SECONDS = 2 * HEARTBEAT_SECONDS
#: Seconds a refused holder waits before it asks again (the permits reserved for it meanwhile
#: are handed over then).
POLL_SECONDS = 0.05
#: Seconds a permit reserved for a holder waits for its next ask before it comes back; a
#: holder silent that long has its wants forgotten too.
RESERVE_SECONDS = 3.0
#: Seconds a refused holder is told to wait at most: it asks again well within
#: `RESERVE_SECONDS`, so its wants keep their place.
MAX_WAIT = RESERVE_SECONDS / 2
#: Steps of one `Want` of a holder queued for their turn at once; the rest queue as these go.
WINDOW = 64
#: Concurrency keys `LimitCore.states` lists per limit.
TOP_KEYS = 10

Key = str | None
#: Steps waiting for a permit: their (priority, fairness key, weight) and concurrency key.
Want = tuple[int, str, float, Key]
#: `("type", path)`, `("key", path, key)` or `("named", name)`.
LimitId = tuple[str, ...]
#: A `LimitState`: its kind and name (a per-key limit's keys count in one, named by the type).
Row = tuple[Literal["named", "type", "per-key"], str]


class TypeLimits(NamedTuple):
    """What a step type says of its limits (`JobStep`)."""

    max_concurrent: int | None = None
    max_per_second: float | None = None
    max_concurrent_per_key: int | None = None
    limits: tuple[str, ...] = ()

    @classmethod
    def of(cls, step_type: Any) -> TypeLimits:
        return cls(
            step_type.max_concurrent,
            step_type.max_per_second,
            step_type.max_concurrent_per_key,
            tuple(step_type.limits),
        )

    @property
    def limited(self) -> bool:
        return self != TypeLimits()


class Holding(NamedTuple):
    """What a gate says on every call: its step type and the type's limits, the named ones as
    its host's options configure them, what it holds per concurrency key (running, or granted
    and not started) and what waits for a permit, per `Want`."""

    step_type: str
    type_limits: TypeLimits
    named: Mapping[str, Limit]
    held: Mapping[Key, int]
    wants: Mapping[Want, int]


class _Rule(NamedTuple):
    max_concurrent: int | None
    per_second: float | None
    bucket: float

    @classmethod
    def of(cls, limit: Limit) -> _Rule:
        return cls(limit.max_concurrent, limit.per_second, limit.bucket)


#: A limit named by a type and configured nowhere: nothing is granted.
_UNKNOWN = _Rule(0, None, 0.0)

#: A waiting step's turn in a type's queue: (holder, want, serial).
Unit = tuple[str, Want, int]


@dataclass
class _Holder:
    step_type: str
    held: dict[Key, int]
    seen: float
    #: Its latest wants, less what was granted or reserved for it since.
    wants: dict[Want, int] = field(default_factory=dict)
    #: Permits chosen for it while another holder asked, handed over on its next ask.
    reserved: Counter[Want] = field(default_factory=Counter)
    #: Per want, the serials of its units queued (or parked) now.
    units: dict[Want, dict[int, None]] = field(default_factory=dict)


class LimitCore:
    """The limiter's rules. `live`: the limits set live, as stored."""

    def __init__(
        self, now: float, restarted: bool = False, live: Mapping[str, Limit] | None = None
    ) -> None:
        self.holders: dict[str, _Holder] = {}
        self.types: dict[str, TypeLimits] = {}
        #: Named limits as the asking hosts' options configure them (the latest said).
        self.configured: dict[str, Limit] = {}
        #: Named limits set live: they beat the configured ones.
        self.live: dict[str, Limit] = dict(live or {})
        #: Per rate limit, (tokens, when last filled).
        self.buckets: dict[LimitId, tuple[float, float]] = {}
        #: Per step type, the turns of its waiting steps; per (type, key) at its per-key limit,
        #: the turns passed over until it has room.
        self.queues: dict[str, FairQueue[Unit]] = {}
        self.parked: dict[tuple[str, Key], list[Unit]] = {}
        self.learning_until = now + LEARN_SECONDS if restarted else now
        #: When it started: a bucket fills from then, empty (a restarted limiter does not know
        #: what was spent before).
        self.started = now
        self._rules: dict[str, list[tuple[LimitId, _Rule]]] = {}
        self._serials = itertools.count()
        self._turn = 0

    def limit(self, name: str) -> Limit | None:
        return self.live.get(name) or self.configured.get(name)

    def set_limit(self, name: str, limit: Limit) -> None:
        """Changes a named limit live: the next asks are answered with it."""
        self.live[name] = limit
        self._rules.clear()

    def take(self, holder: str, holding: Holding, now: float) -> tuple[dict[Want, int], float]:
        """Grants permits to a holder: (per want, how many; seconds to wait before asking
        again, 0 when all it wants was granted)."""
        h = self._learn(holder, holding, now)
        if now < self.learning_until:
            self._want(holder, h, holding.wants)
            return {}, min(self.learning_until - now, MAX_WAIT)
        grants: Counter[Want] = Counter()
        wants = dict(holding.wants)
        for want, reserved in h.reserved.items():  # handed over; what it no longer wants is free
            grants[want] = min(reserved, wants.get(want, 0))
            wants[want] = wants.get(want, 0) - grants[want]
            h.held[want[3]] = h.held.get(want[3], 0) + grants[want]
        h.reserved.clear()
        self._want(holder, h, wants)
        self._hand_out(holder, grants, now)
        refused = any(n > 0 for n in h.wants.values())
        return {w: n for w, n in grants.items() if n}, self._wait(h, now) if refused else 0.0

    def report(self, holder: str, holding: Holding, now: float) -> None:
        """What a holder holds and wants now; a holder that holds and wants nothing leaves."""
        h = self._learn(holder, holding, now)
        wants = {w: n - h.reserved[w] for w, n in holding.wants.items()}
        self._want(holder, h, wants)
        if not h.held and not h.units and not h.reserved:
            del self.holders[holder]

    def states(self, now: float) -> list[LimitState]:
        """Every limit of the cluster: held, waiting and the keys that hold or wait most."""
        self._expire(now)
        used = self._used()
        held: Counter[Row] = Counter()
        waiting: Counter[Row] = Counter()
        keys: dict[Row, Counter[tuple[str, str]]] = {}
        for h in self.holders.values():
            counts = [(key, n, "held") for key, n in h.held.items()]
            counts += [(want[3], n, "held") for want, n in h.reserved.items()]
            counts += [(want[3], n, "waiting") for want, n in h.wants.items()]
            for key, n, what in counts:
                for lid, _ in self._rules_of(h.step_type, key):
                    row = _row(lid)
                    if what == "waiting":
                        waiting[row] += n
                    if key is not None:
                        keys.setdefault(row, Counter())[(key, what)] += n
        for lid, n in used.items():
            held[_row(lid)] += n
        rows: set[Row] = {("named", name) for name in {*self.configured, *self.live}}
        for path, spec in self.types.items():
            if spec.max_concurrent is not None or spec.max_per_second is not None:
                rows.add(("type", path))
            if spec.max_concurrent_per_key is not None:
                rows.add(("per-key", path))
        return [
            LimitState(
                name=name,
                kind=kind,
                limit=self._limit_of((kind, name)),
                held=held[(kind, name)],
                waiting=waiting[(kind, name)],
                top_keys=_top(keys.get((kind, name), Counter())),
                live=kind == "named" and name in self.live,
            )
            for kind, name in sorted(rows)
        ]

    # -- the holders ------------------------------------------------------------------------

    def _learn(self, holder: str, holding: Holding, now: float) -> _Holder:
        self._expire(now)
        if self.types.get(holding.step_type) != holding.type_limits:
            self.types[holding.step_type] = holding.type_limits
            self._rules.clear()
        for name, limit in holding.named.items():
            if self.configured.get(name) != limit:
                self.configured[name] = limit
                self._rules.clear()
        h = self.holders.get(holder)
        if h is None:
            h = self.holders[holder] = _Holder(holding.step_type, {}, now)
        h.held = {key: n for key, n in holding.held.items() if n > 0}
        h.seen = now
        return h

    def _expire(self, now: float) -> None:
        for holder, h in list(self.holders.items()):
            if now - h.seen > HOLDER_SECONDS:
                self._want(holder, h, {})
                del self.holders[holder]
            elif now - h.seen > RESERVE_SECONDS and (h.units or h.reserved):
                h.reserved.clear()
                self._want(holder, h, {})

    def _want(self, holder: str, h: _Holder, wants: Mapping[Want, int]) -> None:
        """Sets a holder's wants, and its units queued to match: at most `WINDOW` a want."""
        h.wants = {want: n for want, n in wants.items() if n > 0}
        drop: set[int] = set()
        for want, units in list(h.units.items()):
            excess = len(units) - min(h.wants.get(want, 0), WINDOW)
            if excess > 0:
                for serial in list(reversed(units))[:excess]:  # the latest go first
                    drop.add(serial)
                    del units[serial]
            if not units:
                del h.units[want]
        if drop:
            queue = self.queues[h.step_type]
            queue.remove_if(lambda unit: unit[2] in drop)
            for cls, parked in list(self.parked.items()):
                parked[:] = [unit for unit in parked if unit[2] not in drop]
                if not parked:
                    del self.parked[cls]
        for want, n in h.wants.items():
            for _ in range(min(n, WINDOW) - len(h.units.get(want, ()))):
                self._queue(holder, h, want)

    def _queue(self, holder: str, h: _Holder, want: Want) -> None:
        unit = (holder, want, next(self._serials))
        h.units.setdefault(want, {})[unit[2]] = None
        parked = self.parked.get((h.step_type, want[3]))
        if parked is not None:
            parked.append(unit)
        else:
            self.queues.setdefault(h.step_type, FairQueue()).push(unit, Share(*want[:3]))

    # -- handing permits out ----------------------------------------------------------------

    def _hand_out(self, asking: str, grants: Counter[Want], now: float) -> None:
        used = self._used()
        every = self._every_rule()
        for lid, rule in every:
            if rule.per_second is not None:
                self._fill(lid, rule, now)
        for (path, key), units in list(self.parked.items()):
            if all(self._fits(lid, rule, used, 1) for lid, rule in self._rules_of(path, key)):
                del self.parked[(path, key)]
                for unit in units:
                    self.queues[path].push(unit, Share(*unit[1][:3]))
        demand: Counter[LimitId] = Counter()
        for h in self.holders.values():
            for want, n in h.wants.items():
                for lid, _ in self._rules_of(h.step_type, want[3]):
                    demand[lid] += n
        if all(self._fits(lid, rule, used, demand[lid]) for lid, rule in every if demand[lid]):
            # Every wait fits: no order to keep.
            for holder, h in self.holders.items():
                for want, n in list(h.wants.items()):
                    self._give(holder, h, want, n, asking, grants)
                    for lid, rule in self._rules_of(h.step_type, want[3]):
                        self._spend(lid, rule, n)
                self._want(holder, h, {})
            return
        # The types' queues by their next step's priority; types of one priority take turns.
        queues = [(path, queue) for path, queue in sorted(self.queues.items()) if len(queue)]
        self._turn = (self._turn + 1) % max(1, len(queues))
        queues = queues[self._turn :] + queues[: self._turn]
        queues.sort(key=lambda pq: _priority(pq[1]))
        for path, queue in queues:
            while (head := queue.peek()) is not None:
                holder, want, serial = head
                rules = self._rules_of(path, want[3])
                full = [lid for lid, rule in rules if not self._fits(lid, rule, used, 1)]
                if full and all(lid[0] == "key" for lid in full):
                    # Its own key is at its limit: the steps of other keys go past it.
                    self.parked[(path, want[3])] = queue.remove_if(_of_key(want[3]))
                    continue
                if full:
                    break  # a limit every step of the type needs is full: the rest waits
                queue.pop()
                h = self.holders[holder]
                del h.units[want][serial]
                if not h.units[want]:
                    del h.units[want]
                self._give(holder, h, want, 1, asking, grants)
                for lid, rule in rules:
                    used[lid] += 1
                    self._spend(lid, rule, 1)
                if h.wants.get(want, 0) > len(h.units.get(want, ())):
                    self._queue(holder, h, want)

    def _give(
        self, holder: str, h: _Holder, want: Want, n: int, asking: str, grants: Counter[Want]
    ) -> None:
        h.wants[want] -= n
        if not h.wants[want]:
            del h.wants[want]
        if holder == asking:
            grants[want] += n
            h.held[want[3]] = h.held.get(want[3], 0) + n
        else:
            h.reserved[want] += n

    def _used(self) -> Counter[LimitId]:
        """Permits held or reserved, per limit."""
        used: Counter[LimitId] = Counter()
        for h in self.holders.values():
            counts = [*h.held.items(), *((want[3], n) for want, n in h.reserved.items())]
            for key, n in counts:
                for lid, _ in self._rules_of(h.step_type, key):
                    used[lid] += n
        return used

    def _fits(self, lid: LimitId, rule: _Rule, used: Counter[LimitId], n: int) -> bool:
        if rule.max_concurrent is not None and used[lid] + n > rule.max_concurrent:
            return False
        return rule.per_second is None or self.buckets.get(lid, (0.0, 0.0))[0] >= n

    def _fill(self, lid: LimitId, rule: _Rule, now: float) -> None:
        tokens, filled = self.buckets.get(lid, (0.0, self.started))
        rate = rule.per_second or 0.0
        self.buckets[lid] = (min(rule.bucket, tokens + (now - filled) * rate), now)

    def _spend(self, lid: LimitId, rule: _Rule, n: int) -> None:
        if rule.per_second is not None:
            tokens, filled = self.buckets[lid]
            self.buckets[lid] = (tokens - n, filled)

    def _wait(self, h: _Holder, now: float) -> float:
        """Seconds a refused holder waits: until its type's emptiest bucket holds a token, at
        most `MAX_WAIT`."""
        wait = POLL_SECONDS
        for lid, rule in self._rules_of(h.step_type, None):
            if rule.per_second is not None:
                tokens = self.buckets.get(lid, (0.0, now))[0]
                wait = max(wait, (1.0 - tokens) / rule.per_second)
        return min(wait, MAX_WAIT)

    # -- the limits of a step ---------------------------------------------------------------

    def _rules_of(self, path: str, key: Key) -> list[tuple[LimitId, _Rule]]:
        """The limits a step of the type with that concurrency key takes a permit of."""
        rules = self._rules.get(path)
        spec = self.types.get(path, TypeLimits())
        if rules is None:
            rules = self._rules[path] = []
            if spec.max_concurrent is not None or spec.max_per_second is not None:
                rate = spec.max_per_second
                rules.append(
                    (("type", path), _Rule(spec.max_concurrent, rate, max(1.0, rate or 0)))
                )
            for name in spec.limits:
                limit = self.limit(name)
                rules.append((("named", name), _UNKNOWN if limit is None else _Rule.of(limit)))
        if spec.max_concurrent_per_key is None or key is None:
            return rules
        return [*rules, (("key", path, key), _Rule(spec.max_concurrent_per_key, None, 0.0))]

    def _every_rule(self) -> list[tuple[LimitId, _Rule]]:
        """The limits of every type, and of every key held, reserved or wanted."""
        found: dict[LimitId, _Rule] = {}
        for path in self.types:
            found.update(self._rules_of(path, None))
        for h in self.holders.values():
            keys = {*h.held, *(want[3] for want in (*h.wants, *h.reserved))}
            for key in keys - {None}:
                found.update(self._rules_of(h.step_type, key))
        return list(found.items())

    def _limit_of(self, row: Row) -> Limit:
        kind, name = row
        if kind == "named":
            return self.limit(name) or Limit(max_concurrent=0)
        spec = self.types[name]
        if kind == "type":
            return Limit(max_concurrent=spec.max_concurrent, rate=spec.max_per_second)
        return Limit(max_concurrent=spec.max_concurrent_per_key)


def _row(lid: LimitId) -> Row:
    """The `LimitState` a limit is counted in: a per-key limit's keys count in their type's."""
    if lid[0] == "key":
        return "per-key", lid[1]
    return ("named" if lid[0] == "named" else "type"), lid[1]


def _of_key(key: Key) -> Callable[[Unit], bool]:
    return lambda unit: unit[1][3] == key


def _priority(queue: FairQueue[Unit]) -> int:
    unit = queue.peek()
    return unit[1][0] if unit is not None else 0


def _top(counts: Counter[tuple[str, str]]) -> tuple[LimitKey, ...]:
    keys = {key for key, _ in counts}
    loads = [
        LimitKey(key=k, held=counts[(k, "held")], waiting=counts[(k, "waiting")]) for k in keys
    ]
    loads.sort(key=lambda load: (-(load.held + load.waiting), load.key))
    return tuple(loads[:TOP_KEYS])
