"""The autoscaling test kit (`tests/autoscaling.py`): a `request_resources` request read back
from a local cluster (no autoscaler), and, in the slow tier, a real autoscaler with the fake
multi-node provider that adds GPU nodes for a request and removes them once it is withdrawn.

The autoscaling scenario is a script run in a subprocess (it cannot share the session Ray of
`conftest.py`), as in `test_recovery_cluster.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from ray.autoscaler.sdk import request_resources
from ray.autoscaler.v2.sdk import request_cluster_resources
from ray.experimental.internal_kv import internal_kv_get_gcs_client

from tests.autoscaling import (
    autoscaling_cluster,
    constraint_bundles,
    requested_bundles,
)
from tests.heads import REPO


@pytest.fixture
def no_request(ray_cluster: None) -> Iterator[None]:
    """The session cluster's request withdrawn after the test: a request outlives its caller."""
    yield
    request_resources(bundles=[])


@pytest.mark.timeout(60)
def test_requested_bundles__reads_back_the_last_request_as_a_whole(no_request: None) -> None:
    request_resources(bundles=[{"GPU": 1}] * 3)
    assert requested_bundles() == [{"GPU": 1}] * 3

    request_resources(bundles=[{"GPU": 1, "CPU": 2}])  # replaces the request, adds nothing
    assert requested_bundles() == [{"GPU": 1, "CPU": 2}]

    request_resources(bundles=[])
    assert requested_bundles() == []


@pytest.mark.timeout(60)
def test_constraint_bundles__reads_the_autoscaler_v2_form(no_request: None) -> None:
    """Autoscaler v2 keeps one entry per distinct bundle with a count; read back, it is one
    bundle each again. (This cluster runs no v2 autoscaler: the request is written as
    `request_resources` writes it under v2.)"""
    gcs = internal_kv_get_gcs_client().address
    request = [{"resources": {"GPU": 1}, "label_selector": {}}] * 3
    request_cluster_resources(gcs, [*request, {"resources": {"CPU": 2}, "label_selector": {}}])
    assert sorted(constraint_bundles(), key=str) == [{"CPU": 2}] + [{"GPU": 1}] * 3

    request_cluster_resources(gcs, [])
    assert constraint_bundles() == []


ROUND_TRIP = """
import json, signal, sys, time

import ray
from ray.autoscaler.sdk import request_resources

from tests.autoscaling import alive_gpus, requested_bundles

address, deadline = sys.argv[1], int(sys.argv[2])


def on_deadline(*_):
    raise TimeoutError(f"autoscaling round trip still running after {deadline} s")


signal.signal(signal.SIGALRM, on_deadline)
signal.alarm(deadline)


def seconds_until(check, what, timeout):
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what} ({alive_gpus()} GPUs alive)")
        time.sleep(0.2)
    return round(time.monotonic() - start, 1)


ray.init(address=address, logging_level="WARNING", log_to_driver=False)
before = alive_gpus()
request_resources(bundles=[{"GPU": 1}, {"GPU": 1}])
read_back = requested_bundles()
up = seconds_until(lambda: alive_gpus() == 2, "two GPU nodes joined", 90)
held = time.monotonic()
time.sleep(8)  # past the idle timeout: the request alone keeps the nodes
kept = alive_gpus()
request_resources(bundles=[])
cleared = requested_bundles()
down = seconds_until(lambda: alive_gpus() == 0, "the GPU nodes were removed", 90)

# The other demand an autoscaler reads: an actor Ray cannot place, with no request at all.
Host = ray.remote(num_gpus=1)(type("Host", (), {"ping": lambda self: "pong"}))
host = Host.remote()
actor_up = seconds_until(lambda: alive_gpus() == 1, "a GPU node joined for the actor", 90)
pong = ray.get(host.ping.remote(), timeout=60)
ray.kill(host)
actor_down = seconds_until(lambda: alive_gpus() == 0, "the actor's node was removed", 90)
ray.shutdown()
print(json.dumps({"before": before, "read_back": read_back, "up": up, "kept": kept,
                  "cleared": cleared, "down": down, "pong": pong, "actor_up": actor_up,
                  "actor_down": actor_down}))
"""


def run_driver(script: str, env: dict[str, str], *args: str, timeout: int) -> dict[str, object]:
    """The script as a driver in a process group of its own; the last line of its output is
    JSON."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args, str(timeout)],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"driver hung past its deadline:\n{err[-3000:]}")
    assert process.returncode == 0, err[-5000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(300)
@pytest.mark.slow  # a head of its own whose autoscaler starts three raylets: about a minute
@pytest.mark.parametrize("autoscaler_v2", [False, True], ids=["v1", "v2"])
def test_fake_autoscaler__request_resources_adds_gpu_nodes_and_withdrawing_it_removes_them(
    autoscaler_v2: bool,
) -> None:
    """The head has no GPU; the worker type has one (0 to 2 nodes, idle timeout 6 s). A
    request of two GPU bundles alone brings two nodes, which stay while it holds; an empty
    request lets the autoscaler remove them. The request reads back under either autoscaler.
    Then a GPU actor Ray cannot place brings one node alone, removed once the actor ends."""
    with autoscaling_cluster(
        max_workers=2, idle_timeout_minutes=0.1, autoscaler_v2=autoscaler_v2
    ) as head:
        result = run_driver(ROUND_TRIP, head.driver_env, head.address, timeout=200)
    assert result["before"] == 0
    assert result["read_back"] == [{"GPU": 1}, {"GPU": 1}]
    assert result["kept"] == 2
    assert result["cleared"] == []
    assert result["pong"] == "pong"
    print(f"request: up {result['up']} s, down {result['down']} s; "
          f"pending actor: up {result['actor_up']} s, down {result['actor_down']} s")  # fmt: skip
