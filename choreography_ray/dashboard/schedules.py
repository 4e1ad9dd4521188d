"""The schedules pages: a scope's manifests (next due time, counted failures), its runs, its
dead letters, and the requeue and acknowledge actions behind their confirmations.

Manifests are read from the scheduler's storage with the history the manifest manager reads
(`manifest_manager.gather`) and judged by `cycle.outlook`, the rules the scheduler runs, on the
database's clock. Failures are counted with the running scheduler's `SchedulerOptions` when the
dashboard can ask it (with `--address`), else with the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from choreography_ray.dashboard.actions import ActionRefused, DeadLetterOperation
from choreography_ray.dashboard.site import Site, seconds, site_of
from choreography_ray.scheduler import cycle
from choreography_ray.scheduler.manifest_manager import gather
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt
from choreography_ray.scheduler.status import DeadLetterStatus

#: Runs a runs page shows unless `limit` says otherwise (at most `MAX_RUNS`).
RUNS = 100
MAX_RUNS = 1_000
#: The scope shown when storage has no manifest to name one.
DEFAULT_SCOPE = "default"


def describe(manifest: Manifest) -> str:
    schedule = manifest.schedule
    if isinstance(schedule, Every):
        return f"every {seconds(schedule.interval)}"
    if isinstance(schedule, Cron):
        return f"cron {schedule.expression} ({schedule.tz})"
    if isinstance(schedule, OnceAt):
        return f"once at {schedule.at:%Y-%m-%d %H:%M:%S}"
    assert isinstance(schedule, After)
    return f"after {schedule.parent}"


@dataclass(frozen=True)
class ManifestRow:
    manifest: Manifest
    schedule: str
    outlook: cycle.Outlook
    latest: ManifestRun | None
    #: Counted failures that dead-letter it: its first run and its retries.
    allowed: int


async def _scopes(site: Site, request: Request) -> tuple[str, list[str]]:
    """The scope asked for (else the first that has manifests), and every scope known."""
    known = sorted({scope for scope, _ in await site.scheduler_storage.manifest_keys()})
    scope = request.query_params.get("scope") or (known[0] if known else DEFAULT_SCOPE)
    return scope, sorted({*known, scope})


async def _options(site: Site, scope: str) -> tuple[SchedulerOptions, bool]:
    """The options failures are counted with, and whether they are the running scheduler's."""
    if site.actions is not None:
        running = await site.actions.scheduler_options(scope)
        if running is not None:
            return running, True
    return SchedulerOptions(), False


def _link(path: str, **params: str) -> str:
    shown = {k: v for k, v in params.items() if v}
    return path + (f"?{urlencode(shown)}" if shown else "")


async def manifests_page(request: Request) -> Response:
    site = site_of(request)
    storage = site.scheduler_storage
    scope, scopes = await _scopes(site, request)
    options, from_scheduler = await _options(site, scope)
    now = await storage.now()
    rows = []
    for manifest in await storage.list_manifests(scope):
        history = await gather(storage, manifest, options, now)
        rows.append(ManifestRow(
            manifest, describe(manifest), cycle.outlook(manifest, history, options, now),
            history.runs[0] if history.runs else None, manifest.max_retries + 1,
        ))  # fmt: skip
    context = {"scope": scope, "scopes": scopes, "rows": rows, "db_now": now,
               "from_scheduler": from_scheduler, "link": _link}  # fmt: skip
    return site.render(request, "manifests.html", context)


async def runs_page(request: Request) -> Response:
    site = site_of(request)
    scope, scopes = await _scopes(site, request)
    manifest = request.query_params.get("manifest") or None
    try:
        limit = min(max(int(request.query_params.get("limit") or RUNS), 1), MAX_RUNS)
    except ValueError:
        return site.error(request, 400, "This filter cannot be read", "limit is not a number")
    runs = await site.scheduler_storage.list_runs(scope, manifest, limit)
    context = {"scope": scope, "scopes": scopes, "manifest": manifest, "runs": runs,
               "limit": limit, "link": _link}  # fmt: skip
    return site.render(request, "runs.html", context)


def _dead_letter_status(text: str) -> DeadLetterStatus | None:
    key = text.replace("_", "").lower()
    for status in DeadLetterStatus:
        if key in (status.name.replace("_", "").lower(), status.value.lower()):
            return status
    return None


