"""Every page of the dashboard over HTTP, on a seeded SQLite file (tests/dashboard/seed.py)."""

from __future__ import annotations

import asyncio
import re
from html import unescape

from choreography_ray.dashboard import create_app
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage
from choreography_ray.storage.memory import MemoryStorage
from tests.dashboard.client import TOKEN, Client
from tests.dashboard.seed import DEAD_LETTER, FAILED_STEPS, FILLERS, RUNNING_JOB, SCOPE


def job_ids(page: str) -> list[str]:
    """The jobs a list page shows, in order."""
    return re.findall(r'<tr data-job="([^"]+)"', page)


def count_of(page: str, status: str) -> int:
    found = re.search(rf'data-status="{status}">{status} <b>([\d,]+)</b>', page)
    assert found, f"no count of {status}"
    return int(found[1].replace(",", ""))


def link(page: str, rel: str) -> str:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', page)
    assert found, f"no {rel} link"
    return unescape(found[1])


# -- the jobs list -------------------------------------------------------------------------


def test_jobs_list__newest_first_with_the_counts_per_status_at_the_top(reader: Client) -> None:
    answer = reader.get("/")

    assert answer.status_code == 200
    page = answer.text
    assert re.search(r"All <b>66</b>", page)
    assert count_of(page, "RUNNING") == 1
    assert count_of(page, "COMPLETED_SUCCESSFULLY") == FILLERS + 2
    assert count_of(page, "STOPPED") == count_of(page, "FAILED") == 1
    shown = job_ids(page)
    assert len(shown) == 50
    assert shown[:6] == [RUNNING_JOB, "job-failed", "job-stopped", "job-with-failures",
                         "job-big-request", "job-done"]  # fmt: skip


def test_jobs_list__pages_older_and_newer_on_the_server(reader: Client) -> None:
    first = reader.get("/").text
    second = reader.get(link(first, "next")).text
    back = reader.get(link(second, "prev")).text

    assert len(job_ids(second)) == 66 - 50
    assert job_ids(second)[-1] == "filler-059"
    assert set(job_ids(first)).isdisjoint(job_ids(second))
    assert 'rel="next"' not in second
    assert job_ids(back) == job_ids(first)
    assert [len(job_ids(reader.get(f"/?limit=20&before={b}").text)) for b in ("",)] == [20]


def test_jobs_list__filters_by_status_type_scope_namespace_and_creation(reader: Client) -> None:
    def shown(query: str) -> list[str]:
        answer = reader.get(f"/?{query}")
        assert answer.status_code == 200, answer.text
        return job_ids(answer.text)

    assert shown("status=RUNNING") == [RUNNING_JOB]
    assert shown("status=running") == shown("status=Running") == [RUNNING_JOB]
    assert shown("type=tests.jobs:EmbedDocuments") == ["job-done"]
    assert shown("scope=lab") == ["job-with-failures"]
    assert shown("scope=studio&namespace=tenant-b") == ["job-done"]
    assert len(shown("since=24h")) == 6
    assert len(shown("since=2000-01-01")) == 50
    assert shown("status=REMOVING") == []
    # The counts follow every filter but the status, so the status chips still add up.
    page = reader.get("/?scope=studio&status=FAILED").text
    assert count_of(page, "FAILED") == 1 and count_of(page, "RUNNING") == 1
    assert "lab" in page  # the scope choice lists every known scope


def test_jobs_list__an_unreadable_filter_is_a_400_page_naming_the_choices(reader: Client) -> None:
    for query, says in (("status=Sleeping", "RUNNING"), ("since=yesterday", "24h"),
                        ("limit=many", "limit"), ("before=nonsense", "place")):  # fmt: skip
        answer = reader.get(f"/?{query}")
        assert answer.status_code == 400
        assert says in answer.text and "Traceback" not in answer.text


def test_storage_url__shown_without_its_password(runner: asyncio.Runner) -> None:
    storage = MemoryStorage("memory://admin:hunter2@db.example/jobs")
    runner.run(storage.create_job(JobState(id="j", scope="s", namespace="n", type="a:B")))
    client = Client(create_app(storage, token=TOKEN), runner)
    try:
        page = client.get("/jobs/j").text
        assert "memory://admin:***@db.example/jobs" in page
        assert "hunter2" not in page
    finally:
        client.close()


# -- a job ---------------------------------------------------------------------------------


