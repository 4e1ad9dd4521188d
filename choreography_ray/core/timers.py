"""Named timers of a job activation: start retries, admission, step retries, the stop finish.

A timer kicks the activation's pump when it is due; the pump's turn asks `due(name)`. A timer
armed without a delay backs off: 1 s, doubling to 60 s, by how often it was armed in a row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from choreography_ray.core.retries import STANDARD


class Timers:
    def __init__(self, kick: Callable[[], None]) -> None:
        self._kick = kick
        self._due: dict[str, float] = {}  # name -> monotonic due time
        self._failures: dict[str, int] = {}

    def arm(self, name: str, delay: float | None = None) -> None:
        """Due after `delay` seconds (an earlier due time stays), else after the backoff."""
        if delay is None:
            if name in self._due:
                return
            delay = self._backoff(name)
        due = time.monotonic() + delay
        if self._due.get(name, due + 1) <= due:
            return
        self._due[name] = due
        asyncio.get_running_loop().call_later(delay, self._kick)

    def _backoff(self, name: str) -> float:
        """The next delay of `name`'s backoff, counting this failure."""
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        return STANDARD.delay(failures)

    def armed(self, name: str) -> bool:
        return name in self._due

    def due(self, name: str) -> bool:
        """Whether `name` is due; a due timer is disarmed."""
        at = self._due.get(name)
        if at is None or at > time.monotonic():
            return False
        del self._due[name]
        return True

    def clear(self, name: str) -> None:
        """Disarmed, and its backoff starts again."""
        self._due.pop(name, None)
        self._failures.pop(name, None)
