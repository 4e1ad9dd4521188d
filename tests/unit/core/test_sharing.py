"""The order of what waits for capacity (`core.sharing.FairQueue`): priority first, weighted
fair shares between fairness keys, first come within a key."""

from __future__ import annotations

from collections import Counter

import pytest

from choreography_ray.core.sharing import FairQueue, Share, check_priority
from tests.unit.core.conftest import Activations
from tests.unit.core.jobs import Plan, StagedJob


def drain(queue: FairQueue[str], n: int | None = None) -> list[str]:
    return [queue.pop() for _ in range(len(queue) if n is None else n)]


def test_first_come_within_a_key() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "a3"):
        queue.push(item, Share(key="a"))
    assert drain(queue) == ["a1", "a2", "a3"]
    assert len(queue) == 0 and queue.peek() is None


def test_a_higher_priority_goes_first_whatever_came_before() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(3):
        queue.push(f"p5-{n}", Share(priority=5, key="big"))
    queue.push("p3", Share(priority=3, key="other"))
    queue.push("p1", Share(priority=1, key="big"))
    assert drain(queue) == ["p1", "p3", "p5-0", "p5-1", "p5-2"]


def test_keys_share_by_weight() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(400):
        queue.push(f"a{n}", Share(key="a", weight=3.0))
        queue.push(f"b{n}", Share(key="b", weight=1.0))
    served = Counter(item[0] for item in drain(queue, 400))
    assert served == {"a": 300, "b": 100}


def test_a_key_that_arrives_late_goes_next_and_saves_no_credit_while_idle() -> None:
    queue: FairQueue[str] = FairQueue()
    for n in range(1000):
        queue.push(f"big{n}", Share(key="big"))
    drain(queue, 500)
    for n in range(3):
        queue.push(f"small{n}", Share(key="small"))
    # The small key alternates with the backlog from now: it does not wait behind it, and it
    # is not owed the 500 turns it had nothing waiting for.
    assert drain(queue, 6) == ["small0", "big500", "small1", "big501", "small2", "big502"]


def test_costs_count_so_a_small_batch_passes_a_big_one() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("big-batch-1", Share(key="big"), cost=1024)
    queue.push("big-batch-2", Share(key="big"), cost=1024)
    assert queue.pop() == "big-batch-1"
    queue.push("small-batch", Share(key="small"), cost=10)
    assert drain(queue) == ["small-batch", "big-batch-2"]


def test_put_back_in_front_keeps_its_turn() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("a1", Share(key="a"))
    queue.push("a2", Share(key="a"))
    taken = queue.pop()
    queue.push(taken, Share(key="a"), front=True)
    assert drain(queue) == ["a1", "a2"]


def test_remove_if_takes_a_jobs_items_out_and_the_rest_keep_their_order() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("x1", "y1", "x2", "y2"):
        queue.push(item, Share(key="k", priority=2 if item.startswith("x") else 4))
    assert queue.remove_if(lambda item: item.startswith("x")) == ["x1", "x2"]
    assert queue.waiting() == {"k": 2}
    assert drain(queue) == ["y1", "y2"]
    assert queue.remove_if(lambda item: True) == []


def test_waiting_counts_per_key_over_priorities() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("1", Share(priority=1, key="a"))
    queue.push("2", Share(priority=5, key="a"))
    queue.push("3", Share(key="b"))
    assert queue.waiting() == {"a": 2, "b": 1}
    assert sorted(queue) == ["1", "2", "3"]


def test_pop_of_nothing_raises() -> None:
    with pytest.raises(IndexError):
        FairQueue[str]().pop()


@pytest.mark.parametrize("bad", [0, 6, True, 2.0, "1", None])
def test_check_priority_refuses_what_is_not_1_to_5(bad: object) -> None:
    with pytest.raises(ValueError, match="priority must be an int from 1"):
        check_priority(bad)


def test_check_priority_takes_1_to_5() -> None:
    assert [check_priority(p) for p in range(1, 6)] == [1, 2, 3, 4, 5]


def test_a_job_hands_its_share_with_every_start(activations: Activations) -> None:
    """A job's starts carry its priority, its fairness key (the namespace when it has none)
    and that key's weight, which order its steps where they wait on the host."""

    async def scenario() -> None:
        keyed = await activations.new(
            StagedJob,
            Plan(sizes=[2]),
            priority=1,
            fairness_key="tenant-x",
            fairness_weights={"tenant-x": 2.5},
        )
        plain = await activations.new(StagedJob, Plan(sizes=[2]))
        for harness in (keyed, plain):
            await harness.c.start()
            await harness.settle()
        assert keyed.hosts.shares == [Share(1, "tenant-x", 2.5)]
        assert plain.hosts.shares == [Share(3, "core", 1.0)]

    activations.run(scenario)
