"""The job page shows the job's priority and fairness key (a record stored before them: 3 and
its namespace)."""

from __future__ import annotations

import asyncio

from choreography_ray.dashboard import create_app
from choreography_ray.model import JobState
from choreography_ray.storage.memory import MemoryStorage
from tests.dashboard.client import TOKEN, Client


def test_job_page__priority_and_fairness_key(runner: asyncio.Runner) -> None:
    storage = MemoryStorage()
    for job in (
        JobState(id="keyed", scope="s", namespace="n", type="a:B", priority=1,
                 fairness_key="tenant-<a>"),
        JobState(id="old", scope="s", namespace="n", type="a:B"),
    ):  # fmt: skip
        runner.run(storage.create_job(job))
    client = Client(create_app(storage, token=TOKEN), runner)
    try:
        page = client.get("/jobs/keyed").text
        assert '<dd id="priority">1</dd>' in page
        assert '<dd id="fairness-key"><code>tenant-&lt;a&gt;</code></dd>' in page
        page = client.get("/jobs/old").text
        assert '<dd id="priority">3</dd>' in page
        assert '<dd id="fairness-key"><code>n</code></dd>' in page
    finally:
        client.close()
