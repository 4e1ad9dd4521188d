"""The scheduler's metadata cleanup, carried out against storage by the manifest manager's
cycle every `run_cleanup_interval`: resolved dead letters past `dead_letter_retention` (each
manifest's latest resolution stays), and the runs `retention.doomed` names, with their
decisions, checkpoints and work entries (docs/retention.md, "Scheduler metadata")."""

from __future__ import annotations

from datetime import datetime

from choreography_ray.logs import get_logger
from choreography_ray.scheduler import retention
from choreography_ray.scheduler.lock import lapsed
from choreography_ray.scheduler.options import SchedulerOptions
from choreography_ray.scheduler.records import Manifest
from choreography_ray.storage.scheduler import SchedulerStorage

log = get_logger(__name__)


async def clean_up_runs(
    storage: SchedulerStorage,
    manifest: Manifest,
    options: SchedulerOptions,
    now: datetime,
) -> int:
    """Deletes the runs of `manifest` nothing needs any more; how many."""
    scope, name = manifest.scope, manifest.name
    runs = await storage.list_runs(scope, name, options.runs_kept + retention.CLEANUP_BATCH)
    if len(runs) <= options.runs_kept:
        return 0
    doomed = retention.doomed(
        manifest,
        runs,
        await storage.list_dead_letters(scope, name),
        await storage.queued_entries(scope, name),
        options,
        now,
    )
    return await storage.delete_runs(doomed) if doomed else 0


async def clean_up(
    storage: SchedulerStorage, scope: str, manifests: list[Manifest], options: SchedulerOptions
) -> int:
    """One cleanup pass over the scope; how many runs it deleted. One manifest's failure is
    logged and holds up no other; a lock that lapsed stops the pass."""
    now = await storage.now()
    removed = await storage.remove_resolved_dead_letters(now - options.dead_letter_retention)
    if removed:
        log.info("scheduler/%s: %d resolved dead letter(s) cleaned up", scope, removed)
    deleted = 0
    for manifest in manifests:
        try:
            deleted += await clean_up_runs(storage, manifest, options, now)
        except Exception as error:
            if lapsed(error):
                raise
            log.exception("scheduler/%s: cleaning up the runs of %r failed", scope, manifest.name)
    if deleted:
        log.info("scheduler/%s: %d run(s) past their retention cleaned up", scope, deleted)
    return deleted
