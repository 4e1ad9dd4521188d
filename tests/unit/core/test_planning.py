"""A plan consumed in chunks and a stage fed from storage in pages (issue 13): every form
`prepare_steps` may return, the chunking rules, a plan cut short, and the feed's rules across
stages, stops, resumes and reactivations. Small chunks stand for large plans."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from choreography_ray.core import plan_writer
from choreography_ray.core.plan_writer import FIRST_EPOCH
from choreography_ray.core.planning import (
    UNSIZED_WIDTH,
    Feed,
    PlanError,
    PlanReader,
    feed_page,
    id_width,
    plan_records,
    plan_source,
)
from choreography_ray.core.window import RunState
from choreography_ray.errors import CannotResumeJobError, StartJobError
from choreography_ray.job import StepSpec
from choreography_ray.model import ResumeAfter, StageShape
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import PlannedStep, StoredStart
from choreography_ray.storage.memory import MemoryStorage
from tests.unit.core.conftest import Activations
from tests.unit.core.harness import Harness
from tests.unit.core.jobs import Item, Plan, StagedJob, Streamed, StreamedJob

pytestmark = pytest.mark.timeout(60)

CHUNK = 4


def spec(n: int, stage: int = 0) -> StepSpec:
    return StepSpec(step_type="pkg.mod:Step", request=Item(n=n), stage=stage)


async def _chunks(reader: PlanReader, size: int) -> AsyncIterator[list[StepSpec]]:
    while chunk := await reader.read(size):
        yield chunk


def chunked(source: object, size: int = 3) -> list[list[StepSpec]]:
    async def read() -> list[list[StepSpec]]:
        reader = PlanReader(await plan_source(source))
        return [chunk async for chunk in _chunks(reader, size)]

    return asyncio.run(read())


# -- the chunking rules, without a job ----------------------------------------------------------


def test_chunks__every_form_gives_the_same_chunks_in_plan_order() -> None:
    plan = [spec(i) for i in range(7)]

    def generator() -> Iterator[StepSpec]:
        yield from plan

    async def agen() -> AsyncIterator[StepSpec]:
        for s in plan:
            yield s

    async def awaitable_list() -> list[StepSpec]:
        return plan

    async def awaitable_agen() -> AsyncIterator[StepSpec]:
        return agen()

    expected = [plan[0:3], plan[3:6], plan[6:7]]
    for form in (plan, tuple(plan), generator(), agen(), awaitable_list(), awaitable_agen()):
        assert chunked(form) == expected
    assert chunked([]) == []


def test_chunks__an_item_that_is_not_a_step_or_a_failing_plan_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="item 4 of the plan is a dict") as raised:
        chunked([spec(0), spec(1), spec(2), spec(3), {"n": 4}])
    assert isinstance(raised.value.__cause__, TypeError)

    def failing() -> Iterator[StepSpec]:
        yield spec(0)
        raise ValueError("boom")

    with pytest.raises(PlanError, match="boom") as raised:
        chunked(failing())
    assert isinstance(raised.value.__cause__, ValueError)


def test_plan_source__anything_but_an_iterable_is_refused_clearly() -> None:
    for wrong in (None, 3, "steps", b"steps"):
        with pytest.raises(TypeError, match="prepare_steps must return steps"):
            asyncio.run(plan_source(wrong))


def test_step_ids__as_wide_as_the_known_length_else_unsized_width() -> None:
    assert id_width([spec(0)] * 3, 3, more=False) == 6
    assert id_width([spec(0)] * 1_234_567, 50_000, more=True) == 7
    assert id_width(iter([]), 3, more=False) == 6  # ended within its first chunk
    assert id_width(iter([]), 50_000, more=True) == UNSIZED_WIDTH
    records = plan_records([spec(0), spec(1, stage=3)], offset=41, width=6)
    assert records == [
        PlannedStep("000041", "pkg.mod:Step", 0, '{"n":0}'),
        PlannedStep("000042", "pkg.mod:Step", 3, '{"n":1}'),
    ]
    with pytest.raises(PlanError, match="at most 999,999 steps"):
        plan_records([spec(0), spec(1)], offset=999_999, width=6)


def test_plan_records__a_request_shared_by_steps_and_requests_alike_each_give_their_own_json() -> (
    None
):
    shared, alike = Item(n=7), Item(n=7)
    specs = [StepSpec("pkg.mod:Step", shared), StepSpec("pkg.mod:Step", Item(n=8)),
             StepSpec("pkg.mod:Step", shared), StepSpec("pkg.mod:Step", alike)]  # fmt: skip
    texts = [r.request_json for r in plan_records(specs, offset=0, width=6)]
    assert texts == ['{"n":7}', '{"n":8}', '{"n":7}', '{"n":7}']


def test_feed__reads_each_step_once_skips_held_ones_and_restarts_a_stopped_one() -> None:
    feed = Feed(stage=2, skip={"b"})
    rows = [
        StoredStart("a", "t", 2, StepStatus.SCHEDULED, 0, "{}"),
        StoredStart("b", "t", 2, StepStatus.RUNNING, 1, "{}"),
        StoredStart("c", "t", 2, StepStatus.STOPPED, 2, "{}"),
    ]
    starts = feed.take(rows, limit=3)
    assert [(s.step_id, s.attempt) for s in starts] == [("a", 1), ("c", 3)]
    assert (feed.after, feed.done) == ("c", False)
    assert feed.take([], limit=3) == [] and feed.done
    assert feed_page(50_000) == 5_000 and feed_page(4) == 4


# -- a job's plan in chunks and its stages in pages ---------------------------------------------


async def run_to_the_end(h: Harness) -> Counter[str]:
    """Finishes every step the job starts until it settles; how many times each step ran. The
    window's pending steps never exceed two pages."""
    for _ in range(1_000):
        await h.settle()
        assert h.c.window.count(RunState.QUEUED) <= 2 * feed_page(CHUNK)
        if (await h.status()).is_terminal:
            break
        await h.hosts.finish_all()
    return Counter(start.step_id for start in h.hosts.started)


