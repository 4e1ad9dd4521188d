"""The core is the activation's rules in plain classes: none of its modules imports Ray or the
Ray shell (`choreography_ray.runtime`), so they are tested without a cluster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "choreography_ray" / "core"


def imported(path: Path) -> set[str]:
    """The modules a file imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module__imports_neither_ray_nor_the_runtime(path: Path) -> None:
    shell = {
        name
        for name in imported(path)
        if name == "ray" or name.startswith(("ray.", "choreography_ray.runtime"))
    }
    assert shell == set(), f"{path.name} imports {sorted(shell)}"


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module__but_the_activation_imports_no_job_core(path: Path) -> None:
    """The flows take `activation.Activation`, never `job.JobCore`, which imports them: the
    core has no import circle (issue 35), not even for type checking."""
    if path.name == "job.py":
        return
    assert "choreography_ray.core.job" not in imported(path), f"{path.name} imports job.py"
