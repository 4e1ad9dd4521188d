"""Limits across the cluster (no Ray): the limiter's rules (`LimitCore`: permits per holder and
key, every limit of a step granted at once, token buckets, the order in which short permits go,
reservations, a restarted limiter that learns before it grants, limits set live), and a host's
`Gate` asking a real `LimitCore` for permits and reporting what it holds."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import pytest

from choreography_ray.core import limits
from choreography_ray.core.gate import Gate
from choreography_ray.core.limits import (
    HOLDER_SECONDS,
    LEARN_SECONDS,
    MAX_WAIT,
    POLL_SECONDS,
    RESERVE_SECONDS,
    Holding,
    Key,
    LimitCore,
    TypeLimits,
    Want,
)
from choreography_ray.limit import Limit, LimitKey
from tests.unit.core.harness import eventually

pytestmark = pytest.mark.timeout(10)

#: Seconds a scenario may take before it fails.
SCENARIO_TIMEOUT = 8.0
#: Seconds within which a change a gate reports "in a moment" reaches the limiter.
MOMENT = 1.5  # under the 2 s heartbeat: a report that waited for it would be too late
#: A heartbeat short enough for a test to wait out.
SHORT_HEARTBEAT = 0.1

CONCURRENT_3 = TypeLimits(max_concurrent=3)
#: Steps of priority 3, fairness key "", weight 1, no concurrency key.
PLAIN: Want = (3, "", 1.0, None)


def want(key: Key = None, priority: int = 3, fairness: str = "", weight: float = 1.0) -> Want:
    return (priority, fairness, weight, key)


def holding(
    wants: dict[Want, int] | None = None,
    held: dict[Key, int] | None = None,
    spec: TypeLimits = CONCURRENT_3,
    path: str = "T",
    named: dict[str, Limit] | None = None,
) -> Holding:
    return Holding(path, spec, named or {}, held or {}, wants or {})


def take(
    core: LimitCore, holder: str, n: int, held: int, now: float, **kw: Any
) -> tuple[int, float]:
    """Asks for `n` plain permits holding `held`: (granted, wait)."""
    granted, wait = core.take(holder, holding({PLAIN: n}, {None: held}, **kw), now)
    return sum(granted.values()), wait


def held(core: LimitCore, holder: str) -> int:
    """What the limiter counts for `holder` (held and reserved)."""
    h = core.holders.get(holder)
    return 0 if h is None else sum(h.held.values()) + sum(h.reserved.values())


def leave(core: LimitCore, holder: str, now: float, still: int = 0, **kw: Any) -> None:
    """The holder holds `still` and wants nothing."""
    core.report(holder, holding({}, {None: still}, **kw), now)


# LimitCore: concurrency


def test_limit_core__grants_up_to_max_concurrent_and_what_a_holder_gives_back() -> None:
    core = LimitCore(0.0)

    assert take(core, "a", 5, 0, 0.0) == (3, POLL_SECONDS)
    assert take(core, "b", 1, 0, 0.1) == (0, POLL_SECONDS)

    leave(core, "a", 0.2, still=1)
    assert take(core, "b", 2, 0, 0.3) == (2, 0.0)
    assert (held(core, "a"), held(core, "b")) == (1, 2)


def test_limit_core__a_limit_never_reached_grants_all_wanted_in_one_answer() -> None:
    core = LimitCore(0.0)
    generous = TypeLimits(max_concurrent=10_000)

    assert take(core, "a", 4096, 0, 0.0, spec=generous) == (4096, 0.0)
    assert take(core, "b", 4096, 0, 0.0, spec=generous) == (4096, 0.0)
    assert core.queues["T"].peek() is None


def test_limit_core__a_holder_that_holds_fewer_than_counted_corrects_the_count() -> None:
    """A reply lost on its way: the holder never got the 3 permits and says it holds none."""
    core = LimitCore(0.0)
    assert take(core, "a", 3, 0, 0.0) == (3, 0.0)

    assert take(core, "a", 3, 0, 0.1) == (3, 0.0)
    assert held(core, "a") == 3


def test_limit_core__a_holder_that_holds_more_than_counted_corrects_the_count() -> None:
    """A duplicate call: the holder holds 2, not the 1 the limiter's last reply left it."""
    core = LimitCore(0.0)
    leave(core, "a", 0.0, still=1)

    assert take(core, "b", 3, 0, 0.1) == (2, POLL_SECONDS)
    leave(core, "b", 0.2)
    assert take(core, "a", 2, 2, 0.3) == (1, POLL_SECONDS)
    assert held(core, "a") == 3


