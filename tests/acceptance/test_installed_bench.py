"""`choreography-ray bench` from an installed wheel, the way a user gets it: the wheel built from
this checkout, installed by pip into a fresh virtualenv outside the checkout, and the command
run from a directory that is not the checkout, so nothing can come from it.

The virtualenv must hold the wheel and its dependencies, but downloading Ray and its
dependencies takes minutes and needs the network. So the dependencies are the distributions
this environment has installed, linked into the new virtualenv's site-packages: only those the
wheel declares (its `Requires-Dist`, with extras and markers, followed transitively), so an
undeclared import fails there as it would for a user. pip then installs the wheel with
`--no-index` and checks that every declared requirement is met. The wheel is built without
build isolation (the test extra brings the setuptools it needs), so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from email import message_from_bytes
from email.message import Message
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
#: How long building the wheel and installing it may take, in seconds (about 10 here).
INSTALL_SECONDS = 180
#: How long the small bench may take, in seconds (about 40 here: Ray starting is most of it).
BENCH_SECONDS = 300
#: Steps of the bench's job: small, the point is that the installed command runs.
BENCH_STEPS = 1000

#: What the wheel's build needs of a checkout; the rest (tests, caches, venvs) is left out.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", ".*_cache", ".hypothesis", "build", "dist", "*.egg-info",
    "*.db", "*.db-*", "tests", "benchmarks",
)  # fmt: skip


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
        f"--- stderr\n{done.stderr[-4000:]}"
    )


def run(
    *args: str | Path, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`args` run to completion; fails the test unless it exits 0."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, explain(done)
    return done


def build_wheel(scratch: Path) -> Path:
    """The wheel of a copy of this checkout (a build writes into its source tree)."""
    source = scratch / "source"
    shutil.copytree(REPO, source, ignore=IGNORED)
    out = scratch / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
        "--wheel-dir", out, source, timeout=INSTALL_SECONDS)  # fmt: skip
    (wheel,) = out.glob("choreography_ray-*.whl")
    return wheel


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_metadata(wheel: Path) -> Message:
    """The wheel's METADATA (name, version, `Requires-Dist`)."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return message_from_bytes(archive.read(name))


def declared_closure(wheel: Path) -> list[metadata.Distribution]:
    """The installed distributions of everything the wheel requires, transitively: each
    requirement's extras and environment markers evaluated as pip does."""
    found: dict[str, tuple[metadata.Distribution, frozenset[str]]] = {}
    todo = [Requirement(text) for text in wheel_metadata(wheel).get_all("Requires-Dist") or ()]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        requirement = todo.pop()
        key, extras = _key(requirement.name), frozenset(requirement.extras)
        known = found.get(key)
        if known is not None and extras <= known[1]:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{requirement} is declared but not installed in this environment")
        extras |= known[1] if known else frozenset()
        found[key] = (dist, extras)
        for text in dist.requires or ():
            needed = Requirement(text)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in extras or {""}
            ):
                todo.append(needed)
    return [dist for dist, _ in found.values()]


def link_dependencies(dists: list[metadata.Distribution], site: Path) -> None:
    """Each distribution's top-level files and folders (its modules, its .dist-info), linked
    into `site`. A namespace folder shared by several (`google/`) is linked once."""
    for dist in dists:
        if dist.files is None:
            pytest.fail(f"{dist.metadata['Name']} was installed without a RECORD of its files")
        root = Path(str(dist.locate_file("")))
        for top in {file.parts[0] for file in dist.files} - {"..", "__pycache__"}:
            target = site / top
            if not target.exists() and (root / top).exists():
                target.symlink_to(root / top)


@pytest.mark.slow  # builds a wheel, makes a virtualenv, starts Ray: about a minute
@pytest.mark.timeout(INSTALL_SECONDS + BENCH_SECONDS + 60)
def test_installed_wheel__bench_runs_outside_the_checkout(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(
        run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
            timeout=60).stdout.strip()
    )  # fmt: skip
    link_dependencies(declared_closure(wheel), site)
    # pip of this environment installs into the new one; --no-index: the dependencies must be
    # met by what is there, nothing downloaded.
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", wheel,
        timeout=INSTALL_SECONDS)  # fmt: skip

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    drop = {"PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(env_dir / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(env_dir)

    located = run(python, "-c", "import choreography_ray; print(choreography_ray.__file__)",
                  cwd=workdir, env=env, timeout=60)  # fmt: skip
    package = Path(located.stdout.strip())
    assert package == site / "choreography_ray" / "__init__.py", located.stdout
    assert not package.is_symlink() and REPO not in package.resolve().parents

    report_file = workdir / "bench.json"
    # --actor-sample 0: creating the sample's 200 detached actors alone takes about a minute;
    # tests/acceptance/test_bench.py measures it from the checkout.
    done = run(env_dir / "bin" / "choreography-ray", "bench", "--steps", str(BENCH_STEPS),
               "--actor-sample", "0", "--json", report_file,
               cwd=workdir, env=env, timeout=BENCH_SECONDS)  # fmt: skip
    assert "durable / bare tasks" in done.stdout, explain(done)

    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert report["machine"]["choreography_ray"] == wheel_metadata(wheel)["Version"]
    assert "git_commit" not in report["machine"]  # an installed wheel is no checkout
    (durable,) = report["durable"]
    assert durable["steps"] == BENCH_STEPS
    assert durable["status"] == "CompletedSuccessfully"
    assert durable["successful_steps"] == BENCH_STEPS
    assert durable["seconds"] > 0 and durable["ratio_vs_bare_tasks"] > 0
    (bare,) = report["bare_tasks"]
    assert bare["steps"] == BENCH_STEPS and bare["seconds"] > 0
    assert report["actors"] == []
