"""The active window and the start throttle: which steps start, on which host, and when.

The job hands steps of the running stage to step hosts in batches (one start operation = one
RPC), never more than the window (`max_active_steps_per_job` or the job type's
`max_active_steps`; below 1 is 1) running at once and never more than
`max_concurrent_step_starts` start operations in flight. A host that dies is noticed through
Ray's error on a call that never returns (`watch`); without leases its steps start again.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import Any

from choreography_ray.options import window_size
from choreography_ray.runtime.job_base import JobBase, log
from choreography_ray.runtime.messages import StepStart, starts_to_wire
from choreography_ray.status import JobStatus
from choreography_ray.step import JobStep
from choreography_ray.types import import_type

#: Seconds before start operations that threw are tried again (the watchdog also retries them).
START_RETRY_DELAY = 1.0


class Window(JobBase):
    """The window part of a job activation (see `JobCore`)."""

    @property
    def window(self) -> float:
        assert self.job is not None
        configured = self.job.max_active_steps
        if configured is None:
            configured = self.options.max_active_steps_per_job
        size = window_size(configured)
        return math.inf if size is None else size

    def _kick(self) -> None:
        self._wake.set()

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.halted and not self.hook_owed and not self._in_first_wave:
                self._fill()
                await self._check_stage()

    def _fill(self) -> list[asyncio.Future[bool]]:
        """Starts pending steps while the window and the start throttle allow."""
        started: list[asyncio.Future[bool]] = []
        room = self.window - len(self.active)
        while (
            self.pending
            and room > 0
            and not self.halted
            and self._starts_in_flight < self.options.effective_max_concurrent_step_starts
        ):
            batch: list[StepStart] = []
            size = int(min(self.options.step_batch_size, room))
            while self.pending and len(batch) < size:
                batch.append(self.pending.popleft())
            room -= len(batch)
            started.extend(self._start(batch))
        return started

    def _start(self, batch: list[StepStart]) -> list[asyncio.Future[bool]]:
        shared: list[StepStart] = []
        tasks: list[asyncio.Future[bool]] = []
        for start in batch:
            if self._is_dedicated(start.type):
                assert self.job is not None
                step_type = import_type(start.type, self.options.allowed_type_prefixes)
                name, handle = self.hosts.dedicated(
                    self.job_id, start.step_id, getattr(step_type, "actor_options", {})
                )
                self._dedicated[start.step_id] = handle
                tasks.append(self._start_on(name, handle, [start]))
            else:
                shared.append(start)
        if shared:
            name, handle = self.hosts.next()
            tasks.append(self._start_on(name, handle, shared))
        return tasks

    def _start_on(self, name: str, handle: Any, batch: list[StepStart]) -> asyncio.Future[bool]:
        # Counted in flight and active now, not when the task first runs: the throttle and
        # the window see this operation before `_fill` decides on the next one.
        self._starts_in_flight += 1
        for start in batch:
            self.active[start.step_id] = (start, name)
        return self._spawn(self._send_start(name, handle, batch))

    async def _send_start(self, name: str, handle: Any, batch: list[StepStart]) -> bool:
        try:
            await handle.start_steps.remote(self.job_id, self.hosts.context, starts_to_wire(batch))
        except Exception as error:
            log.warning(
                "job %s: starting %d steps on %s failed: %s", self.job_id, len(batch), name, error
            )
            for start in batch:
                if self.active.get(start.step_id, (None,))[0] == start:
                    del self.active[start.step_id]
                    self.start_failed.append(start)
            asyncio.get_running_loop().call_later(START_RETRY_DELAY, self._retry_failed_starts)
            return False
        else:
            self._watch(name, handle)
            if (
                self.halted
                and self.state is not None
                and self.state.status in (JobStatus.STOPPED, JobStatus.REMOVING)
            ):
                # The stop reached this host before these steps did: tell them again.
                await handle.cancel_steps.remote(
                    self.job_id, self.state.status is JobStatus.REMOVING
                )
            return True
        finally:
            self._starts_in_flight -= 1
            self._kick()

    def _retry_failed_starts(self) -> None:
        if self.start_failed and not self.halted:
            self.pending.extendleft(reversed(self.start_failed))
            self.start_failed.clear()
            self._kick()

    def _is_dedicated(self, type_path: str) -> bool:
        step_type = import_type(type_path, self.options.allowed_type_prefixes)
        return (
            isinstance(step_type, type) and issubclass(step_type, JobStep) and step_type.dedicated
        )

    def _watch(self, name: str, handle: Any) -> None:
        """Learns from Ray's error on a never-returning call that a host died."""
        if name in self._watched:
            return
        self._watched[name] = self._spawn(self._watch_host(name, handle))

    async def _watch_host(self, name: str, handle: Any) -> None:
        try:
            await handle.watch.remote()
        except Exception:
            pass
        finally:
            self._watched.pop(name, None)
        if self.options.lease_seconds is None:
            lost = [start for start, host in self.active.values() if host == name]
            if lost:
                log.warning(
                    "job %s: host %s died with %d steps; starting them again",
                    self.job_id,
                    name,
                    len(lost),
                )
                self._requeue(lost)
        self.hosts.refresh()

    def _requeue(self, starts: Iterable[StepStart]) -> None:
        starts = list(starts)
        for start in starts:
            self.active.pop(start.step_id, None)
        self.pending.extendleft(reversed(starts))
        self._kick()
