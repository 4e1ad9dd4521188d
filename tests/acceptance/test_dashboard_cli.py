"""`choreography-ray dashboard` as a user starts it: a real server process on loopback, asked
over HTTP, stopped with SIGINT. Without --address no Ray starts, so each run takes a second."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from choreography_ray.model import JobState
from tests.acceptance.test_cli import REPO, cli, cli_env, explain
from tests.support import free_port, in_storage, with_default_sigint

#: How long the server may take to print its address, in seconds.
START_SECONDS = 60


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """The dashboard's process and what it printed up to the line after its address."""
    server = subprocess.Popen(
        with_default_sigint([sys.executable, "-m", "choreography_ray.cli", "dashboard", *args]),
        cwd=REPO, env=env or cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert server.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + START_SECONDS
    while not any("dashboard at" in line for line in lines[:-1]):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            reader.join(5)
            pytest.fail(f"the dashboard did not start: {''.join(lines)}")
        time.sleep(0.05)
    return server, "".join(lines)


def stop(server: subprocess.Popen[str]) -> None:
    server.send_signal(signal.SIGINT)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def answer(url: str) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def storage_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def write(storage):  # type: ignore[no-untyped-def]
        await storage.create_job(JobState(id="cli-job", scope="s", namespace="n", type="a:B"))

    in_storage(url, write)
    yield url


def test_dashboard__serves_loopback_read_only_by_default(storage_url: str) -> None:
    port = free_port()
    server, printed = start("--storage", storage_url, "--port", str(port))
    try:
        assert f"dashboard at http://127.0.0.1:{port}/" in printed
        assert "read only" in printed
        page = answer(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "cli-job" in page.text
        assert answer(f"http://127.0.0.1:{port}/jobs/cli-job").status_code == 200
        assert answer(f"http://127.0.0.1:{port}/jobs/missing").status_code == 404
        assert "server" not in page.headers
    finally:
        stop(server)
    assert server.returncode in (0, -signal.SIGINT), printed


@pytest.mark.slow  # a Ray head of its own: about 25 s
def test_dashboard__with_an_address_prints_a_token_that_logs_in(storage_url: str) -> None:
    port = free_port()
    env = {k: v for k, v in cli_env().items() if k != "CHOREOGRAPHY_DASHBOARD_TOKEN"}
    server, printed = start("--storage", storage_url, "--port", str(port), "--address", "local",
                            env=env)  # fmt: skip
    try:
        found = re.search(rf"log in at http://127.0.0.1:{port}/login\?token=(\S+)", printed)
        assert found, printed
        base = f"http://127.0.0.1:{port}"
        # The address is printed before the server listens: the first request waits for it.
        assert answer(f"{base}/login?token=wrong").status_code == 403
        login = httpx.get(f"{base}/login?token={found[1]}")
        assert login.status_code == 303 and "cr_session" in login.headers["set-cookie"]
        page = httpx.get(f"{base}/jobs/cli-job", cookies=login.cookies)
        assert 'id="action-stop"' in page.text and "log out" in page.text
    finally:
        stop(server)


def test_dashboard__memory_storage_and_a_bad_url_are_refused() -> None:
    done = cli("dashboard", "--storage", "memory://", timeout=60)
    assert done.returncode == 2 and "memory://" in done.stderr, explain(done)
    done = cli("dashboard", "--storage", "redis://x", timeout=60)
    assert done.returncode == 2 and "unknown storage URL" in done.stderr, explain(done)
    assert re.search(r"--port\b", cli("dashboard", "--help", timeout=60).stdout)