def test_limit_core__a_silent_holder_loses_its_permits_to_the_others() -> None:
    core = LimitCore(0.0)
    assert take(core, "a", 3, 0, 0.0) == (3, 0.0)
    assert take(core, "b", 3, 0, HOLDER_SECONDS) == (0, POLL_SECONDS)

    assert take(core, "b", 3, 0, HOLDER_SECONDS + 0.01) == (3, 0.0)
    assert "a" not in core.holders


def test_limit_core__a_holder_that_reports_keeps_its_permits() -> None:
    core = LimitCore(0.0)
    assert take(core, "a", 3, 0, 0.0) == (3, 0.0)
    leave(core, "a", HOLDER_SECONDS - 1, still=3)  # its heartbeat

    assert take(core, "b", 3, 0, HOLDER_SECONDS + 1) == (0, POLL_SECONDS)
    assert held(core, "a") == 3


def test_limit_core__a_report_of_none_removes_the_holder() -> None:
    core = LimitCore(0.0)
    take(core, "a", 2, 0, 0.0)

    leave(core, "a", 0.1)
    assert "a" not in core.holders
    assert take(core, "b", 3, 0, 0.2) == (3, 0.0)


# LimitCore: rates


def test_limit_core__max_per_second_grants_a_bucket_that_fills_in_one_second() -> None:
    rate = TypeLimits(max_per_second=10)
    core = LimitCore(0.0)

    granted, wait = take(core, "a", 1, 0, 0.0, spec=rate)
    assert granted == 0 and wait == pytest.approx(0.1)

    granted, wait = take(core, "a", 25, 0, 1.0, spec=rate)
    assert granted == 10 and wait == pytest.approx(0.1)
    leave(core, "a", 1.0, spec=rate)
    granted, wait = take(core, "b", 1, 0, 1.0, spec=rate)  # one bucket for every holder
    assert granted == 0 and wait == pytest.approx(0.1)

    granted, wait = take(core, "b", 5, 0, 1.25, spec=rate)
    assert granted == 2 and wait == pytest.approx(0.05)  # half a token left

    leave(core, "b", 1.25, spec=rate)
    granted, wait = take(core, "b", 25, 2, 60.0, spec=rate)  # a long pause fills it no fuller
    assert granted == 10 and wait == pytest.approx(0.1)


def test_limit_core__a_rate_below_one_per_second_grants_one_start_at_a_time() -> None:
    rate = TypeLimits(max_per_second=0.5)
    core = LimitCore(0.0)

    granted, wait = take(core, "a", 3, 0, 1.0, spec=rate)
    assert granted == 0 and wait == pytest.approx(1.0)
    granted, wait = take(core, "a", 3, 0, 2.0, spec=rate)
    assert granted == 1 and wait == MAX_WAIT  # 2 s to the next token: it asks again before
    granted, wait = take(core, "a", 2, 1, 3.5, spec=rate)
    assert granted == 0 and wait == pytest.approx(0.5)

    granted, wait = take(core, "a", 2, 1, 60.0, spec=rate)
    assert granted == 1 and wait == MAX_WAIT


def test_limit_core__a_named_rate_over_a_minute_fills_its_burst_and_no_more() -> None:
    crm = {"crm": Limit(rate=600, per=timedelta(minutes=1), burst=50)}
    spec = TypeLimits(limits=("crm",))
    core = LimitCore(0.0)

    assert take(core, "a", 100, 0, 0.0, spec=spec, named=crm)[0] == 0
    granted, wait = take(core, "a", 100, 0, 2.0, spec=spec, named=crm)  # 10 a second
    assert granted == 20 and wait == pytest.approx(0.1)
    granted, _ = take(core, "a", 100, 20, 60.0, spec=spec, named=crm)
    assert granted == 50  # the burst, however long the pause


def test_limit_core__a_rate_without_burst_holds_one_pers_worth_at_least_one() -> None:
    assert Limit(rate=600, per=60).bucket == 600
    assert Limit(rate=0.5).bucket == 1
    assert Limit(rate=10, burst=3).bucket == 3


@pytest.mark.parametrize(
    ("both", "at", "expected"),
    [
        (TypeLimits(2, 10), 1.0, (2, POLL_SECONDS)),  # 10 tokens, room for 2
        (TypeLimits(8, 10), 0.5, (5, 0.1)),  # room for 8, 5 tokens
        (TypeLimits(3, 10), 0.2, (2, 0.1)),  # room for 3, 2 tokens
    ],
)
def test_limit_core__with_both_limits_the_smaller_wins(
    both: TypeLimits, at: float, expected: tuple[int, float]
) -> None:
    core = LimitCore(0.0)

    granted, wait = take(core, "a", 10, 0, at, spec=both)
    assert granted == expected[0] and wait == pytest.approx(expected[1])
    assert held(core, "a") == granted


