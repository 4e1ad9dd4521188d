"""The group commit without a cluster: a round whose write fails fails every writer of it, and
the next round writes again."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import pytest

from choreography_ray.runtime.group_commit import GroupCommit
from choreography_ray.status import StepStatus
from choreography_ray.storage import PlannedStep, StepUpdate, StoredOutput
from choreography_ray.storage.memory import MemoryStorage

pytestmark = pytest.mark.timeout(30)


class CountingStorage(MemoryStorage):
    """Memory storage that keeps each bulk call's records, and can refuse the next ones."""

    def __init__(self) -> None:
        super().__init__()
        self.updated: list[list[str]] = []
        self.deleted: list[list[str]] = []
        self.refuse = 0

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        self._maybe_refuse()
        self.updated.append([u.step_id for u in updates])
        await super().update_steps(updates)

    async def delete_steps(
        self, job_id: str, step_ids: Collection[str], outputs: Sequence[StoredOutput] = ()
    ) -> None:
        self._maybe_refuse()
        self.deleted.append(sorted(step_ids))
        await super().delete_steps(job_id, step_ids, outputs)

    def _maybe_refuse(self) -> None:
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("storage refused the write")


def running(step_id: str) -> StepUpdate:
    return StepUpdate("j", step_id, StepStatus.RUNNING, 1)


async def stored(*step_ids: str) -> CountingStorage:
    """Storage holding job "j"'s plan of these steps."""
    storage = CountingStorage()
    await storage.insert_plan("j", [PlannedStep(s, "pkg:Step", 0, "{}") for s in step_ids])
    return storage


def test_a_failed_round__fails_every_writer__the_next_round_writes_again() -> None:
    async def scenario() -> None:
        storage = await stored("a")
        storage.refuse = 1
        commit = GroupCommit(storage, 0.001)
        with pytest.raises(ConnectionError):
            await asyncio.gather(commit.write([running("a")]), commit.write(deletes=[("j", "a")]))
        await commit.write(deletes=[("j", "a")])
        assert storage.deleted == [["a"]]
        assert "j" not in storage.steps or not storage.steps["j"]

    asyncio.run(scenario())


def test_a_round__leaves_out_the_update_of_a_record_it_deletes() -> None:
    """A step that succeeds before its RUNNING write is flushed writes only its delete."""

    async def scenario() -> None:
        storage = await stored("a", "b")
        commit = GroupCommit(storage, 0.01)
        await asyncio.gather(
            commit.write([running("a"), running("b")]), commit.write(deletes=[("j", "a")])
        )
        assert storage.updated == [["b"]]
        assert storage.deleted == [["a"]]
        assert set(storage.steps["j"]) == {"b"}

    asyncio.run(scenario())


def test_a_round__writes_a_succeeded_steps_output_with_its_delete() -> None:
    async def scenario() -> None:
        storage = await stored("a", "b")
        commit = GroupCommit(storage, 0.01)
        output = StoredOutput("j", "a", 0, 1, '{"n": 1}')
        await asyncio.gather(
            commit.write(deletes=[("j", "a")], outputs=[output]), commit.write([running("b")])
        )
        assert storage.deleted == [["a"]]
        assert await storage.list_outputs("j") == [output]

    asyncio.run(scenario())


def test_two_updates_of_one_record_in_a_round__are_written_in_the_order_they_joined() -> None:
    async def scenario() -> None:
        storage = await stored("a", "b")
        commit = GroupCommit(storage, 0.01)
        failed = StepUpdate("j", "a", StepStatus.FAILED, 1)
        await asyncio.gather(commit.write([running("a"), running("b")]), commit.write([failed]))
        assert storage.updated == [["a", "b"], ["a"]]
        assert storage.steps["j"]["a"].status is StepStatus.FAILED

    asyncio.run(scenario())


class SlowStorage(CountingStorage):
    """Each bulk update takes `seconds`; records how many run at once."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.at_once = 0
        self.most_at_once = 0

    async def update_steps(self, updates: Sequence[StepUpdate]) -> None:
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            await asyncio.sleep(self.seconds)
            await super().update_steps(updates)
        finally:
            self.at_once -= 1


def test_rounds__are_written_one_at_a_time_in_the_order_they_began() -> None:
    """A round due while the one before is still being written waits for it, so a later
    write (an outcome) never lands before an earlier one (its step's RUNNING)."""

    async def scenario() -> None:
        storage = SlowStorage(0.05)
        await storage.insert_plan("j", [PlannedStep(s, "pkg:Step", 0, "{}") for s in "abc"])
        commit = GroupCommit(storage, 0.001)
        first = asyncio.ensure_future(commit.write([running("a")]))
        await asyncio.sleep(0.01)  # the first round is being written
        second = asyncio.ensure_future(commit.write([running("b")]))
        await asyncio.sleep(0.01)
        third = asyncio.ensure_future(commit.write([running("c")]))
        await asyncio.gather(first, second, third)
        assert storage.most_at_once == 1
        assert storage.updated == [["a"], ["b"], ["c"]] or storage.updated == [["a"], ["b", "c"]]

    asyncio.run(scenario())
