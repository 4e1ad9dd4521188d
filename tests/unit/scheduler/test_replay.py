"""Decision replay: the spec's table of checks ("It links the retry only when all of these
hold"), replay at most once, replay_abandoned, the dispatch-time check, requeues, the opt-out."""

from __future__ import annotations

from datetime import timedelta

import pytest

from choreography_ray.scheduler import replay
from choreography_ray.scheduler.records import WorkEntry
from choreography_ray.scheduler.replay import AskAfresh, Link
from choreography_ray.scheduler.schedules import After
from choreography_ray.scheduler.status import EntryKind, RunStatus, WorkStatus
from tests.unit.scheduler.factory import T0, failed, manifest, run, succeeded

MINUTE = timedelta(minutes=1)


def link(m=None, bad=None, runs=(), queued=(), decisions=1, parent=None):  # type: ignore[no-untyped-def]
    bad = bad or failed(T0)
    return replay.retry_link(
        m or manifest(), bad, runs=[bad, *runs], queued=list(queued),
        recorded_decisions=decisions, parent_success=parent,
    )  # fmt: skip


def test_all_checks_hold__the_retry_replays_the_failed_run() -> None:
    bad = failed(T0)
    assert link(bad=bad) == Link(bad.id)


def test_check__the_manifest_replays_decisions_on_retry() -> None:
    assert link(manifest(replay_decisions_on_retry=False)) == Link(None, AskAfresh.OPTED_OUT)


def test_check__the_failed_run_asked_its_deciders_itself() -> None:
    bad = failed(T0, replays="older")
    assert link(bad=bad) == Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)


def test_check__a_replay_that_never_started_still_counts_as_the_one_replay() -> None:
    # Queued to replay "older", its dispatch ran out of attempts: it keeps its link.
    never_ran = failed(T0, replays="older", started_at=None, dispatch_attempts=5)
    assert link(bad=never_ran) == Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)


def test_check__an_abandoned_replay_asked_itself_and_may_be_replayed_once() -> None:
    abandoned = failed(T0, replays="older", replay_abandoned=True)
    assert link(bad=abandoned) == Link(abandoned.id)


@pytest.mark.parametrize("status", list(RunStatus))
def test_check__no_run_in_any_state_replays_the_failed_run(status: RunStatus) -> None:
    bad = failed(T0 - MINUTE)
    other = run(status, T0, replays=bad.id)
    assert link(bad=bad, runs=[other]) == Link(None, AskAfresh.ALREADY_REPLAYED)


def test_check__an_abandoned_replay_does_not_use_up_the_run_it_names() -> None:
    bad = failed(T0 - MINUTE)
    other = run(RunStatus.FAILED, T0, replays=bad.id, replay_abandoned=True)
    assert link(bad=bad, runs=[other]) == Link(bad.id)


def test_check__no_queued_entry_replays_the_failed_run() -> None:
    bad = failed(T0)
    entry = WorkEntry(scope="s", manifest="m", run_id="r2", replays=bad.id)
    assert link(bad=bad, queued=[entry]) == Link(None, AskAfresh.ALREADY_REPLAYED)
    dispatched = entry.model_copy(update={"status": WorkStatus.DISPATCHED})
    assert link(bad=bad, queued=[dispatched]) == Link(bad.id)


def test_check__a_dependents_parent_has_not_succeeded_again_since_the_dispatch() -> None:
    m = manifest(schedule=After(parent="p"))
    first = succeeded(T0 - 10 * MINUTE, manifest_name="p")
    bad = failed(T0, parent_run=first.id, dispatched_at=T0)
    assert link(m, bad, parent=first) == Link(bad.id)
    again = succeeded(T0 + MINUTE, manifest_name="p")
    assert link(m, bad, parent=again) == Link(None, AskAfresh.NEW_PARENT_SUCCESS)


def test_check__a_run_of_the_manifests_job_type_that_recorded_decisions() -> None:
    assert link(decisions=0) == Link(None, AskAfresh.NO_DECISIONS)
    other_type = failed(T0, job_type="pkg.jobs:Other")
    assert link(bad=other_type) == Link(None, AskAfresh.NO_DECISIONS)


def test_check__queued_with_exactly_the_input_the_retry_is_queued_with() -> None:
    edited = manifest(request={"index": "other"})
    assert link(edited) == Link(None, AskAfresh.INPUT_CHANGED)