def test_limit_core__with_both_limits_a_refusal_spends_no_token() -> None:
    both = TypeLimits(1, 10)
    core = LimitCore(0.0)
    assert take(core, "a", 1, 0, 1.0, spec=both) == (1, 0.0)

    assert take(core, "b", 1, 0, 1.0, spec=both) == (0, POLL_SECONDS)
    leave(core, "a", 1.0, spec=both)
    leave(core, "b", 1.0, spec=both)
    assert take(core, "b", 5, 0, 1.0, spec=both) == (1, POLL_SECONDS)
    assert core.buckets[("type", "T")][0] == pytest.approx(8)


# LimitCore: per key, named limits, all at once


PER_KEY_2 = TypeLimits(max_concurrent_per_key=2)


def test_limit_core__a_key_at_its_limit_holds_up_no_other_key() -> None:
    core = LimitCore(0.0)
    a = {want("x"): 5, want("y"): 1}

    granted, _ = core.take("a", holding(a, spec=PER_KEY_2), 0.0)
    assert granted == {want("x"): 2, want("y"): 1}
    granted, wait = core.take("b", holding({want("x"): 3, want("z"): 4}, spec=PER_KEY_2), 0.1)
    assert granted == {want("z"): 2} and wait == POLL_SECONDS

    # a's x ends: the permit goes to a's x (it waited first), reserved while b asks.
    core.report("a", holding({want("x"): 3}, {"x": 1, "y": 1}, spec=PER_KEY_2), 0.2)
    granted, _ = core.take("b", holding({want("x"): 3, want("z"): 2}, {"z": 2}, PER_KEY_2), 0.3)
    assert granted == {}
    assert core.take("a", holding({want("x"): 3}, {"x": 1, "y": 1}, spec=PER_KEY_2), 0.4) == (
        {want("x"): 1},
        POLL_SECONDS,
    )


def test_limit_core__a_named_limit_holds_over_every_type_that_names_it() -> None:
    crm = {"crm": Limit(max_concurrent=3)}
    calls = TypeLimits(limits=("crm",))
    core = LimitCore(0.0)

    assert take(core, "a", 2, 0, 0.0, spec=calls, path="Call", named=crm) == (2, 0.0)
    assert take(core, "b", 2, 0, 0.1, spec=calls, path="Sync", named=crm) == (1, POLL_SECONDS)
    assert take(core, "c", 1, 0, 0.2, spec=TypeLimits(max_concurrent=5)) == (1, 0.0)
    states = {state.name: state for state in core.states(0.3)}
    assert (states["crm"].kind, states["crm"].held, states["crm"].waiting) == ("named", 3, 1)


def test_limit_core__a_step_gets_every_permit_it_needs_at_once_or_none() -> None:
    """A step of a type with its own limit and a named one: while the named one is full, its
    type's permits stay free for nobody to hold in vain."""
    crm = {"crm": Limit(max_concurrent=1)}
    both = TypeLimits(max_concurrent=5, limits=("crm",))
    core = LimitCore(0.0)
    assert take(core, "other", 1, 0, 0.0, spec=TypeLimits(limits=("crm",)), path="O", named=crm)

    assert take(core, "a", 3, 0, 0.1, spec=both, named=crm) == (0, POLL_SECONDS)
    states = {(s.kind, s.name): s for s in core.states(0.2)}
    assert (states[("type", "T")].held, states[("type", "T")].waiting) == (0, 3)
    assert states[("named", "crm")].held == 1


def test_limit_core__a_type_at_its_limit_holds_up_no_other_type() -> None:
    core = LimitCore(0.0)
    assert take(core, "a", 3, 0, 0.0) == (3, 0.0)
    assert take(core, "a", 5, 3, 0.1) == (0, POLL_SECONDS)  # T is full, 5 wait

    other = TypeLimits(max_concurrent=4)
    assert take(core, "b", 6, 0, 0.2, spec=other, path="U") == (4, POLL_SECONDS)
    assert core.queues["T"].peek() is not None and not core.parked


