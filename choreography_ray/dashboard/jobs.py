"""The jobs pages: the list at `/`, a job at `/jobs/{job_id}` with its live fragment, and the
job actions behind their confirmations.

The list is one page of `Storage.find_jobs` (newest first, paged by cursor) and one
`count_jobs_by_type_and_status` for the counts at the top: two indexed queries whatever the
number of jobs. A job page reads the job record (its counters and status history), its failure
clusters (`failure_clusters`, when it counts failures), one page of its failed steps
(`list_steps` by status, or `list_failed` of one signature with `?signature=`, in step-id
order), how many step outputs it stored (`count_outputs`) and the scheduler run it belongs to.

`/jobs/{job_id}/outputs.jsonl` downloads the job's first outputs (`?limit=`, `?stage=`) as
the JSON lines `choreography-ray jobs outputs` writes, streamed a page of `list_outputs` at a
time: the dashboard holds one page, however many it sends.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from choreography_ray.core.stopping import settled
from choreography_ray.dashboard.actions import ActionRefused, JobOperation
from choreography_ray.dashboard.site import Site, site_of
from choreography_ray.model import JobState, utcnow
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.storage import JobCursor, JobFilter, Storage, StoredOutput

#: Jobs per page of the list, unless `limit` says otherwise (at most `MAX_PAGE`).
PAGE = 50
MAX_PAGE = 500
#: Failed steps per page of a job's failed steps.
FAILED_PAGE = 25
#: The failed steps a job page lists: failures and the steps a failure made unreachable.
FAILED_SHOWN = FAILED_STEP | {StepStatus.UNREACHABLE}
#: Failure clusters a job page lists, most frequent first.
CLUSTERS_SHOWN = 20
#: Characters of a job's request shown on its page; the whole is at `request.json`.
REQUEST_SHOWN = 64 * 1024
#: Milliseconds between two refreshes of a job page's live part.
LIVE_EVERY_MS = 1000
#: Outputs `outputs.jsonl` sends unless `limit` says otherwise, and at most.
OUTPUTS_SENT = 10_000
MAX_OUTPUTS_SENT = 100_000
#: Outputs read from storage (and sent) at a time by `outputs.jsonl`.
OUTPUTS_PAGE = 1_000

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

OPERATIONS = {
    JobOperation.STOP: (
        "Stop",
        "Running steps are told to stop and no new step starts. A stopped job can be resumed.",
    ),
    JobOperation.RESUME: (
        "Resume",
        "The job runs again from its stored plan: steps without an outcome start again.",
    ),
    JobOperation.RETRY_FAILED: (
        "Retry failed steps",
        "Every failed step runs again as its next attempt (for a job that completed with "
        "failures, of a job type that allows it).",
    ),
    JobOperation.REMOVE: (
        "Remove",
        "The job and all its records (steps, counted steps, the job itself) are deleted. This "
        "cannot be undone.",
    ),
}


class BadQuery(ValueError):
    """A filter the list cannot read."""


def parse_status(text: str) -> JobStatus | None:
    """A job status by member name or stored value, in any case; "" for any status."""
    if not text:
        return None
    key = text.replace("_", "").replace("-", "").lower()
    for status in JobStatus:
        if key in (status.name.replace("_", "").lower(), status.value.lower()):
            return status
    names = ", ".join(s.name for s in JobStatus)
    raise BadQuery(f"{text!r} is not a job status: use one of {names}")


def parse_since(text: str, now: datetime) -> datetime | None:
    """ "24h", "30m", "7d" before `now`, or a date or time (ISO-8601, UTC unless it says)."""
    text = text.strip()
    if not text:
        return None
    if match := _RELATIVE.match(text.lower()):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise BadQuery(f"{text!r} is not a time: use 24h, 7d, 2026-12-01 or "
                       "2026-12-01T08:00") from None  # fmt: skip
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def parse_cursor(text: str) -> JobCursor | None:
    if not text:
        return None
    created, _, job_id = text.partition("/")
    try:
        return JobCursor(datetime.fromisoformat(created), job_id)
    except ValueError:
        raise BadQuery(f"{text!r} is not a place in the list") from None


def cursor_text(job: JobState) -> str:
    return f"{job.created.isoformat()}/{job.id}"


@dataclass(frozen=True)
class JobsQuery:
    """The list's filters and place, as its URL has them."""

    status: str = ""
    type: str = ""
    scope: str = ""
    namespace: str = ""
    since: str = ""
    before: str = ""
    after: str = ""
    limit: int = PAGE
    where: JobFilter = field(default_factory=JobFilter, compare=False)

    @classmethod
    def parse(cls, params: Mapping[str, str], now: datetime) -> JobsQuery:
        text = {name: params.get(name, "").strip() for name in
                ("status", "type", "scope", "namespace", "since", "before", "after")}  # fmt: skip
        try:
            limit = min(max(int(params.get("limit") or PAGE), 1), MAX_PAGE)
        except ValueError:
            raise BadQuery(f"limit {params.get('limit')!r} is not a number") from None
        status = parse_status(text["status"])
        where = JobFilter(
            scope=text["scope"] or None,
            namespace=text["namespace"] or None,
            statuses=None if status is None else frozenset({status}),
            type=text["type"] or None,
            created_since=parse_since(text["since"], now),
        )
        parse_cursor(text["before"])
        parse_cursor(text["after"])
        return cls(**text, limit=limit, where=where)

    def link(self, **changes: str | int) -> str:
        """This list's URL with `changes`."""
        # A new place drops the old one; a filter change starts at the newest page.
        changes = {"before": "", "after": "", **changes}
        values = {**self.params(), **changes}
        shown = {k: v for k, v in values.items() if v not in ("", None) and
                 not (k == "limit" and v == PAGE)}  # fmt: skip
        return "/" + (f"?{urlencode(shown)}" if shown else "")

    def params(self) -> dict[str, str | int]:
        return {"status": self.status, "type": self.type, "scope": self.scope,
                "namespace": self.namespace, "since": self.since, "before": self.before,
                "after": self.after, "limit": self.limit}  # fmt: skip


