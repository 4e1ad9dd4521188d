"""`choreography-ray chaos`: the chaos soak, N seeded runs of the chaos harness.

The harness lives in the repository's test tree (`tests/chaos/`, docs/chaos.md), not in the
package: this command finds it in a source checkout, puts the repository root on `sys.path`,
and only parses options and prints. An installed wheel has no `tests/`: the command then says
so and exits 2. Each run starts a Ray cluster of its own in a subprocess.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from choreography_ray.cli._common import ExitCode, console, err_console, fail

#: The directory that holds this package in a source checkout.
REPO_ROOT = Path(__file__).resolve().parents[2]


def _harness() -> Any:
    """The `tests.chaos.harness` module of the source checkout, or exit 2 saying why not."""
    if not (REPO_ROOT / "tests" / "chaos" / "harness.py").is_file():
        fail(
            "`chaos` runs from a source checkout of choreography-ray: it needs the "
            f"repository's tests/chaos/ harness, looked for in {REPO_ROOT / 'tests' / 'chaos'}"
        )
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        return importlib.import_module("tests.chaos.harness")
    except ImportError as error:
        fail(f"the chaos harness in {REPO_ROOT / 'tests' / 'chaos'} is not importable: {error}")


def _line(result: Any) -> str:
    faults = ", ".join(f.kind + ("" if f.injected else " (not injected)") for f in result.faults)
    reruns = sum(result.reruns.values())
    verdict = "ok" if result.ok else f"FAILED ({len(result.violations)} violations)"
    if result.error:
        verdict = "HARNESS ERROR"
    return (
        f"seed {result.seed}: {verdict} in {result.seconds:.0f} s; faults: {faults or 'none'}; "
        f"re-runs: {reruns}"
    )


def _print_summary(summary: dict[str, Any]) -> None:
    out = console.print
    out(f"runs: {summary['runs']} ({summary['seconds']:.0f} s)", highlight=False)
    injected = summary["faults_injected"]
    out(
        "faults injected by kind: "
        + (", ".join(f"{k} {n}" for k, n in injected.items()) or "none"),
        highlight=False,
        soft_wrap=True,
    )
    if summary["faults_not_injected"]:
        out(
            "faults not injected (nothing to hit): "
            + ", ".join(f"{k} {n}" for k, n in summary["faults_not_injected"].items()),
            highlight=False,
            soft_wrap=True,
        )
    out(
        f"re-runs of in-flight steps: {summary['reruns_in_flight']}, of steps whose outcome was "
        f"written (at a lossy fault): {summary['reruns_after_outcome']}",
        highlight=False,
    )
    if summary["reruns"]:
        out(
            "re-runs by cause: " + ", ".join(f"{k} {n}" for k, n in summary["reruns"].items()),
            highlight=False,
            soft_wrap=True,
        )
    longest = summary["longest_fault_to_progress"]
    if longest:
        out(
            f"longest time from a fault to the job making progress again: "
            f"{longest['seconds']:.1f} s ({longest['kind']}, seed {longest['seed']})",
            highlight=False,
        )
    violations = summary["violations"]
    out(f"invariant violations: {len(violations)}", highlight=False)
    for v in violations:
        out(
            f"  seed {v['seed']}: {v['kind']} (job {v['job']}): {v['detail']}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    if summary["failed_seeds"]:
        out(f"failing seeds: {' '.join(map(str, summary['failed_seeds']))}", highlight=False)


def chaos(
    runs: Annotated[int, typer.Option("--runs", min=1, metavar="N", help="Runs to make.")] = 10,
    seed: Annotated[
        int, typer.Option("--seed", metavar="S", help="The first run's seed; run i uses S + i.")
    ] = 0,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="ci: small jobs, 1-2 faults; soak: bigger jobs, up to 4 faults; tier: ci's "
            "jobs, 3-4 faults (these three: a fault during a stop besides, one run in five); "
            "activation: soak's, with job actors killed during stops, "
            "removals, or with their hosts; proxy (with --storage mongodb): tier's jobs, six "
            "faults of the MongoDB fault proxy only; pool: tier's, pool jobs among them on GPU "
            "worker nodes, and the pool faults (a pool host killed mid-batch, a GPU node "
            "removed, a job whose pool no node can place).",
        ),
    ] = "soak",
    storage: Annotated[
        str,
        typer.Option(
            "--storage",
            help="sqlite: an SQLite file under the storage wrapper's faults; mongodb: MongoDB "
            "behind the fault proxy (CHOREOGRAPHY_MONGODB_URI's server, else an nx-27017 of "
            "each run's own), with the proxy's faults.",
        ),
    ] = "sqlite",
    json_file: Annotated[
        Path | None,
        typer.Option("--json", metavar="FILE", help="Write every run and the summary as JSON."),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep every run's directory, not only failed ones'.")
    ] = False,
) -> None:
    """Run the chaos harness: seeded jobs on a Ray cluster of their own under random faults,
    every invariant checked after each run. See docs/chaos.md."""
    harness = _harness()
    if profile not in harness.PROFILES:
        fail(f"unknown profile {profile!r}: use one of {', '.join(harness.PROFILES)}")
    if storage not in harness.STORAGES:
        fail(f"unknown storage {storage!r}: use one of {', '.join(harness.STORAGES)}")
    if not harness.fault_weights(harness.PROFILES[profile], storage):
        fail(f"the {profile} profile draws no fault on {storage}: use --storage mongodb")
    results = []
    for i in range(runs):
        run_seed = seed + i
        err_console.print(f"seed {run_seed}: running", style="dim", highlight=False)
        result = harness.run_seed(run_seed, profile, keep=keep, storage=storage)
        results.append(result)
        console.print(_line(result), highlight=False, markup=False, soft_wrap=True)
        if not result.ok:
            err_console.print(
                harness.describe(result), highlight=False, markup=False, soft_wrap=True
            )
    summary = harness.summarize(results)
    _print_summary(summary)
    if json_file is not None:
        data = {"summary": summary, "runs": [r.to_json() for r in results]}
        json_file.write_text(json.dumps(data, indent=2))
        err_console.print(f"wrote {json_file}", highlight=False, markup=False)
    if summary["violations"]:
        raise typer.Exit(ExitCode.JOB_NOT_SUCCESSFUL)


def register(app: typer.Typer) -> None:
    app.command("chaos")(chaos)
