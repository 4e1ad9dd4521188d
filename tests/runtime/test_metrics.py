"""Metrics as Prometheus sees them: a `ray start --head` of the test's own with a fixed metrics
export port and a 1 s report interval, a job run by a driver that joins it with `ray.init`, and
the head's `/metrics` scraped and parsed with `prometheus_client`'s parser until the counters
equal the job's progress.

Run it alone (it starts its own head; it never touches the session's local Ray):

    flock /tmp/ray.lock python -m pytest tests/runtime/test_metrics.py -x -q
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import choreography_ray as cr
from choreography_ray.types import type_path
from tests.heads import REPO, Head, ray_head
from tests.runtime.metrics_jobs import NAMESPACE, POOL_SHAPE, SCOPE, MetricsJob
from tests.support import eventually

#: The head's environment: Ray exports metrics every second (it never goes below 1 s).
HEAD_ENV = {"RAY_metrics_report_interval_ms": "1000"}
#: Seconds the driver may take (it waits for the gate, opened by the test).
DRIVER_SECONDS = 240
#: Seconds until a recorded value shows on `/metrics`: a few report intervals, on a busy machine.
SCRAPE_SECONDS = 60.0

SUCCEED, FAIL = 30, 5
JOB_TYPE = type_path(MetricsJob)

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(head: Head) -> Samples:
    """Every sample on the head's `/metrics`, by sample name (a counter's ends in `_total`)."""
    try:
        with urllib.request.urlopen(head.metrics_url, timeout=5) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return samples


def value(samples: Samples, name: str, **tags: str) -> float | None:
    """The sum of `name`'s samples that carry this job's labels and `tags`; None if none."""
    wanted = {"scope": SCOPE, "namespace": NAMESPACE, "job_type": JOB_TYPE, **tags}
    found = [v for labels, v in samples.get(name, []) if wanted.items() <= labels.items()]
    return sum(found) if found else None


def pool_value(samples: Samples, name: str) -> float:
    """The sum of a pool gauge's series (one per host) for the metrics job's pool."""
    return sum(v for labels, v in samples.get(name, []) if labels.get("shape") == POOL_SHAPE)


def ours(samples: Samples) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {name: found for name, found in samples.items() if "choreography" in name}


@pytest.mark.timeout(480)
@pytest.mark.slow  # a Ray head of its own and its metrics scrape: about 25 s
def test_metrics__scraped_counters_equal_the_jobs_progress(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    request = {"succeed": SUCCEED, "fail": FAIL, "gate": str(gate)}
    storage = f"sqlite:///{tmp_path / 'jobs.db'}"

    with ray_head(HEAD_ENV) as head:
        driver = subprocess.Popen(
            [sys.executable, "-m", "tests.runtime.metrics_jobs", head.address, storage,
             json.dumps(request)],
            cwd=REPO, env=head.driver_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            # The gated steps hold the job RUNNING: the manager's gauge counts it, and the
            # pool's host its one busy step.
            eventually(
                lambda: value(scrape(head), "ray_choreography_jobs", status="Running") == 1,
                timeout=SCRAPE_SECONDS + 60,
                what="choreography_jobs{status=Running} = 1",
                every=0.5,
            )
            eventually(
                lambda: pool_value(scrape(head), "ray_choreography_pool_busy_steps") == 1,
                timeout=SCRAPE_SECONDS,
                what=f"choreography_pool_busy_steps{{shape={POOL_SHAPE}}} = 1",
                every=0.5,
            )
            assert pool_value(scrape(head), "ray_choreography_pool_hosts") >= 1
            gate.touch()
            out, err = driver.communicate(timeout=DRIVER_SECONDS)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        assert driver.returncode == 0, f"driver failed:\n{err[-4000:]}"
        state = cr.JobState.model_validate_json(out.strip().splitlines()[-1])
        assert state.status is cr.JobStatus.COMPLETED_WITH_FAILURES
        progress = state.progress
        assert (progress.successful_steps, progress.failed_steps) == (SUCCEED + 2, FAIL)

        expected = {
            "ray_choreography_steps_started_total": SUCCEED + 2 * FAIL + 2,  # each failure twice
            "ray_choreography_steps_succeeded_total": progress.successful_steps,
            "ray_choreography_steps_failed_total": progress.failed_steps,
            "ray_choreography_steps_retried_total": FAIL,
        }

        last: list[Samples] = [{}]

        def settled() -> dict[str, float | None] | None:
            last[0] = scrape(head)
            seen = {name: value(last[0], name) for name in expected}
            return seen if seen == expected else None

        try:
            eventually(settled, timeout=SCRAPE_SECONDS, what="the counters", every=0.5)
        except BaseException:
            print(json.dumps(ours(last[0]), indent=1, default=str)[:20_000])
            raise
        samples = last[0]

        # Nothing was stopped, restarted by a lease or delivered twice.
        for name in (
            "ray_choreography_steps_stopped_total",
            "ray_choreography_steps_restarted_by_lease_total",
            "ray_choreography_outcome_deliveries_retried_total",
        ):
            assert value(samples, name) in (None, 0.0), name
        # The histograms observed batches and writes, per kind and operation.
        for kind in ("start", "outcomes", "group_commit"):
            count = value(samples, "ray_choreography_batch_size_count", kind=kind)
            assert count is not None and count >= 1, kind
        for operation in ("create_job", "insert_plan", "save_job", "group_commit"):
            count = value(samples, "ray_choreography_storage_write_seconds_count",
                          operation=operation)  # fmt: skip
            assert count is not None and count >= 1, operation
        # No series names a job or a step, and none comes from the job's own process (Ray
        # labels each with its WorkerId): a job actor relays its metrics to its manager.
        workers = {
            labels.get("WorkerId")
            for name in expected
            for labels, _ in samples.get(name, [])
            if labels.get("scope") == SCOPE
        }
        assert len(workers) == 1, f"the counters come from one process, the manager: {workers}"
        for found in ours(samples).values():
            for labels, _ in found:
                assert state.id not in labels.values()
        # Once the job is done, the gauge counts it no more.
        eventually(
            lambda: value(scrape(head), "ray_choreography_jobs", status="Running") == 0,
            timeout=SCRAPE_SECONDS,
            what="choreography_jobs{status=Running} = 0",
            every=0.5,
        )
