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
from choreography_ray.core.stopping import settled
from choreography_ray.storage import Storage
from tests.support import RAY_NAMESPACE, in_storage

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
            # Declared GPUs (Ray accepts them on a machine without any): the pool tests' shape.
            num_gpus=2,
            namespace=RAY_NAMESPACE,
            include_dashboard=False,
            logging_level=logging.WARNING,
        )
    yield
    ray.shutdown()


#: The name prefixes of the actors that are a test's own: its scope's jobs managers (a fresh
#: scope per test), schedulers, pool hosts and limiters (each test's pools and limits start
#: new). The recovery actor and the step hosts of `RAY_NAMESPACE` are shared by every test,
#: as in production, and stay.
OWN_ACTORS = ("jobs-manager/", "scheduler/", "pool/", "limiter")


def actor_is_gone(name: str) -> bool:
    """No actor of that name lives in the tests' namespace (exited, or never started)."""
    try:
        ray.get_actor(name, namespace=RAY_NAMESPACE)
    except ValueError:
        return True
    return False


def job_actor_names() -> set[str]:
    """The names of the job actors alive in the tests' namespace (`job/{id}`)."""
    return {
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"].startswith("job/")
    }


def _named_actors() -> set[tuple[str, str]]:
    """(namespace, name) of every named actor alive in the cluster this process joined."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return {(actor["namespace"], actor["name"]) for actor in named}


#: The name prefixes of the actors that run a test's jobs: its job actors and dedicated steps.
JOB_ACTORS = ("job/", "step/")


def _kill(namespace: str, name: str) -> None:
    with contextlib.suppress(ValueError):  # gone meanwhile
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


def _unsettled(url: str | None, job_ids: set[str]) -> set[str]:
    """The jobs of `job_ids` that `url` holds neither settled nor removed."""
    if url is None or not job_ids:
        return set()

    async def read(storage: Storage) -> set[str]:
        running = set()
        for job_id in job_ids:
            try:
                state = await storage.get_job(job_id)
            except cr.ChoreographyError:  # a record the test made unreadable: never resumed
                continue
            if state is not None and not settled(state):
                running.add(job_id)
        return running

    return in_storage(url, read)


@pytest.fixture(autouse=True)
def _end_the_tests_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Ends, once the test has ended (its other fixtures torn down first), the actors it
    created: its jobs managers and schedulers, every actor of a Ray namespace it began (a
    recovery actor and step hosts of its own), and its job actors and dedicated steps. A job of
    its storage left running (not settled, not removed) fails the test, naming it: its record
    would have the recovery actor bring it back, beside every later test. The step hosts and
    the recovery actor of `RAY_NAMESPACE` are shared by every test, as in production, and stay."""
    before = _named_actors() if ray.is_initialized() else None
    url = request.getfixturevalue("storage_url") if "storage_url" in request.fixturenames else None
    yield
    if before is None or not ray.is_initialized():
        return
    namespaces = {namespace for namespace, _ in before} | {RAY_NAMESPACE}
    left: list[tuple[str, str]] = []  # the test's job actors and dedicated steps
    for namespace, name in sorted(_named_actors() - before):
        if name.startswith(OWN_ACTORS) or namespace not in namespaces:
            _kill(namespace, name)
        elif name.startswith(JOB_ACTORS):
            left.append((namespace, name))
    running = _unsettled(url, {name.split("/")[1] for _, name in left})
    for namespace, name in left:
        _kill(namespace, name)
    if running:
        pytest.fail(
            f"the test left jobs running: {sorted(running)}; stop or remove them before it ends"
        )


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
