"""Real Ray for the runtime tests: one local cluster per test session, a fresh SQLite file and
a fresh manager key per test (step hosts are shared by every connection, as in production)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import choreography_ray as cr
from tests.support import RAY_NAMESPACE

#: Short intervals so the tests observe watchdog ticks and deliveries in seconds.
FAST = {
    "job_watchdog_interval": 0.5,
    "step_delivery_retry_delay": 0.1,
    "max_step_delivery_retry_delay": 0.5,
    "step_retry_backoff": 0.2,
    "max_step_retry_backoff": 1.0,
    # A spare job actor per test's manager would stay 10 minutes each (the spare test, the
    # chaos runs and the scheduler's and recovery's tests keep the default).
    "spare_job_actors": 0,
}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=2,
            namespace=RAY_NAMESPACE,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    yield
    ray.shutdown()


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


@pytest.fixture
def connect(ray_cluster: None, storage_url: str):
    """`connect(**options)` -> a Jobs handle on this test's storage with FAST options."""

    def make(**options: object) -> cr.Jobs:
        return cr.Jobs.connect(
            storage=storage_url,
            options=cr.JobsOptions(**{**FAST, **options}),
            namespace=RAY_NAMESPACE,
        )

    return make


@pytest.fixture
def scope() -> str:
    """A fresh scope per test: a jobs manager is one actor per (scope, namespace)."""
    return f"test-{uuid.uuid4().hex[:8]}"
