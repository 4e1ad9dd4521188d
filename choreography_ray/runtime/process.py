"""CPython's cyclic garbage collector in the package's busy actor processes (job actors, step
hosts).

A 100,000-step job allocates millions of short-lived tuples, strings and records, and at
CPython's default (a young-generation collection every 700 container allocations) the
collector took about a third of building a plan's records in the job actor (measured on 100,000
records: 0.39 s with it, 0.27 s without). These processes freeze what they hold once started
(the imported modules' objects are never traversed again) and collect the young generation every
`YOUNG_COLLECTION_EVERY` allocations; cyclic garbage is still collected, a little later.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Container allocations between two young-generation collections (CPython's default: 700).
YOUNG_COLLECTION_EVERY = 50_000


def tune_gc() -> None:
    """For the rest of this process's life."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, old)


@contextmanager
def gc_tuned() -> Iterator[None]:
    """`tune_gc` for a while (the benchmark's storage ceiling runs as the actors do)."""
    thresholds = gc.get_threshold()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
