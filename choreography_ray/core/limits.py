"""Limits per step type across the cluster (`JobStep.max_concurrent`, `max_per_second`), with
no storage round trip per step: a limiter actor per limited type (`limit/{type}`,
`runtime/limits.py`) keeps `LimitCore`, and each host keeps a `Gate` per limited type, asking
the limiter for permits in batches and reporting what it holds.

A holder (a host's incarnation) says how many permits it holds on every call, so a lost reply
or a duplicate call corrects itself on the next. A holder silent for `HOLDER_SECONDS` is gone
(its host or node died): its permits come back. A limiter that was restarted (its node died)
grants nothing for `LEARN_SECONDS`, until every live holder has told it what it holds.
No Ray here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple

from choreography_ray.logs import get_logger

log = get_logger(__name__)

#: Seconds between two reports of a holder that holds permits.
HEARTBEAT_SECONDS = 2.0
#: Seconds after which a silent holder's permits come back.
HOLDER_SECONDS = 5 * HEARTBEAT_SECONDS
#: Seconds a restarted limiter listens before it grants.
LEARN_SECONDS = 2 * HEARTBEAT_SECONDS
#: Seconds a refused holder waits before it asks again, when the concurrency limit refused it.
POLL_SECONDS = 0.05


class Limits(NamedTuple):
    max_concurrent: int | None
    max_per_second: float | None


class LimitCore:
    """The limiter's rules: permits held per holder, and a token bucket of one second's starts."""

    def __init__(self, now: float, restarted: bool = False) -> None:
        #: holder -> (permits it holds, when it last spoke).
        self.holders: dict[str, tuple[int, float]] = {}
        self.tokens = 0.0
        self.filled = now
        self.learning_until = now + LEARN_SECONDS if restarted else now

    @property
    def held(self) -> int:
        return sum(held for held, _ in self.holders.values())

    def report(self, holder: str, held: int, now: float) -> None:
        """What a holder holds now (0: it leaves)."""
        self._expire(now)
        if held > 0:
            self.holders[holder] = (held, now)
        else:
            self.holders.pop(holder, None)

    def take(
        self, holder: str, want: int, held: int, limits: Limits, now: float
    ) -> tuple[int, float]:
        """Grants up to `want` permits to a holder that holds `held`: (granted, seconds to
        wait before asking again when fewer than `want` were granted)."""
        self.report(holder, held, now)
        if now < self.learning_until:
            return 0, self.learning_until - now
        grant, wait = want, 0.0
        if limits.max_concurrent is not None:
            room = limits.max_concurrent - self.held
            if room < grant:
                grant, wait = max(0, room), POLL_SECONDS
        if limits.max_per_second is not None:
            rate = limits.max_per_second
            self.tokens = min(max(1.0, rate), self.tokens + (now - self.filled) * rate)
            self.filled = now
            if int(self.tokens) < grant:
                grant = int(self.tokens)
                wait = max(wait, (1.0 - (self.tokens - grant)) / rate)
            self.tokens -= grant
        if grant:
            self.report(holder, held + grant, now)
        return grant, wait

    def _expire(self, now: float) -> None:
        for holder, (_, seen) in list(self.holders.items()):
            if now - seen > HOLDER_SECONDS:
                del self.holders[holder]


Ask = Callable[[int, int], Awaitable[tuple[int, float]]]
Report = Callable[[int], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None], str], Any]


class Gate:
    """A host's side of one limited type: the permits it was granted and the steps running
    under them. `take` never waits: the lane starts what it was given, and `wake` (its pump)
    is called when more is granted."""

    def __init__(
        self, name: str, ask: Ask, report: Report, wake: Callable[[], None], spawn: Spawn
    ) -> None:
        self.name = name
        self.running = 0
        self.granted = 0
        self.wanted = 0
        self._ask = ask
        self._report = report
        #: Called when the limiter granted more (the lane's pump).
        self.wake = wake
        self._spawn = spawn
        self._asking = False
        self._reporting = False
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def held(self) -> int:
        return self.running + self.granted

    def take(self, want: int) -> int:
        """How many of `want` steps may start now (they run from now on)."""
        given = min(want, self.granted)
        self.granted -= given
        self.running += given
        self.wanted = want - given
        if self.wanted and not self._asking:
            self._asking = True
            self._spawn(self._asking_loop(), f"limit-ask {self.name}")
        return given

    def idle(self) -> None:
        """Nothing waits any more: permits granted and not used go back."""
        self.wanted = 0
        if self.granted:
            self.granted = 0
            self._report_soon()

    def done(self, steps: int) -> None:
        """`steps` ended: their permits go back (reported in a moment, with any others)."""
        self.running -= steps
        self._report_soon()

    async def _asking_loop(self) -> None:
        try:
            while self.wanted > self.granted:
                async with self._lock:  # no report reads `held` while a grant is on its way
                    try:
                        granted, wait = await self._ask(self.wanted - self.granted, self.held)
                    except Exception as error:  # the limiter is restarting, say
                        log.warning("%s: asking the limiter failed (asked again in %g s): %s",
                                    self.name, HEARTBEAT_SECONDS / 4, error)  # fmt: skip
                        granted, wait = 0, HEARTBEAT_SECONDS / 4
                    self.granted += granted
                if granted:
                    self._report_soon()  # the heartbeats that keep the permits
                    self.wake()
                if self.wanted > self.granted:
                    await asyncio.sleep(max(wait, POLL_SECONDS))
        finally:
            self._asking = False

    def _report_soon(self) -> None:
        self._changed.set()
        if not self._reporting:
            self._reporting = True
            self._spawn(self._reporting_loop(), f"limit-report {self.name}")

    async def _reporting_loop(self) -> None:
        """Reports what the host holds: a moment after a change (the changes of that moment in
        one report), and every heartbeat while it holds any, until its report of none is
        stored. A report that fails is made again at the next heartbeat."""
        try:
            while True:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that comes as the event is set, and the loop would go on.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(HEARTBEAT_SECONDS):
                        await self._changed.wait()
                await asyncio.sleep(POLL_SECONDS)
                self._changed.clear()
                async with self._lock:
                    held = self.held
                    try:
                        await self._report(held)
                    except Exception as error:  # restarting, say: told again at the next heartbeat
                        log.warning("%s: reporting %d permits held failed (reported again "
                                    "within %g s): %s", self.name, held, HEARTBEAT_SECONDS,
                                    error)  # fmt: skip
                        continue
                if held == 0 and not self._changed.is_set():
                    return
        finally:
            self._reporting = False
