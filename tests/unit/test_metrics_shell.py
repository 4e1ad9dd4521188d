"""What the Ray shell records, without a cluster: a group commit round observes once per job
labels in it, a retried delivery counts its outcomes once per retry, and the Ray port builds
each metric and tag dict once and never raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from choreography_ray.core.messages import Outcome
from choreography_ray.core.metrics import (
    JOBS_GAUGE,
    NO_METRICS,
    BatchKind,
    Counter,
    Histogram,
    Labels,
    WriteOperation,
)
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import metrics as ray_port
from choreography_ray.runtime.delivery import Delivery
from choreography_ray.runtime.group_commit import GroupCommit
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import StepUpdate
from choreography_ray.storage.memory import MemoryStorage
from tests.unit.core.fakes import RecordingMetrics

pytestmark = pytest.mark.timeout(30)

A = Labels("s", "n", "pkg:A")
B = Labels("s", "n", "pkg:B")


def test_group_commit__a_round_observes_once_per_labels_with_its_records() -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        commit = GroupCommit(MemoryStorage(), 0.001, metrics)
        running = StepUpdate("j1", "s1", StepStatus.RUNNING, 1)
        await asyncio.gather(
            commit.write([running], [("j1", "s2"), ("j1", "s3")], A),
            commit.write([], [("j2", "s1")], B),
            commit.write([], [("j2", "s2")], B),
        )

        sizes = metrics.observed(Histogram.BATCH_SIZE, BatchKind.GROUP_COMMIT)
        seconds = metrics.observed(Histogram.STORAGE_WRITE_SECONDS, WriteOperation.GROUP_COMMIT)
        by_labels = {labels: v for name, v, labels, _ in metrics.observations if name is
                     Histogram.BATCH_SIZE}  # fmt: skip
        assert sorted(sizes) == [2, 3]
        assert by_labels == {A: 3, B: 2}
        assert len(seconds) == 2, "one round, observed for each job type in it"

    asyncio.run(scenario())


def test_group_commit__metrics_off_observes_nothing() -> None:
    async def scenario() -> None:
        commit = GroupCommit(MemoryStorage(), 0.001, NO_METRICS)
        await commit.write([], [("j1", "s1")], A)
        assert not commit._sizes

    asyncio.run(scenario())


def test_delivery__each_retry_counts_the_batchs_outcomes() -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        options = JobsOptions(
            step_delivery_max_attempts=3,
            step_delivery_retry_delay=0.001,
            max_step_delivery_retry_delay=0.001,
        )

        async def exists(job_id: str) -> bool:
            return True

        delivery = Delivery(options, "ns", exists, metrics)
        delivery.drop = lambda job_id, outcomes: True  # every delivery fails, on purpose
        outcomes = [Outcome(f"s{i}", 1, StepStatus.COMPLETED_SUCCESSFULLY) for i in range(3)]

        delivered = await delivery.deliver("j1", outcomes, labels=A)

        assert not delivered, "gave up after three attempts"
        assert metrics.counts == [
            (Counter.OUTCOME_DELIVERIES_RETRIED, 3, A),
            (Counter.OUTCOME_DELIVERIES_RETRIED, 3, A),
        ]

    asyncio.run(scenario())


class FakeRayMetric:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []
        self.fail = fail

    def _call(self, method: str, value: float, tags: dict[str, str]) -> None:
        if self.fail:
            raise ValueError("the metrics agent said no")
        self.calls.append((method, value, tags))

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self._call("inc", value, tags)

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self._call("observe", value, tags)

    def set(self, value: float, tags: dict[str, str]) -> None:
        self._call("set", value, tags)


def test_ray_metrics__tags_are_built_once_and_extra_tags_named_per_metric() -> None:
    port = ray_port.RayMetrics()
    fakes: dict[str, Any] = {
        Counter.STEPS_SUCCEEDED: FakeRayMetric(),
        Histogram.BATCH_SIZE: FakeRayMetric(),
        JOBS_GAUGE: FakeRayMetric(),
    }
    port._objects.update(fakes)

    port.count(Counter.STEPS_SUCCEEDED, 3, A)
    port.count(Counter.STEPS_SUCCEEDED, 0, A)  # nothing moved: nothing recorded
    port.count(Counter.STEPS_SUCCEEDED, 2, A)
    port.observe(Histogram.BATCH_SIZE, 7, A, BatchKind.START)
    port.jobs(4, A, JobStatus.RUNNING)

    (_, v1, tags1), (_, v2, tags2) = fakes[Counter.STEPS_SUCCEEDED].calls
    assert (v1, v2) == (3, 2)
    assert tags1 is tags2, "one dict per labels, built once"
    assert tags1 == {"scope": "s", "namespace": "n", "job_type": "pkg:A"}
    assert fakes[Histogram.BATCH_SIZE].calls == [("observe", 7, {**tags1, "kind": "start"})]
    assert fakes[JOBS_GAUGE].calls == [("set", 4, {**tags1, "status": "Running"})]


def test_ray_metrics__a_failing_recording_is_logged_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = ray_port.RayMetrics()
    port._objects[Counter.STEPS_FAILED] = FakeRayMetric(fail=True)

    port.count(Counter.STEPS_FAILED, 1, A)
    port.count(Counter.STEPS_FAILED, 1, A)

    warnings = [r for r in caplog.records if "choreography_steps_failed" in r.getMessage()]
    assert len(warnings) == 1


def test_metrics_for__off_is_the_no_op_port_and_on_one_port_per_process() -> None:
    assert ray_port.metrics_for(JobsOptions(metrics=False)) is NO_METRICS
    on = ray_port.metrics_for(JobsOptions())
    assert on.enabled
    assert ray_port.metrics_for(JobsOptions(step_batch_size=7)) is on


def test_relayed_metrics__one_sum_per_counter_and_labels_kept_when_a_relay_fails() -> None:
    async def scenario() -> None:
        sent: list[ray_port.MetricsBatch] = []
        failing = [True]

        async def send(batch: ray_port.MetricsBatch) -> None:
            if failing[0]:
                raise ConnectionError("the manager is restarting")
            sent.append(batch)

        relay = ray_port.RelayedMetrics(send)
        relay.count(Counter.STEPS_SUCCEEDED, 3, A)
        relay.count(Counter.STEPS_SUCCEEDED, 2, A)
        relay.count(Counter.STEPS_SUCCEEDED, 1, B)
        relay.observe(Histogram.BATCH_SIZE, 7, A, BatchKind.START)
        await relay.flush()  # fails: kept
        relay.count(Counter.STEPS_SUCCEEDED, 4, A)
        failing[0] = False
        await relay.flush()
        await relay.flush()  # nothing left: nothing sent

        (batch,) = sent
        counts, observations = batch
        assert sorted(counts) == [("choreography_steps_succeeded", 1, B, ""),
                                  ("choreography_steps_succeeded", 9, A, "")]  # fmt: skip
        assert observations == [("choreography_batch_size", 7, A, "start")]
        received = RecordingMetrics()
        ray_port.replay(received, batch)
        assert received.total(Counter.STEPS_SUCCEEDED) == 10
        assert received.observed(Histogram.BATCH_SIZE, "start") == [7]

    asyncio.run(scenario())
