"""A `ray start --head --block` of a test's own, as `tests/acceptance/test_cli.py`'s `ray_head`
fixture starts one: its own temp dir (so no other `ray.init` on the machine finds it) and its own
ports, stopped by a signal to the pid it started (which stops the processes it started), never by
`ray stop`: other Ray clusters run on this machine.

`ray start --head` here turns token authentication on; `driver_env` is the environment a driver
(or `ray job submit`) needs to join it: `RAY_AUTH_MODE=token`, the token read from
`~/.ray/auth_token`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import free_port, with_default_sigint

REPO = Path(__file__).resolve().parents[1]
#: How long `ray start --head` may take until its GCS answers, in seconds.
HEAD_START_SECONDS = 120
#: How long the head may take to exit once interrupted, in seconds.
HEAD_STOP_SECONDS = 30


def ray_command(name: str) -> str:
    """The `ray` script of this interpreter's environment."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


@dataclass(frozen=True)
class Head:
    #: The GCS address, as `ray.init(address=...)` takes it.
    address: str
    metrics_port: int
    #: The environment of a driver that joins this head.
    driver_env: dict[str, str]
    log: Path

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def base_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH (Ray workers import the job
    types by path) and without RAY_ADDRESS."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _give_up(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def _gcs_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def ray_head(env: Mapping[str, str] | None = None, num_cpus: int = 2) -> Iterator[Head]:
    """A head on 127.0.0.1 with a fixed `--metrics-export-port`; `env` is added to the head's
    environment (`RAY_...` settings reach the raylet and every worker it starts). A head that
    does not come up skips the test, and fails it under `CI=true`."""
    if shutil.which(ray_command("ray")) is None:
        pytest.skip("no `ray` command")
    temp_dir = tempfile.mkdtemp(prefix="crm-", dir="/tmp")  # short: Ray's sockets live under it
    gcs, metrics = free_port(), free_port()
    head_env = {**base_env(), **dict(env or {})}
    command = [
        ray_command("ray"), "start", "--head", "--block", "--temp-dir", temp_dir,
        "--node-ip-address", "127.0.0.1", "--port", str(gcs),
        "--dashboard-port", str(free_port()), "--dashboard-host", "127.0.0.1",
        "--include-dashboard", "true",
        "--dashboard-agent-listen-port", str(free_port()),
        "--dashboard-agent-grpc-port", str(free_port()),
        "--runtime-env-agent-port", str(free_port()),
        "--metrics-export-port", str(metrics),
        "--ray-client-server-port", str(free_port()),
        "--num-cpus", str(num_cpus), "--disable-usage-stats",
    ]  # fmt: skip
    with started_head(command, head_env, temp_dir, gcs) as log_path:
        yield Head(
            address=f"127.0.0.1:{gcs}",
            metrics_port=metrics,
            driver_env={**head_env, "RAY_AUTH_MODE": "token"},
            log=log_path,
        )


@contextlib.contextmanager
def started_head(
    command: list[str], env: Mapping[str, str], temp_dir: str, gcs: int
) -> Iterator[Path]:
    """Runs `command` (a `ray start --head --block` whose GCS listens on `gcs`) in a process
    group of its own until the GCS answers, and yields its output's file; at exit, stops it
    and everything it started, and removes `temp_dir`. A head that does not come up skips the
    test (fails it under `CI=true`)."""
    log_path = Path(temp_dir) / "ray-start.log"
    log = open(log_path, "w+b")  # noqa: SIM115 - closed below
    head = subprocess.Popen(with_default_sigint(command), cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + HEAD_START_SECONDS
        while not _gcs_answers(gcs):
            if head.poll() is not None:
                log.seek(0)
                _give_up(f"`ray start --head` failed: {log.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                _give_up(f"the GCS of `ray start --head` did not answer on port {gcs}")
            time.sleep(0.5)
        yield log_path
    finally:
        if head.poll() is None:
            # SIGINT, not SIGTERM: SIGTERM first drains the node, which here takes half a
            # minute; an interrupted `ray start --block` kills its processes at exit.
            head.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                head.wait(HEAD_STOP_SECONDS)
        # Whatever of the process group is left: the head's children (with an autoscaler,
        # the worker raylets it started, and their workers).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(HEAD_STOP_SECONDS)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
