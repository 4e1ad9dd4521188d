"""`Backoff`: the one helper behind every retry loop (delivery, removal finish, recovery, start
and step retries, the scheduler's dispatch retries): `first`, doubling up to `longest`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class Backoff:
    """Seconds before retry `n` (1-based): `first`, doubling, never more than `longest`."""

    first: float
    longest: float

    @classmethod
    def of(cls, first: timedelta, longest: timedelta) -> Backoff:
        return cls(first.total_seconds(), longest.total_seconds())

    def delay(self, n: int) -> float:
        if n <= 1:
            return min(self.first, self.longest)
        return min(self.first * 2.0 ** min(n - 1, 62), self.longest)


#: Start operations that threw, removal finishes, recovery retries: 1 s doubling to 60 s.
STANDARD = Backoff(1.0, 60.0)
