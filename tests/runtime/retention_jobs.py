"""Job types of the retention tests (importable by path in Ray workers)."""

from __future__ import annotations

from tests.runtime.sample_jobs import FanOut


class NotKept(FanOut):
    """Drops its records once it completed successfully."""

    keep_after_completed = False
