"""A job's step outputs on the dashboard, over HTTP on the seeded SQLite file with outputs
written through the storage API: the job page's link and count, and `outputs.jsonl` (its
lines, `limit` and its bounds, `stage`, pages streamed one at a time, the refusals)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from choreography_ray.dashboard import jobs
from choreography_ray.storage import Storage, StoredOutput
from tests.dashboard.client import Client
from tests.dashboard.seed import RUNNING_JOB

#: The running job's outputs: seven of stage 0 and three of stage 10, of two shapes.
OUTPUTS = [
    StoredOutput(RUNNING_JOB, f"step-{n:03d}", 0, 1, json.dumps({"shard": n, "docs": n * 10}))
    for n in range(60, 67)
] + [
    StoredOutput(RUNNING_JOB, f"step-{n:03d}", 10, 2, json.dumps({"index": "docs", "part": [n]}))
    for n in range(100, 103)
]


def rows(outputs: list[StoredOutput]) -> list[dict[str, Any]]:
    return [{"job_id": o.job_id, "step_id": o.step_id, "stage": o.stage, "attempt": o.attempt,
             "output": json.loads(o.output)} for o in outputs]  # fmt: skip


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def with_outputs(storage: Storage, runner: asyncio.Runner) -> None:
    runner.run(storage.put_outputs(OUTPUTS))


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three outputs read and sent at a time, so that ten take four pages."""
    monkeypatch.setattr(jobs, "OUTPUTS_PAGE", 3)


def test_job_page__links_the_outputs_with_their_count(
    reader: Client, with_outputs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = reader.get(f"/jobs/{RUNNING_JOB}").text
    assert '<dd id="outputs">10 · ' in page
    assert f'href="/jobs/{RUNNING_JOB}/outputs.jsonl" id="outputs-download"' in page
    assert "all as JSON lines" in page and "jobs outputs" not in page

    monkeypatch.setattr(jobs, "OUTPUTS_SENT", 4)
    more = reader.get(f"/jobs/{RUNNING_JOB}").text
    assert "the first 4 as JSON lines" in more
    assert f"<code>choreography-ray jobs outputs {RUNNING_JOB}</code>" in more
    # A job without outputs has no link.
    assert 'id="outputs"' not in reader.get("/jobs/job-done").text


def test_outputs_jsonl__every_output_in_step_id_order_as_a_download(
    reader: Client, with_outputs: None
) -> None:
    answer = reader.get(f"/jobs/{RUNNING_JOB}/outputs.jsonl")

    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.headers["content-disposition"] == (
        f'attachment; filename="{RUNNING_JOB}-outputs.jsonl"')  # fmt: skip
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert lines(answer.text) == rows(OUTPUTS)


def test_outputs_jsonl__limit_bounded_and_stage(
    reader: Client, with_outputs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def sent(query: str) -> list[dict[str, Any]]:
        answer = reader.get(f"/jobs/{RUNNING_JOB}/outputs.jsonl?{query}")
        assert answer.status_code == 200, answer.text
        return lines(answer.text)

    assert sent("limit=4") == rows(OUTPUTS[:4])  # a page and one
    assert sent("limit=6") == rows(OUTPUTS[:6])  # two pages whole
    assert sent("limit=0") == rows(OUTPUTS[:1])  # at least one
    assert sent("stage=10") == rows(OUTPUTS[7:])
    assert sent("stage=0&limit=5") == rows(OUTPUTS[:5])
    assert sent("stage=20") == []
    staged = reader.get(f"/jobs/{RUNNING_JOB}/outputs.jsonl?stage=10")
    assert f'filename="{RUNNING_JOB}-stage-10-outputs.jsonl"' in staged.headers[
        "content-disposition"]  # fmt: skip

    monkeypatch.setattr(jobs, "OUTPUTS_SENT", 2)
    monkeypatch.setattr(jobs, "MAX_OUTPUTS_SENT", 5)
    assert sent("") == rows(OUTPUTS[:2])  # the default
    assert sent("limit=100000") == rows(OUTPUTS[:5])  # the most


def test_outputs_jsonl__read_a_page_at_a_time(
    reader: Client, with_outputs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str | None, int]] = []
    storage = reader.app.state.site.storage
    list_outputs = storage.list_outputs

    async def spy(job_id: str, **options: Any) -> list[StoredOutput]:
        asked.append((options.get("after"), options["limit"]))
        found: list[StoredOutput] = await list_outputs(job_id, **options)
        return found

    monkeypatch.setattr(storage, "list_outputs", spy)
    assert len(lines(reader.get(f"/jobs/{RUNNING_JOB}/outputs.jsonl?limit=8").text)) == 8
    assert asked == [(None, 3), ("step-062", 3), ("step-065", 2)]


def test_outputs_jsonl__none_an_unknown_job_and_a_bad_query(reader: Client) -> None:
    empty = reader.get("/jobs/job-done/outputs.jsonl")
    assert empty.status_code == 200 and empty.text == ""

    unknown = reader.get("/jobs/no-such-job/outputs.jsonl")
    assert unknown.status_code == 404 and "There is no job no-such-job" in unknown.text

    for query in ("limit=many", "stage=last"):
        bad = reader.get(f"/jobs/{RUNNING_JOB}/outputs.jsonl?{query}")
        assert bad.status_code == 400 and "is not a number" in bad.text, query
        assert "text/html" in bad.headers["content-type"]
