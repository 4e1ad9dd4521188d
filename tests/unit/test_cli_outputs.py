"""`jobs outputs` in process, on an SQLite file whose job and step outputs are written through
the storage API, without Ray: JSON lines to stdout and to a file, a Parquet file read back with
pyarrow, `--stage`, pages written one at a time, and the refusals (unknown job, parquet without
`--out`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import choreography_ray as cr
from choreography_ray.cli import app
from choreography_ray.cli.jobs import outputs
from choreography_ray.storage import Storage, StoredOutput
from tests.support import in_storage, seed_job

pytestmark = pytest.mark.timeout(30)

JOB = "job-words"
#: What the steps returned, by step id: stage 0 counted words, stage 10 summed them (another
#: shape), and one step ran twice.
OUTPUTS: dict[str, tuple[int, int, Any]] = {
    "count-000": (0, 1, {"word": "über", "count": 3}),
    "count-001": (0, 2, {"word": "ray", "count": 5, "tags": ["x", "y"]}),
    "count-002": (0, 1, {"word": "job", "count": 1}),
    "count-003": (0, 1, {"word": "step", "count": 2}),
    "sum-000": (10, 1, {"total": 11, "by": {"über": 3, "ray": 5, "job": 1, "step": 2}}),
}


def rows(stage: int | None = None) -> list[dict[str, Any]]:
    """The rows `jobs outputs` writes, in step-id order."""
    return [
        {"job_id": JOB, "step_id": step_id, "stage": s, "attempt": attempt, "output": output}
        for step_id, (s, attempt, output) in sorted(OUTPUTS.items())
        if stage in (None, s)
    ]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An SQLite file with the job, its outputs, and another job's output beside them."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    state = cr.JobState(id=JOB, scope="ops", namespace="a", type="pkg.words:Count",
                        created=datetime(2026, 3, 1, tzinfo=UTC))  # fmt: skip
    seed_job(url, state.with_status(cr.JobStatus.COMPLETED_SUCCESSFULLY))
    seed_job(url, state.model_copy(update={"id": "job-other"}))
    stored = [StoredOutput(JOB, step_id, stage, attempt, json.dumps(output))
              for step_id, (stage, attempt, output) in OUTPUTS.items()]  # fmt: skip
    stored.append(StoredOutput("job-other", "count-000", 0, 1, '{"word": "elsewhere"}'))

    async def write(storage: Storage) -> None:
        await storage.put_outputs(stored)

    in_storage(url, write)
    return url


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two outputs a page, so that five are read and written in three pages."""
    monkeypatch.setattr(outputs, "PAGE", 2)


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["jobs", "outputs", *args], terminal_width=200)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_jsonl_to_stdout__one_object_a_line_in_step_id_order(url: str) -> None:
    done = run(JOB, "--storage", url)

    assert done.exit_code == 0, done.output
    assert lines(done.stdout) == rows()
    assert f"5 output(s) of job {JOB} written to stdout" in done.stderr


def test_jsonl_to_a_file__replaced_once_complete(url: str, tmp_path: Path) -> None:
    out = tmp_path / "words.jsonl"
    out.write_text("an earlier export\n")

    done = run(JOB, "--storage", url, "--out", str(out))

    assert done.exit_code == 0, done.output
    assert done.stdout == ""
    assert lines(out.read_text(encoding="utf-8")) == rows()
    assert f"5 output(s) of job {JOB} written to {out}" in done.stderr
    assert not outputs.partial_path(out).exists()


def test_a_failed_export__leaves_the_earlier_file_and_no_partial_one(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "words.jsonl"
    out.write_text("an earlier export\n")
    written: list[str] = []

    def line_then_fail(stored: StoredOutput) -> str:
        if len(written) == 3:  # on the second page
            raise ValueError("the disk went away")
        written.append(stored.step_id)
        return "{}\n"

    monkeypatch.setattr(outputs, "json_line", line_then_fail)
    done = run(JOB, "--storage", url, "--out", str(out))

    assert done.exit_code == 1 and "the disk went away" in done.stderr, done.output
    assert out.read_text() == "an earlier export\n"
    assert not outputs.partial_path(out).exists()


def test_parquet__read_back_with_pyarrow_a_row_group_per_page(url: str, tmp_path: Path) -> None:
    out = tmp_path / "words.parquet"

    done = run(JOB, "--storage", url, "--format", "parquet", "--out", str(out))

    assert done.exit_code == 0, done.output
    file = pq.ParquetFile(out)
    assert file.metadata.num_rows == 5 and file.metadata.num_row_groups == 3
    assert file.schema_arrow.names == ["job_id", "step_id", "stage", "attempt", "output"]
    assert str(file.schema_arrow.field("output").type) == "string"
    read = file.read().to_pylist()
    # The output column holds each step's JSON text, whatever its shape.
    assert [{**row, "output": json.loads(row["output"])} for row in read] == rows()
    assert f"5 output(s) of job {JOB} written to {out}" in done.stderr


def test_stage__only_that_stages_outputs(url: str, tmp_path: Path) -> None:
    counted = run(JOB, "--storage", url, "--stage", "0")
    assert counted.exit_code == 0, counted.output
    assert lines(counted.stdout) == rows(stage=0) and len(rows(stage=0)) == 4
    assert "4 output(s) of stage 0 of job" in counted.stderr

    out = tmp_path / "sum.parquet"
    summed = run(JOB, "--storage", url, "--stage", "10", "--format", "PARQUET", "--out", str(out))
    assert summed.exit_code == 0, summed.output
    assert pq.read_table(out).column("step_id").to_pylist() == ["sum-000"]

    none = run(JOB, "--storage", url, "--stage", "20")
    assert none.exit_code == 0 and none.stdout == "", none.output
    assert "0 output(s) of stage 20" in none.stderr


def test_unknown_job__one_line_exit_2_and_no_file(url: str, tmp_path: Path) -> None:
    out = tmp_path / "ghost.jsonl"

    done = run("ghost", "--storage", url, "--out", str(out))

    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: no job ghost in sqlite:///")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists() and not outputs.partial_path(out).exists()
    another = run(JOB, "--storage", url, "--scope", "elsewhere")
    assert another.exit_code == 2 and f"no job {JOB}" in another.stderr, another.output


def test_refusals_before_any_read(url: str, tmp_path: Path) -> None:
    parquet = run(JOB, "--storage", url, "--format", "parquet")
    assert parquet.exit_code == 2 and "--out" in parquet.output, parquet.output
    nowhere = run(JOB, "--storage", url, "--out", str(tmp_path / "missing" / "x.jsonl"))
    assert nowhere.exit_code == 2 and "no directory" in nowhere.output, nowhere.output
    memory = run(JOB, "--storage", "memory://")
    assert memory.exit_code == 2 and "memory://" in memory.output, memory.output


def test_help__the_options_and_the_global_ones() -> None:
    done = run("--help")
    assert done.exit_code == 0, done.output
    for option in ("--stage", "--format", "--out", "--storage", "--debug", "--log-json"):
        assert option in done.output, option
