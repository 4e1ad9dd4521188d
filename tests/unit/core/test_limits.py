"""Limits per step type (no Ray): the limiter's rules (`LimitCore`: permits per holder, a token
bucket of one second's starts, a restarted limiter that learns before it grants), and a host's
`Gate` asking a real `LimitCore` for permits and reporting what it holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from choreography_ray.core import limits
from choreography_ray.core.limits import (
    HOLDER_SECONDS,
    LEARN_SECONDS,
    POLL_SECONDS,
    Gate,
    LimitCore,
    Limits,
)
from tests.unit.core.harness import eventually

pytestmark = pytest.mark.timeout(10)

#: Seconds a scenario may take before it fails.
SCENARIO_TIMEOUT = 8.0
#: Seconds within which a change a gate reports "in a moment" reaches the limiter.
MOMENT = 1.5  # under the 2 s heartbeat: a report that waited for it would be too late
#: A heartbeat short enough for a test to wait out.
SHORT_HEARTBEAT = 0.1

CONCURRENT_3 = Limits(3, None)


def held(core: LimitCore, holder: str) -> int:
    """What the limiter counts for `holder`."""
    return core.holders.get(holder, (0, 0.0))[0]


# LimitCore


def test_limit_core__grants_up_to_max_concurrent_and_what_a_holder_gives_back() -> None:
    core = LimitCore(0.0)

    granted, wait = core.take("a", 5, 0, CONCURRENT_3, 0.0)
    assert granted == 3 and wait > 0
    assert core.take("b", 1, 0, CONCURRENT_3, 0.1) == (0, POLL_SECONDS)

    core.report("a", 1, 0.2)
    assert core.take("b", 2, 0, CONCURRENT_3, 0.3) == (2, 0.0)
    assert (held(core, "a"), held(core, "b"), core.held) == (1, 2, 3)


def test_limit_core__a_holder_that_holds_fewer_than_counted_corrects_the_count() -> None:
    """A reply lost on its way: the holder never got the 3 permits and says it holds none."""
    core = LimitCore(0.0)
    assert core.take("a", 3, 0, CONCURRENT_3, 0.0) == (3, 0.0)

    assert core.take("a", 3, 0, CONCURRENT_3, 0.1) == (3, 0.0)
    assert held(core, "a") == 3


def test_limit_core__a_holder_that_holds_more_than_counted_corrects_the_count() -> None:
    """A duplicate call: the holder holds 2, not the 1 the limiter's last reply left it."""
    core = LimitCore(0.0)
    core.report("a", 1, 0.0)

    assert core.take("b", 3, 0, CONCURRENT_3, 0.1) == (2, POLL_SECONDS)
    core.report("b", 0, 0.2)
    assert core.take("a", 2, 2, CONCURRENT_3, 0.3) == (1, POLL_SECONDS)
    assert held(core, "a") == 3


def test_limit_core__a_silent_holder_loses_its_permits_to_the_others() -> None:
    core = LimitCore(0.0)
    assert core.take("a", 3, 0, CONCURRENT_3, 0.0) == (3, 0.0)
    assert core.take("b", 3, 0, CONCURRENT_3, HOLDER_SECONDS) == (0, POLL_SECONDS)

    assert core.take("b", 3, 0, CONCURRENT_3, HOLDER_SECONDS + 0.01) == (3, 0.0)
    assert "a" not in core.holders and core.held == 3


def test_limit_core__a_holder_that_reports_keeps_its_permits() -> None:
    core = LimitCore(0.0)
    assert core.take("a", 3, 0, CONCURRENT_3, 0.0) == (3, 0.0)
    core.report("a", 3, HOLDER_SECONDS - 1)  # its heartbeat

    assert core.take("b", 3, 0, CONCURRENT_3, HOLDER_SECONDS + 1) == (0, POLL_SECONDS)
    assert held(core, "a") == 3


def test_limit_core__a_report_of_none_removes_the_holder() -> None:
    core = LimitCore(0.0)
    core.take("a", 2, 0, CONCURRENT_3, 0.0)

    core.report("a", 0, 0.1)
    assert "a" not in core.holders and core.held == 0
    assert core.take("b", 3, 0, CONCURRENT_3, 0.2) == (3, 0.0)