@dataclass(frozen=True)
class Listing:
    jobs: list[JobState]
    newer: str | None
    older: str | None
    #: Jobs per status under every filter but the status.
    counts: dict[JobStatus, int]
    #: The job types stored under the filters but the type and the status.
    types: list[str]


async def read_listing(site: Site, query: JobsQuery) -> Listing:
    where, limit = query.where, query.limit
    before, after = parse_cursor(query.before), parse_cursor(query.after)
    found = await site.storage.find_jobs(where, before=before, after=after, limit=limit + 1)
    more = len(found) > limit
    if after is not None:
        jobs, has_newer, has_older = (found[1:] if more else found), more, True
    else:
        jobs, has_newer, has_older = found[:limit], before is not None, more
    newer = query.link(after=cursor_text(jobs[0])) if has_newer and jobs else None
    older = query.link(before=cursor_text(jobs[-1])) if has_older and jobs else None
    if has_newer and not jobs:
        newer = query.link(status=query.status)
    unsorted = replace(where, statuses=None, type=None)
    tally = await site.storage.count_jobs_by_type_and_status(unsorted)
    counts: dict[JobStatus, int] = {}
    for (job_type, status), n in tally.items():
        if where.type is None or job_type == where.type:
            counts[status] = counts.get(status, 0) + n
    ordered = {s: counts[s] for s in JobStatus if counts.get(s)}
    return Listing(jobs, newer, older, ordered, sorted({t for t, _ in tally}))


async def jobs_page(request: Request) -> Response:
    site = site_of(request)
    try:
        query = JobsQuery.parse(request.query_params, utcnow())
    except BadQuery as error:
        return site.error(request, 400, "This filter cannot be read", str(error))
    listing = await read_listing(site, query)
    keys = await site.storage.list_manager_keys()
    context = {
        "query": query,
        "listing": listing,
        "statuses": list(JobStatus),
        "scopes": sorted({k.scope for k in keys}),
        "namespaces": sorted({k.namespace for k in keys}),
        "total": sum(listing.counts.values()),
        "operations": OPERATIONS,
    }
    return site.render(request, "jobs.html", context)


async def _job(site: Site, request: Request) -> JobState | Response:
    job_id = request.path_params["job_id"]
    state = await site.storage.get_job(job_id)
    if state is None:
        return site.error(request, 404, "No such job", f"There is no job {job_id} in "
                          f"{site.storage_shown}.")  # fmt: skip
    return state


def failed_link(job_id: str, signature: str | None = None, after: str | None = None) -> str:
    """A job page at a page of its failed steps (of one failure signature, when given)."""
    query = {k: v for k, v in (("signature", signature), ("steps_after", after)) if v}
    return f"/jobs/{job_id}" + (f"?{urlencode(query)}" if query else "")


