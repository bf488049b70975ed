"""Garbage-collector settings for a long fold (the replay and embedded runners, the bench).

A fold allocates a few container objects per event (envelopes, payloads, job records) and
almost never makes a reference cycle, yet CPython's default thresholds run a young
collection every 700 allocations and, as the ledger grows, old collections that walk the
whole state: about 5% of a replay measured (bench/accounting.py). Inside `long_fold()` the
objects alive at entry are frozen out of collection (`gc.freeze`) and young collections are
rarer; the previous settings come back on exit. Cycles are still collected, only later.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: allocations between young collections inside a fold (CPython's default: 700)
FOLD_THRESHOLD = (50_000, 20, 20)


_depth = 0


@contextmanager
def long_fold() -> Iterator[None]:
    """Collector settings for folding many events; restored when the outermost one exits."""
    global _depth
    before = gc.get_threshold()
    if _depth == 0:
        gc.freeze()
        gc.set_threshold(*FOLD_THRESHOLD)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.set_threshold(*before)
            gc.unfreeze()
