"""The command line's root: `--version` and `--help`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import choreography_ray
from choreography_ray.cli import app

runner = CliRunner()


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"choreography-ray {choreography_ray.__version__}\n"


def test_help_describes_the_tool() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "durable job system" in result.stdout
    assert "--version" in result.stdout


def test_unknown_command_is_a_usage_error() -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2


def test_module_entry_point_runs_the_same_app() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "choreography_ray.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == f"choreography-ray {choreography_ray.__version__}\n"


def test_chaos__a_profile_with_no_fault_on_the_storage_exits_2_before_any_run() -> None:
    result = runner.invoke(app, ["chaos", "--profile", "proxy", "--storage", "sqlite"])
    assert result.exit_code == 2
    assert "draws no fault on sqlite" in result.output
    assert "running" not in result.output


def test_command_modules__import_only_the_shared_private_modules() -> None:
    """A command module imports its shared options and helpers from the `_` modules, never
    from another command module: `pools` and the `jobs` groups once imported each other."""
    root = Path(choreography_ray.__file__).parent / "cli"
    wrong = []
    for path in sorted(root.rglob("*.py")):
        if path.name.startswith("_"):  # the packages and the shared modules themselves
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            package, _, module = node.module.rpartition(".")
            if f"{package}.".startswith("choreography_ray.cli.") and not module.startswith("_"):
                wrong.append(f"{path.relative_to(root)}: from {node.module} import ...")
    assert wrong == []