def test_limit_core__a_key_set_aside_and_no_longer_wanted_is_forgotten() -> None:
    core = LimitCore(0.0)
    core.take("a", holding({want("x"): 3}, spec=PER_KEY_2), 0.0)
    core.take("a", holding({want("x"): 1, want("y"): 1}, {"x": 2}, PER_KEY_2), 0.1)
    assert list(core.parked) == [("T", "x")]

    core.report("a", holding({}, {"x": 2, "y": 1}, spec=PER_KEY_2), 0.2)
    assert core.parked == {} and core.queues["T"].peek() is None


def test_limit_core__a_limit_no_options_configure_grants_nothing() -> None:
    core = LimitCore(0.0)

    assert take(core, "a", 3, 0, 0.0, spec=TypeLimits(limits=("nowhere",))) == (0, POLL_SECONDS)


def test_limit_core__a_limit_set_live_beats_the_options_and_a_lower_one_waits_below_it() -> None:
    crm = {"crm": Limit(max_concurrent=10)}
    spec = TypeLimits(limits=("crm",))
    core = LimitCore(0.0)
    assert take(core, "a", 6, 0, 0.0, spec=spec, named=crm) == (6, 0.0)

    core.set_limit("crm", Limit(max_concurrent=2))
    assert take(core, "b", 1, 0, 0.1, spec=spec, named=crm) == (0, POLL_SECONDS)
    leave(core, "a", 0.2, still=2, spec=spec, named=crm)
    assert take(core, "b", 1, 0, 0.3, spec=spec, named=crm) == (0, POLL_SECONDS)
    leave(core, "a", 0.4, still=1, spec=spec, named=crm)
    assert take(core, "b", 5, 0, 0.5, spec=spec, named=crm) == (1, POLL_SECONDS)
    (state,) = core.states(0.6)
    assert (state.limit, state.live, state.held) == (Limit(max_concurrent=2), True, 2)


def test_limit_core__a_restarted_limiter_keeps_the_limits_set_live() -> None:
    core = LimitCore(0.0, restarted=True, live={"crm": Limit(max_concurrent=1)})
    crm = {"crm": Limit(max_concurrent=10)}
    spec = TypeLimits(limits=("crm",))

    assert take(core, "a", 5, 0, LEARN_SECONDS, spec=spec, named=crm) == (1, POLL_SECONDS)


# LimitCore: the order of short permits


def test_limit_core__short_permits_go_to_the_highest_priority_over_every_holder() -> None:
    core = LimitCore(0.0)
    low, high = want(priority=5), want(priority=1)
    assert take(core, "busy", 3, 0, 0.0) == (3, 0.0)
    core.take("a", holding({low: 2}), 0.1)
    core.take("b", holding({high: 2}), 0.2)

    leave(core, "busy", 0.3, still=1)  # two end
    granted, _ = core.take("a", holding({low: 2}), 0.4)

    assert granted == {}  # b's, reserved for it
    assert core.take("b", holding({high: 2}), 0.5) == ({high: 2}, 0.0)


def test_limit_core__short_permits_go_to_fairness_keys_by_weight() -> None:
    named = {"crm": Limit(max_concurrent=4)}
    spec = TypeLimits(limits=("crm",))
    wants = {"A": want(fairness="a", weight=3.0), "B": want(fairness="b", weight=1.0)}
    running = {"A": 0, "B": 0}
    core = LimitCore(0.0)
    got: Counter[str] = Counter()
    for tick in range(400):
        now = tick * 0.001
        if sum(running.values()) >= 4:  # a step ends, the hosts in turn
            ending = "A" if tick % 2 else "B"
            if not running[ending]:
                ending = "B" if ending == "A" else "A"
            running[ending] -= 1
        for name, w in wants.items():
            answer = core.take(
                name, holding({w: 100}, {None: running[name]}, spec, named=named), now
            )
            running[name] += sum(answer[0].values())
            got[name] += sum(answer[0].values())

    assert got["A"] / got["B"] == pytest.approx(3.0, rel=0.1)


def test_limit_core__a_reserved_permit_comes_back_when_its_holder_does_not_ask() -> None:
    core = LimitCore(0.0)
    assert take(core, "busy", 3, 0, 0.0) == (3, 0.0)
    assert take(core, "a", 1, 0, 0.1) == (0, POLL_SECONDS)  # a waits first
    leave(core, "busy", 0.2, still=2)

    assert take(core, "b", 1, 0, 0.3) == (0, POLL_SECONDS)  # a's turn: reserved for a
    assert core.holders["a"].reserved == {PLAIN: 1}
    assert take(core, "b", 1, 0, 0.1 + RESERVE_SECONDS + 0.01) == (1, 0.0)  # a went silent
    assert "a" not in core.holders or not core.holders["a"].reserved