@pytest.mark.parametrize("form", ["list", "generator", "async", "awaitable", "awaitable-async"])
def test_plan__every_form_runs_every_step_once_across_stages_in_chunks(
    activations: Activations, form: str
) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StreamedJob, Streamed(steps=23, stages=3, form=form), plan_chunk_size=CHUNK
        )
        assert await h.c.start() is None
        ran = await run_to_the_end(h)

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        width = 6 if form == "list" else UNSIZED_WIDTH  # a list's length is known up front
        assert ran == Counter({f"{i:0{width}d}": 1 for i in range(23)})
        assert [(s.stage, s.total_steps, s.successful_steps) for s in stored.progress.stages] == [
            (0, 8, 8),
            (1, 8, 8),
            (2, 7, 7),
        ]
        assert stored.progress.total_steps == 23

    activations.run(scenario)


def test_plan__a_generator_that_ends_within_its_first_chunk_gets_a_lists_ids_and_no_read(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StreamedJob, Streamed(steps=3), plan_chunk_size=CHUNK)
        await h.c.start()
        assert h.c.feed is not None and h.c.feed.done
        assert Counter(await run_to_the_end(h)) == {"000000": 1, "000001": 1, "000002": 1}

    activations.run(scenario)


@pytest.mark.parametrize("steps", [6, 20])
def test_plan__a_first_stage_waiting_for_admission_starts_nothing_until_admitted(
    activations: Activations, steps: int
) -> None:
    """Neither the steps kept in memory (6: all of them) nor those read from storage after them
    (20: 12 of them) start while the first stage's admission is refused, however often the
    window is filled; once admitted, each runs once."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[steps]), plan_chunk_size=CHUNK)
        refusal = h.control("admit_stage", admit=False)
        await h.c.start()
        for _ in range(3):
            await h.c.watchdog_tick()
            await h.settle()
        assert h.hosts.started == [] and not h.c.window.runs
        refusal.admit = True
        await h.c.watchdog_tick()
        assert await run_to_the_end(h) == Counter({f"{i:06d}": 1 for i in range(steps)})
        assert h.calls["admit_stage:0"] >= 2

    activations.run(scenario)


@pytest.mark.parametrize(("steps", "reads"), [(8, []), (9, [["0000000008"]])])
def test_plan__the_first_run_keeps_the_two_chunks_read_to_size_ids_and_reads_only_after_them(
    activations: Activations, steps: int, reads: list[list[str]]
) -> None:
    async def scenario() -> None:
        h = await activations.new(StreamedJob, Streamed(steps=steps), plan_chunk_size=CHUNK)
        list_starts = h.storage.list_starts
        read: list[list[str]] = []
        probes = 0

        async def reading(*args: Any, **kwargs: Any) -> list[StoredStart]:
            nonlocal probes
            page = await list_starts(*args, **kwargs)
            if kwargs.get("stage") is not None:  # the feed's reads, not the prepare's probe
                read.append([row.step_id for row in page])
            else:
                probes += 1
            return page

        h.storage.list_starts = reading  # type: ignore[method-assign]
        await h.c.start()
        ran = await run_to_the_end(h)
        # Two chunks (8 steps) were read before the first insert: they start from memory.
        assert [page for page in read if page] == reads
        assert ran == Counter({f"{i:010d}": 1 for i in range(steps)})
        assert probes == 0  # a first activation has no earlier activation's plan to look for

    activations.run(scenario)


@pytest.mark.parametrize(
    ("request_", "message", "error"),
    [
        (Streamed(steps=20, raises_at=9), "RuntimeError: the plan failed at step 9 on purpose",
         StartJobError.COULD_NOT_PREPARE_STEPS),
        (Streamed(steps=20, not_a_step_at=13), "TypeError: prepare_steps must return steps",
         StartJobError.COULD_NOT_PREPARE_STEPS),
    ],
)  # fmt: skip
def test_plan__failing_after_some_chunks_were_written_fails_the_job_and_leaves_no_step(
    activations: Activations, request_: Streamed, message: str, error: StartJobError
) -> None:
    async def scenario() -> None:
        h = await activations.new(StreamedJob, request_, plan_chunk_size=CHUNK)
        assert await h.c.start() is error
        stored = await h.stored()
        assert stored.status is JobStatus.FAILED
        assert not stored.has_plan
        assert (stored.error or "").startswith(message)
        assert await h.steps() == {}
        assert h.hosts.calls == []

    activations.run(scenario)


def test_plan__failing_while_a_chunk_is_written_waits_for_that_write_and_leaves_no_step(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StreamedJob, Streamed(steps=20, raises_at=9), plan_chunk_size=CHUNK
        )
        insert_plan = h.storage.insert_plan
        written: list[str] = []

        async def slow(job_id: str, steps: Sequence[PlannedStep]) -> None:
            await asyncio.sleep(0.05)  # still in flight when the plan raises
            await insert_plan(job_id, steps)
            written.append(steps[0].step_id)

        h.storage.insert_plan = slow  # type: ignore[method-assign]
        assert await h.c.start() is StartJobError.COULD_NOT_PREPARE_STEPS
        # Steps 0-3 and 4-7 were written (the second while step 9 was read); then cleared.
        assert written == ["0000000000", "0000000004"]
        assert await h.steps() == {}
        assert (await h.stored()).status is JobStatus.FAILED

    activations.run(scenario)


def test_plan__a_chunk_is_written_in_pieces_each_while_the_next_is_built_two_writes_at_most(
    activations: Activations, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        monkeypatch.setattr(plan_writer, "PLAN_WRITE", 3)
        events: list[str] = []
        in_flight = most = 0

        def building(specs: list[StepSpec], offset: int, width: int) -> list[PlannedStep]:
            events.append(f"build {offset}")
            return plan_records(specs, offset, width)

        monkeypatch.setattr(plan_writer, "plan_records", building)
        h = await activations.new(StreamedJob, Streamed(steps=10), plan_chunk_size=CHUNK)
        insert_plan = h.storage.insert_plan

        async def slow(job_id: str, steps: Sequence[PlannedStep]) -> None:
            nonlocal in_flight, most
            first = int(steps[0].step_id)
            events.append(f"write {first}+{len(steps)}")
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.01)
            await insert_plan(job_id, steps)
            in_flight -= 1
            events.append(f"written {first}")

        h.storage.insert_plan = slow  # type: ignore[method-assign]
        assert await h.c.start() is None
        # The first chunk of 4 (and a step past it) is read whole, then pieces of 3. Each
        # piece's write begins as it is built, while the next is read and built; two at most
        # are in flight (WRITES_IN_FLIGHT): the third begins once the first is written.
        assert [e for e in events if e.startswith("write ")] == [
            "write 0+3", "write 3+3", "write 6+3", "write 9+1",
        ]  # fmt: skip
        assert events[:4] == ["build 0", "write 0+3", "build 3", "write 3+3"]
        assert events.index("written 0") < events.index("write 6+3")
        assert events.index("written 3") < events.index("write 9+1")
        assert most == plan_writer.WRITES_IN_FLIGHT == 2
        assert Counter(await run_to_the_end(h)) == {f"{i:010d}": 1 for i in range(10)}

    activations.run(scenario)


def test_plan__a_partial_plan_an_earlier_activation_left_is_cleared_before_the_plan_is_written(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StreamedJob, Streamed(steps=10), plan_chunk_size=CHUNK)
        # The first chunks of an activation that died while it wrote the plan, and the next
        # activation (its epoch a later one: the first activation has no plan to look for).
        width = UNSIZED_WIDTH
        await h.storage.insert_plan(
            h.job_id, [PlannedStep(f"{i:0{width}d}", "x:Y", 0, "{}") for i in range(8)]
        )
        assert (await h.activate()).epoch > FIRST_EPOCH
        assert await h.c.start() is None
        assert await run_to_the_end(h) == Counter({f"{i:0{width}d}": 1 for i in range(10)})
        assert (await h.stored()).progress.successful_steps == 10

    activations.run(scenario)


def test_plan__a_job_interrupted_while_it_wrote_its_plan_fails_with_missing_step_plan_and_no_step(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StreamedJob, Streamed(steps=10), plan_chunk_size=CHUNK)
        await h.storage.insert_plan(
            h.job_id, [PlannedStep(f"{i:010d}", "x:Y", 0, "{}") for i in range(4)]
        )
        await h.activate(reconstructed=True)  # the actor restarted: it recovers
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.FAILED
        assert str(CannotResumeJobError.MISSING_STEP_PLAN) in (stored.error or "")
        assert await h.steps() == {}
        assert h.hosts.calls == []

    activations.run(scenario)


def test_feed__a_stop_counts_the_steps_never_read_as_stopped_and_a_resume_runs_each_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StreamedJob, Streamed(steps=30), plan_chunk_size=CHUNK, max_active_steps_per_job=2
        )
        await h.c.start()
        await h.settle()
        await h.hosts.finish_all()
        await h.settle()
        assert h.c.feed is not None and not h.c.feed.done

        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert stored.progress.successful_steps == 2
        assert stored.progress.stopped_steps == 28  # 2 told to stop, 26 never started

        await h.c.resume()
        ran = await run_to_the_end(h)
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (30, 0)
        # The two stopped while they ran ran again; every other step ran once.
        assert sorted(ran.values()) == [1] * 28 + [2] * 2

    activations.run(scenario)


def test_feed__a_reactivation_adopts_the_running_steps_and_pages_the_rest_of_the_stage(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(
            StreamedJob, Streamed(steps=25, stages=2), plan_chunk_size=CHUNK,
            max_active_steps_per_job=3,
        )  # fmt: skip
        await h.c.start()
        await h.settle()
        await h.hosts.finish_all()
        await h.settle()
        running = h.hosts.running_ids()
        assert len(running) == 3

        await h.activate(reconstructed=True)  # the job actor died; its hosts did not
        await h.settle()
        assert set(h.c.window.active()) == running  # adopted, not started twice
        ran = await run_to_the_end(h)

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 25
        assert ran == Counter({f"{i:010d}": 1 for i in range(25)})

    activations.run(scenario)


def test_plan__a_checkpointed_start_deletes_the_skipped_stages_records_written_in_chunks(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        layout = (StageShape(stage=0, steps=5), StageShape(stage=1, steps=5))
        resume = ResumeAfter(stage=0, layout=layout, source="run-1")
        h = await activations.new(
            StreamedJob, Streamed(steps=10, stages=2), plan_chunk_size=CHUNK, resume_after=resume
        )
        await h.c.start()
        await h.settle()
        assert {step.stage for step in (await h.steps()).values()} == {1}
        ran = await run_to_the_end(h)
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 10
        assert ran == Counter({f"{i:010d}": 1 for i in range(1, 10, 2)})

    activations.run(scenario)


def test_storage__memory_list_starts_is_list_steps_without_records() -> None:
    async def check() -> None:
        storage = MemoryStorage()
        await storage.insert_plan("j", [PlannedStep("a", "t", 1, '{"n": 1}')])
        assert await storage.list_starts("j") == [
            StoredStart("a", "t", 1, StepStatus.SCHEDULED, 0, '{"n": 1}')
        ]

    asyncio.run(check())
