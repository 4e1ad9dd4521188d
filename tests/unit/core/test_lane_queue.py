"""What a lane holds per fairness key (`core.lane_queue.LaneQueue.waiting_by_key`), which the
step host's `choreography_waiting_steps` gauge reads."""

from __future__ import annotations

from pydantic import BaseModel

from choreography_ray.core.lane_queue import Item, LaneQueue
from choreography_ray.core.messages import StepStart
from choreography_ray.core.sharing import Share
from choreography_ray.step import StepContext


class Request(BaseModel):
    n: int = 0


SHARES = {"a1": Share(key="tenant-a"), "a2": Share(key="tenant-a"), "b": Share(key="tenant-b")}


def item(job_id: str, n: int, key: str | None = None) -> Item:
    start = StepStart(f"{job_id}-{n}", "pkg.mod:Step", 0, 1, "{}")
    return Item(job_id, start, Request(), StepContext(job_id, start.step_id, 0, 1), 0.0, key)


def test_steps_waiting_for_a_turn_or_a_permit_count_for_their_jobs_fairness_key() -> None:
    queue = LaneQueue(size=1, wait=0.0, share_of=SHARES.__getitem__)
    for job_id, n in (("a1", 0), ("a1", 1), ("a2", 0), ("b", 0)):
        queue.stage(item(job_id, n))
    queue.hold_back(item("b", 1, key="customer-7"))
    assert queue.waiting_by_key() == {"tenant-a": 3, "tenant-b": 2}
    assert len(queue) == 5