def test_limit_core__a_holder_gets_its_reserved_permits_and_those_it_no_longer_wants_go() -> None:
    core = LimitCore(0.0)
    assert take(core, "busy", 3, 0, 0.0) == (3, 0.0)
    assert take(core, "a", 2, 0, 0.1) == (0, POLL_SECONDS)
    leave(core, "busy", 0.2, still=1)
    take(core, "b", 1, 0, 0.3)  # two go to a, reserved

    assert take(core, "a", 1, 0, 0.4) == (1, 0.0)  # one of its steps went meanwhile
    assert take(core, "b", 1, 0, 0.5) == (1, 0.0)


# LimitCore: a restart, and what it tells


def test_limit_core__a_restarted_limiter_learns_the_holders_before_it_grants() -> None:
    core = LimitCore(0.0, restarted=True)

    assert take(core, "a", 1, 3, 0.0) == (0, MAX_WAIT)
    leave(core, "c", 1.5)
    assert take(core, "a", 1, 3, 2.5) == (0, MAX_WAIT)  # asks again: its wants stay
    granted, wait = take(core, "b", 2, 0, LEARN_SECONDS - 1.0)
    assert granted == 0 and wait == pytest.approx(1.0)
    assert held(core, "a") == 3

    assert take(core, "b", 2, 0, LEARN_SECONDS) == (0, POLL_SECONDS)
    leave(core, "a", LEARN_SECONDS + 0.1, still=1)
    assert take(core, "b", 2, 0, LEARN_SECONDS + 0.2) == (2, 0.0)


def test_limit_core__a_limiter_that_was_not_restarted_grants_at_once() -> None:
    core = LimitCore(100.0)

    assert take(core, "a", 3, 0, 100.0) == (3, 0.0)


def test_limit_core__states_tell_held_waiting_and_the_top_keys_never_more_than_ten() -> None:
    core = LimitCore(0.0)
    wants = {want(f"k{n:02}"): n for n in range(12)}
    core.take("a", holding(wants, spec=PER_KEY_2), 0.0)

    (state,) = core.states(0.1)
    assert (state.name, state.kind, state.limit) == ("T", "per-key", Limit(max_concurrent=2))
    assert state.held == 1 + 2 * 10 and state.waiting == sum(range(12)) - state.held
    assert len(state.top_keys) == 10
    assert state.top_keys[0] == LimitKey(key="k11", held=2, waiting=9)


# Gate


class Limiter:
    """A `LimitCore` on the monotonic clock, as `runtime/limits.py` keeps it, of one type."""

    def __init__(self, spec: TypeLimits, restarted: bool = False) -> None:
        self.spec = spec
        self.core = LimitCore(time.monotonic(), restarted)

    def held(self, holder: str | None = None) -> int:
        if holder is None:
            return sum(held(self.core, h) for h in self.core.holders)
        return held(self.core, holder)


class Host:
    """A host's gate over a limiter, calling it directly: the asks and reports it made, how
    many times it was woken (and `on_wake` then), and the tasks it spawned. `failing` asks
    raise, as while the limiter restarts, and so do `failing_reports` reports. While
    `replies` is an Event not set, the reply to an ask the limiter answered waits for it (on
    its way back)."""

    def __init__(self, limiter: Limiter, holder: str) -> None:
        self.limiter = limiter
        self.holder = holder
        self.asks: list[tuple[int, int]] = []
        self.reports: list[int] = []
        self.failing = 0
        self.failing_reports = 0
        self.replies: asyncio.Event | None = None
        self.wakes = 0
        self.on_wake: Callable[[], None] = lambda: None
        self.tasks: list[asyncio.Task[None]] = []
        self.gate = Gate(holder, self.ask, self.report, self.wake, self.spawn)

    def holding(self, held: dict[Key, int], wants: dict[Want, int]) -> Holding:
        return Holding("T", self.limiter.spec, {}, held, wants)

    async def ask(
        self, wants: dict[Want, int], held: dict[Key, int]
    ) -> tuple[dict[Want, int], float]:
        self.asks.append((sum(wants.values()), sum(held.values())))
        if self.failing:
            self.failing -= 1
            raise ConnectionError("the limiter is restarting")
        answer = self.limiter.core.take(self.holder, self.holding(held, wants), time.monotonic())
        if self.replies is not None:
            await self.replies.wait()
        return answer

    async def report(self, held: dict[Key, int], wants: dict[Want, int]) -> None:
        self.reports.append(sum(held.values()))
        if self.failing_reports:
            self.failing_reports -= 1
            raise ConnectionError("the limiter is restarting")
        self.limiter.core.report(self.holder, self.holding(held, wants), time.monotonic())

    def wake(self) -> None:
        self.wakes += 1
        self.on_wake()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(task)
        return task

    @property
    def pending(self) -> list[str]:
        return [task.get_name() for task in self.tasks if not task.done()]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def start(gate: Gate, most: int) -> int:
    """A host's pump that starts up to `most` plain steps with what it was given."""
    return gate.take(PLAIN, most)