def test_limit_core__max_per_second_grants_a_bucket_that_fills_in_one_second() -> None:
    rate = Limits(None, 10)
    core = LimitCore(0.0)

    granted, wait = core.take("a", 1, 0, rate, 0.0)
    assert granted == 0 and wait == pytest.approx(0.1)

    granted, wait = core.take("a", 25, 0, rate, 1.0)
    assert granted == 10 and wait == pytest.approx(0.1)
    granted, wait = core.take("b", 1, 0, rate, 1.0)  # one bucket for every holder
    assert granted == 0 and wait == pytest.approx(0.1)

    granted, wait = core.take("b", 5, 0, rate, 1.25)
    assert granted == 2 and wait == pytest.approx(0.05)  # half a token left

    granted, wait = core.take("b", 25, 2, rate, 60.0)  # a long pause fills it no fuller
    assert granted == 10 and wait == pytest.approx(0.1)


def test_limit_core__a_rate_below_one_per_second_grants_one_start_at_a_time() -> None:
    rate = Limits(None, 0.5)
    core = LimitCore(0.0)

    granted, wait = core.take("a", 3, 0, rate, 1.0)
    assert granted == 0 and wait == pytest.approx(1.0)
    granted, wait = core.take("a", 3, 0, rate, 2.0)
    assert granted == 1 and wait == pytest.approx(2.0)
    granted, wait = core.take("a", 3, 1, rate, 2.0)
    assert granted == 0 and wait == pytest.approx(2.0)

    granted, wait = core.take("a", 3, 1, rate, 60.0)
    assert granted == 1 and wait == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("both", "at", "expected"),
    [
        (Limits(2, 10), 1.0, (2, POLL_SECONDS)),  # 10 tokens, room for 2
        (Limits(8, 10), 0.5, (5, 0.1)),  # room for 8, 5 tokens
        (Limits(3, 10), 0.2, (2, 0.1)),  # room for 3, 2 tokens
    ],
)
def test_limit_core__with_both_limits_the_smaller_wins(
    both: Limits, at: float, expected: tuple[int, float]
) -> None:
    core = LimitCore(0.0)

    granted, wait = core.take("a", 10, 0, both, at)
    assert granted == expected[0] and wait == pytest.approx(expected[1])
    assert held(core, "a") == granted


def test_limit_core__with_both_limits_a_refusal_spends_no_token() -> None:
    both = Limits(1, 10)
    core = LimitCore(0.0)
    assert core.take("a", 1, 0, both, 1.0) == (1, 0.0)

    assert core.take("b", 1, 0, both, 1.0) == (0, POLL_SECONDS)
    core.report("a", 0, 1.0)
    assert core.take("b", 5, 0, both, 1.0) == (1, POLL_SECONDS)
    assert core.tokens == pytest.approx(8)


def test_limit_core__a_restarted_limiter_learns_the_holders_before_it_grants() -> None:
    core = LimitCore(0.0, restarted=True)

    assert core.take("a", 1, 3, CONCURRENT_3, 0.0) == (0, LEARN_SECONDS)
    granted, wait = core.take("b", 2, 0, CONCURRENT_3, 1.0)
    assert granted == 0 and wait == pytest.approx(LEARN_SECONDS - 1.0)
    core.report("c", 0, 1.5)
    assert (held(core, "a"), core.held) == (3, 3)

    assert core.take("b", 2, 0, CONCURRENT_3, LEARN_SECONDS) == (0, POLL_SECONDS)
    core.report("a", 1, LEARN_SECONDS + 0.1)
    assert core.take("b", 2, 0, CONCURRENT_3, LEARN_SECONDS + 0.2) == (2, 0.0)


def test_limit_core__a_limiter_that_was_not_restarted_grants_at_once() -> None:
    core = LimitCore(100.0)

    assert core.take("a", 3, 0, CONCURRENT_3, 100.0) == (3, 0.0)


def test_limit_core__without_limits_grants_all_wanted() -> None:
    core = LimitCore(0.0)

    assert core.take("a", 1000, 0, Limits(None, None), 0.0) == (1000, 0.0)
    assert core.take("b", 5, 0, Limits(None, None), 0.0) == (5, 0.0)
    assert core.held == 1005


# Gate


