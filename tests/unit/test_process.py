"""The garbage collector of the busy actor processes: young collections every
`YOUNG_COLLECTION_EVERY` allocations, what the process held at start frozen."""

from __future__ import annotations

import gc
import subprocess
import sys

from choreography_ray.runtime.process import YOUNG_COLLECTION_EVERY, gc_tuned


def test_gc_tuned__collects_young_objects_less_often_and_restores_the_collector() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    with gc_tuned():
        assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, *before[1:])
        assert gc.get_freeze_count() > frozen
        assert gc.isenabled()  # cyclic garbage is still collected
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_tune_gc__lasts_for_the_process() -> None:
    code = (
        "import gc; from choreography_ray.runtime.process import tune_gc; tune_gc(); "
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 0, gc.isenabled())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(YOUNG_COLLECTION_EVERY), "True", "True"]