def starting(gate: Gate, most: int) -> Callable[[], None]:
    """A host's pump that starts up to `most` steps with what it was given, then wants none."""

    def pump() -> None:
        start(gate, most)
        gate.want({})

    return pump


def run(scenario: Callable[[], Coroutine[Any, Any, None]], *hosts: Host) -> None:
    """Runs `scenario` on a loop of its own; what the hosts' gates spawned is cancelled before
    the loop ends."""

    async def main() -> None:
        try:
            await asyncio.wait_for(scenario(), SCENARIO_TIMEOUT)
        finally:
            for host in hosts:
                await host.close()

    asyncio.run(main())


class Worker:
    """A lane over a gate: `steps` waiting, started as the gate allows (its pump is the gate's
    `wake`, as `runtime/lanes.py` does), each running `seconds` then giving its permit back;
    `running` is shared by the workers of one limiter, `peak` the most it ever was."""

    def __init__(self, host: Host, steps: int, seconds: float, running: list[int]) -> None:
        self.host = host
        self.gate = host.gate
        self.waiting = steps
        self.seconds = seconds
        self.running = running
        self.ended = 0
        self.peak = 0
        self.steps: list[asyncio.Task[None]] = []
        host.on_wake = self.pump

    def pump(self) -> None:
        for _ in range(start(self.gate, self.waiting)):
            self.waiting -= 1
            self.running[0] += 1
            self.peak = max(self.peak, self.running[0])
            self.steps.append(asyncio.get_running_loop().create_task(self._step()))
        self.gate.want({PLAIN: self.waiting})

    async def _step(self) -> None:
        await asyncio.sleep(self.seconds)
        self.running[0] -= 1
        self.ended += 1
        self.gate.done(None)
        self.pump()


def test_gate__want_asks_and_the_permits_granted_wake_the_host() -> None:
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    gate = host.gate

    async def scenario() -> None:
        gate.want({PLAIN: 5})
        assert host.pending == ["limit-ask a"]
        await eventually(lambda: host.wakes, within=MOMENT, what="the gate woken")
        assert (gate.granted[PLAIN], limiter.held("a")) == (3, 3)

        assert start(gate, 5) == 3
        gate.want({PLAIN: 2})
        assert (gate.running[None], gate.granted[PLAIN], gate.held) == (3, 0, {None: 3})
        await eventually(lambda: host.reports, within=MOMENT, what="a report")
        assert host.reports == [3] and limiter.held("a") == 3
        await eventually(lambda: len(host.asks) >= 3, within=MOMENT, what="asks again")
        assert host.asks[1:3] == [(2, 3), (2, 3)]  # refused: it asks again
        assert host.wakes == 1

        gate.idle()  # nothing waits any more: it stops asking
        await eventually(lambda: "limit-ask a" not in host.pending, within=MOMENT)
        assert gate.held == {None: 3} and limiter.held("a") == 3

    run(scenario, host)


