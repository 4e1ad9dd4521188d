from choreography_ray.core.spares import Spares


def test_take__the_oldest_spare_young_enough__older_ones_are_forgotten() -> None:
    spares = Spares(size=3, max_age=10.0)
    spares.add("old", created=0.0, handle=None)
    spares.add("young", created=5.0, handle=None)
    spares.add("newest", created=8.0, handle=None)

    assert spares.take(now=12.0) == ("young", None)  # "old" is 12 s old: forgotten
    assert spares.take(now=12.0) == ("newest", None)
    assert spares.take(now=12.0) is None


def test_missing__counts_spares_ready_and_being_created() -> None:
    spares = Spares(size=2, max_age=10.0)
    assert spares.missing() == 2
    spares.creating = 1
    assert spares.missing() == 1
    spares.add("a", created=0.0, handle="handle of a")
    assert spares.missing() == 0
    assert spares.take(now=1.0) == ("a", "handle of a")
    assert spares.missing() == 1


def test_size_zero__never_creates_or_gives_one() -> None:
    spares = Spares(size=0, max_age=10.0)
    assert spares.missing() == 0
    assert spares.take(now=0.0) is None


def test_recent_types__the_latest_job_types_started_each_once_the_latest_last() -> None:
    spares = Spares(size=1, max_age=10.0)
    assert spares.recent_types() == []
    for job_type in ["a.A", "b.B", "a.A", "c.C", "d.D", "e.E"]:
        spares.started(job_type)
    # At most RECENT_TYPES (4): "b.B" is the oldest and goes; "a.A" moved up when it came again.
    assert spares.recent_types() == ["a.A", "c.C", "d.D", "e.E"]
