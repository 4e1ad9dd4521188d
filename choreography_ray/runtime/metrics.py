"""The metrics port (`core.metrics.Metrics`) on `ray.util.metrics`.

Ray exports what a process records through its node's metrics agent, on the port `ray start
--metrics-export-port` names, in Prometheus' text format: a metric `X` as `ray_X`, a counter as
`ray_X_total`. Each metric object is made once per process, on first use, and each tag dict once
per (labels, extra tag): a recording is one `inc`, `observe` or `set` on a dict already built.
A recording that fails is logged once per metric and otherwise ignored: metrics never fail a
job. docs/metrics.md lists the metrics.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ray.util import metrics as ray_metrics

from choreography_ray.core.metrics import (
    COUNTER_TAG,
    HISTOGRAM_TAG,
    JOBS_GAUGE,
    NO_METRICS,
    BoundedTags,
    Counter,
    Histogram,
    Labels,
    Metrics,
)
from choreography_ray.logs import get_logger
from choreography_ray.options import JobsOptions
from choreography_ray.status import JobStatus

log = get_logger(__name__)

#: The tags every metric has.
LABEL_KEYS = ("scope", "namespace", "job_type")

#: Bucket boundaries of `choreography_storage_write_seconds`, in seconds.
WRITE_SECONDS_BOUNDARIES = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
]  # fmt: skip
#: Bucket boundaries of `choreography_batch_size`, in items.
BATCH_SIZE_BOUNDARIES = [
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10_000.0,
    25_000.0, 50_000.0,
]  # fmt: skip

_DESCRIPTIONS = {
    Counter.STEPS_STARTED: "Step attempts a step host took and stored RUNNING.",
    Counter.STEPS_SUCCEEDED: "Steps whose success their job counted.",
    Counter.STEPS_FAILED: "Steps whose failure their job counted (no retry left or wanted).",
    Counter.STEPS_RETRIED: "Failed step attempts scheduled to run again.",
    Counter.STEPS_RESTARTED_BY_LEASE: "Running steps restarted after their owner and lease "
    "were gone.",
    Counter.STEPS_STOPPED: "Steps whose stop their job counted.",
    Counter.OUTCOME_DELIVERIES_RETRIED: "Outcomes whose delivery to their job was tried again.",
    Counter.REHYDRATIONS: "Jobs a jobs manager's rehydration resumed.",
    Counter.STEP_FAILURES: "Steps whose failure their job counted, by failure signature.",
    Histogram.STORAGE_WRITE_SECONDS: "Seconds one storage write took.",
    Histogram.BATCH_SIZE: "Items in one batch (start, outcome report, group commit round).",
    JOBS_GAUGE: "Jobs per status, as storage holds them (non-terminal statuses).",
}


class RayMetrics:
    """`Metrics` on `ray.util.metrics`: one instance per process (`metrics_for`). Recorded from
    the actor's event loop only (steps' threads never record)."""

    enabled = True

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}
        self._tags: dict[tuple[Labels, str, str], dict[str, str]] = {}
        self._warned: set[str] = set()
        self._bounded = BoundedTags()

    def count(self, counter: Counter, value: int, labels: Labels, tag: str = "") -> None:
        key = COUNTER_TAG.get(counter, "")
        if value > 0 and key:
            self._record(counter, "inc", value, labels, key, self._bounded(counter, labels, tag))
        elif value > 0:
            self._record(counter, "inc", value, labels)

    def observe(self, histogram: Histogram, value: float, labels: Labels, tag: str) -> None:
        self._record(histogram, "observe", value, labels, HISTOGRAM_TAG[histogram], tag)

    def jobs(self, value: int, labels: Labels, status: JobStatus) -> None:
        self._record(JOBS_GAUGE, "set", value, labels, "status", status.value)

    def _record(
        self, name: str, method: str, value: float, labels: Labels, key: str = "", tag: str = ""
    ) -> None:
        try:
            metric = self._objects.get(name) or self._make(name)
            tags = self._tags.get((labels, key, tag))
            if tags is None:
                tags = dict(zip(LABEL_KEYS, labels, strict=True))
                if key:
                    tags[key] = tag
                self._tags[(labels, key, tag)] = tags
            getattr(metric, method)(value, tags=tags)
        except Exception as error:
            if name not in self._warned:
                self._warned.add(name)
                log.warning("recording the metric %s failed (not logged again): %s", name, error)

    def _make(self, name: str) -> Any:
        description = _DESCRIPTIONS[name]
        metric: Any
        if name == Histogram.STORAGE_WRITE_SECONDS:
            metric = ray_metrics.Histogram(
                name, description, WRITE_SECONDS_BOUNDARIES, (*LABEL_KEYS, "operation")
            )
        elif name == Histogram.BATCH_SIZE:
            metric = ray_metrics.Histogram(
                name, description, BATCH_SIZE_BOUNDARIES, (*LABEL_KEYS, "kind")
            )
        elif name == JOBS_GAUGE:
            metric = ray_metrics.Gauge(name, description, (*LABEL_KEYS, "status"))
        elif name == Counter.STEP_FAILURES:
            tag_keys = (*LABEL_KEYS, COUNTER_TAG[Counter.STEP_FAILURES])
            metric = ray_metrics.Counter(name, description, tag_keys)
        else:
            metric = ray_metrics.Counter(name, description, LABEL_KEYS)
        self._objects[name] = metric
        return metric


_PROCESS_METRICS: RayMetrics | None = None


def metrics_for(options: JobsOptions) -> Metrics:
    """This process's Ray metrics, or the no-op port when `options.metrics` is off."""
    global _PROCESS_METRICS
    if not options.metrics:
        return NO_METRICS
    if _PROCESS_METRICS is None:
        _PROCESS_METRICS = RayMetrics()
    return _PROCESS_METRICS