def test_gate__asks_for_all_that_waits_in_one_call_and_again_at_once_when_all_was_granted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limiter is no bottleneck below its limit: 3,000 steps, 1,000 of them arriving each
    time the lane pumps, take three asks and no wait between them (a wait of a refusal would
    be 10 s here)."""
    monkeypatch.setattr(limits, "POLL_SECONDS", 10.0)
    limiter = Limiter(TypeLimits(max_concurrent=1_000_000))
    host = Host(limiter, "a")
    gate = host.gate
    arriving = [2000]
    started = [0]

    def pump() -> None:
        started[0] += start(gate, 1000)
        more = min(1000, arriving[0])
        arriving[0] -= more
        gate.want({PLAIN: more})

    host.on_wake = pump

    async def scenario() -> None:
        gate.want({PLAIN: 1000})
        await eventually(lambda: started[0] == 3000, within=MOMENT, what="3,000 started")

        assert [want for want, _ in host.asks] == [1000, 1000, 1000]

    run(scenario, host)


def test_gate__permits_granted_for_steps_that_went_meanwhile_go_back() -> None:
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    host.on_wake = lambda: host.gate.want({})  # its steps were stopped meanwhile

    async def scenario() -> None:
        host.gate.want({PLAIN: 2})
        await eventually(lambda: host.wakes, within=MOMENT, what="granted")
        assert not host.gate.granted
        await eventually(lambda: limiter.held() == 0, within=MOMENT, what="given back")

    run(scenario, host)


def test_gate__two_hosts_never_run_more_than_max_concurrent_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(TypeLimits(max_concurrent=2))
    a, b = Host(limiter, "a"), Host(limiter, "b")
    running = [0]
    workers = [Worker(a, 8, 0.01, running), Worker(b, 8, 0.015, running)]
    most_counted = [0]

    async def watch() -> None:
        while True:
            most_counted[0] = max(most_counted[0], limiter.held())
            await asyncio.sleep(0.002)

    async def scenario() -> None:
        watching = asyncio.create_task(watch())
        for worker in workers:
            worker.pump()
        await eventually(
            lambda: sum(w.ended for w in workers) == 16, within=4.0, what="16 steps ended"
        )
        watching.cancel()
        await asyncio.gather(*(step for w in workers for step in w.steps))

        assert max(w.peak for w in workers) == 2
        assert most_counted[0] == 2
        assert all(w.host.wakes for w in workers)
        await eventually(lambda: not a.pending and not b.pending, within=MOMENT)
        assert limiter.core.holders == {}

    run(scenario, a, b)


@pytest.mark.parametrize(
    "after_a_heartbeat",
    [False, True],
    ids=["right-after-the-grant", "after-a-heartbeat"],
)
def test_gate__done_reaches_the_limiter_in_a_moment_and_the_other_host_gets_the_permit(
    after_a_heartbeat: bool,
) -> None:
    limiter = Limiter(TypeLimits(max_concurrent=2))
    a, b = Host(limiter, "a"), Host(limiter, "b")

    async def scenario() -> None:
        a.on_wake = starting(a.gate, 2)
        a.gate.want({PLAIN: 2})
        await eventually(lambda: a.gate.running[None] == 2, within=MOMENT, what="a runs 2")
        if after_a_heartbeat:
            await eventually(lambda: a.reports, within=MOMENT, what="a's first report")
        b.gate.want({PLAIN: 1})

        a.gate.done(None)
        assert a.gate.held == {None: 1}
        await eventually(lambda: limiter.held("a") == 1, within=MOMENT, what="a's done reported")
        await eventually(lambda: b.wakes, within=MOMENT, what="b granted")
        assert start(b.gate, 1) == 1
        assert limiter.held() == 2

    run(scenario, a, b)


@pytest.mark.parametrize(
    "after_a_heartbeat",
    [False, True],
    ids=["right-after-the-grant", "after-a-heartbeat"],
)
def test_gate__idle_gives_back_the_permits_granted_and_not_used(after_a_heartbeat: bool) -> None:
    limiter = Limiter(CONCURRENT_3)
    a, b = Host(limiter, "a"), Host(limiter, "b")

    async def scenario() -> None:
        a.gate.want({PLAIN: 3})
        await eventually(lambda: a.gate.granted[PLAIN] == 3, within=MOMENT, what="a granted 3")
        if after_a_heartbeat:
            await eventually(lambda: a.reports, within=MOMENT, what="a's first report")
        assert limiter.held("a") == 3

        a.gate.idle()
        assert (a.gate.granted, a.gate.held, a.gate.wanted) == (Counter(), {}, {})
        await eventually(lambda: limiter.held() == 0, within=MOMENT, what="a's permits back")
        assert "a" not in limiter.core.holders
        await eventually(lambda: not a.pending, within=MOMENT, what="a's tasks ended")
        b.gate.want({PLAIN: 3})
        await eventually(lambda: b.gate.granted[PLAIN] == 3, within=MOMENT, what="b granted 3")

    run(scenario, a, b)


def test_gate__an_ask_that_raises_is_asked_again_until_the_limiter_answers() -> None:
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    host.failing = 1

    async def scenario() -> None:
        host.gate.want({PLAIN: 2})
        await eventually(lambda: host.asks, within=MOMENT, what="the first ask")
        assert (host.failing, host.wakes, host.gate.granted[PLAIN]) == (0, 0, 0)

        await eventually(lambda: host.wakes, within=5.0, what="granted once the limiter answers")
        assert host.asks == [(2, 0), (2, 0)]
        assert start(host.gate, 2) == 2
        assert limiter.held("a") == 2

    run(scenario, host)


def test_gate__a_report_that_raises_is_made_at_the_next_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    host.failing_reports = 1

    async def scenario() -> None:
        host.on_wake = starting(host.gate, 2)
        host.gate.want({PLAIN: 2})
        await eventually(lambda: len(host.reports) >= 2, within=1.0, what="a second report")
        assert host.reports[:2] == [2, 2] and host.failing_reports == 0
        assert limiter.held("a") == 2

        host.gate.done(None, 2)
        await eventually(lambda: limiter.held("a") == 0, within=MOMENT, what="done reported")
        await eventually(lambda: not host.pending, within=MOMENT, what="the tasks ended")

    run(scenario, host)


def test_gate__a_report_waits_for_the_grant_on_its_way_so_no_other_host_gets_its_permits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's heartbeat comes due while the limiter has granted A a permit and the reply is on its
    way: a report of what A held before the grant would let the limiter give it to B."""
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(TypeLimits(max_concurrent=2))
    a, b = Host(limiter, "a"), Host(limiter, "b")
    most = {"running": 0, "held": 0}

    def total(attribute: str) -> int:
        return sum(sum(getattr(h.gate, attribute).values()) for h in (a, b))

    async def watch() -> None:
        while True:
            most["running"] = max(most["running"], total("running"))
            most["held"] = max(most["held"], sum(sum(h.gate.held.values()) for h in (a, b)))
            await asyncio.sleep(0.002)

    async def scenario() -> None:
        watching = asyncio.create_task(watch())
        a.on_wake = starting(a.gate, 1)
        b.on_wake = starting(b.gate, 1)
        a.gate.want({PLAIN: 1})
        await eventually(lambda: a.gate.running[None] == 1, within=MOMENT, what="a runs 1")
        await eventually(lambda: a.reports, within=MOMENT, what="a's first report")

        a.replies = asyncio.Event()
        a.gate.want({PLAIN: 1})
        await eventually(lambda: limiter.held("a") == 2, within=MOMENT, what="a granted 1 more")
        await asyncio.sleep(2 * SHORT_HEARTBEAT)  # a's heartbeat comes due
        b.gate.want({PLAIN: 1})
        await eventually(lambda: b.asks, within=MOMENT, what="b asks")
        await asyncio.sleep(2 * POLL_SECONDS)
        b_woken_before_the_reply = b.wakes

        a.replies.set()
        await eventually(lambda: a.gate.running[None] == 2, within=MOMENT, what="a runs 2")
        a.gate.done(None, 2)
        await eventually(lambda: b.gate.running[None] == 1, within=MOMENT, what="b runs one")
        watching.cancel()

        assert most == {"running": 2, "held": 2}
        assert b_woken_before_the_reply == 0
        assert (held(limiter.core, "a"), held(limiter.core, "b")) == (0, 1)

    run(scenario, a, b)