async def dead_letters_page(request: Request) -> Response:
    site = site_of(request)
    scope, scopes = await _scopes(site, request)
    manifest = request.query_params.get("manifest") or None
    text = request.query_params.get("status", "")
    status = _dead_letter_status(text) if text else None
    if text and status is None:
        names = ", ".join(s.name for s in DeadLetterStatus)
        return site.error(request, 400, "This filter cannot be read",
                          f"{text!r} is not a dead letter status: use one of {names}")  # fmt: skip
    letters = await site.scheduler_storage.list_dead_letters(scope, manifest, status)
    context = {"scope": scope, "scopes": scopes, "manifest": manifest, "letters": letters,
               "status": status, "statuses": list(DeadLetterStatus), "link": _link}  # fmt: skip
    return site.render(request, "dead_letters.html", context)


#: The dead letter id that names every one awaiting intervention (of `?manifest=`, or the scope).
ALL = "all"


async def _dead_letter(site: Site, request: Request) -> DeadLetter | Response | None:
    """The dead letter of the path; None for `ALL`."""
    letter_id = request.path_params["dead_letter_id"]
    if letter_id == ALL:
        return None
    letter = await site.scheduler_storage.get_dead_letter(letter_id)
    if letter is None or letter.scope != request.path_params["scope"]:
        return site.error(request, 404, "No such dead letter", f"There is no dead letter "
                          f"{letter_id} in scope {request.path_params['scope']}.")  # fmt: skip
    return letter


def _operation(request: Request) -> DeadLetterOperation | None:
    try:
        return DeadLetterOperation(request.path_params["operation"])
    except ValueError:
        return None


async def _confirmation(
    site: Site,
    request: Request,
    letter: DeadLetter | None,
    op: DeadLetterOperation,
    refused: ActionRefused | None = None,
    note: str = "",
    manifest: str | None = None,
) -> Response:
    """The confirmation of `op` on `letter`, or (None) on every dead letter awaiting
    intervention of `manifest` or of the scope."""
    scope = request.path_params["scope"]
    awaiting = DeadLetterStatus.AWAITING_INTERVENTION
    bulk = [] if letter else await site.scheduler_storage.list_dead_letters(scope, manifest,
                                                                            awaiting)  # fmt: skip
    context = {"letter": letter, "op": op, "refused": refused, "note": note, "scope": scope,
               "manifest": manifest, "awaiting": len(bulk), "all": ALL,
               "requeue": op is DeadLetterOperation.REQUEUE}  # fmt: skip
    return site.render(request, "confirm_dead_letter.html", context, 409 if refused else 200)


async def confirm_dead_letter(request: Request) -> Response:
    site = site_of(request)
    op = _operation(request)
    if op is None:
        return site.not_a_page(request)
    letter = await _dead_letter(site, request)
    if isinstance(letter, Response):
        return letter
    if site.actions is None:
        return site.no_actions(request)
    manifest = request.query_params.get("manifest") or None
    return await _confirmation(site, request, letter, op, manifest=manifest)


async def do_dead_letter(request: Request) -> Response:
    site = site_of(request)
    op = _operation(request)
    if op is None:
        return site.not_a_page(request)
    form = await request.form()
    actions = site.actions_for(request, form)
    if isinstance(actions, Response):
        return actions
    letter = await _dead_letter(site, request)
    if isinstance(letter, Response):
        return letter
    note = str(form.get("note") or "").strip()
    scope = request.path_params["scope"]
    manifest = str(form.get("manifest") or "") or None
    try:
        if op is DeadLetterOperation.REQUEUE:
            afresh = form.get("ask_afresh") == "on"
            message = await (actions.requeue(scope, letter.id, afresh) if letter
                             else actions.requeue_all(scope, manifest, afresh))  # fmt: skip
        elif not note:
            needed = ActionRefused("NoteRequired", "an acknowledgement needs a note: say why")
            return await _confirmation(site, request, letter, op, needed, manifest=manifest)
        else:
            message = await (actions.acknowledge(scope, letter.id, note) if letter
                             else actions.acknowledge_all(scope, manifest, note))  # fmt: skip
    except ActionRefused as refused:
        return await _confirmation(site, request, letter, op, refused, note, manifest)
    target = _link("/schedules/dead-letters", scope=scope, manifest=manifest or "")
    response = RedirectResponse(target, status_code=303)
    site.flash(response, message)
    return response


routes = [
    Route("/schedules", manifests_page),
    Route("/schedules/runs", runs_page),
    Route("/schedules/dead-letters", dead_letters_page),
    Route("/schedules/{scope}/dead-letters/{dead_letter_id}/{operation}", confirm_dead_letter,
          methods=["GET"]),
    Route("/schedules/{scope}/dead-letters/{dead_letter_id}/{operation}", do_dead_letter,
          methods=["POST"]),
]  # fmt: skip