async def job_page(request: Request) -> Response:
    site = site_of(request)
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    steps_after = request.query_params.get("steps_after") or None
    signature = request.query_params.get("signature") or None
    if signature is None:
        failed = await site.storage.list_steps(
            state.id, statuses=FAILED_SHOWN, after=steps_after, limit=FAILED_PAGE + 1
        )
    else:
        failed = await site.storage.list_failed(
            state.id, signature, after=steps_after, limit=FAILED_PAGE + 1
        )
    more = len(failed) > FAILED_PAGE
    failed = failed[:FAILED_PAGE]
    clusters = await site.storage.failure_clusters(state.id) if state.progress.has_failures else []
    failed_total = state.progress.failed_steps + state.progress.unreachable_steps
    if signature is not None:
        failed_total = sum(c.count for c in clusters if c.signature == signature)
    request_json = json.dumps(state.request, indent=2, ensure_ascii=False)
    pools = [] if site.actions is None or settled(state) else await site.actions.job_pools(state.id)
    context = {
        "job": state,
        "pools": pools,
        "pace": site.rates.pace(state),
        "live_every": LIVE_EVERY_MS,
        "clusters": clusters[:CLUSTERS_SHOWN],
        "clusters_total": len(clusters),
        # The jobs manager retries only a job that completed with failures; it refuses a job
        # type that does not allow it (`can_retry_failed_steps`), which the page cannot know.
        "retry_clusters": state.status is JobStatus.COMPLETED_WITH_FAILURES,
        "signature": signature,
        "failed": failed,
        "failed_total": failed_total,
        "failed_first": steps_after is None,
        "failed_home": failed_link(state.id, signature),
        "failed_next": failed_link(state.id, signature, failed[-1].step_id) if more else None,
        "run": await site.scheduler_storage.run_for_job(state.id),
        "outputs": await site.storage.count_outputs(state.id),
        "outputs_sent": OUTPUTS_SENT,
        "request_json": request_json[:REQUEST_SHOWN],
        "request_cut": len(request_json) > REQUEST_SHOWN,
        "operations": OPERATIONS,
    }
    return site.render(request, "job.html", context)


async def job_live(request: Request) -> Response:
    """The live part of a job page, which the page's script swaps in every second."""
    site = site_of(request)
    state = await site.storage.get_job(request.path_params["job_id"])
    context = {"job": state, "pace": None if state is None else site.rates.pace(state),
               "live_every": LIVE_EVERY_MS}  # fmt: skip
    response = site.render(request, "_live.html", context)
    response.headers["cache-control"] = "no-store"
    return response


async def job_request(request: Request) -> Response:
    site = site_of(request)
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    return JSONResponse(state.request)


def _optional_int(params: Mapping[str, str], name: str) -> int | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise BadQuery(f"{name} {text!r} is not a number") from None


def output_line(stored: StoredOutput) -> str:
    """One output as a line of `outputs.jsonl`: the line `choreography-ray jobs outputs`
    writes."""
    row = {"job_id": stored.job_id, "step_id": stored.step_id, "stage": stored.stage,
           "attempt": stored.attempt, "output": json.loads(stored.output)}  # fmt: skip
    return json.dumps(row) + "\n"


async def output_lines(
    storage: Storage, job_id: str, stage: int | None, limit: int
) -> AsyncIterator[bytes]:
    """The job's first `limit` outputs (of `stage`) in step-id order, a page at a time."""
    after: str | None = None
    left = limit
    while left > 0:
        asked = min(OUTPUTS_PAGE, left)
        page = await storage.list_outputs(job_id, stage=stage, after=after, limit=asked)
        if page:
            yield "".join(output_line(stored) for stored in page).encode()
        if len(page) < asked:
            return
        left -= len(page)
        after = page[-1].step_id


async def job_outputs(request: Request) -> Response:
    """`outputs.jsonl`: the job's first `limit` outputs (of `stage`), as JSON lines."""
    site = site_of(request)
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    try:
        limit = _optional_int(request.query_params, "limit")
        stage = _optional_int(request.query_params, "stage")
    except BadQuery as error:
        return site.error(request, 400, "This download cannot be read", str(error))
    limit = min(max(OUTPUTS_SENT if limit is None else limit, 1), MAX_OUTPUTS_SENT)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", state.id)
    if stage is not None:
        name = f"{name}-stage-{stage}"
    headers = {"content-disposition": f'attachment; filename="{name}-outputs.jsonl"',
               "cache-control": "no-store"}  # fmt: skip
    lines = output_lines(site.storage, state.id, stage, limit)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers=headers)