def test_gate__a_report_of_none_that_raises_is_made_again_at_the_next_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")

    async def scenario() -> None:
        host.on_wake = starting(host.gate, 2)
        host.gate.want({PLAIN: 2})
        await eventually(lambda: host.reports, within=MOMENT, what="a report")
        assert limiter.held("a") == 2

        host.failing_reports = 1  # the next report, of none, raises
        host.gate.done(None, 2)
        await eventually(lambda: not host.failing_reports, within=MOMENT, what="the report")
        assert host.reports[-1] == 0 and limiter.held("a") == 2

        await eventually(
            lambda: "a" not in limiter.core.holders,
            within=1.0,
            what="the report of none made again",
        )
        assert host.reports[-2:] == [0, 0] and limiter.held() == 0
        await eventually(lambda: not host.pending, within=MOMENT, what="the tasks ended")
        assert all(task.exception() is None for task in host.tasks)

    run(scenario, host)


def test_gate__its_tasks_end_when_nothing_is_wanted_or_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(TypeLimits(2, 40))
    host = Host(limiter, "a")
    worker = Worker(host, 6, 0.02, [0])

    async def scenario() -> None:
        worker.pump()
        assert host.pending == ["limit-ask a"]
        await eventually(lambda: worker.ended == 6, within=2.0, what="6 steps ended")
        assert worker.peak <= 2 and host.wakes

        await eventually(lambda: not host.pending, within=1.0, what="the gate's tasks ended")
        assert all(task.exception() is None for task in host.tasks)
        assert {task.get_name() for task in host.tasks} == {"limit-ask a", "limit-report a"}
        assert host.reports[-1] == 0 and limiter.core.holders == {}
        assert (host.gate.running, host.gate.granted, host.gate.wanted) == (
            Counter(),
            Counter(),
            {},
        )

    run(scenario, host)
