"""Documents embedded in batches on a pool of GPU hosts, durably (docs/pools.md).

    pip install numpy   # the stand-in model's one dependency
    python docs/examples/embed.py [--documents 2000] [--gpus 2] [--storage sqlite:///embed.db]

`Embed` declares what one host needs (a GPU), loads its model once per host (`setup`) and embeds
up to 64 documents in one call (`perform_batch`). A numpy projection stands in for the model, so
nothing is downloaded, and the local Ray declares `--gpus` GPUs, which Ray accepts on a machine
without any: the pool gets one host per GPU. Each document's vector is written to its own file,
so a batch run again after a lost node writes the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import numpy as np
import ray
from pydantic import BaseModel

import choreography_ray as cr

DIMENSIONS = 32
VOCABULARY = 1024


class Document(BaseModel):
    id: str
    text: str
    out: str


class Embed(cr.JobStep[Document]):
    resources = {"num_gpus": 1}  # one GPU per host: Ray places the hosts where GPUs are
    batch_size = 64  # documents per perform_batch call ...
    batch_wait = 0.05  # ... waiting at most 50 ms for a batch to fill

    def setup(self) -> None:
        """Once per host: "load the model" (a fixed random projection)."""
        self.model = np.random.default_rng(7).normal(size=(VOCABULARY, DIMENSIONS))

    def perform_batch(
        self, requests: list[Document], context: cr.BatchContext
    ) -> list[cr.StepResult]:
        counts = np.zeros((len(requests), VOCABULARY))
        for row, document in enumerate(requests):
            for word in document.text.split():
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                counts[row, int.from_bytes(digest, "big") % VOCABULARY] += 1
        vectors = counts @ self.model  # the batch in one matrix product, as on a GPU
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        for document, vector in zip(requests, vectors, strict=True):
            np.save(Path(document.out) / f"{document.id}.npy", vector)
        return [cr.StepResult.succeeded()] * len(requests)


class CorpusRequest(BaseModel):
    documents: int
    out: str


class EmbedCorpus(cr.Job[CorpusRequest]):
    def prepare_steps(self, request: CorpusRequest) -> list[cr.StepSpec]:
        words = ["ray", "durable", "batch", "gpu", "pool", "step", "job", "vector"]
        return [
            self.create_step(
                Embed,
                Document(id=f"doc-{n:06d}", text=" ".join(words[n % 8 :] * 3), out=request.out),
            )
            for n in range(request.documents)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=2, help="GPUs the local Ray declares")
    parser.add_argument("--storage", default="sqlite:///embed.db")
    args = parser.parse_args()

    ray.init(num_gpus=args.gpus)
    out = Path(tempfile.mkdtemp(prefix="embeddings-"))
    jobs = cr.Jobs.connect(storage=args.storage)
    manager = jobs.manager("examples", "embed")
    started = manager.start(EmbedCorpus, CorpusRequest(documents=args.documents, out=str(out)))
    state = manager.wait(started.job_id, timeout=600)

    written = len(list(out.glob("*.npy")))
    print(f"job {state.status}: {state.progress.successful_steps} documents embedded")
    print(f"{written} vectors of {DIMENSIONS} dimensions in {out}")
    pools = jobs.pools()
    print("pools:", ", ".join(f"{pool.shape} ({pool.hosts} hosts)" for pool in pools))


if __name__ == "__main__":
    main()
