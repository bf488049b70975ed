"""When the faust worker flushes (`streams.faust_app.Pending.due`): not after every batch
while it catches up on a backlog, since a flush costs about the state's size."""
from __future__ import annotations

from streams.faust_app import FLUSH_MAX, FLUSH_RATIO, Pending


def test_a_backlog_defers_the_flush_until_folding_outweighs_it() -> None:
    pending = Pending(events=5000, folding=0.5)
    assert pending.due(caught_up=False, last_flush=None)  # the first flush measures the cost
    assert not pending.due(caught_up=False, last_flush=0.5)  # folded 0.5 s, a flush costs 0.5 s
    pending.folding = FLUSH_RATIO * 0.5
    assert pending.due(caught_up=False, last_flush=0.5)


def test_caught_up_or_too_many_pending_flushes_at_once() -> None:
    assert Pending(events=1, folding=0.001).due(caught_up=True, last_flush=10.0)
    assert Pending(events=FLUSH_MAX, folding=0.001).due(caught_up=False, last_flush=10.0)
    assert not Pending(events=FLUSH_MAX - 1, folding=0.001).due(caught_up=False, last_flush=10.0)


def test_nothing_folded_is_nothing_to_flush() -> None:
    assert not Pending().owed
    assert not Pending().due(caught_up=True, last_flush=None)
    assert Pending(letters=[(None, b"{}", 0.0)]).due(caught_up=True, last_flush=None)