class Limiter:
    """A `LimitCore` on the monotonic clock, as `runtime/limits.py` keeps it."""

    def __init__(self, limits: Limits, restarted: bool = False) -> None:
        self.limits = limits
        self.core = LimitCore(time.monotonic(), restarted)

    def held(self, holder: str | None = None) -> int:
        return self.core.held if holder is None else held(self.core, holder)


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

    async def ask(self, want: int, held: int) -> tuple[int, float]:
        self.asks.append((want, held))
        if self.failing:
            self.failing -= 1
            raise ConnectionError("the limiter is restarting")
        core, limits = self.limiter.core, self.limiter.limits
        answer = core.take(self.holder, want, held, limits, time.monotonic())
        if self.replies is not None:
            await self.replies.wait()
        return answer

    async def report(self, held: int) -> None:
        self.reports.append(held)
        if self.failing_reports:
            self.failing_reports -= 1
            raise ConnectionError("the limiter is restarting")
        self.limiter.core.report(self.holder, held, time.monotonic())

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


def take(gate: Gate, want: int) -> None:
    """A host's pump that starts what it is given."""
    gate.take(want)


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
        while self.waiting and (take := self.gate.take(self.waiting)):
            for _ in range(take):
                self.waiting -= 1
                self.running[0] += 1
                self.peak = max(self.peak, self.running[0])
                self.steps.append(asyncio.get_running_loop().create_task(self._step()))
        if not self.waiting:
            self.gate.idle()

    async def _step(self) -> None:
        await asyncio.sleep(self.seconds)
        self.running[0] -= 1
        self.ended += 1
        self.gate.done(1)
        self.pump()


def test_gate__take_starts_asking_and_the_permits_granted_wake_the_host() -> None:
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    gate = host.gate

    async def scenario() -> None:
        assert gate.take(5) == 0
        assert host.pending == ["limit-ask a"]
        await eventually(lambda: host.wakes, within=MOMENT, what="the gate woken")
        assert (gate.granted, limiter.held("a")) == (3, 3)

        assert gate.take(5) == 3
        assert (gate.running, gate.granted, gate.held, gate.wanted) == (3, 0, 3, 2)
        await eventually(lambda: host.reports, within=MOMENT, what="a report")
        assert host.reports == [3] and limiter.held("a") == 3
        await eventually(lambda: len(host.asks) >= 3, within=MOMENT, what="asks again")
        assert host.asks[1:3] == [(2, 3), (2, 3)]  # refused: it asks again
        assert (gate.granted, host.wakes) == (0, 1)

        gate.idle()  # nothing waits any more: it stops asking
        await eventually(lambda: "limit-ask a" not in host.pending, within=MOMENT)
        assert (gate.running, gate.granted, gate.wanted) == (3, 0, 0)
        assert gate.held == limiter.held("a") == 3

    run(scenario, host)


def test_gate__a_take_of_fewer_than_granted_keeps_the_rest_granted() -> None:
    limiter = Limiter(Limits(None, None))
    host = Host(limiter, "a")
    gate = host.gate

    async def scenario() -> None:
        assert gate.take(4) == 0
        await eventually(lambda: gate.granted == 4, within=MOMENT, what="4 granted")

        assert gate.take(1) == 1
        assert gate.take(2) == 2
        assert (gate.running, gate.granted, gate.held, gate.wanted) == (3, 1, 4, 0)
        assert limiter.held("a") == 4
        assert len(host.asks) == 1

    run(scenario, host)


def test_gate__two_hosts_never_run_more_than_max_concurrent_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(Limits(2, None))
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
    limiter = Limiter(Limits(2, None))
    a, b = Host(limiter, "a"), Host(limiter, "b")

    async def scenario() -> None:
        a.on_wake = lambda: take(a.gate, 2)
        assert a.gate.take(2) == 0
        await eventually(lambda: a.gate.running == 2, within=MOMENT, what="a runs 2")
        if after_a_heartbeat:
            await eventually(lambda: a.reports, within=MOMENT, what="a's first report")
        assert b.gate.take(1) == 0

        a.gate.done(1)
        assert (a.gate.running, a.gate.held) == (1, 1)
        await eventually(lambda: limiter.held("a") == 1, within=MOMENT, what="a's done reported")
        await eventually(lambda: b.wakes, within=MOMENT, what="b granted")
        assert b.gate.take(1) == 1
        assert limiter.held() == a.gate.held + b.gate.held == 2

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
        assert a.gate.take(3) == 0
        await eventually(lambda: a.gate.granted == 3, within=MOMENT, what="a granted 3")
        if after_a_heartbeat:
            await eventually(lambda: a.reports, within=MOMENT, what="a's first report")
        assert limiter.held("a") == 3

        a.gate.idle()
        assert (a.gate.granted, a.gate.held, a.gate.wanted) == (0, 0, 0)
        await eventually(lambda: limiter.held() == 0, within=MOMENT, what="a's permits back")
        assert "a" not in limiter.core.holders
        await eventually(lambda: not a.pending, within=MOMENT, what="a's tasks ended")
        assert b.gate.take(3) == 0
        await eventually(lambda: b.gate.granted == 3, within=MOMENT, what="b granted 3")

    run(scenario, a, b)


