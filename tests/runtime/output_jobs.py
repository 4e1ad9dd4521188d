"""Job and step types of the output tests (`test_outputs.py`), importable by path in Ray
workers: a map stage whose steps return outputs and a reduce stage that reads them."""

from __future__ import annotations

from pydantic import BaseModel

import choreography_ray as cr


class Item(BaseModel):
    n: int
    #: What the step does: "square" (its output), "fail", "big" (an output over the limit),
    #: "nothing" (success without output), "sum" / "sum_sync" (reads stage 0's outputs).
    do: str = "square"


class Square(BaseModel):
    n: int
    square: int


class Big(BaseModel):
    text: str


class Sum(BaseModel):
    outputs: int
    total: int


class MapStep(cr.JobStep[Item]):
    async def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        if request.do == "fail":
            return cr.StepResult.failed(f"item {request.n} failed")
        if request.do == "big":
            return cr.StepResult.succeeded(output=Big(text="x" * 70_000))
        if request.do == "nothing":
            return cr.StepResult.succeeded()
        return cr.StepResult.succeeded(output=Square(n=request.n, square=request.n**2))


class BatchMapStep(cr.JobStep[Item]):
    batch_size = 16

    def perform_batch(self, requests: list[Item], context: cr.BatchContext) -> list[cr.StepResult]:
        return [cr.StepResult.succeeded(output=Square(n=r.n, square=r.n**2)) for r in requests]


class ReduceStep(cr.JobStep[Item]):
    async def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        squares = [out.output_as(Square) async for out in context.outputs(stage=0, page=7)]
        return cr.StepResult.succeeded(output=_sum(squares))


class SyncReduceStep(cr.JobStep[Item]):
    def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        squares = [out.output_as(Square) for out in context.outputs_sync(stage=0, page=7)]
        return cr.StepResult.succeeded(output=_sum(squares))


def _sum(squares: list[Square]) -> Sum:
    return Sum(outputs=len(squares), total=sum(s.square for s in squares))


class MapReduceRequest(BaseModel):
    count: int
    #: Per n, what its map step does instead of "square".
    special: dict[int, str] = {}
    batched: bool = False
    #: The reduce stage's step: "sum", "sum_sync" or "" (no reduce stage).
    reduce: str = "sum"


class MapReduce(cr.Job[MapReduceRequest]):
    def prepare_steps(self, request: MapReduceRequest) -> list[cr.StepSpec]:
        kind = BatchMapStep if request.batched else MapStep
        steps = [
            self.create_step(kind, Item(n=n, do=request.special.get(n, "square")), stage=0)
            for n in range(request.count)
        ]
        if request.reduce:
            reduce = ReduceStep if request.reduce == "sum" else SyncReduceStep
            steps.append(self.create_step(reduce, Item(n=-1, do=request.reduce), stage=1))
        return steps

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE


class RowsRequest(BaseModel):
    rows: int


class FromDataset(cr.Job[RowsRequest]):
    """A plan read from a Ray Dataset, streamed (`cr.steps_from_dataset`)."""

    def prepare_steps(self, request: RowsRequest):  # type: ignore[no-untyped-def]
        import ray.data

        ds = ray.data.range(request.rows)
        return cr.steps_from_dataset(ds, MapStep, lambda row: Item(n=row["id"]))
