"""The gauge of what waits on a step host, per fairness key (`choreography_waiting_steps`):
steps whose start waits for room, sync steps waiting for a thread, and steps waiting in a lane.
A host records its own (Ray tags each series with the process), so their sum is the cluster's.
The first `MAX_TAG_VALUES` keys a host sees are named, later ones are `other`."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from ray.util import metrics as ray_metrics

from choreography_ray.core.metrics import UNKNOWN, BoundedTags

if TYPE_CHECKING:
    from choreography_ray.runtime.step_host import StepHostCore

WAITING_GAUGE = "choreography_waiting_steps"
#: Seconds between two recordings.
GAUGE_SECONDS = 5.0


async def record_waiting(host: StepHostCore) -> None:
    """Every `GAUGE_SECONDS`, while a tenant of the host has metrics on, records the steps
    waiting per fairness key; a key that waited before and waits no more reads 0."""
    gauge = ray_metrics.Gauge(
        WAITING_GAUGE,
        "Steps waiting for capacity on step hosts (room, a thread, a lane), per fairness key.",
        ("fairness_key",),
    )
    bounded = BoundedTags()
    shown: set[str] = set()
    while True:
        if any(tenant.options.metrics for tenant in host.tenants.values()):
            counts: Counter[str] = Counter()
            for key, steps in host.waiting_by_key().items():
                counts[bounded(WAITING_GAUGE, UNKNOWN, key)] += int(steps)
            shown |= set(counts)
            for key in shown:
                gauge.set(counts[key], tags={"fairness_key": key})
        await asyncio.sleep(GAUGE_SECONDS)
