"""Map and reduce with step outputs (docs/outputs.md): no files, no side channel.

    python docs/examples/word_count.py [--documents 1000] [--storage sqlite:///words.db]

Stage 0 counts the words of each document and returns the counts as its output; stage 1's one
step reads every output of stage 0 (`context.outputs`, a page at a time) and returns the total.
The driver then reads the outputs back: the total with `manager.outputs`, and stage 0's as a Ray
Dataset (`jobs.outputs_dataset`), streamed from storage by parallel read tasks.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr

WORDS = ["ray", "step", "job", "stage", "output", "durable", "fan", "out"]


class Document(BaseModel):
    n: int


class Counts(BaseModel):
    """One document's word counts: stage 0's output."""

    n: int
    words: dict[str, int]


class CountWords(cr.JobStep[Document]):
    async def perform(self, request: Document, context: cr.StepContext) -> cr.StepResult:
        text = " ".join(WORDS[(request.n * i) % len(WORDS)] for i in range(1, 8))
        counts = Counts(n=request.n, words=Counter(text.split()))
        return cr.StepResult.succeeded(output=counts)


class Total(BaseModel):
    documents: int
    words: dict[str, int]


class SumCounts(cr.JobStep[Document]):
    async def perform(self, request: Document, context: cr.StepContext) -> cr.StepResult:
        total: Counter[str] = Counter()
        documents = 0
        async for out in context.outputs(stage=0):  # pages of 1,000, in step-id order
            total.update(out.output_as(Counts).words)
            documents += 1
        return cr.StepResult.succeeded(output=Total(documents=documents, words=total))


class CorpusRequest(BaseModel):
    documents: int


class WordCount(cr.Job[CorpusRequest]):
    def prepare_steps(self, request: CorpusRequest) -> list[cr.StepSpec]:
        maps = [
            self.create_step(CountWords, Document(n=n), stage=0) for n in range(request.documents)
        ]
        return [*maps, self.create_step(SumCounts, Document(n=-1), stage=1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--storage", default=None, help="default: a new SQLite file")
    args = parser.parse_args()
    storage = args.storage or f"sqlite:///{Path(tempfile.mkdtemp()) / 'words.db'}"

    with cr.Jobs.connect(storage=storage) as jobs:
        manager = jobs.manager("examples", "word-count")
        started = manager.start(WordCount, CorpusRequest(documents=args.documents))
        state = manager.wait(started.job_id, timeout=600)
        assert state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY, state.status

        (total,) = manager.outputs(started.job_id, stage=1)
        print(total.output_as(Total))
        per_document = jobs.outputs_dataset(started.job_id, stage=0)
        print(f"{per_document.count()} outputs of stage 0 read back as a Dataset")


if __name__ == "__main__":
    main()
