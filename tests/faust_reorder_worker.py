"""The faust worker with its events delivered out of offset order, for the ordering test
only: the first batch faust hands the agent is held back and handed over after the second,
as records a fetcher buffered before a seek reach the agent ahead of the ones after it.

Run as `python -m tests.faust_reorder_worker worker ...`, like `python -m streams.faust_app`."""
from __future__ import annotations

from typing import Any, AsyncIterator

import faust

from streams.faust_app import main

_take = faust.Stream.noack_take


async def swapped(self: Any, max_: int, within: float) -> AsyncIterator[Any]:
    """faust's `noack_take` (the worker's batches), except that the first two batches come
    second, first."""
    held = None
    swapped_yet = False
    async for batch in _take(self, max_, within):
        if not swapped_yet and held is None:
            held = batch
            continue
        yield batch
        if held is not None:
            yield held
            held, swapped_yet = None, True


if __name__ == "__main__":
    faust.Stream.noack_take = swapped  # type: ignore[method-assign, assignment]
    main()
