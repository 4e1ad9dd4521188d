"""A host's side of one limited step type (`Gate`): the permits the limiter granted this host
(`core.limits.LimitCore`) and the steps holding them. The host's lane says what waits for a
permit each time it pumps (`want`); the gate asks the limiter for all of it in one call, and
again at once when all of it was granted and more waits: it waits only when refused. It tells
the limiter what it holds a moment after that changes and every heartbeat while it holds any.
No Ray here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from choreography_ray.core import limits
from choreography_ray.core.limits import Key, Want
from choreography_ray.core.messages import describe
from choreography_ray.logs import get_logger

log = get_logger(__name__)

#: Seconds a gate waits before asking again when asking failed (the limiter is restarting, or
#: cannot be created): its steps wait meanwhile, the limit is never dropped.
RETRY_SECONDS = 0.5

#: Asks for permits: (what waits per want, what it holds per key) -> (granted per want, seconds
#: to wait before asking again; 0 when all was granted).
Ask = Callable[[dict[Want, int], dict[Key, int]], Awaitable[tuple[dict[Want, int], float]]]
#: Tells what it holds per key and what waits per want.
Report = Callable[[dict[Key, int], dict[Want, int]], Awaitable[None]]
Spawn = Callable[[Coroutine[Any, Any, None], str], Any]


class Gate:
    """`take` never waits: the lane starts what was granted, and `wake` (its pump) is called
    when more is granted."""

    def __init__(
        self, name: str, ask: Ask, report: Report, wake: Callable[[], None], spawn: Spawn
    ) -> None:
        self.name = name
        #: Permits of steps that took one (starting or running), per concurrency key.
        self.running: Counter[Key] = Counter()
        #: Permits granted and not taken yet, per want.
        self.granted: Counter[Want] = Counter()
        #: Steps that could start now but for a permit, per want: the lane's latest word.
        self.wanted: dict[Want, int] = {}
        self._ask = ask
        self._report = report
        #: Called when the limiter granted more (the lane's pump).
        self.wake = wake
        self._spawn = spawn
        #: The wants the limiter was told last.
        self._told: dict[Want, int] = {}
        self._asking = False
        self._reporting = False
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def held(self) -> dict[Key, int]:
        """Permits held per concurrency key: taken, and granted and not taken."""
        held = Counter(self.running)
        for want, n in self.granted.items():
            held[want[3]] += n
        return {key: n for key, n in held.items() if n > 0}

    def take(self, want: Want, most: int) -> int:
        """Takes up to `most` of the permits granted for `want`: as many steps hold them now."""
        given = min(most, self.granted[want])
        if given:
            self.granted[want] -= given
            if not self.granted[want]:
                del self.granted[want]
            self.running[want[3]] += given
        return given

    def want(self, wants: Mapping[Want, int]) -> None:
        """What waits for a permit now (the lane took what was granted first): asked for at
        once. Permits granted and not taken go back (their steps were stopped meanwhile)."""
        self.wanted = {want: n for want, n in wants.items() if n > 0}
        if self.granted:
            self.granted.clear()
            self._report_soon()
        if any(self.wanted.get(want, 0) < n for want, n in self._told.items()):
            self._report_soon()  # the limiter forgets what no longer waits
        if self.wanted and not self._asking:
            self._asking = True
            self._spawn(self._asking_loop(), f"limit-ask {self.name}")

    def idle(self) -> None:
        """Nothing waits any more."""
        self.want({})

    def done(self, key: Key, steps: int = 1) -> None:
        """`steps` of that key ended (or were stopped before they started): their permits go
        back, reported in a moment with any others."""
        self.running[key] -= steps
        if self.running[key] <= 0:
            del self.running[key]
        self._report_soon()

    def _outstanding(self) -> dict[Want, int]:
        return {
            want: n - self.granted[want]
            for want, n in self.wanted.items()
            if n > self.granted[want]
        }

    async def _asking_loop(self) -> None:
        try:
            while asked := self._outstanding():
                async with self._lock:  # no report reads `held` while a grant is on its way
                    try:
                        granted, wait = await self._ask(asked, self.held)
                    except Exception as error:  # the limiter is restarting, say
                        log.warning("%s: asking the limiter failed (asked again in %g s): %s",
                                    self.name, RETRY_SECONDS, describe(error))  # fmt: skip
                        granted, wait = {}, RETRY_SECONDS
                    self.granted.update(granted)
                    self._told = {w: n - granted.get(w, 0) for w, n in asked.items()}
                if granted:
                    self._report_soon()  # the heartbeats that keep the permits
                    self.wake()
                if wait > 0:  # refused, at least in part: all granted asks again at once
                    await asyncio.sleep(wait)
        finally:
            self._asking = False

    def _report_soon(self) -> None:
        self._changed.set()
        if not self._reporting:
            self._reporting = True
            self._spawn(self._reporting_loop(), f"limit-report {self.name}")

    async def _reporting_loop(self) -> None:
        """Reports what the host holds and wants: a moment after a change (the changes of that
        moment in one report), and every heartbeat while it holds any, until its report of
        none is stored. A report that fails is made again at the next heartbeat."""
        try:
            while True:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that comes as the event is set, and the loop would go on.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(limits.HEARTBEAT_SECONDS):
                        await self._changed.wait()
                await asyncio.sleep(limits.POLL_SECONDS)
                self._changed.clear()
                async with self._lock:
                    held, wants = self.held, self._outstanding()
                    try:
                        await self._report(held, wants)
                    except Exception as error:  # restarting, say: told again at the next heartbeat
                        log.warning("%s: reporting %d permits held failed (reported again "
                                    "within %g s): %s", self.name, sum(held.values()),
                                    limits.HEARTBEAT_SECONDS, describe(error))  # fmt: skip
                        continue
                    self._told = wants
                if not held and not self._changed.is_set():
                    return
        finally:
            self._reporting = False