def _operation(request: Request) -> JobOperation | None:
    try:
        return JobOperation(request.path_params["operation"])
    except ValueError:
        return None


async def confirm_job_operation(request: Request) -> Response:
    site = site_of(request)
    op = _operation(request)
    if op is None:
        return site.not_a_page(request)
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    if site.actions is None:
        return site.no_actions(request)
    return _confirmation(site, request, state, op)


def _confirmation(
    site: Site,
    request: Request,
    state: JobState,
    op: JobOperation,
    refused: ActionRefused | None = None,
) -> Response:
    label, explanation = OPERATIONS[op]
    context = {"job": state, "op": op, "label": label, "explanation": explanation,
               "refused": refused}  # fmt: skip
    return site.render(request, "confirm_job.html", context, 409 if refused else 200)


def _retry_failures_confirmation(
    site: Site,
    request: Request,
    state: JobState,
    signature: str,
    count: int,
    refused: ActionRefused | None = None,
) -> Response:
    explanation = (f"The {count:,} failed step(s) of this failure signature run again as their "
                   "next attempt (for a job that completed with failures, of a job type that "
                   "allows it).")  # fmt: skip
    context = {"job": state, "op": JobOperation.RETRY_FAILED, "label": "Retry these failed steps",
               "explanation": explanation, "refused": refused, "signature": signature,
               "action": f"/jobs/{state.id}/failures/retry"}  # fmt: skip
    return site.render(request, "confirm_job.html", context, 409 if refused else 200)


async def _cluster_size(site: Site, job_id: str, signature: str) -> int:
    return sum(c.count for c in await site.storage.failure_clusters(job_id)
               if c.signature == signature)  # fmt: skip


async def confirm_retry_failures(request: Request) -> Response:
    """The confirmation of "Retry these": the failed steps of one failure signature."""
    site = site_of(request)
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    if site.actions is None:
        return site.no_actions(request)
    signature = request.query_params.get("signature", "")
    if not signature:
        return site.error(request, 400, "No failure signature", "?signature= names the failed "
                          "steps to retry, as the job page's Failures list them.")  # fmt: skip
    count = await _cluster_size(site, state.id, signature)
    return _retry_failures_confirmation(site, request, state, signature, count)


async def retry_failures(request: Request) -> Response:
    site = site_of(request)
    form = await request.form()
    actions = site.actions_for(request, form)
    if isinstance(actions, Response):
        return actions
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    signature = str(form.get("signature") or "")
    if not signature:
        return site.error(request, 400, "No failure signature", "The form named no failure "
                          "signature to retry.")  # fmt: skip
    try:
        message = await actions.retry_failures(state.scope, state.namespace, state.id, signature)
    except ActionRefused as refused:
        count = await _cluster_size(site, state.id, signature)
        return _retry_failures_confirmation(site, request, state, signature, count, refused)
    response = RedirectResponse(f"/jobs/{state.id}", status_code=303)
    site.flash(response, message)
    return response


async def do_job_operation(request: Request) -> Response:
    site = site_of(request)
    op = _operation(request)
    if op is None:
        return site.not_a_page(request)
    form = await request.form()
    actions = site.actions_for(request, form)
    if isinstance(actions, Response):
        return actions
    state = await _job(site, request)
    if isinstance(state, Response):
        return state
    try:
        message = await actions.operate(state.scope, state.namespace, state.id, op)
    except ActionRefused as refused:
        return _confirmation(site, request, state, op, refused)
    target = "/" if op is JobOperation.REMOVE else f"/jobs/{state.id}"
    response = RedirectResponse(target, status_code=303)
    site.flash(response, message)
    return response


routes = [
    Route("/", jobs_page),
    Route("/jobs/{job_id}", job_page),
    Route("/jobs/{job_id}/live", job_live),
    Route("/jobs/{job_id}/request.json", job_request),
    Route("/jobs/{job_id}/outputs.jsonl", job_outputs),
    Route("/jobs/{job_id}/failures/retry", confirm_retry_failures, methods=["GET"]),
    Route("/jobs/{job_id}/failures/retry", retry_failures, methods=["POST"]),
    Route("/jobs/{job_id}/{operation}", confirm_job_operation, methods=["GET"]),
    Route("/jobs/{job_id}/{operation}", do_job_operation, methods=["POST"]),
]
