"""What a job activation needs from the step hosts: the interface the Ray shell implements
(`runtime/hosts.py`) and the unit tests fake. Every method may raise when a host is gone."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from choreography_ray.core.messages import StepStart
from choreography_ray.core.metrics import Labels
from choreography_ray.core.placement import Placement
from choreography_ray.core.pool_rules import PoolDemand
from choreography_ray.core.sharing import NO_SHARE, Share


class Hosts(Protocol):
    def place(
        self, job_id: str, starts: list[StepStart], placement: Placement
    ) -> list[tuple[str, list[StepStart]]]:
        """The hosts that will run these steps of one placement (shared or dedicated), each
        with its share: the next shared host all of them, or each step its own actor."""

    def pool_hosts(self, shape: str) -> list[str] | None:
        """The pool's hosts Ray has placed, as last learned (None: not asked yet)."""

    def pool_growing(self, shape: str) -> bool:
        """Whether the pool has hosts on their way (created, not placed yet), as last learned."""

    async def sync_pools(self, job_id: str, demands: list[PoolDemand]) -> None:
        """Tells the pools' owner what the job holds of each pool (`PoolDemand`) and learns
        the placed hosts of each; an owner that does not answer in time leaves what was
        known."""

    async def start(
        self,
        host: str,
        job_id: str,
        batch: Sequence[StepStart],
        labels: Labels,
        epoch: int = 0,
        share: Share = NO_SHARE,
    ) -> str:
        """Hands a batch to a host; returns once the host has stored it RUNNING, with the
        host's incarnation (a restarted host is a new one). `labels` are the job's metric
        tags, for what the host records of it; `share` orders the job's steps where they wait
        on the host (`core.sharing`). A host refuses the start (raises) when an
        activation of the job with a newer `epoch` has asked it already (0: none known)."""

    async def cancel(self, hosts: Collection[str], job_id: str, removing: bool) -> None:
        """Tells every running step of the job on these hosts to stop."""

    async def running(self, job_id: str, fence: bool = False, epoch: int = 0) -> dict[str, str]:
        """The job's steps running on placed hosts: step id -> host; a placed host that does
        not answer in time raises (not known yet). With `fence` (a job about
        to count from storage), each host refuses the job's starts still waiting there and
        holds the job's outcome writes until `lift_fence` (`StepHostCore.running_steps`).
        Each host asked learns `epoch`: it refuses the starts of older activations from then
        on."""

    def known_incarnation(self, host: str) -> str | None:
        """The incarnation of the host that last answered a start or listed the job's steps in
        `running` (None: none has): the one a watch of the steps it holds names."""

    async def lift_fence(self, job_id: str) -> None:
        """The hosts write the job's outcomes again."""

    async def watch(self, host: str, incarnation: str | None) -> None:
        """Returns once that incarnation of the host is gone (dead, or restarted since; None:
        the one that runs now); raises when that cannot be told now (the caller asks again)."""

    def release(self, host: str) -> None:
        """A dedicated step's actor is done with."""

    async def refresh(self) -> None:
        """Learns the hosts of the nodes alive now."""

    async def warm(self) -> None:
        """Ahead of a job (a spare activation): learns the hosts, and reaches the first ones a
        placement takes, so the job's first start finds them at once."""

    async def activation_gone(self, activation: str) -> bool:
        """Whether a lease's hosting actor is dead (or a new incarnation)."""
