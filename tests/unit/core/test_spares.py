from choreography_ray.core.spares import FOLLOW_SECONDS, Spares


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


def test_large_start__alone_the_next_spare_waits_for_its_job_to_settle() -> None:
    spares = Spares(size=1, max_age=10.0)
    assert spares.large_start("big", now=0.0, took_spare=True) is True
    assert spares.settled("small", now=1.0) is False  # not a large job: nothing waited for it
    assert spares.settled("big", now=2.0) is True  # the spare is made now
    assert spares.settled("big", now=2.5) is False  # once
    # The next large start, with the spare made meanwhile, runs alone too, however soon.
    spares.add("spare", created=2.8, handle=None)
    assert spares.take(now=2.9) == ("spare", None)
    assert spares.large_start("next", now=3.0, took_spare=True) is True


def test_large_start__while_another_runs_the_next_spare_is_made_at_once() -> None:
    spares = Spares(size=1, max_age=10.0)
    assert spares.large_start("first", now=0.0, took_spare=True) is True
    assert spares.large_start("second", now=1.0, took_spare=True) is False
    assert spares.settled("first", now=2.0) is True
    assert spares.settled("second", now=3.0) is False


def test_large_start__after_a_start_found_no_spare_ready_large_jobs_follow_one_another() -> None:
    spares = Spares(size=1, max_age=10.0)
    spares.add("s1", created=0.0, handle=None)
    assert spares.take(now=0.0) == ("s1", None)
    assert spares.large_start("a", now=0.1, took_spare=True) is True
    assert spares.settled("a", now=2.0) is True  # the manager makes the next spare now
    spares.creating = 1
    # The next start came before that spare was ready: it made its own actor, and is kept.
    assert spares.take(now=2.1) is None
    assert spares.large_start("b", now=2.2, took_spare=False) is False
    spares.creating = 0
    spares.add("s2", created=2.8, handle=None)
    assert spares.settled("b", now=4.0) is False
    # The start after "b" took the spare made meanwhile: the next one is made at once.
    assert spares.take(now=4.1) == ("s2", None)
    assert spares.large_start("c", now=4.2, took_spare=True) is False
    assert spares.settled("c", now=6.0) is False
    # A large start FOLLOW_SECONDS after the last large job settled runs alone again.
    assert spares.large_start("d", now=6.0 + FOLLOW_SECONDS, took_spare=True) is True


def test_large_start__a_managers_first_start_is_not_kept_and_is_no_miss() -> None:
    spares = Spares(size=1, max_age=10.0)
    assert spares.take(now=0.0) is None  # none made yet, none being made: not a miss
    assert spares.large_start("first", now=0.1, took_spare=False) is False
    assert spares.settled("first", now=1.0) is False
    spares.add("spare", created=1.5, handle=None)
    assert spares.take(now=1.6) == ("spare", None)
    assert spares.large_start("next", now=1.7, took_spare=True) is True
