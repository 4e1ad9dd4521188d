"""`jobs outputs ID`: a job's step outputs as stored, as JSON lines or a Parquet file.

It reads the storage directly, opened read-only, and starts no Ray, as `jobs show` does. The
outputs are read a page at a time (`output_pages`, in step-id order) and each page is written
before the next is read, so the command holds one page, whatever the job's size.

- `--format jsonl` (the default): one JSON object a line, `{"job_id", "step_id", "stage",
  "attempt", "output"}`, `output` the step's JSON as a value; to stdout or `--out PATH`.
- `--format parquet` (needs `--out`): the same five columns, a row group per page
  (`pyarrow.parquet.ParquetWriter`). `output` is a string column holding each step's JSON
  text: outputs of different steps (of different stages, or optional fields) may differ in
  shape, which one Parquet schema could not hold. Read it back with `json.loads`, or
  DuckDB's `json` functions.

A file is written beside `PATH` first (`PATH.partial`) and renamed to it once complete, so
`PATH` is never a half-written file: an interrupted export leaves what `PATH` was before.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, Protocol

import typer

from choreography_ray.cli._common import fail, note, open_stored, read_job, where
from choreography_ray.cli._options import (
    JobIdArgument,
    JobNamespaceCheck,
    JobScopeCheck,
    StorageOption,
)
from choreography_ray.storage import Storage, StoredOutput, output_pages

if TYPE_CHECKING:
    import pyarrow

#: Outputs read (and written) per page: at most 64 MiB of outputs of the largest size
#: (`JobsOptions.max_output_bytes`, 64 KiB by default).
PAGE = 1_000


class OutputFormat(enum.StrEnum):
    """What `jobs outputs` writes."""

    #: One JSON object a line, `output` a JSON value.
    JSONL = "jsonl"
    #: A Parquet file, `output` a JSON text column.
    PARQUET = "parquet"


class Sink(Protocol):
    """Where the pages go."""

    def write(self, page: Sequence[StoredOutput]) -> None: ...

    def close(self) -> None: ...


def json_line(stored: StoredOutput) -> str:
    """One output as a line of `--format jsonl`."""
    row = {
        "job_id": stored.job_id,
        "step_id": stored.step_id,
        "stage": stored.stage,
        "attempt": stored.attempt,
        "output": json.loads(stored.output),
    }
    return json.dumps(row) + "\n"


class JsonLines:
    """`--format jsonl` on a text stream, flushed after each page; `owned` closes it too."""

    def __init__(self, stream: IO[str], *, owned: bool = False) -> None:
        self._stream = stream
        self._owned = owned

    def write(self, page: Sequence[StoredOutput]) -> None:
        self._stream.write("".join(json_line(stored) for stored in page))
        self._stream.flush()

    def close(self) -> None:
        if self._owned:
            self._stream.close()
        else:
            self._stream.flush()


def parquet_schema() -> pyarrow.Schema:
    import pyarrow

    return pyarrow.schema(
        [
            ("job_id", pyarrow.string()),
            ("step_id", pyarrow.string()),
            ("stage", pyarrow.int64()),
            ("attempt", pyarrow.int64()),
            # The step's JSON text: the shapes of outputs may differ from step to step.
            ("output", pyarrow.string()),
        ]
    )


class ParquetRows:
    """`--format parquet` to a file: a row group per page."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet

        self._schema = parquet_schema()
        self._writer = pyarrow.parquet.ParquetWriter(path, self._schema)

    def write(self, page: Sequence[StoredOutput]) -> None:
        import pyarrow

        columns: dict[str, list[Any]] = {
            "job_id": [s.job_id for s in page],
            "step_id": [s.step_id for s in page],
            "stage": [s.stage for s in page],
            "attempt": [s.attempt for s in page],
            "output": [s.output for s in page],
        }
        self._writer.write_table(pyarrow.Table.from_pydict(columns, schema=self._schema))

    def close(self) -> None:
        self._writer.close()


def partial_path(path: Path) -> Path:
    """Where `path` is written until it is complete."""
    return path.with_name(path.name + ".partial")


@contextlib.contextmanager
def sink_for(output_format: OutputFormat, out: Path | None) -> Iterator[Sink]:
    """The sink of `output_format` to `out` (stdout when None; jsonl only). A file is written
    at `partial_path(out)` and renamed to `out` when the block completes; removed otherwise."""
    if out is None:
        sink: Sink = JsonLines(sys.stdout)
        yield sink
        sink.close()
        return
    partial = partial_path(out)
    try:
        if output_format is OutputFormat.PARQUET:
            sink = ParquetRows(partial)
        else:
            sink = JsonLines(partial.open("w", encoding="utf-8"), owned=True)
        try:
            yield sink
        finally:
            sink.close()
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


async def export(
    store: Storage,
    job_id: str,
    stage: int | None,
    sink: Sink,
) -> int:
    """Writes the job's outputs (of `stage`) to `sink` a page at a time; how many it wrote."""
    written = 0
    async for page in output_pages(store, job_id, stage=stage, page=PAGE):
        sink.write(page)
        written += len(page)
    return written


def outputs(
    job_id: JobIdArgument,
    storage: StorageOption = None,
    scope: JobScopeCheck = None,
    namespace: JobNamespaceCheck = None,
    stage: Annotated[
        int | None,
        typer.Option(
            "--stage",
            metavar="STAGE",
            help="Only the outputs of the steps of this stage.",
            show_default="every stage",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="jsonl: a JSON object a line; parquet: a Parquet file (needs --out), the "
            "output a JSON text column.",
        ),
    ] = OutputFormat.JSONL,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="PATH",
            dir_okay=False,
            help="Write to this file (replaced once complete).",
            show_default="stdout",
        ),
    ] = None,
) -> None:
    """Write a job's step outputs, in step-id order: as JSON lines `{"job_id", "step_id",
    "stage", "attempt", "output"}` (to stdout or --out), or as a Parquet file."""
    if output_format is OutputFormat.PARQUET and out is None:
        raise typer.BadParameter("--format parquet writes a file: name it with --out PATH",
                                 param_hint="--out")  # fmt: skip
    if out is not None and not out.parent.is_dir():
        raise typer.BadParameter(f"no directory {out.parent} to write {out.name} in",
                                 param_hint="--out")  # fmt: skip
    store = open_stored(storage, "jobs outputs")

    async def read() -> int | None:
        try:
            if await read_job(store, job_id, scope, namespace) is None:
                return None
            with sink_for(output_format, out) as sink:
                return await export(store, job_id, stage, sink)
        finally:
            await store.close()

    try:
        written = asyncio.run(read())
    except BrokenPipeError:
        if out is not None:
            raise
        # The reader of stdout went away (`| head`): what it read is what it wanted. Python's
        # own flush of stdout at exit would fail again, so stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    except OSError as error:
        if out is None:
            raise
        fail(f"cannot write {out}: {error.strerror or error}")
    if written is None:
        fail(f"no job {job_id} in {where(store, scope, namespace)}")
    of_stage = "" if stage is None else f" of stage {stage}"
    note(f"{written:,} output(s){of_stage} of job {job_id} written to "
         f"{'stdout' if out is None else out}")  # fmt: skip
