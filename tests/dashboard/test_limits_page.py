"""The limits page (`/limits`): what the cluster's limiter counts, through the actions (a
stand-in here, no Ray), and the message of a dashboard without a cluster connection."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

from choreography_ray.dashboard import create_app
from choreography_ray.limit import Limit, LimitKey, LimitState
from choreography_ray.storage.memory import MemoryStorage
from tests.dashboard.client import TOKEN, Client, RecordingActions

STATES = [
    LimitState(
        name="crm-<api>",
        kind="named",
        limit=Limit(max_concurrent=50, rate=600, per=timedelta(minutes=1), burst=50),
        held=12,
        waiting=3,
        live=True,
    ),
    LimitState(
        name="app.steps:Fetch",
        kind="per-key",
        limit=Limit(max_concurrent=2),
        held=4,
        waiting=1500,
        top_keys=(
            LimitKey(key="tenant-a", held=2, waiting=1000),
            LimitKey(key="tenant-b", held=2, waiting=500),
        ),
    ),
]


class LimitActions(RecordingActions):
    """`RecordingActions` whose cluster counts `STATES`."""

    async def limits(self) -> list[LimitState]:
        self.calls.append(("limits",))
        return list(STATES)


def rows(page: str) -> dict[str, list[str]]:
    """The table's cells (their text) by limit name."""
    found = re.findall(r'<tr data-limit="([^"]*)">(.*?)</tr>', page)
    return {name: [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                        cells)]
            for name, cells in found}  # fmt: skip


def test_limits_page__a_row_per_limit_of_the_cluster(runner: asyncio.Runner) -> None:
    actions = LimitActions()
    client = Client(create_app(MemoryStorage(), token=TOKEN, actions=actions), runner)
    try:
        answer = client.get("/limits")
        assert answer.status_code == 200, answer.text
        page = answer.text
        assert actions.calls == [("limits",)]
        assert '<a href="/limits" class="here">Limits</a>' in page
        assert "no-cluster" not in page
        assert rows(page) == {
            "crm-&lt;api&gt;": ["crm-&lt;api&gt;", "named", "50 at once, 600 per 60 s (burst 50)",
                                "12", "3", "-", "yes"],
            "app.steps:Fetch": ["app.steps:Fetch", "per-key", "2 at once", "4", "1,500",
                                "tenant-a 2/1,000, tenant-b 2/500", "no"],
        }  # fmt: skip
    finally:
        client.close()


def test_limits_page__none_counted(runner: asyncio.Runner) -> None:
    client = Client(create_app(MemoryStorage(), token=TOKEN, actions=RecordingActions()), runner)
    try:
        page = client.get("/limits").text
        assert 'id="no-limits"' in page
        assert "<table" not in page
    finally:
        client.close()


def test_limits_page__without_a_cluster_connection(runner: asyncio.Runner) -> None:
    client = Client(create_app(MemoryStorage(), token=TOKEN), runner)
    try:
        answer = client.get("/limits")
        assert answer.status_code == 200
        assert "This dashboard was started without --address, so it cannot reach the " \
               "cluster's limiter" in answer.text  # fmt: skip
        assert "<table" not in answer.text
    finally:
        client.close()