def test_job_page__stages_history_failed_steps_and_the_request(reader: Client) -> None:
    answer = reader.get(f"/jobs/{RUNNING_JOB}")

    assert answer.status_code == 200
    page = answer.text
    assert 'id="job-status">RUNNING<' in page
    # One bar for the job and one per stage, each with its segments' counts of the total.
    assert page.count('<svg class="bar"') == 3
    assert 'data-total="300" data-done="150"' in page
    assert 'data-stage="10" class="current"' in page
    assert '<rect class="failed" x="68.0" y="0" width="32.0"' in page
    assert "steps/s" in page and "ETA" in page
    for status in ("PREPARING_JOB", "PREPARING_STEPS", "RUNNING"):
        assert f"<td>{status}</td>" in page
    steps = re.findall(r'<td class="id"><code>(step-\d+)</code>', page)
    assert steps == [f"step-{n:03d}" for n in range(25)]
    assert "shard 0 refused: disk full" in page
    assert f"25 shown of {FAILED_STEPS + 2} failed" in page
    # The request as JSON, escaped.
    assert "&#34;index&#34;: &#34;docs&#34;" in page or "&quot;index&quot;" in page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Actions" not in page and 'id="action-stop"' not in page  # read only


def test_job_page__failed_steps_page_by_step_id(reader: Client) -> None:
    first = reader.get(f"/jobs/{RUNNING_JOB}").text
    second = reader.get(link(first, "next")).text

    steps = re.findall(r'<td class="id"><code>(step-\d+)</code>', second)
    assert steps == [f"step-{n:03d}" for n in range(25, FAILED_STEPS)] + ["step-040", "step-041"]
    assert "COMPLETED_WITH_FAILURE" in second and "no such shard" in second
    assert 'rel="next"' not in second


def test_job_page__an_unknown_job_is_a_404_page_not_a_traceback(reader: Client) -> None:
    for path in ("/jobs/no-such-job", "/jobs/no-such-job/request.json", "/jobs/no-such-job/stop",
                 "/no/such/page"):  # fmt: skip
        answer = reader.get(path)
        assert answer.status_code == 404, path
        assert "text/html" in answer.headers["content-type"]
        assert "Traceback" not in answer.text
    assert "There is no job no-such-job" in reader.get("/jobs/no-such-job").text


def test_job_live__refreshes_while_running_and_stops_once_settled(
    reader: Client, storage: Storage, runner: asyncio.Runner
) -> None:
    live = reader.get(f"/jobs/{RUNNING_JOB}/live")
    assert live.status_code == 200 and live.headers["cache-control"] == "no-store"
    assert f'data-live="/jobs/{RUNNING_JOB}/live"' in live.text
    assert live.text.lstrip().startswith('<section id="live"')

    job = runner.run(storage.get_job(RUNNING_JOB))
    assert job is not None
    progress = job.progress.model_copy(update={"successful_steps": 200})
    runner.run(storage.save_job(job.model_copy(update={"progress": progress})))
    assert 'data-done="232"' in reader.get(f"/jobs/{RUNNING_JOB}/live").text

    job = runner.run(storage.get_job(RUNNING_JOB))
    assert job is not None
    runner.run(storage.save_job(job.with_status(JobStatus.STOPPED)))
    stopping = reader.get(f"/jobs/{RUNNING_JOB}/live").text
    assert 'id="job-status">STOPPED<' in stopping and "data-live=" in stopping  # not final yet
    job = runner.run(storage.get_job(RUNNING_JOB))
    assert job is not None
    runner.run(storage.save_job(job.model_copy(update={"stop_finalized": True})))
    assert "data-live=" not in reader.get(f"/jobs/{RUNNING_JOB}/live").text
    runner.run(storage.remove_job(RUNNING_JOB))
    assert "no longer exists" in reader.get(f"/jobs/{RUNNING_JOB}/live").text


def test_job_request__the_whole_request_as_json_and_cut_on_the_page(reader: Client) -> None:
    page = reader.get("/jobs/job-big-request").text
    assert "Cut at 65,536 characters" in page
    whole = reader.get("/jobs/job-big-request/request.json")
    assert whole.status_code == 200
    assert len(whole.json()["shards"]) == 10_000