#: What a relay carries: counts summed by (counter, labels, tag), and each observation.
MetricsBatch = tuple[
    list[tuple[str, int, Labels, str]],
    list[tuple[str, float, Labels, str]],
]
#: Observations a relay keeps while its receiver cannot be reached; older ones are dropped.
RELAY_OBSERVATIONS_KEPT = 10_000


class RelayedMetrics:
    """`Metrics` of a short-lived process: kept in memory and handed on by `flush` to a
    long-lived one that records them (`replay`). Counts are summed per (counter, labels), so a
    relay carries one number per counter and job type whatever the steps; a failed relay keeps
    what it carried for the next one."""

    enabled = True

    def __init__(self, send: Callable[[MetricsBatch], Awaitable[None]]) -> None:
        self._send = send
        self._counts: dict[tuple[str, Labels, str], int] = {}
        self._observations: list[tuple[str, float, Labels, str]] = []
        self._failing = False

    def count(self, counter: Counter, value: int, labels: Labels, tag: str = "") -> None:
        if value > 0:
            key = (counter.value, labels, tag)
            self._counts[key] = self._counts.get(key, 0) + value

    def observe(self, histogram: Histogram, value: float, labels: Labels, tag: str) -> None:
        self._observations.append((histogram.value, value, labels, str(tag)))
        if len(self._observations) > RELAY_OBSERVATIONS_KEPT:
            del self._observations[: len(self._observations) - RELAY_OBSERVATIONS_KEPT]

    def jobs(self, value: int, labels: Labels, status: JobStatus) -> None:
        return None  # only a jobs manager sets the gauge, and it records it itself

    @property
    def pending(self) -> bool:
        return bool(self._counts or self._observations)

    async def flush(self) -> None:
        """Hands what was recorded on; a relay that fails is logged (once in a row) and its
        batch waits for the next."""
        if not self.pending:
            return
        counts, self._counts = self._counts, {}
        observations, self._observations = self._observations, []
        batch: MetricsBatch = (
            [(c, n, labels, tag) for (c, labels, tag), n in counts.items()],
            observations,
        )
        try:
            await self._send(batch)
        except Exception as error:
            for key, n in counts.items():
                self._counts[key] = self._counts.get(key, 0) + n
            self._observations[:0] = observations[-RELAY_OBSERVATIONS_KEPT:]
            if not self._failing:
                log.warning("relaying metrics failed (kept for the next relay): %s", error)
            self._failing = True
            return
        self._failing = False


def replay(metrics: Metrics, batch: MetricsBatch) -> None:
    """Records a relayed batch through `metrics` (the receiver's own port)."""
    counts, observations = batch
    for name, value, labels, tag in counts:
        metrics.count(Counter(name), value, Labels(*labels), tag)
    for name, observed, labels, tag in observations:
        metrics.observe(Histogram(name), observed, Labels(*labels), tag)
