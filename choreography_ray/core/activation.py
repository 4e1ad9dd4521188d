"""`Activation`: the state of one job's activation as its flows see it.

The flows (`dispatch`, `stage_flow`, `stop_flow`, `resume_flow`, ...) are functions over an
activation that never take a turn themselves; `job.JobCore` is the activation that calls them,
one turn at a time. They take this protocol, never `JobCore`, so the core has no import circle:
`job.py` imports the flows, the flows import this module and each other, and nothing here
imports a flow.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from choreography_ray.core.counting import Counting
from choreography_ray.core.hosts import Hosts
from choreography_ray.core.messages import StepStart
from choreography_ray.core.metrics import Labels, Metrics, Tally
from choreography_ray.core.mode import Mode
from choreography_ray.core.placement import Placement
from choreography_ray.core.planning import Feed
from choreography_ray.core.stages import Stages
from choreography_ray.core.timers import Timers
from choreography_ray.core.watchdog import HookBackoff
from choreography_ray.core.window import Window
from choreography_ray.job import Job
from choreography_ray.model import JobState
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage


class Activation(Protocol):
    """What the flows read and change of an activation (`job.JobCore` says what each is)."""

    job_id: str
    storage: Storage
    hosts: Hosts
    options: JobsOptions
    metrics: Metrics
    labels: Labels | None
    tally: Tally
    mode: Mode
    state: JobState | None
    job: Job[Any] | None
    stages: Stages
    window: Window
    counting: Counting
    hook_backoff: HookBackoff
    admission_stage: int
    ticks: int
    feed: Feed | None
    page: int
    epoch: int
    dirty: bool
    placements: dict[str, Placement]
    incarnations: dict[str, str | None]
    timers: Timers
    owed: tuple[JobStatus, str | None, str | None] | None
    unanswered_saves: int
    first_stage_failed: int

    @property
    def job_state(self) -> JobState: ...

    @property
    def loaded_job(self) -> Job[Any]: ...

    @property
    def metric_labels(self) -> Labels: ...

    @property
    def live(self) -> bool: ...

    @property
    def awaiting_admission(self) -> int | None: ...

    def enter(self, mode: Mode) -> None: ...

    def kick(self) -> None: ...

    def send(self, host: str, batch: list[StepStart]) -> asyncio.Future[bool]: ...

    def watch(self, host: str, incarnation: str | None) -> None: ...

    def lose_later(self, host: str, step_ids: set[str]) -> None: ...