def test_gate__an_ask_that_raises_is_asked_again_until_the_limiter_answers() -> None:
    limiter = Limiter(CONCURRENT_3)
    host = Host(limiter, "a")
    host.failing = 1

    async def scenario() -> None:
        assert host.gate.take(2) == 0
        await eventually(lambda: host.asks, within=MOMENT, what="the first ask")
        assert (host.failing, host.wakes, host.gate.granted) == (0, 0, 0)

        await eventually(lambda: host.wakes, within=5.0, what="granted once the limiter answers")
        assert host.asks == [(2, 0), (2, 0)]
        assert host.gate.take(2) == 2
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
        host.on_wake = lambda: take(host.gate, 2)
        assert host.gate.take(2) == 0
        await eventually(lambda: len(host.reports) >= 2, within=1.0, what="a second report")
        assert host.reports[:2] == [2, 2] and host.failing_reports == 0
        assert limiter.held("a") == 2

        host.gate.done(2)
        await eventually(lambda: limiter.held("a") == 0, within=MOMENT, what="done reported")
        await eventually(lambda: not host.pending, within=MOMENT, what="the tasks ended")

    run(scenario, host)


def test_gate__a_report_waits_for_the_grant_on_its_way_so_no_other_host_gets_its_permits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's heartbeat comes due while the limiter has granted A a permit and the reply is on its
    way: a report of what A held before the grant would let the limiter give it to B."""
    monkeypatch.setattr(limits, "HEARTBEAT_SECONDS", SHORT_HEARTBEAT)
    limiter = Limiter(Limits(2, None))
    a, b = Host(limiter, "a"), Host(limiter, "b")
    most = {"running": 0, "held": 0}

    async def watch() -> None:
        while True:
            most["running"] = max(most["running"], a.gate.running + b.gate.running)
            most["held"] = max(most["held"], a.gate.held + b.gate.held)
            await asyncio.sleep(0.002)

    async def scenario() -> None:
        watching = asyncio.create_task(watch())
        a.on_wake = lambda: take(a.gate, 1)
        b.on_wake = lambda: take(b.gate, 1)
        assert a.gate.take(1) == 0
        await eventually(lambda: a.gate.running == 1, within=MOMENT, what="a runs 1")
        await eventually(lambda: a.reports, within=MOMENT, what="a's first report")

        a.replies = asyncio.Event()
        assert a.gate.take(1) == 0
        await eventually(lambda: limiter.held("a") == 2, within=MOMENT, what="a granted 1 more")
        await asyncio.sleep(2 * SHORT_HEARTBEAT)  # a's heartbeat comes due
        assert b.gate.take(1) == 0
        await eventually(lambda: b.asks, within=MOMENT, what="b asks")
        await asyncio.sleep(2 * POLL_SECONDS)
        b_woken_before_the_reply = b.wakes

        a.replies.set()
        await eventually(lambda: a.gate.running == 2, within=MOMENT, what="a runs 2")
        a.gate.done(2)
        await eventually(lambda: b.gate.running == 1, within=MOMENT, what="b runs a's permit")
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
        host.on_wake = lambda: take(host.gate, 2)
        assert host.gate.take(2) == 0
        await eventually(lambda: host.reports, within=MOMENT, what="a report")
        assert limiter.held("a") == 2

        host.failing_reports = 1  # the next report, of none, raises
        host.gate.done(2)
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
    limiter = Limiter(Limits(2, 40))
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
        assert (host.gate.running, host.gate.granted, host.gate.wanted) == (0, 0, 0)

    run(scenario, host)
