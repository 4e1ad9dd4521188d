"""Prints docs/options.md: every option of `JobsOptions` and `SchedulerOptions` with its type,
default and meaning, read from the models and the `#:` comment above each field.

    python scripts/options_table.py > docs/options.md

`tests/docs/test_options_table.py` fails when docs/options.md is not what this prints."""

from __future__ import annotations

import ast
import inspect
import sys
import types
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from choreography_ray.options import JobsOptions
from choreography_ray.scheduler.options import SchedulerOptions

HEADER = """# Options

Every option of `JobsOptions` (passed to `Jobs.connect(options=...)`) and of `SchedulerOptions`
(`JobsOptions(scheduler=...)`), with its default. Durations are `timedelta`; a plain number reads
as seconds. This page is generated from the models: `python scripts/options_table.py >
docs/options.md` (a test fails when it drifts).
"""


def comments(model: type[BaseModel]) -> dict[str, str]:
    """Each field's `#:` comment, joined into one line."""
    tree = ast.parse(inspect.getsource(model))
    lines = inspect.getsource(model).splitlines()
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                text.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            found[node.target.id] = " ".join(text)
    return found


def shown(value: Any) -> str:
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, BaseModel):
        return f"`{type(value).__name__}()`"
    return repr(value)


def _duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size * (2 if unit == "days" else 1) and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return "0" if seconds == 0 else f"{seconds * 1000:g} ms"


def type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `duration`, `int | None`, `tuple[str, ...]`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if annotation is type(None):
        return "None"
    if annotation is timedelta:
        return "duration"
    return getattr(annotation, "__name__", str(annotation))


def table(model: type[BaseModel], prefix: str = "") -> list[str]:
    notes = comments(model)
    rows = ["| option | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        kind = type_name(field.annotation).replace("|", "\\|")
        meaning = notes.get(name, "").replace("|", "\\|")
        default = field.get_default(call_default_factory=True)
        rows.append(f"| `{prefix}{name}` | `{kind}` | {shown(default)} | {meaning} |")
    return rows


def render() -> str:
    parts = [HEADER, "## `JobsOptions`", "", *table(JobsOptions), ""]
    parts += ["## `SchedulerOptions` (`JobsOptions.scheduler`)", ""]
    parts += [*table(SchedulerOptions, "scheduler."), ""]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(render())