def test_no_retry__asks_afresh() -> None:
    assert replay.retry_link(manifest(), None, runs=[], queued=[], recorded_decisions=3) == Link(
        None, AskAfresh.NOT_A_RETRY
    )


def test_replays_at_most_once_in_a_row() -> None:
    """A retry that replayed into a failure is not replayed again: the next retry asks afresh."""
    first = failed(T0 - 2 * MINUTE)
    second = failed(T0 - MINUTE, replays=first.id, is_retry=True)
    assert link(bad=second, runs=[first]) == Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)
    third = failed(T0, is_retry=True)
    assert link(bad=third, runs=[first, second]) == Link(third.id)


def test_dispatch__an_entry_naming_a_run_another_run_replays_drops_its_link() -> None:
    source = failed(T0 - MINUTE)
    entry = WorkEntry(scope="s", manifest="m", run_id="mine", replays=source.id)
    assert replay.dispatch_link(entry, manifest(), [source]) == Link(source.id)
    other = run(RunStatus.RUNNING, T0, replays=source.id)
    assert replay.dispatch_link(entry, manifest(), [source, other]) == Link(
        None, AskAfresh.ALREADY_REPLAYED
    )
    mine = run(RunStatus.QUEUED, T0, replays=source.id, id="mine")
    assert replay.dispatch_link(entry, manifest(), [source, mine]) == Link(source.id)


def test_dispatch__the_flag_is_checked_again_when_the_entry_is_claimed() -> None:
    entry = WorkEntry(scope="s", manifest="m", run_id="r", replays="x")
    opted_out = manifest(replay_decisions_on_retry=False)
    assert replay.dispatch_link(entry, opted_out, []) == Link(None, AskAfresh.OPTED_OUT)
    requeue = entry.model_copy(update={"kind": EntryKind.REQUEUE_EXECUTION})
    assert replay.dispatch_link(requeue, opted_out, []) == Link("x")


def test_requeue__links_the_run_unless_asked_afresh_or_replayed_already() -> None:
    target = failed(T0)
    kwargs = {"runs": [target], "queued": [], "recorded_decisions": 1}
    assert replay.requeue_link(target, ask_afresh=False, **kwargs) == Link(target.id)  # type: ignore[arg-type]
    afresh = replay.requeue_link(target, ask_afresh=True, **kwargs)  # type: ignore[arg-type]
    assert afresh == Link(None, AskAfresh.ASKED_AFRESH)
    retry = run(RunStatus.QUEUED, T0, replays=target.id)
    taken = replay.requeue_link(
        target, runs=[target, retry], queued=[], recorded_decisions=1, ask_afresh=False
    )
    assert taken == Link(None, AskAfresh.ALREADY_REPLAYED)


def test_requeue__of_a_replay_that_never_ran_follows_its_kept_link() -> None:
    source = failed(T0 - MINUTE)
    never_ran = failed(T0, replays=source.id, started_at=None)
    assert replay.requeue_source(never_ran) == source.id
    found = replay.requeue_link(
        never_ran, runs=[source, never_ran], queued=[], recorded_decisions=1, ask_afresh=False
    )
    assert found == Link(source.id)


def test_requeue__of_a_run_that_ran_replaying_asks_afresh() -> None:
    source = failed(T0 - MINUTE)
    replayed = failed(T0, replays=source.id)
    assert replay.requeue_source(replayed) is None
    found = replay.requeue_link(
        replayed, runs=[source, replayed], queued=[], recorded_decisions=1, ask_afresh=False
    )
    assert found == Link(None, AskAfresh.REPLAYED_ANOTHER_RUN)


def test_dispatch__a_requeue_of_a_replay_that_never_ran_took_its_link_over() -> None:
    never_ran = failed(T0, replays="x", started_at=None)
    entry = WorkEntry(scope="s", manifest="m", run_id="r", replays="x",
                      kind=EntryKind.REQUEUE_EXECUTION, requeues=never_ran.id)  # fmt: skip
    assert replay.dispatch_link(entry, manifest(), [never_ran]) == Link("x")
    other = entry.model_copy(update={"requeues": None})
    assert replay.dispatch_link(other, manifest(), [never_ran]).replays is None


def test_messages_are_the_specs() -> None:
    assert replay.opt_out_message(2) == (
        "2 queued retry(s) no longer replay a failed run's decisions."
    )
    assert replay.already_replayed_message("42").startswith(
        "It asks its deciders afresh: the decisions of execution 42 are already replayed by "
        "another run or queued entry, and are replayed once."
    )