def test_job_page__links_the_scheduler_run_it_belongs_to(reader: Client) -> None:
    page = reader.get("/jobs/job-with-failures").text
    assert "run run-1 · FAILED" in page
    assert f"/schedules/runs?scope={SCOPE}&amp;manifest=hourly" in page
    assert "on_completed raised RuntimeError" in reader.get("/jobs/job-failed").text


# -- schedules -----------------------------------------------------------------------------


def test_manifests__next_due_time_and_counted_failures(reader: Client) -> None:
    answer = reader.get("/schedules")

    assert answer.status_code == 200
    page = answer.text
    rows = dict(re.findall(r'<tr data-manifest="([^"]+)">(.*?)</tr>', page, re.S))
    assert set(rows) == {"hourly", "nightly", "after-nightly"}
    assert "2 / 4" in rows["hourly"] and "dead lettered" in rows["hourly"]
    assert "cron 0 3 * * * (Europe/Berlin)" in rows["nightly"]
    assert re.search(r"\d{4}-\d\d-\d\d 0[12]:00:00", rows["nightly"])  # 03:00 in Berlin, in UTC
    assert "disabled" in rows["after-nightly"]
    assert "the default scheduler options" in page


def test_runs__newest_first_with_their_jobs(reader: Client) -> None:
    page = reader.get(f"/schedules/runs?scope={SCOPE}").text
    assert re.findall(r'<tr data-run="([^"]+)"', page) == ["run-2", "run-1", "run-0"]
    assert '<a href="/jobs/job-with-failures">' in page
    assert "run-1" in page.split('data-run="run-2"')[1].split("</tr>")[0]  # run-2 replays run-1
    only = reader.get(f"/schedules/runs?scope={SCOPE}&manifest=nightly").text
    assert "No runs." in only


def test_dead_letters__by_status_with_their_notes(reader: Client, operator: Client) -> None:
    page = reader.get(f"/schedules/dead-letters?scope={SCOPE}").text
    assert re.findall(r'<tr data-dead-letter="([^"]+)"', page) == [DEAD_LETTER, "dl-acknowledged"]
    assert "upstream outage" in page
    assert "/requeue" not in page  # read only: no actions
    awaiting = reader.get(f"/schedules/dead-letters?scope={SCOPE}&status=AWAITING_INTERVENTION")
    assert re.findall(r'<tr data-dead-letter="([^"]+)"', awaiting.text) == [DEAD_LETTER]
    assert reader.get(f"/schedules/dead-letters?scope={SCOPE}&status=lost").status_code == 400
    acting = operator.get(f"/schedules/dead-letters?scope={SCOPE}").text
    assert f"/schedules/{SCOPE}/dead-letters/{DEAD_LETTER}/requeue" in acting
    assert "dl-acknowledged/requeue" not in acting


def test_schedules__a_scope_without_manifests_says_so(reader: Client) -> None:
    assert "No manifests in scope nowhere" in reader.get("/schedules?scope=nowhere").text


def test_static_files__served_from_the_package(reader: Client) -> None:
    script = reader.get("/static/live.js")
    assert script.status_code == 200 and "data-live" in script.text
    assert "svg.bar" in reader.get("/static/dashboard.css").text


class Failing(MemoryStorage):
    """A storage whose job reads fail: with `error`, else with a bug of its own."""

    def __init__(self, error: Exception) -> None:
        super().__init__("memory://")
        self.error = error

    async def get_job(self, job_id: str) -> JobState | None:
        raise self.error


def test_errors__storage_down_is_a_503_page_and_a_bug_a_500_page_without_traceback(
    runner: asyncio.Runner,
) -> None:
    from choreography_ray.errors import StorageUnavailableError

    down = Failing(StorageUnavailableError("MongoDB at mongodb://u:***@db/x is unavailable"))
    client = Client(create_app(down, token=TOKEN), runner)
    answer = client.get("/jobs/j")
    assert answer.status_code == 503 and "mongodb://u:***@db/x is unavailable" in answer.text
    client.close()

    broken = Failing(ZeroDivisionError("secret detail"))
    client = Client(create_app(broken, token=TOKEN), runner, raise_app_exceptions=False)
    answer = client.get("/jobs/j")
    assert answer.status_code == 500
    assert "ZeroDivisionError" in answer.text
    assert "secret detail" not in answer.text and "Traceback" not in answer.text
    assert answer.headers["x-frame-options"] == "DENY"
    client.close()
