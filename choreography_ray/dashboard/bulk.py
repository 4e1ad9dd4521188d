"""The bulk form at `/bulk`: one operation on every job a filter selects, previewed first.

`GET /bulk` reads the filters (status, type, scope, namespace, older than: the time since a job
reached its status) and lists the jobs they select, as a dry run: through
`choreography_ray.bulk.select_jobs`, the selection of the CLI's bulk form and of
`jobs.act_on_jobs`. Its form carries the ids it listed; `POST /bulk` selects again and acts on
the jobs both selections hold, so a confirmation never reaches a job the user did not see. Each
job goes through `Actions.operate` in turn; a refusal is listed and the others still run. The
guard is a single job action's: CSRF, the token or a session, and no action when read only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from choreography_ray.bulk import JobSelection, select_jobs
from choreography_ray.dashboard.actions import ActionRefused, JobOperation
from choreography_ray.dashboard.jobs import OPERATIONS, BadQuery, parse_since, parse_status
from choreography_ray.dashboard.site import Site, site_of
from choreography_ray.model import JobState, utcnow
from choreography_ray.status import JobStatus

#: The most jobs one confirmation acts on: narrow the filters for more.
MAX_JOBS = 500
FILTERS = ("op", "status", "type", "scope", "namespace", "older_than")


@dataclass(frozen=True)
class BulkForm:
    """The form's fields as given, and the selection they make (None without a filter that
    selects: a status, a type or an age)."""

    fields: dict[str, str]
    op: JobOperation
    selection: JobSelection | None

    @classmethod
    def parse(cls, params: Mapping[str, object]) -> BulkForm:
        fields = {name: str(params.get(name) or "").strip() for name in FILTERS}
        try:
            op = JobOperation(fields["op"] or JobOperation.STOP)
        except ValueError:
            raise BadQuery(f"{fields['op']!r} is not an operation") from None
        status = parse_status(fields["status"])
        fields["status"] = "" if status is None else status.name
        now = utcnow()
        since = parse_since(fields["older_than"], now)
        if since is not None and since > now:
            raise BadQuery(f"{fields['older_than']!r} is in the future")
        if status is None and not fields["type"] and since is None:
            return cls(fields, op, None)
        selection = JobSelection(
            scope=fields["scope"] or None,
            namespace=fields["namespace"] or None,
            types={fields["type"]} if fields["type"] else None,
            statuses=None if status is None else {status},
            older_than=None if since is None else now - since,
        )
        return cls(fields, op, selection)


@dataclass(frozen=True)
class Outcome:
    """What the operation did to one job: `message` when done, else `refused`."""

    job_id: str
    message: str = ""
    refused: ActionRefused | None = None


async def _page(
    site: Site, request: Request, form: BulkForm, results: list[Outcome] | None = None
) -> Response:
    jobs: list[JobState] = []
    if form.selection is not None and results is None:
        jobs = await select_jobs(site.storage, form.selection)
    keys = await site.storage.list_manager_keys()
    label, explanation = OPERATIONS[form.op]
    context = {
        "form": form.fields, "op": form.op, "label": label, "explanation": explanation,
        "operations": OPERATIONS, "selecting": form.selection is not None,
        "jobs": jobs[:MAX_JOBS], "selected": len(jobs), "max_jobs": MAX_JOBS,
        "results": results, "statuses": list(JobStatus),
        "scopes": sorted({k.scope for k in keys}),
        "namespaces": sorted({k.namespace for k in keys}),
    }  # fmt: skip
    return site.render(request, "bulk.html", context)


async def bulk_page(request: Request) -> Response:
    site = site_of(request)
    if site.actions is None:
        return site.no_actions(request)
    try:
        form = BulkForm.parse(request.query_params)
    except BadQuery as error:
        return site.error(request, 400, "This filter cannot be read", str(error))
    return await _page(site, request, form)


async def do_bulk(request: Request) -> Response:
    site = site_of(request)
    posted: FormData = await request.form()
    actions = site.actions_for(request, posted)
    if isinstance(actions, Response):
        return actions
    try:
        form = BulkForm.parse(posted)
    except BadQuery as error:
        return site.error(request, 400, "This filter cannot be read", str(error))
    previewed = {str(job_id) for job_id in posted.getlist("job")}
    if form.selection is None or not previewed or len(previewed) > MAX_JOBS:
        return site.error(request, 400, "Nothing to act on", "Preview the jobs (at most "
                          f"{MAX_JOBS:,}), then confirm.")  # fmt: skip
    selected = [j for j in await select_jobs(site.storage, form.selection) if j.id in previewed]
    results: list[Outcome] = []
    for job in selected:
        try:
            message = await actions.operate(job.scope, job.namespace, job.id, form.op)
        except ActionRefused as refused:
            results.append(Outcome(job.id, refused=refused))
        else:
            results.append(Outcome(job.id, message))
    gone = ActionRefused("NoLongerSelected", "the filters no longer select it")
    results += [Outcome(job_id, refused=gone) for job_id in
                sorted(previewed - {j.id for j in selected})]  # fmt: skip
    return await _page(site, request, form, results)


routes = [
    Route("/bulk", bulk_page, methods=["GET"]),
    Route("/bulk", do_bulk, methods=["POST"]),
]
