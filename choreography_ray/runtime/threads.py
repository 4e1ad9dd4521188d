"""A step host's thread pool, shared fairly (`FairThreads`): sync performs, batches and setups
wait here in a `core.sharing.FairQueue`, and only as many are handed to the pool as it has
threads, so a job's steps never wait in the pool's own first-come queue behind thousands of
another tenant's. No Ray here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from choreography_ray.core.sharing import FairQueue, Share

Call = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


class FairThreads:
    def __init__(self, threads: int, prefix: str = "step") -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=prefix)
        self._waiting: FairQueue[Call] = FairQueue()
        #: The futures of the calls waiting (not handed to the pool yet).
        self._queued: set[asyncio.Future[Any]] = set()
        #: Calls handed to the pool and not done.
        self.busy = 0

    @property
    def waiting(self) -> FairQueue[Call]:
        return self._waiting

    def run(self, share: Share, call: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """`call(*args)` in a thread once its turn comes; a future of its result. Cancelling
        the future before the call began drops it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.push((call, args, future), share)
        self._queued.add(future)
        self._hand_out()
        return future

    def drop(self, future: asyncio.Future[Any]) -> bool:
        """Cancels a call that has not begun (a stop of its step's job); False when it has
        begun, or is not one of these."""
        if future not in self._queued:
            return False
        self._queued.discard(future)
        future.cancel()
        return True

    def _hand_out(self) -> None:
        loop = asyncio.get_running_loop()
        while self.busy < self.threads and self._waiting:
            call, args, future = self._waiting.pop()
            self._queued.discard(future)
            if future.cancelled():
                continue
            self.busy += 1
            inner = loop.run_in_executor(self._pool, call, *args)
            inner.add_done_callback(functools.partial(self._done, outer=future))

    def _done(self, inner: asyncio.Future[Any], *, outer: asyncio.Future[Any]) -> None:
        self.busy -= 1
        if not outer.cancelled():
            if inner.cancelled():
                outer.cancel()
            elif (error := inner.exception()) is not None:
                outer.set_exception(error)
            else:
                outer.set_result(inner.result())
        self._hand_out()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
