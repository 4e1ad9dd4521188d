"""When a schedule is due: intervals, cron in IANA zones across DST, once, after a parent."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from choreography_ray.scheduler.due import (
    Settled,
    latest_occurrence,
    next_due,
    next_occurrence,
)
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt, schedule_of
from tests.unit.scheduler.factory import T0, manifest, succeeded

HOUR = timedelta(hours=1)
BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")


def local(zone: ZoneInfo, *parts: int, fold: int = 0) -> datetime:
    year, month, day, hour, minute = parts
    return datetime(year, month, day, hour, minute, tzinfo=zone, fold=fold).astimezone(UTC)


def test_every__never_run_is_due_from_its_creation() -> None:
    m = manifest(schedule=Every.hours(1), created=T0)
    due = next_due(m, [], T0)
    assert due is not None and due.at == T0 and due.occurrence == T0


def test_every__counts_from_the_last_success() -> None:
    m = manifest(schedule=Every.hours(1))
    due = next_due(m, [Settled(T0, T0)], T0 + timedelta(minutes=10))
    assert due is not None and due.at == T0 + HOUR


def test_every__due_while_the_cluster_was_down_runs_once_for_the_latest_occurrence() -> None:
    m = manifest(schedule=Every.hours(1))
    now = T0 + timedelta(hours=5, minutes=20)
    due = next_due(m, [Settled(T0, T0)], now)
    assert due is not None and due.at == T0 + HOUR
    assert due.occurrence == T0 + 5 * HOUR
    # That one run settles every missed occurrence: the next is an hour after it, not 1 h after T0.
    after = next_due(m, [Settled(T0, T0), Settled(now, due.occurrence)], now + timedelta(minutes=1))
    assert after is not None and after.at == T0 + 6 * HOUR > now


@pytest.mark.parametrize(
    ("zone", "expression", "before", "expected"),
    [
        # Spring forward: 02:30 does not exist that night; it runs at the first minute after.
        (BERLIN, "30 2 * * *", (2025, 3, 29, 12, 0), (2025, 3, 30, 3, 0)),
        (NEW_YORK, "30 2 * * *", (2025, 3, 8, 12, 0), (2025, 3, 9, 3, 0)),
        # The day after, the wall-clock time holds again.
        (BERLIN, "30 2 * * *", (2025, 3, 30, 12, 0), (2025, 3, 31, 2, 30)),
        (NEW_YORK, "30 2 * * *", (2025, 3, 9, 12, 0), (2025, 3, 10, 2, 30)),
    ],
)
def test_cron__spring_forward_day(
    zone: ZoneInfo, expression: str, before: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    schedule = Cron(expression=expression, tz=str(zone))
    assert next_occurrence(schedule, local(zone, *before)) == local(zone, *expected)


@pytest.mark.parametrize(
    ("zone", "expression", "day"),
    [(BERLIN, "30 2 * * *", (2025, 10, 26)), (NEW_YORK, "30 1 * * *", (2025, 11, 2))],
)
def test_cron__fall_back_day_runs_a_repeated_time_once(
    zone: ZoneInfo, expression: str, day: tuple[int, int, int]
) -> None:
    schedule = Cron(expression=expression, tz=str(zone))
    hour, minute = int(expression.split()[1]), int(expression.split()[0])
    first = next_occurrence(schedule, local(zone, *day, 0, 0))
    # The first of the two wall-clock instants (summer time), then the next day, not the repeat.
    assert first == local(zone, *day, hour, minute, fold=0)
    second = next_occurrence(schedule, first)  # type: ignore[arg-type]
    assert second is not None and second - first == timedelta(hours=25)


def test_cron__hourly_across_fall_back_runs_every_real_hour() -> None:
    schedule = Cron(expression="0 * * * *", tz="Europe/Berlin")
    at, seen = local(BERLIN, 2025, 10, 26, 0, 30), []
    for _ in range(5):
        at = next_occurrence(schedule, at)  # type: ignore[assignment]
        seen.append(at)
    assert [b - a for a, b in itertools.pairwise(seen)] == [HOUR] * 4


def test_cron__latest_occurrence_not_after_now() -> None:
    schedule = Cron(expression="0 3 * * *", tz="Europe/Berlin")
    now = local(BERLIN, 2025, 6, 4, 3, 0)
    assert latest_occurrence(schedule, now) == now
    assert latest_occurrence(schedule, now - timedelta(seconds=1)) == now - timedelta(days=1)


def test_cron__missed_days_run_once_for_the_latest_occurrence() -> None:
    m = manifest(schedule=Cron(expression="0 3 * * *", tz="Europe/Berlin"))
    last = local(BERLIN, 2025, 6, 1, 3, 0)
    now = local(BERLIN, 2025, 6, 4, 9, 0)
    due = next_due(m, [Settled(last, last)], now)
    assert due is not None
    assert due.at == local(BERLIN, 2025, 6, 2, 3, 0)
    assert due.occurrence == local(BERLIN, 2025, 6, 4, 3, 0)


def test_cron__never_run_is_due_at_the_first_occurrence_after_creation() -> None:
    created = local(BERLIN, 2025, 6, 1, 10, 0)
    m = manifest(schedule=Cron(expression="0 3 * * *", tz="Europe/Berlin"), created=created)
    due = next_due(m, [], created)
    assert due is not None and due.at == local(BERLIN, 2025, 6, 2, 3, 0)


def test_once__due_at_its_time_until_settled() -> None:
    m = manifest(schedule=OnceAt(at=T0))
    due = next_due(m, [], T0 - HOUR)
    assert due is not None and due.at == T0
    assert next_due(m, [Settled(T0, T0)], T0 + HOUR) is None


def test_after__due_after_each_new_success_of_its_parent() -> None:
    m = manifest(schedule=After(parent="p"))
    parent = succeeded(T0, manifest_name="p")
    assert next_due(m, [], T0) is None
    due = next_due(m, [], T0 + HOUR, parent)
    assert due is not None and due.parent_run == parent.id and due.at == parent.ended_at
    consumed = Settled(T0 + HOUR, None, parent.id)
    assert next_due(m, [consumed], T0 + HOUR, parent) is None
    again = succeeded(T0 + 2 * HOUR, manifest_name="p")
    due = next_due(m, [consumed], T0 + 3 * HOUR, again)
    assert due is not None and due.parent_run == again.id


def test_after__a_parent_success_before_the_dependent_existed_fires_nothing() -> None:
    m = manifest(schedule=After(parent="p"), created=T0 + HOUR)
    assert next_due(m, [], T0 + 2 * HOUR, succeeded(T0, manifest_name="p")) is None


def test_schedule_of__exactly_one_keyword() -> None:
    assert schedule_of(every=60) == Every.minutes(1)
    assert schedule_of(cron="0 3 * * *", tz="Europe/Berlin").tz == "Europe/Berlin"  # type: ignore[union-attr]
    assert schedule_of(after="p") == After(parent="p")
    with pytest.raises(ValueError, match="exactly one"):
        schedule_of(every=60, after="p")
    with pytest.raises(ValueError, match="tz"):
        schedule_of(every=60, tz="UTC")


@pytest.mark.parametrize(
    "fields", [{"expression": "61 * * * *"}, {"expression": "* * *"}, {"tz": "Mars/Olympus"}]
)
def test_cron__bad_expression_or_zone_refused(fields: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Cron.model_validate({"expression": "0 3 * * *", **fields})


def test_every__interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Every(interval=timedelta(0))
