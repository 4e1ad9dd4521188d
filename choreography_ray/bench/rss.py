"""Peak memory of the Ray processes this benchmark started, sampled by a background thread.

A local Ray started by `ray.init` is a tree under the driver: the GCS, the raylet, the
dashboard agents, and under the raylet the worker processes (their title starts with `ray::`:
`ray::IDLE`, `ray::StepHost.start_steps`, ...). Every `INTERVAL` seconds the sampler sums the
resident set size (RSS) of the workers, and of the whole tree with the driver, and keeps the
highest sums seen since the last `measure()` began. RSS counts pages shared between processes
(the object store's mapping, shared libraries) once per process, so the sums are upper bounds.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Ray ships psutil (in ray/thirdparty_files) and puts it on sys.path when imported: the venv
# need not have its own.
import ray  # noqa: F401

psutil: Any = importlib.import_module("psutil")

#: Seconds between two samples.
INTERVAL = 0.2

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


@dataclass
class Peak:
    """The highest sums of RSS seen during one measurement, in bytes."""

    workers: int = 0
    all: int = 0


def sample() -> tuple[int, int]:
    """(RSS of the Ray worker processes, RSS of the driver and every descendant), in bytes."""
    root = psutil.Process()
    workers = 0
    total = int(root.memory_info().rss)
    for process in root.children(recursive=True):
        try:
            rss = int(process.memory_info().rss)
            command = process.cmdline()
        except _GONE:
            continue
        total += rss
        if _is_worker(command):
            workers += rss
    return workers, total


def total_memory() -> int:
    """The machine's memory, in bytes."""
    return int(psutil.virtual_memory().total)


def _is_worker(command: list[str]) -> bool:
    """A Ray worker: titled `ray::...` once it runs, `.../default_worker.py ...` before."""
    return bool(command) and (
        command[0].startswith("ray::") or any(p.endswith("default_worker.py") for p in command)
    )


class RssSampler:
    """Samples in a daemon thread from `start()` to `stop()`; `measure()` scopes a peak."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self._interval = interval
        self._peak = Peak()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _record(self) -> None:
        workers, total = sample()
        with self._lock:
            self._peak.workers = max(self._peak.workers, workers)
            self._peak.all = max(self._peak.all, total)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            with contextlib.suppress(*_GONE):
                self._record()

    @contextlib.contextmanager
    def measure(self) -> Iterator[Peak]:
        """Yields a `Peak` that holds, once the block ends, the highest sums seen during it
        (one sample is taken at each end, so a short block is measured too)."""
        result = Peak()
        with self._lock:
            self._peak = Peak()
        with contextlib.suppress(*_GONE):
            self._record()
        try:
            yield result
        finally:
            with contextlib.suppress(*_GONE):
                self._record()
            with self._lock:
                result.workers, result.all = self._peak.workers, self._peak.all
