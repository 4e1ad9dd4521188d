"""`choreography-ray jobs ...`: jobs as stored, and the operations on them.

- `reading.py`: `list`, `show`, `steps`, `failures` read the storage directly (read-only, no
  Ray);
- `watching.py`: `watch` follows one job live, from storage too;
- `outputs.py`: `outputs` writes a job's step outputs (JSON lines or Parquet), from storage too;
- `acting.py`: `stop`, `resume`, `remove`, `retry-failed` and `rehydrate` go through the jobs
  manager running in the cluster at `--address`.

`status` and `list`, the commands of earlier releases, stay at the top level as aliases of
`jobs show` and `jobs list`.
"""

from __future__ import annotations

import typer

from choreography_ray.cli.jobs import acting, outputs, reading, watching

app = typer.Typer(
    name="jobs",
    help="Jobs as stored (list, show, steps, failures, outputs, watch) and operations on them "
    "(stop, resume, remove, retry-failed, rehydrate).",
    no_args_is_help=True,
)
app.command("list")(reading.list_jobs)
app.command("show")(reading.show)
app.command("steps")(reading.steps)
app.command("failures")(reading.failures)
app.command("outputs")(outputs.outputs)
app.command("watch")(watching.watch)
acting.register(app)


def register(root: typer.Typer) -> None:
    root.add_typer(app)
    root.command("status", help="Alias of `jobs show`: a job's status, stages and failures.")(
        reading.show
    )
    root.command("list", help="Alias of `jobs list`: the stored jobs, newest first.")(
        reading.list_jobs
    )
