"""`choreography-ray limits` in-process, where no cluster is needed: a missing address, a
cluster nobody answers at, and a limit `set` refuses before it joins. The listing and `set` on
a cluster are tested on real Ray (tests/runtime/test_limits.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.cli.limits import limits_table
from choreography_ray.limit import Limit, LimitKey, LimitState

runner = CliRunner()


@pytest.mark.parametrize("args", [["limits"], ["limits", "set", "crm", "--max-concurrent", "2"]])
def test_limits__needs_an_address(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    done = runner.invoke(app, args)

    assert done.exit_code == 2
    assert "asks the cluster's limiter: give --address" in done.output


def test_limits__an_unreachable_cluster_exits_4() -> None:
    done = runner.invoke(app, ["limits", "--address", "127.0.0.1:1"])

    assert done.exit_code == 4
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in done.output


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--rate", "0"], "greater than 0"),
        (["--max-concurrent", "-1"], "greater than or equal to 0"),
        (["--rate", "5", "--per", "0"], "per must be a positive duration"),
    ],
)
def test_limits_set__a_wrong_limit_exits_2_before_joining(options: list[str], says: str) -> None:
    done = runner.invoke(app, ["limits", "set", "crm", *options, "--address", "127.0.0.1:1"])

    assert done.exit_code == 2
    assert says in done.output


def test_limits_table__a_row_per_limit_with_its_top_keys() -> None:
    state = LimitState(
        name="crm-api",
        kind="named",
        limit=Limit(max_concurrent=50, rate=600, per=60, burst=50),
        held=3,
        waiting=7,
        top_keys=(LimitKey(key="acme", held=2, waiting=5),),
        live=True,
    )

    columns = [list(column.cells) for column in limits_table([state]).columns]
    row = [cells[0] for cells in columns]

    assert row == [
        "crm-api",
        "named",
        "50 at once, 600 per 60 s (burst 50) (set live)",
        "3",
        "7",
        "acme 2/5",
    ]
