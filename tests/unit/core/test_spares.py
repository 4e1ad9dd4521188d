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


def test_large_start__following_another_large_job_the_next_spare_is_made_at_once() -> None:
    spares = Spares(size=1, max_age=10.0)
    assert spares.large_start("first", now=0.0, took_spare=True) is True
    # While "first" runs, the next large start's spare is made now, and waits for nothing.
    assert spares.large_start("second", now=1.0, took_spare=True) is False
    assert spares.settled("first", now=2.0) is True
    assert spares.settled("second", now=3.0) is False
    # Within FOLLOW_SECONDS of a large job settling, the next one follows it: made now.
    assert spares.large_start("third", now=3.0 + FOLLOW_SECONDS - 0.1, took_spare=True) is False
    assert spares.settled("third", now=9.0) is False
    # Alone again once FOLLOW_SECONDS passed.
    assert spares.large_start("fourth", now=9.0 + FOLLOW_SECONDS, took_spare=True) is True


def test_large_start__without_a_spare_it_is_kept_only_when_it_follows_another() -> None:
    spares = Spares(size=1, max_age=10.0)
    # A manager's first start made its own actor: it waits for nothing and is not kept, so its
    # job settling does not make the next large start a follower.
    assert spares.large_start("first", now=0.0, took_spare=False) is False
    assert spares.settled("first", now=1.0) is False
    assert spares.large_start("alone", now=1.5, took_spare=True) is True
    # A start that found no spare ready right after "alone" settled (its spare is being made):
    # kept, so the start after it, with the spare made meanwhile, follows it too.
    assert spares.settled("alone", now=3.0) is True
    assert spares.large_start("missed", now=3.1, took_spare=False) is False
    assert spares.settled("missed", now=5.5) is False
    assert spares.large_start("next", now=5.6, took_spare=True) is False
