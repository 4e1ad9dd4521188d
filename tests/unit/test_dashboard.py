"""The dashboard's pure parts: bars, the measured rate and ETA, the list's filters and links,
the guard's signatures, and the CLI's host rules."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatch
from pathlib import Path

import pytest

import choreography_ray.dashboard
from choreography_ray.cli.dashboard import allowed_hosts, is_loopback
from choreography_ray.dashboard.jobs import BadQuery, JobsQuery, parse_since, parse_status
from choreography_ray.dashboard.progress import Bar, RateTracker
from choreography_ray.dashboard.security import TOKEN_ENV, Guard, token_from_environment
from choreography_ray.dashboard.site import relative, seconds
from choreography_ray.model import JobProgress, JobState, StageProgress, StatusChange, utcnow
from choreography_ray.status import JobStatus

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def running(done: int, total: int = 1_000, since: timedelta = timedelta(seconds=100)) -> JobState:
    changes = (StatusChange(status=JobStatus.RUNNING, occurred=utcnow() - since),)
    return JobState(id="j", scope="s", namespace="n", type="a:B", status=JobStatus.RUNNING,
                    status_changes=changes,
                    progress=JobProgress(total_steps=total, successful_steps=done))  # fmt: skip


def test_bar__segments_in_order_with_their_share_of_the_total() -> None:
    bar = Bar.of(StageProgress(stage=0, total_steps=8, successful_steps=4, failed_steps=1,
                               unreachable_steps=1, stopped_steps=2))  # fmt: skip
    assert bar.done == 6
    assert bar.segments() == [
        ("successful", 4, 0.0, 50.0), ("failed", 1, 50.0, 12.5),
        ("unreachable", 1, 62.5, 12.5), ("stopped", 2, 75.0, 25.0),
    ]  # fmt: skip
    assert Bar.of(JobProgress()).segments() == [] and Bar.of(JobProgress()).share(3) == 0.0


def test_rate__the_average_since_running_at_first_then_measured_between_looks() -> None:
    tracker = RateTracker(window=30)
    first = tracker.pace(running(500), now=0.0)
    assert first is not None and first.basis == "average"
    assert first.rate == pytest.approx(5.0, rel=0.05) and first.eta == pytest.approx(100, rel=0.05)

    tracker.pace(running(520), now=0.5)  # under a second apart: still the average
    later = tracker.pace(running(600), now=10.0)
    assert later is not None and later.basis == "measured"
    assert later.rate == pytest.approx(10.0) and later.eta == pytest.approx(40.0)


def test_rate__samples_older_than_the_window_are_dropped_and_a_recount_starts_over() -> None:
    tracker = RateTracker(window=30)
    for t, done in ((0, 0), (10, 100), (20, 200), (50, 800)):
        pace = tracker.pace(running(done), now=float(t))
    assert pace is not None and pace.rate == pytest.approx((800 - 200) / 30)
    pace = tracker.pace(running(100), now=60.0)  # fewer done: counted again from storage
    assert pace is not None and pace.basis == "average"


def test_rate__none_unless_running_and_bounded_in_jobs() -> None:
    tracker = RateTracker(jobs=2)
    stopped = running(10).model_copy(update={"status": JobStatus.STOPPED})
    assert tracker.pace(stopped) is None
    for n in range(5):
        tracker.pace(running(10).model_copy(update={"id": f"j{n}"}), now=float(n))
    assert list(tracker._samples) == ["j3", "j4"]
    assert tracker.pace(running(1_000), now=1.0).eta == 0.0  # type: ignore[union-attr]


def test_filters__status_by_name_or_value_and_since_relative_or_absolute() -> None:
    assert parse_status("COMPLETED_WITH_FAILURES") is JobStatus.COMPLETED_WITH_FAILURES
    assert parse_status("completedwithfailures") is parse_status("CompletedWithFailures")
    assert parse_status("") is None
    assert parse_since("90m", NOW) == NOW - timedelta(minutes=90)
    assert parse_since("2d", NOW) == NOW - timedelta(days=2)
    assert parse_since("2026-11-30", NOW) == datetime(2026, 11, 30, tzinfo=UTC)
    assert parse_since("2026-11-30T08:00+01:00", NOW) == datetime(2026, 11, 30, 7, tzinfo=UTC)
    for bad in ("lately", "-3h"):
        with pytest.raises(BadQuery):
            parse_since(bad, NOW)
    with pytest.raises(BadQuery, match="RUNNING"):
        parse_status("asleep")


def test_links__keep_the_filters_and_a_new_place_drops_the_old() -> None:
    query = JobsQuery.parse({"status": "FAILED", "scope": "a b", "before": "2026-12-01T00:00/x",
                             "limit": "50"}, NOW)  # fmt: skip
    assert query.link() == "/?status=FAILED&scope=a+b"
    assert query.link(after="2026-12-02T00:00/y") == (
        "/?status=FAILED&scope=a+b&after=2026-12-02T00%3A00%2Fy"
    )
    assert query.link(status="") == "/?scope=a+b"
    assert JobsQuery.parse({"limit": "100000"}, NOW).limit == 500


def test_guard__seals_only_what_it_signed() -> None:
    guard = Guard("token")
    sealed = guard.seal("flash", "done")
    assert guard.unseal("flash", sealed) == "done"
    assert guard.unseal("other", sealed) is None
    assert Guard("another token").unseal("flash", sealed) is None
    assert guard.unseal("flash", "x" + sealed) is None
    assert guard.is_token("token") and not guard.is_token("tok") and not guard.is_token(None)


def test_durations__as_people_read_them() -> None:
    assert [seconds(s) for s in (0, 12.4, 187, 3_725, 200_000)] == [
        "0 s", "12 s", "3 min 07 s", "1 h 02 min", "2 d 07 h",
    ]  # fmt: skip
    assert relative(NOW + timedelta(minutes=5), NOW) == "in 5 min 00 s"
    assert relative(NOW - timedelta(seconds=30), NOW) == "30 s ago"
    assert relative(NOW, NOW) == "now"


def test_hosts__loopback_answers_its_names_a_wildcard_any() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert "localhost" in allowed_hosts("127.0.0.1")
    assert allowed_hosts("0.0.0.0") == ["*"]
    assert allowed_hosts("10.1.2.3") == ["10.1.2.3"]


def test_package_data__ships_every_template_and_static_file_in_the_wheel() -> None:
    root = Path(choreography_ray.dashboard.__file__).parent
    pyproject = tomllib.loads((root.parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["choreography_ray.dashboard"]
    files = [str(p.relative_to(root)) for folder in ("templates", "static")
             for p in (root / folder).rglob("*") if p.is_file()]  # fmt: skip
    assert len(files) > 10
    assert [f for f in files if not any(fnmatch(f, g) for g in globs)] == []


def test_token__from_the_environment_else_generated_and_to_be_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, " fixed ")
    assert token_from_environment() == ("fixed", False)
    monkeypatch.delenv(TOKEN_ENV)
    token, generated = token_from_environment()
    assert generated and len(token) >= 32 and token != token_from_environment()[0]
