"""`choreography-ray pools` in-process, where no cluster is needed: a missing address, and a
cluster nobody answers at. The listing is tested on real Ray (tests/runtime/test_pools.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app

runner = CliRunner()


def test_pools__needs_an_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    done = runner.invoke(app, ["pools"])

    assert done.exit_code == 2
    assert "pools asks the pools' hosts: give --address" in done.output


def test_pools__an_unreachable_cluster_exits_4() -> None:
    done = runner.invoke(app, ["pools", "--address", "127.0.0.1:1"])

    assert done.exit_code == 4
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in done.output
