"""The table of step runs (`core/window.py`): one row per step, in exactly one state, the
window and the throttle counted from it, retries waiting for their delay."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from choreography_ray.core.messages import StepStart
from choreography_ray.core.window import IN_FLIGHT, RunState, Window
from choreography_ray.options import JobsOptions

pytestmark = pytest.mark.timeout(10)


def start(step_id: str, attempt: int = 1) -> StepStart:
    return StepStart(step_id, "tests:Step", 0, attempt, '{"n": 1}')


def window(**options: object) -> Window:
    made = Window(JobsOptions(**options))  # type: ignore[arg-type]
    made.configure(None)
    return made


def states(w: Window) -> dict[str, RunState]:
    return {step_id: run.state for step_id, run in w.runs.items()}


def test_window__the_window_and_the_throttle_count_steps_in_flight() -> None:
    w = window(max_active_steps_per_job=3, max_concurrent_step_starts=2, step_batch_size=10)
    w.queue([start(s) for s in "abcde"])

    first = w.next_batch()
    assert [s.step_id for s in first] == ["a", "b"], "two being started at once"
    w.started(first, "host-0")
    assert w.next_batch() == []
    w.answered(first, ok=True)
    assert [s.step_id for s in w.next_batch()] == ["c"], "three in flight at once"
    assert states(w) == {"a": RunState.ACTIVE, "b": RunState.ACTIVE, "c": RunState.STARTING,
                         "d": RunState.QUEUED, "e": RunState.QUEUED}  # fmt: skip
    assert w.take("a", 1) == (start("a"), "host-0")
    assert w.take("a", 1) is None, "counted once"
    assert [s.step_id for s in w.next_batch()] == ["d"]


def test_window__a_failed_start_waits_and_goes_back_to_the_front_of_the_line() -> None:
    w = window(step_batch_size=1)
    w.queue([start("a"), start("b")])
    batch = w.next_batch()
    w.started(batch, "host-0")
    w.answered(batch, ok=False)
    assert w.failed_starts() == [start("a")]

    w.queue(w.failed_starts(), front=True)
    assert [s.step_id for s in w.next_batch()] == ["a"]
    assert w.count(RunState.START_FAILED) == 0


def test_window__a_retry_waits_for_its_delay_then_starts_first_as_a_retry() -> None:
    w = window()
    w.queue([start("b")])
    w.wait_retry(start("a", attempt=2), 0.0)
    w.wait_retry(start("c"), 60.0)

    w.retry_due()
    assert states(w) == {"a": RunState.QUEUED, "b": RunState.QUEUED, "c": RunState.RETRY_WAIT}
    due_in = w.next_due_in()
    assert due_in is not None and 59.0 < due_in <= 60.0
    batch = w.next_batch()
    assert batch[0] == start("a", attempt=3), "the next attempt, first in line"
    assert w.runs["a"].retry
    w.started(batch, "host-0")
    w.answered(batch, ok=True)
    assert not w.runs["a"].retry, "a host took it"


def test_window__a_stop_takes_every_waiting_run_and_says_which_were_retries() -> None:
    w = window(step_batch_size=1)
    w.queue([start("a"), start("b")])
    w.wait_retry(start("c"), 60.0)
    batch = w.next_batch()
    w.started(batch, "host-0")

    waiting = {run.start.step_id: run.retry for run in w.never_started()}
    assert waiting == {"b": False, "c": True}
    assert states(w) == {"a": RunState.STARTING}
    assert w.next_due_in() is None


def test_window__a_row_replaced_is_not_started_or_retried_from_its_old_place() -> None:
    w = window(step_batch_size=10)
    w.queue([start("a"), start("b")])
    w.wait_retry(start("c"), 0.0)
    w.adopt(start("a"), "host-1")  # found running: no longer waiting
    w.adopt(start("c", attempt=2), "host-1")

    w.retry_due()
    assert [s.step_id for s in w.next_batch()] == ["b"]
    assert w.count(RunState.ACTIVE) == 2 and w.in_flight() == 3


def test_window__a_host_gone_with_leases_on_leaves_its_steps_in_flight_with_no_owner() -> None:
    w = window()
    w.adopt(start("a"), "host-0")
    w.lose_owner(["a"])

    assert states(w) == {"a": RunState.OWNER_LOST}
    assert w.in_flight() == 1
    assert w.take("a", 1) == (start("a"), "host-0")


def recounted(w: Window) -> tuple[Counter[RunState], Counter[str], Counter[str]]:
    """The counts the window keeps, computed again from its table."""
    runs = list(w.runs.values())
    return (
        Counter(run.state for run in runs),
        Counter(run.start.type for run in runs if run.state is RunState.QUEUED),
        Counter(run.host for run in runs if run.host and run.state in IN_FLIGHT),
    )


@pytest.mark.parametrize("seed", range(20))
def test_window__its_counts_are_always_those_of_its_table(seed: int) -> None:
    """Random operations, the hot paths' counts kept by batch among them: after each, the
    per-state, per-type and per-host counts are what the table holds."""
    rng = random.Random(seed)
    w = window(max_active_steps_per_job=40, max_concurrent_step_starts=25, step_batch_size=8)
    ids = iter(range(10**6))
    pending: list[tuple[list[StepStart], str]] = []
    kinds = ["a:A", "b:B"]

    def new(n: int) -> list[StepStart]:
        return [StepStart(f"{next(ids):06d}", rng.choice(kinds), 0, 1, "{}") for _ in range(n)]

    for _ in range(400):
        op = rng.randrange(9)
        if op == 0:
            w.queue(new(rng.randint(1, 10)), front=rng.random() < 0.2)
        elif op == 1:
            batch = w.next_batch(lambda _type: rng.choice([0, 3, math.inf]))
            if batch:
                pending.append((batch, rng.choice(["h0", "h1", "h2"])))
                w.started(*pending[-1])
        elif op == 2 and pending:
            batch, _host = pending.pop(rng.randrange(len(pending)))
            w.answered(batch, ok=rng.random() < 0.8)
        elif op == 3 and w.runs:
            run = rng.choice(list(w.runs.values()))
            w.take(run.start.step_id, run.start.attempt)
        elif op == 4 and w.runs:
            run = rng.choice(list(w.runs.values()))
            if run.state in IN_FLIGHT and w.take(run.start.step_id, run.start.attempt):
                w.wait_retry(run.start, rng.choice([0.0, 60.0]))
        elif op == 5:
            w.retry_due()
            w.queue(w.failed_starts())
        elif op == 6:
            w.lose_owner(rng.sample(sorted(w.runs), min(3, len(w.runs))))
        elif op == 7:
            stage = rng.randrange(3)
            if rng.random() < 0.5:
                # Mostly new steps; now and then one the table holds already.
                known = rng.sample(sorted(w.runs), min(len(w.runs), rng.choice([0, 0, 1])))
                w.hold(stage, new(rng.randint(1, 5)) + [w.runs[i].start for i in known])
            else:
                w.queue(w.release(stage) or [])
        elif op == 8 and rng.random() < 0.1:
            w.never_started()
        counts, queued, load = recounted(w)
        assert +w._count == counts
        assert +w._queued == queued
        assert +w._load == load
