"""The limiter of a limited step type (`limit/{type path}`, `core.limits.LimitCore`), and the
gate a step host asks it through. A sync actor: one call at a time, each a few dict updates."""

from __future__ import annotations

import time
import warnings
from typing import Any

import ray

from choreography_ray.core.limits import Gate, LimitCore, Limits, Spawn
from choreography_ray.logs import configure_actor
from choreography_ray.runtime.names import actor_options, limiter_name
from choreography_ray.step import JobStep
from choreography_ray.types import type_path


@ray.remote
class Limiter:
    def __init__(self) -> None:
        configure_actor()
        with warnings.catch_warnings():  # Ray 2.60 reads its own deprecated `actor_id` here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.core = LimitCore(time.monotonic(), restarted)

    def take(
        self, holder: str, want: int, held: int, limits: tuple[int | None, float | None]
    ) -> tuple[int, float]:
        return self.core.take(holder, want, held, Limits(*limits), time.monotonic())

    def report(self, holder: str, held: int) -> None:
        self.core.report(holder, held, time.monotonic())

    def held(self) -> int:
        """Permits held over the cluster now (tests, `choreography-ray pools`)."""
        self.core.report("", 0, time.monotonic())  # drops the silent holders first
        return self.core.held


def limited(step_type: type[JobStep[Any]]) -> bool:
    return step_type.max_concurrent is not None or step_type.max_per_second is not None


def gate_for(step_type: type[JobStep[Any]], namespace: str, holder: str, spawn: Spawn) -> Gate:
    """The host's gate for a limited type, its limiter created when missing. Its `wake` is
    set by the lane that uses it."""
    path = type_path(step_type)
    limits = (step_type.max_concurrent, step_type.max_per_second)
    handle = Limiter.options(  # type: ignore[attr-defined]
        **actor_options(limiter_name(path), namespace, max_concurrency=1)
    ).remote()

    async def ask(want: int, held: int) -> tuple[int, float]:
        granted, wait = await handle.take.remote(holder, want, held, limits)
        return int(granted), float(wait)

    async def report(held: int) -> None:
        await handle.report.remote(holder, held)

    return Gate(path, ask, report, lambda: None, spawn)
