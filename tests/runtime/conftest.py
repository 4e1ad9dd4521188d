"""Real Ray for the runtime tests: one local cluster per test session, a fresh SQLite file and
a fresh manager key per test (step hosts are shared by every connection, as in production).

The jobs managers and schedulers a test brought up end with the test (`_end_the_tests_actors`):
they are detached, so each would stay for the rest of the session, an idle process whose loops
(the jobs gauge every 5 s, the cleanup pass) take a share of the machine's two cores from every
later test, and whose number makes the raylet warn about the workers it started."""

from __future__ import annotations

import contextlib
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


#: The name prefixes of the actors that are a test's own: its scope's jobs managers (a fresh
#: scope per test) and schedulers. The recovery actor and the step hosts of `RAY_NAMESPACE` are
#: shared by every test, as in production, and stay.
OWN_ACTORS = ("jobs-manager/", "scheduler/")


def _named_actors() -> set[tuple[str, str]]:
    """(namespace, name) of every named actor alive in the cluster this process joined."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return {(actor["namespace"], actor["name"]) for actor in named}


@pytest.fixture(autouse=True)
def _end_the_tests_actors() -> Iterator[None]:
    """Kills, once the test has ended (its other fixtures torn down first), the jobs managers
    and schedulers it created, and every actor of a Ray namespace it began (a recovery actor and
    step hosts of its own). Nothing outlives a test on its fresh scope; a job actor left running
    is not killed (the recovery actor's reconciliation would bring it back through its
    manager), and its metrics relay to the gone manager fails, as metrics may."""
    before = _named_actors() if ray.is_initialized() else None
    yield
    if before is None or not ray.is_initialized():
        return
    namespaces = {namespace for namespace, _ in before} | {RAY_NAMESPACE}
    for namespace, name in sorted(_named_actors() - before):
        if name.startswith(OWN_ACTORS) or namespace not in namespaces:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


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
