"""Which failed run a retry replays the decisions of, and the replay-at-most-once rule.

The run to replay is read from storage, never from a caller: the manifest's latest finished run,
and only when the next run is a retry of it (it failed and its failure still counts: the same
test that applies the backoff). `retry_link` links it only when every check of the spec's table
holds, and otherwise says which one asked afresh (`AskAfresh`). Asking afresh is never an error.

At dispatch (`dispatch_link`) the link is checked again: an entry naming a run another run
already replays is dispatched without it, and so is one whose manifest has since opted out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from choreography_ray.scheduler.records import Manifest, ManifestRun, WorkEntry
from choreography_ray.scheduler.status import WorkStatus


class AskAfresh(enum.StrEnum):
    """Why a run asks its deciders afresh instead of replaying a failed run's answers."""

    #: The next run is not a retry (the latest finished run did not fail, or its failure no
    #: longer counts), or the caller asked afresh on purpose.
    NOT_A_RETRY = "NotARetry"
    #: The manifest does not replay decisions on retry (`replay_decisions_on_retry`).
    OPTED_OUT = "OptedOut"
    #: The failed run replayed another run's answers rather than asking itself.
    REPLAYED_ANOTHER_RUN = "ReplayedAnotherRun"
    #: A run (in any state) or a queued entry already replays the failed run.
    ALREADY_REPLAYED = "AlreadyReplayed"
    #: A dependent's parent succeeded again since the failed run was dispatched: a new firing.
    NEW_PARENT_SUCCESS = "NewParentSuccess"
    #: The failed run is not a run of the manifest's job type, or recorded no decision.
    NO_DECISIONS = "NoDecisions"
    #: The failed run was not queued with the input and job type the retry is queued with.
    INPUT_CHANGED = "InputChanged"
    #: The caller asked afresh (`ask_afresh=True`).
    ASKED_AFRESH = "AskedAfresh"


@dataclass(frozen=True, slots=True)
class Link:
    """The run whose decisions to replay, or None and the reason the run asks afresh."""

    replays: str | None
    afresh: AskAfresh | None = None


def replayers(
    run_id: str,
    runs: Iterable[ManifestRun],
    entries: Iterable[WorkEntry],
    *,
    besides: Collection[str | None] = (),
) -> list[str]:
    """The runs (any state) and queued entries that use up the one replay of `run_id`. A run
    whose replay was abandoned asked afresh and does not use it up. `besides` are left out."""
    found = [r.id for r in runs if r.replays == run_id and not r.replay_abandoned]
    found += [e.run_id for e in entries if e.replays == run_id and e.status is WorkStatus.QUEUED]
    return [f for f in dict.fromkeys(found) if f not in besides]


def retry_link(
    manifest: Manifest,
    failed: ManifestRun | None,
    *,
    runs: Sequence[ManifestRun],
    queued: Sequence[WorkEntry],
    recorded_decisions: int,
    parent_success: ManifestRun | None = None,
) -> Link:
    """The link of a retry of `failed` (None when the next run is no retry), check by check."""
    if failed is None:
        return Link(None, AskAfresh.NOT_A_RETRY)
    if not manifest.replay_decisions_on_retry:
        return Link(None, AskAfresh.OPTED_OUT)
    if not failed.asked_itself:
        return Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)
    if replayers(failed.id, runs, queued, besides=(failed.id,)):
        return Link(None, AskAfresh.ALREADY_REPLAYED)
    if manifest.parent is not None and parent_succeeded_since(failed, parent_success):
        return Link(None, AskAfresh.NEW_PARENT_SUCCESS)
    if failed.job_type != manifest.job_type or recorded_decisions < 1:
        return Link(None, AskAfresh.NO_DECISIONS)
    if failed.manifest != manifest.name or failed.request != manifest.request:
        return Link(None, AskAfresh.INPUT_CHANGED)
    return Link(failed.id)


def parent_succeeded_since(failed: ManifestRun, parent_success: ManifestRun | None) -> bool:
    """A dependent's parent succeeded again since `failed` was dispatched: a new firing."""
    if parent_success is None or parent_success.ended_at is None:
        return False
    if failed.parent_run is not None and failed.parent_run == parent_success.id:
        return False
    return parent_success.ended_at > failed.dated


def dispatch_link(entry: WorkEntry, manifest: Manifest | None, runs: Iterable[ManifestRun]) -> Link:
    """The link an entry keeps when it is claimed: dropped when another run already replays
    the run it names (replay at most once) or the manifest opted out since it was queued. The
    run an operator's requeue queues again (`entry.requeues`) is not another: a requeue of a
    replay that never ran took its link over."""
    if entry.replays is None:
        return Link(None, AskAfresh.NOT_A_RETRY)
    opted_out = manifest is not None and not manifest.replay_decisions_on_retry
    if opted_out and entry.kind.holds_manifest_key:
        return Link(None, AskAfresh.OPTED_OUT)
    if replayers(entry.replays, runs, (), besides=(entry.run_id, entry.requeues)):
        return Link(None, AskAfresh.ALREADY_REPLAYED)
    return Link(entry.replays)


def requeue_source(target: ManifestRun) -> str | None:
    """The run whose answers a requeue of `target` replays: its own when it asked itself; a
    run queued to replay that never started hands on its kept link, so a requeue follows it to
    the answers it never replayed. None for a run that ran replaying another's answers: they
    were replayed once (a requeue of it asks afresh)."""
    if target.asked_itself:
        return target.id
    return target.replays if target.started_at is None else None


def same_input(manifest: Manifest, run: ManifestRun) -> bool:
    """`run` was queued by `manifest` with the job type and request its next run is queued
    with: what a replay and a resume of `run` need."""
    ours = (manifest.name, manifest.job_type, manifest.request)
    return (run.manifest, run.job_type, run.request) == ours


def requeue_link(
    target: ManifestRun,
    *,
    runs: Iterable[ManifestRun],
    queued: Iterable[WorkEntry],
    recorded_decisions: int,
    ask_afresh: bool,
    manifest: Manifest | None = None,
) -> Link:
    """The link of a requeue of `target` (a dead letter's run, or `requeue_execution`);
    `recorded_decisions` counts those of `requeue_source(target)`. A dead letter's requeue
    passes `manifest`, whose current job type and request it runs: a retry's checks apply
    too, so the manifest's opt-out, or an input edited since `target`, asks afresh."""
    if ask_afresh:
        return Link(None, AskAfresh.ASKED_AFRESH)
    if manifest is not None and not manifest.replay_decisions_on_retry:
        return Link(None, AskAfresh.OPTED_OUT)
    if manifest is not None and not same_input(manifest, target):
        return Link(None, AskAfresh.INPUT_CHANGED)
    source = requeue_source(target)
    if source is None:
        return Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)
    if replayers(source, runs, queued, besides=(target.id,)):
        return Link(None, AskAfresh.ALREADY_REPLAYED)
    if recorded_decisions < 1:
        return Link(None, AskAfresh.NO_DECISIONS)
    return Link(source)


def already_replayed_message(run_id: str) -> str:
    return (
        f"It asks its deciders afresh: the decisions of execution {run_id} are already replayed "
        "by another run or queued entry, and are replayed once."
    )


def opt_out_message(cleared: int) -> str:
    """What `set_replay_decisions_on_retry(names, False)` answers."""
    return f"{cleared} queued retry(s) no longer replay a failed run's decisions."


def opt_in_message(manifests: int) -> str:
    return f"{manifests} manifest(s) replay a failed run's decisions on retry."
